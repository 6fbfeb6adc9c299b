#!/bin/sh
# NVMe/TCP over the guest's loopback (issue 12), set up with transport-lib.sh: an nvmet target
# (configfs) with three subsystems, each on its own port of 127.0.0.1, and the kernel's NVMe/TCP
# host connected to each with ctrl_loss_tmo=-1 (reconnect for ever):
#   A (port 4420): nothing uses it; its port is removed, so its controller reconnects for ever:
#       suspect, then stale after the grace period, and `clean` deletes the controller;
#   B (port 4422): its namespace is mounted in a foreign mount namespace; its port is removed
#       too: the plan is refused (never deleted under the mount, never released while no path
#       is live), the controller and the mount stay;
#   C (port 4421): live: never touched;
# then C's port goes too: every controller left to 127.0.0.1 is down at once: an outage is
# reported and nothing is cleaned.
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl --state /tmp/state.json --rescan-interval 5"
fail() { echo "FAIL: $*"; exit 1; }
[ -x $A ] || fail "$A missing"
T0=$(cut -d' ' -f1 /proc/uptime)
t() { awk -v a="$T0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f", b - a }'; }

. /extra/lib/nvme-lib.sh
# Port IDs: 1 = 127.0.0.1:4420 (A), 2 = :4421 (C), 3 = :4422 (B).
wait_state() { nvme_wait_state "$1" "$2" 10 || fail "$1 not $2 ($(state $1))"; }
head_of() { nvme_ns_heads "$1" | cut -d' ' -f1; }

nvmet_target_up nqn.2026-11.io.blockjanitor:a 1 1 || fail "target a"
nvmet_target_up nqn.2026-11.io.blockjanitor:c 1 2 || fail "target c"
nvmet_target_up nqn.2026-11.io.blockjanitor:b 1 3 || fail "target b"
CA=$(nvme_host_connect nqn.2026-11.io.blockjanitor:a 1 -1 1) || fail "connect a"
CC=$(nvme_host_connect nqn.2026-11.io.blockjanitor:c 2 -1 1) || fail "connect c"
CB=$(nvme_host_connect nqn.2026-11.io.blockjanitor:b 3 -1 1) || fail "connect b"
HA=$(head_of $CA); HB=$(head_of $CB); HC=$(head_of $CC)
echo "A: $CA $HA  B: $CB $HB  C: $CC $HC  (connected at $(t)s)"

# B's namespace is mounted only in a foreign mount namespace (incident 5's shape).
mke2fs -F -b 4096 /dev/$HB >/dev/null 2>&1 || fail "mke2fs $HB"
unshare -m sh -c "mkdir -p /mnt/b && mount -t ext4 /dev/$HB /mnt/b && exec sleep 1000" &
HOLDER=$!
i=0; while ! grep -q ' /mnt/b ' /proc/$HOLDER/mountinfo 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || fail "no foreign mount"; sleep 0.1; done
echo "B mounted in the mount namespace of pid $HOLDER"

nvmet_port_remove 1 || fail "remove port 4420"
nvmet_port_remove 3 || fail "remove port 4422"
wait_state $CA connecting
wait_state $CB connecting
echo "ports 4420 and 4422 removed: $CA $(state $CA), $CB $(state $CB), $CC $(state $CC) at $(t)s"

# First look: a candidate, not stale before the grace period (2 s).
echo "BEGIN first"; $A $J --grace-period 2 holders $HA --output json || case $? in 2|3) ;; *) false ;; esac; echo "END first"
sleep 2.5
echo "BEGIN scan"; $A $J --grace-period 2 scan --output json; echo "END scan"
set +e
echo "BEGIN clean_a"; S=$(t); timeout 60 $A $J --grace-period 2 clean $HA --apply; echo "rc=$?"; echo "took $(awk -v a="$S" -v b="$(t)" 'BEGIN { printf "%.1f", b - a }')s"; echo "END clean_a"
echo "BEGIN clean_b"; timeout 60 $A $J --grace-period 0 clean $HB --apply; echo "rc=$?"; echo "END clean_b"
echo "BEGIN clean_c"; timeout 60 $A $J --grace-period 0 clean $HC --apply; echo "rc=$?"; echo "END clean_c"
set -e
[ "$(state $CA)" = gone ] || fail "$CA still there: $(state $CA)"
[ ! -e /sys/class/block/$HA ] || fail "$HA still there"
[ "$(state $CB)" = connecting ] || fail "$CB is $(state $CB), not left connecting"
grep -q ' /mnt/b ' /proc/$HOLDER/mountinfo || fail "B's foreign mount was released"
[ "$(state $CC)" = live ] || fail "$CC is $(state $CC), not live"
echo "after clean: $CA $(state $CA), $CB $(state $CB), $CC $(state $CC)"

# Now C's port goes too: every controller left to 127.0.0.1 is down: an outage.
nvmet_port_remove 2 || fail "remove port 4421"
wait_state $CC connecting
echo "BEGIN outage"; $A $J --grace-period 0 holders $HC --output json || case $? in 2|3) ;; *) false ;; esac; echo "END outage"
set +e
echo "BEGIN clean_outage"; timeout 60 $A $J --grace-period 0 clean $HC --apply; echo "rc=$?"; echo "END clean_outage"
set -e
[ "$(state $CC)" = connecting ] || fail "$CC is $(state $CC) during the outage"
[ "$(state $CB)" = connecting ] || fail "$CB is $(state $CB) during the outage"
echo "journal:"; cat /tmp/journal.jsonl
# The target comes back: both controllers reconnect (reconnect_delay 1 s), so B's filesystem
# can be unmounted when its holder ends (with no live path the unmount's writes would queue).
nvmet_port_link 3 nqn.2026-11.io.blockjanitor:b || fail "port 4422 back"
nvmet_port_link 2 nqn.2026-11.io.blockjanitor:c || fail "port 4421 back"
wait_state $CB live
wait_state $CC live
kill $HOLDER
i=0; while [ -e /proc/$HOLDER ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
echo "total $(t)s"
echo OK
