#!/usr/bin/env bash
# Mutation check of the safety property tests: removes each gate of agent/src/judge/gates.rs in turn
# (completeness, identity, the Kubernetes API, the kernel's word, the users of a mount a release
# detaches, what an unmount takes with it through mount propagation, a dm device's openers, a volume in use that no device serves once a plan's subject is gone; and for
# an orphaned pod volume directory's rmdir: the API's word on its pod, the node's, the mounts on it
# in every namespace, its identity) and requires the property test guarding it to FAIL against
# every mutant: tests/tests/safety_property.rs for the device gates,
# tests/tests/pod_volume_property.rs for pod-api, pod-node, dir-mounts and dir-identity. `openers-exact` is not a
# removal: it puts back the openers gate as it was before issue 34 (the open count at most the fds
# seen, counted one by one), so the property test must also tell the exact comparison from the old
# one. A mutant that passes means the property test no longer guards that gate: this
# script then exits 1.
#
# One build serves every mutant: with the agent's `mutation-check` feature, each gate begins
# (right after its `// mutation-check: NAME` marker) with an early "let everything through" (or,
# for openers-exact, the old comparison) taken when BLOCKJANITOR_MUTANT names it. The feature gives the build artifacts of its own, so none of
# this checkout's compiled crates or binaries is replaced, and a warm run builds nothing.
#
# Usage: scripts/mutation-check.sh [GATE...]   (default: all thirteen)
set -euo pipefail
cd "$(dirname "$0")/.."
gates=("$@")
[ ${#gates[@]} -gt 0 ] || gates=(completeness identity api kernel-word mount-users umount-propagation openers openers-exact unplaced-volume pod-api pod-node dir-mounts dir-identity)
cases=${BLOCKJANITOR_MUTATION_CASES:-20000}
work=$(mktemp -d /var/tmp/bj-mutants.XXXXXX)
trap 'rm -rf "$work"' EXIT

for gate in "${gates[@]}"; do
  case "$gate" in
    completeness | identity | api | kernel-word | mount-users | umount-propagation | openers | openers-exact | unplaced-volume) ;;
    pod-api | pod-node | dir-mounts | dir-identity) ;;
    *) echo "mutation-check: unknown gate '$gate' (completeness, identity, api, kernel-word, mount-users, umount-propagation, openers, openers-exact, unplaced-volume, pod-api, pod-node, dir-mounts, dir-identity)" >&2; exit 2 ;;
  esac
  # The removal must sit right after the gate's marker, at the top of its body.
  if ! grep -A1 -F "// mutation-check: $gate" agent/src/judge/gates.rs | grep -qF "removable!(\"$gate\","; then
    echo "mutation-check: no 'removable!(\"$gate\", ...)' right after the marker '// mutation-check: $gate' in gates.rs" >&2
    exit 2
  fi
done

property_test() { # GATE: the property test that guards it
  case "$1" in
    pod-api | pod-node | dir-mounts | dir-identity) echo pod_volume_property ;;
    *) echo safety_property ;;
  esac
}

run() { # GATE: its property test against the build with GATE removed (none: "")
  BLOCKJANITOR_MUTANT="$1" BLOCKJANITOR_PROPERTY_CASES="$cases" \
    cargo test --locked --quiet -p blockjanitor-tests --features blockjanitor/mutation-check \
    --test "$(property_test "$1")" -- --test-threads=2
}

echo "== building the property tests with removable gates"
cargo test --locked --quiet --no-run -p blockjanitor-tests --features blockjanitor/mutation-check \
  --test safety_property --test pod_volume_property >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 2; }

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
    why=$(grep -m1 -oE '"[^"]*(ran|detached|unmounted|rmdir)[^"]*"' "$work/$gate.log" || true)
    echo "killed: the property test fails without the $gate gate (${secs}s) ${why}"
  fi
done
if [ ${#survivors[@]} -gt 0 ]; then
  echo "mutation-check: ${#survivors[@]} mutant(s) survived: ${survivors[*]}" >&2
  exit 1
fi
echo "mutation-check: every gate is guarded (${#gates[@]} mutants killed)"
