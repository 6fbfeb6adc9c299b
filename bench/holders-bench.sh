#!/usr/bin/env bash
# holders-bench.sh: time "who holds this block device?" on the busy-node scene.
#
# Requires the scene to be up (bench/busy-node-scene.sh up).  Times, in ONE
# hyperfine run:
#   grep   the baseline: grep -l ' MAJ:MIN ' /proc/*/task/*/mountinfo, i.e.
#          every task's mountinfo (~4,000 files), as a shell one-liner would;
#   floor  reading mountinfo exactly once per distinct mount namespace
#          (one precomputed /proc/PID/task/TID/mountinfo per ns/mnt inode),
#          the least I/O any correct mountinfo-based answer needs;
#   agent  $AGENT holders $DEV --output json (skipped, with a note, if the
#          agent binary does not exist yet).
# then prints a markdown summary for BENCHMARKS.md: medians, ratios, the
# agent's peak RSS (/usr/bin/time -v, one run), the machine and the exact
# commands.  Raw hyperfine JSON and the summary go to $RESULTS_DIR.
#
# Environment:
#   AGENT          agent binary   (/work/main/target/release/blockjanitor-agent)
#   AGENT_BASE     optional: a baseline agent binary (e.g. the previous release) timed in the
#                  same hyperfine run as agent-base, with the ratio agent / agent-base
#   BENCH_WARMUP   hyperfine --warmup  (2)
#   BENCH_RUNS     hyperfine --runs    (10)
#   RESULTS_DIR    output directory    (<this dir>/results)
#   BJB_BENCH_STATE scene state dir    (/run/blockjanitor-bench)
#   BENCH_AGENT_ALLOW_FAIL=1  benchmark the agent even if it exits non-zero
#                             (its command is then wrapped in `|| true`)
#   BENCH_MEMO     the statmount memo file the agent keeps between runs ($WORK/statmount-memo),
#                  for an agent that has --statmount-memo: the `agent` row runs with it warm
#                  (hyperfine's warm-up runs fill it), as a node's repeated `holders` would
#   BENCH_COLD=1   also time, in the same hyperfine run, `agent-cold` (the memo file removed
#                  before each run: hyperfine --prepare) and `agent-nomemo` (--statmount-memo '':
#                  none kept, what the agent did before the memo)
#   BENCH_DAEMON_MEMO=1  also time `agent-daemon`: the first one-shot on a node where the daemon
#                  runs. Before timing, `$AGENT serve` (report mode, its own socket and journal
#                  under $WORK) runs until it has written its memo file after its first full scan,
#                  and is stopped; before each run (hyperfine --prepare, untimed) that file is
#                  copied to where the run reads it, so every run starts from the daemon's file
#                  and nothing of its own
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STATE=${BJB_BENCH_STATE:-/run/blockjanitor-bench}
AGENT=${AGENT:-/work/main/target/release/blockjanitor-agent}
WARMUP=${BENCH_WARMUP:-2}
RUNS=${BENCH_RUNS:-10}
RESULTS_DIR=${RESULTS_DIR:-$SCRIPT_DIR/results}
WORK=$STATE/bench   # scratch files (floor path list); removed by `down`
MEMO=${BENCH_MEMO:-$WORK/statmount-memo}
COLD=${BENCH_COLD:-0}
DAEMON_MEMO=${BENCH_DAEMON_MEMO:-0}

log() { printf '== %s\n' "$*" >&2; }
die() {
    printf 'holders-bench: ERROR: %s\n' "$*" >&2
    exit 1
}

# need TOOL PACKAGE: install the Debian package if TOOL is missing.
need() {
    command -v "$1" >/dev/null 2>&1 && return 0
    log "installing Debian package $2 (for $1)"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    command -v "$1" >/dev/null 2>&1 || die "could not install $2"
}

# majmin DEV: decimal "MAJ:MIN" of a block device.
majmin() {
    local maj min
    read -r maj min < <(stat -L -c '%t %T' "$1")
    printf '%d:%d' "0x$maj" "0x$min"
}

# ms SECONDS: format a duration given in seconds as milliseconds.
ms() { awk -v s="$1" 'BEGIN { printf "%.1f ms", s * 1000 }'; }
# ratio A B: A / B with two decimals.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

# ---------------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "must run as root (reads every task's mountinfo)"
need hyperfine hyperfine
need /usr/bin/time time
need jq jq

# The scene must be up: `status` exits 0 only for a complete scene.
"$SCRIPT_DIR/busy-node-scene.sh" status >/dev/null ||
    die "the busy-node scene is not up; run: $SCRIPT_DIR/busy-node-scene.sh up"
DEV=$(<"$STATE/dev")
HOLDER_PID=$(<"$STATE/holder_pid")
MM=$(majmin "$DEV")
mkdir -p "$WORK" "$RESULTS_DIR"

# ---------------------------------------------------------------------------
# The floor's input: one readable /proc/PID/task/TID/mountinfo per distinct
# mount namespace (by ns/mnt inode), over every task on the system.  Tasks
# whose ns/mnt link cannot be read (e.g. a ptrace-protected PID 1) are
# skipped.  Computed once, before timing.
log "precomputing one mountinfo path per mount namespace"
FLOOR_LIST=$WORK/floor-paths
declare -A seen=()
: >"$FLOOR_LIST"
while read -r ns dir; do
    [ -n "${seen[$ns]:-}" ] && continue
    f=${dir%/ns}/mountinfo
    if head -c1 "$f" >/dev/null 2>&1; then
        seen[$ns]=1
        echo "$f" >>"$FLOOR_LIST"
    fi
done < <({ find /proc -mindepth 5 -maxdepth 5 -path '/proc/[0-9]*/task/[0-9]*/ns/mnt' \
    -printf '%l %h\n' 2>/dev/null || true; } | awk 'NF == 2')
NS_COUNT=$(wc -l <"$FLOOR_LIST")
FLOOR_BYTES=$(xargs cat <"$FLOOR_LIST" 2>/dev/null | wc -c)
# What the grep baseline walks: every task's mountinfo.
TASK_FILES=(/proc/[0-9]*/task/[0-9]*/mountinfo)
ALL_BYTES=$(cat "${TASK_FILES[@]}" 2>/dev/null | wc -c || true)
log "$NS_COUNT mount namespaces, $FLOOR_BYTES bytes once per namespace;" \
    "${#TASK_FILES[@]} task mountinfo files, $ALL_BYTES bytes in total"

# ---------------------------------------------------------------------------
# The commands, exactly as timed (hyperfine runs them with sh -c).
CMD_GREP="grep -l ' $MM ' /proc/*/task/*/mountinfo 2>/dev/null || true"
CMD_FLOOR="xargs cat < $FLOOR_LIST > /dev/null"
CMD_AGENT="$AGENT holders $DEV --output json > /dev/null; test \$? -ne 1"
# The same, forced to read every namespace's mountinfo text (what kernels before 6.11 get).
CMD_AGENT_TEXT="$AGENT --mount-reader mountinfo holders $DEV --output json > /dev/null; test \$? -ne 1"

HAVE_AGENT=0
HAVE_MEMO=0
AGENT_RSS_KB=""
AGENT_RSS_COLD_KB=""
AGENT_NOTE=""
# rss_run ARGS...: one run of the agent under /usr/bin/time -v (output in $WORK/agent.*); sets
# rc and RSS_KB (its peak RSS in KiB).
rss_run() {
    rc=0
    /usr/bin/time -v -o "$WORK/agent.time" "$AGENT" "$@" holders "$DEV" --output json \
        >"$WORK/agent.json" 2>"$WORK/agent.stderr" || rc=$?
    RSS_KB=$(awk -F': ' '/Maximum resident set size/ { print $2 }' "$WORK/agent.time")
}
if [ -x "$AGENT" ]; then
    HAVE_AGENT=1
    MEMO_ARGS=()
    if "$AGENT" --help 2>/dev/null | grep -q -- '--statmount-memo'; then
        HAVE_MEMO=1
        MEMO_ARGS=(--statmount-memo "$MEMO")
        CMD_AGENT="$AGENT --statmount-memo $MEMO holders $DEV --output json > /dev/null; test \$? -ne 1"
        # One run with no memo file (it writes one), for its peak RSS.
        rm -f "$MEMO"
        rss_run "${MEMO_ARGS[@]}"
        AGENT_RSS_COLD_KB=$RSS_KB
    fi
    # One instrumented run: peak RSS (memo warm, if kept), exit status, sanity of output.
    log "one run of the agent under /usr/bin/time -v"
    rss_run "${MEMO_ARGS[@]}"
    AGENT_RSS_KB=$RSS_KB
    # 2 (held) and 3 (unknown) are answers, as fuser -s gives them; 1 is an error.
    if [ "$rc" -eq 1 ] || [ "$rc" -gt 3 ]; then
        sed 's/^/  agent stderr: /' "$WORK/agent.stderr" | head -20 >&2
        [ "${BENCH_AGENT_ALLOW_FAIL:-0}" = 1 ] ||
            die "the agent exited $rc (set BENCH_AGENT_ALLOW_FAIL=1 to time it anyway)"
        CMD_AGENT="$CMD_AGENT || true"
        CMD_AGENT_TEXT="$CMD_AGENT_TEXT || true"
        AGENT_NOTE="agent exited $rc on the check run (timed anyway, BENCH_AGENT_ALLOW_FAIL=1)"
    fi
    if grep -qw "$HOLDER_PID" "$WORK/agent.json"; then
        log "agent output mentions holder PID $HOLDER_PID: yes"
    else
        log "agent output mentions holder PID $HOLDER_PID: NO (check $WORK/agent.json)"
        AGENT_NOTE="${AGENT_NOTE:+$AGENT_NOTE; }agent output did not mention holder PID $HOLDER_PID"
    fi
else
    log "agent binary $AGENT not found: timing only grep and floor"
    AGENT_NOTE="agent not built ($AGENT missing): only grep and floor were timed"
fi

# ---------------------------------------------------------------------------
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
JSON=$RESULTS_DIR/holders-bench-$STAMP.json
MD=$RESULTS_DIR/holders-bench-$STAMP.md
# The timed commands, each with what runs before each of its runs (untimed).
names=() cmds=() preps=()
add() { names+=("$1") cmds+=("$2") preps+=("${3:-:}"); }
add grep "$CMD_GREP"
add floor "$CMD_FLOOR"
if [ "$HAVE_AGENT" -eq 1 ]; then
    add agent "$CMD_AGENT"
    add agent-mountinfo "$CMD_AGENT_TEXT"
fi
CMD_BASE=""
if [ -n "${AGENT_BASE:-}" ] && [ -x "$AGENT_BASE" ]; then
    CMD_BASE="$AGENT_BASE holders $DEV --output json > /dev/null; test \$? -ne 1"
    add agent-base "$CMD_BASE"
fi
CMD_COLD="" CMD_NOMEMO=""
if [ "$COLD" = 1 ] && [ "$HAVE_MEMO" -eq 1 ]; then
    CMD_COLD="$CMD_AGENT"
    CMD_NOMEMO="$AGENT --statmount-memo '' holders $DEV --output json > /dev/null; test \$? -ne 1"
    add agent-cold "$CMD_COLD" "rm -f $MEMO"
    add agent-nomemo "$CMD_NOMEMO"
fi
CMD_DAEMON="" DAEMON_KEPT=$WORK/daemon-memo.kept DAEMON_RUN_MEMO=$WORK/daemon-run-memo
if [ "$DAEMON_MEMO" = 1 ] && [ "$HAVE_MEMO" -eq 1 ]; then
    log "the daemon writes its memo file after its first full scan"
    rm -f "$WORK/daemon-memo" "$WORK/daemon.sock"
    BLOCKJANITOR_LOG=info,blockjanitor::engine::statmount_cache_file=debug \
        "$AGENT" --statmount-memo "$WORK/daemon-memo" --journal "$WORK/daemon-journal.jsonl" \
        serve --socket "$WORK/daemon.sock" >"$WORK/daemon.log" 2>&1 &
    daemon_pid=$!
    for _ in $(seq 600); do
        grep -q 'statmount memo saved' "$WORK/daemon.log" && break
        kill -0 "$daemon_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -TERM "$daemon_pid" 2>/dev/null || true
    wait "$daemon_pid" || true
    grep -q 'statmount memo saved' "$WORK/daemon.log" ||
        die "the daemon wrote no memo file in 60 s: $(tail -5 "$WORK/daemon.log")"
    cp "$WORK/daemon-memo" "$DAEMON_KEPT"
    CMD_DAEMON="$AGENT --statmount-memo $DAEMON_RUN_MEMO holders $DEV --output json > /dev/null; test \$? -ne 1"
    add agent-daemon "$CMD_DAEMON" "cp $DAEMON_KEPT $DAEMON_RUN_MEMO"
fi
hf_args=(--warmup "$WARMUP" --runs "$RUNS" --export-json "$JSON")
for i in "${!names[@]}"; do hf_args+=(-n "${names[$i]}" "${cmds[$i]}"); done
if [ -n "$CMD_COLD$CMD_DAEMON" ]; then for p in "${preps[@]}"; do hf_args+=(--prepare "$p"); done; fi
log "hyperfine $(printf '%q ' "${hf_args[@]}")"
hyperfine "${hf_args[@]}"

# median NAME: median seconds of the named command from the JSON export.
median() { jq -r --arg n "$1" '.results[] | select(.command == $n) | .median' "$JSON"; }
# row NAME LABEL: a markdown table row for the named command.
row() {
    jq -r --arg n "$1" --arg l "$2" '.results[] | select(.command == $n) |
        "| \($l) | \(.median * 1000 * 10 | round / 10) ms | \(.mean * 1000 * 10 | round / 10) ± \(.stddev * 1000 * 10 | round / 10) ms | \(.min * 1000 * 10 | round / 10) ms | \(.max * 1000 * 10 | round / 10) ms | \(.user * 1000 | round) ms | \(.system * 1000 | round) ms |"' "$JSON"
}

# cpu NAME: mean user + system seconds of the named command (hyperfine counts children too).
cpu() { jq -r --arg n "$1" '.results[] | select(.command == $n) | .user + .system' "$JSON"; }

GREP_MED=$(median grep)
FLOOR_MED=$(median floor)

CPU=$(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)
MEM_GIB=$(awk '/^MemTotal/ { printf "%.1f", $2 / 1048576 }' /proc/meminfo)
SCENE_STATUS=$("$SCRIPT_DIR/busy-node-scene.sh" status)
scene_field() { awk -F': *' -v k="$1" '$1 == k { print $2 }' <<<"$SCENE_STATUS"; }

{
    echo "### holders: busy-node scene ($(date -u +%Y-%m-%d))"
    echo
    echo "- Machine: ${CPU:-unknown CPU}, nproc $(nproc), kernel $(uname -r), ${MEM_GIB} GiB RAM"
    echo "- Scene (\`bench/busy-node-scene.sh up\`): $(scene_field 'scene processes') processes," \
        "each in its own mount namespace with $(scene_field 'mounts per scene namespace') mounts," \
        "$(scene_field 'scene tasks') scene tasks; system-wide ${#TASK_FILES[@]} tasks, $NS_COUNT mount namespaces"
    echo "- Device: $DEV ($MM), ext4, mounted only in the namespace of PID $HOLDER_PID (not on the host)"
    echo "- mountinfo: $ALL_BYTES bytes across all ${#TASK_FILES[@]} tasks (what grep reads);" \
        "$FLOOR_BYTES bytes once per namespace (what the floor reads)"
    echo "- hyperfine $(hyperfine --version | awk '{ print $2 }'), --warmup $WARMUP --runs $RUNS; raw: \`${JSON#"$SCRIPT_DIR"/}\`"
    echo
    echo "| command | median | mean ± σ | min | max | user | system |"
    echo "|---|---|---|---|---|---|---|"
    row grep "grep (baseline)"
    row floor "floor (1 mountinfo / ns)"
    if [ "$HAVE_AGENT" -eq 1 ]; then
        row agent "blockjanitor-agent (auto: statmount prefilter$([ "$HAVE_MEMO" -eq 1 ] && echo ', memo warm'))"
        row agent-mountinfo "blockjanitor-agent --mount-reader mountinfo"
    fi
    if [ -n "$CMD_BASE" ]; then row agent-base "baseline agent (\$AGENT_BASE)"; fi
    if [ -n "$CMD_COLD" ]; then
        row agent-cold "blockjanitor-agent, memo file removed before each run (cold)"
        row agent-nomemo "blockjanitor-agent --statmount-memo '' (no memo kept)"
    fi
    if [ -n "$CMD_DAEMON" ]; then row agent-daemon "blockjanitor-agent, starting from the daemon's memo file"; fi
    echo
    echo "- grep / floor: $(ratio "$GREP_MED" "$FLOOR_MED")x"
    if [ "$HAVE_AGENT" -eq 1 ]; then
        AGENT_MED=$(median agent)
        echo "- grep / agent: $(ratio "$GREP_MED" "$AGENT_MED")x (agent is this many times faster than grep)"
        echo "- agent / floor: $(ratio "$AGENT_MED" "$FLOOR_MED")x (1.00 = as fast as just reading mountinfo once per namespace)"
        echo "- agent / floor, CPU time (user + system, hyperfine means): $(ratio "$(cpu agent)" "$(cpu floor)")x"
        TEXT_MED=$(median agent-mountinfo)
        echo "- grep / agent-mountinfo: $(ratio "$GREP_MED" "$TEXT_MED")x; agent-mountinfo / floor: $(ratio "$TEXT_MED" "$FLOOR_MED")x"
        if [ -n "$CMD_BASE" ]; then
            echo "- agent / agent-base: $(ratio "$AGENT_MED" "$(median agent-base)")x (the baseline agent: \`$AGENT_BASE\`)"
            echo "- grep / agent-base: $(ratio "$GREP_MED" "$(median agent-base)")x; agent-base / floor, CPU time: $(ratio "$(cpu agent-base)" "$(cpu floor)")x"
            echo "- agent / agent-base, CPU time: $(ratio "$(cpu agent)" "$(cpu agent-base)")x"
        fi
        if [ -n "$CMD_COLD" ]; then
            echo "- cold: grep / agent-cold: $(ratio "$GREP_MED" "$(median agent-cold)")x;" \
                "agent-cold / floor, CPU time: $(ratio "$(cpu agent-cold)" "$(cpu floor)")x;" \
                "agent-nomemo / floor, CPU time: $(ratio "$(cpu agent-nomemo)" "$(cpu floor)")x"
            echo "- agent (warm) / agent-nomemo, CPU time: $(ratio "$(cpu agent)" "$(cpu agent-nomemo)")x;" \
                "agent-cold / agent-nomemo, CPU time: $(ratio "$(cpu agent-cold)" "$(cpu agent-nomemo)")x"
        fi
        if [ -n "$CMD_DAEMON" ]; then
            echo "- from the daemon's file: grep / agent-daemon: $(ratio "$GREP_MED" "$(median agent-daemon)")x;" \
                "agent-daemon / floor, CPU time: $(ratio "$(cpu agent-daemon)" "$(cpu floor)")x;" \
                "the daemon's file $(stat -c %s "$DAEMON_KEPT") bytes"
        fi
        if [ -n "$AGENT_RSS_COLD_KB" ]; then
            echo "- agent peak RSS with no memo file (cold): ${AGENT_RSS_COLD_KB} KiB ($(awk -v k="$AGENT_RSS_COLD_KB" 'BEGIN { printf "%.1f", k / 1024 }') MiB); memo file $(stat -c %s "$MEMO" 2>/dev/null || echo '?') bytes"
        fi
        echo "- agent peak RSS: ${AGENT_RSS_KB} KiB ($(awk -v k="$AGENT_RSS_KB" 'BEGIN { printf "%.1f", k / 1024 }') MiB), /usr/bin/time -v, one run"
    fi
    if [ -n "$AGENT_NOTE" ]; then echo "- Note: $AGENT_NOTE"; fi
    echo
    echo "Commands (as timed by hyperfine, via sh -c):"
    echo
    echo '```sh'
    echo "# grep: every task's mountinfo"
    echo "$CMD_GREP"
    echo "# floor: $NS_COUNT paths, one /proc/PID/task/TID/mountinfo per distinct ns/mnt inode, listed before timing"
    echo "$CMD_FLOOR"
    if [ "$HAVE_AGENT" -eq 1 ]; then
        echo "# agent"
        echo "$CMD_AGENT"
        echo "# agent, mountinfo text for every namespace"
        echo "$CMD_AGENT_TEXT"
        if [ -n "$CMD_COLD" ]; then
            echo "# agent-cold: the same as agent, after (hyperfine --prepare, untimed): rm -f $MEMO"
            echo "# agent-nomemo"
            echo "$CMD_NOMEMO"
        fi
        if [ -n "$CMD_DAEMON" ]; then
            echo "# agent-daemon, after (hyperfine --prepare, untimed): cp $DAEMON_KEPT $DAEMON_RUN_MEMO"
            echo "$CMD_DAEMON"
        fi
    else
        echo "# agent (not run: binary missing)"
        echo "$CMD_AGENT"
    fi
    echo '```'
} >"$MD"

echo
echo "---- summary (also in $MD) ----"
cat "$MD"
