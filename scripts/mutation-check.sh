#!/usr/bin/env bash
# Mutation check of the safety property test: removes each gate of agent/src/gates.rs in turn
# (completeness, identity, the Kubernetes API, the kernel's word, the users of a mount a release
# detaches, a dm device's openers), in a copy of the sources, and
# requires tests/tests/safety_property.rs to FAIL against every mutant. A mutant that passes
# means the property test no longer guards that gate: this script then exits 1.
#
# Usage: scripts/mutation-check.sh [GATE...]   (default: all six)
# The copy shares this checkout's target/ directory for dependencies; its own crates carry
# another version, so none of this checkout's compiled crates or binaries is replaced.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
gates=("$@")
[ ${#gates[@]} -gt 0 ] || gates=(completeness identity api kernel-word mount-users openers)
cases=${BLOCKJANITOR_MUTATION_CASES:-20000}
work=$(mktemp -d /var/tmp/bj-mutants.XXXXXX)
trap 'rm -rf "$work"' EXIT

survivors=()
for gate in "${gates[@]}"; do
  case "$gate" in
    api) body='        return ApiWord::NotConfigured;' ;;
    completeness | identity | kernel-word | mount-users | openers) body='        return None;' ;;
    *) echo "mutation-check: unknown gate '$gate' (completeness, identity, api, kernel-word, mount-users, openers)" >&2; exit 2 ;;
  esac
  copy="$work/$gate"
  mkdir -p "$copy"
  # The whole workspace (every member Cargo.toml names), so the copy builds as this checkout does.
  cp -r Cargo.toml Cargo.lock rustfmt.toml "$copy/"
  for member in $(sed -n '/^members *=/s/[][",=]/ /gp' Cargo.toml | sed 's/^ *members *//'); do
    cp -r "$member" "$copy/"
  done
  # Cargo names a workspace crate's artifacts by a hash of its package id that does not depend on
  # where the workspace lies: a copy at another path would overwrite this checkout's own compiled
  # crates in the shared target/ (and a later warm run would link a test against the copy's,
  # with the copy's paths baked in). Another version for the copy's members gives them artifacts
  # of their own; the dependencies stay shared. The copy's Cargo.lock is updated to match (only
  # the members' versions change: nothing is resolved anew).
  sed -i 's/^version = "\(.*\)"$/version = "\1-mutant"/' "$copy/Cargo.toml"
  grep -q '^version = ".*-mutant"$' "$copy/Cargo.toml" || { echo "mutation-check: no workspace version to set in Cargo.toml" >&2; exit 2; }
  marker="// mutation-check: $gate"
  grep -qF "$marker" "$copy/agent/src/gates.rs" || { echo "mutation-check: no marker '$marker' in gates.rs" >&2; exit 2; }
  # Replace the gate's body by an early "let everything through".
  sed -i "s|^\(\s*\)$marker\$|&\n$body|" "$copy/agent/src/gates.rs"
  echo "== mutant without the $gate gate"
  start=$(date +%s)
  set +e
  (cd "$copy" && CARGO_TARGET_DIR="$repo/target" BLOCKJANITOR_PROPERTY_CASES="$cases" \
    cargo test --offline --quiet -p blockjanitor-tests --test safety_property -- --test-threads=2 \
    >"$work/$gate.log" 2>&1)
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "SURVIVED: the property test passes without the $gate gate (${secs}s)"
    tail -20 "$work/$gate.log"
    survivors+=("$gate")
  elif grep -q "error\[E" "$work/$gate.log"; then
    echo "mutation-check: the $gate mutant does not build:" >&2
    grep -A8 "error\[E" "$work/$gate.log" >&2 | head -40
    exit 2
  elif ! grep -q "^test result: FAILED" "$work/$gate.log"; then
    # Killed means the property test ran and failed; anything else (a workspace that does not
    # load, a missing tool) proves nothing about the gate.
    echo "mutation-check: the $gate mutant failed before its property test ran:" >&2
    tail -20 "$work/$gate.log" >&2
    exit 2
  else
    why=$(grep -m1 -oE '"[^"]*(ran|detached)[^"]*"' "$work/$gate.log" || true)
    echo "killed: the property test fails without the $gate gate (${secs}s) ${why}"
  fi
done
if [ ${#survivors[@]} -gt 0 ]; then
  echo "mutation-check: ${#survivors[@]} mutant(s) survived: ${survivors[*]}" >&2
  exit 1
fi
echo "mutation-check: every gate is guarded (${#gates[@]} mutants killed)"
