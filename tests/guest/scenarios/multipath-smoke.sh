#!/bin/sh
# multipath-smoke: two scsi_debug paths to one LUN, a dm-multipath map made by hand with dmsetup
# (no multipathd, no udevd), one path taken offline, then the teardown order blockjanitor uses:
# fail_if_no_path, remove the map, delete each SCSI path. Runs under busybox sh in the guest.
# Prints, at each step, the paths' sysfs device/state, the /sys/block listing and the dm status.
set -u
export DM_DISABLE_UDEV=1   # no udevd: libdevmapper makes /dev/mapper nodes itself

fail() { echo "FAIL: $*"; exit 1; }
show() {
    echo "--- $1"
    for d in $PATHS; do
        if [ -e /sys/block/$d/device/state ]; then
            echo "state $d ($(cat /sys/block/$d/dev)): $(cat /sys/block/$d/device/state)"
        else
            echo "state $d: (gone)"
        fi
    done
    echo "/sys/block: $(ls /sys/block | tr '\n' ' ')"
    if dmsetup info mp >/dev/null 2>&1; then
        STATUS=$(dmsetup status mp)
        echo "dmsetup status: $STATUS"
    else
        STATUS=
        echo "dmsetup status: (no map mp)"
    fi
}
# direct reads through the map, so that round-robin sends I/O down both paths
read_map() { dd if=/dev/mapper/mp of=/dev/null bs=4096 count=$1 iflag=direct 2>&1 | tail -n 1; }

modprobe scsi_debug add_host=2 num_tgts=1 max_luns=1 vpd_use_hostno=0 dev_size_mb=16 \
    || fail "modprobe scsi_debug"

PATHS=
for b in /sys/block/sd*; do
    [ -e "$b" ] || continue
    [ "$(cat $b/device/model | tr -d ' ')" = scsi_debug ] && PATHS="$PATHS ${b##*/}"
done
PATHS=${PATHS# }
set -- $PATHS
[ $# = 2 ] || fail "expected 2 scsi_debug paths, got: '$PATHS'"
A=$1 B=$2
for d in $A $B; do
    echo "path $d: hctl $(basename "$(readlink -f /sys/block/$d/device)") wwid $(cat /sys/block/$d/device/wwid 2>/dev/null) size $(cat /sys/block/$d/size) sectors"
done
[ "$(cat /sys/block/$A/device/wwid)" = "$(cat /sys/block/$B/device/wwid)" ] || fail "paths have different wwids"
SECTORS=$(cat /sys/block/$A/size)
DEVA=$(cat /sys/block/$A/dev) DEVB=$(cat /sys/block/$B/dev)
show "paths up, no map"

TABLE="0 $SECTORS multipath 1 queue_if_no_path 0 1 1 round-robin 0 2 1 $DEVA 1 $DEVB 1"
echo "table: $TABLE"
echo "$TABLE" | dmsetup create mp || fail "dmsetup create mp"
[ -b /dev/mapper/mp ] || fail "/dev/mapper/mp not created"
MAJMIN=$(dmsetup info -c --noheadings -o major,minor --separator : mp)
DM=$(basename "$(readlink -f "/sys/dev/block/$MAJMIN")")
echo "map mp is $DM, slaves: $(ls /sys/block/$DM/slaves | tr '\n' ' ')"
show "map created"
echo "dmsetup table: $(dmsetup table mp)"
case $STATUS in *" $DEVA A 0 $DEVB A 0"*) ;; *) fail "expected both paths active" ;; esac
echo "read: $(read_map 8)"

echo offline >/sys/block/$B/device/state
show "$B offline, before I/O"
echo "read: $(read_map 16)"
show "$B offline, after direct reads"
case $STATUS in *" $DEVA A 0 $DEVB F "*) ;; *) fail "expected $DEVB failed, $DEVA active" ;; esac

# teardown
dmsetup message mp 0 fail_if_no_path || fail "fail_if_no_path"
show "after fail_if_no_path"
TBL=$(dmsetup table mp)
echo "dmsetup table: $TBL"
case $TBL in *queue_if_no_path*) fail "queue_if_no_path still set" ;; esac
echo "open count: $(dmsetup info -c --noheadings -o open mp)"
dmsetup remove mp || fail "dmsetup remove mp"
show "map removed"
for d in $A $B; do
    echo 1 >/sys/block/$d/device/delete || fail "delete $d"
done
show "paths deleted"
for d in $A $B $DM; do [ ! -e /sys/block/$d ] || fail "/sys/block/$d still there"; done
[ -z "$STATUS" ] || fail "map still there"
echo "multipath-smoke: ok"
