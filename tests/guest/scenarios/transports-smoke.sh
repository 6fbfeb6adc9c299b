#!/bin/sh
# transports-smoke: every transport of issue 12 works in the guest, with the image's tools and
# scenario-lib/transport-lib.sh (in the image as /usr/lib/blockjanitor/transport-lib.sh), timed:
#  (a) a LIO iSCSI target (configfs, 2 fileio LUNs, 127.0.0.1:3260) + iscsid/iscsiadm: discovery,
#      login (sd devices under /sys/class/iscsi_session/sessionN), logout;
#  (b) an nvmet NVMe/TCP target on 127.0.0.1:4420 + nvme connect (nvme0n1), disconnect;
#  (c) on a dm-multipath map over two scsi_debug paths: an LVM LV, a LUKS2 mapping, a partition
#      table + kpartx (each dm uuid prefix printed);
#  (d) multipathd making the map itself from the paths, `show maps`, /etc/multipath/wwids,
#      `multipathd del map`.
# busybox sh. Prints "TIME <what> <seconds>" lines and ends with "transports-smoke OK".
set -u
TL=/usr/lib/blockjanitor/transport-lib.sh
[ -f /extra/lib/transport-lib.sh ] && TL=/extra/lib/transport-lib.sh
. $TL
fail() { echo "FAIL: $*"; echo "--- dmesg"; dmesg | tail -n 30; exit 1; }
T0=$(tl_now)
step() { STEP=$1; TS=$(tl_now); echo "--- $1"; }
took() { echo "TIME $STEP $(tl_since $TS)"; }

# ------------------------------------------------------------------ (a) iSCSI
step iscsi-target
T1=iqn.2026-11.io.blockjanitor:smoke1
iscsi_target_up $T1 2 || fail "iscsi_target_up"
ls $LIO/iscsi/$T1/tpgt_1/lun $LIO/iscsi/$T1/tpgt_1/np | tr '\n' ' '; echo
took
step iscsi-login
iscsid_start || fail "iscsid_start"
iscsiadm -m discovery -t st -p 127.0.0.1:3260 || fail "discovery"
iscsi_login $T1 127.0.0.1:3260 10 2 >/dev/null || fail "iscsi_login"
S=$ISCSI_SESSION
echo "session $S: state $(iscsi_session_state $S) target $(cat /sys/class/iscsi_session/$S/targetname)"
echo "devices: $ISCSI_DEVS"
[ "$(echo $ISCSI_DEVS | wc -w)" = 2 ] || fail "expected 2 disks, got '$ISCSI_DEVS'"
for d in $ISCSI_DEVS; do
    echo "$d: wwid $(cat /sys/block/$d/device/wwid) vendor $(cat /sys/block/$d/device/vendor) size $(cat /sys/block/$d/size)"
done
for c in /sys/class/iscsi_connection/*; do
    echo "${c##*/}: $(cat $c/persistent_address 2>/dev/null):$(cat $c/persistent_port 2>/dev/null) state $(cat $c/state 2>/dev/null)"
done
echo "replacement_timeout $(cat /sys/class/iscsi_session/$S/recovery_tmo)"
iscsiadm -m session || fail "iscsiadm -m session"
dd if=/dev/$(echo $ISCSI_DEVS | cut -d' ' -f1) of=/dev/null bs=64k count=4 2>/dev/null || fail "read through iSCSI"
took
step iscsi-logout
iscsi_logout $T1 || fail "logout"
[ -e /sys/class/iscsi_session/$S ] && fail "$S still there after logout"
for d in $ISCSI_DEVS; do [ -e /sys/block/$d ] && fail "$d still there after logout"; done
iscsi_target_down $T1 || fail "iscsi_target_down"
took

# ------------------------------------------------------------------ (b) NVMe/TCP
step nvme-target
N1=nqn.2026-11.io.blockjanitor:smoke-nvme1
nvmet_target_up $N1 1 1 || fail "nvmet_target_up"
took
step nvme-connect
nvme_host_connect $N1 1 -1 1 >/dev/null || fail "nvme_host_connect"
C=$NVME_CTRL
F=/sys/class/nvme-fabrics/ctl/$C
echo "$C: state $(cat $F/state) transport $(cat $F/transport) address $(cat $F/address) subsysnqn $(cat $F/subsysnqn)"
echo "$C: ctrl_loss_tmo $(cat $F/ctrl_loss_tmo 2>/dev/null) reconnect_delay $(cat $F/reconnect_delay 2>/dev/null)"
HEADS=$(nvme_ns_heads $C) || fail "nvme_ns_heads"
echo "subsystem $(nvme_subsys_of $C): heads $HEADS; per-path: $(ls /sys/class/nvme/$C | grep -E '^nvme[0-9]+c[0-9]+n[0-9]+$' | tr '\n' ' ')"
[ -n "$HEADS" ] && [ -e /sys/block/${HEADS%% *} ] || fail "no namespace block device"
dd if=/dev/${HEADS%% *} of=/dev/null bs=64k count=4 2>/dev/null || fail "read through NVMe/TCP"
nvme list-subsys 2>&1 | head -8
took
step nvme-disconnect
nvme_host_disconnect $C || fail "disconnect"
tl_wait 10 "$C gone" test ! -e /sys/class/nvme/$C || fail "$C still there"
nvmet_target_down $N1 || fail "nvmet_target_down"
nvmet_port_remove 1 || fail "nvmet_port_remove"
took

# ------------------------------------------------------------------ (c) stacks on a map
step mp-map
P=$(sd_debug_paths add_host=2 num_tgts=1 max_luns=1 vpd_use_hostno=0 dev_size_mb=16) || fail "scsi_debug"
echo "paths: $P wwid $(sd_udev_wwid ${P%% *})"
MAP=$(mp_map_by_hand mpathb $P) || fail "mp_map_by_hand"
echo "mpathb is $MAP uuid $(tl_dm_uuid $MAP)"
took
step lvm
LV=$(lvm_on /dev/mapper/mpathb vgsmoke lvsmoke) || fail "lvm_on"
echo "LV vgsmoke/lvsmoke is $LV uuid $(tl_dm_uuid $LV) slaves $(ls /sys/block/$LV/slaves) table: $(dmsetup table vgsmoke-lvsmoke)"
case $(tl_dm_uuid $LV) in LVM-*) ;; *) fail "LV uuid prefix" ;; esac
lvs -o lv_name,vg_name,lv_size,devices 2>&1
[ -e /dev/vgsmoke/lvsmoke ] || fail "/dev/vgsmoke/lvsmoke missing"
vgchange -an vgsmoke >/dev/null || fail "vgchange -an"
[ -e /sys/block/$LV ] && fail "$LV still there after vgchange -an"
dd if=/dev/zero of=/dev/mapper/mpathb bs=1M count=1 2>/dev/null || fail "wipe the PV label"
took
step luks
CR=$(luks_on /dev/mapper/mpathb cryptsmoke) || fail "luks_on"
echo "crypt cryptsmoke is $CR uuid $(tl_dm_uuid $CR) table: $(dmsetup table cryptsmoke | sed 's/ [0-9a-f]\{64\} / <key> /; s/ :[0-9]*:logon:[^ ]* / <keyring> /')"
case $(tl_dm_uuid $CR) in CRYPT-LUKS2-*) ;; *) fail "crypt uuid prefix" ;; esac
dd if=/dev/mapper/cryptsmoke of=/dev/null bs=64k count=4 2>/dev/null || fail "read through crypt"
cryptsetup close cryptsmoke || fail "cryptsetup close"
took
step kpartx
PARTS=$(parts_on /dev/mapper/mpathb 2) || fail "parts_on"
for p in $PARTS; do echo "$p: name $(tl_dm_name $p) uuid $(tl_dm_uuid $p) table: $(dmsetup table $(tl_dm_name $p))"; done
case $(tl_dm_uuid ${PARTS%% *}) in part1-mpath-*) ;; *) fail "partition uuid prefix" ;; esac
kpartx -d /dev/mapper/mpathb || fail "kpartx -d"
for p in $PARTS; do [ -e /sys/block/$p ] && fail "$p still there after kpartx -d"; done
dmsetup remove mpathb || fail "dmsetup remove mpathb"
took

# ------------------------------------------------------------------ (d) multipathd
step multipathd
WWID=$(sd_udev_wwid ${P%% *})
mpd_fake_udev $P || fail "mpd_fake_udev"
mpd_start || { cat /tmp/multipathd.log; fail "mpd_start"; }
M=$(mpd_wait_map $WWID) || { cat /tmp/multipathd.log; fail "multipathd made no map for $WWID"; }
echo "multipathd made $M ($(tl_dm_name $M), uuid $(tl_dm_uuid $M)): $(dmsetup table $(tl_dm_name $M))"
multipathd show maps || fail "show maps"
multipathd show paths
grep -qx "/$WWID/" /etc/multipath/wwids || { cat /etc/multipath/wwids; fail "wwid not in /etc/multipath/wwids"; }
echo "wwids: $(grep -v '^#' /etc/multipath/wwids | tr '\n' ' ')"
multipathd del map $(tl_dm_name $M) || fail "multipathd del map"
tl_wait 5 "$M gone" test ! -e /sys/block/$M || fail "$M still there after del map"
multipathd show maps | grep -q "$WWID" && fail "multipathd still lists the map"
echo "after del map: wwids: $(grep -v '^#' /etc/multipath/wwids | tr '\n' ' ')"
mpd_stop || fail "mpd_stop"
took

echo "TIME total $(tl_since $T0)"
echo "transports-smoke OK"
