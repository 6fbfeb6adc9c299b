#!/bin/sh
# Incident 1: an image still mapped on the old node, unused. The agent reports it stale with the
# client id and address the cluster shows as the image's watcher; `clean --apply` unmaps it; the
# cluster then lists no watcher.
. /extra/lib/rbd-common.sh
echo "BEGIN holders"; $A $J --grace-period 0 holders "$DEV" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
echo "BEGIN watchers-mapped"; host_handshake watchers-mapped "$DEV" 60; echo "END watchers-mapped"
set +e; echo "BEGIN clean"; $A $J --grace-period 0 clean "$DEV" --apply; echo "rc=$?"; echo "END clean"; set -e
[ ! -e /sys/bus/rbd/devices/$RBD_ID ] || fail "still mapped"
echo "BEGIN watchers-after"; host_handshake watchers-after "unmapped" 60; echo "END watchers-after"
echo OK
