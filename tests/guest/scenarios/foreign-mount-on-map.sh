#!/bin/sh
# A filesystem on the map, mounted only in a foreign namespace (incident 5 on multipath): the
# agent stops queueing, releases that mount, then tears the map and its paths down.
. /extra/lib/mp-lib.sh
make_map
mke2fs -F /dev/mapper/mpathb >/dev/null 2>&1 || fail mke2fs
mkdir -p /mnt/vol
mount -t ext4 /dev/mapper/mpathb /mnt/vol || fail mount
unshare -m sleep 1000 &
HOLDER=$!
sleep 0.3
umount /mnt/vol
fail_path 8:0
fail_path 8:16
echo "BEGIN holders"; $A $J holders "$MAP" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"; set -e
kill -0 $HOLDER || fail "the holder was killed"
for d in sda sdb "$MAP"; do [ ! -e /sys/block/$d ] || fail "$d still in /sys/block"; done
echo OK
