//! Unit tests of the sweep (console/src/sweep.rs).

use super::*;
use crate::index::Index;

fn rbd(name: &str, image: &str, verdict: pb::Verdict, held: bool) -> pb::Device {
    pb::Device {
        name: name.into(),
        kind: pb::DeviceKind::Rbd as i32,
        verdict: verdict as i32,
        holders: if held {
            vec![pb::Holder { description: "mounted at /var/lib/kubelet/x".into(), ..Default::default() }]
        } else {
            vec![]
        },
        rbd: Some(pb::RbdMapping {
            pool: "k8s".into(),
            image: image.into(),
            snap: "-".into(),
            client_id: format!("client.{}", name.len() * 1000),
            client_addr: "10.0.0.9:0/77".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An index with `nodes` (name, answering?, devices).
fn index(nodes: Vec<(&str, bool, Vec<pb::Device>)>) -> Index {
    let ix = Index::new();
    {
        let mut w = ix.write();
        for (n, up, devs) in nodes {
            w.upsert_node(n, "127.0.0.1:1", "static", (!up).then_some("connection refused"));
            w.replace_devices(n, devs);
            if let Some(e) = w.nodes.get_mut(n) {
                e.reachable = up;
                e.synced = true;
            }
        }
    }
    ix
}

fn run(ix: &Index, kube: Option<&KubeView>) -> pb::SweepResponse {
    let r = ix.read();
    sweep(&r, kube, r.missing(), &[])
}

fn kinds(r: &pb::SweepResponse) -> Vec<(&'static str, String, Vec<String>)> {
    r.findings
        .iter()
        .map(|f| {
            (
                kind_name(pb::FindingKind::try_from(f.kind).unwrap_or_default()),
                f.volume.clone(),
                f.nodes.clone(),
            )
        })
        .collect()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| (*x).to_owned()).collect()
}

#[test]
fn a_volume_on_two_nodes_and_a_stale_mapping_are_found_and_the_answer_is_complete() {
    let ix = index(vec![
        ("a", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)]),
        ("b", true, vec![rbd("rbd4", "db", pb::Verdict::Stale, false)]),
        ("c", true, vec![rbd("rbd1", "web", pb::Verdict::InUse, true)]),
    ]);
    let r = run(&ix, None);
    assert_eq!(
        kinds(&r),
        vec![
            ("multi_node", "k8s/db".to_owned(), s(&["a", "b"])),
            ("attached_not_in_use", "k8s/db".to_owned(), s(&["b"])),
        ]
    );
    assert!(r.complete);
    assert_eq!(r.volumes, 2);
    assert_eq!(r.counts.get("multi_node"), Some(&1));
    assert_eq!(r.counts.get("dead_node_watcher"), Some(&0));
    assert!(r.findings[0].detail.contains("a (rbd0 mounted at"), "{}", r.findings[0].detail);
    assert!(r.summary.starts_with("2 finding(s); every node answered"), "{}", r.summary);
}

#[test]
fn a_node_that_does_not_answer_makes_the_sweep_incomplete_never_clean() {
    let ix = index(vec![
        ("a", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)]),
        ("dead", false, vec![rbd("rbd2", "logs", pb::Verdict::InUse, true)]),
    ]);
    let r = run(&ix, None);
    assert!(!r.complete);
    assert_eq!(kinds(&r), vec![("dead_node_watcher", "k8s/logs".to_owned(), s(&["dead"]))]);
    assert_eq!(r.findings[0].clients, ["client.4000 10.0.0.9:0/77"]);
    assert!(r.summary.starts_with("incomplete: 1 node(s) did not answer (dead)"), "{}", r.summary);
    assert!(!r.summary.contains("clean"), "{}", r.summary);
    assert_eq!(r.missing_nodes[0].node, "dead");

    // The same fleet with nothing to find anywhere still is incomplete while a node is missing.
    let ix = index(vec![("a", true, vec![]), ("dead", false, vec![])]);
    let r = run(&ix, None);
    assert!(r.findings.is_empty() && !r.complete);
    assert!(r.summary.starts_with("incomplete:"), "{}", r.summary);
    let ix = index(vec![("a", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)])]);
    let r = run(&ix, None);
    assert!(r.complete && r.findings.is_empty());
    assert!(r.summary.starts_with("clean:"), "{}", r.summary);
}

#[test]
fn snapshots_unknown_verdicts_and_filters() {
    let mut snap = rbd("rbd0", "db", pb::Verdict::InUse, true);
    if let Some(r) = snap.rbd.as_mut() {
        r.snap = "daily".into();
    }
    let ix = index(vec![
        ("a", true, vec![snap.clone(), rbd("rbd1", "x", pb::Verdict::Unknown, false)]),
        ("b", true, vec![snap]),
    ]);
    let r = run(&ix, None);
    assert!(r.findings.is_empty(), "a read-only snapshot on two nodes, an unknown verdict: {r:#?}");
    assert!(!r.complete, "an agent that cannot vouch for a device: never clean");
    assert!(
        r.summary
            .starts_with("incomplete: the agents cannot vouch for 1 device(s) (verdict unknown): a/rbd1"),
        "{}",
        r.summary
    );

    let ix = index(vec![
        ("a", true, vec![rbd("rbd0", "db", pb::Verdict::Stale, false)]),
        ("b", true, vec![rbd("rbd0", "db", pb::Verdict::Stale, false)]),
    ]);
    let r = ix.read();
    let only = sweep(&r, None, r.missing(), &[pb::FindingKind::MultiNode]);
    assert_eq!(only.findings.len(), 1);
    assert_eq!(only.counts.len(), 1, "{:?}", only.counts);
}

#[test]
fn a_multipath_map_counts_once_and_its_paths_do_not_hide_it() {
    let path = |n: &str| pb::Device {
        name: n.into(),
        wwid: "3600A0B8".into(),
        verdict: pb::Verdict::InUse as i32,
        stacked_on_top: vec!["dm-3".into()],
        ..Default::default()
    };
    let map = |held: bool| pb::Device {
        name: "dm-3".into(),
        wwid: "3600a0b8".into(),
        verdict: if held { pb::Verdict::InUse as i32 } else { pb::Verdict::Unused as i32 },
        holders: if held { vec![pb::Holder::default()] } else { vec![] },
        ..Default::default()
    };
    let ix = index(vec![("a", true, vec![map(false), path("sdb"), path("sdc")])]);
    let r = run(&ix, None);
    assert_eq!(kinds(&r), vec![("attached_not_in_use", "3600a0b8".to_owned(), s(&["a"]))]);
    assert_eq!(r.findings[0].devices.len(), 1, "the map, not its paths");
    let ix = index(vec![("a", true, vec![map(true), path("sdb"), path("sdc")])]);
    assert!(run(&ix, None).findings.is_empty());
}

fn kube(synced: bool) -> KubeView {
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pv-db"},
        "spec": {"rbd": {"monitors": ["10.0.0.1:6789"], "pool": "k8s", "image": "db"}}
    }))
    .expect("pv");
    let va = |name: &str, node: &str| -> VolumeAttachment {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"attacher": "x", "nodeName": node, "source": {"persistentVolumeName": "pv-db"}},
            "status": {"attached": true}
        }))
        .expect("va")
    };
    let mut k = KubeView::default();
    k.not_synced = (!synced).then(|| "the Kubernetes view is not synced: nodes".to_owned());
    k.set_pv("pv-db", Some(crate::multiattach::volume_id(&pv)));
    for (name, node) in [("va-free", "free"), ("va-used", "used"), ("va-dead", "dead")] {
        k.set_va(name, Some(Attachment::of(&va(name, node))));
    }
    k
}

#[test]
fn volume_attachments_to_idle_and_dead_nodes() {
    let ix = index(vec![
        ("free", true, vec![]),
        ("used", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)]),
        ("dead", false, vec![]),
    ]);
    let k = kube(true);
    let r = run(&ix, Some(&k));
    assert_eq!(
        kinds(&r),
        vec![
            ("attached_not_in_use", "k8s/db".to_owned(), s(&["free"])),
            ("dead_node_watcher", "k8s/db".to_owned(), s(&["dead"])),
        ]
    );
    assert_eq!(r.findings[0].pv, "pv-db");
    assert_eq!(r.findings[1].volume_attachments, ["va-dead (node=dead, attached=true)"]);
    assert!(!r.complete);

    // The dead node is deleted (no Node, no agent), its VolumeAttachment is not: still a finding,
    // and the sweep is complete (every node there is answered).
    let ix = index(vec![
        ("free", true, vec![]),
        ("used", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)]),
    ]);
    let r = run(&ix, Some(&k));
    assert!(r.complete, "{r:#?}");
    let dead = r.findings.iter().find(|f| f.kind == pb::FindingKind::DeadNodeWatcher as i32).expect("dead");
    assert!(dead.detail.contains("no Node of the cluster any more"), "{}", dead.detail);

    // The dead node is a Node of the cluster again, but with no agent at all: nothing on it can
    // be asked, so the sweep is incomplete (and makes no finding: the node is alive).
    let mut k2 = kube(true);
    k2.set_node("dead", Some(vec![]));
    let r = run(&ix, Some(&k2));
    assert!(!r.complete, "{r:#?}");
    assert!(r.summary.contains("attached to 1 node(s) with no agent: dead"), "{}", r.summary);
    assert!(!r.findings.iter().any(|f| f.nodes == ["dead"]), "{r:#?}");

    let ix = index(vec![("used", true, vec![rbd("rbd0", "db", pb::Verdict::InUse, true)])]);
    let mut k = kube(false);
    for name in ["va-free", "va-used", "va-dead"] {
        k.set_va(name, None);
    }
    let r = run(&ix, Some(&k));
    assert!(!r.complete, "an unsynced Kubernetes view is no evidence");
    assert!(r.summary.starts_with("incomplete: the Kubernetes view is not synced"), "{}", r.summary);
}

/// A measurement, not a check (run with `--ignored --nocapture`): the sweep over 5,000 nodes of
/// 20 rbd mappings each, one image in ten on two nodes, one node in a hundred missing.
#[test]
#[ignore = "a measurement: cargo test -p blockjanitor-console --lib sweep_of_5000 -- --ignored --nocapture"]
fn sweep_of_5000_nodes_measured() {
    let nodes: Vec<(String, bool, Vec<pb::Device>)> = (0..5000)
        .map(|n| {
            let devs = (0..20)
                .map(|d| {
                    let image = if d == 0 { format!("shared-{}", n / 2) } else { format!("img-{n}-{d}") };
                    let verdict = if d % 7 == 0 { pb::Verdict::Stale } else { pb::Verdict::InUse };
                    rbd(&format!("rbd{d}"), &image, verdict, verdict == pb::Verdict::InUse)
                })
                .collect();
            (format!("node-{n:04}"), n % 100 != 0, devs)
        })
        .collect();
    let ix = index(nodes.iter().map(|(n, up, d)| (n.as_str(), *up, d.clone())).collect());
    let mut took = Vec::new();
    for _ in 0..5 {
        let t = std::time::Instant::now();
        let r = run(&ix, None);
        took.push(t.elapsed());
        assert!(!r.complete && r.volumes > 90_000);
    }
    took.sort();
    let sweeper = crate::sweeper::Sweeper::new(ix.clone(), None);
    let t = std::time::Instant::now();
    sweeper.flush();
    println!("the incremental sweep's first pass (every volume): {:?}", t.elapsed());
    ix.write().upsert_device("node-0001", rbd("rbd3", "img-1-3", pb::Verdict::Stale, false));
    let t = std::time::Instant::now();
    sweeper.flush();
    println!("one device changed, the incremental sweep caught up in {:?}", t.elapsed());
    let r = run(&ix, None);
    println!(
        "sweep of 5000 nodes x 20 devices ({} volumes, {} findings): min {:?}, median {:?}, max {:?}",
        r.volumes,
        r.findings.len(),
        took[0],
        took[2],
        took[4]
    );
}
