#!/usr/bin/env bash
# run.sh SCENARIO_SCRIPT [EXTRA_FILES_DIR]
#
# Boot the real-kernel qemu guest (Debian 6.1, TCG) with SCENARIO_SCRIPT as /scenario.sh and, if
# given, the files of EXTRA_FILES_DIR under /extra/; exit with the scenario's exit code.
#
# stdout: the scenario's output (its stdout+stderr, from the guest's second serial port), ending
#         with the line "GUEST-EXIT <code>", whatever the exit code. stderr: harness messages; on
#         failure qemu's stderr and the tail of the guest console.
# Exit:   the guest's code; 124 if the host timeout hit; 125 if the guest printed no GUEST-EXIT
#         (kernel panic, init died); 126 on a harness error (bad arguments, prepare failed).
#
# Environment:
#   BLOCKJANITOR_GUEST_TIMEOUT=120     host-side timeout for qemu, seconds
#   BLOCKJANITOR_GUEST_SHARE=DIR       share DIR over 9p (tag host0), mounted on /mnt/host
#   BLOCKJANITOR_GUEST_APPEND='...'    extra kernel command line (scenario=/path picks another script)
#   BLOCKJANITOR_GUEST_QEMU_ARGS='...' extra qemu arguments (word-split)
#   BLOCKJANITOR_GUEST_NET=user        add user-mode networking (virtio-net). Only inside a network
#                                      namespace made for the test: see tests/guest/README.md
#   BLOCKJANITOR_GUEST_HOSTFWD='...'   with NET=user: qemu hostfwd rules, space-separated, e.g.
#                                      tcp:127.0.0.1:19443-:9443 (a listener of qemu's, i.e. in the
#                                      namespace qemu runs in, forwarded to the guest's port 9443)
#   BLOCKJANITOR_GUEST_OUTDIR=DIR      keep console.log, out.log and initrd there (else a temp dir,
#                                      removed on success and kept on failure)
#   BLOCKJANITOR_GUEST_TAIL=60         console lines shown on failure
#   BLOCKJANITOR_GUEST_KERNEL_IMAGE=vmlinux  vmlinux (default when prepare.sh made one: the
#                                      decompressed kernel, booted through PVH, ~3 s faster) or vmlinuz
#   BLOCKJANITOR_GUEST_BOOTS=3         boots tried when qemu itself dies (a signal) or the boot stalls
#                                      before the guest starts the scenario; a crash after that is
#                                      never retried
#   BLOCKJANITOR_GUEST_BOOT_DEADLINE=90  seconds a boot (not the last) may take to reach init
#   BLOCKJANITOR_GUEST_NO_PREPARE=1    do not call prepare.sh (use $CACHE/current as it is)
#   BLOCKJANITOR_GUEST_CACHE           as for prepare.sh
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${BLOCKJANITOR_GUEST_CACHE:-/var/cache/blockjanitor-guest}
TIMEOUT=${BLOCKJANITOR_GUEST_TIMEOUT:-120}
TAIL=${BLOCKJANITOR_GUEST_TAIL:-60}

say() { printf '[run] %s\n' "$*" >&2; }
fail() { say "ERROR: $*"; exit 126; }
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

(( $# >= 1 && $# <= 2 )) || { sed -n '2,4p' "$0" >&2; exit 126; }
SCENARIO=$1
EXTRA=${2:-}
[[ -f $SCENARIO ]] || fail "no such scenario script: $SCENARIO"
[[ -z $EXTRA || -d $EXTRA ]] || fail "EXTRA_FILES_DIR is not a directory: $EXTRA"
SHARE=${BLOCKJANITOR_GUEST_SHARE:-}
[[ -z $SHARE || -d $SHARE ]] || fail "BLOCKJANITOR_GUEST_SHARE is not a directory: $SHARE"

T0=$EPOCHREALTIME
# The build to boot: the one this checkout's prepare.sh names (it prints its guest.env). Checkouts
# whose prepare.sh differ share the cache, so `current` is only whichever was prepared last.
if [[ -z ${BLOCKJANITOR_GUEST_NO_PREPARE:-} ]]; then
    GUEST_ENV=$("$HERE/prepare.sh") || fail "prepare.sh failed"
else
    [[ -f $CACHE/current/guest.env ]] || fail "no guest build in $CACHE (run tests/guest/prepare.sh)"
    GUEST_ENV=$(<"$CACHE/current/guest.env")
fi
# shellcheck disable=SC1090
. <(printf '%s\n' "$GUEST_ENV")
[[ -n ${GUEST_BASE_CPIO:-} ]] || fail "prepare.sh printed no GUEST_BASE_CPIO"

if [[ -n ${BLOCKJANITOR_GUEST_OUTDIR:-} ]]; then
    WORK=$BLOCKJANITOR_GUEST_OUTDIR; mkdir -p "$WORK" || fail "cannot create $WORK"
    rm -f "$WORK"/{console.log,out.log,initrd.cpio,extra.cpio,kernel}
    KEEP=1
else
    WORK=$(mktemp -d "${TMPDIR:-/tmp}/blockjanitor-guest.XXXXXX") || fail "mktemp failed"
    KEEP=0
fi

QPID=
cleanup() {
    [[ -n $QPID ]] && kill "$QPID" 2>/dev/null
    [[ $KEEP == 1 ]] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case ${BLOCKJANITOR_GUEST_KERNEL_IMAGE:-vmlinux} in
    vmlinux) KERNEL=${GUEST_VMLINUX:-}; [[ -n $KERNEL && -f $KERNEL ]] || KERNEL=$GUEST_VMLINUZ ;;
    vmlinuz) KERNEL=$GUEST_VMLINUZ ;;
    *) fail "BLOCKJANITOR_GUEST_KERNEL_IMAGE must be vmlinux or vmlinuz" ;;
esac

# ---- extra cpio: /scenario.sh and /extra/...
STAGE=$WORK/stage
mkdir -p "$STAGE"
cp "$SCENARIO" "$STAGE/scenario.sh" && chmod 755 "$STAGE/scenario.sh"
if [[ -n $EXTRA ]]; then
    mkdir -p "$STAGE/extra"
    cp -a "$EXTRA"/. "$STAGE/extra/" || fail "copying $EXTRA failed"
fi
(cd "$STAGE" && find . -mindepth 1 -print0 | LC_ALL=C sort -z \
    | cpio --null --quiet -o -H newc -R 0:0) >"$WORK/extra.cpio" || fail "cpio of the extra files failed"
rm -rf "$STAGE"
# Another checkout's prepare.sh may prune builds: take what this run needs out of the build under
# the cache lock (shared; a prepare holds it exclusively): the initrd as a copy, the kernel as a
# hard link (a copy across filesystems), so a later prune cannot pull them from under qemu.
if [[ -e $CACHE/.lock ]]; then exec 8<"$CACHE/.lock" && flock -s 8; fi
[[ -f $GUEST_BASE_CPIO && -f $KERNEL ]] || fail "$(dirname "$GUEST_BASE_CPIO") is gone (pruned by another prepare.sh?): run again"
cat "$GUEST_BASE_CPIO" "$WORK/extra.cpio" >"$WORK/initrd.cpio" || fail "writing the initrd failed"
ln -f "$KERNEL" "$WORK/kernel" 2>/dev/null || cp "$KERNEL" "$WORK/kernel" || fail "copying the kernel failed"
exec 8<&-
KERNEL_NAME=$(basename "$KERNEL")
KERNEL=$WORK/kernel

# ---- qemu (flags from shared/real-kernel-harness.md)
# no_timer_check: on a loaded host, emulated time runs unevenly while the kernel verifies that
# the 8254 timer reaches the IO-APIC, and it panics ("IO-APIC + timer doesn't work", measured
# with five builds running on 2 cores); the check proves nothing about an emulated board.
# shellcheck disable=SC2054  # commas belong to qemu option values
QEMU=(qemu-system-x86_64 -accel tcg,thread=multi -cpu max -M pc -smp 2 -m 1024
      -nodefaults -no-user-config -display none -no-reboot
      -kernel "$KERNEL" -initrd "$WORK/initrd.cpio"
      -append "console=ttyS0 panic=-1 quiet no_timer_check ${BLOCKJANITOR_GUEST_APPEND:-}"
      -serial "file:$WORK/console.log" -serial "file:$WORK/out.log")
[[ -n $SHARE ]] && QEMU+=(-virtfs "local,path=$(cd "$SHARE" && pwd),mount_tag=host0,security_model=none")
# shellcheck disable=SC2054
if [[ ${BLOCKJANITOR_GUEST_NET:-} == user ]]; then
    NETDEV=user,id=n0
    for rule in ${BLOCKJANITOR_GUEST_HOSTFWD:-}; do NETDEV+=",hostfwd=$rule"; done
    QEMU+=(-netdev "$NETDEV" -device virtio-net-pci,netdev=n0)
elif [[ -n ${BLOCKJANITOR_GUEST_HOSTFWD:-} ]]; then
    fail "BLOCKJANITOR_GUEST_HOSTFWD needs BLOCKJANITOR_GUEST_NET=user"
fi
# shellcheck disable=SC2206
[[ -n ${BLOCKJANITOR_GUEST_QEMU_ARGS:-} ]] && QEMU+=(${BLOCKJANITOR_GUEST_QEMU_ARGS})

# qemu's TCG can itself abort early in boot (measured in CI with 10.0.2: "iotlb_to_section:
# Assertion `section_index < d->map.sections_nb' failed", SIGABRT 1.6 s in). That is the emulator
# failing, not the guest: when qemu died of a signal before the guest's init started the scenario,
# nothing of the scenario ran, so booting again is safe. A crash once the scenario runs is a failure.
# The same holds for a boot that stalls: on a host loaded by other tests, a TCG guest's kernel was
# seen (CI, 2 cores) stuck in RCU stalls ("rcu_preempt kthread timer wakeup didn't happen") for
# the whole timeout without reaching init. A guest whose init has not said `init: running` within
# BLOCKJANITOR_GUEST_BOOT_DEADLINE seconds is stopped and booted again; nothing of it ran.
BOOTS=${BLOCKJANITOR_GUEST_BOOTS:-3}
BOOT_DEADLINE=${BLOCKJANITOR_GUEST_BOOT_DEADLINE:-90}
for ((boot = 1; ; boot++)); do
    say "booting $(basename "$SCENARIO") (kernel $GUEST_KVER $KERNEL_NAME, initrd $(du -h "$WORK/initrd.cpio" | cut -f1), timeout ${TIMEOUT}s)"
    : >"$WORK/console.log"; : >"$WORK/out.log"
    T1=$EPOCHREALTIME
    timeout -k 5 "$TIMEOUT" "${QEMU[@]}" </dev/null >"$WORK/qemu.log" 2>&1 &
    QPID=$!
    stalled=0
    started() { grep -aq '^init: running' "$WORK/console.log"; }
    while kill -0 "$QPID" 2>/dev/null; do
        if ((stalled == 0 && boot < BOOTS)) && ! started \
            && awk -v a="$T1" -v b="$EPOCHREALTIME" -v d="$BOOT_DEADLINE" 'BEGIN { exit !(b - a > d) }'; then
            stalled=1
            kill -TERM "$QPID" 2>/dev/null
        fi
        started && break
        sleep 0.5
    done
    wait "$QPID"
    QRC=$?
    QPID=
    if ((stalled)) && ! started; then
        say "the guest's kernel did not reach init within ${BOOT_DEADLINE}s of boot (a stalled boot on a loaded host); the scenario never started: booting again ($((boot + 1)) of $BOOTS). The console's last lines:"
        tr -d '\r' <"$WORK/console.log" | tail -n 8 | sed 's/^/[run]   /' >&2
        continue
    fi
    qemu_crashed=0
    ((QRC > 128 && QRC != 137)) && qemu_crashed=1
    if ((qemu_crashed && boot < BOOTS)) && ! started; then
        say "qemu itself died (exit $QRC, signal $((QRC - 128))) $(elapsed "$T1") s into boot, before the scenario started: booting again ($((boot + 1)) of $BOOTS). qemu said:"
        sed 's/^/[run]   /' "$WORK/qemu.log" >&2
        continue
    fi
    break
done

# ---- result
LINE=$(tr -d '\r' <"$WORK/out.log" 2>/dev/null | grep -a '^GUEST-EXIT [0-9]*$' | tail -n 1)
if [[ $QRC == 124 || $QRC == 137 ]]; then
    RC=124; WHY="host timeout after ${TIMEOUT}s"
elif [[ -z $LINE ]]; then
    RC=125; WHY="no GUEST-EXIT line (qemu exit $QRC)"
else
    RC=${LINE#GUEST-EXIT }
    WHY="guest exit $RC"
    [[ $QRC == 0 ]] || { WHY="$WHY, qemu exit $QRC"; [[ $RC == 0 ]] && RC=125; }
fi

# The scenario's output goes to stdout whatever its exit code: a caller (tests/src/guest.rs) reads
# its sections from there, also when the scenario failed.
tr -d '\r' <"$WORK/out.log" 2>/dev/null
if [[ $RC == 0 ]]; then
    say "ok: $(basename "$SCENARIO") in $(elapsed "$T1") s (boot+scenario), $(elapsed "$T0") s in all"
else
    KEEP=1
    {
        say "FAILED: $(basename "$SCENARIO"): $WHY, after $(elapsed "$T1") s; logs kept in $WORK"
        if [[ -s $WORK/qemu.log ]]; then echo "----- qemu stderr"; cat "$WORK/qemu.log"; fi
        echo "----- guest console (last $TAIL lines of $WORK/console.log)"
        tr -d '\r' <"$WORK/console.log" 2>/dev/null | tail -n "$TAIL"
        echo "----- end of guest console (the guest's output is on stdout and in $WORK/out.log)"
    } >&2
fi
exit "$RC"
