//! The NVMe controller deletion through the recording kernel, on the `nvme-tcp-guest` tree
//! (`nvme2`: subsystem `...:nvme-lost`, tcp 127.0.0.1:4421, cntlid 3, connecting, head
//! `nvme2n1`; `nvme0` and `nvme1`: the two live paths of `...:nvme-live`): a controller name
//! reused by another connect, a live one, or one whose namespaces are in use refuses the step
//! with nothing written; the planned one gets exactly its `delete_controller` write.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel};
use crate::discover::probe::{Claim, KernelWord};

const LOST: &str = "nqn.2026-11.io.blockjanitor:nvme-lost";
const LIVE: &str = "nqn.2026-11.io.blockjanitor:nvme-live";

fn name(n: &str) -> DeviceName {
    DeviceName::new(n).expect("name")
}

fn delete(
    k: &RecordingKernel,
    controller: &str,
    subsysnqn: &str,
    address: &str,
    cntlid: u16,
) -> Result<StepOutcome, ActError> {
    let action = Action::NvmeDeleteController {
        controller: controller.into(),
        subsysnqn: subsysnqn.into(),
        transport: "tcp".into(),
        address: address.into(),
        cntlid: Some(cntlid),
    };
    k.actuator().nvme_delete_step(&name("nvme2n1"), &action)
}

/// The planned `nvme2`, as the scan saw it.
fn delete_nvme2(k: &RecordingKernel) -> Result<StepOutcome, ActError> {
    delete(k, "nvme2", LOST, "traddr=127.0.0.1,trsvcid=4421", 3)
}

fn assert_refused(r: Result<StepOutcome, ActError>, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device, .. } if device.as_str() == "nvme2n1"), "{e:?}");
    assert!(e.to_string().starts_with("nvme2n1: precondition failed: "), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn a_controller_name_taken_by_another_connect_is_left_alone() {
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    let r = delete(&k, "nvme2", LOST, "traddr=127.0.0.1,trsvcid=4421", 7);
    let why = format!("nvme2 is now tcp traddr=127.0.0.1,trsvcid=4421 of subsystem {LOST} (cntlid 3), not the planned controller (tcp traddr=127.0.0.1,trsvcid=4421 of {LOST}, cntlid 7): its name was reused");
    assert_refused(r, &why);
    let r = delete(&k, "nvme2", LIVE, "traddr=127.0.0.1,trsvcid=4421", 3);
    assert_refused(r, &format!("nvme2 is now tcp traddr=127.0.0.1,trsvcid=4421 of subsystem {LOST} (cntlid 3), not the planned controller"));
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn a_live_controller_is_never_deleted() {
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    let r = delete(&k, "nvme0", LIVE, "traddr=127.0.0.1,trsvcid=4420", 1);
    assert_refused(r, "controller nvme0 is live again: a live controller is never deleted");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_controller_whose_subsystem_has_a_live_path_is_left_alone() {
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    k.file("sys/devices/virtual/nvme-fabrics/ctl/nvme1/state", "connecting\n");
    let r = delete(&k, "nvme1", LIVE, "traddr=127.0.0.1,trsvcid=4422", 2);
    assert_refused(r, "not deleting nvme1: controller nvme0 of the same subsystem is live");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_controller_whose_namespace_is_in_use_is_left_alone() {
    // The kernel says a filesystem lives on the head.
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    k.file("dev/nvme2n1", "");
    let fs = "ext4 at /sys/fs/ext4/nvme2n1".to_owned();
    let word = KernelWord {
        claim: Claim::Claimed,
        sysfs_holders: Vec::new(),
        live_filesystems: vec![fs],
        loops_on_top: Vec::new(),
        dm_open_count: None,
        unreadable: Vec::new(),
    };
    k.word("nvme2n1", word);
    assert_refused(delete_nvme2(&k), "not deleting nvme2: nvme2n1: an exclusive open fails with EBUSY: something claims it; nvme2n1: a filesystem lives on it (ext4 at /sys/fs/ext4/nvme2n1)");
    assert!(k.calls().contains(&Call::KernelWord("nvme2n1".into())), "{:?}", k.calls());
    assert_eq!(k.writes(), vec![]);
    // Or sysfs lists a holder of it.
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    std::fs::create_dir_all(k.path("sys/class/block/nvme2n1/holders/dm-4")).expect("holder");
    assert_refused(delete_nvme2(&k), "not deleting nvme2: nvme2n1: sysfs holders/ lists dm-4");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_controller_is_deleted_with_one_write() {
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    let write = Call::Write { path: k.path("sys/class/nvme/nvme2/delete_controller"), text: "1\n".into() };
    let gone = ["sys/class/nvme/nvme2", "sys/devices/virtual/nvme-fabrics/ctl/nvme2"];
    k.on(write.clone(), gone.iter().map(|p| Effect::Remove(k.path(p))).collect());
    assert_eq!(delete_nvme2(&k).expect("deleted"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![write]);
}

#[test]
fn a_controller_that_is_gone_is_already_absent() {
    let k = RecordingKernel::fixture("nvme-tcp-guest");
    let r = delete(&k, "nvme7", LOST, "traddr=127.0.0.1,trsvcid=4421", 3);
    assert_eq!(r.expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(k.writes(), vec![]);
}
