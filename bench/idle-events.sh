#!/bin/bash
# Events and bytes a watcher receives from the agent on this host over a window (BENCHMARKS.md
# "The event stream", issue 21): the daemon in report mode (its default periodic rescans), one
# `agentctl watch -o json` for WINDOW seconds after the first scan, every event counted with its
# JSON size and its largest.
#   bench/idle-events.sh [BIN_DIR] [WINDOW]      (default target/release, 60 s)
# Run it as root on a host left otherwise idle for the window.
set -euo pipefail
BIN=${1:-target/release}
WINDOW=${2:-60}
dir=$(mktemp -d /var/tmp/bj-idle-events.XXXXXX)
trap 'kill "$agent" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"' EXIT
"$BIN/blockjanitor-agent" serve --socket "$dir/agent.sock" --state "$dir/state.json" \
  --journal "$dir/journal.jsonl" --trust-unreadable-init --log-format json >"$dir/agent.log" 2>&1 &
agent=$!
for _ in $(seq 100); do [ -S "$dir/agent.sock" ] && break; sleep 0.2; done
"$BIN/agentctl" --socket "$dir/agent.sock" devices >/dev/null   # the first scan is done
timeout "$WINDOW" "$BIN/agentctl" --socket "$dir/agent.sock" watch -o json >"$dir/events.json" || true
python3 - "$dir/events.json" "$WINDOW" <<'PY'
import json, sys, collections
# `agentctl watch -o json`: one event per line; each with its size in bytes of JSON.
events = [(json.loads(l), len(l.rstrip("\n"))) for l in open(sys.argv[1]) if l.strip()]
kinds = collections.Counter(f"{e.get('type', '?')} {e.get('device', '')}" for e, _ in events)
total = sum(n for _, n in events)
print(f"window {sys.argv[2]} s: {len(events)} events, {total} bytes of JSON, largest {max((n for _, n in events), default=0)} bytes")
for k, n in kinds.most_common(10):
    print(f"  {n:5d}  {k}")
PY
