#!/bin/sh
# An nbd device whose server died: the agent reports it stale (server process gone, nothing
# holds it) and clean disconnects it through the kernel's ioctl (no nbd-client involved).
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
truncate -s 16M /tmp/nbd.img
cat >/tmp/nbd.conf <<'CONF'
[generic]
listenaddr = 127.0.0.1
port = 10809
[disk]
exportname = /tmp/nbd.img
CONF
nbd-server -C /tmp/nbd.conf || fail "nbd-server"
# netlink mode: the device stays configured after nbd-client exits, like rbd-nbd's
nbd-client -N disk 127.0.0.1 10809 /dev/nbd0 || fail "nbd-client"
i=0; while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ "$(cat /sys/block/nbd0/size)" != 0 ] || fail "nbd0 did not connect"
echo "nbd0 connected: pid $(cat /sys/block/nbd0/pid 2>/dev/null)"
pidof nbd-server >/dev/null || fail "no nbd-server is running before the kill"
killall -9 nbd-server || fail "kill nbd-server"
# nbd-client has exited (netlink mode), so the kernel's pid attribute says nothing about the
# server: check the server process itself, every fork of it.
i=0; while pidof nbd-server >/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
if pidof nbd-server >/dev/null; then fail "nbd-server still runs: pid $(pidof nbd-server)"; fi
echo "BEGIN server"; echo "nbd-server processes after the kill: $(pidof nbd-server | wc -w)"; echo "END server"
echo "BEGIN holders"; $A $J --grace-period 0 holders nbd0 --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN clean"; $A $J clean nbd0 --grace-period 0 --apply; echo "rc=$?"; echo "END clean"; set -e
[ "$(cat /sys/block/nbd0/size)" = 0 ] || fail "nbd0 still connected"
[ ! -e /sys/block/nbd0/pid ] || fail "nbd0 still has a pid"
echo OK
