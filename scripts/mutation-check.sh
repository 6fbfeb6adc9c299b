#!/usr/bin/env bash
# Mutation check of the safety property test: removes each gate of agent/src/judge/gates.rs in turn
# (completeness, identity, the Kubernetes API, the kernel's word, the users of a mount a release
# detaches, a dm device's openers) and requires tests/tests/safety_property.rs to FAIL against
# every mutant. A mutant that passes means the property test no longer guards that gate: this
# script then exits 1.
#
# One build serves every mutant: with the agent's `mutation-check` feature, each gate begins
# (right after its `// mutation-check: NAME` marker) with an early "let everything through" taken
# when BLOCKJANITOR_MUTANT names it. The feature gives the build artifacts of its own, so none of
# this checkout's compiled crates or binaries is replaced, and a warm run builds nothing.
#
# Usage: scripts/mutation-check.sh [GATE...]   (default: all six)
set -euo pipefail
cd "$(dirname "$0")/.."
gates=("$@")
[ ${#gates[@]} -gt 0 ] || gates=(completeness identity api kernel-word mount-users openers)
cases=${BLOCKJANITOR_MUTATION_CASES:-20000}
work=$(mktemp -d /var/tmp/bj-mutants.XXXXXX)
trap 'rm -rf "$work"' EXIT

for gate in "${gates[@]}"; do
  case "$gate" in
    completeness | identity | api | kernel-word | mount-users | openers) ;;
    *) echo "mutation-check: unknown gate '$gate' (completeness, identity, api, kernel-word, mount-users, openers)" >&2; exit 2 ;;
  esac
  # The removal must sit right after the gate's marker, at the top of its body.
  if ! grep -A1 -F "// mutation-check: $gate" agent/src/judge/gates.rs | grep -qF "removable!(\"$gate\","; then
    echo "mutation-check: no 'removable!(\"$gate\", ...)' right after the marker '// mutation-check: $gate' in gates.rs" >&2
    exit 2
  fi
done

run() { # GATE: the property test against the build with GATE removed (none: "")
  BLOCKJANITOR_MUTANT="$1" BLOCKJANITOR_PROPERTY_CASES="$cases" \
    cargo test --locked --quiet -p blockjanitor-tests --features blockjanitor/mutation-check \
    --test safety_property -- --test-threads=2
}

echo "== building the property test with removable gates"
cargo test --locked --quiet --no-run -p blockjanitor-tests --features blockjanitor/mutation-check \
  --test safety_property >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 2; }

survivors=()
for gate in "${gates[@]}"; do
  echo "== mutant without the $gate gate"
  start=$(date +%s)
  set +e
  run "$gate" >"$work/$gate.log" 2>&1
  rc=$?
  set -e
  secs=$(( $(date +%s) - start ))
  if [ $rc -eq 0 ]; then
    echo "SURVIVED: the property test passes without the $gate gate (${secs}s)"
    tail -20 "$work/$gate.log"
    survivors+=("$gate")
  elif ! grep -q "^test result: FAILED" "$work/$gate.log"; then
    # Killed means the property test ran and failed; anything else (a build that fails, a
    # missing tool) proves nothing about the gate.
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
