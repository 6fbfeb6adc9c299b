# Sourced by the rbd agent scenarios (busy-box sh): the cluster facts and helpers, the agent,
# and a mapped image. Sets DEV (rbdN) and RBD_ID.
set -eu
. /extra/ceph.env
. /extra/ceph-lib.sh
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
[ -x $A ] || fail "$A missing"
ceph_net_up >/dev/null || fail "network to the monitor"
RBD_ID=$(rbd_map "$POOL" "$IMAGE") || fail "rbd map"
DEV=rbd$RBD_ID
echo "mapped $POOL/$IMAGE as $DEV: $(cat /sys/bus/rbd/devices/$RBD_ID/client_id) at $(cat /sys/bus/rbd/devices/$RBD_ID/client_addr)"
