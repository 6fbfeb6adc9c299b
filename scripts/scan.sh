#!/usr/bin/env bash
# The main job: a one-shot scan of this host, report only: no device, mount or map is changed (the
# agent records when it first saw each device unheld in its state file). Builds the agent
# first (installing libudev-dev and pkg-config when missing and run as root; the binaries end up in
# target/release), then runs
# `blockjanitor-agent scan` with any extra arguments (e.g. --output json).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
# shellcheck disable=SC2046
install_missing scan.sh $(build_missing)
# Every binary (agentctl and the console too), as the README's image build does: one release
# build serves both.
cargo build --locked --release --quiet --bins
exec target/release/blockjanitor-agent scan "$@"
