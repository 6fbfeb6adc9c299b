# shellcheck shell=sh
# Guest-side helpers for rbd scenarios (busybox sh). guest-rbd.sh puts this file in the guest as
# /extra/ceph-lib.sh next to /extra/ceph.env; a scenario does:
#     . /extra/ceph.env; . /extra/ceph-lib.sh
#     ceph_net_up || exit 1
#     id=$(rbd_map "$POOL" "$IMAGE") || exit 1      # kernel client, no rbd binary
#     ... /dev/rbd$id ...
#     rbd_unmap "$id"
# ceph.env holds MON_ADDR (ip:6789, msgr v1), SECRET (client.admin, base64), CEPH_USER, POOL,
# IMAGE, FSID, GUEST_IP (10.0.2.15/24), GUEST_GW (10.0.2.2), RBD_MAP_OPTS.

# ceph_net_up: configure eth0 statically the way qemu's user networking expects it (guest
# 10.0.2.15/24, gateway 10.0.2.2; no DHCP needed) and check that the monitor answers: a msgr v1
# server sends its banner "ceph v027" as soon as a connection is accepted.
ceph_net_up() {
    i=0
    while [ ! -e /sys/class/net/eth0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    [ -e /sys/class/net/eth0 ] || { echo "ceph_net_up: no eth0 (is BLOCKJANITOR_GUEST_NET=user set?)"; return 1; }
    ip link set eth0 up || return 1
    ip addr add "${GUEST_IP:-10.0.2.15/24}" dev eth0 2>/dev/null
    ip route replace default via "${GUEST_GW:-10.0.2.2}" dev eth0 || return 1
    ceph_mon_banner >/dev/null
}

# ceph_mon_banner: print the first 9 bytes the monitor sends ("ceph v027"); fail after 10 s.
ceph_mon_banner() {
    b=$(timeout 10 nc "${MON_ADDR%:*}" "${MON_ADDR##*:}" </dev/null 2>/dev/null | head -c 9)
    echo "$b"
    [ "$b" = "ceph v027" ] || { echo "ceph_mon_banner: no msgr v1 banner from $MON_ADDR (got '$b')" >&2; return 1; }
}

# rbd_map POOL IMAGE [SNAP]: map with the kernel client through sysfs; print the device id (the
# new one: mapping an image mapped already, e.g. with the `noshare` option, gives a second id).
# Format (Documentation/ABI/testing/sysfs-bus-rbd):
#   "<mon addrs> <options> <pool> <image> [<snap>]" > /sys/bus/rbd/add_single_major
rbd_map() {
    _ctl=/sys/bus/rbd/add_single_major
    [ -e $_ctl ] || _ctl=/sys/bus/rbd/add      # rbd loaded with single_major=N
    _opts="name=${CEPH_USER:-admin},secret=$SECRET${RBD_MAP_OPTS:+,$RBD_MAP_OPTS}"
    _before=" $(ls /sys/bus/rbd/devices 2>/dev/null | tr '\n' ' ') "
    echo "$MON_ADDR $_opts $1 $2 ${3:--}" >$_ctl || { echo "rbd_map: write to $_ctl failed" >&2; return 1; }
    for d in /sys/bus/rbd/devices/*; do
        [ -e "$d/name" ] || continue
        case $_before in *" ${d##*/} "*) continue ;; esac
        if [ "$(cat "$d/pool")" = "$1" ] && [ "$(cat "$d/name")" = "$2" ]; then
            echo "${d##*/}"; return 0
        fi
    done
    echo "rbd_map: mapped, but no /sys/bus/rbd/devices/N for $1/$2" >&2
    return 1
}

# rbd_unmap ID [force]: "<id>" or "<id> force" > /sys/bus/rbd/remove_single_major.
rbd_unmap() {
    _ctl=/sys/bus/rbd/remove_single_major
    [ -e $_ctl ] || _ctl=/sys/bus/rbd/remove
    echo "$1${2:+ $2}" >$_ctl || { echo "rbd_unmap: write '$1${2:+ $2}' to $_ctl failed" >&2; return 1; }
    [ ! -e "/sys/bus/rbd/devices/$1" ]
}

# host_share_ready: true when the host shared a folder (run.sh BLOCKJANITOR_GUEST_SHARE).
host_share_ready() { grep -qs ' /mnt/host 9p ' /proc/mounts; }

# host_handshake NAME CONTENT [TIMEOUT_S]: write /mnt/host/NAME (atomically), then wait for the
# host to answer with /mnt/host/NAME.ack; print the ack's content. Fails on a timeout or when the
# ack starts with "fail".
host_handshake() {
    printf '%s\n' "$2" >"/mnt/host/.$1.tmp" && mv "/mnt/host/.$1.tmp" "/mnt/host/$1" || return 1
    _n=$(( ${3:-60} * 10 ))
    i=0
    while [ ! -f "/mnt/host/$1.ack" ] && [ $i -lt $_n ]; do sleep 0.1; i=$((i + 1)); done
    [ -f "/mnt/host/$1.ack" ] || { echo "host_handshake: no /mnt/host/$1.ack after ${3:-60} s" >&2; return 1; }
    _ack=$(cat "/mnt/host/$1.ack")
    echo "$_ack"
    case $_ack in fail*) return 1 ;; esac
}
