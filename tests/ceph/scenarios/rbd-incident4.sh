#!/bin/sh
# Incident 4: the client id and address the agent reports are the watcher the cluster lists;
# after `ceph osd blocklist add` of that address the agent reports the mapping fenced, and still
# cleans it locally.
. /extra/lib/rbd-common.sh
echo "BEGIN holders"; $A $J --grace-period 0 holders "$DEV" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
echo "BEGIN watchers-mapped"; host_handshake watchers-mapped "$DEV" 60; echo "END watchers-mapped"
host_handshake blocklist "$(cat /sys/bus/rbd/devices/$RBD_ID/client_addr)" 60 >/dev/null || fail "blocklist"
# The client learns it is fenced at its next contact with the OSDs: nudge it with one direct
# read (it fails), then wait for krbd's log line.
(timeout 20 dd if=/dev/$DEV of=/dev/null bs=4096 count=1 iflag=direct 2>/dev/null; true) &
i=0; while ! dmesg | grep -q "rbd: $DEV: .*-108" && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
echo "BEGIN dmesg"; dmesg | grep -E "rbd|libceph" | tail -8; echo "END dmesg"
echo "BEGIN fenced"; $A $J --grace-period 0 holders "$DEV" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END fenced"
set +e; echo "BEGIN clean"; timeout 60 $A $J --grace-period 0 clean "$DEV" --apply; echo "rc=$?"; echo "END clean"; set -e
[ ! -e /sys/bus/rbd/devices/$RBD_ID ] || fail "still mapped"
host_handshake clear "done" 60 >/dev/null || fail "blocklist clear"
echo OK
