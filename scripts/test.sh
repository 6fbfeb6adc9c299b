#!/usr/bin/env bash
# The whole test suite, as CI runs it (.ci/run calls exactly this).
#
# As root it first installs the Debian packages the real-kernel tests need when they are missing
# (e2fsprogs for mkfs.ext4; util-linux and mount for losetup, unshare, mkswap, swapon; libudev-dev
# to build; prometheus for promtool). Then it
# checks formatting and lints, builds the binaries the integration tests run, and runs every
# test: unit, fixture-tree and real-kernel (`root_*`) tests. Real-kernel tests fail loudly when a
# prerequisite is missing and CI=true; elsewhere they print SKIPPED and the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v mkfs.ext4 >/dev/null || missing+=(e2fsprogs)
command -v losetup >/dev/null && command -v unshare >/dev/null && command -v mkswap >/dev/null || missing+=(util-linux)
command -v mount >/dev/null && command -v swapon >/dev/null || missing+=(mount)
pkg-config --exists libudev 2>/dev/null || missing+=(libudev-dev pkg-config)
command -v promtool >/dev/null || missing+=(prometheus)        # promtool checks /metrics
command -v setpriv >/dev/null || missing+=(util-linux)          # runs clients as other users
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing ${missing[*]}"
    apt-get update -qq
            # policy-rc.d exit 101: never start a service (prometheus) while installing it.
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
    [ "$own_policy" = 1 ] && rm -f /usr/sbin/policy-rc.d
  else
    echo "test.sh: missing ${missing[*]}; the real-kernel tests will be skipped (run as root to install)"
  fi
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
echo "== build"
cargo build --locked --workspace --bins
echo "== tests"
cargo test --locked --workspace
