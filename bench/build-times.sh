#!/bin/bash
# Clean and warm dev builds of agentctl and the console, at an older revision and at the working
# tree, one after the other in one run (BENCHMARKS.md "Build times", issue 19):
#   bench/build-times.sh [BEFORE_REV]        (default c4f28f7, the tree before the restructure)
# For each: a clean build into a fresh target dir (the registry already downloaded), a rebuild
# after touching a source file of the binary's own crate, and a rebuild after touching an agent
# file (agent/src/engine/mod.rs): the last is what a change to the agent costs agentctl and the
# console. Needs about 3 GB of disk at a time; the target dirs are removed as it goes.
set -euo pipefail
BEFORE=${1:-c4f28f7}
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d /var/tmp/bj-build-times.XXXXXX)
trap 'git -C "$REPO" worktree remove --force "$WORK/before" 2>/dev/null; rm -rf "$WORK"' EXIT
git -C "$REPO" worktree add -q --detach "$WORK/before" "$BEFORE"

secs() { local s e; s=$(date +%s.%N); "$@" >/dev/null 2>&1; e=$(date +%s.%N); echo "$e - $s" | bc; }
measure() { # LABEL DIR TOUCHED CARGO-ARGS...
  local label=$1 dir=$2 touched=$3; shift 3
  local t="$WORK/target-$label"
  cd "$dir"
  printf '%-16s clean %7.1f s' "$label" "$(CARGO_TARGET_DIR=$t secs cargo build --locked "$@")"
  touch "$touched"
  printf '   own source touched %5.2f s' "$(CARGO_TARGET_DIR=$t secs cargo build --locked "$@")"
  touch agent/src/engine/mod.rs
  printf '   agent file touched %5.2f s\n' "$(CARGO_TARGET_DIR=$t secs cargo build --locked "$@")"
  rm -rf "$t"
}
echo "$(uptime)"
measure agentctl-before "$WORK/before" agent/src/bin/agentctl.rs -p blockjanitor --bin agentctl
measure agentctl-after "$REPO" ctl/src/cli/mod.rs -p blockjanitor-ctl --bin agentctl
measure console-before "$WORK/before" console/src/serve.rs -p blockjanitor-console --bin blockjanitor-console
measure console-after "$REPO" console/src/serve.rs -p blockjanitor-console --bin blockjanitor-console
echo "$(uptime)"
