#!/bin/sh
# Issue 12: kpartx partition maps on a dead multipath map are removed before the map (the first
# run of that path against real kpartx maps). The map (mpathb) gets a DOS partition table with
# two partitions, kpartx maps them (mpathb1, mpathb2: dm uuids part1-/part2-mpath-<wwid>), then
# both paths fail. `clean --apply` stops queueing, removes both partition maps, then the map,
# then sets its paths offline and deletes them.
#
# Sections for tests/tests/guest.rs: layers, holders (JSON), clean (ends rc=N), journal (JSON
# lines), exists-after, timing.
. /extra/lib/mp-lib.sh
T0=$(cut -d' ' -f1 /proc/uptime)
make_map

# A DOS partition table written by hand (no partitioning tool needed): two Linux (0x83)
# partitions of 4 MiB at sectors 2048 and 10240. Entries at byte 446, 16 bytes each: status,
# CHS start (3), type, CHS end (3), LBA start (4, little endian), sectors (4).
{
  printf '\000\000\000\000\203\000\000\000\000\010\000\000\000\040\000\000'
  printf '\000\000\000\000\203\000\000\000\000\050\000\000\000\040\000\000'
  dd if=/dev/zero bs=16 count=2 2>/dev/null
  printf '\125\252'
} >/tmp/mbr
[ "$(wc -c </tmp/mbr)" = 66 ] || fail "the partition table is $(wc -c </tmp/mbr) bytes, not 66"
dd if=/tmp/mbr of=/dev/mapper/mpathb bs=1 seek=446 conv=notrunc,fsync 2>/dev/null || fail "write the partition table"
kpartx -a /dev/mapper/mpathb >/tmp/kpartx.log 2>&1 || { cat /tmp/kpartx.log; fail "kpartx -a"; }
# kpartx names them mpathb1 or mpathbp1 by version; the dm uuid is what counts.
by_uuid() { for d in /sys/block/dm-*; do [ "$(cat $d/dm/uuid)" = "$1" ] && basename $d; done; return 0; }
P1=$(by_uuid part1-mpath-333333330000007d0) P2=$(by_uuid part2-mpath-333333330000007d0)
[ -n "$P1" ] && [ -n "$P2" ] || { cat /tmp/kpartx.log; fail "kpartx made no partition maps: $(dmsetup ls)"; }
echo "BEGIN layers"
for d in "$MAP" "$P1" "$P2"; do
  n=$(cat /sys/block/$d/dm/name)
  echo "$n $d uuid=$(cat /sys/block/$d/dm/uuid) table=$(dmsetup table $n) holders=$(ls /sys/block/$d/holders | tr '\n' ' ')"
done
echo "END layers"

fail_path 8:0
fail_path 8:16
echo offline >/sys/block/sda/device/state
echo offline >/sys/block/sdb/device/state
echo "status: $(dmsetup status mpathb)"

set +e
echo "BEGIN holders"; timeout 60 $A $J holders "$MAP" --grace-period 0 --output json; echo "END holders"
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
