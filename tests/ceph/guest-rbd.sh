#!/usr/bin/env bash
# guest-rbd.sh DIR SCENARIO_SCRIPT [EXTRA_DIR]
#
# Run a guest scenario (tests/guest/run.sh) that can reach the test cluster of DIR
# (tests/ceph/cluster.sh up DIR): qemu runs INSIDE the cluster's network namespace with user-mode
# networking, so the guest's TCP connections come out of slirp as connections made from inside
# that namespace, where the monitor's 10.x address lives on lo. Nothing can leave the machine: the
# namespace has no other interface and no route.
#
# The guest gets, besides the files of EXTRA_DIR (copied, never modified):
#   /extra/ceph.env      MON_ADDR SECRET CEPH_USER POOL IMAGE FSID GUEST_IP GUEST_GW RBD_MAP_OPTS
#   /extra/ceph-lib.sh   ceph_net_up, rbd_map, rbd_unmap, host_handshake (tests/ceph/guest-lib.sh)
# stdout/stderr/exit code: those of run.sh.
#
# Environment: BJ_CEPH_IMAGE (IMAGE in ceph.env, default "smoke"), BJ_CEPH_RBD_MAP_OPTS (extra
# kernel map options, default "mount_timeout=30"), and every BLOCKJANITOR_GUEST_* knob of run.sh
# (BLOCKJANITOR_GUEST_SHARE for a 9p folder, BLOCKJANITOR_GUEST_TIMEOUT...).
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
GUEST=$(cd "$HERE/../guest" && pwd)
say() { printf '[guest-rbd] %s\n' "$*" >&2; }
fail() { say "ERROR: $*"; exit 126; }

(( $# >= 2 && $# <= 3 )) || { sed -n '2,4p' "$0" >&2; exit 126; }
DIR=$1 SCENARIO=$2 EXTRA=${3:-}
[[ -f $SCENARIO ]] || fail "no such scenario: $SCENARIO"
[[ -z $EXTRA || -d $EXTRA ]] || fail "EXTRA_DIR is not a directory: $EXTRA"

ENV=$("$HERE/cluster.sh" env "$DIR") || fail "no cluster in $DIR"
eval "$ENV"
ip netns list | grep -qw -- "^$BJ_CEPH_NETNS" || fail "netns $BJ_CEPH_NETNS is gone"
# slirp forwards the guest's connections from inside the namespace: refuse if it could reach out.
"$HERE/cluster.sh" check-isolated "$DIR" >/dev/null || fail "netns $BJ_CEPH_NETNS is not isolated"

# The guest build must exist before we enter the namespace: prepare.sh may need Debian's mirror,
# which is (on purpose) unreachable from inside it.
"$GUEST/prepare.sh" >/dev/null || fail "tests/guest/prepare.sh failed"

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/bj-guest-rbd.XXXXXX") || fail "mktemp"
trap 'rm -rf "$STAGE"' EXIT
trap 'exit 130' INT TERM
if [[ -n $EXTRA ]]; then cp -a "$EXTRA"/. "$STAGE/" || fail "copying $EXTRA"; fi
cp "$HERE/guest-lib.sh" "$STAGE/ceph-lib.sh" || fail "copying guest-lib.sh"
cat >"$STAGE/ceph.env" <<EOF
# written by tests/ceph/guest-rbd.sh for cluster $BJ_CEPH_DIR (netns $BJ_CEPH_NETNS)
MON_ADDR=$BJ_CEPH_MON_ADDR
SECRET=$BJ_CEPH_SECRET
CEPH_USER=admin
POOL=$BJ_CEPH_POOL
IMAGE=${BJ_CEPH_IMAGE:-smoke}
FSID=$BJ_CEPH_FSID
GUEST_IP=10.0.2.15/24
GUEST_GW=10.0.2.2
RBD_MAP_OPTS=${BJ_CEPH_RBD_MAP_OPTS-mount_timeout=30}
EOF

say "run.sh $(basename "$SCENARIO") in netns $BJ_CEPH_NETNS (user networking, monitor $BJ_CEPH_MON_ADDR)"
ip netns exec "$BJ_CEPH_NETNS" env BLOCKJANITOR_GUEST_NET=user BLOCKJANITOR_GUEST_NO_PREPARE=1 \
    "$GUEST/run.sh" "$SCENARIO" "$STAGE"
