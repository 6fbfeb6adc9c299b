//! The SCSI steps through the recording kernel, on the `iscsi-guest` tree (`sda` 8:0 running,
//! `sdf` 8:80 transport-offline, as the guest's kernel showed them): a disk with another number
//! or wwid, a held disk, or one that came back refuses the step with nothing written; the planned
//! disk gets exactly its `device/state` or `device/delete` write.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel};

const SDA_WWID: &str = "naa.600140501769504c9f6383a000000000";
const SDF_WWID: &str = "naa.6001405ad4f4d7fcc73088e000000000";
/// `sdf`'s SCSI device, the directory the kernel removes on `delete`.
const SDF_SCSI: &str = "sys/devices/platform/host3/session4/target3:0:0/3:0:0:0";

fn name(n: &str) -> DeviceName {
    DeviceName::new(n).expect("name")
}

fn assert_refused(r: Result<StepOutcome, ActError>, device: &str, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device: d, .. } if d.as_str() == device), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{device}: precondition failed: ")), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn a_disk_with_another_wwid_is_left_alone() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let planned = "naa.6001405ffffffffffffffff000000000";
    let why = format!("wwid is now '{SDA_WWID}', not '{planned}': another disk");
    assert_refused(k.actuator().scsi_offline(&name("sda"), DevNum::new(8, 0), planned, false), "sda", &why);
    assert_refused(k.actuator().scsi_delete(&name("sda"), DevNum::new(8, 0), planned), "sda", &why);
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn a_name_that_is_another_device_now_is_left_alone() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let r = k.actuator().scsi_delete(&name("sdf"), DevNum::new(8, 96), SDF_WWID);
    assert_refused(r, "sdf", "sdf is now 8:80, not 8:96: name reused?");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_held_disk_is_left_alone() {
    let k = RecordingKernel::fixture("iscsi-guest");
    std::fs::create_dir_all(k.path("sys/class/block/sdf/holders/dm-0")).expect("a holder");
    assert_refused(
        k.actuator().scsi_delete(&name("sdf"), DevNum::new(8, 80), SDF_WWID),
        "sdf",
        "still held by dm-0",
    );
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_disk_planned_offline_that_came_back_is_left_alone() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let r = k.actuator().scsi_offline(&name("sda"), DevNum::new(8, 0), SDA_WWID, true);
    assert_refused(r, "sda", "planned as an offline disk, but its state is now 'running': it came back");
    assert_refused(
        k.actuator().scsi_delete(&name("sda"), DevNum::new(8, 0), SDA_WWID),
        "sda",
        "its state is 'running', not offline",
    );
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_disk_is_set_offline_with_one_write() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let r = k.actuator().scsi_offline(&name("sda"), DevNum::new(8, 0), SDA_WWID, false);
    assert_eq!(r.expect("offline"), StepOutcome::Done);
    let state = k.path("sys/class/block/sda/device/state");
    assert_eq!(k.writes(), vec![Call::Write { path: state, text: "offline\n".into() }]);
    // Already offline (transport-offline): done, nothing written.
    let k = RecordingKernel::fixture("iscsi-guest");
    let r = k.actuator().scsi_offline(&name("sdf"), DevNum::new(8, 80), SDF_WWID, true);
    assert_eq!(r.expect("offline"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_offline_disk_is_deleted_with_one_write() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let delete = Call::Write { path: k.path("sys/class/block/sdf/device/delete"), text: "1\n".into() };
    k.on(
        delete.clone(),
        vec![Effect::Remove(k.path(SDF_SCSI)), Effect::Remove(k.path("sys/class/block/sdf"))],
    );
    let r = k.actuator().scsi_delete(&name("sdf"), DevNum::new(8, 80), SDF_WWID);
    assert_eq!(r.expect("deleted"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![delete]);
}

#[test]
fn a_disk_that_is_gone_is_already_absent() {
    let k = RecordingKernel::fixture("iscsi-guest");
    let r = k.actuator().scsi_delete(&name("sdz"), DevNum::new(65, 160), SDF_WWID);
    assert_eq!(r.expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(
        k.actuator().scsi_offline(&name("sdz"), DevNum::new(65, 160), SDF_WWID, false).expect("absent"),
        StepOutcome::AlreadyAbsent
    );
    assert_eq!(k.writes(), vec![]);
}
