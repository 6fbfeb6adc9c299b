#!/bin/sh
# smoke: the guest boots Debian's kernel, /init loaded the modules, the scenario's output and exit
# code come back. Runs under busybox sh.
set -eu
echo "uname -r: $(uname -r)"
echo "modules loaded: $(wc -l </proc/modules)"
echo "cpus: $(nproc), mem: $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
echo "uptime: $(cut -d' ' -f1 /proc/uptime) s"
for m in scsi_mod sd_mod sg dm_mod dm_multipath nbd rbd loop ext4; do
    grep -q "^$m " /proc/modules || { echo "module $m is not loaded"; exit 1; }
done
echo "all expected modules loaded"
exit 0
