#!/bin/sh
# Issue 34: an nbd device whose node is still open somewhere is never counted as disconnected
# and done. The server of nbd0 (netlink mode) dies: nothing the scan sees holds the device, so
# it is stale. A process opens /dev/nbd0, sends the fd to itself over a unix socketpair
# (SCM_RIGHTS) without receiving it and closes its own: the open lives on only in flight. The
# kernel keeps an open nbd device's configuration (size, pid) until the last opener closes it,
# so after NBD_DISCONNECT and NBD_CLEAR_SOCK it is still set up: `clean nbd0 --apply` must report
# the step deferred (exit 2, the journal's result `deferred`), never done. The opener gone, the
# kernel drops the configuration.
#
# Sections for tests/tests/guest.rs: opener, clean (ends rc=N), after, journal, after_free.
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
F=/extra/bin/fd-in-flight
fail() { echo "FAIL: $*"; exit 1; }
[ -x $F ] || fail "$F missing"
truncate -s 16M /tmp/nbd.img
cat >/tmp/nbd.conf <<'CONF'
[generic]
listenaddr = 127.0.0.1
port = 10809
[disk]
exportname = /tmp/nbd.img
CONF
nbd-server -C /tmp/nbd.conf || fail "nbd-server"
nbd-client -N disk 127.0.0.1 10809 /dev/nbd0 || fail "nbd-client"
i=0; while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(cat /sys/block/nbd0/size)" != 0 ] || fail "nbd0 did not connect"
killall -9 nbd-server || fail "kill nbd-server"
i=0; while pidof nbd-server >/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done

$F /dev/nbd0 1000 >/tmp/fif.out &
OPENER=$!
i=0; while ! grep -q "in flight" /tmp/fif.out 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || fail "the opener did not start"; sleep 0.1; done
echo "BEGIN opener"
echo "pid $OPENER"
ls -l /proc/$OPENER/fd | sed 's/.*[0-9] \([0-9]* ->\)/\1/'
echo "END opener"

set +e
echo "BEGIN clean"; timeout 60 $A $J clean nbd0 --grace-period 0 --apply; echo "rc=$?"; echo "END clean"
set -e
echo "BEGIN after"
echo "size $(cat /sys/block/nbd0/size)"
echo "END after"
echo "BEGIN journal"; cat /tmp/journal.jsonl; echo "END journal"

kill $OPENER
i=0; while [ -e /proc/$OPENER ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
i=0; while [ "$(cat /sys/block/nbd0/size)" != 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
echo "BEGIN after_free"
echo "size $(cat /sys/block/nbd0/size)"
echo "END after_free"
echo OK
