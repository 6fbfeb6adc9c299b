#!/bin/sh
# tools-smoke: every user-space tool in the image starts (its shared libraries resolve), scsi_debug
# gives sg3-utils a disk to inquire, an nbd export on the guest's loopback attaches, and rbd's
# sysfs control files exist.
set -u
export DM_DISABLE_UDEV=1
fail() { echo "FAIL: $*"; exit 1; }
run() { echo "\$ $*"; "$@" 2>&1 | head -n "${LINES_MAX:-3}"; }

# Every ELF tool of the image starts: the dynamic loader finds all its libraries.
n=0
for b in dmsetup dmstats multipath multipathd mpathpersist nbd-client nbd-server sg_inq sg_vpd \
         sg_turs sg_readcap sg_map26 sg_persist sg_rtpg; do
    p=$(command -v $b) || fail "$b not in the image"
    out=$($p -h 2>&1 </dev/null)
    case $out in *"error while loading shared libraries"*|*"not found"*) fail "$b: $out" ;; esac
    n=$((n + 1))
done
echo "$n tools start"
run dmsetup version
run multipath -h
run nbd-client -V
run sg_inq -V

modprobe scsi_debug dev_size_mb=8 || fail "modprobe scsi_debug"
run sg_inq /dev/sda || fail "sg_inq"
LINES_MAX=6 run sg_vpd -p di /dev/sda
run sg_turs -v /dev/sda || fail "sg_turs"
ls /dev/sg* >/dev/null || fail "no /dev/sg*"

# nbd: server and client both inside the guest, on 127.0.0.1
truncate -s 16M /tmp/nbd.img
cat >/tmp/nbd.conf <<'CONF'
[generic]
user = root
group = root
listenaddr = 127.0.0.1
port = 10809
[disk]
exportname = /tmp/nbd.img
CONF
nbd-server -C /tmp/nbd.conf || fail "nbd-server"
sleep 0.3
nbd-client -N disk 127.0.0.1 10809 /dev/nbd0 -L || fail "nbd-client"
# nbd-client -L forks a child that sits in NBD_DO_IT; the size shows up a moment later.
i=0; while [ "$(cat /sys/block/nbd0/size)" = 0 ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
echo "nbd0 size: $(cat /sys/block/nbd0/size) sectors, pid: $(cat /sys/block/nbd0/pid 2>/dev/null)"
[ "$(cat /sys/block/nbd0/size)" = 32768 ] || fail "nbd0 has the wrong size"
dd if=/dev/zero of=/dev/nbd0 bs=4096 count=4 2>/dev/null || fail "write to nbd0"
nbd-client -d /dev/nbd0 || fail "nbd-client -d"

ls /sys/bus/rbd/
for f in add add_single_major remove remove_single_major; do
    [ -e /sys/bus/rbd/$f ] || fail "/sys/bus/rbd/$f missing"
done
echo "tools-smoke: ok"
