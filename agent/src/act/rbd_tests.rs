//! The rbd step through the recording kernel, on incident 1's tree (`rbd4`, id 4, 251:0, a
//! kernel without `diskseq`): the mapping re-check (pool, image, image id, number) and the
//! attach stamp (diskseq, or the kernel log's attach record) refuse a mapping that is not the
//! planned one with nothing written; the planned one gets exactly its `remove_single_major`.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel};

const POOL: &str = "k8s";
const IMAGE: &str = "kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
const IMAGE_ID: &str = "115f79643c9869";
const RBD4: DevNum = DevNum { major: 251, minor: 0 };

fn rbd4() -> DeviceName {
    DeviceName::new("rbd4").expect("name")
}

/// Incident 1's tree, with the bus's write-only control files (the fixture dumps only what
/// reads) and the kernel log's attach record of `rbd4`, #1200.
fn incident1() -> RecordingKernel {
    let k = RecordingKernel::fixture("incident1");
    k.file("sys/bus/rbd/remove_single_major", "");
    k.file("sys/bus/rbd/remove", "");
    k.rbd_record("rbd4", 1200);
    k
}

fn unmap(k: &RecordingKernel, image: &str, stamp: AttachStamp, force: bool) -> Result<StepOutcome, ActError> {
    k.actuator().rbd_unmap(&rbd4(), RBD4, 4, (POOL, image, IMAGE_ID), stamp, force)
}

const PLANNED: AttachStamp = AttachStamp { diskseq: None, record: Some(1200) };

/// What the kernel does on `echo 4 > remove_single_major`: the id's device goes away.
fn on_remove(k: &RecordingKernel, text: &str) -> Call {
    let write = Call::Write { path: k.path("sys/bus/rbd/remove_single_major"), text: text.to_owned() };
    let gone = ["sys/bus/rbd/devices/4", "sys/devices/rbd/4", "sys/class/block/rbd4"];
    k.on(write.clone(), gone.iter().map(|p| Effect::Remove(k.path(p))).collect());
    write
}

fn assert_refused(r: Result<StepOutcome, ActError>, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device, .. } if device.as_str() == "rbd4"), "{e:?}");
    assert!(e.to_string().starts_with("rbd4: precondition failed: rbd id 4 is "), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn an_id_that_maps_another_image_now_is_left_alone() {
    let k = incident1();
    assert_refused(
        unmap(&k, "csi-vol-other", PLANNED, false),
        &format!("now {POOL}/{IMAGE} (251:0), not {POOL}/csi-vol-other: id reused?"),
    );
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn the_same_image_mapped_again_is_left_alone() {
    // A kernel with diskseq: the device's is 9 now, the plan saw 8.
    let k = incident1();
    k.file("sys/devices/rbd/4/block/rbd4/diskseq", "9\n");
    assert_refused(
        unmap(&k, IMAGE, AttachStamp { diskseq: Some(8), record: None }, false),
        "now diskseq 9, not the planned 8",
    );
    assert_eq!(k.writes(), vec![]);
    // Without diskseq: the kernel log announces it by another record, or by none any more.
    let k = incident1();
    k.rbd_record("rbd4", 1301);
    assert_refused(unmap(&k, IMAGE, PLANNED, false), "now announced by kernel record #1301, not #1200");
    let k = RecordingKernel::fixture("incident1");
    assert_refused(unmap(&k, IMAGE, PLANNED, false), "no longer announced by kernel record #1200");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_mapping_is_unmapped_with_one_write() {
    let k = incident1();
    let write = on_remove(&k, "4");
    assert_eq!(unmap(&k, IMAGE, PLANNED, false).expect("unmapped"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![write]);
    // With diskseq, and forced on request.
    let k = incident1();
    k.file("sys/devices/rbd/4/block/rbd4/diskseq", "9\n");
    let write = on_remove(&k, "4 force");
    assert_eq!(
        unmap(&k, IMAGE, AttachStamp { diskseq: Some(9), record: None }, true).expect("unmapped"),
        StepOutcome::Done
    );
    assert_eq!(k.writes(), vec![write]);
}

#[test]
fn the_transient_ebusy_of_last_close_is_retried() {
    let k = incident1();
    let write = on_remove(&k, "4");
    k.fail(write.clone(), libc::EBUSY);
    assert_eq!(unmap(&k, IMAGE, PLANNED, false).expect("unmapped"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![write.clone(), write]);
}

#[test]
fn a_write_the_kernel_did_not_carry_out_is_not_verified() {
    let k = incident1();
    let e = unmap(&k, IMAGE, PLANNED, false).expect_err("still there");
    assert!(
        matches!(&e, ActError::NotVerified { device, op: "rbd remove", .. } if device.as_str() == "rbd4"),
        "{e:?}"
    );
    assert_eq!(k.writes().len(), 1);
}

#[test]
fn an_unmapped_id_is_already_absent() {
    let k = incident1();
    std::fs::remove_dir_all(k.path("sys/bus/rbd/devices/4")).expect("unmap");
    assert_eq!(unmap(&k, IMAGE, PLANNED, false).expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(k.writes(), vec![]);
}
