#!/bin/sh
# Issue 12, iSCSI: a LIO target on the guest's loopback exports LUNs 1 and 2 of target A
# (session A) and one LUN of target B (session B, mounted) and of target C (session C, unheld).
# A's LUNs are removed on the target side; one read per disk (what a path checker does) makes the
# kernel log LOGICAL UNIT NOT SUPPORTED. The agent then deletes A's disks and logs session A out
# through iscsid (delete first, then logout); B and C are untouched. Then the whole portal goes
# down (every session fails, the disks go transport-offline): an outage, and nothing is cleaned.
#
# LUN 0 is not exported: once LIO's LUN 0 is removed, LIO answers on LUN 0 with its read-only
# virtual LUN 0 (reads return zeros and succeed), so the initiator never hears that it is gone
# (measured on Debian's 6.1 kernel; see ARCHITECTURE.md, "iSCSI").
set -u
. /usr/lib/blockjanitor/transport-lib.sh
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl --state /tmp/state.json"
fail() { echo "FAIL: $*"; exit 1; }
T0=$(tl_now)
TA=iqn.2026-11.io.blockjanitor:stale-a
TB=iqn.2026-11.io.blockjanitor:mounted-b
TC=iqn.2026-11.io.blockjanitor:idle-c

iscsi_target_up $TA 3 || fail "target A"
iscsi_target_del_lun $TA 0 || fail "target A: drop LUN 0 before login"
iscsi_target_up $TB 1 || fail "target B"
iscsi_target_up $TC 1 || fail "target C"
SA=$(iscsi_login $TA "" 5 2) || fail "login A"
SB=$(iscsi_login $TB "" 5 1) || fail "login B"
SC=$(iscsi_login $TC "" 5 1) || fail "login C"
DA=$(iscsi_session_devs $SA); DB=$(iscsi_session_devs $SB); DC=$(iscsi_session_devs $SC)
set -- $DA; A1=$1; A2=$2
echo "sessions: A=$SA ($DA) B=$SB ($DB) C=$SC ($DC)"
mke2fs -F /dev/$DB >/dev/null 2>&1 || fail "mke2fs $DB"
mkdir -p /mnt/b && mount -t ext4 /dev/$DB /mnt/b || fail "mount $DB"
echo "scene up after $(tl_since $T0) s"

echo "BEGIN before"; $A $J holders $A1 --output json || case $? in 2|3) ;; *) false ;; esac; echo "END before"
iscsi_target_del_lun $TA 1 || fail "del LUN 1"
iscsi_target_del_lun $TA 2 || fail "del LUN 2"
# What the kernel shows without I/O: nothing changes (state running, session LOGGED_IN).
echo "BEGIN kernel-after-removal"
for d in $A1 $A2; do echo "$d state=$(cat /sys/block/$d/device/state) ioerr=$(cat /sys/block/$d/device/ioerr_cnt)"; done
echo "$SA $(cat /sys/class/iscsi_session/$SA/state)"
echo "END kernel-after-removal"
# A path checker's read (scene setup, not the agent: the agent does no I/O to a disk).
for d in $A1 $A2; do dd if=/dev/$d of=/dev/null bs=4k count=1 iflag=direct 2>/dev/null && fail "read of $d succeeded"; done
echo "BEGIN kernel-after-read"
for d in $A1 $A2; do echo "$d state=$(cat /sys/block/$d/device/state) ioerr=$(cat /sys/block/$d/device/ioerr_cnt)"; done
dmesg | grep "Logical unit not supported"
echo "END kernel-after-read"

# A grace period of 12 s: the first look starts each disk's clock (the one-shot CLI keeps its
# clocks in its state file), a clean before it has run refuses, one after it acts. The second
# look and the early clean must fit in it: two one-shot runs under TCG on a loaded host took
# over 3 s (CI22), so the margin is wide.
G="--grace-period 12"
echo "BEGIN holders"; $A $J holders $A1 $G --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
$A $J holders $A2 $G --output json >/dev/null || case $? in 2|3) ;; *) false ;; esac
echo "BEGIN too-soon"; $A $J clean $A1 $G --apply; echo "rc=$?"; echo "END too-soon"
sleep 13
echo "BEGIN holders-after"; $A $J holders $A1 $G --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders-after"
T1=$(tl_now)
echo "BEGIN clean1"; $A $J clean $A1 $G --apply; echo "rc=$?"; echo "END clean1"
echo "BEGIN clean2"; $A $J clean $A2 $G --apply; echo "rc=$?"; echo "END clean2"
echo "agent cleanup took $(tl_since $T1) s"
[ ! -e /sys/block/$A1 ] && [ ! -e /sys/block/$A2 ] || fail "A's disks are still there"
[ ! -e /sys/class/iscsi_session/$SA ] || fail "$SA is still logged in"
iscsi_state_is $SB LOGGED_IN && iscsi_state_is $SC LOGGED_IN || fail "B or C is not logged in any more"
[ -e /sys/block/$DB ] && [ -e /sys/block/$DC ] || fail "B's or C's disk is gone"
grep -q " /mnt/b " /proc/mounts || fail "B is not mounted any more"
echo "BEGIN journal"; cat /tmp/journal.jsonl; echo "END journal"

# The whole portal goes down: every session fails; past replacement_timeout (5 s) the disks
# go transport-offline, which alone would make C's unheld disk a candidate.
iscsi_portal_down || fail "portal down"
for d in $DB $DC; do
    tl_wait 20 "$d transport-offline" sh -c "[ \"\$(cat /sys/block/$d/device/state)\" = transport-offline ]" \
        || fail "$d never went transport-offline"
done
echo "BEGIN outage-kernel"
for s in $SB $SC; do echo "$s $(cat /sys/class/iscsi_session/$s/state)"; done
for d in $DB $DC; do echo "$d $(cat /sys/block/$d/device/state)"; done
echo "END outage-kernel"
echo "BEGIN outage-scan"; $A $J scan --grace-period 0 --output json; echo "END outage-scan"
echo "BEGIN outage-clean"; $A $J clean $DC --grace-period 0 --apply; echo "rc=$?"; echo "END outage-clean"
[ -e /sys/block/$DC ] && [ -e /sys/class/iscsi_session/$SC ] || fail "something was cleaned during the outage"
echo "scenario took $(tl_since $T0) s"
echo OK
