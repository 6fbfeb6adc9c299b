//! Discovery and judgement of orphaned pod volume directories on the fixture tree
//! `tests/fixtures/kubelet-orphans` (make-kubelet-orphans.py: a deleted pod's leftovers, a live
//! pod, a static pod, a force-deleted pod still running, node_exporter's private copy of a
//! volume's mount), copied to a scratch directory where the empty directories git cannot hold
//! are made (`.empty-dirs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;
use crate::discover::kubelet::pod_dirs::{self, Content, PodVolumeKind};
use crate::engine::world::LinuxWorld;
use crate::engine::{Engine, Settings};
use crate::host::clock::BootTime;
use crate::host::HostRoot;
use crate::kube::cluster::{PodInfo, WatchHealth};
use crate::kube::ClusterView;
use crate::snapshot::ScanOptions;

const GONE: &str = "9f1e6c2a-4b3d-4e5f-8a7b-6c5d4e3f2a1b";
const LIVE: &str = "2c4e6a8b-1d3f-4a5b-9c7d-0e1f2a3b4c5d";
const STATIC: &str = "6b1d8f2e9c4a7b3e5d0f1a2c3b4d5e6f";
const RUNNING: &str = "7e6d5c4b-3a29-4817-8f6e-5d4c3b2a1f0e";
const EXPORTER: &str = "5d1c7c2e-8a0b-11e8-9a3b-fa163e6f1a5c";

/// The fixture copied into a scratch directory, its empty directories made.
fn fixture() -> tempfile::TempDir {
    let from = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/kubelet-orphans");
    let to = tempfile::tempdir().expect("tempdir");
    crate::act::recording_kernel::copy_tree(&from, to.path());
    let list = std::fs::read_to_string(from.join(".empty-dirs")).expect(".empty-dirs");
    for dir in list.lines().filter(|l| !l.is_empty()) {
        std::fs::create_dir_all(to.path().join(dir)).expect("empty dir");
    }
    to
}

fn engine(root: &Path, pods: Option<Vec<PodInfo>>) -> Engine<LinuxWorld> {
    let world = LinuxWorld::new(HostRoot::new(root), ScanOptions::default(), Duration::from_secs(5));
    match pods {
        Some(pods) => {
            let now = BootTime::now();
            let view = ClusterView {
                node_name: "node-a".into(),
                synced: true,
                watches: ["pods", "volumeattachments", "persistentvolumes"]
                    .into_iter()
                    .map(|resource| WatchHealth { resource, synced: true, error: None, heard: Some(now) })
                    .collect(),
                node_found: Some(true),
                last_contact: Some(now),
                pods_on_node: pods,
                ..Default::default()
            };
            let (_tx, rx) = tokio::sync::watch::channel(view);
            let _ = world.cluster.set(rx);
        }
        None => {
            let _ = world.api_off.set("--no-kubernetes".into());
        }
    }
    Engine::new(world, Settings { grace: Duration::ZERO, ..Settings::default() })
}

fn api_pods() -> Vec<PodInfo> {
    let pod = |uid: &str, name: &str| PodInfo {
        uid: uid.into(),
        namespace: "shop".into(),
        name: name.into(),
        phase: "Running".into(),
        ..Default::default()
    };
    let mut mirror = pod("c0ffee00-0000-4000-8000-000000000001", "etcd-node-a");
    mirror.mirror_of = Some(STATIC.into());
    vec![pod(LIVE, "web-0"), pod(EXPORTER, "node-exporter-x7k2p"), mirror]
}

fn verdicts(r: &PodVolumeReport) -> Vec<(String, &'static str)> {
    r.dirs
        .iter()
        .map(|d| (d.evidence.entry.rel.display().to_string(), d.judgement.verdict.as_str()))
        .collect()
}

#[test]
fn the_walk_finds_every_volume_place_of_every_pod_with_what_it_holds() {
    let root = fixture();
    let dirs = pod_dirs::scan(&HostRoot::new(root.path()), Path::new("/var/lib/kubelet"), &|uid| uid != LIVE)
        .expect("scan");
    assert_eq!(dirs.kubelet_dir, Path::new("/var/lib/kubelet"));
    let gone = dirs.pod(GONE).expect("the deleted pod's directory");
    assert!(gone.etc_hosts);
    assert_eq!(gone.containers, ["app"]);
    let by_name =
        |n: &str| gone.volumes.iter().find(|v| v.name == n).unwrap_or_else(|| panic!("{n}: {gone:#?}"));
    let empty = by_name("pvc-empty");
    assert_eq!((empty.kind, empty.plugin.as_str()), (PodVolumeKind::Volume, "kubernetes.io/csi"));
    let base = PathBuf::from(format!("pods/{GONE}/volumes/kubernetes.io~csi/pvc-empty"));
    match &empty.content {
        Content::Empty { dirs } => {
            let order: Vec<&Path> = dirs.iter().map(|(p, _)| p.as_path()).collect();
            assert_eq!(order, [base.join("mount").as_path(), base.as_path()], "deepest first");
            assert_eq!(Some(dirs[1].1), empty.key, "the entry's own key last");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(empty.path, Path::new("/var/lib/kubelet").join(&base));
    match &by_name("pvc-full").content {
        Content::NotEmpty { entries, first } => {
            assert_eq!(*entries, 2);
            assert_eq!(first, &["vol_data.json (file)".to_owned()]);
        }
        other => panic!("{other:?}"),
    }
    match &by_name("pvc-block").content {
        Content::NotADirectory { kind: "symlink", target: Some(t) } => {
            assert!(t.ends_with(format!("publish/pvc-block/{GONE}")), "{t:?}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(by_name("pvc-block").kind, PodVolumeKind::Device);
    let sub = by_name("app/0");
    assert_eq!((sub.kind, sub.plugin.as_str()), (PodVolumeKind::Subpath, "data"));
    assert!(sub.content.is_empty_dir());
    assert!(
        matches!(&by_name("scratch").content, Content::NotEmpty { first, .. } if first[0] == "cache.db (file)")
    );
    let live = dirs.pod(LIVE).expect("live");
    assert!(live.etc_hosts && live.volumes.len() == 1);
    assert_eq!(live.volumes[0].content, Content::NotSurveyed, "a running pod's volumes are not looked into");
    assert!(live.volumes[0].key.is_some());
    assert_eq!(
        dirs.pods.len(),
        4,
        "GONE, LIVE, STATIC, RUNNING: {:?}",
        dirs.pods.iter().map(|p| &p.uid).collect::<Vec<_>>()
    );
    assert!(dirs.warnings.is_empty(), "{:?}", dirs.warnings);
}

#[test]
fn only_a_proven_orphaned_empty_directory_is_removable() {
    let root = fixture();
    let e = engine(root.path(), Some(api_pods()));
    let report = e.pod_volumes(&mut crate::judge::grace::Clocks::new(None));
    assert_eq!(report.error, None);
    let g = |rest: &str| format!("pods/{GONE}/{rest}");
    let mut want = vec![
        (g("volumeDevices/kubernetes.io~csi/pvc-block"), "kept"),
        (g("volume-subpaths/data/app/0"), "removable"),
        (g("volumes/kubernetes.io~csi/pvc-empty"), "removable"),
        (g("volumes/kubernetes.io~csi/pvc-full"), "kept"),
        (g("volumes/kubernetes.io~csi/pvc-mounted"), "mounted"),
        (g("volumes/kubernetes.io~empty-dir/scratch"), "kept"),
    ];
    want.sort();
    let mut got = verdicts(&report);
    got.sort();
    assert_eq!(got, want, "{:#?}", report.dirs.iter().map(|d| &d.judgement).collect::<Vec<_>>());
    // The live pod (API and node), the static pod (its mirror pod), the force-deleted pod
    // still running (its process): in use, not listed.
    assert_eq!(report.in_use, 3);
    let mounted = report.dirs.iter().find(|d| d.judgement.verdict == DirVerdict::Mounted).expect("mounted");
    assert_eq!(mounted.evidence.pins.len(), 1);
    let pin = &mounted.evidence.pins[0];
    assert_eq!((pin.namespace.0, pin.mount_id), (4026532700, 2892), "node_exporter's private copy");
    assert!(mounted.judgement.advice.as_deref().is_some_and(|a| a.contains("4026532700")));
    assert_eq!(mounted.argument, format!("pod-volume:{GONE}/volumes/kubernetes.io~csi/pvc-mounted"));
}

#[test]
fn without_the_api_nothing_is_orphaned() {
    let root = fixture();
    let e = engine(root.path(), None);
    let report = e.pod_volumes(&mut crate::judge::grace::Clocks::new(None));
    for d in &report.dirs {
        assert_eq!(d.judgement.verdict, DirVerdict::Unknown, "{}: {:?}", d.argument, d.judgement.reasons);
    }
    // GONE's six, and STATIC's: nothing of it runs here and no API says it is on the node.
    assert_eq!(report.dirs.len(), 7, "{:?}", verdicts(&report));
    assert!(report
        .dirs
        .iter()
        .all(|d| d.evidence.entry.pod_uid != LIVE && d.evidence.entry.pod_uid != RUNNING));
    assert_eq!(report.in_use, 2, "the pods whose processes run here");
}
