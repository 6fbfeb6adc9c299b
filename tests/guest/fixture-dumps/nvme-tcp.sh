#!/bin/sh
# Dumps the NVMe/TCP sysfs layout of the guest's kernel for tests/fixtures/make-nvme-fixture.py
# (not part of the suite): subsystem A (one namespace) whose port was removed, so its controller
# reconnects for ever (ctrl_loss_tmo=-1), and subsystem C (one namespace), live.
# Output lines: "D path", "L path target", "F path hex-bytes" (files that cannot be read: "F path").
set -eu
for m in nvmet nvmet_tcp nvme_tcp; do modprobe $m; done
grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs configfs /sys/kernel/config
N=/sys/kernel/config/nvmet
target() {
  s=$N/subsystems/$1; mkdir $s; echo 1 >$s/attr_allow_any_host; echo "$2" >$s/attr_serial
  truncate -s 16M /tmp/ns-$2.img; mkdir $s/namespaces/1
  printf %s /tmp/ns-$2.img >$s/namespaces/1/device_path; echo 1 >$s/namespaces/1/buffered_io
  printf '%08x-0000-4000-8000-000000000001' "$2" >$s/namespaces/1/device_uuid
  echo 1 >$s/namespaces/1/enable
  p=$N/ports/$3; mkdir $p; echo tcp >$p/addr_trtype; echo ipv4 >$p/addr_adrfam
  echo 127.0.0.1 >$p/addr_traddr; echo "$3" >$p/addr_trsvcid; ln -s $s $p/subsystems/$1
}
target nqn.2026-11.io.blockjanitor:a 1111 4420
target nqn.2026-11.io.blockjanitor:c 2222 4421
nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-11.io.blockjanitor:a --ctrl-loss-tmo=-1 --reconnect-delay=1 >/dev/null
nvme connect -t tcp -a 127.0.0.1 -s 4421 -n nqn.2026-11.io.blockjanitor:c --ctrl-loss-tmo=-1 --reconnect-delay=1 >/dev/null
sleep 1
rm $N/ports/4420/subsystems/*; rmdir $N/ports/4420
i=0; while [ "$(cat /sys/class/nvme/nvme0/state)" != connecting ] && [ $i -lt 100 ]; do i=$((i + 1)); sleep 0.1; done
hex() { od -An -v -tx1 "$1" 2>/dev/null | tr -d ' \n'; }
# Attribute directories only: the block layer's queue/, mq/, integrity/, trace/, power/, hwmon
# are left out (the agent reads none of them).
skip() { case "${1##*/}" in queue|mq|integrity|trace|power|hwmon*|bdi|subsystem|ng*) return 0 ;; esac; return 1; }
walk() {
  local d=$1 depth=$2 e
  echo "D $d"
  for e in "$d"/* ; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    if [ -L "$e" ]; then echo "L $e $(readlink "$e")"
    elif [ -d "$e" ]; then skip "$e" || { [ "$depth" -gt 0 ] && walk "$e" $((depth - 1)); } || true
    elif [ -r "$e" ] && v=$(hex "$e"); then echo "F $e $v"
    else echo "F $e"; fi
  done
}
echo "BEGIN dump"
walk /sys/devices/virtual/nvme-fabrics 3
walk /sys/devices/virtual/nvme-subsystem 2
for c in /sys/class/nvme /sys/class/nvme-subsystem /sys/class/nvme-fabrics; do
  echo "D $c"; for e in $c/*; do echo "L $e $(readlink $e)"; done
done
echo "D /sys/class/block"; for e in /sys/class/block/nvme*; do echo "L $e $(readlink $e)"; done
echo "D /sys/block"; for e in /sys/block/nvme*; do echo "L $e $(readlink $e)"; done
echo "END dump"
