# shellcheck shell=bash
# Shared helpers for the qemu guest harness (sourced by prepare.sh and copy-binary-libs.sh).
# bash only; the caller sets `set -euo pipefail`.

# copy_path_preserving SRC DESTROOT
#   Copy the absolute host path SRC to DESTROOT/SRC. A symlink is recreated as the same
#   symlink and its target is copied as well (recursively), so soname links such as
#   /lib64/ld-linux-x86-64.so.2 -> /lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 keep working.
#   Directory symlinks in DESTROOT (a merged-/usr root: lib -> usr/lib) are followed.
copy_path_preserving() {
    local src=$1 root=$2 dst target depth=${3:-0}
    [[ $src == /* ]] || { echo "copy_path_preserving: not absolute: $src" >&2; return 1; }
    (( depth < 16 )) || { echo "copy_path_preserving: symlink loop at $src" >&2; return 1; }
    dst=$root$src
    if [[ -L $src ]]; then
        target=$(readlink "$src")
        if [[ ! -e $dst && ! -L $dst ]]; then
            mkdir -p "$(dirname "$dst")"
            ln -s "$target" "$dst"
        fi
        [[ $target == /* ]] || target=$(dirname "$src")/$target
        copy_path_preserving "$target" "$root" $((depth + 1))
    elif [[ -f $src ]]; then
        if [[ ! -e $dst ]]; then
            mkdir -p "$(dirname "$dst")"
            cp -p "$src" "$dst"
        fi
    else
        # A path component of SRC is a symlink (e.g. /lib -> usr/lib on the host); copy the
        # resolved file under its resolved path too so that both spellings exist.
        local real
        real=$(readlink -f "$src") || { echo "copy_path_preserving: cannot resolve $src" >&2; return 1; }
        [[ -f $real ]] || { echo "copy_path_preserving: missing $src" >&2; return 1; }
        mkdir -p "$(dirname "$dst")"
        [[ -e $dst ]] || cp -p "$real" "$dst"
    fi
}

# ldd_paths FILE [LD_LIBRARY_PATH]
#   Print the absolute paths of the shared libraries (and the ELF interpreter) FILE needs,
#   one per line. Fails, naming them, if ldd reports a library as "not found".
#   Prints nothing for a static binary.
ldd_paths() {
    local file=$1 ldpath=${2:-} out
    out=$(LD_LIBRARY_PATH=$ldpath ldd "$file" 2>&1) || {
        case $out in
            *"not a dynamic executable"*|*"statically linked"*) return 0 ;;
        esac
        echo "ldd $file failed: $out" >&2
        return 1
    }
    case $out in *"statically linked"*) return 0 ;; esac
    if grep -q 'not found' <<<"$out"; then
        echo "ldd $file: missing libraries:" >&2
        grep 'not found' <<<"$out" >&2
        return 1
    fi
    # "libx.so.1 => /path (0x...)"  and  "/lib64/ld-linux-x86-64.so.2 (0x...)"
    awk '$2 == "=>" && $3 ~ /^\// { print $3; next }
         $1 ~ /^\// { print $1 }' <<<"$out"
}

# is_elf FILE
is_elf() {
    [[ -f $1 && ! -L $1 ]] || return 1
    local magic
    magic=$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' \n')
    [[ $magic == '177ELF' ]]
}
