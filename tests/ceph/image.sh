#!/usr/bin/env bash
# image.sh DIR COMMAND [ARGS]   thin wrappers around rbd/rados/ceph, run inside the cluster's
# network namespace with its private config (DIR as given to cluster.sh up).
#
#   create NAME SIZE_MB      rbd create POOL/NAME --size SIZE_MB  (BJ_CEPH_IMAGE_FEATURES=... to
#                            pass --image-feature; default: rbd's own default feature set)
#   rm NAME                  rbd rm POOL/NAME
#   info NAME                rbd info POOL/NAME
#   id NAME                  the image id (rbd info's block_name_prefix without "rbd_data.")
#   status NAME              rbd status POOL/NAME   ("Watchers:" and one "watcher=ADDR client.ID
#                            cookie=N" line per watcher)
#   watchers NAME            only the watcher lines of `rbd status`, trimmed (nothing if none)
#   listwatchers NAME        rados -p POOL listwatchers rbd_header.<id>
#   blocklist-add ADDR       ceph osd blocklist add ADDR   (ADDR: ip, or ip:port/nonce)
#   blocklist-ls             ceph osd blocklist ls
#   blocklist-clear          ceph osd blocklist clear
#   ceph|rbd|rados ARGS...   any of the three CLIs, inside the namespace
set -uo pipefail

die() { printf '[image] ERROR: %s\n' "$*" >&2; exit 1; }
(( $# >= 2 )) || { sed -n '2,19p' "$0" >&2; exit 2; }
DIR=$(realpath -m -- "$1"); CMD=$2; shift 2
NS=$(cat "$DIR/netns" 2>/dev/null) || die "no cluster in $DIR (cluster.sh up $DIR)"
CONF=$DIR/ceph.conf
[[ -f $CONF ]] || die "no $CONF"
POOL=${BJ_CEPH_POOL:-k8s}

# Every command: inside the namespace, private config, bounded in time.
nsx() { ip netns exec "$NS" env CEPH_CONF="$CONF" timeout -k 2 "${BJ_CEPH_CMD_TIMEOUT:-30}" "$@"; }
need() { (( $# >= $1 + 1 )) || die "$CMD needs $1 argument(s)"; }

image_id() {
    local prefix
    prefix=$(nsx rbd info "$POOL/$1" | awk '/block_name_prefix:/ { print $2 }') || return 1
    [[ $prefix == rbd_data.* ]] || { echo "no block_name_prefix for $POOL/$1" >&2; return 1; }
    echo "${prefix#rbd_data.}"
}

case $CMD in
    create)
        (( $# == 2 )) || die "usage: create NAME SIZE_MB"
        feat=()
        [[ -n ${BJ_CEPH_IMAGE_FEATURES:-} ]] && feat=(--image-feature "$BJ_CEPH_IMAGE_FEATURES")
        nsx rbd create "$POOL/$1" --size "$2" "${feat[@]}" ;;
    rm)            (( $# == 1 )) || die "usage: rm NAME"; nsx rbd rm --no-progress "$POOL/$1" ;;
    info)          (( $# == 1 )) || die "usage: info NAME"; nsx rbd info "$POOL/$1" ;;
    id)            (( $# == 1 )) || die "usage: id NAME"; image_id "$1" ;;
    status)        (( $# == 1 )) || die "usage: status NAME"; nsx rbd status "$POOL/$1" ;;
    watchers)
        (( $# == 1 )) || die "usage: watchers NAME"
        out=$(nsx rbd status "$POOL/$1") || exit 1
        awk '$1 ~ /^watcher=/ { $1 = $1; print }' <<<"$out" ;;
    listwatchers)
        (( $# == 1 )) || die "usage: listwatchers NAME"
        id=$(image_id "$1") || exit 1
        nsx rados -p "$POOL" listwatchers "rbd_header.$id" ;;
    blocklist-add)   (( $# == 1 )) || die "usage: blocklist-add ADDR"; nsx ceph osd blocklist add "$1" ;;
    blocklist-ls)    nsx ceph osd blocklist ls ;;
    blocklist-clear) nsx ceph osd blocklist clear ;;
    ceph|rbd|rados)  nsx "$CMD" "$@" ;;
    *) die "unknown command $CMD" ;;
esac
