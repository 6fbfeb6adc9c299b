#!/bin/sh
# Issue 17: a one-shot `clean` of one NVMe namespace must not delete its controller under an
# open sibling namespace. An nvmet NVMe/TCP target on the guest's loopback with one subsystem of
# TWO namespaces; the host connected (ctrl_loss_tmo=-1); the port removed, so the controller
# reconnects for ever; a process holds the SECOND namespace open (`sleep < /dev/nvmeXn2`).
# `clean <first namespace> --apply` scans the target namespace, sees that deleting the controller
# removes the second one too, widens its scan to it, finds the holder and refuses (non-zero exit
# code, naming the second namespace and the process); the controller stays. Once the holder is
# gone, the same command deletes the controller (nothing is refused for nothing).
#
# Sections for tests/tests/guest.rs: devices, clean (ends rc=N), after, clean_free, after_free.
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl --state /tmp/state.json"
fail() { echo "FAIL: $*"; exit 1; }
[ -x $A ] || fail "$A missing"
. /extra/lib/nvme-lib.sh

NQN=nqn.2026-11.io.blockjanitor:two
nvmet_target_up $NQN 2 1 || fail "target"
C=$(nvme_host_connect $NQN 1 -1 1) || fail "connect"
HEADS=$(nvme_ns_heads $C)
N1=${HEADS%% *} N2=${HEADS##* }
[ "$N1" != "$N2" ] || fail "one subsystem, two namespaces expected: $HEADS"
echo "BEGIN devices"; echo "controller=$C n1=$N1 n2=$N2"; ls /sys/class/nvme/$C; echo "END devices"

# The second namespace held open by a process (an fd the scan sees).
sleep 1000 </dev/$N2 &
HOLDER=$!
nvmet_port_remove 1 || fail "remove port 4420"
nvme_wait_state $C connecting 10 || fail "$C not connecting ($(state $C))"
echo "port removed: $C $(state $C); $N2 held by pid $HOLDER"

# `clean N1 --apply` as section $1 (ends rc=N), after a first look that starts the grace clock
# (2 s), as an operator's earlier run would; then section $2: the controller's state, the
# namespaces, and the holder when it is alive.
clean_n1() {
  set +e
  $A $J --grace-period 2 holders $N1 --output json >/dev/null || case $? in 2|3) ;; *) false ;; esac
  sleep 2.5
  echo "BEGIN $1"; timeout 60 $A $J --grace-period 2 clean $N1 --apply; echo "rc=$?"; echo "END $1"
  set -e
  echo "BEGIN $2"
  echo "controller $C $(state $C)"
  for d in $N1 $N2; do if [ -e /sys/class/block/$d ]; then echo "$d present"; else echo "$d gone"; fi; done
  if [ -e /proc/$HOLDER ]; then echo "holder $HOLDER alive: $(ls -l /proc/$HOLDER/fd/0 | sed 's/.*-> //')"; fi
  echo "END $2"
}

clean_n1 clean after
[ "$(state $C)" != gone ] || fail "the controller was deleted under the open $N2"
[ -e /proc/$HOLDER ] || fail "the holder died"

# The holder gone: the same command deletes the controller (both namespaces go with it).
kill $HOLDER
i=0; while [ -e /proc/$HOLDER ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
clean_n1 clean_free after_free
echo OK
