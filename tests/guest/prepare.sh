#!/usr/bin/env bash
# prepare.sh — build, once, what the qemu guest harness boots: Debian's 6.1 kernel (vmlinuz) and a
# base initramfs (raw newc cpio) with busybox, the storage tools (dmsetup, multipath-tools,
# sg3-utils, nbd-client/nbd-server, mkfs.btrfs, open-iscsi, nvme-cli, lvm2, cryptsetup, kpartx,
# sfdisk), the kernel modules they need (SCSI, dm, nbd, rbd, LIO target, iSCSI initiator, NVMe/TCP
# host and target, dm-crypt) and an /init that runs a scenario.
#
# Idempotent and cached: a warm run only checks the cache and prints where the build is.
#   cache:   ${BLOCKJANITOR_GUEST_CACHE:-/var/cache/blockjanitor-guest}
#   result:  $CACHE/current -> builds/<KVER>-<hash>/  holding vmlinuz, base.cpio, guest.env
# Run as root it installs what is missing (qemu-system-x86 from bookworm-backports, cpio, kmod).
# See tests/guest/README.md.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

CACHE=${BLOCKJANITOR_GUEST_CACHE:-/var/cache/blockjanitor-guest}
KERNEL_META=${BLOCKJANITOR_GUEST_KERNEL_META:-linux-image-amd64}
KERNEL_SERIES=${BLOCKJANITOR_GUEST_KERNEL_SERIES:-6.1}   # which linux-image-amd64 dependency to take
# Fixed identities in the image (scenario-lib/transport-lib.sh uses the same ones).
GUEST_INITIATOR_IQN=iqn.2026-11.io.blockjanitor:guest-initiator
GUEST_HOSTNQN=nqn.2014-08.org.nvmexpress:uuid:b10c4a17-0000-4000-8000-000000000012

# User-space packages fetched with `apt-get download` (their libraries that the host already has,
# libc, libudev, libgnutls..., are copied from the host: ldd tells which).
TOOL_PKGS=(
    busybox-static
    dmsetup libdevmapper1.02.1
    multipath-tools liburcu8 libaio1
    sg3-utils libsgutils2-1.46-2
    nbd-client libnl-3-200 libnl-genl-3-200
    nbd-server
    btrfs-progs
    open-iscsi libisns0 libopeniscsiusr
    nvme-cli libnvme1
    lvm2 libdevmapper-event1.02.1
    cryptsetup-bin libcryptsetup12 libpopt0
    kpartx
    fdisk
)

# Packages of which only these files go into the image (default: the whole package minus docs).
# btrfs-progs: mkfs.btrfs alone (0.5 MB; it needs only libuuid, libblkid, libudev and libc, which
# the host has); the other seven tools (3.4 MB, and liblzo2 for `btrfs`) no scenario uses.
declare -A TOOL_FILES=(
    [btrfs-progs]='./sbin/mkfs.btrfs'
    [open-iscsi]='./sbin/iscsid ./sbin/iscsiadm ./sbin/iscsi-iname ./etc/iscsi'
    [nvme-cli]='./usr/sbin/nvme'
    [lvm2]='./sbin'
    [cryptsetup-bin]='./sbin/cryptsetup'
    [kpartx]='./sbin/kpartx'
    [fdisk]='./sbin/sfdisk'
)

# Modules whose dependency closure goes into the image (modprobe --show-depends).
CLOSURE_MODS=(
    scsi_common scsi_mod crc_t10dif crct10dif_generic crct10dif_pclmul crc64_rocksoft
    crc64_rocksoft_generic t10_pi sd_mod sg scsi_debug
    dm_mod dm_multipath dm_round_robin dm_service_time dm_queue_length scsi_dh_alua
    nbd
    crc32c crc32c_generic crc32c_intel libcrc32c libceph rbd
    loop ext4
    btrfs
    virtio_pci virtio_net 9pnet_virtio 9p
    configfs target_core_mod target_core_iblock target_core_file iscsi_target_mod
    scsi_transport_iscsi libiscsi libiscsi_tcp iscsi_tcp
    nvme_core nvme_fabrics nvme_tcp nvmet nvmet_tcp
    dm_crypt xts ecb aesni_intel sha256_ssse3 af_alg algif_skcipher algif_hash
)

# What /init loads, in this order (the order the harness doc measured). scsi_debug is NOT loaded
# by /init: a scenario loads it with the topology it wants (modprobe scsi_debug add_host=2 ...).
# A scenario can replace this list by shipping /extra/guest-modules.conf.
INIT_MODULES='# module [parameters]   (loaded by /init with busybox modprobe, in this order)
scsi_common
scsi_mod scan=sync
crc_t10dif
crc64_rocksoft
t10_pi
sd_mod
sg
dm_mod
dm_multipath
dm_round_robin
dm_service_time
dm_queue_length
scsi_dh_alua
nbd nbds_max=4
crc32c
libcrc32c
libceph
rbd
loop
ext4
virtio_pci
virtio_net
9pnet_virtio
9p
'

T_START=$EPOCHREALTIME
T_STEP=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
log()  { printf '[prepare +%6ss] %s\n' "$(elapsed "$T_START")" "$*" >&2; }
step() { T_STEP=$EPOCHREALTIME; log "$*"; }
done_step() { log "  done in $(elapsed "$T_STEP") s${1:+: $1}"; }
die()  { printf '[prepare] ERROR: %s\n' "$*" >&2; exit 1; }
# quietly CMD...: run CMD with its output in $CACHE/apt.log; show that log if CMD fails.
quietly() {
    if ! "$@" >"$CACHE/apt.log" 2>&1; then
        tail -n 30 "$CACHE/apt.log" >&2; return 1
    fi
}

IS_ROOT=0; [[ $(id -u) == 0 ]] && IS_ROOT=1
APT_UPDATED=0
apt_update_once() {
    (( APT_UPDATED )) && return 0
    (( IS_ROOT )) || return 1
    step "apt-get update"
    quietly apt-get update || die "apt-get update failed"
    APT_UPDATED=1
    done_step
}

# ---------------------------------------------------------------- host tools
codename() { . /etc/os-release && echo "${VERSION_CODENAME:-bookworm}"; }

# qemu-system-x86 comes from <codename>-backports, like the machine's qemu-utils 10.0.2. Adds that
# apt source when no configured source provides it; the caller runs apt-get update afterwards.
ensure_backports_source() {
    local bpo; bpo="$(codename)-backports"
    if grep -rqsE -- "^[^#]*$bpo\b" /etc/apt/sources.list /etc/apt/sources.list.d/; then return 0; fi
    log "adding apt source $bpo (/etc/apt/sources.list.d/blockjanitor-$bpo.sources)"
    cat >"/etc/apt/sources.list.d/blockjanitor-$bpo.sources" <<EOF
Types: deb
URIs: http://deb.debian.org/debian
Suites: $bpo
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
    APT_UPDATED=0
}

ensure_host_tools() {
    local missing=() need_qemu=0 t0=$EPOCHREALTIME
    command -v qemu-system-x86_64 >/dev/null || { missing+=(qemu-system-x86); need_qemu=1; }
    command -v cpio >/dev/null || missing+=(cpio)
    { command -v depmod && command -v modprobe; } >/dev/null 2>&1 \
        || [[ -x /sbin/depmod && -x /sbin/modprobe ]] || missing+=(kmod)
    command -v flock >/dev/null || missing+=(util-linux)
    command -v xz >/dev/null || missing+=(xz-utils)
    (( ${#missing[@]} )) || return 0
    (( IS_ROOT )) || die "missing host packages: ${missing[*]} (run this script as root once, or: apt-get install -t bookworm-backports qemu-system-x86; apt-get install cpio kmod)"
    log "installing host packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if (( need_qemu )); then ensure_backports_source; fi
    apt_update_once
    local plain=() p
    for p in "${missing[@]}"; do [[ $p == qemu-system-x86 ]] || plain+=("$p"); done
    if (( ${#plain[@]} )); then
        step "apt-get install ${plain[*]}"
        quietly apt-get install -y --no-install-recommends "${plain[@]}" || die "apt-get install ${plain[*]} failed"
        done_step
    fi
    if (( need_qemu )); then
        local bpo sim before after
        bpo="$(codename)-backports"
        step "apt-get install -t $bpo --no-install-recommends qemu-system-x86"
        before=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
        # From backports so that it matches (and does not replace) the installed qemu-utils 10.0.2;
        # --no-install-recommends keeps the rest of the system as it is.
        sim=$(apt-get install -s -t "$bpo" --no-install-recommends qemu-system-x86 2>&1) || die "apt-get -s failed: $sim"
        if grep -Eq '^(Remv|Inst) qemu-utils |^Remv ' <<<"$sim"; then
            grep -E '^(Remv|Inst)' <<<"$sim" >&2
            die "installing qemu-system-x86 would change qemu-utils or remove packages; refusing"
        fi
        quietly apt-get install -y -t "$bpo" --no-install-recommends qemu-system-x86 \
            || die "apt-get install -t $bpo qemu-system-x86 failed"
        after=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
        [[ $before == "$after" ]] || log "WARNING: qemu-utils changed: '$before' -> '$after'"
        done_step "$(qemu-system-x86_64 --version | head -1)"
    fi
    T_STEP=$t0; done_step "host packages"
}

# ---------------------------------------------------------------- package resolution
# The versioned kernel package that linux-image-amd64 depends on (6.1 series: bookworm's own
# kernel, not the 6.12 backport).
resolve_kernel_pkg() {
    if [[ -n ${BLOCKJANITOR_GUEST_KERNEL_PKG:-} ]]; then echo "$BLOCKJANITOR_GUEST_KERNEL_PKG"; return; fi
    apt-cache show "$KERNEL_META" 2>/dev/null \
        | sed -n "s/^Depends:.*\\b\\(linux-image-${KERNEL_SERIES//./\\.}\\.[0-9]*-[0-9]*-amd64\\)\\b.*/\\1/p" \
        | sort -Vu | tail -1
}

# apt-cache parses every package list each time here (about 0.7 s: no pkgcache.bin), so the
# answer is remembered until apt's lists change.
resolve_kernel_pkg_cached() {
    local memo=$CACHE/kernel-pkg.$KERNEL_META.$KERNEL_SERIES pkg
    if [[ -z ${BLOCKJANITOR_GUEST_KERNEL_PKG:-} && -s $memo ]] \
        && [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -newer "$memo" -print -quit 2>/dev/null) ]]; then
        cat "$memo"; return
    fi
    pkg=$(resolve_kernel_pkg)
    [[ -z $pkg || -n ${BLOCKJANITOR_GUEST_KERNEL_PKG:-} ]] || echo "$pkg" >"$memo"
    echo "$pkg"
}

deb_for() { compgen -G "$DEBS/${1}_*.deb" | sort -V | tail -1 || true; }

download_debs() {
    local want=() p
    for p in "$@"; do [[ -n $(deb_for "$p") ]] || want+=("$p"); done
    (( ${#want[@]} )) || return 0
    step "apt-get download ${want[*]}"
    local opts=()
    (( IS_ROOT )) && opts+=(-o APT::Sandbox::User=root)
    if ! (cd "$DEBS" && apt-get download -qq "${opts[@]}" "${want[@]}" >&2); then
        apt_update_once || die "apt-get download failed (and cannot apt-get update as non-root)"
        (cd "$DEBS" && apt-get download -qq "${opts[@]}" "${want[@]}" >&2) || die "apt-get download ${want[*]} failed"
    fi
    for p in "${want[@]}"; do [[ -n $(deb_for "$p") ]] || die "download of $p left no .deb in $DEBS"; done
    done_step "${#want[@]} packages"
}

# ---------------------------------------------------------------- main
mkdir -p "$CACHE" 2>/dev/null || die "cannot create $CACHE (set BLOCKJANITOR_GUEST_CACHE to a writable directory)"
[[ -w $CACHE ]] || die "$CACHE is not writable (set BLOCKJANITOR_GUEST_CACHE)"
DEBS=$CACHE/debs
mkdir -p "$DEBS" "$CACHE/builds"

# One prepare at a time (parallel tests may all call run.sh, which calls this).
exec 9>"$CACHE/.lock"
flock 9

ensure_host_tools

KPKG=$(resolve_kernel_pkg_cached)
if [[ -z $KPKG ]]; then
    apt_update_once || true
    KPKG=$(resolve_kernel_pkg_cached)
fi
if [[ -z $KPKG ]]; then
    # Offline and no apt lists: fall back to the last build, if any.
    if [[ -f $CACHE/current/guest.env ]]; then
        log "cannot resolve $KERNEL_META's $KERNEL_SERIES dependency; using the existing build"
        cat "$CACHE/current/guest.env"
        exit 0
    fi
    die "cannot resolve the $KERNEL_SERIES kernel package that $KERNEL_META depends on"
fi
KVER=${KPKG#linux-image-}

download_debs "$KPKG" "${TOOL_PKGS[@]}"

# Cache key: kernel version + the exact .deb files + this script and lib.sh (the /init lives here)
# + scenario-lib/transport-lib.sh (in the image as /usr/lib/blockjanitor/transport-lib.sh).
DEB_LIST=$(for p in "$KPKG" "${TOOL_PKGS[@]}"; do basename "$(deb_for "$p")"; done)
KEY_HASH=$( { printf '%s\n' "$DEB_LIST"; cat "$HERE/prepare.sh" "$HERE/lib.sh" "$HERE/scenario-lib/transport-lib.sh"; } \
    | sha256sum | cut -c1-12)
KEY="$KVER-$KEY_HASH"
OUT=$CACHE/builds/$KEY

if [[ -f $OUT/stamp ]]; then
    ln -sfn "builds/$KEY" "$CACHE/current"
    touch "$OUT/used"
    log "up to date: $OUT (kernel $KVER), checked in $(elapsed "$T_START") s"
    cat "$OUT/guest.env"
    exit 0
fi

log "building $OUT (kernel package $KPKG)"
WORK=$CACHE/work.$$
rm -rf "$WORK"; mkdir -p "$WORK"
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
KROOT=$WORK/kroot

# ---- unpack
step "dpkg -x the kernel and ${#TOOL_PKGS[@]} tool packages"
dpkg -x "$(deb_for "$KPKG")" "$KROOT"
mkdir -p "$WORK/pkg"
for p in "${TOOL_PKGS[@]}"; do dpkg -x "$(deb_for "$p")" "$WORK/pkg/$p"; done
[[ -d $KROOT/lib/modules/$KVER ]] || die "no lib/modules/$KVER in $KPKG"
done_step "$(du -sh "$KROOT" | cut -f1) kernel tree"

# ---- merged-/usr skeleton
mkdir -p "$ROOT"/{usr/bin,usr/sbin,usr/lib/x86_64-linux-gnu,usr/lib64,etc,proc,sys,dev,run,tmp,root,mnt/host,extra,var}
ln -s usr/bin "$ROOT/bin"; ln -s usr/sbin "$ROOT/sbin"; ln -s usr/lib "$ROOT/lib"; ln -s usr/lib64 "$ROOT/lib64"
ln -s ../run "$ROOT/var/run"; mkdir -p "$ROOT/var/tmp" "$ROOT/var/lib"
chmod 1777 "$ROOT/tmp" "$ROOT/var/tmp"

# ---- kernel + modules
step "depmod on the full kernel tree, module closure, depmod on the image"
cp "$KROOT/boot/vmlinuz-$KVER" "$WORK/vmlinuz"
# The same kernel, decompressed: qemu boots this ELF through its PVH entry point (CONFIG_PVH=y)
# and skips the xz decompression that costs ~3 s of wall time under TCG. run.sh uses it when present.
extract_vmlinux() {
    local pos
    command -v xz >/dev/null && command -v readelf >/dev/null || return 1
    pos=$(grep -abo $'\xfd7zXZ\x00' "$WORK/vmlinuz" | head -n 1 | cut -d: -f1)
    [[ -n $pos ]] || return 1
    tail -c "+$((pos + 1))" "$WORK/vmlinuz" | xz -dc --single-stream >"$WORK/vmlinux" 2>/dev/null || true
    # PVH entry = Xen ELF note type 0x12 (XEN_ELFNOTE_PHYS32_ENTRY)
    readelf -n "$WORK/vmlinux" 2>/dev/null | grep -i 'xen' | grep -q '0x00000012'
}
extract_vmlinux || { rm -f "$WORK/vmlinux"; log "  no PVH vmlinux could be extracted; run.sh will boot vmlinuz"; }
depmod -b "$KROOT" "$KVER"
declare -A KO=()
for m in "${CLOSURE_MODS[@]}"; do
    deps=$(modprobe -d "$KROOT" -S "$KVER" --show-depends "$m" 2>&1) || die "modprobe --show-depends $m: $deps"
    while read -r kind path _; do
        [[ $kind == insmod ]] && KO[$path]=1
    done <<<"$deps"
done
MODDIR=$ROOT/usr/lib/modules/$KVER
mkdir -p "$MODDIR"
for path in "${!KO[@]}"; do
    rel=${path#"$KROOT"/lib/modules/"$KVER"/}
    mkdir -p "$MODDIR/$(dirname "$rel")"
    cp "$path" "$MODDIR/$rel"
done
cp "$KROOT/lib/modules/$KVER"/modules.{order,builtin,builtin.modinfo} "$MODDIR/"
depmod -b "$ROOT" "$KVER"
done_step "${#KO[@]} modules, $(du -sh "$MODDIR" | cut -f1)"

# ---- user-space tools
step "user-space tools and their shared libraries"
for p in "${TOOL_PKGS[@]}"; do
    [[ $p == busybox-static ]] && continue
    read -ra files <<<"${TOOL_FILES[$p]:-.}"
    # merged-/usr: --keep-directory-symlink lets lib/ and sbin/ land in usr/lib and usr/sbin.
    tar -C "$WORK/pkg/$p" -cf - \
        --exclude=./usr/share --exclude=./usr/include --exclude='./lib/systemd' --exclude='./lib/udev' \
        --exclude='./etc/init.d' --exclude='*/pkgconfig' --exclude='*.a' --exclude='./lib/modules-load.d' \
        --exclude='./usr/lib/tmpfiles.d' --exclude='./etc/modprobe.d' "${files[@]}" \
        | tar -C "$ROOT" -xf - --keep-directory-symlink
done
# Libraries that are dlopen()ed (ldd cannot see them): libgcc_s for pthread_cancel (multipathd).
copy_path_preserving /lib/x86_64-linux-gnu/libgcc_s.so.1 "$ROOT"
LDP="$ROOT/usr/lib/x86_64-linux-gnu:$ROOT/usr/lib"
nelf=0
while IFS= read -r -d '' f; do
    is_elf "$f" || continue
    nelf=$((nelf + 1))
    libs=$(ldd_paths "$f" "$LDP") || die "unresolved libraries for ${f#"$ROOT"}"
    while IFS= read -r lib; do
        [[ -z $lib || $lib == "$ROOT"/* ]] && continue
        copy_path_preserving "$lib" "$ROOT"
    done <<<"$libs"
done < <(find "$ROOT/usr" -path "$ROOT/usr/lib/modules" -prune -o -type f -print0)
done_step "$nelf ELF files scanned, $(du -sh "$ROOT/usr/lib" | cut -f1) in usr/lib (modules included)"

# ---- busybox
step "busybox applets"
cp "$WORK/pkg/busybox-static/bin/busybox" "$ROOT/usr/bin/busybox"
napplets=0
while IFS= read -r a; do
    a=/${a#/}
    dst=$ROOT$a
    [[ -e $dst || -L $dst ]] && continue   # a real tool (dmsetup, nbd-client...) wins
    mkdir -p "$(dirname "$dst")"
    ln -s /usr/bin/busybox "$dst"
    napplets=$((napplets + 1))
done < <("$ROOT/usr/bin/busybox" --list-full)
# The kernel's own module requests (crypto-crc32c for libceph/rbd, ...) run /sbin/modprobe:
# busybox's, which needs no modules.*.bin and handles the aliases.
ln -sfn /usr/bin/busybox "$ROOT/usr/sbin/modprobe"
done_step "$napplets applet links"

# ---- /etc and /init
step "/etc, /init"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$ROOT/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\ndisk:x:6:\n' >"$ROOT/etc/group"
printf 'guest\n' >"$ROOT/etc/hostname"
printf '127.0.0.1 localhost guest\n::1 localhost\n' >"$ROOT/etc/hosts"
ln -s /proc/self/mounts "$ROOT/etc/mtab"
# Daemons and tools without systemd or udevd (see README "Transports"): their state and lock
# directories, and configs that need no udev.
mkdir -p "$ROOT"/run/{lock/iscsi,lock/lvm,lvm,cryptsetup,multipath,udev/data} "$ROOT"/var/lib/iscsi \
    "$ROOT"/etc/{multipath,nvme,target,lvm/archive,lvm/backup}
# open-iscsi: a fixed initiator name; iscsiadm starts iscsid itself if none runs (not systemctl).
printf 'InitiatorName=%s\n' "$GUEST_INITIATOR_IQN" >"$ROOT/etc/iscsi/initiatorname.iscsi"
sed -i 's|^iscsid.startup = .*|iscsid.startup = /sbin/iscsid|' "$ROOT/etc/iscsi/iscsid.conf"
grep -qx 'iscsid.startup = /sbin/iscsid' "$ROOT/etc/iscsi/iscsid.conf" || die "iscsid.conf: no iscsid.startup line to replace"
# nvme-cli / the kernel's nvme-fabrics: a fixed host NQN and host id (qemu's DMI uuid is not stable).
printf '%s\n' "$GUEST_HOSTNQN" >"$ROOT/etc/nvme/hostnqn"
printf '%s\n' "${GUEST_HOSTNQN##*:uuid:}" >"$ROOT/etc/nvme/hostid"
# lvm2 without udev or dmeventd: lvm makes the /dev/mapper and /dev/VG/LV nodes itself. Component
# detection of multipath paths reads sysfs holders (an sd path under an mpath map is skipped).
cat >"$ROOT/etc/lvm/lvm.conf" <<'EOF'
# blockjanitor guest: no udevd, no dmeventd, no lvmpolld, no devices file.
devices {
    dir = "/dev"
    scan = [ "/dev" ]
    obtain_device_list_from_udev = 0
    external_device_info_source = "none"
    use_devicesfile = 0
    multipath_component_detection = 1
    md_component_detection = 0
    filter = [ "a|^/dev/mapper/|", "a|^/dev/dm-|", "a|^/dev/sd|", "a|^/dev/nvme|", "a|^/dev/loop|", "r|.*|" ]
}
activation {
    udev_sync = 0
    udev_rules = 0
    verify_udev_operations = 0
    monitoring = 0
}
global {
    use_lvmpolld = 0
    event_activation = 0
}
backup {
    backup = 0
    archive = 0
}
EOF
# multipath-tools: multipathd started by a scenario (scenario-lib/transport-lib.sh mpd_start), no
# udevd: it sees a path only if /run/udev/data/bMAJ:MIN says I:1 (mpd_fake_udev writes it, with
# ID_SERIAL so the wwid is the one udev would give). greedy: a map for every SCSI path's wwid.
cat >"$ROOT/etc/multipath.conf" <<'EOF'
defaults {
    find_multipaths greedy
    user_friendly_names no
    enable_foreign "^$"
    verbosity 2
}
blacklist {
    devnode "^(ram|zram|loop|nbd|rbd|dm-|nvme|sr|fd)"
}
EOF
printf '%s' "$INIT_MODULES" >"$ROOT/etc/guest-modules.conf"
# The scene helpers of issue 12's scenarios (iSCSI/NVMe targets and hosts, stacks, multipathd).
install -D -m 644 "$HERE/scenario-lib/transport-lib.sh" "$ROOT/usr/lib/blockjanitor/transport-lib.sh"
printf 'KVER=%s\nKERNEL_PKG=%s\nBUILD=%s\n' "$KVER" "$KPKG" "$KEY" >"$ROOT/etc/guest-release"
(( IS_ROOT )) && mknod -m 600 "$ROOT/dev/console" c 5 1 && mknod -m 666 "$ROOT/dev/null" c 1 3

cat >"$ROOT/init" <<'INIT'
#!/bin/sh
# blockjanitor guest /init (busybox ash). Built by tests/guest/prepare.sh.
# Output contract: the scenario's stdout+stderr go to the second serial port (/dev/ttyS1), followed
# by one line "GUEST-EXIT <code>"; then the guest powers off. Kernel and init messages: ttyS0.
export PATH=/extra/bin:/extra/sbin:/extra/usr/bin:/extra/usr/sbin:/usr/sbin:/usr/bin
export HOME=/root TERM=dumb SYSTEMD_PAGER=cat PAGER=cat
umask 022
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
exec </dev/console >/dev/console 2>&1
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd
[ -e /dev/stdin ] || ln -s /proc/self/fd/0 /dev/stdin
[ -e /dev/stdout ] || ln -s /proc/self/fd/1 /dev/stdout
[ -e /dev/stderr ] || ln -s /proc/self/fd/2 /dev/stderr
hostname guest
ip link set lo up 2>/dev/null

up() { cut -d' ' -f1 /proc/uptime; }
echo "init: up at $(up) s, kernel $(uname -r)"

# Modules, in order (a scenario may replace the list with /extra/guest-modules.conf).
conf=/etc/guest-modules.conf
[ -f /extra/guest-modules.conf ] && conf=/extra/guest-modules.conf
while read -r mod args; do
    case $mod in ''|\#*) continue ;; esac
    # shellcheck disable=SC2086
    modprobe "$mod" $args || echo "init: modprobe $mod $args FAILED"
done <"$conf"
echo "init: modules loaded at $(up) s ($(wc -l </proc/modules) in /proc/modules)"

# Files passed in /extra: make their libraries visible at their usual paths (never replacing a
# library the image already has), so a host binary copied with copy-binary-libs.sh runs as is.
if [ -d /extra ]; then
    find /extra \( -type f -o -type l \) 2>/dev/null | while read -r f; do
        dst=${f#/extra}
        case $dst in
            /lib/*|/lib64/*|/usr/lib/*|/usr/lib64/*|/usr/local/lib/*) ;;
            *) continue ;;
        esac
        if [ -e "$dst" ] || [ -L "$dst" ]; then continue; fi
        mkdir -p "${dst%/*}" && ln -s "$f" "$dst"
    done
fi

# 9p share from the host (run.sh: BLOCKJANITOR_GUEST_SHARE=DIR), mount tag host0. Virtio drivers
# are loaded whenever a virtio PCI device exists, even if a custom module list left them out.
if grep -qs 0x1af4 /sys/bus/pci/devices/*/vendor; then
    for m in virtio_pci virtio_net 9pnet_virtio 9p; do modprobe $m; done
fi
if grep -qs host0 /sys/bus/virtio/drivers/9pnet_virtio/*/mount_tag; then
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 host0 /mnt/host \
        && echo "init: 9p host0 mounted on /mnt/host" || echo "init: 9p mount FAILED"
fi

script=/scenario.sh
for arg in $(cat /proc/cmdline); do
    case $arg in scenario=*) script=${arg#scenario=} ;; esac
done

out=/dev/ttyS1
stty -F $out 115200 raw -echo 2>/dev/null
if [ -f "$script" ]; then
    echo "init: running $script at $(up) s"
    ( cd /root && exec /bin/sh "$script" ) >$out 2>&1 </dev/null
    rc=$?
else
    echo "init: no scenario $script" | tee $out
    rc=127
fi
echo "init: $script exited $rc at $(up) s"
if [ "$rc" != 0 ]; then
    echo "init: last kernel messages:"; dmesg | tail -n 40
fi
# Stop whatever the scenario left running (it could hold ttyS1 open, and then the last close,
# which waits for the UART to drain, would not be ours).
kill -TERM -1 2>/dev/null; sleep 0.1; kill -KILL -1 2>/dev/null
echo "GUEST-EXIT $rc" >$out
echo "GUEST-EXIT $rc"
sync
poweroff -f
INIT
chmod 755 "$ROOT/init"
done_step

# ---- cpio
step "base.cpio (raw newc)"
(cd "$ROOT" && find . -mindepth 1 -print0 | LC_ALL=C sort -z \
    | cpio --null --quiet -o -H newc -R 0:0 --reproducible) >"$WORK/base.cpio"
done_step "$(du -h "$WORK/base.cpio" | cut -f1)"

# ---- publish
rm -rf "$OUT"; mkdir -p "$OUT"
mv "$WORK/vmlinuz" "$WORK/base.cpio" "$OUT/"
VMLINUX=
[[ -f $WORK/vmlinux ]] && mv "$WORK/vmlinux" "$OUT/" && VMLINUX=$OUT/vmlinux
(cd "$ROOT/usr/lib/modules/$KVER" && find . -name '*.ko' | sed 's|.*/||; s|\.ko$||' | sort) >"$OUT/modules.txt"
cat >"$OUT/guest.env" <<EOF
GUEST_KVER=$KVER
GUEST_KERNEL_PKG=$KPKG
GUEST_VMLINUZ=$OUT/vmlinuz
GUEST_VMLINUX=$VMLINUX
GUEST_BASE_CPIO=$OUT/base.cpio
EOF
printf '%s\n' "$DEB_LIST" >"$OUT/debs.txt"
date -u +%FT%TZ >"$OUT/stamp"
ln -sfn "builds/$KEY" "$CACHE/current"
touch "$OUT/used"
# Drop old builds and the .debs no kept build lists. Checkouts whose prepare.sh differs (branches)
# share this cache, each with its own build: keep the most recently used ones (every warm check
# touches `used`), so that two branches' test runs do not rebuild each other's image every time.
KEEP_BUILDS=${BLOCKJANITOR_GUEST_KEEP_BUILDS:-3}
kept=("$OUT")
while IFS= read -r d; do
    [[ $d == "$OUT" ]] && continue
    if (( ${#kept[@]} < KEEP_BUILDS )) && [[ -f $d/stamp ]]; then kept+=("$d"); else rm -rf "$d"; fi
done < <(ls -dt "$CACHE"/builds/*/used 2>/dev/null | xargs -r -n1 dirname; \
         for d in "$CACHE"/builds/*; do [[ -e $d/used ]] || echo "$d"; done)
for f in "$DEBS"/*.deb; do
    b=$(basename "$f")
    for d in "${kept[@]}"; do grep -qxF "$b" "$d/debs.txt" 2>/dev/null && continue 2; done
    rm -f "$f"
done
log "built $OUT in $(elapsed "$T_START") s"
cat "$OUT/guest.env"
