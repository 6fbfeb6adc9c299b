#!/usr/bin/env bash
# selftest.sh — prove the guest harness: prepare (timed), then each scenario in scenarios/ (timed).
#   tests/guest/selftest.sh            # all
#   tests/guest/selftest.sh smoke multipath-smoke
# Exit 0 only if every scenario passed. Ends with the line "N passed, N failed".
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

t=$EPOCHREALTIME
"$HERE/prepare.sh" >/dev/null || { echo "prepare.sh failed"; echo "0 passed, 1 failed"; exit 1; }
echo "prepare.sh: $(elapsed "$t") s"

names=("$@")
(( ${#names[@]} )) || names=(smoke smoke-vmlinuz multipath-smoke binary-smoke share-smoke tools-smoke transports-smoke)
pass=0 failn=0
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for n in "${names[@]}"; do
    env=() extra=()
    script=$HERE/scenarios/$n.sh
    case $n in
        smoke-vmlinuz) script=$HERE/scenarios/smoke.sh; env=(BLOCKJANITOR_GUEST_KERNEL_IMAGE=vmlinuz) ;;
        binary-smoke)
            mkdir -p "$TMP/extra"
            "$HERE/copy-binary-libs.sh" /usr/bin/lsblk "$TMP/extra" >/dev/null &&
            "$HERE/copy-binary-libs.sh" /usr/sbin/losetup "$TMP/extra" >/dev/null || { echo "copy-binary-libs failed"; }
            extra=("$TMP/extra") ;;
        share-smoke)
            mkdir -p "$TMP/share"; echo "hello from the host" >"$TMP/share/from-host.txt"
            env=(BLOCKJANITOR_GUEST_SHARE="$TMP/share") ;;
    esac
    t=$EPOCHREALTIME
    # run.sh calls the (warm, ~0.1 s) prepare.sh again: it boots this checkout's build, even if
    # another checkout prepared its own since.
    env "${env[@]}" "$HERE/run.sh" "$script" "${extra[@]}" >"$TMP/$n.out" 2>"$TMP/$n.err"
    rc=$?
    if [[ $rc == 0 && $n == share-smoke ]] && ! grep -q 'written by the guest' "$TMP/share/from-guest.txt" 2>/dev/null; then
        echo "share-smoke: the host does not see the guest's file"; rc=1
    fi
    if [[ $rc == 0 ]]; then
        pass=$((pass + 1)); echo "PASS $n: $(elapsed "$t") s"
    else
        failn=$((failn + 1)); echo "FAIL $n (exit $rc): $(elapsed "$t") s"
        cat "$TMP/$n.out" "$TMP/$n.err"
    fi
done
echo "$pass passed, $failn failed"
(( failn == 0 ))
