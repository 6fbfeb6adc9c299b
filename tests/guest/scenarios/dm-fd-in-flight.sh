#!/bin/sh
# Issue 17: an opener the fd scan cannot see keeps a dead map's teardown refused. A process opens
# the dead multipath map's node, sends the fd to itself over a unix socketpair (SCM_RIGHTS)
# without ever receiving it and closes its own: the open file lives on only in flight, in the
# socket's queue; no /proc/PID/fd shows it, the dm open count does. `clean MAP --apply` must
# refuse naming the difference (open count 1, accounted 0), without sending fail_if_no_path
# (the map keeps queueing) and without removing anything. The opener gone, the same command
# tears the map down.
#
# Sections for tests/tests/guest.rs: opener, clean (ends rc=N), after, clean_free, after_free.
. /extra/lib/mp-lib.sh
F=/extra/bin/fd-in-flight
[ -x $F ] || fail "$F missing"
make_map
kill_both_paths

$F /dev/$MAP 1000 >/tmp/fif.out &
OPENER=$!
i=0; while ! grep -q "in flight" /tmp/fif.out 2>/dev/null; do i=$((i + 1)); [ $i -lt 50 ] || fail "the opener did not start"; sleep 0.1; done
echo "BEGIN opener"
echo "pid $OPENER, open count $(dmsetup info -c --noheadings -o open mpathb | tr -d ' ')"
ls -l /proc/$OPENER/fd | sed 's/.*[0-9] \([0-9]* ->\)/\1/'
echo "END opener"

set +e
echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"
set -e
echo "BEGIN after"
for d in "$MAP" sda sdb; do if [ -e /sys/block/$d ]; then echo "$d present"; else echo "$d gone"; fi; done
# The table shows queue_if_no_path while the map queues (fail_if_no_path clears it).
echo "table: $(dmsetup table mpathb)"
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
echo "END after_free"
echo OK
