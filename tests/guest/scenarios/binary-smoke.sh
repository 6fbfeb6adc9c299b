#!/bin/sh
# binary-smoke: host-built, dynamically linked binaries passed in through EXTRA_FILES_DIR
# (copy-binary-libs.sh) run in the guest. Uses util-linux's lsblk and losetup from the host:
#   d=$(mktemp -d); tests/guest/copy-binary-libs.sh /usr/bin/lsblk "$d"
#   tests/guest/copy-binary-libs.sh /usr/sbin/losetup "$d"; tests/guest/run.sh this-script "$d"
set -eu
fail() { echo "FAIL: $*"; exit 1; }
LSBLK=/extra/usr/bin/lsblk
LOSETUP=/extra/usr/sbin/losetup
for b in $LSBLK $LOSETUP; do [ -x $b ] || fail "$b missing: pass the copy-binary-libs.sh dir"; done
echo "files under /extra: $(find /extra -type f | wc -l)"
echo "lsblk resolves to: $(command -v lsblk)"
$LSBLK --version
$LOSETUP --version | grep -q util-linux || fail "losetup is not util-linux's"
$LOSETUP --version

truncate -s 32M /tmp/disk.img
DEV=$($LOSETUP -f --show /tmp/disk.img) || fail "losetup -f --show"
echo "attached $DEV"
mke2fs "$DEV" >/dev/null 2>&1 || fail "mke2fs $DEV"
mkdir -p /mnt/disk
mount -t ext4 "$DEV" /mnt/disk || fail "mount $DEV"
echo "--- losetup --list"
$LOSETUP --list --noheadings -O NAME,BACK-FILE,SIZELIMIT,AUTOCLEAR
echo "--- lsblk"
$LSBLK -o NAME,MAJ:MIN,SIZE,TYPE,FSTYPE,MOUNTPOINTS "$DEV"
echo "--- lsblk --json"
$LSBLK --json -o NAME,TYPE,MOUNTPOINTS "$DEV"
$LSBLK -n -o MOUNTPOINTS "$DEV" | grep -qx /mnt/disk || fail "lsblk does not show the mount"
umount /mnt/disk
$LOSETUP -d "$DEV"
[ -z "$($LOSETUP --list --noheadings)" ] || fail "loop device still attached"
echo "binary-smoke: ok"
