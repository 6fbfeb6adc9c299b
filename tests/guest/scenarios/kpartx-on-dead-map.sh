#!/bin/sh
# Issue 12: kpartx partition maps on a dead multipath map are removed before the map (the first
# run of that path against real kpartx maps). The map (mpathb) gets a DOS partition table with
# two partitions, kpartx maps them (dm uuids part1-/part2-mpath-<wwid>), then both paths fail.
# `clean --apply` stops queueing, removes both partition maps, then the map, then sets its paths
# offline and deletes them.
#
# Sections for tests/tests/guest.rs: layers, holders (JSON), clean (ends rc=N), journal (JSON
# lines), exists-after, timing.
. /extra/lib/mp-lib.sh
T0=$(cut -d' ' -f1 /proc/uptime)
. /usr/lib/blockjanitor/transport-lib.sh
make_map

# A DOS partition table with two partitions (sfdisk), mapped by `kpartx -a -s`: mpathb1/mpathb2
# (or mpathbp1...), dm uuids part1-/part2-mpath-333333330000007d0.
PARTS=$(parts_on /dev/mapper/mpathb 2) || fail "parts_on"
P1=${PARTS%% *} P2=${PARTS##* }
echo "BEGIN layers"
for d in "$MAP" "$P1" "$P2"; do
  n=$(cat /sys/block/$d/dm/name)
  echo "$n $d uuid=$(cat /sys/block/$d/dm/uuid) table=$(dmsetup table $n) holders=$(ls /sys/block/$d/holders | tr '\n' ' ')"
done
echo "END layers"

kill_both_paths

set +e
echo "BEGIN holders"; timeout 60 $A $J holders "$MAP" --grace-period 0 --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
T1=$(cut -d' ' -f1 /proc/uptime)
echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"
T2=$(cut -d' ' -f1 /proc/uptime)
set -e
echo "BEGIN journal"; cat /tmp/journal.jsonl 2>/dev/null; echo "END journal"
echo "BEGIN exists-after"
for d in "$MAP" "$P1" "$P2" sda sdb; do if [ -e /sys/block/$d ]; then echo "$d present"; else echo "$d gone"; fi; done
dmsetup ls
echo "END exists-after"
echo "BEGIN timing"
echo "setup $(echo "$T0 $T1" | awk '{printf "%.1f", $2-$1}') s, clean $(echo "$T1 $T2" | awk '{printf "%.1f", $2-$1}') s"
echo "END timing"
broken=
for d in "$MAP" "$P1" "$P2" sda sdb; do [ ! -e /sys/block/$d ] || broken="$broken $d-left"; done
dmsetup message mpathb 0 fail_if_no_path 2>/dev/null || true
[ -z "$broken" ] || fail "kpartx maps on a dead map:$broken"
echo OK
