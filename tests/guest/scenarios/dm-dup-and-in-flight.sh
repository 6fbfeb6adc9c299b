#!/bin/sh
# Issue 34: the dm open count is compared with the distinct open files the plan expects, not with
# the fds it saw. Two readers stuck on a dead multipath map share ONE open file of it: a subshell
# opens the map's node on its stdin, dups it to fd 4, starts one `dd` reading it in the
# background and execs another (fork and exec keep the open file): two processes, four fds, one
# open file; both hang in D state (queue_if_no_path, no path). A third process opens the node,
# sends the fd to itself over a unix socketpair (SCM_RIGHTS) without receiving it and closes its
# own: that open file lives on only in flight; no /proc/PID/fd shows it.
#
# The kernel counts 2 opens (the readers' open file and the one in flight). The readers' four
# fds used to cover that ("at most" the fds seen): fail_if_no_path went out under the hidden
# opener. Told apart by kcmp, the readers are 1 open file: `clean MAP --apply` must refuse
# ("open count 2, accounted 1"), send nothing (the map keeps queueing, the readers stay stuck)
# and remove nothing. The opener gone, the same command tears the map down (the readers get EIO).
#
# Sections for tests/tests/guest.rs: opener, readers, clean (ends rc=N), after, clean_free,
# after_free.
. /extra/lib/mp-lib.sh
F=/extra/bin/fd-in-flight
[ -x $F ] || fail "$F missing"
make_map
kill_both_paths
# Whatever happens, the readers are freed before the guest powers off (a process in D state
# would hold the poweroff up).
trap 'dmsetup message mpathb 0 fail_if_no_path >/dev/null 2>&1 || true' EXIT

# Two readers, one open file: the subshell's stdin is the map, fd 4 its dup; `dd ... &` inherits
# both (its stdin given explicitly: an asynchronous list without job control would get
# /dev/null), `exec dd` keeps them.
( exec 4<&0; dd of=/dev/null bs=4096 count=1 <&4 2>/tmp/dd1.err & exec dd of=/dev/null bs=4096 count=1 2>/tmp/dd2.err ) </dev/mapper/mpathb &
SUB=$!
$F /dev/$MAP 1000 >/tmp/fif.out &
OPENER=$!
i=0; while ! grep -q "in flight" /tmp/fif.out 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || fail "the opener did not start"; sleep 0.1; done
# Both readers in D state (busybox has no pgrep).
dd_pids() { for d in /proc/[0-9]*; do [ "$(cat $d/comm 2>/dev/null)" = dd ] && echo "${d#/proc/}"; done; true; }
stuck() { n=0; for p in $(dd_pids); do [ "$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)" = D ] && n=$((n + 1)); done; echo $n; }
i=0; while [ "$(stuck)" != 2 ]; do i=$((i + 1)); [ $i -lt 100 ] || fail "the readers did not hang (stuck: $(stuck))"; sleep 0.1; done

echo "BEGIN opener"
echo "pid $OPENER, open count $(dmsetup info -c --noheadings -o open mpathb | tr -d ' ')"
ls -l /proc/$OPENER/fd | sed 's/.*[0-9] \([0-9]* ->\)/\1/'
echo "END opener"
echo "BEGIN readers"
for p in $(dd_pids); do
  echo "dd $p state $(cut -d' ' -f3 /proc/$p/stat) fds: $(ls -l /proc/$p/fd | grep -cE "$MAP|mpathb") of the map"
done
echo "END readers"

set +e
echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"
set -e
echo "BEGIN after"
for d in "$MAP" sda sdb; do if [ -e /sys/block/$d ]; then echo "$d present"; else echo "$d gone"; fi; done
echo "table: $(dmsetup table mpathb)"
echo "stuck readers: $(stuck)"
echo "END after"
[ -e /sys/block/$MAP ] || fail "the map was removed under the opener"
dmsetup table mpathb | grep -q queue_if_no_path || fail "fail_if_no_path was sent under the opener"

kill $OPENER
i=0; while [ -e /proc/$OPENER ] && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done
set +e
echo "BEGIN clean_free"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean_free"
set -e
echo "BEGIN after_free"
for d in "$MAP" sda sdb; do if [ -e /sys/block/$d ]; then echo "$d present"; else echo "$d gone"; fi; done
echo "readers left: $(dd_pids | wc -l)"
echo "END after_free"
wait $SUB 2>/dev/null || true
echo OK
