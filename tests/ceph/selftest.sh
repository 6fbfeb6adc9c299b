#!/usr/bin/env bash
# selftest.sh — prove the Ceph harness end to end, timed:
#   cluster up; create image; map-smoke in the guest (kernel rbd client over qemu user networking
#   inside the cluster's netns) while the host checks that `rbd status` shows exactly the guest's
#   watcher; no watcher after the unmap; `ceph osd blocklist add` of the guest's address, then
#   `blocklist clear`; cluster down, and nothing left behind (processes, netns, files).
# Ends with "N passed, N failed"; exit 0 only if nothing failed. Cleans up on any failure or signal.
# Bounded: BJ_CEPH_SELFTEST_LIMIT (default 170) seconds in all, then it stops and cleans up.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LIMIT=${BJ_CEPH_SELFTEST_LIMIT:-170}
IMAGE=smoke
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

PASS=0 FAILN=0
pass() { PASS=$((PASS + 1)); echo "PASS $1${2:+: $2}"; }
failc() { FAILN=$((FAILN + 1)); echo "FAIL $1${2:+: $2}"; }

T0=$EPOCHREALTIME
TOP=$(mktemp -d "${TMPDIR:-/tmp}/bj-ceph-selftest.XXXXXX") || exit 1
CDIR=$TOP/cluster SHARE=$TOP/share
mkdir -p "$SHARE"
GPID='' WATCHDOG='' NS='' CLUSTER_UP=0 FINISHED=0

cleanup() {
    local rc=$?
    [[ -n $WATCHDOG ]] && kill "$WATCHDOG" 2>/dev/null
    [[ -n $GPID ]] && kill "$GPID" 2>/dev/null     # guest-rbd.sh; its qemu dies with the netns below
    if (( CLUSTER_UP )); then
        echo "cleanup: cluster down"
        "$HERE/cluster.sh" down "$CDIR" 2>&1 | sed 's/^/  /'
    fi
    rm -rf "$TOP"
    if (( ! FINISHED )); then
        echo "$PASS passed, $((FAILN + 1)) failed (aborted after $(elapsed "$T0") s)"
        exit 1
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'echo "selftest: interrupted or over its ${LIMIT}s limit"; exit 1' INT TERM
( trap 'kill "$sp" 2>/dev/null; exit 0' TERM; sleep "$LIMIT" & sp=$!; wait "$sp" && kill -TERM $$ ) 2>/dev/null &
WATCHDOG=$!

# ---- 1. cluster up
t=$EPOCHREALTIME
CLUSTER_UP=1                      # from here on, `down` in cleanup (it handles a partial up too)
if "$HERE/cluster.sh" up "$CDIR" 2>"$TOP/up.log"; then
    eval "$("$HERE/cluster.sh" env "$CDIR")"
    NS=$BJ_CEPH_NETNS
    pass "cluster up" "$(elapsed "$t") s (netns $NS, mon $BJ_CEPH_MON_ADDR)"
    grep -E 'installing|done in|up in' "$TOP/up.log" | sed 's/^/    /'
else
    failc "cluster up" "$(elapsed "$t") s"; cat "$TOP/up.log"
    exit 1
fi
img() { "$HERE/image.sh" "$CDIR" "$@"; }

# ---- 2. image
t=$EPOCHREALTIME
if img create "$IMAGE" 64 && img info "$IMAGE" >"$TOP/info" && [[ -z $(img watchers "$IMAGE") ]]; then
    pass "create image k8s/$IMAGE (64 MiB), no watcher yet" "$(elapsed "$t") s"
    grep -E 'block_name_prefix|features:' "$TOP/info" | sed 's/^\s*/    /'
else
    failc "create image k8s/$IMAGE"; exit 1
fi

# ---- 3. the guest maps the image; the host checks the watcher while it is mapped.
# Handshake over the 9p share: the guest writes share/mapped and waits for share/mapped.ack.
t=$EPOCHREALTIME
# run.sh keeps its logs in BLOCKJANITOR_GUEST_OUTDIR: inside $TOP, printed on failure, then removed.
BJ_CEPH_IMAGE=$IMAGE BLOCKJANITOR_GUEST_SHARE=$SHARE BLOCKJANITOR_GUEST_TIMEOUT=90 \
    BLOCKJANITOR_GUEST_OUTDIR=$TOP/guest-logs \
    "$HERE/guest-rbd.sh" "$CDIR" "$HERE/scenarios/map-smoke.sh" >"$TOP/guest.out" 2>"$TOP/guest.err" &
GPID=$!
while [[ ! -f $SHARE/mapped ]] && kill -0 "$GPID" 2>/dev/null; do sleep 0.1; done
CLIENT_ID='' CLIENT_ADDR=''
if [[ -f $SHARE/mapped ]]; then
    t_mapped=$(elapsed "$t")
    line=$(cat "$SHARE/mapped")
    for kv in $line; do
        case $kv in client_id=*) CLIENT_ID=${kv#*=} ;; client_addr=*) CLIENT_ADDR=${kv#*=} ;; esac
    done
    num=${CLIENT_ID#client}
    watchers=$(img watchers "$IMAGE")
    listw=$(img listwatchers "$IMAGE")
    echo "    guest says (after ${t_mapped} s): $line"
    echo "    rbd status:        ${watchers//$'\n'/ | }"
    echo "    rados listwatchers: ${listw//$'\n'/ | }"
    n=$(grep -c . <<<"$watchers")
    re="^watcher=${CLIENT_ADDR//./\\.} client\.$num cookie=[0-9]+$"
    if [[ $num =~ ^[0-9]+$ && $n == 1 && $watchers =~ $re && $listw =~ $re ]]; then
        pass "watcher while mapped" "exactly one, client.$num at $CLIENT_ADDR"
        echo "ok watcher=$CLIENT_ADDR client.$num" >"$SHARE/.ack" && mv "$SHARE/.ack" "$SHARE/mapped.ack"
    else
        failc "watcher while mapped" "$n watcher(s), expected one for client.$num at $CLIENT_ADDR"
        echo "fail: host saw $n watcher(s)" >"$SHARE/.ack" && mv "$SHARE/.ack" "$SHARE/mapped.ack"
    fi
else
    failc "watcher while mapped" "the guest never reported a mapping"
fi
wait "$GPID"; grc=$?; GPID=
if [[ $grc == 0 ]] && grep -q '^map-smoke: ok$' "$TOP/guest.out" && [[ -f $SHARE/unmapped ]]; then
    pass "map-smoke in the guest" "$(elapsed "$t") s ($(grep -o 'ok: map-smoke.sh in [0-9.]* s' "$TOP/guest.err" | cut -d' ' -f4-) boot+scenario)"
    grep -E '^rbd0 |^mapped|^eth0|banner' "$TOP/guest.out" | sed 's/^/    /'
else
    failc "map-smoke in the guest" "exit $grc"
    sed 's/^/    | /' "$TOP/guest.out" "$TOP/guest.err"
fi

# ---- 4. no watcher after the unmap
t=$EPOCHREALTIME
w=$(img watchers "$IMAGE"); rc=$?
if [[ $rc == 0 && -z $w ]]; then
    pass "no watcher after unmap" "$(elapsed "$t") s"
else
    failc "no watcher after unmap" "rc $rc: $w"
fi

# ---- 5. blocklist the guest's address, then clear
t=$EPOCHREALTIME
if [[ -n $CLIENT_ADDR ]]; then
    out=$(img blocklist-add "$CLIENT_ADDR" 2>&1); ls1=$(img blocklist-ls 2>&1)
    out2=$(img blocklist-clear 2>&1); ls2=$(img blocklist-ls 2>&1)
    echo "    blocklist add: $out"
    echo "    blocklist ls:  ${ls1//$'\n'/ | }"
    echo "    after clear:   ${ls2//$'\n'/ | }"
    if grep -qF "$CLIENT_ADDR " <<<"$ls1" && ! grep -qF "$CLIENT_ADDR" <<<"$ls2"; then
        pass "blocklist add + clear" "$(elapsed "$t") s"
    else
        failc "blocklist add + clear" "$out / $out2"
    fi
else
    failc "blocklist add + clear" "no client_addr from the guest"
fi

# ---- 6. cluster down, nothing left
t=$EPOCHREALTIME
"$HERE/cluster.sh" down "$CDIR" 2>"$TOP/down.log"; rc=$?
CLUSTER_UP=0
left=()
ip netns list | grep -qw -- "^$NS" && left+=("netns $NS")
[[ -e $CDIR ]] && left+=("$CDIR")
for p in /proc/[0-9]*; do
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -qF -- "$CDIR/" && left+=("pid ${p#/proc/}")
done
if [[ $rc == 0 && ${#left[@]} == 0 ]]; then
    pass "cluster down, nothing left" "$(elapsed "$t") s"
else
    failc "cluster down" "rc $rc, left: ${left[*]}"; cat "$TOP/down.log"
fi

echo "total $(elapsed "$T0") s"
FINISHED=1
echo "$PASS passed, $FAILN failed"
(( FAILN == 0 ))
