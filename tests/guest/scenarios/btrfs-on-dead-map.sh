#!/bin/sh
# Issue 9: btrfs mounted on a dead multipath map (queue_if_no_path, every path failed). btrfs shows
# an anonymous 0:NN device in mountinfo, never the map's 254:0, so an agent matching mountinfo
# numbers sees no holder and judges the map stale. The contract: the mount is found (joined through
# /sys/fs/btrfs/<uuid>/devices/, or the kernel's exclusive-open claim), the map is in_use, and
# `clean --apply` refuses (exit 2) without sending fail_if_no_path (which would fail the
# filesystem's queued and future I/O: data loss) or removing anything.
#
# Sections for tests/tests/guest.rs: mountinfo, holders (JSON), clean (ends with rc=N), table,
# exists, journal, kernel (dmesg), mount. The scenario also exits non-zero (after printing
# everything) when the contract is broken, so run.sh alone says whether the agent kept its promise.
. /extra/lib/mp-lib.sh
# btrfs is not loaded by /init (about 1 s of guest time under TCG: raid6_pq benchmarks itself).
modprobe btrfs || fail "modprobe btrfs"
make_map

# A 16 MB LUN is below btrfs's 114 MB minimum for separate data/metadata: mixed block groups (-M).
# -K: no TRIM at mkfs time.
mkfs.btrfs -f -M -K /dev/mapper/mpathb >/tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mkfs.btrfs"; }
mkdir -p /mnt/vol
mount -t btrfs /dev/mapper/mpathb /mnt/vol || fail "mount"
echo "written before the paths died" >/mnt/vol/file || fail "write"
# Commit everything now: nothing is dirty once the paths fail, so no I/O queues on the map unless
# someone (the agent) issues it.
sync

# What an agent has to join: mountinfo names an anonymous device, sysfs names the map.
echo "BEGIN mountinfo"
grep ' /mnt/vol ' /proc/self/mountinfo
for d in /sys/fs/btrfs/*/devices/*; do echo "btrfs $(basename "$(dirname "$(dirname "$d")")") device $(basename "$d")"; done
echo "END mountinfo"

# Every path fails, the order incident3.sh uses (no I/O needed, so nothing hangs): the target's
# fail_path message first, then the SCSI devices offline. The map keeps queue_if_no_path: from
# here on, any I/O to it hangs until queueing stops.
kill_both_paths
echo "table: $(dmsetup table mpathb)"

# The agent. Nothing below touches the filesystem's files (that would hang on the dead map).
set +e
echo "BEGIN holders"; timeout 60 $A $J holders "$MAP" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; crc=$?; echo "rc=$crc"; echo "END clean"
set -e

# What the kernel says afterwards: the map's table still has queue_if_no_path (fail_if_no_path
# removes that feature), the map exists, the mount is still in the root namespace.
echo "BEGIN table"; dmsetup table mpathb; dmsetup status mpathb; echo "END table"
echo "BEGIN exists"
if dmsetup info mpathb >/dev/null 2>&1 && [ -e "/sys/block/$MAP" ]; then echo "map mpathb ($MAP) exists"; else echo "map mpathb is gone"; fi
for d in sda sdb; do
  if [ -e /sys/block/$d ]; then echo "$d $(cat /sys/block/$d/device/state)"; else echo "$d is gone"; fi
done
echo "END exists"
echo "BEGIN journal"; cat /tmp/journal.jsonl 2>/dev/null || echo "(no journal)"; echo "END journal"
echo "BEGIN kernel"; dmesg | grep -E 'device-mapper|multipath|BTRFS' || true; echo "END kernel"
echo "BEGIN mount"; grep ' /mnt/vol ' /proc/self/mountinfo || echo "no mount on /mnt/vol"; echo "END mount"

broken=
[ "$crc" = 2 ] || broken="$broken clean-exit-$crc"
dmsetup table mpathb 2>/dev/null | grep -q queue_if_no_path || broken="$broken queueing-stopped"
[ -e "/sys/block/$MAP" ] || broken="$broken map-removed"
if grep -qE '"(dm_message|dm_remove)"' /tmp/journal.jsonl 2>/dev/null; then broken="$broken dm-step-journaled"; fi

# The scenario's own teardown: stop queueing so that /init's final sync cannot hang on the map.
dmsetup message mpathb 0 fail_if_no_path 2>/dev/null || true
[ -z "$broken" ] || fail "the agent tore down a map under a mounted btrfs:$broken"
echo OK
