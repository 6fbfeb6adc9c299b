#!/bin/sh
# Issue 9: btrfs on nbd devices whose server died. btrfs shows an anonymous 0:NN device in
# mountinfo, never nbd's 43:N, so an agent matching mountinfo numbers sees no holder and, the
# server being gone, judges the device stale. The contract: the filesystem is found (a mount of
# fstype btrfs, or a live filesystem on the device), the device is in_use, and `clean --apply`
# refuses (exit 2) without NBD_DISCONNECT (which would pull the device from under the mount).
#   nbd0: btrfs mounted in the guest's root namespace.
#   nbd1: btrfs mounted only in a foreign mount namespace (kept by a sleeping process; unmounted
#         in the root namespace), incident 5's shape.
#
# Sections for tests/tests/guest.rs: mountinfo; per device D (nbd0, nbd1) holders-D (JSON),
# clean-D (ends with rc=N), after-D (size and pid in sysfs); journal, kernel (dmesg), mount. The scenario also exits
# non-zero (after printing everything) when the contract is broken.
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
[ -x $A ] || fail "$A missing"
# btrfs is not loaded by /init (about 1 s of guest time under TCG: raid6_pq benchmarks itself).
modprobe btrfs || fail "modprobe btrfs"

truncate -s 16M /tmp/nbd0.img /tmp/nbd1.img
cat >/tmp/nbd.conf <<'CONF'
[generic]
listenaddr = 127.0.0.1
port = 10809
[root]
exportname = /tmp/nbd0.img
[foreign]
exportname = /tmp/nbd1.img
CONF
nbd-server -C /tmp/nbd.conf || fail "nbd-server"
# netlink mode (-N): the device stays configured after nbd-client exits, like rbd-nbd's.
nbd-client -N root 127.0.0.1 10809 /dev/nbd0 || fail "nbd-client nbd0"
nbd-client -N foreign 127.0.0.1 10809 /dev/nbd1 || fail "nbd-client nbd1"
for d in nbd0 nbd1; do
  i=0; while [ "$(cat /sys/block/$d/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
  [ "$(cat /sys/block/$d/size)" != 0 ] || fail "$d did not connect"
  echo "$d connected: size $(cat /sys/block/$d/size), pid $(cat /sys/block/$d/pid 2>/dev/null)"
done

# A 16 MB device is below btrfs's 114 MB minimum for separate data/metadata: mixed block groups
# (-M). -K: no TRIM at mkfs time.
for d in nbd0 nbd1; do
  mkfs.btrfs -f -M -K /dev/$d >/tmp/mkfs.log 2>&1 || { cat /tmp/mkfs.log; fail "mkfs.btrfs $d"; }
  mkdir -p /mnt/$d
  mount -t btrfs /dev/$d /mnt/$d || fail "mount $d"
  echo "written while the server lived" >/mnt/$d/file || fail "write on $d"
done
sync

# nbd1's mount lives on only in a foreign namespace (unshare -m copies the mount table, private).
unshare -m sleep 1000 &
HOLDER=$!
sleep 0.3
umount /mnt/nbd1 || fail "umount nbd1 in the root namespace"
grep -q ' /mnt/nbd1 ' /proc/$HOLDER/mountinfo || fail "the foreign namespace lost nbd1's mount"

# What an agent has to join: mountinfo names anonymous devices, sysfs names nbd0 and nbd1.
echo "BEGIN mountinfo"
echo "root namespace:"; grep btrfs /proc/self/mountinfo
echo "namespace of pid $HOLDER:"; grep btrfs /proc/$HOLDER/mountinfo
for d in /sys/fs/btrfs/*/devices/*; do echo "btrfs $(basename "$(dirname "$(dirname "$d")")") device $(basename "$d")"; done
echo "END mountinfo"

# The server dies: the case the agent would judge stale (server process gone).
killall -9 nbd-server || fail "kill nbd-server"
sleep 0.3

# The agent, once per device. Nothing below touches the filesystems' files.
set +e
rc_nbd0= rc_nbd1=
for d in nbd0 nbd1; do
  echo "BEGIN holders-$d"; timeout 60 $A $J --grace-period 0 holders $d --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders-$d"
  echo "BEGIN clean-$d"; timeout 60 $A $J clean $d --grace-period 0 --apply; rc=$?; echo "rc=$rc"; echo "END clean-$d"
  eval "rc_$d=$rc"
done
set -e

# What the kernel says afterwards: a connected nbd device has a non-zero size and a pid file.
for d in nbd0 nbd1; do
  echo "BEGIN after-$d"
  echo "size=$(cat /sys/block/$d/size)"
  if [ -e /sys/block/$d/pid ]; then echo "pid=$(cat /sys/block/$d/pid)"; else echo "pid=none"; fi
  echo "END after-$d"
done
echo "BEGIN journal"; cat /tmp/journal.jsonl 2>/dev/null || echo "(no journal)"; echo "END journal"
# sysfs alone cannot prove nbd was left alone: while btrfs keeps the device open, the kernel keeps
# its size and pid until the last close even after NBD_DISCONNECT. The kernel logs every
# NBD_DISCONNECT it receives ("block nbdN: NBD_DISCONNECT"): that log is the proof.
echo "BEGIN kernel"; dmesg | grep -E 'nbd|BTRFS' || true; echo "END kernel"
echo "BEGIN mount"
echo "root namespace:"; grep ' /mnt/nbd0 ' /proc/self/mountinfo || echo "no mount on /mnt/nbd0"
echo "namespace of pid $HOLDER:"; grep ' /mnt/nbd1 ' /proc/$HOLDER/mountinfo || echo "no mount on /mnt/nbd1"
echo "END mount"
kill -0 $HOLDER || fail "the foreign namespace's process was killed"

broken=
for d in nbd0 nbd1; do
  eval "rc=\$rc_$d"
  [ "$rc" = 2 ] || broken="$broken $d-clean-exit-$rc"
  [ "$(cat /sys/block/$d/size)" != 0 ] || broken="$broken $d-disconnected"
done
if grep -q '"nbd_disconnect"' /tmp/journal.jsonl 2>/dev/null; then broken="$broken nbd_disconnect-journaled"; fi
if dmesg | grep -q 'NBD_DISCONNECT'; then broken="$broken kernel-got-NBD_DISCONNECT"; fi
[ -z "$broken" ] || fail "the agent disconnected nbd under a mounted btrfs:$broken"
echo OK
