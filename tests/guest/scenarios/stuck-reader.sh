#!/bin/sh
# queue_if_no_path and no paths: a reader hangs in D state. The agent's scan and its API keep
# answering; the plan's fail_if_no_path frees the reader; teardown completes.
. /extra/lib/mp-lib.sh
make_map
fail_path 8:0
fail_path 8:16
dd if=/dev/mapper/mpathb of=/dev/null bs=4096 count=1 iflag=direct 2>/tmp/dd.err &
DD=$!
i=0; while [ "$(cut -d' ' -f3 /proc/$DD/stat 2>/dev/null)" != D ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
echo "reader $DD state: $(cut -d' ' -f3 /proc/$DD/stat)"
$A $J serve --no-kubernetes --socket /tmp/agent.sock --grace-period 0 >/tmp/serve.log 2>&1 &
SERVE=$!
i=0; while [ ! -S /tmp/agent.sock ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo "BEGIN api"; timeout 20 /extra/bin/agentctl --socket /tmp/agent.sock device "$MAP" -o json; echo "END api"
echo "BEGIN holders"; timeout 20 $A $J holders "$MAP" --output json || case $? in 2|3) ;; *) false ;; esac; echo "END holders"
set +e; echo "BEGIN clean"; timeout 60 $A $J clean "$MAP" --grace-period 0 --apply; echo "rc=$?"; echo "END clean"; set -e
set +e; wait $DD; rc=$?; set -e
echo "reader exit: $rc ($(tail -1 /tmp/dd.err))"
echo "BEGIN api-after"; timeout 20 /extra/bin/agentctl --socket /tmp/agent.sock node -o json; echo "END api-after"
kill $SERVE
for d in sda sdb "$MAP"; do [ ! -e /sys/block/$d ] || fail "$d still in /sys/block"; done
echo OK
