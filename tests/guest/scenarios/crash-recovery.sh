#!/bin/sh
# Issue 13, crash safety: the clean-mode daemon is killed with SIGKILL at each journal phase of a
# dead map's teardown in turn, then restarted without the fault; the map and both paths must end
# removed. Fault injection (the agent kill -9s itself at its one journal write point):
#   phase K        BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD=K: right after its Kth intent or
#                  result record is fsync'd (K = 1..12: intent and result of each of the 6 steps)
#   phase before-K BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD=K, K even: right before the Kth
#                  record, a result: the step's kernel call is made, the journal does not know
#   phase changed  after record CHANGED_AT (the intent of the first path's delete); then that disk
#                  is deleted and found again by a host rescan (same name, number, wwid; a new
#                  diskseq) before the restart: the interrupted step must not be repeated.
#   phase cli-P    issue 17: the same teardown by the ONE-SHOT `clean mpathb --apply`, killed at
#                  every journal record in turn (P = plan-before-1, plan-1, before-K, K,
#                  plan-before-2, plan-2: before and after the plan record, each step record and
#                  the plan's end), then the SAME command run once more: it must finish the plan
#                  (resumed before its argument is resolved, the map being gone) or say it is gone.
# Each phase has its own map (scsi_debug reloaded: sda and sdb again) and its own journal.
# Sections per phase (read by tests/tests/guest.rs): setup-P (name dev diskseq of each device
# before the daemon), crash-P (exit code of the killed daemon, its fault line), journal-P (the
# whole journal), after-P (what is left), recovered-log-P (the restarted daemon's recovery lines).
. /extra/lib/mp-lib.sh
RECORDS=${RECORDS:-12}
CHANGED_AT=${CHANGED_AT:-7}
SOCK=/tmp/agent.sock

# The daemon in clean mode, rescanning every second, no grace, no rate limit in the way.
SERVE="serve --no-kubernetes --socket $SOCK --mode clean --grace-period 0 --rescan-interval 1 --max-actions-per-minute 100"

# wait_until SECONDS CONDITION...: polls every 0.2 s; 1 on timeout.
wait_until() {
  n=$(($1 * 5)); shift
  while ! "$@"; do
    n=$((n - 1)); [ $n -gt 0 ] || return 1
    sleep 0.2
  done
}
gone() { for d in "$@"; do [ ! -e /sys/block/$d ] || return 1; done; }
# settled JOURNAL DEVICES...: the devices are gone and the journal has no step left open (the
# restarted daemon recovered the interrupted one: with nothing left to clean, only that shows).
settled() {
  j=$1; shift
  gone "$@" && $A --journal "$j" journal 2>/dev/null | grep -q "^no unfinished steps"
}

setup() {
  make_map >/dev/null
  fail_path 8:0
  fail_path 8:16
  echo offline > /sys/block/sda/device/state
  echo offline > /sys/block/sdb/device/state
  echo "BEGIN setup-$1"
  for d in $MAP sda sdb; do echo "$d $(cat /sys/block/$d/dev) $(cat /sys/block/$d/diskseq)"; done
  echo "END setup-$1"
}

# crash LABEL VARIABLE K JOURNAL: runs the daemon until the fault point VARIABLE=K kills it (busybox
# timeout execs the agent, so $? is the agent's own status: 137 for SIGKILL, 143 if timeout
# stopped it).
crash() {
  rm -f $SOCK
  set +e
  (export "$2=$3"; exec timeout 90 $A --journal "$4" $SERVE) >/tmp/crash-$1.log 2>&1
  rc=$?
  set -e
  echo "BEGIN crash-$1"; echo "rc=$rc"; grep -a "fault injection: SIGKILL" /tmp/crash-$1.log || true; echo "END crash-$1"
  [ $rc = 137 ] || { tail -n 30 /tmp/crash-$1.log; fail "phase $1: the daemon was not killed by SIGKILL (rc $rc)"; }
}

# restart LABEL JOURNAL DEVICES...: the daemon without the fault, until DEVICES are gone and no
# step is left open (60 s).
restart() {
  label=$1; jf=$2; shift 2
  rm -f $SOCK
  $A --journal "$jf" $SERVE >/tmp/restart-$label.log 2>&1 &
  pid=$!
  ok=0; wait_until 60 settled "$jf" "$@" || ok=1
  [ -z "${LINGER:-}" ] || sleep "$LINGER"
  kill $pid; set +e; wait $pid; set -e
  echo "BEGIN recovered-log-$label"; grep -a "recovered\|left open" /tmp/restart-$label.log | tail -n 20; echo "END recovered-log-$label"
  echo "BEGIN journal-$label"; cat "$jf"; echo "END journal-$label"
  echo "BEGIN after-$label"; ls /sys/block | grep -E '^(sd|dm-)' || true; dmsetup ls; echo "END after-$label"
  [ $ok = 0 ] || { tail -n 30 /tmp/restart-$label.log; fail "phase $label: $* not all gone, or a step left open, after the restart"; }
}

# phase LABEL VARIABLE K: one dead map, killed at the fault point, restarted until it is gone.
phase() {
  t=$(date +%s)
  setup $1
  crash $1 $2 $3 /tmp/journal-$1.jsonl
  restart $1 /tmp/journal-$1.jsonl "$MAP" sda sdb
  unload_scsi_debug "phase $1"
  echo "phase $1: $(($(date +%s) - t)) s"
}

T0=$(date +%s)
k=1
while [ $k -le $RECORDS ]; do
  phase $k BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD $k
  k=$((k + 1))
done
k=2
while [ $k -le $RECORDS ]; do
  phase before-$k BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD $k
  k=$((k + 2))
done

# The device changes while the agent is down.
t=$(date +%s)
setup changed
crash changed BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD "$CHANGED_AT" /tmp/journal-changed.jsonl
[ -e /sys/block/sda ] && [ ! -e /sys/block/$MAP ] || fail "phase changed: expected the map gone and sda left"
host=$(basename "$(readlink /sys/block/sda/device)" | cut -d: -f1)
echo 1 > /sys/block/sda/device/delete
wait_until 10 gone sda || fail "sda not deleted"
echo "- - -" > /sys/class/scsi_host/host$host/scan
wait_until 10 test -e /sys/block/sda || fail "sda not found again by the rescan"
echo "BEGIN new-sda"; echo "sda $(cat /sys/block/sda/dev) $(cat /sys/block/sda/diskseq) $(cat /sys/block/sda/device/state)"; echo "END new-sda"
# Three more rescans after sdb is gone, for a wrong step against the new sda to show.
LINGER=3 restart changed /tmp/journal-changed.jsonl sdb
[ -e /sys/block/sda ] || fail "phase changed: the new sda was deleted"
unload_scsi_debug "phase changed"
echo "phase changed: $(($(date +%s) - t)) s"

# cli_phase LABEL VARIABLE K: the one-shot teardown killed at VARIABLE=K, then run again.
cli_phase() {
  t=$(date +%s)
  setup cli-$1
  jf=/tmp/journal-cli-$1.jsonl; st=/tmp/state-cli-$1.json
  CLEAN="--journal $jf --state $st --grace-period 0 clean mpathb --apply"
  set +e
  (export "$2=$3"; exec timeout 90 $A $CLEAN) >/tmp/crash-cli-$1.log 2>&1
  rc=$?
  timeout 90 $A $CLEAN >/tmp/again-cli-$1.log 2>&1
  rc2=$?
  set -e
  echo "BEGIN crash-cli-$1"; echo "rc=$rc"; grep -a "fault injection: SIGKILL" /tmp/crash-cli-$1.log || true; echo "END crash-cli-$1"
  echo "BEGIN again-cli-$1"; echo "rc=$rc2"; grep -a "resumed\|is gone\|: [0-9]* steps\?$\|refused\|error" /tmp/again-cli-$1.log; echo "END again-cli-$1"
  echo "BEGIN journal-cli-$1"; cat "$jf"; echo "END journal-cli-$1"
  echo "BEGIN after-cli-$1"; ls /sys/block | grep -E '^(sd|dm-)' || true; dmsetup ls; echo "END after-cli-$1"
  [ $rc = 137 ] || { tail -n 30 /tmp/crash-cli-$1.log; fail "phase cli-$1: the one-shot run was not killed by SIGKILL (rc $rc)"; }
  [ $rc2 = 0 ] || { cat /tmp/again-cli-$1.log; fail "phase cli-$1: the same command run again did not converge (rc $rc2)"; }
  gone "$MAP" sda sdb || { cat /tmp/again-cli-$1.log; fail "phase cli-$1: the map or a path is left"; }
  $A --journal "$jf" journal | grep -q "^no unfinished steps" || { $A --journal "$jf" journal; fail "phase cli-$1: something is left open in the journal"; }
  unload_scsi_debug "phase cli-$1"
  echo "phase cli-$1: $(($(date +%s) - t)) s"
}
if [ -z "${SKIP_CLI:-}" ]; then
  cli_phase plan-before-1 BLOCKJANITOR_FAULT_SIGKILL_BEFORE_PLAN_RECORD 1
  cli_phase plan-1 BLOCKJANITOR_FAULT_SIGKILL_AFTER_PLAN_RECORD 1
  k=1
  while [ $k -le $RECORDS ]; do
    cli_phase before-$k BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD $k
    cli_phase $k BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD $k
    k=$((k + 1))
  done
  cli_phase plan-before-2 BLOCKJANITOR_FAULT_SIGKILL_BEFORE_PLAN_RECORD 2
  cli_phase plan-2 BLOCKJANITOR_FAULT_SIGKILL_AFTER_PLAN_RECORD 2
fi
echo "all phases: $(($(date +%s) - T0)) s"
echo OK
