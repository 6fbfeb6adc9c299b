#!/usr/bin/env bash
# agent-scenario.sh SCENARIO EXTRA_DIR
#
# Runs one agent scenario against a real Ceph cluster: brings a private cluster up (cluster.sh,
# its own network namespace), creates the image k8s/vol, boots the guest inside that namespace
# (guest-rbd.sh) with EXTRA_DIR (the staged agent) and a 9p share, and answers the guest's
# handshakes while it runs:
#   watchers*   -> reports the image's watchers  ("HOST <name>: <rbd status lines>")
#   blocklist   -> `ceph osd blocklist add <the address the guest wrote>`
#   clear       -> `ceph osd blocklist clear`
# Then tears the cluster down and prints the guest's output followed by the HOST lines.
# Exit: the guest's exit code (125 when the harness itself failed).
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SCENARIO=$1
EXTRA=$2
TOP=$(mktemp -d /tmp/bj-ceph-agent.XXXXXX)
CDIR=$TOP/cluster
SHARE=$TOP/share
mkdir -p "$SHARE"
HOSTLOG=$TOP/host.log
GPID=
cleanup() {
    [[ -n $GPID ]] && kill "$GPID" 2>/dev/null
    "$HERE/cluster.sh" down "$CDIR" >/dev/null 2>&1
    rm -rf "$TOP"
}
trap cleanup EXIT
img() { "$HERE/image.sh" "$CDIR" "$@"; }
ack() { printf '%s\n' "$2" >"$SHARE/.ack" && mv "$SHARE/.ack" "$SHARE/$1.ack"; }

"$HERE/cluster.sh" up "$CDIR" >"$TOP/up.log" 2>&1 || { cat "$TOP/up.log" >&2; exit 125; }
img create vol 64 >/dev/null || { echo "cannot create k8s/vol" >&2; exit 125; }

BJ_CEPH_IMAGE=vol BLOCKJANITOR_GUEST_SHARE=$SHARE BLOCKJANITOR_GUEST_TIMEOUT=${BLOCKJANITOR_GUEST_TIMEOUT:-150} \
    "$HERE/guest-rbd.sh" "$CDIR" "$SCENARIO" "$EXTRA" >"$TOP/guest.out" 2>"$TOP/guest.err" &
GPID=$!
declare -A done_names=()
while kill -0 "$GPID" 2>/dev/null; do
    for f in "$SHARE"/*; do
        [[ -f $f ]] || continue
        name=$(basename "$f")
        [[ $name == *.ack || -n ${done_names[$name]:-} ]] && continue
        done_names[$name]=1
        content=$(cat "$f")
        case $name in
            watchers*)
                w=$(img watchers vol 2>&1)
                echo "HOST $name: ${w//$'\n'/ | }" >>"$HOSTLOG"
                ack "$name" "ok ${w//$'\n'/ | }" ;;
            blocklist)
                out=$(img blocklist-add "$content" 2>&1)
                echo "HOST blocklist $content: ${out//$'\n'/ | }" >>"$HOSTLOG"
                ack "$name" "ok" ;;
            clear)
                out=$(img blocklist-clear 2>&1)
                echo "HOST clear: ${out//$'\n'/ | }" >>"$HOSTLOG"
                ack "$name" "ok" ;;
            *)  ack "$name" "fail: unknown handshake $name" ;;
        esac
    done
    sleep 0.1
done
wait "$GPID"; grc=$?; GPID=
echo "HOST final watchers: $(img watchers vol 2>&1 | tr '\n' '|')" >>"$HOSTLOG"
cat "$TOP/guest.out"
cat "$HOSTLOG" 2>/dev/null
[[ $grc == 0 ]] || cat "$TOP/guest.err" >&2
exit "$grc"
