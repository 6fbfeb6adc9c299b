#!/usr/bin/env bash
# busy-node-scene.sh up|down|status|churn
#
# Builds (and tears down) the real-kernel "busy node" scene used to benchmark
# `blockjanitor-agent holders`:
#
#   * a 64 MiB file-backed loop device with ext4 on it;
#   * SCENE_PROCS (200) long-lived processes, each in its OWN mount namespace,
#     each namespace holding ~SCENE_MOUNTS (1,000) mounts, each process
#     having SCENE_THREADS (20) tasks  => ~4,000 tasks, ~15 MB of mountinfo
#     when reading one mountinfo per namespace;
#   * the ext4 filesystem mounted in exactly ONE of those namespaces and not
#     in the host namespace (incident 5: mount, start the holder, unmount on
#     the host), so the device is held only by a foreign namespace.
#
# How the namespaces are built cheaply:
#   1. ext4 is mounted on the host at $STATE/ext4;
#   2. process #0 is started with `unshare -m --propagation private` from the
#      host; its namespace (the "template") is a private copy of the host's,
#      so it includes the ext4 mount;
#   3. inside the template, a tmpfs is mounted at $STATE/t and ~1,000 tiny
#      tmpfs mounts are stacked under it (nothing propagates to the host:
#      everything in the template is private);
#   4. the holder process (#SCENE_HOLDER_INDEX) is started with
#      `unshare -m --propagation private` from INSIDE the template, so its
#      namespace copies the ~1,000 mounts and the ext4 mount;
#   5. ext4 is unmounted in the template and on the host;
#   6. the remaining processes are started from inside the template too;
#      they copy the ~1,000 mounts but no ext4.
#   Process #0 keeps the template alive and is itself one of the 200.
#
# Every scene process runs $STATE/bjb-sleeper (built from scene-sleeper.c
# next to this script), which is how `down` and `status` recognise them:
# /proc/PID/exe pointing at that binary.  All state lives under $STATE.
# `down` only touches: processes running $STATE/bjb-sleeper, mounts under
# $STATE in the host namespace, and loop devices backed by $STATE/disk.img.
#
# SCENE_SHAPE=node (issue 20) makes the scene look like a node running pods:
#   * a second ext4 loop device, the "image disk" ($STATE/image.img), is
#     mounted on the host at $STATE/image before the template starts, so
#     every namespace has it (as every container has its node's image disk);
#     it holds the sleeper binary, its own copy of the dynamic linker and
#     libc (the binary is linked to load them from there), a rootfs and one
#     volume directory per pod;
#   * every scene process is a "pod": in its own namespace it mounts a tmpfs
#     for its state, an overlay root (lower: the image's rootfs, upper/work
#     on that tmpfs), a bind mount of its volume, proc, sysfs, a /dev tmpfs
#     with a /dev/shm tmpfs and a bind-mounted /etc/hostname file (the
#     shapes container runtimes make), then runs the sleeper from the image
#     disk with its working directory on its volume and a log file there
#     open: its mappings, cwd and an fd are on a real block device;
#   * `churn` starts a pod every CHURN_PERIOD seconds (2) and kills the
#     oldest once CHURN_LIVE (5) are alive, until it is killed: pods appearing
#     and vanishing while a bench runs.  Churn pods run bjb-churn (a copy of
#     the sleeper), so `status` and the benches tell them from the scene's.
#
# Environment knobs (defaults are the benchmark's reference scene):
#   SCENE_SHAPE         busy | node               (busy)
#   BJB_BENCH_STATE     state dir                 (/run/blockjanitor-bench)
#   SCENE_PROCS         processes / namespaces    (200)
#   SCENE_THREADS       tasks per process         (20)
#   SCENE_MOUNTS        mounts per namespace      (1000, including the
#                                                  host's inherited mounts)
#   SCENE_HOLDER_INDEX  which process holds ext4  (137; 1..SCENE_PROCS-1)
#   SCENE_READY_TIMEOUT seconds to wait for processes (120)
#
# Exit status of `status`: 0 if the scene is fully up, 1 otherwise.
set -euo pipefail

STATE=${BJB_BENCH_STATE:-/run/blockjanitor-bench}
PROCS=${SCENE_PROCS:-200}
THREADS=${SCENE_THREADS:-20}
MOUNTS=${SCENE_MOUNTS:-1000}
HOLDER_INDEX=${SCENE_HOLDER_INDEX:-137}
READY_TIMEOUT=${SCENE_READY_TIMEOUT:-120}
DISK_SIZE=64M
IMAGE_SIZE=128M
CHURN_PERIOD=${CHURN_PERIOD:-2}
CHURN_LIVE=${CHURN_LIVE:-5}
# The shape of a scene that is up wins over the environment (down/status/churn).
SHAPE=${SCENE_SHAPE:-busy}
if [ -s "$STATE/shape" ]; then SHAPE=$(<"$STATE/shape"); fi
case "$SHAPE" in busy | node) ;; *)
    echo "SCENE_SHAPE must be busy or node, not $SHAPE" >&2
    exit 2
    ;;
esac

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SLEEPER_SRC=$SCRIPT_DIR/scene-sleeper.c
SLEEPER=$STATE/bjb-sleeper   # the scene's process image (identifies scene processes)
IMAGE_BACKING=$STATE/image.img # node shape: the image disk's backing file
IMAGE_MNT=$STATE/image         # node shape: where the image disk is mounted (everywhere)
PODS=$STATE/pods               # node shape: each pod's mount points
CHURN_BIN=$IMAGE_MNT/bin/bjb-churn
CHURN_READY=$STATE/churn-ready
if [ "$SHAPE" = node ]; then SLEEPER=$IMAGE_MNT/bin/bjb-sleeper; fi
BACKING=$STATE/disk.img      # loop device backing file
EXT4_MNT=$STATE/ext4         # where ext4 is (briefly) mounted on the host
TMPL_MNT=$STATE/t            # root of the ~1,000 template mounts
READY=$STATE/ready           # INDEX.pid per scene process (its PID), written once it is ready

START_US=${EPOCHREALTIME/./}

# log MSG...: progress line prefixed with the elapsed time since the script
# started, on stderr so `status` output stays clean on stdout.
log() {
    local now=${EPOCHREALTIME/./}
    local ms=$(((now - START_US) / 1000))
    printf '[%4d.%01ds] %s\n' $((ms / 1000)) $((ms % 1000 / 100)) "$*" >&2
}

die() {
    log "ERROR: $*"
    exit 1
}

# scene_pids: PIDs of every live process whose executable is the scene's
# sleeper (also matches after the binary was deleted).  Zombies have no exe
# link, so killed-but-unreaped processes are not listed.
scene_pids() {
    find /proc -mindepth 2 -maxdepth 2 -path '/proc/[0-9]*/exe' \
        -lname "$SLEEPER*" -printf '%h\n' 2>/dev/null |
        sed 's|^/proc/||' | sort -n || true
}

# churn_pids: PIDs of the churn's pods (node shape).
churn_pids() {
    find /proc -mindepth 2 -maxdepth 2 -path '/proc/[0-9]*/exe' \
        -lname "$CHURN_BIN*" -printf '%h\n' 2>/dev/null |
        sed 's|^/proc/||' | sort -n || true
}

# ns_of_pids PID...: "PID mnt:[INODE]" for each PID still alive.
ns_of_pids() {
    local p args=()
    for p in "$@"; do args+=("/proc/$p/ns/mnt"); done
    [ ${#args[@]} -gt 0 ] || return 0
    find "${args[@]}" -maxdepth 0 -printf '%h %l\n' 2>/dev/null |
        sed 's|^/proc/\([0-9]*\)/ns |\1 |' || true
}

# majmin DEV: "MAJ:MIN" of a block device, in decimal.
majmin() {
    local maj min
    read -r maj min < <(stat -L -c '%t %T' "$1")   # hex
    printf '%d:%d' "0x$maj" "0x$min"
}

# our_loop_devs: loop devices whose backing file is $BACKING or, in the
# node shape, $IMAGE_BACKING.
our_loop_devs() {
    loop_devs_of "$BACKING" "$STATE/dev"
    loop_devs_of "$IMAGE_BACKING" "$STATE/image_dev"
}

# loop_devs_of BACKING DEVFILE: loop devices whose backing file is BACKING.
# Uses both `losetup -j` (needs the backing file) and the device recorded in
# DEVFILE (verified to be backed by BACKING, possibly "(deleted)").
loop_devs_of() {
    local BACKING=$1 devfile=$2
    {
        if [ -e "$BACKING" ]; then
            losetup -n -O NAME -j "$BACKING" 2>/dev/null || true
        fi
        if [ -s "$devfile" ]; then
            local d back
            d=$(<"$devfile")
            back=$(losetup -n -O BACK-FILE "$d" 2>/dev/null || true)
            back=${back%% (deleted)}
            # losetup pads the column; trim trailing blanks
            back=${back%"${back##*[![:space:]]}"}
            if [ "$back" = "$BACKING" ]; then echo "$d"; fi
        fi
    } | sort -u
}

# host_mounts_under_state: mount points in THIS (host) namespace at or under
# $STATE, deepest first.
host_mounts_under_state() {
    awk -v p="$STATE" '$5 == p || index($5, p "/") == 1 { print $5 }' \
        /proc/self/mountinfo | sort -r
}

# wait_ready N LABEL: wait until N ready files exist, printing progress.
wait_ready() {
    local want=$1 label=$2 have=0 last=-1 last_print=-1 deadline=$((SECONDS + READY_TIMEOUT))
    local files=()
    while :; do
        files=("$READY"/*.pid)
        have=${#files[@]}
        [ -e "${files[0]}" ] || have=0
        # at most one line per second, plus the final count
        if [ "$have" -ne "$last" ] && { [ "$SECONDS" -ne "$last_print" ] || [ "$have" -ge "$want" ]; }; then
            log "  $label: $have/$want processes ready"
            last=$have last_print=$SECONDS
        fi
        [ "$have" -lt "$want" ] || return 0
        [ "$SECONDS" -lt "$deadline" ] || die "timed out waiting for $label ($have/$want ready)"
        sleep 0.1
    done
}

# start_cmd INDEX: print a shell command line that starts scene process
# INDEX in the background: the sleeper exec-ed in a fresh private mount
# namespace, in its own session, detached from our stdio and without fd 9
# (the lock below; an inherited copy would keep it held forever).  It is
# run either on the host or from inside the template namespace (nsenter).
start_cmd() {
    if [ "$SHAPE" = node ]; then
        pod_cmd "$1" "$SLEEPER" "$READY/$1.pid"
        return
    fi
    printf '%q ' setsid unshare -m --propagation private -- "$SLEEPER" "$THREADS" "$READY/$1.pid"
    printf '</dev/null >/dev/null 2>&1 9<&- &\n'
}

# The node shape's pod: what a container runtime mounts in a container's
# namespace, then the sleeper run from the image disk, its cwd and a log file
# on the pod's volume.  Arguments: NAME BINARY THREADS READYFILE STATE.
# shellcheck disable=SC2016 # expanded by the pod's own sh
POD_SCRIPT='set -e
name=$1 bin=$2 threads=$3 ready=$4 state=$5
p=$state/pods/$name
mkdir -p "$p" "$state/image/volumes/$name"
mount -t tmpfs -o size=8m,mode=755 pod "$p"
mkdir "$p/upper" "$p/work" "$p/merged"
mount -t overlay overlay -o "lowerdir=$state/image/rootfs,upperdir=$p/upper,workdir=$p/work" "$p/merged"
mount --bind "$state/image/volumes/$name" "$p/merged/data"
mount -t proc proc "$p/merged/proc"
mount -t sysfs sysfs "$p/merged/sys"
mount -t tmpfs -o size=64k,mode=755 dev "$p/merged/dev"
mkdir "$p/merged/dev/shm"
mount -t tmpfs -o size=1m shm "$p/merged/dev/shm"
mount --bind "$state/image/rootfs/etc/hostname" "$p/merged/etc/hostname"
cd "$p/merged/data"
exec "$bin" "$threads" "$ready" "$p/merged/data/app.log"'

# pod_cmd NAME BINARY READYFILE: a command line starting one pod in the
# background, in a fresh private mount namespace, in its own session.
pod_cmd() {
    printf '%q ' setsid unshare -m --propagation private -- sh "$STATE/pod.sh" \
        "$1" "$2" "$THREADS" "$3" "$STATE"
    printf '</dev/null >/dev/null 2>&1 9<&- &\n'
}

# image_disk_up: the node shape's image disk, mounted on the host (so every
# namespace made from here on has it): the sleeper linked to load its dynamic
# linker and libc from the disk, a rootfs with the pods' mount points, and
# the pods' volumes.
image_disk_up() {
    printf '%s\n' "$POD_SCRIPT" >"$STATE/pod.sh"
    log "creating the $IMAGE_SIZE image disk"
    truncate -s "$IMAGE_SIZE" "$IMAGE_BACKING"
    local dev
    dev=$(losetup --find --show "$IMAGE_BACKING")
    echo "$dev" >"$STATE/image_dev"
    mkfs.ext4 -q -F -L bjb-image "$dev"
    mkdir -p "$IMAGE_MNT"
    mount -t ext4 "$dev" "$IMAGE_MNT"
    mkdir -p "$IMAGE_MNT/bin" "$IMAGE_MNT/lib" "$IMAGE_MNT/volumes" \
        "$IMAGE_MNT"/rootfs/{proc,sys,dev,data,etc,tmp}
    echo pod >"$IMAGE_MNT/rootfs/etc/hostname"
    local interp lib
    interp=$IMAGE_MNT/lib/$(basename "$(readelf -l /bin/true | sed -n 's/.*interpreter: \(.*\)]/\1/p')")
    gcc -O2 -Wall -Wextra -pthread -Wl,--dynamic-linker="$interp" -Wl,-rpath="$IMAGE_MNT/lib" \
        -o "$SLEEPER" "$SLEEPER_SRC"
    # The libraries it loads, and the linker, copied onto the image disk.
    for lib in $(ldd "$SLEEPER" | awk '$3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
        [ -e "$IMAGE_MNT/lib/$(basename "$lib")" ] || cp -L "$lib" "$IMAGE_MNT/lib/"
    done
    cp -L "$(readelf -l /bin/true | sed -n 's/.*interpreter: \(.*\)]/\1/p')" "$interp"
    cp "$SLEEPER" "$CHURN_BIN"
    log "  image disk $dev ($(majmin "$dev")) at $IMAGE_MNT: $(ldd "$SLEEPER" | grep -c "$IMAGE_MNT") libraries from it"
}

scene_exists() {
    [ -e "$STATE" ] || [ -n "$(scene_pids)" ]
}

# EXIT trap while `up` runs: a failed or interrupted `up` removes its
# partial scene (unless BJB_KEEP_PARTIAL=1).
on_up_exit() {
    local rc=$?
    [ "$rc" -ne 0 ] || return 0
    log "up failed (exit $rc)"
    if [ "${BJB_KEEP_PARTIAL:-0}" = 1 ]; then
        log "keeping the partial scene (BJB_KEEP_PARTIAL=1); run: $0 down"
    else
        log "cleaning up the partial scene"
        down || true
    fi
}

# ---------------------------------------------------------------------------
up() {
    [ "$(id -u)" -eq 0 ] || die "must run as root"
    [ "$PROCS" -ge 2 ] || die "SCENE_PROCS must be >= 2"
    if [ "$HOLDER_INDEX" -lt 1 ] || [ "$HOLDER_INDEX" -ge "$PROCS" ]; then
        die "SCENE_HOLDER_INDEX must be in 1..$((PROCS - 1))"
    fi
    local tool
    for tool in gcc losetup mkfs.ext4 unshare nsenter setsid findmnt readelf ldd; do
        command -v "$tool" >/dev/null || die "missing tool: $tool"
    done

    if scene_exists; then
        log "an earlier (possibly partial) scene exists; tearing it down first"
        down
    fi

    # From here on, any failure or interruption tears the partial scene
    # down again (set BJB_KEEP_PARTIAL=1 to keep it for debugging).
    # (bash runs no EXIT trap when killed by an untrapped signal, so turn
    # INT/TERM/HUP into ordinary exits; a running foreground step such as the
    # template build finishes first.)
    trap on_up_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    trap 'exit 129' HUP

    log "building scene in $STATE: $PROCS processes x $THREADS tasks, ~$MOUNTS mounts/namespace"
    mkdir -p "$STATE" "$READY" "$EXT4_MNT" "$TMPL_MNT"
    echo "$PROCS $THREADS $MOUNTS $HOLDER_INDEX" >"$STATE/params"

    echo "$SHAPE" >"$STATE/shape"
    if [ "$SHAPE" = node ]; then
        image_disk_up
    else
        log "compiling $SLEEPER"
        gcc -O2 -Wall -Wextra -pthread -o "$SLEEPER" "$SLEEPER_SRC"
    fi

    # -- loop device with ext4, mounted on the host (for now) --------------
    log "creating $DISK_SIZE backing file and loop device"
    truncate -s "$DISK_SIZE" "$BACKING"
    local dev
    dev=$(losetup --find --show "$BACKING")
    echo "$dev" >"$STATE/dev"
    log "  device $dev ($(majmin "$dev")); mkfs.ext4"
    mkfs.ext4 -q -F -L bjb-bench "$dev"
    mount -t ext4 "$dev" "$EXT4_MNT"
    echo "blockjanitor busy-node bench scene; held by scene process #$HOLDER_INDEX" >"$EXT4_MNT/README"

    # -- process #0: the template namespace ----------------------------------
    log "starting process #0 (template namespace)"
    eval "$(start_cmd 0)"
    wait_ready 1 "template"
    local tpid
    tpid=$(<"$READY/0.pid")
    echo "$tpid" >"$STATE/template_pid"

    # -- ~1,000 mounts inside the template -------------------------------------
    # Count what the template inherited (minus ext4, which goes away later) and
    # top up to $MOUNTS with one tmpfs root + N tiny tmpfs children.
    log "building template mounts inside mnt ns of PID $tpid"
    # shellcheck disable=SC2016 # the script below is expanded by the inner bash
    nsenter -t "$tpid" -m -- bash -c '
        set -euo pipefail
        base=$1 want=$2 started=$3
        have=$(($(wc -l </proc/self/mountinfo) - 1))   # minus ext4
        n=$((want - have - 1))                          # minus the tmpfs root
        [ "$n" -ge 0 ] || n=0
        mount -t tmpfs -o size=1m,mode=755 bjb "$base"
        for ((i = 1; i <= n; i++)); do
            printf -v d "%s/%03d" "$base" "$i"
            mkdir "$d"
            mount -t tmpfs -o size=4k bjb "$d"
            if ((i % 250 == 0 || i == n)); then
                now=${EPOCHREALTIME/./}
                echo "  template: $i/$n tmpfs mounts ($(((now - started) / 1000)) ms since start)" >&2
            fi
        done
    ' _ "$TMPL_MNT" "$MOUNTS" "$START_US"
    log "  template namespace has $(wc -l </proc/"$tpid"/mountinfo) mounts (incl. ext4, removed below)"

    # -- the holder: copies template mounts + ext4 -----------------------------
    log "starting holder process #$HOLDER_INDEX from inside the template"
    nsenter -t "$tpid" -m -- bash -c "$(start_cmd "$HOLDER_INDEX")"
    wait_ready 2 "holder"
    local hpid
    hpid=$(<"$READY/$HOLDER_INDEX.pid")
    echo "$hpid" >"$STATE/holder_pid"

    # -- incident 5: unmount everywhere except in the holder's namespace --------
    log "unmounting ext4 in the template namespace and on the host"
    nsenter -t "$tpid" -m -- umount "$EXT4_MNT"
    umount "$EXT4_MNT"

    # -- everybody else ----------------------------------------------------------
    log "starting the other $((PROCS - 2)) processes from inside the template"
    local i cmds=""
    for ((i = 1; i < PROCS; i++)); do
        [ "$i" -eq "$HOLDER_INDEX" ] && continue
        cmds+="$(start_cmd "$i")"$'\n'
    done
    nsenter -t "$tpid" -m -- bash -c "$cmds"
    wait_ready "$PROCS" "scene"

    # Record the scene's namespaces so `down` can check nothing keeps them.
    # shellcheck disable=SC2046 # one PID per word
    ns_of_pids $(cat "$READY"/*.pid) | awk '{ print $2 }' | sort -u >"$STATE/namespaces"

    # -- sanity checks -------------------------------------------------------------
    local mm
    mm=$(majmin "$dev")
    if grep -q " $mm " /proc/self/mountinfo; then die "ext4 still mounted on the host"; fi
    grep -q " $mm " "/proc/$hpid/mountinfo" || die "ext4 not mounted in holder PID $hpid"
    if grep -q " $mm " "/proc/$tpid/mountinfo"; then die "ext4 still mounted in the template"; fi

    trap - EXIT INT TERM HUP
    log "scene is up (took $(((${EPOCHREALTIME/./} - START_US) / 1000)) ms)"
    status
}

# ---------------------------------------------------------------------------
down() {
    log "tearing down scene in $STATE"

    # 0. Remember the scene's namespaces (recorded by a complete `up`, plus
    #    those of whatever scene process is alive now, for a partial `up`).
    local scene_ns="" pids=()
    mapfile -t pids < <(scene_pids)
    if [ ${#pids[@]} -gt 0 ] || [ -s "$STATE/namespaces" ]; then
        scene_ns=$({ cat "$STATE/namespaces" 2>/dev/null || true
            ns_of_pids "${pids[@]}" | awk '{ print $2 }'; } | sort -u)
    fi

    # 1. Kill every scene process.  Repeat in case something was still being
    #    started by an interrupted `up`.
    local round n killed=()
    for round in 1 2 3 4 5; do
        mapfile -t pids < <(scene_pids; churn_pids)
        n=${#pids[@]}
        [ "$n" -gt 0 ] || break
        log "  round $round: killing $n scene processes"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        killed+=("${pids[@]}")
        local deadline=$((SECONDS + 15))
        while [ -n "$(scene_pids)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    done
    [ -z "$(scene_pids)" ] || die "scene processes survived SIGKILL: $(scene_pids | tr '\n' ' ')"
    [ -z "$(churn_pids)" ] || die "churn pods survived SIGKILL: $(churn_pids | tr '\n' ' ')"

    # The killed processes were reparented to init, which reaps them; on
    # some systems (e.g. a minimal PID 1) only every few seconds.  Wait a
    # little so `down` leaves no zombies behind, but do not fail over it.
    if [ ${#killed[@]} -gt 0 ]; then
        local p comm zombies deadline=$((SECONDS + 20))
        while :; do
            zombies=0
            for p in "${killed[@]}"; do
                # still the same killed process (exiting or zombie)?
                comm=""
                { read -r _ comm _ <"/proc/$p/stat"; } 2>/dev/null || true
                if [ "$comm" = "(bjb-sleeper)" ] || [ "$comm" = "(bjb-churn)" ]; then zombies=$((zombies + 1)); fi
            done
            [ "$zombies" -gt 0 ] || break
            if [ "$SECONDS" -ge "$deadline" ]; then
                log "  note: $zombies killed scene processes are still zombies, waiting for init to reap them"
                break
            fi
            sleep 0.2
        done
    fi

    # 2. Report (never kill) foreign processes still inside scene namespaces,
    #    e.g. a shell somebody nsenter-ed; they keep the namespace alive.
    if [ -n "$scene_ns" ]; then
        local left
        left=$({ find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/ns/mnt' -printf '%l %h\n' 2>/dev/null || true; } |
            grep -F -f <(echo "$scene_ns") | sed 's|^.* /proc/\([0-9]*\)/ns$|\1|' | tr '\n' ' ' || true)
        [ -z "$left" ] || log "  WARNING: non-scene processes still in scene namespaces (not killed), PIDs: $left"
    fi

    # 3. Unmount whatever the scene mounted in the host namespace (only
    #    $STATE/ext4 during a partial `up`).
    local m
    while read -r m; do
        [ -n "$m" ] || continue
        log "  unmounting $m"
        umount "$m" || { log "  umount $m failed; lazy unmount"; umount -l "$m"; }
    done < <(host_mounts_under_state)

    # 4. Detach our loop device(s).  If the device is still briefly busy
    #    (namespace teardown), `losetup -d` sets autoclear; wait for it.
    local devs d
    mapfile -t devs < <(our_loop_devs)
    for d in "${devs[@]}"; do
        [ -n "$d" ] || continue
        log "  detaching $d"
        losetup -d "$d" 2>/dev/null || true
    done
    local deadline=$((SECONDS + 30))
    while [ -n "$(our_loop_devs)" ]; do
        [ "$SECONDS" -lt "$deadline" ] ||
            die "loop device(s) still attached: $(our_loop_devs | tr '\n' ' ') (state kept in $STATE)"
        sleep 0.1
    done

    # 5. Remove the state dir (backing file, sleeper binary, ready files).
    #    Refuse if anything is still mounted under it in this namespace.
    if [ -e "$STATE" ]; then
        [ -z "$(host_mounts_under_state)" ] || die "mounts remain under $STATE; not deleting it"
        rm -rf --one-file-system "$STATE"
    fi
    log "scene is down"
}

# ---------------------------------------------------------------------------
status() {
    # The scene's actual parameters, if it was built with non-default ones.
    if [ -s "$STATE/params" ]; then read -r PROCS THREADS MOUNTS HOLDER_INDEX <"$STATE/params"; fi
    local pids
    mapfile -t pids < <(scene_pids)
    local nproc=${#pids[@]} tasks=0 p t

    # tasks of scene processes
    for p in "${pids[@]}"; do
        for t in /proc/"$p"/task/[0-9]*; do [ -e "$t" ] && tasks=$((tasks + 1)); done
    done

    # one mountinfo per distinct scene namespace
    local -A seen=()
    local files=() pid ns
    while read -r pid ns; do
        [ -n "${seen[$ns]:-}" ] && continue
        seen[$ns]=1
        files+=("/proc/$pid/mountinfo")
    done < <(ns_of_pids "${pids[@]}")
    local nns=${#files[@]} bytes=0 lines=0 minl=0 maxl=0
    if [ "$nns" -gt 0 ]; then
        read -r lines bytes < <(cat "${files[@]}" 2>/dev/null | wc -lc)
        read -r minl maxl < <(wc -l "${files[@]}" 2>/dev/null | grep -v ' total$' |
            awk 'NR == 1 { mn = mx = $1 } { if ($1 < mn) mn = $1; if ($1 > mx) mx = $1 } END { print mn + 0, mx + 0 }')
    fi

    # system-wide view (what `grep /proc/*/task/*/mountinfo` walks)
    local sys_tasks sys_ns
    # (find exits non-zero when tasks vanish mid-walk or a link is not
    # readable, e.g. a ptrace-protected PID 1; both are fine here)
    sys_tasks=$({ find /proc -mindepth 3 -maxdepth 3 -path '/proc/[0-9]*/task/[0-9]*' 2>/dev/null || true; } | wc -l)
    sys_ns=$({ find /proc -mindepth 5 -maxdepth 5 -path '/proc/[0-9]*/task/[0-9]*/ns/mnt' -printf '%l\n' 2>/dev/null || true; } | sort -u | grep -c . || true)

    local dev="(none)" mm="" where="" ok=1
    if [ -s "$STATE/dev" ]; then
        dev=$(<"$STATE/dev")
        if [ -b "$dev" ] && [ -n "$(our_loop_devs)" ]; then
            mm=$(majmin "$dev")
            # scene namespaces holding the device, and the host
            local holders=0
            [ "$nns" -gt 0 ] && holders=$(grep -l " $mm " "${files[@]}" 2>/dev/null | wc -l)
            where="mounted in $holders scene namespace(s)"
            if grep -q " $mm " /proc/self/mountinfo; then where+=", ALSO in the host namespace"; ok=0; fi
            [ "$holders" -eq 1 ] || ok=0
        else
            dev+=" (not attached to $BACKING)"
            ok=0
        fi
    else
        ok=0
    fi
    [ "$nproc" -eq "$PROCS" ] && [ "$nns" -eq "$PROCS" ] || ok=0

    echo "scene state dir:              $STATE"
    echo "scene shape:                  $SHAPE"
    echo "scene processes:              $nproc"
    echo "scene tasks:                  $tasks"
    echo "scene mount namespaces:       $nns"
    echo "mounts per scene namespace:   min $minl, max $maxl"
    echo "mountinfo, once per scene ns: $bytes bytes, $lines lines"
    echo "system tasks (/proc/*/task):  $sys_tasks"
    echo "system mount namespaces:      $sys_ns"
    echo "device:                       $dev${mm:+ ($mm)}${where:+, $where}"
    if [ -s "$STATE/holder_pid" ]; then
        echo "holder PID:                   $(<"$STATE/holder_pid")"
    fi
    if [ "$ok" -eq 1 ]; then
        echo "scene:                        UP"
    else
        echo "scene:                        DOWN or incomplete"
        return 1
    fi
}

# ---------------------------------------------------------------------------
# churn: pods appearing and vanishing (node shape), until killed.  Each pod is
# started from inside the template namespace, like the scene's; the oldest is
# killed once CHURN_LIVE are alive; every churn pod is killed on exit.
churn() {
    [ "$SHAPE" = node ] || die "churn needs a node-shaped scene (SCENE_SHAPE=node up)"
    local tpid k=0 live=()
    tpid=$(<"$STATE/template_pid")
    mkdir -p "$CHURN_READY"
    trap 'kill -KILL "${live[@]}" 2>/dev/null; exit 0' INT TERM HUP EXIT
    while :; do
        rm -f "$CHURN_READY/c$k.pid"
        nsenter -t "$tpid" -m -- bash -c "$(pod_cmd "c$k" "$CHURN_BIN" "$CHURN_READY/c$k.pid")"
        local deadline=$((SECONDS + 10))
        while [ ! -s "$CHURN_READY/c$k.pid" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.05; done
        [ -s "$CHURN_READY/c$k.pid" ] && live+=("$(<"$CHURN_READY/c$k.pid")")
        if [ "${#live[@]}" -gt "$CHURN_LIVE" ]; then
            kill -KILL "${live[0]}" 2>/dev/null || true
            live=("${live[@]:1}")
        fi
        k=$((k + 1))
        sleep "$CHURN_PERIOD"
    done
}

# ---------------------------------------------------------------------------
# churn runs beside the other commands (a bench's status checks), unlocked.
if [ "${1:-}" = churn ]; then
    churn
    exit 0
fi

# Serialise up/down/status: hold a lock on this script file itself (no state
# outside $STATE, nothing to clean up).
exec 9<"${BASH_SOURCE[0]}"
flock 9

case "${1:-}" in
up) up ;;
down) down ;;
status) status ;;
*)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
