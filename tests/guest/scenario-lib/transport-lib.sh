# transport-lib.sh — scene helpers for the guest scenarios of issue 12 (sourced; busybox sh).
#
#   . /extra/transport-lib.sh      (ship it in EXTRA_DIR, or cat it in front of the scenario)
#
# Sets up, inside the qemu guest, the transports CSI drivers use, all over the guest's own
# loopback: a LIO iSCSI target (configfs) + open-iscsi's initiator (iscsid, iscsiadm), an nvmet
# NVMe/TCP target (configfs) + the kernel's NVMe/TCP host, LVM / LUKS2 / kpartx stacks on a
# device, and multipathd without systemd or udevd. See tests/guest/README.md ("Transports").
#
# Conventions:
# - Every function returns 0 on success; on failure it prints "transport-lib: FUNC: why" on stderr
#   and returns non-zero (never exits: the caller decides; `fn || fail "..."`).
# - Results that a caller needs are printed on stdout (one word or one line) AND left in a global
#   variable named in the function's comment, so `x=$(fn ...)` and `fn ...; echo $VAR` both work
#   (a $(...) call runs in a subshell: only the stdout form survives it).
# - Waits poll every 0.1 s with a deadline (TL_TIMEOUT, default 20 s): nothing here blocks forever.
# - Backing storage is files on the guest's RAM root (/tmp/tl/...): keep sizes small (MB).
# - No udevd: DM_DISABLE_UDEV=1 is exported (libdevmapper, lvm, cryptsetup, kpartx and multipathd
#   then make /dev/mapper nodes themselves).
export DM_DISABLE_UDEV=1
TL_TIMEOUT=${TL_TIMEOUT:-20}
TL_DIR=/tmp/tl
CFS=/sys/kernel/config
mkdir -p $TL_DIR

tl_err() { echo "transport-lib: $*" >&2; return 1; }
# tl_now: guest uptime in seconds (0.01 s resolution).
tl_now() { cut -d' ' -f1 /proc/uptime; }
# tl_since T0: seconds since tl_now printed T0, "%.2f".
tl_since() { awk -v a="$1" -v b="$(tl_now)" 'BEGIN { printf "%.2f", b - a }'; }
# tl_wait SECONDS DESCRIPTION CMD...: run CMD every 0.1 s until it succeeds; 1 after SECONDS.
tl_wait() {
    local secs=$1 what=$2 i=0 n
    shift 2
    n=$(awk -v s="$secs" 'BEGIN { printf "%d", s * 10 }')
    while ! "$@" >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -ge "$n" ] && { tl_err "timed out after ${secs}s waiting for $what"; return 1; }
        sleep 0.1
    done
    return 0
}
# tl_devno NAME: "MAJ:MIN" of the block device /sys/class/block/NAME.
tl_devno() { cat /sys/class/block/$1/dev; }
# tl_dm_name DM (dm-N): its device-mapper name.  tl_dm_uuid DM: its dm uuid.
tl_dm_name() { cat /sys/block/$1/dm/name; }
tl_dm_uuid() { cat /sys/block/$1/dm/uuid; }
# tl_dm_of NAME: the dm-N kernel name of the mapping NAME (from /dev/mapper/NAME's numbers).
tl_dm_of() {
    local d
    for d in /sys/block/dm-*; do
        [ -e "$d/dm/name" ] || continue
        [ "$(cat $d/dm/name)" = "$1" ] && { echo "${d##*/}"; return 0; }
    done
    tl_err "tl_dm_of: no dm device named $1"
}

# configfs_up: load configfs and mount it on /sys/kernel/config (idempotent).
configfs_up() {
    modprobe configfs || { tl_err "configfs_up: modprobe configfs"; return 1; }
    grep -q " $CFS configfs " /proc/mounts || mount -t configfs configfs $CFS \
        || { tl_err "configfs_up: mount configfs"; return 1; }
}

# =============================================================================== iSCSI target (LIO)
# Targets are LIO iSCSI targets made through configfs, one TPG (tpgt_1) each, fileio backstores
# on files in $TL_DIR/lio/, demo mode (generate_node_acls=1, authentication=0,
# demo_mode_write_protect=0, cache_dynamic_acls=1): any initiator may log in, no CHAP.
# Portal default: 127.0.0.1:3260. Several targets may share one portal (LIO shares the listener).
LIO=$CFS/target
ISCSI_PORTAL_DEFAULT=127.0.0.1:3260

# iscsi_tag IQN: the short name used for the IQN's backstores and files (its part after the last
# ':' or '.', non-alphanumerics dropped). Two targets need different tags.
iscsi_tag() { echo "${1##*[:.]}" | tr -cd 'A-Za-z0-9_-'; }

# iscsi_target_up IQN NLUNS [PORTAL] [SIZE_MB]
#   Create target IQN with NLUNS LUNs (lun_0..lun_{NLUNS-1}), each a SIZE_MB (default 16) fileio
#   backstore core/fileio_0/TAG_lN (TAG = iscsi_tag IQN) with the unit serial = the first 16 hex
#   digits of md5("IQN lun N") (so the initiator's wwid, naa.6001405 + serial digits, is unique and
#   the same on every boot), exported on PORTAL. Enables the TPG.
iscsi_target_up() {
    local iqn=$1 n=$2 portal=${3:-$ISCSI_PORTAL_DEFAULT} mb=${4:-16} tag i so tpg
    tag=$(iscsi_tag "$iqn")
    configfs_up || return 1
    for m in target_core_mod target_core_file iscsi_target_mod; do
        modprobe $m || { tl_err "iscsi_target_up: modprobe $m"; return 1; }
    done
    mkdir -p $LIO/iscsi $TL_DIR/lio /etc/target 2>/dev/null
    tpg=$LIO/iscsi/$iqn/tpgt_1
    mkdir -p $tpg || { tl_err "iscsi_target_up: mkdir $tpg"; return 1; }
    i=0
    while [ $i -lt "$n" ]; do
        so=$LIO/core/fileio_0/${tag}_l$i
        mkdir -p $so || { tl_err "iscsi_target_up: mkdir $so"; return 1; }
        echo "fd_dev_name=$TL_DIR/lio/${tag}_l$i.img,fd_dev_size=$((mb * 1048576))" >$so/control \
            || { tl_err "iscsi_target_up: $so/control"; return 1; }
        echo 1 >$so/enable || { tl_err "iscsi_target_up: enable $so"; return 1; }
        printf '%s lun %s' "$iqn" "$i" | md5sum | cut -c1-16 >$so/wwn/vpd_unit_serial 2>/dev/null
        mkdir -p $tpg/lun/lun_$i && ln -s $so $tpg/lun/lun_$i/${tag}_l$i \
            || { tl_err "iscsi_target_up: export lun_$i"; return 1; }
        i=$((i + 1))
    done
    if [ ! -d "$tpg/np/$portal" ]; then
        mkdir $tpg/np/$portal || { tl_err "iscsi_target_up: portal $portal"; return 1; }
    fi
    echo 1 >$tpg/attrib/generate_node_acls
    echo 1 >$tpg/attrib/cache_dynamic_acls
    echo 0 >$tpg/attrib/authentication
    echo 0 >$tpg/attrib/demo_mode_write_protect
    echo 1 >$tpg/enable || { tl_err "iscsi_target_up: enable $tpg"; return 1; }
}

# iscsi_target_del_lun IQN LUN
#   Remove LUN number LUN from the target, target-side only (the array unmapping a volume): the
#   initiator's sd device stays, and its I/O and TURs then fail (LOGICAL UNIT NOT SUPPORTED).
#   The backstore (and its file) stays too.
iscsi_target_del_lun() {
    local d=$LIO/iscsi/$1/tpgt_1/lun/lun_$2 l
    [ -d "$d" ] || { tl_err "iscsi_target_del_lun: no $d"; return 1; }
    for l in "$d"/*; do [ -L "$l" ] && rm "$l"; done
    rmdir "$d" || { tl_err "iscsi_target_del_lun: rmdir $d"; return 1; }
}

# iscsi_portal_down [PORTAL]
#   Take PORTAL down for every target on it (an array or network outage): remove the portal
#   (closes the listener: reconnects get "connection refused") and disable each TPG (which drops
#   the sessions it has). Every initiator session to PORTAL goes FAILED and iscsid keeps retrying
#   (for replacement_timeout, I/O queues; then fails). Remembers what it did for iscsi_portal_up.
iscsi_portal_down() {
    local portal=${1:-$ISCSI_PORTAL_DEFAULT} np tpg
    : >$TL_DIR/lio/down.$portal
    for np in $LIO/iscsi/*/tpgt_*/np/$portal; do
        [ -d "$np" ] || continue
        tpg=${np%/np/*}
        echo "$tpg" >>$TL_DIR/lio/down.$portal
        rmdir "$np" || { tl_err "iscsi_portal_down: rmdir $np"; return 1; }
        echo 0 >$tpg/enable || { tl_err "iscsi_portal_down: disable $tpg"; return 1; }
    done
    [ -s $TL_DIR/lio/down.$portal ] || { tl_err "iscsi_portal_down: no target on $portal"; return 1; }
}

# iscsi_portal_up [PORTAL]: undo iscsi_portal_down (the sessions then recover by themselves).
iscsi_portal_up() {
    local portal=${1:-$ISCSI_PORTAL_DEFAULT} tpg
    while read -r tpg; do
        mkdir "$tpg/np/$portal" && echo 1 >$tpg/enable || { tl_err "iscsi_portal_up: $tpg"; return 1; }
    done <$TL_DIR/lio/down.$portal
}

# iscsi_target_down IQN: remove the target entirely (TPG, LUNs, portal, then its backstores).
iscsi_target_down() {
    local iqn=$1 tag tpg d l
    tag=$(iscsi_tag "$iqn")
    tpg=$LIO/iscsi/$iqn/tpgt_1
    if [ -d $tpg ]; then
        echo 0 >$tpg/enable 2>/dev/null
        for d in $tpg/lun/lun_*; do
            [ -d "$d" ] || continue
            for l in "$d"/*; do [ -L "$l" ] && rm "$l"; done
            rmdir "$d"
        done
        for d in $tpg/np/*; do [ -d "$d" ] && rmdir "$d"; done
        rmdir $tpg
    fi
    [ -d $LIO/iscsi/$iqn ] && rmdir $LIO/iscsi/$iqn
    for d in $LIO/core/fileio_0/${tag}_l*; do [ -d "$d" ] && rmdir "$d"; done
    rm -f $TL_DIR/lio/${tag}_l*.img
    [ ! -d $LIO/iscsi/$iqn ] || { tl_err "iscsi_target_down: $iqn still there"; return 1; }
}

# ============================================================================ iSCSI initiator
# iscsid_start: load iscsi_tcp and start iscsid (foreground process in the background, log in
#   /tmp/iscsid.log) unless one runs; returns once its control socket listens.
iscsid_start() {
    modprobe iscsi_tcp || { tl_err "iscsid_start: modprobe iscsi_tcp"; return 1; }
    iscsid_running && return 0
    iscsid -f >>/tmp/iscsid.log 2>&1 </dev/null &
    ISCSID_PID=$!
    tl_wait "$TL_TIMEOUT" "iscsid's socket" iscsid_running
}
iscsid_running() { grep -q '@ISCSIADM_ABSTRACT_NAMESPACE' /proc/net/unix; }

# iscsi_login IQN [PORTAL] [REPLACEMENT_TIMEOUT] [NLUNS]
#   Discover PORTAL (sendtargets), set the node's session replacement_timeout (default 120, the
#   open-iscsi default), log in to IQN there and wait until the session exists and NLUNS (default:
#   don't wait) SCSI disks appeared under it. Prints and sets ISCSI_SESSION (e.g. "session1");
#   sets ISCSI_DEVS to its sd names (space-separated, in LUN order).
iscsi_login() {
    local iqn=$1 portal=${2:-$ISCSI_PORTAL_DEFAULT} rt=${3:-120} nluns=${4:-}
    iscsid_start || return 1
    iscsiadm -m discovery -t sendtargets -p "$portal" >/dev/null \
        || { tl_err "iscsi_login: discovery on $portal"; return 1; }
    iscsiadm -m node -T "$iqn" -p "$portal" -o update -n node.session.timeo.replacement_timeout -v "$rt" \
        || { tl_err "iscsi_login: node $iqn $portal"; return 1; }
    iscsiadm -m node -T "$iqn" -p "$portal" --login >/dev/null \
        || { tl_err "iscsi_login: login to $iqn at $portal"; return 1; }
    ISCSI_SESSION=$(iscsi_session_of "$iqn") || return 1
    if [ -n "$nluns" ]; then
        tl_wait "$TL_TIMEOUT" "$nluns disks on $ISCSI_SESSION" iscsi_has_devs "$ISCSI_SESSION" "$nluns" || return 1
    fi
    ISCSI_DEVS=$(iscsi_session_devs "$ISCSI_SESSION")
    echo "$ISCSI_SESSION"
}
iscsi_has_devs() { [ "$(iscsi_session_devs "$1" | wc -w)" -ge "$2" ]; }

# iscsi_session_of IQN: prints the sessionN whose targetname is IQN (the first one), else fails.
iscsi_session_of() {
    local s
    for s in /sys/class/iscsi_session/session*; do
        [ -e "$s/targetname" ] || continue
        [ "$(cat $s/targetname)" = "$1" ] && { echo "${s##*/}"; return 0; }
    done
    tl_err "iscsi_session_of: no session to $1"
}

# iscsi_session_devs SESSION (sessionN): the sd names of the SCSI disks under it, in LUN order.
iscsi_session_devs() {
    local d
    for d in /sys/class/iscsi_session/$1/device/target*/*:*:*:*; do
        [ -d "$d/block" ] || continue
        echo "${d##*:} $(ls $d/block)"
    done | sort -n | awk '{ printf "%s%s", sep, $2; sep = " " } END { print "" }'
}

# iscsi_session_state SESSION: the session's state (LOGGED_IN, FAILED, FREE).
iscsi_session_state() { cat /sys/class/iscsi_session/$1/state; }

# iscsi_wait_state SESSION STATE [SECONDS]: wait until the session's state is STATE.
iscsi_wait_state() {
    tl_wait "${3:-$TL_TIMEOUT}" "$1 $2" iscsi_state_is "$1" "$2"
}
iscsi_state_is() { [ "$(cat /sys/class/iscsi_session/$1/state 2>/dev/null)" = "$2" ]; }

# iscsi_logout IQN [PORTAL]: log out of IQN at PORTAL (its SCSI devices go with the session).
iscsi_logout() {
    iscsiadm -m node -T "$1" -p "${2:-$ISCSI_PORTAL_DEFAULT}" --logout >/dev/null \
        || { tl_err "iscsi_logout: $1"; return 1; }
}

# ================================================================ NVMe/TCP target (nvmet) and host
# Subsystems are nvmet subsystems made through configfs with attr_allow_any_host=1; namespaces
# are files in $TL_DIR/nvmet/ (buffered_io=1: tmpfs has no O_DIRECT in 6.1). Port P listens on
# 127.0.0.1:$((4419 + P)) (port 1 = 4420), TCP, ipv4.
NVMET=$CFS/nvmet

# nvmet_port_svc PORTID: the TCP port (trsvcid) of nvmet port PORTID.
nvmet_port_svc() { echo $((4419 + $1)); }

# nvmet_target_up NQN [NNS] [PORTID] [SIZE_MB]
#   Create subsystem NQN with NNS (default 1) namespaces (nsid 1..NNS, SIZE_MB default 16 each),
#   serial and per-namespace uuid derived from the NQN's position (stable across boots), and
#   expose it on port PORTID (default 1; the port is created if needed, and may carry several
#   subsystems).
nvmet_target_up() {
    local nqn=$1 nns=${2:-1} port=${3:-1} mb=${4:-16} s i tag f
    configfs_up || return 1
    for m in nvmet nvmet_tcp; do modprobe $m || { tl_err "nvmet_target_up: modprobe $m"; return 1; }; done
    s=$NVMET/subsystems/$nqn
    mkdir -p $s $TL_DIR/nvmet || { tl_err "nvmet_target_up: mkdir $s"; return 1; }
    tag=$(printf '%s' "$nqn" | md5sum | cut -c1-8)
    echo 1 >$s/attr_allow_any_host
    echo "$tag" >$s/attr_serial 2>/dev/null
    i=1
    while [ $i -le "$nns" ]; do
        f=$TL_DIR/nvmet/$tag-ns$i.img
        truncate -s ${mb}M $f || { tl_err "nvmet_target_up: truncate $f"; return 1; }
        mkdir -p $s/namespaces/$i
        printf '%s' "$f" >$s/namespaces/$i/device_path
        echo 1 >$s/namespaces/$i/buffered_io
        printf '%s-0000-4000-8000-%012x' "$tag" "$i" >$s/namespaces/$i/device_uuid 2>/dev/null
        echo 1 >$s/namespaces/$i/enable || { tl_err "nvmet_target_up: enable ns $i of $nqn"; return 1; }
        i=$((i + 1))
    done
    nvmet_port_link "$port" "$nqn"
}

# nvmet_port_link PORTID NQN: create port PORTID if needed and expose subsystem NQN on it (a second
#   port for a subsystem gives the host a second path: native NVMe multipath).
nvmet_port_link() {
    local p=$NVMET/ports/$1
    if [ ! -d $p ]; then
        mkdir $p || { tl_err "nvmet_port_link: mkdir $p"; return 1; }
        echo tcp >$p/addr_trtype
        echo ipv4 >$p/addr_adrfam
        echo 127.0.0.1 >$p/addr_traddr
        nvmet_port_svc "$1" >$p/addr_trsvcid
    fi
    [ -L $p/subsystems/$2 ] || ln -s $NVMET/subsystems/$2 $p/subsystems/$2 \
        || { tl_err "nvmet_port_link: link $2 to port $1"; return 1; }
}

# nvmet_port_remove PORTID
#   Remove the port: unlink its subsystems (nvmet drops their controllers on it) and remove it
#   (the listener closes). A host controller connected through it starts reconnecting; with
#   ctrl_loss_tmo=-1 it stays in state "connecting" for ever.
nvmet_port_remove() {
    local p=$NVMET/ports/$1 l
    [ -d $p ] || { tl_err "nvmet_port_remove: no port $1"; return 1; }
    for l in $p/subsystems/*; do [ -L "$l" ] && rm "$l"; done
    rmdir $p || { tl_err "nvmet_port_remove: rmdir $p"; return 1; }
}

# nvmet_target_down NQN: unlink NQN from every port, remove its namespaces and the subsystem
#   (ports left empty stay).
nvmet_target_down() {
    local s=$NVMET/subsystems/$1 l n
    for l in $NVMET/ports/*/subsystems/$1; do [ -L "$l" ] && rm "$l"; done
    for n in $s/namespaces/*; do [ -d "$n" ] && { echo 0 >$n/enable; rmdir $n; }; done
    rmdir $s || { tl_err "nvmet_target_down: rmdir $s"; return 1; }
}

# nvme_host_connect NQN [PORTID] [CTRL_LOSS_TMO] [RECONNECT_DELAY]
#   Connect the kernel's NVMe/TCP host to NQN at 127.0.0.1 port PORTID (default 1) with nvme-cli,
#   ctrl_loss_tmo (default 600, the kernel's; -1 = reconnect for ever) and reconnect_delay
#   (default 10). Waits until the controller is "live" and its namespaces' block devices exist.
#   Prints and sets NVME_CTRL (e.g. "nvme0").
nvme_host_connect() {
    local nqn=$1 port=${2:-1} tmo=${3:-600} delay=${4:-10} before c
    modprobe nvme_tcp || { tl_err "nvme_host_connect: modprobe nvme_tcp"; return 1; }
    before=$(ls /sys/class/nvme-fabrics/ctl 2>/dev/null | tr '\n' ' ')
    nvme connect -t tcp -a 127.0.0.1 -s "$(nvmet_port_svc "$port")" -n "$nqn" \
        --ctrl-loss-tmo="$tmo" --reconnect-delay="$delay" >/dev/null \
        || { tl_err "nvme_host_connect: nvme connect $nqn port $port"; return 1; }
    NVME_CTRL=
    for c in $(ls /sys/class/nvme-fabrics/ctl); do
        case " $before " in *" $c "*) continue ;; esac
        [ "$(cat /sys/class/nvme-fabrics/ctl/$c/subsysnqn)" = "$nqn" ] && NVME_CTRL=$c
    done
    [ -n "$NVME_CTRL" ] || { tl_err "nvme_host_connect: no new controller for $nqn"; return 1; }
    tl_wait "$TL_TIMEOUT" "$NVME_CTRL live" nvme_state_is "$NVME_CTRL" live || return 1
    tl_wait "$TL_TIMEOUT" "$NVME_CTRL's namespaces" nvme_has_ns "$NVME_CTRL" || return 1
    echo "$NVME_CTRL"
}
nvme_state_is() { [ "$(cat /sys/class/nvme/$1/state 2>/dev/null)" = "$2" ]; }
nvme_has_ns() { ls -d /sys/class/nvme/$1/nvme*c*n* /sys/class/nvme/$1/nvme*n* >/dev/null 2>&1; }

# nvme_ctrl_state CTRL: the controller's state (live, connecting, resetting, deleting...).
nvme_ctrl_state() { cat /sys/class/nvme/$1/state; }

# nvme_wait_state CTRL STATE [SECONDS]
nvme_wait_state() { tl_wait "${3:-$TL_TIMEOUT}" "$1 $2" nvme_state_is "$1" "$2"; }

# nvme_host_disconnect CTRL: delete the controller (nvme disconnect -d CTRL).
nvme_host_disconnect() {
    nvme disconnect -d "$1" >/dev/null || { tl_err "nvme_host_disconnect: $1"; return 1; }
}

# nvme_subsys_of CTRL: the nvme-subsysN that controller CTRL belongs to.
nvme_subsys_of() {
    local d
    for d in /sys/class/nvme-subsystem/nvme-subsys*; do
        [ -e "$d/$1" ] && { echo "${d##*/}"; return 0; }
    done
    tl_err "nvme_subsys_of: no subsystem holds $1"
}

# nvme_ns_heads CTRL: the namespace block devices (nvmeXnY, the native-multipath heads) of CTRL's
#   subsystem, space-separated. Each path's own device is the hidden nvmeXcYnZ under the controller.
nvme_ns_heads() {
    local sub
    sub=$(nvme_subsys_of "$1") || return 1
    ls /sys/class/nvme-subsystem/$sub | grep -E '^nvme[0-9]+n[0-9]+$' | tr '\n' ' ' | sed 's/ $//'
    echo
}

# ======================================================================= stacks on a device
# lvm_on DEV VG LV [SIZE]
#   Make DEV (a /dev path) a PV of a new VG, lvcreate LV (SIZE like "8m", default all free
#   extents), active. Prints and sets LV_DM (the LV's dm-N). Its dm uuid is "LVM-<vg uuid><lv uuid>".
lvm_on() {
    local dev=$1 vg=$2 lv=$3 size=${4:-}
    # vgcreate makes the PV itself (one lvm run less: each costs ~0.5 s under TCG); -y wipes any
    # old signature (a LUKS header, a partition table) without asking.
    vgcreate -q -y "$vg" "$dev" >/dev/null || { tl_err "lvm_on: vgcreate $vg on $dev"; return 1; }
    if [ -n "$size" ]; then
        lvcreate -q -y -W n -Z n -L "$size" -n "$lv" "$vg" >/dev/null
    else
        lvcreate -q -y -W n -Z n -l 100%FREE -n "$lv" "$vg" >/dev/null
    fi || { tl_err "lvm_on: lvcreate $vg/$lv"; return 1; }
    LV_DM=$(tl_dm_of "$vg-$lv") || return 1
    echo "$LV_DM"
}

# luks_on DEV NAME
#   LUKS2-format DEV (aes-xts-plain64, sha256, pbkdf2 with 1000 iterations: fast under TCG; a
#   small header, 16 KiB metadata + 512 KiB keyslots, so a 16 MB device has room) with the key file
#   $TL_DIR/luks.key and open it as /dev/mapper/NAME. Prints and sets CRYPT_DM (dm-N). Its dm
#   uuid is "CRYPT-LUKS2-<luks uuid without dashes>-NAME".
luks_on() {
    local dev=$1 name=$2
    [ -f $TL_DIR/luks.key ] || printf 'blockjanitor-guest-test-key' >$TL_DIR/luks.key
    modprobe dm_crypt || { tl_err "luks_on: modprobe dm_crypt"; return 1; }
    cryptsetup luksFormat -q --batch-mode --type luks2 --cipher aes-xts-plain64 --key-size 256 \
        --hash sha256 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 \
        --luks2-metadata-size 16k --luks2-keyslots-size 512k \
        --key-file $TL_DIR/luks.key "$dev" >/dev/null || { tl_err "luks_on: luksFormat $dev"; return 1; }
    cryptsetup open --type luks2 --key-file $TL_DIR/luks.key "$dev" "$name" >/dev/null \
        || { tl_err "luks_on: open $dev as $name"; return 1; }
    CRYPT_DM=$(tl_dm_of "$name") || return 1
    echo "$CRYPT_DM"
}

# parts_on DEV [NPARTS]
#   Write a DOS partition table with NPARTS (default 2) equal partitions on DEV (a /dev/mapper
#   path) with sfdisk, then `kpartx -a -s` it. Prints and sets PART_DMS (the partition maps' dm-N,
#   in order); their names are NAME1.. or NAMEp1.. as kpartx chooses, dm uuids "partN-<uuid of DEV>".
parts_on() {
    local dev=$1 n=${2:-2} sectors each i script= name d
    name=${dev##*/}
    d=$(tl_dm_of "$name") || return 1
    sectors=$(cat /sys/block/$d/size)
    each=$(( (sectors - 2048) / n / 2048 * 2048 ))
    i=0
    while [ $i -lt "$n" ]; do
        script="$script$((2048 + i * each)),$each,83
"
        i=$((i + 1))
    done
    printf '%s' "$script" | sfdisk -q --no-reread --no-tell-kernel -X dos "$dev" >/dev/null \
        || { tl_err "parts_on: sfdisk $dev"; return 1; }
    kpartx -a -s "$dev" || { tl_err "parts_on: kpartx -a $dev"; return 1; }
    PART_DMS=$(ls /sys/block/$d/holders | sort -V | tr '\n' ' ' | sed 's/ $//')
    [ "$(echo $PART_DMS | wc -w)" = "$n" ] || { tl_err "parts_on: $n partitions expected on $d, got '$PART_DMS'"; return 1; }
    echo "$PART_DMS"
}

# ====================================================================== dm-multipath helpers
# sd_debug_paths ARGS...: modprobe scsi_debug ARGS (e.g. "add_host=2 num_tgts=1 max_luns=1
#   vpd_use_hostno=0 dev_size_mb=16": two paths to one LUN) and print the sd names it created
#   (the disks whose model is scsi_debug), sets SD_PATHS.
sd_debug_paths() {
    modprobe scsi_debug "$@" || { tl_err "sd_debug_paths: modprobe scsi_debug $*"; return 1; }
    SD_PATHS=
    for b in /sys/block/sd*; do
        [ -e "$b/device/model" ] || continue
        [ "$(tr -d ' ' <$b/device/model)" = scsi_debug ] && SD_PATHS="$SD_PATHS ${b##*/}"
    done
    SD_PATHS=${SD_PATHS# }
    [ -n "$SD_PATHS" ] || { tl_err "sd_debug_paths: no scsi_debug disk"; return 1; }
    echo "$SD_PATHS"
}

# sd_udev_wwid SD: the wwid udev (scsi_id) and multipath give SD: "3"+NAA for naa.X, "2"+X for
#   eui.X, else the sysfs wwid as is.
sd_udev_wwid() {
    local w
    w=$(cat /sys/block/$1/device/wwid) || return 1
    case $w in
        naa.*) echo "3${w#naa.}" ;;
        eui.*) echo "2${w#eui.}" ;;
        *) echo "$w" ;;
    esac
}

# mp_map_by_hand NAME SD... : a dm-multipath map NAME over the SD paths (round-robin, one group,
#   queue_if_no_path) made with dmsetup, dm uuid "mpath-<udev wwid of the first path>" (what
#   multipathd would make). Prints and sets MP_DM (dm-N).
mp_map_by_hand() {
    local name=$1 sectors n=0 args= wwid s
    shift
    sectors=$(cat /sys/block/$1/size)
    wwid=$(sd_udev_wwid "$1")
    for s in "$@"; do args="$args $(tl_devno $s) 1"; n=$((n + 1)); done
    echo "0 $sectors multipath 1 queue_if_no_path 0 1 1 round-robin 0 $n 1$args" \
        | dmsetup create "$name" --uuid "mpath-$wwid" || { tl_err "mp_map_by_hand: dmsetup create $name"; return 1; }
    MP_DM=$(tl_dm_of "$name") || return 1
    echo "$MP_DM"
}

# mpd_fake_udev SD...: write /run/udev/data/bMAJ:MIN for each SD as udevd would have: I:1
#   (initialized), ID_SERIAL (the wwid multipath uses) and ID_WWN (multipath's built-in
#   `blacklist_exceptions { property "(SCSI_IDENT_|ID_WWN)" }` blacklists a path without it).
#   Without this file multipathd ignores the path (there is no udevd here).
mpd_fake_udev() {
    local s w
    mkdir -p /run/udev/data
    for s in "$@"; do
        w=$(cat /sys/block/$s/device/wwid) || { tl_err "mpd_fake_udev: no wwid for $s"; return 1; }
        w=${w#*.}
        printf 'I:1\nE:ID_SERIAL=%s\nE:ID_WWN=0x%s\nE:ID_BUS=scsi\nE:DEVTYPE=disk\n' \
            "$(sd_udev_wwid $s)" "$(echo "$w" | cut -c1-16)" \
            >/run/udev/data/b$(tl_devno $s) || { tl_err "mpd_fake_udev: $s"; return 1; }
    done
}

# mpd_start: start multipathd (foreground in the background, -s: no timestamps, log in
#   /tmp/multipathd.log) with /etc/multipath.conf (image default: find_multipaths greedy, so a map
#   for every non-blacklisted SCSI path it sees at start). Call mpd_fake_udev for the paths first.
#   Returns once `multipathd show daemon` answers and the initial map creation is done (idle).
#   multipathd writes the wwids of the maps it makes to /etc/multipath/wwids.
mpd_start() {
    modprobe dm_multipath || { tl_err "mpd_start: modprobe dm_multipath"; return 1; }
    mkdir -p /etc/multipath
    multipathd -d -s >>/tmp/multipathd.log 2>&1 </dev/null &
    MPD_PID=$!
    tl_wait "$TL_TIMEOUT" "multipathd idle" mpd_idle
}
mpd_idle() { multipathd show daemon 2>/dev/null | grep -q idle; }

# mpd_stop: `multipathd shutdown` and wait for it to exit (maps stay).
mpd_stop() {
    multipathd shutdown >/dev/null 2>&1
    tl_wait "$TL_TIMEOUT" "multipathd exit" mpd_gone
}
mpd_gone() { ! pidof multipathd >/dev/null; }

# mpd_wait_map WWID [SECONDS]: wait until a dm map with uuid mpath-WWID exists; prints its dm-N.
mpd_wait_map() {
    tl_wait "${2:-$TL_TIMEOUT}" "map mpath-$1" mp_map_of_wwid "$1" || return 1
    mp_map_of_wwid "$1"
}
mp_map_of_wwid() {
    local d
    for d in /sys/block/dm-*; do
        [ "$(cat $d/dm/uuid 2>/dev/null)" = "mpath-$1" ] && { echo "${d##*/}"; return 0; }
    done
    return 1
}
