#!/bin/sh
# fixtures-dump: set up one issue-12 scene in the guest and dump the sysfs the agent reads (files'
# contents, symlink targets, directories) plus `dmsetup table`/`status` to the 9p share, for
# tests/fixtures/make-guest-fixtures.py, which writes tests/fixtures/<scene>/ from it.
#
#   BLOCKJANITOR_GUEST_SHARE=DIR BLOCKJANITOR_GUEST_APPEND=scene=iscsi-guest \
#       tests/guest/run.sh tests/guest/scenarios/fixtures-dump.sh
#
# Scenes (kernel command line scene=NAME):
#   iscsi-guest  LIO target + open-iscsi: session1 live (2 LUNs); session2 whose 2 LUNs were removed
#                target-side (sd devices left `running`, their reads failed: ioerr_cnt); session3 whose LUN was removed
#                and its sd deleted (no LUN left); session4 and session5 to portal 127.0.0.1:3261,
#                which went down: session4 with recovery_tmo 2 s, which passed (the kernel then
#                says FREE, its sd transport-offline), session5 with recovery_tmo 120 (FAILED, its
#                sd blocked).
#   nvme-tcp-guest nvmet over TCP: subsystem nvme-live reached through ports 4420 and 4422 (nvme0,
#                nvme1: native multipath, one head nvme0n1 and the hidden paths nvme0c0n1,
#                nvme0c1n1); subsystem nvme-lost through port 4421 (nvme2, ctrl_loss_tmo -1,
#                reconnect_delay 2) whose port was removed: `connecting`.
#   dm-stacks    one LIO target with 3 LUNs reached through two portals (127.0.0.1, 127.0.0.2): two
#                iSCSI sessions, 6 sd paths, 3 dm-multipath maps made with dmsetup (mpatha, mpathb,
#                mpathc; uuid mpath-<wwid>); an LVM LV on mpatha, a LUKS2 mapping on mpathb, two
#                kpartx partitions on mpathc; then every path failed in the maps (fail_path: dead
#                maps, sd devices still running, as in incident 3).
# Output in /mnt/host/SCENE/: sys.tar (the dumped tree, below sys/), dm-table.txt, dm-status.txt
# (`dmsetup table` / `dmsetup status` of every map), kernel.txt (uname -r, /etc/guest-release),
# scene.txt (what was set up, names and numbers).
set -u
. /usr/lib/blockjanitor/transport-lib.sh
fail() { echo "FAIL: $*"; dmesg | tail -n 20; exit 1; }
SCENE=
for a in $(cat /proc/cmdline); do case $a in scene=*) SCENE=${a#scene=} ;; esac; done
[ -n "$SCENE" ] || fail "no scene= on the kernel command line"
grep -q ' /mnt/host 9p ' /proc/mounts || fail "no 9p share on /mnt/host (BLOCKJANITOR_GUEST_SHARE)"
OUT=/mnt/host/$SCENE
STAGE=/tmp/dump
mkdir -p $OUT $STAGE
T0=$(tl_now)
note() { echo "$*" | tee -a $STAGE/scene.txt; }
: >$STAGE/scene.txt

# ------------------------------------------------------------------ the dump
# Directory names below a device that the agent never reads (and that are big): not dumped.
PRUNE='power queue mq trace integrity bdi firmware_node bsg scsi_generic'
# dump_tree DIR: DIR (below /sys, no symlink in its path) and everything below it, except the
# PRUNE subdirectories: directories, symlinks (their target text as is) and readable files (their
# content; a file that cannot be read, e.g. write-only, is left out and listed in unreadable.txt).
# One `cp -a --parents` per batch of files (a process per file costs ~80 ms under a loaded TCG).
dump_tree() {
    local expr= n
    for n in $PRUNE; do expr="$expr -name $n -prune -o"; done
    # shellcheck disable=SC2086
    find "$1" $expr -type d -print | sed 's|^/||' | (cd $STAGE && xargs mkdir -p)
    # shellcheck disable=SC2086
    find "$1" $expr ! -type d -print | xargs sh -c 'cp -a --parents "$@" '$STAGE' 2>>'$STAGE'/cp.err' _
    # A read error (EINVAL, EIO...) leaves an empty copy: drop the empty copies of unreadable files.
    find $STAGE/sys -type f -size 0 | while read -r f; do
        cat "${f#$STAGE}" >/dev/null 2>&1 || { rm -f "$f"; echo "${f#$STAGE}" >>$STAGE/unreadable.txt; }
    done
    sed -n "s/^cp: can't open '\(.*\)': .*/\1/p" $STAGE/cp.err >>$STAGE/unreadable.txt
    : >$STAGE/cp.err
}
dump_one() {
    local p=$1 d=$STAGE$1
    if [ -L "$p" ]; then
        mkdir -p "${d%/*}" && ln -sfn "$(readlink "$p")" "$d"
    elif [ -d "$p" ]; then
        mkdir -p "$d"
    elif [ -f "$p" ]; then
        mkdir -p "${d%/*}"
        cat "$p" >"$d" 2>/dev/null || { rm -f "$d"; echo "$p" >>$STAGE/unreadable.txt; }
    fi
}
# dump_class_links ROOT... : every entry of the /sys/class dirs and /sys/block that resolves below
# one of the ROOTs (already dumped with dump_tree): recorded as the symlink it is.
CLASSES=
dump_class_links() {
    local l r root
    for l in /sys/block/* $(for c in $CLASSES; do echo /sys/class/$c/*; done); do
        [ -L "$l" ] || continue
        r=$(readlink -f "$l")
        for root in "$@"; do
            case $r in "$root"|"$root"/*) dump_one "$l"; break ;; esac
        done
    done
}
dump_dm() {
    dmsetup table >$STAGE/dm-table.txt 2>&1
    dmsetup status >$STAGE/dm-status.txt 2>&1
}
finish() {
    uname -r >$STAGE/kernel.txt
    cat /etc/guest-release >>$STAGE/kernel.txt
    (cd $STAGE && tar -cf $OUT/sys.tar sys) || fail "tar"
    sort -u -o $STAGE/unreadable.txt $STAGE/unreadable.txt 2>/dev/null
    for f in scene.txt dm-table.txt dm-status.txt kernel.txt unreadable.txt; do
        [ -f $STAGE/$f ] && cp $STAGE/$f $OUT/$f
    done
    echo "dumped $(find $STAGE/sys | wc -l) entries ($(find $STAGE/sys -type l | wc -l) links) in $(tl_since $T0) s"
    echo "fixtures-dump $SCENE OK"
}
# iscsi_roots: the /sys/devices dirs of the iSCSI hosts (one per session, iscsi_tcp).
iscsi_roots() {
    local h
    for h in /sys/class/iscsi_host/*; do readlink -f $h/device; done
}

# ------------------------------------------------------------------ scenes
scene_iscsi() {
    local base=iqn.2026-11.io.blockjanitor
    iscsi_target_up $base:live 2 || fail "target live"
    iscsi_target_up $base:unmapped 2 || fail "target unmapped"
    iscsi_target_up $base:emptied 1 || fail "target emptied"
    iscsi_target_up $base:outage 1 127.0.0.1:3261 || fail "target outage"
    iscsi_target_up $base:outage2 1 127.0.0.1:3261 || fail "target outage2"
    iscsi_login $base:live 127.0.0.1:3260 120 2 >/dev/null || fail "login live"
    note "$ISCSI_SESSION $base:live 127.0.0.1:3260 live: $ISCSI_DEVS"
    iscsi_login $base:unmapped 127.0.0.1:3260 120 2 >/dev/null || fail "login unmapped"
    note "$ISCSI_SESSION $base:unmapped 127.0.0.1:3260 LUNs 0 and 1 removed target-side: $ISCSI_DEVS (left, reads fail)"
    UNMAPPED=$ISCSI_DEVS
    iscsi_login $base:emptied 127.0.0.1:3260 120 1 >/dev/null || fail "login emptied"
    note "$ISCSI_SESSION $base:emptied 127.0.0.1:3260 LUN 0 removed target-side, $ISCSI_DEVS deleted: no LUN left"
    EMPTIED=$ISCSI_DEVS
    iscsi_login $base:outage 127.0.0.1:3261 2 1 >/dev/null || fail "login outage"
    note "$ISCSI_SESSION $base:outage 127.0.0.1:3261 portal down, recovery_tmo 2 passed: FREE, $ISCSI_DEVS transport-offline"
    OUTS=$ISCSI_SESSION OUTDEV=$ISCSI_DEVS
    iscsi_login $base:outage2 127.0.0.1:3261 120 1 >/dev/null || fail "login outage2"
    note "$ISCSI_SESSION $base:outage2 127.0.0.1:3261 portal down, recovery_tmo 120: FAILED, $ISCSI_DEVS blocked"
    OUTS2=$ISCSI_SESSION OUTDEV2=$ISCSI_DEVS
    iscsi_target_del_lun $base:unmapped 0 && iscsi_target_del_lun $base:unmapped 1 || fail "del luns"
    # LIO answers for a removed LUN 0 with its small virtual LUN 0 (TUR good, reads past its end
    # fail), for other LUNs with LOGICAL UNIT NOT SUPPORTED: read 4 MB in, where both fail.
    for d in $UNMAPPED; do
        dd if=/dev/$d of=/dev/null bs=4096 count=1 skip=1000 iflag=direct 2>/dev/null && fail "read of $d worked"
    done
    iscsi_target_del_lun $base:emptied 0 || fail "del lun emptied"
    echo 1 >/sys/block/$EMPTIED/device/delete || fail "delete $EMPTIED"
    tl_wait 10 "$EMPTIED gone" test ! -e /sys/block/$EMPTIED || fail "$EMPTIED still there"
    iscsi_portal_down 127.0.0.1:3261 || fail "portal down"
    iscsi_wait_state $OUTS2 FAILED 20 || fail "$OUTS2 not FAILED"
    tl_wait 20 "$OUTDEV transport-offline" grep -qx transport-offline /sys/block/$OUTDEV/device/state \
        || fail "$OUTDEV: $(cat /sys/block/$OUTDEV/device/state)"
    iscsi_state_is $OUTS FREE || fail "$OUTS: $(iscsi_session_state $OUTS)"
    iscsi_state_is $OUTS2 FAILED || fail "$OUTS2: $(iscsi_session_state $OUTS2)"
    grep -qx blocked /sys/block/$OUTDEV2/device/state || fail "$OUTDEV2: $(cat /sys/block/$OUTDEV2/device/state)"
    for s in /sys/class/iscsi_session/*; do
        note "${s##*/}: state $(cat $s/state) devices: $(iscsi_session_devs ${s##*/})"
    done
    for d in /sys/block/sd*; do note "${d##*/}: $(cat $d/device/state) $(cat $d/device/wwid)"; done
    CLASSES="iscsi_session iscsi_connection iscsi_host iscsi_endpoint scsi_host scsi_device scsi_disk block"
    for r in $(iscsi_roots); do dump_tree $r; done
    dump_class_links $(iscsi_roots)
}

scene_nvme() {
    local base=nqn.2026-11.io.blockjanitor
    nvmet_target_up $base:nvme-live 1 1 || fail "target live"
    nvmet_port_link 3 $base:nvme-live || fail "port 3"
    nvmet_target_up $base:nvme-lost 1 2 || fail "target lost"
    nvme_host_connect $base:nvme-live 1 >/dev/null || fail "connect live port 1"
    note "$NVME_CTRL $base:nvme-live 127.0.0.1:4420 live"
    nvme_host_connect $base:nvme-live 3 >/dev/null || fail "connect live port 3"
    note "$NVME_CTRL $base:nvme-live 127.0.0.1:4422 live (second path)"
    nvme_host_connect $base:nvme-lost 2 -1 2 >/dev/null || fail "connect lost"
    LOST=$NVME_CTRL
    note "$LOST $base:nvme-lost 127.0.0.1:4421 ctrl_loss_tmo -1 reconnect_delay 2: port removed, connecting"
    nvmet_port_remove 2 || fail "port remove"
    nvme_wait_state $LOST connecting 20 || fail "$LOST: $(nvme_ctrl_state $LOST)"
    sleep 3   # at least one failed reconnect attempt
    nvme_state_is $LOST connecting || fail "$LOST left connecting: $(nvme_ctrl_state $LOST)"
    for c in /sys/class/nvme/*; do
        note "${c##*/}: state $(cat $c/state) subsys $(nvme_subsys_of ${c##*/}) paths $(ls $c | grep -E '^nvme[0-9]+c[0-9]+n[0-9]+$' | tr '\n' ' ')"
    done
    for s in /sys/class/nvme-subsystem/*; do note "${s##*/}: $(ls $s | grep -E '^nvme' | tr '\n' ' ')"; done
    CLASSES="nvme nvme-subsystem nvme-fabrics block"
    ROOTS="/sys/devices/virtual/nvme-fabrics /sys/devices/virtual/nvme-subsystem"
    for r in $ROOTS; do dump_tree $r; done
    dump_class_links $ROOTS
}

scene_dm() {
    local iqn=iqn.2026-11.io.blockjanitor:stacks s devs a b i m
    iscsi_target_up $iqn 3 || fail "target"
    iscsi_portal_add $iqn 127.0.0.2:3260 || fail "second portal"
    iscsi_login $iqn 127.0.0.1:3260 120 3 >/dev/null || fail "login 1"
    A=$ISCSI_DEVS
    iscsi_login $iqn 127.0.0.2:3260 120 3 >/dev/null || fail "login 2"
    B=$ISCSI_DEVS
    note "paths via 127.0.0.1: $A; via 127.0.0.2: $B"
    i=1
    for m in mpatha mpathb mpathc; do
        a=$(echo $A | cut -d' ' -f$i) b=$(echo $B | cut -d' ' -f$i)
        [ "$(sd_udev_wwid $a)" = "$(sd_udev_wwid $b)" ] || fail "$a and $b differ"
        mp_map_by_hand $m $a $b >/dev/null || fail "map $m"
        note "$m = $MP_DM on $a $b, uuid $(tl_dm_uuid $MP_DM)"
        i=$((i + 1))
    done
    lvm_on /dev/mapper/mpatha vgdata lvdata >/dev/null || fail "lvm"
    note "vgdata/lvdata = $LV_DM on mpatha, uuid $(tl_dm_uuid $LV_DM)"
    luks_on /dev/mapper/mpathb cryptdata >/dev/null || fail "luks"
    note "cryptdata = $CRYPT_DM on mpathb, uuid $(tl_dm_uuid $CRYPT_DM)"
    parts_on /dev/mapper/mpathc 2 >/dev/null || fail "kpartx"
    for p in $PART_DMS; do note "$(tl_dm_name $p) = $p on mpathc, uuid $(tl_dm_uuid $p)"; done
    # The array is gone: every path fails (the multipath target's fail_path message: no I/O, so
    # nothing hangs; the sd devices stay `running`, as in incident 3).
    for m in mpatha mpathb mpathc; do
        for dev in $(dmsetup table $m | tr ' ' '\n' | grep -E '^[0-9]+:[0-9]+$'); do
            dmsetup message $m 0 fail_path $dev || fail "fail_path $dev in $m"
        done
        note "$m: $(dmsetup status $m)"
    done
    dump_dm
    CLASSES="iscsi_session iscsi_connection iscsi_host scsi_host scsi_device scsi_disk block"
    ROOTS="$(iscsi_roots) $(for d in /sys/block/dm-*; do readlink -f $d; done)"
    for r in $ROOTS; do dump_tree $r; done
    dump_class_links $ROOTS
}

case $SCENE in
    iscsi-guest) scene_iscsi ;;
    nvme-tcp-guest) scene_nvme ;;
    dm-stacks) scene_dm ;;
    *) fail "unknown scene $SCENE" ;;
esac
finish
