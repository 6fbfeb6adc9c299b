#!/bin/bash
# Events and bytes a watcher receives while one device's holders churn (BENCHMARKS.md "The event
# stream", issue 21): a 32 MiB ext4 loop device mounted and unmounted in a mount namespace of
# its own, RATE cycles a second for WINDOW seconds (each cycle changes its holders and its verdict
# twice), with the daemon in report mode and one `agentctl watch -o json` open throughout. Prints
# the events about that device, their JSON bytes, the largest, and the most in any one second.
#   bench/churn-events.sh [BIN_DIR] [WINDOW] [RATE]   (default target/release, 60 s, 5/s)
# Run it as root; BIN_DIR holds blockjanitor-agent and agentctl. AGENT_FLAGS: more `serve` flags
# (AGENT_FLAGS=--no-cap-device-events: without the per-device event cap, which is on by default).
set -euo pipefail
BIN=${1:-target/release}
WINDOW=${2:-60}
RATE=${3:-5}
dir=$(mktemp -d /var/tmp/bj-churn-events.XXXXXX)
agent= holder= lo=
cleanup() {
    [ -n "$agent" ] && kill "$agent" 2>/dev/null || true
    [ -n "$holder" ] && kill "$holder" 2>/dev/null || true
    wait 2>/dev/null || true
    [ -n "$lo" ] && losetup -d "$lo" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
truncate -s 32M "$dir/disk.img" && mkfs.ext4 -q -F "$dir/disk.img"
lo=$(losetup --find --show "$dir/disk.img")
mkdir -p "$dir/mnt"
unshare -m --propagation private sleep 100000 &
holder=$!
"$BIN/blockjanitor-agent" serve --socket "$dir/agent.sock" --state "$dir/state.json" \
  --journal "$dir/journal.jsonl" --trust-unreadable-init --log-format json ${AGENT_FLAGS:-} >"$dir/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do [ -S "$dir/agent.sock" ] && break; sleep 0.2; done
"$BIN/agentctl" --socket "$dir/agent.sock" devices >/dev/null   # the first scan is done
timeout "$((WINDOW + 3))" "$BIN/agentctl" --socket "$dir/agent.sock" watch -o json >"$dir/events.json" &
watcher=$!
sleep 1
pause=$(awk -v r="$RATE" 'BEGIN { printf "%.3f", 1 / r / 2 }')
nsenter -t "$holder" -m sh -c "end=\$((\$(date +%s) + $WINDOW)); n=0; while [ \$(date +%s) -lt \$end ]; do \
  mount $lo $dir/mnt; sleep $pause; umount $dir/mnt; sleep $pause; n=\$((n+1)); done; echo \$n >$dir/cycles"
wait "$watcher" || true
python3 - "$dir/events.json" "$WINDOW" "$(basename "$lo")" "$(cat "$dir/cycles")" <<'PY'
import json, sys, collections
# `agentctl watch -o json`: one event per line; each with its size in bytes of JSON.
events = [(json.loads(l), len(l.rstrip("\n"))) for l in open(sys.argv[1]) if l.strip()]
window, dev, cycles = int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
mine = [(e, n) for e, n in events if e.get("device") == dev]
per_second = collections.Counter(int(e.get("unix_seconds", 0)) for e, _ in mine)
kinds = collections.Counter(e.get("type", "?") for e, _ in mine)
total = sum(n for _, n in mine)
print(f"{cycles} mount/unmount cycles of {dev} in {window} s ({2 * cycles} holder changes)")
print(f"  events about {dev}: {len(mine)} ({len(mine) * 60 / window:.0f}/min), {total} bytes of JSON "
      f"({total * 60 / window:.0f} B/min), largest {max((n for _, n in mine), default=0)} bytes, "
      f"at most {max(per_second.values(), default=0)} in one second")
for k, n in kinds.most_common():
    print(f"  {n:5d}  {k}")
print(f"  all events: {len(events)}, {sum(n for _, n in events)} bytes")
others = collections.Counter()
for e, n in events:
    if e.get("device") != dev:
        others[(e.get("device", ""), e.get("type", "?"))] += n
for (d, t), n in others.most_common(5):
    print(f"  other: {d} {t}: {n} bytes")
PY
