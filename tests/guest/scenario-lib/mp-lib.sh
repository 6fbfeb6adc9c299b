# Shared by the multipath scenarios (sourced). Two scsi_debug hosts give sda and sdb, two paths to
# one LUN; a dm-multipath map "mpathb" over both, made with dmsetup exactly as
# ../../shared/real-kernel-harness.md measured. Paths are failed with the multipath target's
# fail_path message (no I/O needed, so nothing hangs unless a scenario wants it to).
set -eu
export DM_DISABLE_UDEV=1
A=/extra/bin/blockjanitor-agent
J="--journal /tmp/journal.jsonl"
fail() { echo "FAIL: $*"; exit 1; }
[ -x $A ] || fail "$A missing"

# unload_scsi_debug LABEL: unloads scsi_debug once the kernel has dropped its last reference. A
# path's removal returns before the kernel's own asynchronous users let go (the ALUA handler's
# queued RTPG work holds the SCSI device, and so the module, for a moment after the map that
# triggered it is removed): the module's refcount is waited for (10 s), and if it stays held the
# failure names the count, so a reference the agent left would show.
unload_scsi_debug() {
  n=50
  while [ "$(cat /sys/module/scsi_debug/refcnt 2>/dev/null || echo 0)" != 0 ]; do
    n=$((n - 1))
    [ $n -gt 0 ] || fail "rmmod scsi_debug after $1: module still held (refcnt $(cat /sys/module/scsi_debug/refcnt)); devices: $(ls /sys/block | tr '\n' ' ')"
    sleep 0.2
  done
  rmmod scsi_debug || fail "rmmod scsi_debug after $1"
}

make_map() {
  modprobe scsi_debug add_host=2 num_tgts=1 max_luns=1 vpd_use_hostno=0 dev_size_mb=16 || fail "modprobe scsi_debug"
  [ -e /sys/block/sda ] && [ -e /sys/block/sdb ] || fail "scsi_debug did not give sda and sdb"
  SECTORS=$(cat /sys/block/sda/size)
  echo "0 $SECTORS multipath 1 queue_if_no_path 0 1 1 round-robin 0 2 1 8:0 1 8:16 1" \
    | dmsetup create mpathb --uuid mpath-333333330000007d0 || fail "dmsetup create"
  MAP=dm-$(dmsetup info -c --noheadings -o minor mpathb | tr -d " ")
  [ -e /sys/block/$MAP/dm ] || fail "map mpathb is not $MAP"
  echo "map mpathb is $MAP: $(dmsetup status mpathb)"
}

fail_path() { dmsetup message mpathb 0 fail_path "$1" || fail "fail_path $1"; }

# Incident 3's dead map: both paths failed in the map (its fail_path message, no I/O needed),
# then both SCSI disks offline; the map keeps queue_if_no_path. Prints the status line.
kill_both_paths() {
  fail_path 8:0
  fail_path 8:16
  echo offline >/sys/block/sda/device/state
  echo offline >/sys/block/sdb/device/state
  echo "status: $(dmsetup status mpathb)"
}

section() { echo "BEGIN $1"; shift; "$@"; rc=$?; echo "END $1_rc=$rc"; }
