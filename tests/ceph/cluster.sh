#!/usr/bin/env bash
# cluster.sh up DIR | down DIR | env DIR | status DIR | check-isolated DIR
#
# A throw-away Ceph cluster (Debian's ceph 16.2, one monitor + one memstore OSD, cephx, no mgr)
# that lives in DIR and in a network namespace of its own. See tests/ceph/README.md.
#
#   up DIR      install ceph if missing (root, apt), create the netns bj-ceph-<pid> with a 10.x /32
#               on its lo, write DIR/ceph.conf + DIR/keyring, start ceph-mon and ceph-osd inside the
#               netns (foreground mode, in the background, pids in DIR/pids/), wait for HEALTH_OK,
#               create pool k8s (rbd pool init). Prints the steps with timings on stderr.
#   down DIR    stop the daemons and anything else running in the netns, delete the netns and the
#               state in DIR. Idempotent; works after a partial or failed `up`.
#   env DIR     print `export NAME=value` lines for eval: BJ_CEPH_NETNS, BJ_CEPH_ADDR,
#               BJ_CEPH_MON_ADDR (ip:6789, msgr v1), BJ_CEPH_SECRET (client.admin, base64),
#               BJ_CEPH_FSID, BJ_CEPH_POOL, BJ_CEPH_DIR, CEPH_CONF.
#   status DIR  `ceph -s` inside the netns.
#   check-isolated DIR   fail unless the netns still has only lo and no route (guest-rbd.sh runs
#               it before starting qemu with user networking in there).
#
# NETWORK RULE: the daemons bind only to the namespace's 10.x address and every client runs inside
# the namespace (`ip netns exec`). Nothing here contacts that address from the root namespace.
#
# Environment:
#   BJ_CEPH_ADDR=10.254.0.1       the monitor/OSD address (on the namespace's lo; /32)
#   BJ_CEPH_POOL=k8s              pool created by `up`
#   BJ_CEPH_HEALTH_TIMEOUT=60     seconds `up` waits for HEALTH_OK
#   BJ_CEPH_KEEP_ON_FAILURE=1     do not tear down after a failed `up` (for debugging)
#   BJ_CEPH_STOP_GRACE=1          seconds `down` waits after SIGTERM before SIGKILL (a clean stop
#                                 takes the mon ~2 s; the state is thrown away anyway)
set -uo pipefail

ADDR_DEFAULT=10.254.0.1
POOL=${BJ_CEPH_POOL:-k8s}
HEALTH_TIMEOUT=${BJ_CEPH_HEALTH_TIMEOUT:-60}
MARKER=.bj-ceph-cluster

T_START=$EPOCHREALTIME
T_STEP=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }
log()  { printf '[ceph +%6ss] %s\n' "$(elapsed "$T_START")" "$*" >&2; }
step() { T_STEP=$EPOCHREALTIME; log "$*"; }
done_step() { log "  done in $(elapsed "$T_STEP") s${1:+: $1}"; }
die()  { printf '[ceph] ERROR: %s\n' "$*" >&2; exit 1; }

usage() { sed -n '2,18p' "$0" >&2; exit 2; }
(( $# == 2 )) || usage
CMD=$1
DIR=$(realpath -m -- "$2")
[[ $DIR != / ]] || die "refusing DIR=/"

CONF=$DIR/ceph.conf
KEYRING=$DIR/keyring

# nsx CMD...: run CMD inside the cluster's namespace with the private config.
nsx() { ip netns exec "$NS" env CEPH_CONF="$CONF" "$@"; }
# ceph_cli ARGS...: the ceph CLI inside the namespace, never waiting forever for a monitor.
ceph_cli() { nsx timeout -k 2 30 ceph --connect-timeout 10 "$@"; }

load_state() {
    NS=$(cat "$DIR/netns" 2>/dev/null) || NS=
    ADDR=$(cat "$DIR/addr" 2>/dev/null) || ADDR=
}

# ------------------------------------------------------------------------------------- install
ensure_ceph() {
    local missing=0 t
    for t in ceph-mon ceph-osd ceph rbd rados monmaptool ceph-authtool; do
        command -v "$t" >/dev/null || missing=1
    done
    (( missing )) || return 0
    [[ $(id -u) == 0 ]] || die "ceph is not installed and we are not root (apt-get install ceph-mon ceph-osd ceph-common)"
    step "installing ceph-mon ceph-osd ceph-common (apt-get, --no-install-recommends)"
    local aptlog; aptlog=$(mktemp)
    local -a inst=(apt-get install -y -q --no-install-recommends ceph-mon ceph-osd ceph-common)
    if ! DEBIAN_FRONTEND=noninteractive "${inst[@]}" >"$aptlog" 2>&1; then
        log "  install failed, running apt-get update once and retrying"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$aptlog" 2>&1 \
            || { tail -n 30 "$aptlog" >&2; rm -f "$aptlog"; die "apt-get update failed"; }
        DEBIAN_FRONTEND=noninteractive "${inst[@]}" >>"$aptlog" 2>&1 \
            || { tail -n 30 "$aptlog" >&2; rm -f "$aptlog"; die "apt-get install failed"; }
    fi
    rm -f "$aptlog"
    done_step "$(ceph --version 2>/dev/null | cut -d' ' -f1-3)"
}

# ------------------------------------------------------------------------------------- down
# pid_alive PID: the process exists and is not a zombie (the daemons outlive `up`, so their parent
# is init, which may take its time to reap them).
pid_alive() {
    local st
    [[ -n $1 ]] && st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    st=${st##*) }
    [[ ${st%% *} != Z ]]
}

# stop_pids SIGNAL_WAIT_SECONDS PID...: TERM, wait, then KILL what is left.
stop_pids() {
    local wait=$1; shift
    local p left i
    (( $# )) || return 0
    kill -TERM "$@" 2>/dev/null
    for ((i = 0; i < wait * 10; i++)); do
        left=0
        for p in "$@"; do pid_alive "$p" && left=1; done
        (( left )) || return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null
    for ((i = 0; i < 30; i++)); do
        left=0
        for p in "$@"; do pid_alive "$p" && left=1; done
        (( left )) || return 0
        sleep 0.1
    done
    log "  WARNING: still alive after SIGKILL: $*"
}

cmd_down() {
    local t0=$EPOCHREALTIME pids=() p f
    load_state
    # 1. our daemons (pid files written by `up`; checked against DIR so a reused pid is left alone)
    for f in "$DIR"/pids/*.pid; do
        [[ -f $f ]] || continue
        p=$(cat "$f")
        if pid_alive "$p" && tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -qF -- "$CONF"; then
            pids+=("$p")
        fi
    done
    # 2. anything else still running in our namespace (a client, a qemu): all started by us
    if [[ -n $NS ]] && ip netns list 2>/dev/null | grep -qw -- "^$NS"; then
        for p in $(ip netns pids "$NS" 2>/dev/null); do pids+=("$p"); done
    fi
    if (( ${#pids[@]} )); then
        # shellcheck disable=SC2046
        set -- $(printf '%s\n' "${pids[@]}" | sort -un)
        log "stopping $# process(es) in $NS: $*"
        stop_pids "${BJ_CEPH_STOP_GRACE:-1}" "$@"
    fi
    if [[ -n $NS ]] && ip netns list 2>/dev/null | grep -qw -- "^$NS"; then
        ip netns del "$NS" || log "  WARNING: ip netns del $NS failed"
    fi
    # 3. the state we wrote (only our own entries: DIR may have been made by the caller)
    if [[ -d $DIR ]]; then
        rm -rf "${DIR:?}"/{ceph.conf,keyring,monmap,netns,addr,fsid,osd-uuid,pids,run,log,mon.a,osd.0,timings,$MARKER}
        rmdir "$DIR" 2>/dev/null
    fi
    log "down in $(elapsed "$t0") s${NS:+ (netns $NS deleted)}"
}

# ------------------------------------------------------------------------------------- up
# assert_isolated: the namespace has lo and nothing else, and no route outside its local table, so
# nothing started in it (daemons, clients, qemu's slirp) can send a packet off the machine.
assert_isolated() {
    local links routes
    links=$(ip -n "$NS" -o link show | awk -F': ' '{ print $2 }' | tr '\n' ' ')
    routes=$(ip -n "$NS" route show table all | grep -v '^local \|^broadcast \|^multicast \|^fe80::/64 \|^anycast ')
    [[ $links == "lo " && -z $routes ]] || die "netns $NS is not isolated: links '$links', routes '$routes'"
}

write_conf() {
    cat >"$CONF" <<EOF
# Private config of a throw-away test cluster (tests/ceph/cluster.sh). Not /etc/ceph.
[global]
fsid = $FSID
mon initial members = a
mon host = [v1:$ADDR:6789]
public network = $ADDR/32
public addr = $ADDR
ms bind ipv4 = true
ms bind ipv6 = false
ms bind msgr2 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $KEYRING
run dir = $DIR/run
admin socket = $DIR/run/\$name.asok
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
paxos propose interval = 0.05
mon mgr mkfs grace = 315360000
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on msgr2 not enabled = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
mon data avail warn = 1
mon data avail crit = 0
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 1073741824

[mon]
mon data = $DIR/\$name

[osd]
osd data = $DIR/\$name
keyring = $KEYRING

[client]
admin socket = $DIR/run/\$name.\$pid.asok
log file = $DIR/log/client.log
EOF
}

# start_daemon NAME CMD...: CMD (foreground mode) in the background inside the netns, in its own
# session, output in DIR/log/NAME.out, pid in DIR/pids/NAME.pid.
start_daemon() {
    local name=$1; shift
    setsid ip netns exec "$NS" "$@" </dev/null >"$DIR/log/$name.out" 2>&1 &
    local pid=$!
    echo "$pid" >"$DIR/pids/$name.pid"
    sleep 0.05
    pid_alive "$pid" || { cat "$DIR/log/$name.out" >&2; return 1; }
}

show_logs() {
    local f
    for f in "$DIR"/log/*.out "$DIR"/log/mon.a.log "$DIR"/log/osd.0.log; do
        [[ -s $f ]] || continue
        echo "----- $f (last 15 lines)"; tail -n 15 "$f"
    done >&2
}

UP_OK=0
up_cleanup() {
    (( UP_OK )) && return
    log "up FAILED"
    show_logs
    if [[ -n ${BJ_CEPH_KEEP_ON_FAILURE:-} ]]; then
        log "state kept in $DIR (BJ_CEPH_KEEP_ON_FAILURE); run: $0 down $DIR"
    else
        cmd_down
    fi
}

cmd_up() {
    load_state
    if [[ -n $NS ]] && ip netns list 2>/dev/null | grep -qw -- "^$NS"; then
        local p; p=$(cat "$DIR/pids/mon.a.pid" 2>/dev/null)
        if pid_alive "$p"; then die "a cluster is already up in $DIR (netns $NS); run: $0 down $DIR"; fi
    fi
    if [[ -e $DIR/$MARKER || -e $DIR/netns ]]; then
        log "leftovers of an earlier cluster in $DIR: cleaning them first"
        cmd_down
    fi
    ensure_ceph
    command -v ip >/dev/null || die "ip (iproute2) is missing"
    [[ $(id -u) == 0 ]] || die "root is needed (ip netns)"

    trap up_cleanup EXIT
    trap 'exit 130' INT TERM

    { mkdir -p "$DIR" && touch "$DIR/$MARKER"; } || die "cannot create $DIR"
    mkdir -p "$DIR/pids" "$DIR/run" "$DIR/log"
    NS=bj-ceph-$$
    ADDR=${BJ_CEPH_ADDR:-$ADDR_DEFAULT}
    [[ $ADDR =~ ^10\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "BJ_CEPH_ADDR must be a 10.x.y.z address"
    [[ $ADDR != 10.0.2.* ]] || die "BJ_CEPH_ADDR must not be in 10.0.2.0/24 (qemu user networking)"
    # Record the names before creating anything, so `down` can undo a partial `up`.
    echo "$NS" >"$DIR/netns"
    echo "$ADDR" >"$DIR/addr"

    step "netns $NS, $ADDR/32 on its lo (no other interface, no route out)"
    ip netns add "$NS" || die "ip netns add $NS failed"
    ip -n "$NS" link set lo up || die "lo up failed"
    ip -n "$NS" addr add "$ADDR/32" dev lo || die "addr add failed"
    assert_isolated
    done_step "$(ip -n "$NS" -brief addr | tr -s ' ' | tr '\n' ';')"

    step "config, keys, monmap, mon mkfs"
    FSID=$(cat /proc/sys/kernel/random/uuid)
    echo "$FSID" >"$DIR/fsid"
    write_conf
    nsx ceph-authtool --create-keyring "$KEYRING" --gen-key -n mon. --cap mon 'allow *' >/dev/null || die "ceph-authtool mon."
    nsx ceph-authtool "$KEYRING" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null || die "ceph-authtool client.admin"
    nsx ceph-authtool "$KEYRING" --gen-key -n osd.0 \
        --cap mon 'allow profile osd' --cap osd 'allow *' --cap mgr 'allow profile osd' >/dev/null || die "ceph-authtool osd.0"
    chmod 600 "$KEYRING"
    nsx monmaptool --create --addv a "[v1:$ADDR:6789]" --fsid "$FSID" "$DIR/monmap" >/dev/null || die "monmaptool"
    mkdir -p "$DIR/mon.a"
    nsx ceph-mon --mkfs -i a --monmap "$DIR/monmap" --keyring "$KEYRING" -c "$CONF" \
        >"$DIR/log/mon-mkfs.out" 2>&1 || { cat "$DIR/log/mon-mkfs.out" >&2; die "ceph-mon --mkfs"; }
    done_step "fsid $FSID"

    step "ceph-mon (msgr v1 on $ADDR:6789)"
    start_daemon mon.a ceph-mon -f -i a -c "$CONF" || die "ceph-mon did not start"
    local i ok=0
    for ((i = 0; i < 100; i++)); do
        ceph_cli mon stat >/dev/null 2>&1 && { ok=1; break; }
        pid_alive "$(cat "$DIR/pids/mon.a.pid")" || break
        sleep 0.1
    done
    (( ok )) || die "the monitor does not answer"
    done_step "$(ceph_cli mon stat 2>/dev/null)"

    step "ceph-osd 0 (memstore)"
    local uuid id
    uuid=$(cat /proc/sys/kernel/random/uuid)
    echo "$uuid" >"$DIR/osd-uuid"
    id=$(ceph_cli osd new "$uuid" 2>&1) || die "ceph osd new: $id"
    [[ $id == 0 ]] || die "ceph osd new gave id '$id', expected 0"
    mkdir -p "$DIR/osd.0"
    nsx ceph-osd -i 0 --mkfs --osd-uuid "$uuid" -c "$CONF" >"$DIR/log/osd-mkfs.out" 2>&1 \
        || { cat "$DIR/log/osd-mkfs.out" >&2; die "ceph-osd --mkfs"; }
    start_daemon osd.0 ceph-osd -f -i 0 -c "$CONF" || die "ceph-osd did not start"
    done_step

    step "waiting for HEALTH_OK and 1 OSD up (at most ${HEALTH_TIMEOUT}s)"
    local deadline health osdstat
    deadline=$(awk -v n="$EPOCHREALTIME" -v t="$HEALTH_TIMEOUT" 'BEGIN { printf "%d", n + t }')
    while :; do
        osdstat=$(ceph_cli osd stat 2>&1)
        health=$(ceph_cli health 2>&1)
        [[ $health == HEALTH_OK* && $osdstat == *"1 up"* ]] && break
        for i in mon.a osd.0; do
            pid_alive "$(cat "$DIR/pids/$i.pid")" || die "$i died"
        done
        (( ${EPOCHREALTIME%.*} < deadline )) || die "no HEALTH_OK after ${HEALTH_TIMEOUT}s: $health / $osdstat"
        sleep 0.2
    done
    done_step "$health; $osdstat"

    step "pool $POOL (osd pool create, rbd pool init)"
    ceph_cli osd pool create "$POOL" 8 8 >/dev/null 2>&1 || die "ceph osd pool create $POOL"
    nsx timeout -k 2 60 rbd pool init "$POOL" || die "rbd pool init $POOL"
    health=$(ceph_cli health 2>&1)
    [[ $health == HEALTH_OK* ]] || die "after creating the pool: $health"
    done_step "$health"

    UP_OK=1
    trap - EXIT INT TERM
    log "up in $(elapsed "$T_START") s: netns $NS, mon $ADDR:6789 (v1), pool $POOL, conf $CONF"
    log "  daemons: mon.a pid $(cat "$DIR/pids/mon.a.pid"), osd.0 pid $(cat "$DIR/pids/osd.0.pid")"
}

# ------------------------------------------------------------------------------------- env
cmd_env() {
    load_state
    [[ -n $NS && -f $CONF && -f $KEYRING ]] || die "no cluster in $DIR"
    local secret
    secret=$(ceph-authtool -p -n client.admin "$KEYRING") || die "no client.admin key in $KEYRING"
    printf 'export %s=%q\n' \
        BJ_CEPH_DIR "$DIR" \
        BJ_CEPH_NETNS "$NS" \
        BJ_CEPH_ADDR "$ADDR" \
        BJ_CEPH_MON_ADDR "$ADDR:6789" \
        BJ_CEPH_SECRET "$secret" \
        BJ_CEPH_FSID "$(cat "$DIR/fsid")" \
        BJ_CEPH_POOL "$POOL" \
        CEPH_CONF "$CONF"
}

case $CMD in
    up) cmd_up ;;
    down) cmd_down ;;
    env) cmd_env ;;
    status) load_state; [[ -n $NS ]] || die "no cluster in $DIR"; ceph_cli -s ;;
    check-isolated) load_state; [[ -n $NS ]] || die "no cluster in $DIR"; assert_isolated; echo "netns $NS: only lo, no routes" ;;
    *) usage ;;
esac
