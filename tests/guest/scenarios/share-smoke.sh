#!/bin/sh
# share-smoke: a host directory shared over 9p (run.sh with BLOCKJANITOR_GUEST_SHARE=DIR) is
# mounted on /mnt/host: read a file the host put there, write one back for the host to check.
set -eu
fail() { echo "FAIL: $*"; exit 1; }
grep -q ' /mnt/host 9p ' /proc/mounts || fail "/mnt/host is not a 9p mount"
grep ' /mnt/host ' /proc/mounts
[ -f /mnt/host/from-host.txt ] || fail "no /mnt/host/from-host.txt"
echo "from host: $(cat /mnt/host/from-host.txt)"
echo "written by the guest, kernel $(uname -r)" >/mnt/host/from-guest.txt
sync
echo "share-smoke: ok"
