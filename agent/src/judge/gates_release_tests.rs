//! Tests of the release gates: who uses a mount from which namespace (a thread is not its
//! process), what `--force-busy` covers, and what an unmount takes with it through propagation.

use super::*;
use crate::model::{BlockDevice, DevNum, DeviceKind};

fn entry(holders: Vec<Holder>) -> DeviceEntry {
    DeviceEntry::new(
        BlockDevice {
            diskseq: Some(1),
            ..BlockDevice::new(
                DeviceName::new("dm-0").expect("name"),
                DevNum::new(253, 0),
                DeviceKind::Dm,
                1 << 20,
            )
        },
        holders,
    )
}

fn process(kind: HolderKind, ns: u64, pid: u32) -> Holder {
    let mut h = Holder::bare(kind);
    h.pids = vec![pid];
    h.comm = Some("reader".into());
    h.process_state = Some('S');
    h.mount_namespace = Some(MountNsId(ns));
    h
}

fn with<'a>(expected_openers: &'a [u32], removed: &'a [DeviceName]) -> Releasing<'a> {
    Releasing { expected_openers, removed, force_busy: false }
}

/// A process holder counts in every namespace it uses the device from: a thread's own cwd in
/// the thread's namespace (named with its tid), the process's fds in each of its namespaces.
#[test]
fn mount_users_sees_a_thread_in_the_detached_namespace() {
    let mut thread_cwd = process(HolderKind::Cwd, 7, 5);
    thread_cwd.tid = Some(6);
    let why = mount_users(&entry(vec![thread_cwd]), &[MountNsId(7)], &with(&[], &[])).expect("refused");
    assert!(
        why.contains("pid 5 (reader) tid 6 has its working directory")
            && why.contains("in mount namespace 7"),
        "{why}"
    );
    let mut fds = process(HolderKind::OpenFile, 1, 5);
    fds.other_namespaces = vec![MountNsId(7)];
    let e = entry(vec![fds]);
    let why = mount_users(&e, &[MountNsId(7)], &with(&[], &[])).expect("its thread there reaches the fd");
    assert!(why.contains("(and 7, where it has tasks too)"), "{why}");
    assert_eq!(mount_users(&e, &[MountNsId(8)], &with(&[], &[])), None);
}

/// `--force-busy` covers what its help says, process users, and nothing the kernel holds.
#[test]
fn force_busy_lets_process_users_through_and_nothing_else() {
    let ns = [MountNsId(2)];
    let forced = Releasing { force_busy: true, ..Releasing::default() };
    let users = entry(vec![process(HolderKind::Cwd, 2, 5), process(HolderKind::Mmap, 2, 6)]);
    assert!(mount_users(&users, &ns, &Releasing::default()).is_some());
    assert_eq!(mount_users(&users, &ns, &forced), None);
    let mut swap = Holder::bare(HolderKind::Swap);
    swap.path = Some("/mnt/swapfile".into());
    let mut backing = Holder::bare(HolderKind::LoopBacking);
    backing.device = Some(DeviceName::new("loop9").expect("name"));
    let mut fs = Holder::bare(HolderKind::Filesystem);
    fs.fstype = Some("ext4".into());
    let mut layer = Holder::bare(HolderKind::StackedDevice);
    layer.device = Some(DeviceName::new("dm-3").expect("name"));
    for kernel in [swap, backing, fs, layer] {
        let e = entry(vec![process(HolderKind::Cwd, 2, 5), kernel.clone()]);
        let why = mount_users(&e, &ns, &forced).unwrap_or_else(|| panic!("{kernel:?} let through"));
        assert!(why.contains("--force-busy does not cover these") && !why.contains("pid 5"), "{why}");
        let why = mount_users(&e, &ns, &Releasing::default()).expect("refused");
        assert!(why.contains("pid 5") && why.contains("does not cover these"), "{why}");
    }
}

fn mount(ns: u64, id: u32, host: bool) -> Holder {
    let mut h = Holder::bare(HolderKind::Mount);
    h.mount_namespace = Some(MountNsId(ns));
    h.in_host_namespace = Some(host);
    h.mount_id = Some(id);
    h.mount_point = Some("/var/lib/kubelet/x".into());
    h
}

fn taken(ns: u64, id: u32, dev: DevNum) -> crate::graph::propagation::Taken {
    crate::graph::propagation::Taken {
        ns: MountNsId(ns),
        mount_id: id,
        devnum: dev,
        mount_point: "/var/lib/kubelet/x".into(),
        fstype: "ext4".into(),
        source: "/dev/x".into(),
        through_group: 4,
        through_parent: "/var/lib/kubelet".into(),
    }
}

/// What the unmount takes with it must be a releasable copy of the same device: not the
/// host's own mount, not another device's, not one in use, and the reach must be known.
#[test]
fn umount_propagation_takes_along_only_releasable_copies() {
    let dev = DevNum::new(253, 0);
    let host = MountNsId(1);
    let e = entry(vec![mount(1, 40, true), mount(2, 50, false), mount(3, 60, false)]);
    let go = |reach: Reach| umount_propagation(&e, host, (MountNsId(2), 50), &reach, &Releasing::default());
    assert_eq!(go(Ok(vec![])), None);
    assert_eq!(go(Ok(vec![taken(3, 60, dev)])), None, "another unused copy goes too");
    let why = go(Ok(vec![taken(1, 40, dev)])).expect("the host's own");
    assert!(
        why.contains("the host's own mount") && why.contains("shared:4") && why.contains("mount 40"),
        "{why}"
    );
    let why = go(Ok(vec![taken(3, 61, DevNum::new(7, 1))])).expect("another device");
    assert!(why.contains("another device's mount (7:1)") && why.contains("mount namespace 3"), "{why}");
    let why = go(Err("mount namespace 9 could not be read".into())).expect("blind");
    assert!(why.contains("cannot be told") && why.contains("namespace 9"), "{why}");
    // A copy the unmount takes is held to the users' rule of its own namespace.
    let used = entry(vec![mount(2, 50, false), mount(3, 60, false), process(HolderKind::Cwd, 3, 8)]);
    let reach = Ok(vec![taken(3, 60, dev)]);
    let why =
        umount_propagation(&used, host, (MountNsId(2), 50), &reach, &Releasing::default()).expect("used");
    assert!(why.contains("pid 8 (reader) has its working directory"), "{why}");
    let forced = Releasing { force_busy: true, ..Releasing::default() };
    assert_eq!(umount_propagation(&used, host, (MountNsId(2), 50), &reach, &forced), None);
}

/// The users a release exempts: only what its plan frees (moved from gates.rs).
mod exempt {
    use super::*;
    use crate::model::{BlockDevice, DeviceKind};

    fn entry(holders: Vec<Holder>) -> DeviceEntry {
        DeviceEntry::new(
            BlockDevice {
                diskseq: Some(1),
                ..BlockDevice::new(
                    DeviceName::new("dm-0").expect("name"),
                    DevNum::new(253, 0),
                    DeviceKind::Dm,
                    1 << 20,
                )
            },
            holders,
        )
    }

    fn process(kind: HolderKind, ns: u64, pid: u32, state: char) -> Holder {
        let mut h = Holder::bare(kind);
        h.pids = vec![pid];
        h.comm = Some("reader".into());
        h.process_state = Some(state);
        h.mount_namespace = Some(MountNsId(ns));
        h
    }

    fn with<'a>(expected_openers: &'a [u32], removed: &'a [DeviceName]) -> Releasing<'a> {
        Releasing { expected_openers, removed, force_busy: false }
    }

    #[test]
    fn mount_users_exempts_only_what_the_plan_frees() {
        let ns = [MountNsId(2)];
        // A reader stuck on a dead map, which stopping its queueing frees.
        let stuck = entry(vec![process(HolderKind::OpenDevice, 2, 9, 'D')]);
        assert_eq!(mount_users(&stuck, &ns, &with(&[9], &[])), None);
        assert!(mount_users(&stuck, &ns, &with(&[], &[])).is_some_and(|w| w.contains("pid 9 (reader)")));
        // A layer the plan removes after the releases.
        let mut layer = Holder::bare(HolderKind::StackedDevice);
        layer.device = Some(DeviceName::new("dm-1").expect("name"));
        let stacked = entry(vec![layer]);
        let dm1 = [DeviceName::new("dm-1").expect("name")];
        assert_eq!(mount_users(&stacked, &ns, &with(&[], &dm1)), None);
        assert!(mount_users(&stacked, &ns, &with(&[], &[])).is_some_and(|w| w.contains("dm-1 is stacked")));
        // A cwd elsewhere is not this release's concern; a cwd in its namespace is.
        let cwd = entry(vec![process(HolderKind::Cwd, 3, 5, 'S')]);
        assert_eq!(mount_users(&cwd, &ns, &with(&[], &[])), None);
        assert!(
            mount_users(&cwd, &[MountNsId(3)], &with(&[], &[])).is_some_and(|w| w.contains("--force-busy"))
        );
    }
}
