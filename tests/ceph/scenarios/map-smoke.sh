#!/bin/sh
# shellcheck disable=SC1091,SC2012
# map-smoke (guest, busybox sh; run it with tests/ceph/guest-rbd.sh): bring up eth0, map
# $POOL/$IMAGE with the kernel rbd client through /sys/bus/rbd/add_single_major (no rbd binary),
# print the device's sysfs attributes, make a filesystem on /dev/rbdN, mount it, write a file,
# unmount, then unmap through /sys/bus/rbd/remove_single_major. Exit 0 only if all of it worked.
#
# With a 9p share (/mnt/host) it also hands over to the host while the image is mapped: it writes
# /mnt/host/mapped ("dev=N client_id=clientNNNN client_addr=IP:0/NONCE") and waits (60 s at most)
# for /mnt/host/mapped.ack, which the host writes after checking the watcher ("ok ..." or
# "fail ..."); after the unmap it writes /mnt/host/unmapped. Without a share it keeps the image
# mapped for $HOLD_S seconds (default 0) instead.
set -u
. /extra/ceph.env || { echo "FAIL: no /extra/ceph.env"; exit 1; }
. /extra/ceph-lib.sh || { echo "FAIL: no /extra/ceph-lib.sh"; exit 1; }
up() { cut -d' ' -f1 /proc/uptime; }
fail() { echo "FAIL: $*"; dmesg | grep -iE 'libceph|rbd' | tail -n 15; exit 1; }

echo "rbd single_major: $(cat /sys/module/rbd/parameters/single_major 2>/dev/null || echo '?')"
ls /sys/bus/rbd/ | tr '\n' ' '; echo

t=$(up)
ceph_net_up || fail "network"
echo "eth0: $(ip -4 -o addr show dev eth0 | awk '{ print $4 }'), default via $(ip route | awk '/^default/ { print $3 }')"
echo "monitor $MON_ADDR banner: $(ceph_mon_banner)"

t=$(up)
id=$(rbd_map "$POOL" "$IMAGE") || fail "rbd map $POOL/$IMAGE"
echo "mapped $POOL/$IMAGE as rbd$id in $(awk -v a="$t" -v b="$(up)" 'BEGIN { printf "%.2f", b - a }') s"
echo "ls /sys/bus/rbd/devices/: $(ls /sys/bus/rbd/devices/ | tr '\n' ' ')"
d=/sys/bus/rbd/devices/$id
for a in pool pool_id name image_id client_id client_addr cluster_fsid major minor current_snap size features; do
    printf 'rbd%s %s: %s\n' "$id" "$a" "$(cat "$d/$a" 2>/dev/null || echo '<missing>')"
done
[ "$(cat "$d/pool")" = "$POOL" ] || fail "pool"
[ "$(cat "$d/name")" = "$IMAGE" ] || fail "name"
[ "$(cat "$d/cluster_fsid")" = "$FSID" ] || fail "cluster_fsid != $FSID"
[ "$(cat "$d/current_snap")" = "-" ] || fail "current_snap"
dev=/dev/rbd$id
[ -b "$dev" ] || fail "no block device $dev"
echo "$dev: $(ls -l "$dev" | awk '{ print $5, $6 }') size $(cat "/sys/block/rbd$id/size") sectors"

# A filesystem: busybox mke2fs makes ext2, which the ext4 driver mounts.
mke2fs -q "$dev" >/tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mke2fs $dev"; }
mkdir -p /mnt/rbd
mount -t ext4 "$dev" /mnt/rbd || fail "mount $dev"
echo "written in the guest" >/mnt/rbd/hello.txt || fail "write"
sync
[ "$(cat /mnt/rbd/hello.txt)" = "written in the guest" ] || fail "read back"
grep " /mnt/rbd " /proc/mounts
umount /mnt/rbd || fail "umount"
echo "mkfs, mount, write, umount: ok"

client_id=$(cat "$d/client_id")
client_addr=$(cat "$d/client_addr")
if host_share_ready; then
    echo "handing over to the host (watcher check)"
    ack=$(host_handshake mapped "dev=$id client_id=$client_id client_addr=$client_addr" 60) \
        || fail "host check while mapped: ${ack:-no answer}"
    echo "host: $ack"
else
    sleep "${HOLD_S:-0}"
fi

rbd_unmap "$id" || fail "unmap rbd$id"
echo "unmapped rbd$id; ls /sys/bus/rbd/devices/: '$(ls /sys/bus/rbd/devices/)'"
[ -e "$dev" ] && fail "$dev still exists"
host_share_ready && echo "client_id=$client_id" >/mnt/host/unmapped
echo "map-smoke: ok"
