#!/bin/sh
# Incident 5 on rbd: ext4 on the image, mounted only in a foreign namespace after the host
# unmounted it. `holders` shows the foreign mount; release detaches it (the holder lives on);
# then clean unmaps the image.
. /extra/lib/rbd-common.sh
mke2fs -F /dev/$DEV >/dev/null 2>&1 || fail mke2fs
mkdir -p /mnt/vol
mount -t ext4 /dev/$DEV /mnt/vol || fail mount
unshare -m sleep 1000 &
HOLDER=$!
sleep 0.3
umount /mnt/vol
echo "BEGIN holders"; $A $J --grace-period 0 holders "$DEV" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN release"; $A $J release "$DEV" --apply; echo "rc=$?"; echo "END release"; set -e
set +e; echo "BEGIN clean"; $A $J --grace-period 0 clean "$DEV" --apply; echo "rc=$?"; echo "END clean"; set -e
kill -0 $HOLDER || fail "the holder was killed"
[ ! -e /sys/bus/rbd/devices/$RBD_ID ] || fail "still mapped"
echo OK
