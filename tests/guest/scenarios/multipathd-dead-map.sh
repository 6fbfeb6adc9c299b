#!/bin/sh
# multipathd in sync (issue 12): multipathd runs (started here, without systemd or udevd) and
# makes the map from two scsi_debug paths to one LUN; the LUN dies (both paths offline, failed by
# multipathd's checker). Control first: a root process named multipathd runs but holds no control
# socket (multipathd stopped, a stand-in of that name left running): `clean --apply` must fail
# closed, naming the map, and remove nothing. Then with the real multipathd back, the
# agent removes the map through it (`del map`) and deletes the paths; some seconds later (several
# checker intervals) the map is still gone and its wwid has left /etc/multipath/wwids, every other
# line kept. A second control in between: multipathd stopped (SIGSTOP), its socket silent.
. /extra/lib/mp-lib.sh
WWID=333333330000007d0
WWIDS=/etc/multipath/wwids

wait_for() { # wait_for SECONDS WHAT COMMAND...: polls every 0.2 s
  n=$(( $1 * 5 )); what=$2; shift 2
  while ! "$@" >/dev/null 2>&1; do
    n=$((n - 1)); [ $n -gt 0 ] || fail "timed out waiting for $what"; sleep 0.2
  done
}
start_multipathd() {
  multipathd -d -v3 </dev/null >>/tmp/multipathd.log 2>&1 &
  MPD=$!
  wait_for 15 "multipathd's socket" multipathd show daemon
}
map_present() { dmsetup info -c --noheadings -o uuid 2>/dev/null | grep -qx "mpath-$WWID"; }
both_failed() { s=$(dmsetup status "$NAME" 2>/dev/null) && case $s in *" 8:0 F "*" 8:16 F "*) true ;; *) false ;; esac; }
knows_map() { multipathd show maps 2>/dev/null | grep -q "$NAME"; }

modprobe scsi_debug add_host=2 num_tgts=1 max_luns=1 vpd_use_hostno=0 dev_size_mb=16 || fail "modprobe scsi_debug"
# Without udevd, multipath-tools sees a path only through the udev database: what udev's rules
# would have recorded (initialized, ID_SERIAL from scsi_id, ID_WWN for the property blacklist).
mkdir -p /run/udev/data /etc/multipath
for d in sda sdb; do
  printf 'I:1\nE:ID_SERIAL=%s\nE:ID_WWN=0x%s\nE:DEVTYPE=disk\n' "$WWID" "${WWID#3}" >/run/udev/data/b$(cat /sys/block/$d/dev)
done
cat >/etc/multipath.conf <<EOF
defaults {
  user_friendly_names yes
  find_multipaths no
  polling_interval 1
  no_path_retry queue
}
EOF
# A wwid of another array, to show the other lines survive byte for byte.
printf '# Multipath wwids, Version : 1.0\n# NOTE: This file is automatically maintained by multipath and multipathd.\n# You should not need to edit this file in normal circumstances.\n#\n# Valid WWIDs:\n/3600a098038303634722b4d59646c4436/\n' >$WWIDS
T0=$(cut -d' ' -f1 /proc/uptime)
start_multipathd
wait_for 15 "multipathd to create the map" map_present
NAME=$(dmsetup info -c --noheadings -o name,uuid --separator ' ' | awk -v u="mpath-$WWID" '$2 == u {print $1}')
MAP=dm-$(dmsetup info -c --noheadings -o minor "$NAME" | tr -d ' ')
echo "multipathd (pid $MPD) made map $NAME ($MAP): $(dmsetup table "$NAME")"
echo "BEGIN wwids-before"; cat $WWIDS; echo "END wwids-before"
grep -qx "/$WWID/" $WWIDS || fail "multipathd did not record wwid $WWID"

# The LUN dies: both paths offline; multipathd's checker fails them.
echo offline >/sys/block/sda/device/state
echo offline >/sys/block/sdb/device/state
wait_for 15 "multipathd to fail both paths" both_failed
echo "status: $(dmsetup status "$NAME")"

# Control: multipathd stopped, a process of that name left running, its socket silent.
kill "$MPD"; wait "$MPD" 2>/dev/null || true
mkdir -p /tmp/standin
# (A script: its process's name is the script's; it takes its sleep along when it is killed.)
printf '#!/bin/sh\nsleep 1000 &\ntrap "kill \\$! 2>/dev/null; exit 0" TERM\nwait\n' >/tmp/standin/multipathd
chmod +x /tmp/standin/multipathd
/tmp/standin/multipathd </dev/null >/dev/null 2>&1 &
STANDIN=$!
wait_for 5 "the stand-in" grep -qx multipathd /proc/$STANDIN/comm
set +e; echo "BEGIN unreachable"; $A $J clean "$MAP" --grace-period 0 --apply 2>&1; echo "rc=$?"; echo "END unreachable"; set -e
map_present || fail "the map was removed although multipathd could not be asked"
for d in sda sdb; do [ -e /sys/block/$d ] || fail "$d was deleted although the map removal failed"; done
grep -qx "/$WWID/" $WWIDS || fail "the wwid left $WWIDS although the map is still there"
kill "$STANDIN"; wait "$STANDIN" 2>/dev/null || true

# multipathd back: it takes the map again; the agent removes it through multipathd.
start_multipathd
wait_for 15 "multipathd to know $NAME again" knows_map
wait_for 15 "multipathd to fail both paths again" both_failed
# Control: multipathd stopped (SIGSTOP): its socket accepts, nothing answers. Nothing is removed,
# and no removal is left queued on its socket to be carried out once it runs again.
kill -STOP "$MPD"
set +e; echo "BEGIN silent"; $A $J --timeout 2 clean "$MAP" --grace-period 0 --apply 2>&1; echo "rc=$?"; echo "END silent"; set -e
kill -CONT "$MPD"
wait_for 10 "multipathd to answer again" multipathd show daemon
sleep 1
map_present || fail "the map was removed by a command queued while multipathd was stopped"
for d in sda sdb; do [ -e /sys/block/$d ] || fail "$d was deleted although the map removal failed"; done
grep -qx "/$WWID/" $WWIDS || fail "the wwid left $WWIDS although the map is still there"
T1=$(cut -d' ' -f1 /proc/uptime)
set +e; echo "BEGIN clean"; $A $J clean "$MAP" --grace-period 0 --apply 2>&1; echo "rc=$?"; echo "END clean"; set -e
T2=$(cut -d' ' -f1 /proc/uptime)
# Several checker intervals (polling_interval 1): multipathd must not re-create the map.
sleep 5
echo "BEGIN after"
echo "dmsetup: $(dmsetup ls 2>&1)"
echo "multipathd maps: $(multipathd show maps 2>&1)"
echo "multipathd daemon: $(multipathd show daemon 2>&1)"
ls /sys/block | tr '\n' ' '; echo
echo "END after"
echo "BEGIN wwids-after"; cat $WWIDS; echo "END wwids-after"
echo "BEGIN multipathd-log"; grep -E "remove map|removing map|$NAME: (addmap|set ACT_)" /tmp/multipathd.log; echo "END multipathd-log"
echo "BEGIN journal"; grep '"dm_remove"' /tmp/journal.jsonl; grep '"phase":"result"' /tmp/journal.jsonl; echo "END journal"
map_present && fail "the map came back"
[ ! -e /sys/block/$MAP ] || fail "$MAP still in /sys/block"
for d in sda sdb; do [ ! -e /sys/block/$d ] || fail "$d still in /sys/block"; done
grep -qx "/$WWID/" $WWIDS && fail "wwid $WWID is still in $WWIDS"
kill -0 "$MPD" || fail "multipathd died"
grep -q sleep /proc/[0-9]*/comm 2>/dev/null && fail "the stand-in's sleep is still running"
kill "$MPD"; wait "$MPD" 2>/dev/null || true
echo "times: setup and both controls $(awk "BEGIN{print $T1 - $T0}") s, clean through multipathd $(awk "BEGIN{print $T2 - $T1}") s"
echo OK
