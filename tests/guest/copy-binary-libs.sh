#!/usr/bin/env bash
# copy-binary-libs.sh BINARY DESTDIR [GUEST_PATH]
#
# Copy a dynamically linked host binary and every shared library `ldd` lists for it (and the ELF
# interpreter) into DESTDIR, preserving their absolute paths: /usr/bin/lsblk becomes
# DESTDIR/usr/bin/lsblk, /lib/x86_64-linux-gnu/libblkid.so.1 DESTDIR/lib/x86_64-linux-gnu/...;
# symlinks are kept as symlinks, their targets copied too.
# GUEST_PATH (optional, absolute) puts the binary elsewhere, e.g. /bin/blockjanitor for a
# target/release/blockjanitor. A static binary is copied alone.
#
# Pass DESTDIR to run.sh as EXTRA_FILES_DIR: it appears in the guest as /extra/, whose bin dirs are on
# PATH and whose libraries /init links into /lib... (never replacing the image's own), so the
# binary runs as /extra/<path>. Prints that guest path on stdout.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

(( $# == 2 || $# == 3 )) || { sed -n '2,12p' "$0" >&2; exit 2; }
BIN=$1 DEST=$2 GUEST=${3:-}
[[ -f $BIN ]] || { echo "copy-binary-libs: no such file: $BIN" >&2; exit 1; }
is_elf "$(readlink -f "$BIN")" || { echo "copy-binary-libs: not an ELF file: $BIN" >&2; exit 1; }
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
ABS=$(readlink -f "$BIN")

if [[ -n $GUEST ]]; then
    [[ $GUEST == /* ]] || { echo "copy-binary-libs: GUEST_PATH must be absolute" >&2; exit 1; }
    mkdir -p "$DEST$(dirname "$GUEST")"
    cp -p "$ABS" "$DEST$GUEST"
else
    GUEST=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
    copy_path_preserving "$GUEST" "$DEST"
fi
n=0
while IFS= read -r lib; do
    [[ -n $lib ]] || continue
    copy_path_preserving "$lib" "$DEST"
    n=$((n + 1))
done < <(ldd_paths "$ABS")
echo "copy-binary-libs: $BIN -> $DEST$GUEST with $n libraries" >&2
echo "/extra$GUEST"
