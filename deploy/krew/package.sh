#!/usr/bin/env bash
# Packs a release archive of the kubectl plugin for krew and writes its sum into the manifest.
#
# Usage: deploy/krew/package.sh VERSION BIN ARCH [OUT_DIR [MANIFEST]]
#   VERSION   the release, without the v (0.1.0)
#   BIN       a built agentctl (e.g. target/release/agentctl): packed as kubectl-blockjanitor
#   ARCH      amd64 or arm64 (the platform of BIN)
#   OUT_DIR   where the archive goes (default: target/krew)
#   MANIFEST  the manifest to update (default: deploy/krew/blockjanitor.yaml)
# Makes OUT_DIR/kubectl-blockjanitor_vVERSION_linux_ARCH.tar.gz (kubectl-blockjanitor and
# LICENSE, reproducible: sorted, owner 0, mtime 0, gzip without a name or time), then sets the
# manifest's version and every platform's download URI to vVERSION and that platform's sha256
# to the archive's. Upload the archive to the release vVERSION before publishing the manifest.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 3 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
version=$1 bin=$2 arch=$3
out=${4:-$root/target/krew} manifest=${5:-$root/deploy/krew/blockjanitor.yaml}
case "$arch" in amd64|arm64) ;; *) echo "ARCH must be amd64 or arm64, not '$arch'" >&2; exit 2 ;; esac
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "VERSION must be X.Y.Z, not '$version'" >&2; exit 2; }
[ -x "$bin" ] || { echo "no executable $bin: build agentctl first" >&2; exit 1; }
grep -q "arch: $arch\$" "$manifest" || { echo "$manifest has no platform for arch $arch" >&2; exit 1; }

name="kubectl-blockjanitor_v${version}_linux_${arch}.tar.gz"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$bin" "$stage/kubectl-blockjanitor"
install -m 0644 "$root/LICENSE" "$stage/LICENSE"
mkdir -p "$out"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - kubectl-blockjanitor LICENSE \
    | gzip -n > "$out/$name"
sum=$(sha256sum "$out/$name" | cut -d' ' -f1)

# The version, every URI's version, and the sha256 that follows this arch's selector.
tmp="$manifest.tmp.$$"
awk -v v="v$version" -v arch="$arch" -v sum="$sum" '
    /^  version: / { print "  version: " v; next }
    /^ *uri: / { sub(/download\/v[^\/]*\/kubectl-blockjanitor_v[^_]*_/, "download/" v "/kubectl-blockjanitor_" v "_") }
    /^ *arch: / { mine = ($2 == arch) }
    /^ *sha256: / && mine { sub(/sha256: .*/, "sha256: \"" sum "\""); mine = 0 }
    { print }
' "$manifest" > "$tmp"
mv "$tmp" "$manifest"
echo "$out/$name $sum"
