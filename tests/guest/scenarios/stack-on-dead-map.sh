#!/bin/sh
# Issue 12, stacks on dead devices: LVM and LUKS on a dead multipath map. The map (mpathb) is an
# LVM PV of vg0 with two LVs: lv0 (ext4) and lv1 carrying a LUKS2 mapping "secret". Then both
# paths fail (queue_if_no_path: any I/O hangs).
#
# Phase "held": lv0 is mounted on the host (and in a foreign mount namespace): nothing is
#   removed, `clean` refuses (exit 2), and the map's verdict names the host mount and the way to
#   it ("... (on LV vg0/lv0 (dm-N), stacked on dm-0)").
# Phase "daemon": the host mount goes (the foreign namespace keeps the filesystem alive, so the
#   unmount does no I/O); the agent runs as a daemon in clean mode with a 2 s grace period: after
#   it, it stops the map's queueing, releases the foreign mount, removes the crypt mapping and
#   both LVs (top-down, by uuid; no key, no LVM command), then the map and its paths.
#
# Sections for tests/tests/guest.rs: layers, holders-held (JSON), clean-held (ends rc=N),
# exists-held, journal (JSON lines), exists-after, timing. The scenario exits non-zero when the
# contract is broken, so run.sh alone says whether the agent kept its promise.
. /extra/lib/mp-lib.sh
T0=$(cut -d' ' -f1 /proc/uptime)
. /usr/lib/blockjanitor/transport-lib.sh
make_map

# vg0 on the map: lv0 (ext4) and lv1 (LUKS2, opened as "secret"), with the image's lvm.conf (no
# udevd; the sd paths under the mpath- map are skipped as multipath components).
LV0=$(lvm_on /dev/mapper/mpathb vg0 lv0 4m) || fail "lvm_on"
lvcreate -q -y -W n -Z n -L 4m -n lv1 vg0 >/dev/null || fail "lvcreate lv1"
LV1=$(tl_dm_of vg0-lv1) || fail "no vg0-lv1"
CRYPT=$(luks_on /dev/mapper/vg0-lv1 secret) || fail "luks_on"
echo "BEGIN layers"
for n in mpathb vg0-lv0 vg0-lv1 secret; do
  d=$(tl_dm_of $n)
  echo "$n $d uuid=$(cat /sys/block/$d/dm/uuid) slaves=$(ls /sys/block/$d/slaves | tr '\n' ' ')holders=$(ls /sys/block/$d/holders | tr '\n' ' ')"
done
echo "END layers"

mke2fs -F /dev/mapper/vg0-lv0 >/tmp/mke2fs.log 2>&1 || { cat /tmp/mke2fs.log; fail "mke2fs"; }
mkdir -p /mnt/lv
mount -t ext4 /dev/mapper/vg0-lv0 /mnt/lv || fail "mount"
echo data >/mnt/lv/file
sync
# A copy in a foreign mount namespace (incident 5): it outlives the host's.
unshare -m --propagation private sleep 1000 &
HOLDER=$!
i=0; while ! grep -q ' /mnt/lv ' /proc/$HOLDER/mountinfo 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
grep -q ' /mnt/lv ' /proc/$HOLDER/mountinfo || fail "the foreign namespace has no copy of the mount"

# Every path fails; the map queues.
kill_both_paths

exists() {
  for d in "$MAP" "$LV0" "$LV1" "$CRYPT" sda sdb; do
    if [ -e /sys/block/$d ]; then echo "$d present"; else echo "$d gone"; fi
  done
}

set +e
# Phase "held": lv0 mounted on the host.
echo "BEGIN holders-held"; timeout 60 $A $J holders "$MAP" --grace-period 0 --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders-held"
echo "BEGIN clean-held"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean-held"
echo "BEGIN exists-held"; exists; echo "END exists-held"
broken=
for d in "$MAP" "$LV0" "$LV1" "$CRYPT"; do [ -e /sys/block/$d ] || broken="$broken $d-removed-under-a-host-mount"; done
dmsetup table mpathb | grep -q queue_if_no_path || broken="$broken queueing-stopped-under-a-host-mount"
grep -qE '"(dm_message|dm_remove)"' /tmp/journal.jsonl 2>/dev/null && broken="$broken dm-step-journaled-while-held"

# Phase "daemon": only the foreign copy is left.
umount /mnt/lv || broken="$broken host-umount"
T1=$(cut -d' ' -f1 /proc/uptime)
$A $J serve --no-kubernetes --socket /tmp/agent.sock --mode clean --grace-period 2 --rescan-interval 1 \
  --max-actions-per-minute 100 >/tmp/serve.log 2>&1 &
SERVE=$!
i=0; while [ -e /sys/block/sdb ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
T2=$(cut -d' ' -f1 /proc/uptime)
kill $SERVE; wait $SERVE
set -e
echo "BEGIN journal"; cat /tmp/journal.jsonl 2>/dev/null; echo "END journal"
echo "BEGIN exists-after"; exists; dmsetup ls; echo "END exists-after"
echo "BEGIN serve-log"; grep -E 'audit|not acting|WARN|ERROR' /tmp/serve.log | tail -40; echo "END serve-log"
echo "BEGIN timing"
echo "setup $(echo "$T0 $T1" | awk '{printf "%.1f", $2-$1}') s, daemon until the last path was deleted $(echo "$T1 $T2" | awk '{printf "%.1f", $2-$1}') s"
echo "END timing"
kill -0 $HOLDER 2>/dev/null || broken="$broken holder-killed"
for d in "$MAP" "$LV0" "$LV1" "$CRYPT" sda sdb; do [ ! -e /sys/block/$d ] || broken="$broken $d-left"; done
grep -q ' /mnt/lv ' /proc/$HOLDER/mountinfo 2>/dev/null && broken="$broken foreign-mount-left"
# The scenario's own teardown, so /init's final sync cannot hang on a map left queueing.
dmsetup message mpathb 0 fail_if_no_path 2>/dev/null || true
[ -z "$broken" ] || fail "stack on a dead map:$broken"
echo OK
