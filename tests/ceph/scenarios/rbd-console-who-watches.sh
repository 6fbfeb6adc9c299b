#!/bin/sh
# Issue 11, the Ceph scenario end to end: one guest maps the same image twice with `noshare`, so
# each mapping is its own kernel client (its own client id and address, its own watcher on the
# header), and runs one real `blockjanitor-agent serve` (node guest-a) with a mutual-TLS listener
# on port 9443, which the host reaches through qemu's hostfwd (BLOCKJANITOR_GUEST_HOSTFWD). The host
# (tests/tests/ceph.rs) asks the console `who-watches` with the cluster's watcher list.
# Handshakes (/mnt/host):
#   mapped    "rbdN client.N ADDR" per mapping, once the agent listens; the host's ack ends the
#             first round of questions
#   unmapped  "rbdN" after the second mapping is unmapped (the agent still runs); the host asks
#             again and acks
# Needs /extra/tls/{server.crt,server.key,ca.crt} (the console's identity: `console`).
set -eu
. /extra/ceph.env
. /extra/ceph-lib.sh
A=/extra/bin/blockjanitor-agent
T=/extra/tls
SERVE=
fail() {
    echo "FAIL: $*"
    [ -f /tmp/serve.log ] && { echo "--- serve.log"; tail -n 30 /tmp/serve.log; }
    exit 1
}
[ -x $A ] || fail "$A missing"
[ -f $T/server.crt ] && [ -f $T/server.key ] && [ -f $T/ca.crt ] || fail "$T missing"
host_share_ready || fail "no host share on /mnt/host"
ceph_net_up >/dev/null || fail "network to the monitor"
RBD_MAP_OPTS="${RBD_MAP_OPTS:+$RBD_MAP_OPTS,}noshare"
ID0=$(rbd_map "$POOL" "$IMAGE") || fail "rbd map (first)"
ID1=$(rbd_map "$POOL" "$IMAGE") || fail "rbd map (second)"
[ "$ID0" != "$ID1" ] || fail "both maps gave rbd$ID0"
line() { echo "rbd$1 $(sed 's/^client/client./' /sys/bus/rbd/devices/$1/client_id) $(cat /sys/bus/rbd/devices/$1/client_addr)"; }
echo "BEGIN mappings"; line "$ID0"; line "$ID1"; echo "END mappings"
[ "$(cat /sys/bus/rbd/devices/$ID0/client_addr)" != "$(cat /sys/bus/rbd/devices/$ID1/client_addr)" ] \
    || fail "noshare gave both mappings the same client"

$A --log-format json --journal /tmp/journal.jsonl serve --no-kubernetes --socket /tmp/agent.sock \
    --listen 0.0.0.0:9443 --tls-cert $T/server.crt --tls-key $T/server.key --tls-client-ca $T/ca.crt \
    --tls-console console --node-name guest-a --grace-period 0 --rescan-interval 1 \
    >/tmp/serve.log 2>&1 &
SERVE=$!
i=0
while ! grep -q '"listener":"tcp"' /tmp/serve.log && [ $i -lt 300 ]; do
    kill -0 $SERVE 2>/dev/null || fail "the agent exited"
    sleep 0.1; i=$((i + 1))
done
grep -q '"listener":"tcp"' /tmp/serve.log || fail "the agent does not listen on tcp after 30 s"

host_handshake mapped "$(line "$ID0"; line "$ID1")" 100 >/dev/null || fail "host: mapped"
rbd_unmap "$ID1" || fail "unmap rbd$ID1"
host_handshake unmapped "rbd$ID1" 100 >/dev/null || fail "host: unmapped"
kill $SERVE 2>/dev/null || true; wait $SERVE || true
rbd_unmap "$ID0" || fail "unmap rbd$ID0"
echo OK
