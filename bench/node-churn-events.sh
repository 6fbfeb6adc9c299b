#!/bin/bash
# Events and bytes a watcher receives from the agent on issue 20's node-shaped scene while its pods
# start and stop (BENCHMARKS.md "The event stream", issue 21): the scene must be up
# (`SCENE_SHAPE=node bench/busy-node-scene.sh up`); the daemon in report mode, one
# `agentctl watch -o json` for WINDOW seconds after its first scan, while `busy-node-scene.sh
# churn` starts a pod every 2 s and kills the oldest once 5 are alive. Prints events and bytes
# per minute, the largest event, and the events per device (with the most in any one second).
#   bench/node-churn-events.sh [BIN_DIR] [WINDOW]      (default target/release, 60 s)
# Run it as root. AGENT_FLAGS: more `serve` flags (`--no-cap-device-events` for the stream
# without the per-device cap, which is on by default).
set -euo pipefail
BIN=${1:-target/release}
WINDOW=${2:-60}
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
"$SCRIPT_DIR/busy-node-scene.sh" status >/dev/null || {
    echo "node-churn-events: the scene is not up (SCENE_SHAPE=node $SCRIPT_DIR/busy-node-scene.sh up)" >&2
    exit 1
}
dir=$(mktemp -d /var/tmp/bj-node-churn-events.XXXXXX)
agent= churn=
cleanup() {
    [ -n "$churn" ] && kill "$churn" 2>/dev/null || true
    [ -n "$agent" ] && kill "$agent" 2>/dev/null || true
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
"$BIN/blockjanitor-agent" serve --socket "$dir/agent.sock" --state "$dir/state.json" \
  --journal "$dir/journal.jsonl" --trust-unreadable-init --log-format json ${AGENT_FLAGS:-} >"$dir/agent.log" 2>&1 &
agent=$!
for _ in $(seq 300); do [ -S "$dir/agent.sock" ] && break; sleep 0.2; done
"$BIN/agentctl" --socket "$dir/agent.sock" devices >/dev/null   # the first scan is done
"$SCRIPT_DIR/busy-node-scene.sh" churn &
churn=$!
sleep 1
timeout "$WINDOW" "$BIN/agentctl" --socket "$dir/agent.sock" watch -o json >"$dir/events.json" || true
python3 - "$dir/events.json" "$WINDOW" <<'PY'
import json, sys, collections
# `agentctl watch -o json`: one event per line; each with its size in bytes of JSON.
events = [(json.loads(l), len(l.rstrip("\n"))) for l in open(sys.argv[1]) if l.strip()]
window = int(sys.argv[2])
total = sum(n for _, n in events)
print(f"window {window} s: {len(events)} events ({len(events) * 60 / window:.0f}/min), {total} bytes of JSON "
      f"({total * 60 / window:.0f} B/min), largest {max((n for _, n in events), default=0)} bytes, "
      f"{sum(1 for e, _ in events if e.get('coalesced'))} folded")
per = collections.defaultdict(list)
for e, n in events:
    per[e.get("device", "")].append((e, n))
for dev, evs in sorted(per.items(), key=lambda kv: -len(kv[1]))[:10]:
    kinds = collections.Counter(e.get("type", "?") for e, _ in evs)
    seconds = collections.Counter(int(e.get("unix_seconds", 0)) for e, _ in evs)
    print(f"  {dev or '-'}: {len(evs)} events, {sum(n for _, n in evs)} bytes, largest {max(n for _, n in evs)}, "
          f"at most {max(seconds.values())} in one second; " + ", ".join(f"{k} {c}" for k, c in kinds.most_common()))
PY
