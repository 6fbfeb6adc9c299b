//! Tests of planning: release, clean by kind, teardown of a dead map.

use super::release::{detached_namespaces, release, release_with};
use crate::discover::namespaces::NsEntry;
use crate::graph::{DeviceEntry, Holder};
use crate::model::opt_ins::ReleaseOptions;
use crate::model::DevNum;
use crate::model::{DeviceName, HolderKind, MountNsId};

const DEV: DevNum = DevNum { major: 7, minor: 3 };

fn mount(ns: u64, shared: Option<u32>, master: Option<u32>) -> Holder {
    let mut h = Holder::bare(HolderKind::Mount);
    h.pids = vec![100 + ns as u32];
    h.mount_namespace = Some(MountNsId(ns));
    h.in_host_namespace = Some(ns == 1);
    h.mount_id = Some(40 + ns as u32);
    h.mount_dev = Some(DEV);
    h.mount_point = Some("/mnt/x".into());
    h.shared_group = shared;
    h.master_group = master;
    h.namespace_entry = Some(NsEntry::Task { pid: 100 + ns as u32, tid: 100 + ns as u32 });
    h
}

fn user(kind: HolderKind, ns: Option<u64>, pid: u32) -> Holder {
    let mut h = Holder::bare(kind);
    h.pids = vec![pid];
    h.pid_count = 1;
    h.comm = Some("db".into());
    h.mount_namespace = ns.map(MountNsId);
    h.in_host_namespace = ns.map(|n| n == 1);
    h.path = Some("/mnt/x/db".into());
    h
}

fn entry(holders: Vec<Holder>) -> DeviceEntry {
    crate::graph::test_support::loop3(holders)
}

fn forced() -> ReleaseOptions {
    ReleaseOptions { force_busy: Some("ticket 42: the pod is gone".into()) }
}

#[test]
fn a_release_is_refused_while_a_process_in_the_namespace_uses_the_mount() {
    for kind in
        [HolderKind::Cwd, HolderKind::OpenFile, HolderKind::Mmap, HolderKind::Root, HolderKind::OpenDevice]
    {
        let e = entry(vec![mount(2, None, None), user(kind, Some(2), 777)]);
        let p = release_with(&e, &ReleaseOptions::default());
        assert!(p.steps.is_empty(), "{kind:?}: {p:?}");
        let why = p.refusal.as_deref().unwrap_or_default();
        assert!(why.contains("pid 777 (db)") && why.contains("mount namespace 2"), "{kind:?}: {why}");
        assert!(why.contains("--force-busy") && why.contains("stop those processes"), "{why}");
        // Forced: the step is planned, and the plan says why and what it breaks.
        let p = release_with(&e, &forced());
        assert_eq!(p.steps.len(), 1, "{kind:?}: {p:?}");
        assert_eq!(p.force_busy.as_deref(), Some("ticket 42: the pod is gone"));
        assert!(p.notes.iter().any(|n| n.contains("ticket 42") && n.contains("pid 777")), "{:?}", p.notes);
    }
}

#[test]
fn users_with_no_namespace_or_an_unknown_one_refuse_too() {
    let mut swap = Holder::bare(HolderKind::Swap);
    swap.path = Some("/mnt/x/swapfile".into());
    let mut lb = Holder::bare(HolderKind::LoopBacking);
    lb.device = Some(DeviceName::new("loop9").expect("name"));
    let mut st = Holder::bare(HolderKind::StackedDevice);
    st.device = Some(DeviceName::new("dm-4").expect("name"));
    for h in [swap.clone(), lb.clone(), st.clone(), user(HolderKind::OpenFile, None, 5)] {
        let p = release_with(&entry(vec![mount(2, None, None), h.clone()]), &ReleaseOptions::default());
        assert!(p.refusal.is_some() && p.steps.is_empty(), "{h:?}: {p:?}");
    }
    // --force-busy covers processes (even one whose namespace is unknown), not what the kernel
    // holds: swap, a loop backing file, a stacked device still refuse, and say so.
    let p = release_with(&entry(vec![mount(2, None, None), user(HolderKind::OpenFile, None, 5)]), &forced());
    assert!(p.refusal.is_none() && p.steps.len() == 1, "{p:?}");
    for h in [swap, lb, st] {
        let p = release_with(
            &entry(vec![mount(2, None, None), user(HolderKind::Cwd, Some(2), 7), h.clone()]),
            &forced(),
        );
        let why = p.refusal.as_deref().unwrap_or_default();
        assert!(p.steps.is_empty() && why.contains("--force-busy does not cover these"), "{h:?}: {p:?}");
        assert!(p.force_busy.is_none(), "a refused plan keeps no override: {p:?}");
    }
}

#[test]
fn a_user_in_a_namespace_the_release_does_not_touch_does_not_refuse_it() {
    // The host's own mount and a process using it there; a leaked copy in namespace 2.
    let e = entry(vec![mount(1, None, None), user(HolderKind::Cwd, Some(1), 5), mount(2, None, None)]);
    let p = release_with(&e, &ReleaseOptions::default());
    assert_eq!(p.refusal, None, "{p:?}");
    assert_eq!(p.steps.len(), 1);
    assert!(p.force_busy.is_none() && p.notes.is_empty());
    // A process in namespace 3, whose only mount is a slave copy of the host's (left alone).
    let e = entry(vec![
        mount(1, Some(5), None),
        mount(2, None, None),
        mount(3, None, Some(5)),
        user(HolderKind::Mmap, Some(3), 6),
    ]);
    let p = release_with(&e, &ReleaseOptions::default());
    assert_eq!(p.refusal, None, "{p:?}");
    assert_eq!(detached_namespaces(&p), [MountNsId(2)]);
}

#[test]
fn nothing_to_detach_is_not_refused_for_users() {
    let e = entry(vec![mount(1, None, None), user(HolderKind::Cwd, Some(1), 5)]);
    let p = release_with(&e, &ReleaseOptions::default());
    assert!(p.refusal.is_none() && p.steps.is_empty(), "{p:?}");
}

#[test]
fn a_slave_of_a_slave_of_the_host_is_left_alone() {
    // Host shared:5 -> A shared:7 master:5 -> B master:7; C a private leak.
    let e = entry(vec![
        mount(1, Some(5), None),
        mount(2, Some(7), Some(5)),
        mount(3, None, Some(7)),
        mount(4, None, None),
    ]);
    let p = release(&e);
    assert_eq!(detached_namespaces(&p), [MountNsId(4)], "{p:?}");
    let b = p.left_alone.iter().find(|l| l.holder.mount_namespace == Some(MountNsId(3))).expect("B");
    assert!(b.reason.contains("slave copy (master:7)"), "{}", b.reason);
}

#[test]
fn a_dead_maps_teardown_keeps_its_own_holder_rules() {
    // plan::release::release itself (what the teardowns build on) plans the detach: the teardown's
    // own checks decide about the users.
    let e = entry(vec![mount(2, None, None), user(HolderKind::Cwd, Some(2), 777)]);
    assert_eq!(release(&e).steps.len(), 1);
}
