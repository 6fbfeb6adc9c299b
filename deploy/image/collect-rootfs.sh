#!/bin/sh
# Used by the Dockerfile (not at runtime): copies the given binaries and exactly the shared
# libraries they load (their `ldd` closure, from the Debian bookworm stage that runs this) into a
# new root DIR, plus the few /etc files glibc reads (passwd, group, nsswitch.conf: the socket's
# group is looked up by name). The runtime image is that root and nothing else: no shell, no
# package manager. Usage: collect-rootfs.sh DIR BINARY...
set -eu
root=$1
shift
# Debian bookworm has a merged /usr: /lib and /lib64 are links into /usr.
mkdir -p "$root/usr/local/bin" "$root/usr/lib/x86_64-linux-gnu" "$root/usr/lib64" "$root/etc" "$root/tmp" \
  "$root/run/blockjanitor" "$root/var/lib/blockjanitor"
ln -sfn usr/lib "$root/lib"
ln -sfn usr/lib64 "$root/lib64"
chmod 1777 "$root/tmp"
for bin in "$@"; do
  cp "$bin" "$root/usr/local/bin/"
  # "libX.so => /lib/.../libX.so (0x...)" and the loader's own "/lib64/ld-linux-x86-64.so.2 (0x...)".
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
done | sort -u | while read -r lib; do
  # -L: the soname path gets the library's bytes (no dangling link into a missing file).
  cp -L --parents "$lib" "$root/"
done
cp /etc/passwd /etc/group /etc/nsswitch.conf "$root/etc/"
# Every binary must start in the new root: each library it needs is there.
for bin in "$@"; do
  if chroot "$root" "/usr/local/bin/$(basename "$bin")" --version >/dev/null; then :; else
    echo "collect-rootfs: $(basename "$bin") does not run in $root" >&2
    exit 1
  fi
done
