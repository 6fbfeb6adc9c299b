#!/bin/sh
# Issue 35, the guest side of `explain` for incidents 1 and 4 (tests/tests/ceph_explain.rs): the
# guest is node-old. It maps the image (a kernel rbd client: its own client id and address, its
# watcher on the header), puts ext4 on it, mounts it, starts the old pod's process with its
# working directory on it (the holder), and runs one real `blockjanitor-agent serve` (node
# node-old) with a mutual-TLS listener on port 9443, which the host reaches through qemu's
# hostfwd (BLOCKJANITOR_GUEST_HOSTFWD). Handshakes (/mnt/host):
#   mapped   "rbdN client.N ADDR HOLDER_PID" once the agent listens. The host's ack says what
#            next: "stop" (the agent is killed with SIGKILL, as a dead node's agent goes silent;
#            the mapping and the holder stay), or "done"
#   stopped  "rbdN" after the agent was killed; the host explains, fences the client as printed
#            and acks "done"
# Needs /extra/tls/{server.crt,server.key,ca.crt} (the console's identity: `console`).
set -eu
. /extra/ceph.env
. /extra/ceph-lib.sh
A=/extra/bin/blockjanitor-agent
T=/extra/tls
fail() {
    echo "FAIL: $*"
    [ -f /tmp/serve.log ] && { echo "--- serve.log"; tail -n 30 /tmp/serve.log; }
    exit 1
}
[ -x $A ] || fail "$A missing"
[ -f $T/server.crt ] && [ -f $T/server.key ] && [ -f $T/ca.crt ] || fail "$T missing"
host_share_ready || fail "no host share on /mnt/host"
ceph_net_up >/dev/null || fail "network to the monitor"
ID=$(rbd_map "$POOL" "$IMAGE") || fail "rbd map"
DEV=rbd$ID
mke2fs -F /dev/$DEV >/dev/null 2>&1 || fail mke2fs
mkdir -p /mnt/vol
mount -t ext4 /dev/$DEV /mnt/vol || fail mount
# The old pod's process: its working directory is on the volume.
(cd /mnt/vol && exec sleep 1000) &
HOLDER=$!

$A --log-format json --journal /tmp/journal.jsonl serve --socket /tmp/agent.sock \
    --listen 0.0.0.0:9443 --tls-cert $T/server.crt --tls-key $T/server.key --tls-client-ca $T/ca.crt \
    --tls-console console --node-name node-old --grace-period 0 --rescan-interval 1 \
    >/tmp/serve.log 2>&1 &
SERVE=$!
i=0
while ! grep -q '"listener":"tcp"' /tmp/serve.log && [ $i -lt 300 ]; do
    kill -0 $SERVE 2>/dev/null || fail "the agent exited"
    sleep 0.1; i=$((i + 1))
done
grep -q '"listener":"tcp"' /tmp/serve.log || fail "the agent does not listen on tcp after 30 s"

CLIENT="$(sed 's/^client/client./' /sys/bus/rbd/devices/$ID/client_id) $(cat /sys/bus/rbd/devices/$ID/client_addr)"
echo "mapped $POOL/$IMAGE as $DEV: $CLIENT, held by pid $HOLDER"
NEXT=$(host_handshake mapped "$DEV $CLIENT $HOLDER" 240) || fail "host: mapped"
case $NEXT in
    stop*)
        kill -9 $SERVE 2>/dev/null || true
        wait $SERVE 2>/dev/null || true
        host_handshake stopped "$DEV" 240 >/dev/null || fail "host: stopped"
        ;;
    *)
        kill $SERVE 2>/dev/null || true; wait $SERVE 2>/dev/null || true
        ;;
esac
kill -0 $HOLDER || fail "the holder was killed"
echo OK
