//! The mount step through the recording kernel: a namespace entry that now enters another
//! namespace (PID reuse, another nsfs inode), a mount ID that is now another device, or a mount
//! with mounts beneath it refuses the detach with nothing written; the planned mount gets
//! exactly one detach, in its namespace, from the planned root.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel, ScriptedNode};

/// A container's mount table as the kernel writes it (`/proc/PID/task/TID/mountinfo`): its
/// overlay root and a CSI volume mounted at `/data` (mount 2345, nvme2n1 259:4).
const ROOT_LINE: &str = "1544 1320 0:312 / / rw,relatime master:1 - overlay overlay rw,lowerdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/41/fs,upperdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/57/fs,workdir=/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/57/work\n";
const DATA_LINE: &str = "2345 1544 259:4 / /data rw,relatime master:310 - ext4 /dev/nvme2n1 rw\n";
const NS: MountNsId = MountNsId(4_026_532_301);
const TASK: &str = "proc/4242/task/4242";
const DATA_DEV: DevNum = DevNum { major: 259, minor: 4 };

fn nvme2n1() -> DeviceName {
    DeviceName::new("nvme2n1").expect("name")
}

fn task() -> NsEntry {
    NsEntry::Task { pid: 4242, tid: 4242 }
}

/// A live `/proc` with task 4242 in namespace 4026532301 and the container's table.
fn container(mountinfo: &str) -> RecordingKernel {
    let k = RecordingKernel::new();
    k.live_proc();
    k.link(&format!("{TASK}/ns/mnt"), "mnt:[4026532301]");
    k.file(&format!("{TASK}/mountinfo"), mountinfo);
    std::fs::create_dir_all(k.path(&format!("{TASK}/root"))).expect("root");
    k
}

fn detach(k: &RecordingKernel, via: &NsEntry, dev: DevNum) -> Result<StepOutcome, ActError> {
    k.actuator().detach_mount(&nvme2n1(), dev, NS, via, 2345)
}

fn assert_refused(r: Result<StepOutcome, ActError>, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device, .. } if device.as_str() == "nvme2n1"), "{e:?}");
    assert!(e.to_string().starts_with("nvme2n1: precondition failed: "), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn a_task_now_in_another_namespace_is_not_entered() {
    // PID 4242 exited and was reused by a process of another namespace.
    let k = container(&format!("{ROOT_LINE}{DATA_LINE}"));
    std::fs::remove_file(k.path(&format!("{TASK}/ns/mnt"))).expect("rm");
    k.link(&format!("{TASK}/ns/mnt"), "mnt:[4026532999]");
    assert_refused(
        detach(&k, &task(), DATA_DEV),
        "pid 4242 is now in namespace 4026532999 not 4026532301: PID reused?",
    );
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn an_nsfs_file_of_another_namespace_is_not_entered() {
    let k = container("");
    let nsfs = k.path("run/netns/cni-1");
    k.node("run/netns/cni-1", ScriptedNode::namespace(4_026_532_777));
    let via = NsEntry::Nsfs { path: nsfs.clone() };
    let why = format!("nsfs {} is now in namespace 4026532777 not 4026532301", nsfs.display());
    assert_refused(detach(&k, &via, DATA_DEV), &why);
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_mount_id_that_is_now_another_device_is_left_alone() {
    let k = container(&format!("{ROOT_LINE}{}", DATA_LINE.replace("259:4", "259:7")));
    assert_refused(detach(&k, &task(), DATA_DEV), "mount 2345 is now device 259:7 at /data, not 259:4");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_mount_with_mounts_beneath_it_is_left_alone() {
    let beneath = "2400 2345 0:55 / /data/cache rw,relatime - tmpfs tmpfs rw\n";
    let k = container(&format!("{ROOT_LINE}{DATA_LINE}{beneath}"));
    assert_refused(detach(&k, &task(), DATA_DEV), "1 mount(s) sit beneath /data (first: /data/cache)");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_host_tree_that_is_not_this_process_s_proc_is_never_entered() {
    let k = container(&format!("{ROOT_LINE}{DATA_LINE}"));
    std::fs::remove_file(k.path("proc/self")).expect("rm");
    assert_refused(detach(&k, &task(), DATA_DEV), "is not this host's /proc: namespaces cannot be entered");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_mount_is_detached_once_from_the_task_s_root() {
    let k = container(&format!("{ROOT_LINE}{DATA_LINE}"));
    let unmount = Call::Unmount {
        ns_file: k.path(&format!("{TASK}/ns/mnt")),
        root: Some(k.path(&format!("{TASK}/root"))),
        rel: "data".into(),
        mount_id: 2345,
    };
    k.on(unmount.clone(), vec![Effect::WriteFile(k.path(&format!("{TASK}/mountinfo")), ROOT_LINE.into())]);
    assert_eq!(detach(&k, &task(), DATA_DEV).expect("detached"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![unmount]);
}

#[test]
fn the_planned_mount_of_an_entered_namespace_is_detached_once_from_its_root() {
    let k = container("");
    let nsfs = k.path("run/netns/cni-1");
    k.node("run/netns/cni-1", ScriptedNode::namespace(NS.0));
    k.mountinfo_in(&nsfs, &format!("{ROOT_LINE}{DATA_LINE}"));
    let unmount = Call::Unmount { ns_file: nsfs.clone(), root: None, rel: "data".into(), mount_id: 2345 };
    k.on(unmount.clone(), vec![Effect::MountinfoIn(nsfs.clone(), ROOT_LINE.into())]);
    let via = NsEntry::Nsfs { path: nsfs };
    assert_eq!(detach(&k, &via, DATA_DEV).expect("detached"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![unmount]);
}

#[test]
fn a_detach_the_kernel_did_not_carry_out_is_not_verified() {
    let k = container(&format!("{ROOT_LINE}{DATA_LINE}"));
    let e = detach(&k, &task(), DATA_DEV).expect_err("still mounted");
    assert!(matches!(&e, ActError::NotVerified { op: "umount2(MNT_DETACH)", .. }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "nvme2n1: umount2(MNT_DETACH) reported success but mount 2345 is still in namespace 4026532301"
    );
    assert_eq!(k.writes().len(), 1);
}

#[test]
fn a_mount_that_is_gone_is_already_absent() {
    let k = container(ROOT_LINE);
    assert_eq!(detach(&k, &task(), DATA_DEV).expect("absent"), StepOutcome::AlreadyAbsent);
    assert!(k.calls().contains(&Call::Read(k.path(&format!("{TASK}/mountinfo")))));
    assert_eq!(k.writes(), vec![]);
}
