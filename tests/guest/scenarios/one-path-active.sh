#!/bin/sh
# A map with one path still active is never stale, and clean refuses it.
. /extra/lib/mp-lib.sh
make_map
fail_path 8:0
echo offline > /sys/block/sda/device/state
echo "status: $(dmsetup status mpathb)"
echo "BEGIN holders"; $A $J holders "$MAP" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e
echo "BEGIN clean"; $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"
set -e
[ -e /sys/block/$MAP ] && [ -e /sys/block/sdb ] || fail "the map or its active path was removed"
echo OK
