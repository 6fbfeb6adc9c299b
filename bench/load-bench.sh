#!/usr/bin/env bash
# load-bench.sh: the agent's load test of issue 13 (figures in BENCHMARKS.md, "Load").
#
# Builds the release agent, then runs `cargo bench --bench agent_load`: a release daemon in
# report mode on a temporary unix socket and on loopback TCP with mutual TLS; 200 TLS clients
# (each its own viewer certificate) mixing ListDevices, GetDevice and Plan, and 100 WatchEvents
# streams on the socket, for 120 s, while loop devices are created, mounted, unmounted and
# detached 5 times a second through the real kernel. Prints Markdown and each bound's verdict;
# exits 1 when a bound is missed. Loopback only; bounded in time and count.
#
# Root. Environment: LOAD_SECONDS (120), LOAD_CLIENTS (200), LOAD_WATCHERS (100),
# LOAD_CHURN_PER_SECOND (5), LOAD_THINK_MS (100), LOAD_PLAN_EVERY_MS (5000).
# Everything is made in a temporary directory under /var/tmp and undone at the end, even on
# failure or Ctrl-C (the bench's own guards first; this script's trap for anything left).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "load-bench.sh: needs root (loop devices, mounts)" >&2; exit 2; }

base=$(mktemp -d /var/tmp/bj-load-bench.XXXXXX)
cleanup() {
  # Best effort, every step: nothing found is not a failure (set -e and pipefail are off here).
  set +e +o pipefail
  # Mounts under the directory (deepest first), then loop devices backed by its files.
  findmnt -rn -o TARGET | grep -F "$base/" | sort -r | while read -r m; do umount -l "$m" || true; done
  losetup -n -l -O NAME,BACK-FILE | while read -r dev file; do
    case "$file" in "$base"/*) losetup -d "$dev" || true ;; esac
  done
  rm -rf "$base"
}
trap cleanup EXIT INT TERM

cargo build --release --locked -p blockjanitor --bins
LOAD_DIR=$base cargo bench --locked -p blockjanitor-tests --bench agent_load
