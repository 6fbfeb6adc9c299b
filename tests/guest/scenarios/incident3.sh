#!/bin/sh
# Incident 3: after failover the LUN is gone; the host keeps the map and both paths, failed.
# The agent reports the map and both disks stale with reasons, and `clean --apply` removes the
# map and both disks.
. /extra/lib/mp-lib.sh
make_map
kill_both_paths
echo "BEGIN scan"; $A $J scan --grace-period 0 --output json; echo "END scan"
echo "BEGIN table"; $A $J scan --grace-period 0; echo "END table"
echo "BEGIN holders"; $A $J holders "$MAP" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN clean"; $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"; set -e
echo "BEGIN after"; ls /sys/block; dmsetup ls; echo "END after"
for d in sda sdb "$MAP"; do [ ! -e /sys/block/$d ] || fail "$d still in /sys/block"; done
echo OK
