#!/bin/sh
# Incident 5 on rbd, handled by the daemon by itself: kubelet (in-tree rbd layout) unmounted the
# image, a process in another namespace keeps a copy of the mount; `serve --mode release`
# detaches that mount with nobody asking, and the holder keeps running.
. /extra/lib/rbd-common.sh
K=/tmp/kubelet
G=$K/plugins/kubernetes.io/rbd/mounts/$POOL-image-$IMAGE
mkdir -p "$G"
mke2fs -F /dev/$DEV >/dev/null 2>&1 || fail mke2fs
mount -t ext4 /dev/$DEV "$G" || fail mount
unshare -m sleep 1000 &
HOLDER=$!
sleep 0.3
umount "$G"
grep -q " $G " /proc/$HOLDER/mountinfo || fail "the holder has no copy of the mount"
$A $J serve --no-kubernetes --socket /tmp/agent.sock --mode release --kubelet-dir $K --rescan-interval 1 >/tmp/serve.log 2>&1 &
SERVE=$!
i=0; while grep -q " $G " /proc/$HOLDER/mountinfo && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done
if grep -q " $G " /proc/$HOLDER/mountinfo; then cat /tmp/serve.log; fail "release mode did not detach the mount"; fi
kill -0 $HOLDER || fail "the holder was killed"
# The mount is gone the moment umount2 returns; the agent writes the step's result right after.
i=0; while ! grep -q '"phase":"result"' /tmp/journal.jsonl && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
echo "BEGIN journal"; cat /tmp/journal.jsonl; echo "END journal"
kill $SERVE
echo OK
