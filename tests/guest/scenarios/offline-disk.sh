#!/bin/sh
# A standalone SCSI disk whose device went offline: stale, then deleted.
set -eu
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
modprobe scsi_debug dev_size_mb=16 || fail "modprobe scsi_debug"
echo offline > /sys/block/sda/device/state
echo "BEGIN holders"; $A $J holders sda --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN clean"; $A $J clean sda --grace-period 0 --apply; echo "rc=$?"; echo "END clean"; set -e
[ ! -e /sys/block/sda ] || fail "sda still in /sys/block"
echo OK
