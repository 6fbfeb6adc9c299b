#!/usr/bin/env bash
# Coverage-guided fuzzing of the agent's parsers with AFL++ (cargo-afl, on the stable toolchain).
#
# Usage: scripts/fuzz.sh TARGET [SECONDS]     one target (default 60 s)
#        scripts/fuzz.sh all [SECONDS]        every target in turn, SECONDS each
#        scripts/fuzz.sh build                only install what is missing and build the targets
#                                             (scripts/test.sh runs it while the tests run)
# Targets (fuzz/src/lib.rs): mountinfo dm proc kubelet kmsg config grpc sysfs.
#
# Installs what it needs when missing (as root: build-essential; cargo-afl from crates.io, whose
# `cargo afl config --build` builds AFL++'s runtime once). Builds the targets instrumented
# (`cargo afl build --features afl`, target dir target/afl), runs AFL++'s afl-fuzz from
# the seed corpus fuzz/corpus/TARGET for SECONDS, prints the executions run, and copies every
# crash and hang found into fuzz/regressions/TARGET/ (replayed by `cargo test -p
# blockjanitor-fuzz` from then on) and exits 1 when there is one. Findings are kept, never lost:
# the AFL++ output stays in target/afl/out/TARGET.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(mountinfo dm proc kubelet kmsg config grpc sysfs events ceph_addr)
[ $# -ge 1 ] || { sed -n '2,15p' "$0" >&2; exit 2; }
which=$1 secs=${2:-60}
case "$which" in
  all) run=("${targets[@]}") ;;
  build) run=() ;;
  *) printf '%s\n' "${targets[@]}" | grep -qx "$which" || { echo "fuzz.sh: unknown target '$which' (${targets[*]})" >&2; exit 2; }
     run=("$which") ;;
esac

if ! command -v cargo-afl >/dev/null 2>&1; then
  echo "fuzz.sh: installing cargo-afl (crates.io)"
  cargo install --locked cargo-afl
fi
# AFL++'s runtime for this rustc, built once per toolchain (a few minutes).
cargo afl config --build >/dev/null 2>&1 || true

# afl-fuzz itself, as cargo-afl built it for this rustc (called directly: `cargo afl fuzz` adds
# a CMPLOG pass that needs a second instrumented build, and every seed times out without it).
afl_fuzz=$(ls -d "$HOME"/.local/share/afl.rs/rustc-"$(rustc -V | cut -d' ' -f2)"-*/afl.rs-*/afl/bin/afl-fuzz 2>/dev/null | head -1)
[ -x "$afl_fuzz" ] || { echo "fuzz.sh: no afl-fuzz built by cargo-afl for this rustc (cargo afl config --build)" >&2; exit 1; }

export CARGO_TARGET_DIR=$PWD/target/afl
# The optimisation level is cargo-afl's, not the profile's: it passes `-C opt-level=$AFL_OPT_LEVEL`
# (default 3) and `-C codegen-units=1` in RUSTFLAGS, which is why FUZZ_PROFILE=dev was no faster
# to build. The instrumented build of the agent's whole dependency tree at level 3 took about 9 of
# a cold CI run's minutes on 2 cores; scripts/test.sh's 6-second smoke run asks for
# AFL_OPT_LEVEL=1 (a build of about 7 minutes instead of 11 here, and about as many executions
# in 6 s); a long run keeps 3.
# FUZZ_PROFILE=dev for a debug build (debug info, the same opt-level).
profile=${FUZZ_PROFILE:-release}
# No debug info in the instrumented release build (the workspace's release profile has some, for
# profiling the agent): linking ten instrumented binaries with it was a large part of the build,
# and a finding is replayed by `cargo test -p blockjanitor-fuzz`, which has it.
export CARGO_PROFILE_RELEASE_DEBUG=${CARGO_PROFILE_RELEASE_DEBUG:-0}
bindir=$CARGO_TARGET_DIR/$([ "$profile" = dev ] && echo debug || echo "$profile")
echo "== building the targets instrumented"
cargo afl build --locked --profile "$profile" -q -p blockjanitor-fuzz --features afl
[ ${#run[@]} -gt 0 ] || { echo "== built the targets instrumented in ${SECONDS}s"; exit 0; }

# Machines without a tuned core_pattern or CPU governor (containers, CI): AFL++ would refuse.
export AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_NO_UI=1
export AFL_NO_AFFINITY=1 AFL_AUTORESUME=1
found=0
for t in "${run[@]}"; do
  out=$CARGO_TARGET_DIR/out/$t
  mkdir -p "$out"
  echo "== fuzzing $t for ${secs}s"
  "$afl_fuzz" -V "$secs" -t 2000 -i "fuzz/corpus/$t" -o "$out" "$bindir/$t" >"$out/afl.log" 2>&1 || {
    echo "fuzz.sh: afl-fuzz failed for $t:" >&2; tail -20 "$out/afl.log" >&2; exit 1; }
  stats=$out/default/fuzzer_stats
  execs=$(awk -F: '/^execs_done/ {gsub(/ /,"",$2); print $2}' "$stats")
  paths=$(awk -F: '/^corpus_count/ {gsub(/ /,"",$2); print $2}' "$stats")
  crashes=0
  for kind in crashes hangs; do
    for f in "$out/default/$kind"/id:*; do
      [ -e "$f" ] || continue
      mkdir -p "fuzz/regressions/$t"
      cp "$f" "fuzz/regressions/$t/$kind-$(sha256sum "$f" | cut -c1-16)"
      crashes=$((crashes + 1))
    done
  done
  echo "$t: $execs executions, $paths inputs in the corpus, $crashes crash(es) or hang(s)"
  [ "$crashes" -eq 0 ] || found=1
done
if [ $found -ne 0 ]; then
  echo "fuzz.sh: findings copied to fuzz/regressions/ (replay: cargo test -p blockjanitor-fuzz)" >&2
  exit 1
fi
