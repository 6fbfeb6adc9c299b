#!/bin/sh
# NVMe/TCP over the guest's loopback (issue 12): an nvmet target (configfs) with three
# subsystems, each on its own port of 127.0.0.1, and the kernel's NVMe/TCP host connected to each
# with ctrl_loss_tmo=-1 (reconnect for ever):
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

for m in nvmet nvmet_tcp nvme_tcp; do
  modprobe $m 2>/dev/null || { echo "SKIPPED: the guest image has no $m module (tests/guest/prepare.sh of the 'guest image:' commit adds it)"; exit 0; }
done
command -v nvme >/dev/null || { echo "SKIPPED: the guest image has no nvme-cli"; exit 0; }
grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config
N=/sys/kernel/config/nvmet

# target NQN SERIAL PORT: a subsystem with one 16 MB namespace, exposed on 127.0.0.1:PORT
target() {
  s=$N/subsystems/$1
  mkdir $s
  echo 1 >$s/attr_allow_any_host
  echo "$2" >$s/attr_serial
  truncate -s 16M /tmp/ns-$2.img
  mkdir $s/namespaces/1
  printf %s /tmp/ns-$2.img >$s/namespaces/1/device_path
  echo 1 >$s/namespaces/1/buffered_io
  printf '%08x-0000-4000-8000-000000000001' "$2" >$s/namespaces/1/device_uuid
  echo 1 >$s/namespaces/1/enable
  port_add "$1" "$3"
}
# port_add NQN PORT: expose subsystem NQN on 127.0.0.1:PORT
port_add() {
  p=$N/ports/$2
  mkdir $p
  echo tcp >$p/addr_trtype
  echo ipv4 >$p/addr_adrfam
  echo 127.0.0.1 >$p/addr_traddr
  echo "$2" >$p/addr_trsvcid
  ln -s $N/subsystems/$1 $p/subsystems/$1
}
# connect NQN PORT: prints the new controller's name once it is live with its namespace
connect() {
  before=$(ls /sys/class/nvme)
  nvme connect -t tcp -a 127.0.0.1 -s "$2" -n "$1" --ctrl-loss-tmo=-1 --reconnect-delay=1 >/dev/null \
    || fail "nvme connect $1"
  for c in $(ls /sys/class/nvme); do
    case " $(echo $before) " in *" $c "*) continue ;; esac
    [ "$(cat /sys/class/nvme/$c/subsysnqn)" = "$1" ] || continue
    i=0
    while ! { [ "$(cat /sys/class/nvme/$c/state)" = live ] && ls -d /sys/class/nvme/$c/nvme*n1 >/dev/null 2>&1; }; do
      i=$((i + 1)); [ $i -lt 100 ] || fail "$c not live with a namespace"; sleep 0.1
    done
    echo "$c"; return 0
  done
  fail "no controller for $1"
}
# head CTRL: the namespace head (nvmeSn1) of CTRL's subsystem
head_of() {
  for s in /sys/class/nvme-subsystem/*; do
    [ -e $s/$1 ] && { ls $s | grep -E '^nvme[0-9]+n1$'; return 0; }
  done
  fail "no subsystem holds $1"
}
port_remove() { for l in $N/ports/$1/subsystems/*; do rm "$l"; done; rmdir $N/ports/$1; }
state() { cat /sys/class/nvme/$1/state 2>/dev/null || echo gone; }
wait_state() { i=0; while [ "$(state $1)" != "$2" ]; do i=$((i + 1)); [ $i -lt 100 ] || fail "$1 not $2 ($(state $1))"; sleep 0.1; done; }

target nqn.2026-11.io.blockjanitor:a 1111 4420
target nqn.2026-11.io.blockjanitor:c 2222 4421
target nqn.2026-11.io.blockjanitor:b 3333 4422
CA=$(connect nqn.2026-11.io.blockjanitor:a 4420)
CC=$(connect nqn.2026-11.io.blockjanitor:c 4421)
CB=$(connect nqn.2026-11.io.blockjanitor:b 4422)
HA=$(head_of $CA); HB=$(head_of $CB); HC=$(head_of $CC)
echo "A: $CA $HA  B: $CB $HB  C: $CC $HC  (connected at $(t)s)"

# B's namespace is mounted only in a foreign mount namespace (incident 5's shape).
mke2fs -F -b 4096 /dev/$HB >/dev/null 2>&1 || fail "mke2fs $HB"
unshare -m sh -c "mkdir -p /mnt/b && mount -t ext4 /dev/$HB /mnt/b && exec sleep 1000" &
HOLDER=$!
i=0; while ! grep -q ' /mnt/b ' /proc/$HOLDER/mountinfo 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || fail "no foreign mount"; sleep 0.1; done
echo "B mounted in the mount namespace of pid $HOLDER"

port_remove 4420
port_remove 4422
wait_state $CA connecting
wait_state $CB connecting
echo "ports 4420 and 4422 removed: $CA $(state $CA), $CB $(state $CB), $CC $(state $CC) at $(t)s"

# First look: a candidate, not stale before the grace period (2 s).
echo "BEGIN first"; $A $J --grace-period 2 holders $HA --output json; echo "END first"
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
port_remove 4421
wait_state $CC connecting
echo "BEGIN outage"; $A $J --grace-period 0 holders $HC --output json; echo "END outage"
set +e
echo "BEGIN clean_outage"; timeout 60 $A $J --grace-period 0 clean $HC --apply; echo "rc=$?"; echo "END clean_outage"
set -e
[ "$(state $CC)" = connecting ] || fail "$CC is $(state $CC) during the outage"
[ "$(state $CB)" = connecting ] || fail "$CB is $(state $CB) during the outage"
echo "journal:"; cat /tmp/journal.jsonl
# The target comes back: both controllers reconnect (reconnect_delay 1 s), so B's filesystem
# can be unmounted when its holder ends (with no live path the unmount's writes would queue).
port_add nqn.2026-11.io.blockjanitor:b 4422
port_add nqn.2026-11.io.blockjanitor:c 4421
wait_state $CB live
wait_state $CC live
kill $HOLDER
i=0; while [ -e /proc/$HOLDER ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
echo "total $(t)s"
echo OK
