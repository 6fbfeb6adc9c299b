//! The verdicts on pod volume directories, from evidence built by hand (the engine's tests
//! gather it from a fixture kubelet directory): each proof missing in turn.

use std::path::PathBuf;
use std::time::Duration;

use super::*;
use crate::discover::kubelet::pod_dirs::PodVolumeKind;
use crate::host::beneath::FileKey;
use crate::kube::cluster::{PodInfo, WatchHealth};
use crate::model::{DevNum, KernelText, MountNsId};

const UID: &str = "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e";

fn at(s: u64) -> BootTime {
    BootTime::from_since_boot(Duration::from_secs(s))
}

fn key(ino: u64) -> FileKey {
    FileKey { dev: DevNum::new(254, 1), ino }
}

fn evidence(content: Content) -> DirEvidence {
    let rel = PathBuf::from(format!("pods/{UID}/volumes/kubernetes.io~csi/pvc-1"));
    DirEvidence {
        entry: PodVolumeEntry {
            pod_uid: UID.into(),
            kind: PodVolumeKind::Volume,
            path: PathBuf::from("/var/lib/kubelet").join(&rel),
            rel,
            plugin: "kubernetes.io/csi".into(),
            name: "pvc-1".into(),
            key: Some(key(10)),
            content,
        },
        etc_hosts: true,
        containers: vec!["app".into()],
        pod_pids: Vec::new(),
        pod_rooted: Vec::new(),
        pins: Vec::new(),
        mounts_unknown: Vec::new(),
        pod_unknown: Vec::new(),
        namespaces: 7,
    }
}

fn empty() -> Content {
    Content::Empty {
        dirs: vec![(PathBuf::from(format!("pods/{UID}/volumes/kubernetes.io~csi/pvc-1")), key(10))],
    }
}

/// A view that vouches at 100 s, with the pods given.
fn view(pods: Vec<PodInfo>) -> ClusterView {
    ClusterView {
        node_name: "node-a".into(),
        synced: true,
        watches: ["pods", "volumeattachments", "persistentvolumes"]
            .into_iter()
            .map(|resource| WatchHealth { resource, synced: true, error: None, heard: Some(at(100)) })
            .collect(),
        node_found: Some(true),
        last_contact: Some(at(100)),
        pods_on_node: pods,
        ..Default::default()
    }
}

fn input(api: Option<&ClusterView>) -> OrphanInput<'_> {
    OrphanInput {
        api,
        api_off: "--no-kubernetes",
        now: at(100),
        grace: Duration::from_secs(60),
        max_gap: Duration::from_secs(120),
    }
}

fn pin(reach: Reach) -> Pin {
    Pin {
        namespace: MountNsId(4026532841),
        mount_id: 1502,
        mount_point: KernelText::from_bytes(
            b"/host/var/lib/kubelet/pods/x/volumes/kubernetes.io~csi/pvc-1/mount".to_vec(),
        ),
        root: KernelText::from_bytes(b"/".to_vec()),
        devnum: DevNum::new(7, 3),
        fstype: KernelText::from_bytes(b"ext4".to_vec()),
        source: KernelText::from_bytes(b"/dev/loop3".to_vec()),
        reach,
    }
}

#[test]
fn proven_orphaned_and_empty_is_pending_then_removable_after_the_grace_period() {
    let v = view(Vec::new());
    let ev = evidence(empty());
    let mut clocks = Clocks::new(None);
    let j = judge(&ev, &input(Some(&v)), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Pending, "{:?}", j.reasons);
    assert!(
        j.reasons[0].contains(&format!("no pod with UID {UID} is on node node-a per the API")),
        "{:?}",
        j.reasons
    );
    assert!(j
        .reasons
        .iter()
        .any(|r| r.contains("nothing is mounted at or below it in any of the 7 mount namespaces")));
    let later = OrphanInput { now: at(161), ..input(Some(&v)) };
    let mut v2 = view(Vec::new());
    for w in &mut v2.watches {
        w.heard = Some(at(160));
    }
    v2.last_contact = Some(at(160));
    let later = OrphanInput { api: Some(&v2), ..later };
    let j = judge(&ev, &later, &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Removable, "{:?}", j.reasons);
    assert_eq!(j.advice, None);
}

#[test]
fn no_api_word_no_orphan_verdict() {
    let mut clocks = Clocks::new(None);
    let ev = evidence(empty());
    let j = judge(&ev, &input(None), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Unknown);
    assert!(j.reasons[0].contains("(it is not asked: --no-kubernetes)"), "{:?}", j.reasons);
    let silent = view(Vec::new());
    let late = OrphanInput { now: at(1000), ..input(Some(&silent)) };
    let j = judge(&ev, &late, &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Unknown);
    assert!(j.reasons[0].contains("has not answered"), "{:?}", j.reasons);
}

#[test]
fn a_pod_on_the_node_per_the_api_or_per_the_node_is_in_use() {
    let mut clocks = Clocks::new(None);
    let ev = evidence(empty());
    let pod = PodInfo {
        uid: UID.into(),
        namespace: "shop".into(),
        name: "web-0".into(),
        phase: "Running".into(),
        ..Default::default()
    };
    let j = judge(&ev, &input(Some(&view(vec![pod]))), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::InUse);
    assert!(j.reasons[0].contains("pod shop/web-0"), "{:?}", j.reasons);
    // A static pod: its mirror pod names the UID kubelet knows it by.
    let hash = "6b1d8f2e9c4a7b3e5d0f1a2c3b4d5e6f";
    let mirror = PodInfo {
        uid: "other".into(),
        mirror_of: Some(hash.into()),
        name: "etcd-node-a".into(),
        ..Default::default()
    };
    let mut s = evidence(empty());
    s.entry.pod_uid = hash.into();
    assert_eq!(judge(&s, &input(Some(&view(vec![mirror]))), &mut clocks).verdict, DirVerdict::InUse);
    // A process of the pod, whatever the API says (a force-deleted pod still running).
    let mut p = evidence(empty());
    p.pod_pids = vec![4242];
    let j = judge(&p, &input(Some(&view(Vec::new()))), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::InUse);
    assert!(j.reasons[0].contains("pid 4242"), "{:?}", j.reasons);
    // A container's bind mount of the pod's etc-hosts.
    let mut r = evidence(empty());
    r.pod_rooted = vec![pin(Reach::Rooted)];
    assert_eq!(judge(&r, &input(Some(&view(Vec::new()))), &mut clocks).verdict, DirVerdict::InUse);
    // Processes that could not be read: unknown.
    let mut u = evidence(empty());
    u.pod_unknown = vec!["/proc/77/cgroup: Permission denied".into()];
    assert_eq!(judge(&u, &input(Some(&view(Vec::new()))), &mut clocks).verdict, DirVerdict::Unknown);
}

#[test]
fn mounted_anywhere_or_not_knowable_is_never_removable() {
    let mut clocks = Clocks::new(None);
    let v = view(Vec::new());
    let mut m = evidence(empty());
    m.pins = vec![pin(Reach::At)];
    let j = judge(&m, &input(Some(&v)), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Mounted);
    assert!(
        j.reasons.last().is_some_and(|r| r.contains("still mounted: mount 1502 of ext4 /dev/loop3")),
        "{:?}",
        j.reasons
    );
    assert!(j.advice.as_deref().is_some_and(|a| a.contains("never `rm -rf` it")), "{:?}", j.advice);
    let mut u = evidence(empty());
    u.mounts_unknown = vec!["mount namespace 4026532900: Permission denied".into()];
    let j = judge(&u, &input(Some(&v)), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Unknown);
    assert!(
        j.reasons.last().is_some_and(|r| r.contains("cannot tell whether anything is mounted")),
        "{:?}",
        j.reasons
    );
}

#[test]
fn orphaned_but_not_empty_is_kept_with_what_to_check() {
    let mut clocks = Clocks::new(None);
    let v = view(Vec::new());
    let full = evidence(Content::NotEmpty {
        entries: 2,
        first: vec!["vol_data.json (file)".into(), "mount/".into()],
    });
    let j = judge(&full, &input(Some(&v)), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Kept);
    assert!(j.advice.as_deref().is_some_and(|a| a.contains("NodeUnpublishVolume")), "{:?}", j.advice);
    let mut link = evidence(Content::NotADirectory { kind: "symlink", target: Some("/dev/loop3".into()) });
    link.entry.kind = PodVolumeKind::Device;
    let j = judge(&link, &input(Some(&v)), &mut clocks);
    assert_eq!(j.verdict, DirVerdict::Kept);
    assert!(j.reasons.last().is_some_and(|r| r.contains("a symlink to /dev/loop3")), "{:?}", j.reasons);
    let here = evidence(Content::MountedHere { at: "mount".into() });
    assert_eq!(judge(&here, &input(Some(&v)), &mut clocks).verdict, DirVerdict::Mounted);
    // A clock never runs for what is not a candidate: an empty one judged again starts afresh.
    assert_eq!(judge(&evidence(empty()), &input(Some(&v)), &mut clocks).verdict, DirVerdict::Pending);
}
