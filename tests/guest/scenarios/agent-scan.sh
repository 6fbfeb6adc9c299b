#!/bin/sh
# agent-scan: the host-built agent runs in the guest and sees the guest kernel's devices:
# a scsi_debug disk and an ext4 loop device mounted only in a foreign mount namespace.
set -eu
fail() { echo "FAIL: $*"; exit 1; }
A=/extra/bin/blockjanitor-agent
[ -x $A ] || fail "$A missing"
modprobe scsi_debug dev_size_mb=16 || fail "modprobe scsi_debug"
[ -e /sys/block/sda ] || fail "no sda"
truncate -s 16M /tmp/vol.img
mke2fs -F /tmp/vol.img >/dev/null 2>&1 || fail mke2fs
mkdir -p /mnt/vol
LOOP=$(losetup -f) && losetup "$LOOP" /tmp/vol.img || fail losetup
mount -t ext4 "$LOOP" /mnt/vol || fail mount
unshare -m sleep 1000 &
sleep 0.3
umount /mnt/vol
echo "BEGIN scan"
$A --journal /tmp/j.jsonl scan --output json
echo "END scan"
echo "BEGIN holders"
$A --journal /tmp/j.jsonl holders "$LOOP" --output json || case $? in 2|3) ;; *) false ;; esac  # 2: held, as fuser -s
echo "END holders"
$A --journal /tmp/j.jsonl release "$LOOP" --apply || fail "release exit $?"
$A --journal /tmp/j.jsonl holders "$LOOP" --output json | grep -q '"in_use": false' || fail "still held after release"
echo OK
