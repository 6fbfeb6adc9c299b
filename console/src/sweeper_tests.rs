//! Unit tests of the incremental sweep (console/src/sweeper.rs): it agrees with the sweep from
//! scratch after every change, whatever the order of changes.

use super::*;
use crate::index::Index;
use blockjanitor_rpc::view::time::now_secs;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;

fn rbd(name: &str, image: &str, verdict: pb::Verdict, held: bool) -> pb::Device {
    pb::Device {
        name: name.into(),
        kind: pb::DeviceKind::Rbd as i32,
        verdict: verdict as i32,
        holders: if held {
            vec![pb::Holder { description: "mounted".into(), ..Default::default() }]
        } else {
            vec![]
        },
        rbd: Some(pb::RbdMapping {
            pool: "k8s".into(),
            image: image.into(),
            snap: "-".into(),
            client_id: "client.7".into(),
            client_addr: "10.0.0.9:0/77".into(),
            ..Default::default()
        }),
        pv_names: vec![format!("pv-{image}")],
        ..Default::default()
    }
}

fn pv(image: &str) -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("pv-{image}")},
        "spec": {"rbd": {"monitors": ["10.0.0.1:6789"], "pool": "k8s", "image": image}}
    }))
    .expect("pv")
}

fn va(image: &str, node: &str, attached: bool) -> VolumeAttachment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("va-{image}-{node}")},
        "spec": {"attacher": "x", "nodeName": node, "source": {"persistentVolumeName": format!("pv-{image}")}},
        "status": {"attached": attached}
    }))
    .expect("va")
}

fn node(name: &str, in_use: &[String]) -> Node {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name}, "status": {"volumesInUse": in_use}
    }))
    .expect("node")
}

/// The sweep from scratch over the same index and tables, with the same causes.
fn from_scratch(ix: &Index, c: &Cluster) -> pb::SweepResponse {
    let r = ix.read();
    let mut missing: Vec<pb::MissingNode> = r
        .nodes
        .values()
        .filter_map(|n| {
            n.missing_cause().map(|reason| pb::MissingNode {
                node: n.name.clone(),
                reason,
                ..Default::default()
            })
        })
        .collect();
    for n in c.nodes.keys() {
        if !r.nodes.contains_key(&n) {
            missing.push(pb::MissingNode { node: n, reason: NO_AGENT.into(), ..Default::default() });
        }
    }
    missing.sort_by(|a, b| a.node.cmp(&b.node));
    sweep::sweep(&r, Some(&KubeView::of(c)), missing, &[])
}

fn same(kept: &pb::SweepResponse, fresh: &pb::SweepResponse, what: &str) {
    assert_eq!(kept.findings, fresh.findings, "{what}: findings");
    assert_eq!(kept.counts, fresh.counts, "{what}: counts");
    assert_eq!(kept.volumes, fresh.volumes, "{what}: volumes");
    assert_eq!(kept.complete, fresh.complete, "{what}: complete");
}

/// A small deterministic generator (no dependency): xorshift.
struct Rng(u64);
impl Rng {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

#[test]
fn the_kept_sweep_agrees_with_the_sweep_from_scratch_after_every_change() {
    const NODES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];
    const IMAGES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
    let verdicts = [pb::Verdict::InUse, pb::Verdict::Stale, pb::Verdict::Unknown, pb::Verdict::Unused];
    for seed in 1..=20u64 {
        let ix = Index::new();
        let c = Cluster::default();
        let s = Sweeper::new(ix.clone(), Some(c.clone()));
        c.pvs.replace(vec![]);
        c.pvcs.replace(vec![]);
        c.vas.replace(vec![]);
        c.nodes.replace(vec![]);
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for step in 0..120 {
            let n = NODES[rng.next(NODES.len())];
            let img = IMAGES[rng.next(IMAGES.len())];
            match rng.next(10) {
                0 => ix.write().upsert_node(n, "127.0.0.1:1", "static", None),
                1 => ix.write().remove_node(n),
                2 => ix.with_node(n, |e| e.mark_up(now_secs())),
                3 => ix.with_node(n, |e| e.mark_down("keep-alive timed out".into())),
                4 => {
                    let d = rbd(&format!("rbd{}", rng.next(3)), img, verdicts[rng.next(4)], rng.next(2) == 0);
                    ix.write().upsert_device(n, d);
                }
                5 => ix.write().remove_device(n, &format!("rbd{}", rng.next(3))),
                6 => c.vas.applied(va(img, n, rng.next(3) > 0)),
                7 => c.vas.removed(&va(img, n, true)),
                8 => {
                    if rng.next(2) == 0 {
                        c.pvs.applied(pv(img));
                    } else {
                        c.pvs.removed(&pv(img));
                    }
                }
                _ => {
                    if rng.next(3) == 0 {
                        c.nodes.removed(&node(n, &[]));
                    } else {
                        let used: Vec<String> = if rng.next(2) == 0 {
                            vec![format!("kubernetes.io/rbd/k8s:{img}")]
                        } else {
                            vec![]
                        };
                        c.nodes.applied(node(n, &used));
                    }
                }
            }
            if rng.next(4) == 0 || step == 119 {
                s.flush();
                let kept = s.answer(&[]);
                same(&kept, &from_scratch(&ix, &c), &format!("seed {seed}, step {step}"));
                let p = s.published();
                let counted: Vec<u32> = p.counts.iter().map(|(_, n)| *n).collect();
                let listed: Vec<u32> = KINDS.iter().map(|k| kept.counts[sweep::kind_name(*k)]).collect();
                assert_eq!(counted, listed, "seed {seed}, step {step}: published counts");
            }
        }
    }
}

#[test]
fn the_answer_says_what_was_covered_and_which_missing_nodes_hold_volumes() {
    let ix = Index::new();
    let c = Cluster::default();
    let s = Sweeper::new(ix.clone(), Some(c.clone()));
    c.pvs.replace(vec![pv("db")]);
    c.pvcs.replace(vec![]);
    c.vas.replace(vec![va("db", "gone-quiet", true)]);
    c.nodes.replace(vec![node("a", &[]), node("b", &[]), node("gone-quiet", &[]), node("idle", &[])]);
    for n in ["a", "b", "gone-quiet"] {
        ix.write().upsert_node(n, "127.0.0.1:1", "static", None);
        ix.with_node(n, |e| e.mark_up(now_secs()));
    }
    ix.write().replace_devices("a", vec![rbd("rbd0", "web", pb::Verdict::InUse, true)]);
    ix.with_node("b", |e| e.incomplete_view = "INCOMPLETE VIEW: /proc/1 unreadable".into());
    ix.with_node("gone-quiet", |e| e.mark_down("keep-alive timed out".into()));
    let r = s.answer(&[]);
    assert_eq!((r.nodes, r.covered_nodes), (4, 2), "{r:#?}");
    let missing: Vec<&str> = r.missing_nodes.iter().map(|m| m.node.as_str()).collect();
    assert_eq!(missing, ["gone-quiet", "idle"]);
    assert_eq!(r.uncovered_with_volumes, ["gone-quiet"], "idle has nothing attached or mapped");
    assert_eq!(r.partial_nodes.len(), 1);
    assert!(
        r.summary.contains("covered 2 of 4 node(s)") && r.summary.contains("incomplete view"),
        "{}",
        r.summary
    );
    let p = s.published();
    assert_eq!((p.missing, p.uncovered_with_volumes, p.complete), (2, 0, false), "not missing for long yet");
    lock(&s.state).since.values_mut().for_each(|t| *t -= SETTLE);
    s.flush();
    assert_eq!(s.published().uncovered_with_volumes, 1, "missing for {SETTLE:?}, with a volume attached");
}
