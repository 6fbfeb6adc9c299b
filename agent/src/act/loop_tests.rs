//! The loop step through the recording kernel: the binding re-check (diskseq, backing file,
//! device number) refuses a reused loop device with nothing written; the planned binding gets
//! exactly one `LOOP_CLR_FD`.

use super::*;
use crate::act::kernel::LoopBacking;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel, ScriptedNode};

const LOOP0: DevNum = DevNum { major: 7, minor: 0 };
/// The backing file's filesystem device and inode, as `LOOP_GET_STATUS64` gives them.
const BACKING: (DevNum, u64) = (DevNum { major: 8, minor: 1 }, 1_311_240);

fn loop0() -> DeviceName {
    DeviceName::new("loop0").expect("name")
}

/// `loop0` bound to `/var/lib/images/disk.img` (inode 1311240 on 8:1), diskseq 12: sysfs as
/// drivers/block/loop.c lays it out (the `loop/` group exists only while bound, each attribute
/// one line), and the node's ioctls.
fn bound_loop0() -> RecordingKernel {
    let k = RecordingKernel::new();
    let dir = "sys/devices/virtual/block/loop0";
    for (attr, text) in [
        ("dev", "7:0\n"),
        ("diskseq", "12\n"),
        ("size", "2097152\n"),
        ("loop/backing_file", "/var/lib/images/disk.img\n"),
        ("loop/offset", "0\n"),
        ("loop/sizelimit", "0\n"),
        ("loop/autoclear", "0\n"),
        ("loop/partscan", "0\n"),
        ("loop/dio", "0\n"),
    ] {
        k.file(&format!("{dir}/{attr}"), text);
    }
    k.link("sys/class/block/loop0", "../../devices/virtual/block/loop0");
    let backing = LoopBacking { device: BACKING.0, inode: BACKING.1 };
    k.node(
        "dev/loop0",
        ScriptedNode { diskseq: Some(12), loop_backing: Some(backing), ..ScriptedNode::block(LOOP0) },
    );
    k
}

fn detach(
    k: &RecordingKernel,
    diskseq: Option<u64>,
    backing: Option<(DevNum, u64)>,
) -> Result<StepOutcome, ActError> {
    k.actuator().detach_loop(&loop0(), LOOP0, diskseq, backing.map(|b| b.0), backing.map(|b| b.1))
}

/// The refusal for a binding that is not the planned one: a precondition naming the device.
fn assert_another_binding(r: Result<StepOutcome, ActError>) {
    let e = r.expect_err("another binding is refused");
    assert!(
        matches!(&e, ActError::Precondition { device, reason } if device.as_str() == "loop0" && reason.contains("now another binding than planned")),
        "{e:?}"
    );
    assert!(e.to_string().starts_with("loop0: precondition failed: loop0 is now another binding"), "{e}");
}

#[test]
fn a_loop_device_bound_to_another_file_is_left_alone() {
    let k = bound_loop0();
    let other_file = (BACKING.0, BACKING.1 + 1);
    assert_another_binding(detach(&k, None, Some(other_file)));
    assert!(
        k.calls().contains(&Call::LoopGetStatus(k.path("dev/loop0"))),
        "the binding was read: {:?}",
        k.calls()
    );
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn a_loop_device_bound_again_since_the_plan_is_left_alone() {
    // Same file, same inode, but a new binding: the diskseq moved on.
    let k = bound_loop0();
    assert_another_binding(detach(&k, Some(11), Some(BACKING)));
    assert!(k.calls().contains(&Call::DiskSeq(k.path("dev/loop0"))), "{:?}", k.calls());
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_node_that_is_another_device_is_refused_before_it_is_opened() {
    let k = bound_loop0();
    k.node("dev/loop0", ScriptedNode::block(DevNum::new(7, 1)));
    let e = detach(&k, Some(12), Some(BACKING)).expect_err("another device");
    assert!(e.to_string().starts_with("loop0: precondition failed: "), "{e}");
    assert!(e.to_string().ends_with("/dev/loop0 is not device 7:0"), "{e}");
    assert!(!k.calls().iter().any(|c| matches!(c, Call::Open(..))), "never opened: {:?}", k.calls());
    assert_eq!(k.writes(), vec![]);
}

/// A plan with no identity for the binding (no diskseq, no backing file device and inode) is
/// refused before the kernel is asked anything: the number may be bound to another file by now.
#[test]
fn a_detach_with_no_identity_to_check_is_refused() {
    let k = bound_loop0();
    let e = detach(&k, None, None).expect_err("refused");
    assert!(
        matches!(&e, ActError::Precondition { device, reason } if device.as_str() == "loop0" && reason.contains("no identity")),
        "{e:?}"
    );
    assert_eq!(k.calls(), vec![], "the kernel was not asked anything");
}

#[test]
fn the_planned_binding_is_cleared_once() {
    let k = bound_loop0();
    let node = k.path("dev/loop0");
    k.on(Call::LoopClear(node.clone()), vec![Effect::Remove(k.path("sys/devices/virtual/block/loop0/loop"))]);
    assert_eq!(detach(&k, Some(12), Some(BACKING)).expect("detached"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![Call::LoopClear(node)]);
}

#[test]
fn a_binding_another_opener_keeps_is_reported_deferred() {
    // LOOP_CLR_FD succeeds but only sets autoclear: sysfs still shows the backing file.
    let k = bound_loop0();
    let out = detach(&k, Some(12), Some(BACKING)).expect("accepted");
    assert!(matches!(&out, StepOutcome::Deferred(why) if why.contains("autoclear on loop0")), "{out:?}");
    assert_eq!(k.writes(), vec![Call::LoopClear(k.path("dev/loop0"))]);
}

#[test]
fn an_unbound_loop_device_is_already_absent() {
    // Gone from sysfs: nothing is opened.
    let k = bound_loop0();
    std::fs::remove_dir_all(k.path("sys/devices/virtual/block/loop0/loop")).expect("unbind");
    assert_eq!(detach(&k, Some(12), Some(BACKING)).expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(k.calls().len(), 1, "only the sysfs check: {:?}", k.calls());
    // Unbound between the sysfs check and the ioctl: LOOP_GET_STATUS64 says ENXIO.
    let k = bound_loop0();
    let node = k.path("dev/loop0");
    k.node("dev/loop0", ScriptedNode { diskseq: Some(12), ..ScriptedNode::block(LOOP0) });
    assert_eq!(detach(&k, Some(12), Some(BACKING)).expect("absent"), StepOutcome::AlreadyAbsent);
    assert!(k.calls().contains(&Call::LoopGetStatus(node)));
    assert_eq!(k.writes(), vec![]);
}
