//! The diagnosis on the index and the cluster's tables as the console keeps them: one case per
//! cause, and the dead-node advice only for a node believed dead.

use super::*;
use crate::index::Index;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;

const PV: &str = "pvc-0a5eb91b";
const IMAGE: &str = "csi-vol-0a5eb91b";
const UNIQUE: &str = "kubernetes.io/csi/rbd.csi.ceph.com^0001-0009-rook-ceph-0000000000000002-0a5eb91b";

fn pv() -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": PV},
        "spec": {"claimRef": {"namespace": "shop", "name": "data"},
                 "csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "0001-0009-rook-ceph-0000000000000002-0a5eb91b",
                         "volumeAttributes": {"pool": "k8s", "imageName": IMAGE, "clusterID": "rook-ceph"}}}
    }))
    .expect("pv")
}

fn pvc() -> PersistentVolumeClaim {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data", "namespace": "shop"},
        "spec": {"volumeName": PV}, "status": {"phase": "Bound"}
    }))
    .expect("pvc")
}

fn node(name: &str, ip: &str, ready: &str, attached: bool) -> Node {
    let mut status = serde_json::json!({
        "addresses": [{"type": "InternalIP", "address": ip}],
        "conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
                        "message": "Kubelet stopped posting node status.",
                        "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:40Z"}]
    });
    if attached {
        status["volumesAttached"] = serde_json::json!([{"name": UNIQUE, "devicePath": ""}]);
    }
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "status": status})).expect("node")
}

fn va(node: &str) -> VolumeAttachment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("csi-{node}")},
        "spec": {"attacher": "rbd.csi.ceph.com", "nodeName": node, "source": {"persistentVolumeName": PV}},
        "status": {"attached": true}
    }))
    .expect("va")
}

fn holder(in_host: bool) -> pb::Holder {
    pb::Holder {
        kind: pb::HolderKind::Mount as i32,
        pids: vec![21839],
        comm: "node_exporter".into(),
        mount_namespace: 4026532845,
        in_host_namespace: in_host,
        mount_point: "/host/var/lib/kubelet/plugins/kubernetes.io/csi/pv/x/globalmount".into(),
        description: "mounted at /host/var/lib/kubelet/plugins/...".into(),
        ..Default::default()
    }
}

fn rbd4(holders: Vec<pb::Holder>, verdict: pb::Verdict) -> pb::Device {
    pb::Device {
        name: "rbd4".into(),
        kind: pb::DeviceKind::Rbd as i32,
        verdict: verdict as i32,
        holders,
        rbd: Some(pb::RbdMapping {
            pool: "k8s".into(),
            image: IMAGE.into(),
            client_id: "client.4151".into(),
            client_addr: "10.0.2.15:0/3317410129".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The scene: node-old (10.0.2.15) with `old` devices, node-new where the pod waits.
fn scene(
    old: Vec<pb::Device>,
    old_up: bool,
    old_ready: &str,
    vas: Vec<VolumeAttachment>,
) -> (Index, Cluster) {
    let ix = Index::new();
    for (n, devs) in [("node-old", old), ("node-new", vec![])] {
        let mut w = ix.write();
        w.upsert_node(n, "127.0.0.2:1", "kubernetes", None);
        w.replace_devices(n, devs);
        drop(w);
        ix.with_node(n, |e| {
            e.mark_up(now_secs());
            e.agent_pod = format!("blockjanitor/agent-{n}");
        });
    }
    if !old_up {
        ix.with_node("node-old", |e| e.mark_down("WatchEvents: keep-alive timed out".into()));
    }
    let c = Cluster::default();
    c.pvs.replace(vec![pv()]);
    c.pvcs.replace(vec![pvc()]);
    c.vas.replace(vas);
    c.nodes.replace(vec![
        node("node-old", "10.0.2.15", old_ready, true),
        node("node-new", "10.0.2.16", "True", false),
    ]);
    (ix, c)
}

fn pod() -> pb::ExplainPod {
    pb::ExplainPod {
        name: "db-0".into(),
        namespace: "shop".into(),
        node: "node-new".into(),
        ..Default::default()
    }
}

fn explain(ix: &Index, c: &Cluster) -> pb::ExplainDiagnosis {
    let v = volumes::from_claim("data", "shop/data", c.pvcs.get("shop/data").as_deref(), |n| c.pv(n));
    let facts = facts::gather(&ix.read(), Some(c), &v, "node-new");
    let p = pod();
    let pods = Pods::new();
    let agent_pod = |n: &str| format!("blockjanitor/agent-{n}");
    let cx = diagnose::Context { pod: Some(&p), pods: &pods, agent_pod: &agent_pod, now: now_secs() };
    diagnose::diagnose(&v, &facts, &cx)
}

fn commands(d: &pb::ExplainDiagnosis) -> Vec<&str> {
    d.next.iter().map(|a| a.command.as_str()).collect()
}

fn fences(d: &pb::ExplainDiagnosis) -> bool {
    d.next.iter().any(|a| {
        a.command.contains("blocklist") || a.command.contains("taint") || a.manifest.contains("NetworkFence")
    })
}

#[test]
fn held_on_the_old_node_is_multi_attach_with_the_holder_and_the_agents_plan() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(true)], pb::Verdict::InUse)], true, "True", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(
        (d.cause, d.outcome),
        (pb::Cause::HeldElsewhere as i32, pb::ExplainOutcome::Blocked as i32),
        "{d:#?}"
    );
    assert_eq!((d.node.as_str(), d.device.as_str()), ("node-old", "rbd4"));
    assert!(d.summary.contains("pid 21839 (node_exporter)"), "{}", d.summary);
    assert_eq!(d.holders[0].pid, 21839);
    assert!(commands(&d).contains(&"kubectl blockjanitor plan node-old/rbd4"), "{:?}", commands(&d));
    assert!(!fences(&d), "a node that answers is never fenced");
}

#[test]
fn private_copies_only_is_incident_5_with_release_and_the_manifest_fix() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(false)], pb::Verdict::InUse)], true, "True", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(d.cause, pb::Cause::PrivateMountCopy as i32, "{d:#?}");
    let cmds = commands(&d);
    assert_eq!(cmds[0], "kubectl -n blockjanitor exec agent-node-old -- agentctl release rbd4");
    assert_eq!(cmds[1], "kubectl -n blockjanitor exec agent-node-old -- agentctl release rbd4 --apply");
    assert!(d.next.iter().any(|a| a.manifest.contains("mountPropagation: HostToContainer")), "{:#?}", d.next);
}

#[test]
fn attached_to_a_node_that_finds_nothing_is_incident_2_with_the_va_to_delete() {
    let (ix, c) = scene(vec![], true, "True", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(d.cause, pb::Cause::AttachedNotInUse as i32, "{d:#?}");
    assert_eq!(commands(&d), ["kubectl delete volumeattachment csi-node-old --dry-run=server"]);
    // A stale mapping there: the agent's plan first.
    let (ix, c) = scene(vec![rbd4(vec![], pb::Verdict::Stale)], true, "True", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!((d.cause, d.device.as_str()), (pb::Cause::AttachedNotInUse as i32, "rbd4"));
    assert_eq!(commands(&d)[0], "kubectl blockjanitor plan node-old/rbd4");
}

#[test]
fn a_dead_node_gets_the_dead_node_advice_for_its_exact_client() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(true)], pb::Verdict::InUse)], false, "Unknown", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(d.cause, pb::Cause::DeadNode as i32, "{d:#?}");
    let cmds = commands(&d);
    assert_eq!(cmds[0], "ceph osd blocklist add 10.0.2.15:0/3317410129", "the exact instance, never the IP");
    assert!(d.next[0].note.contains("one hour"), "{}", d.next[0].note);
    let fence = d.next.iter().find(|a| a.manifest.contains("kind: NetworkFence")).expect("a NetworkFence");
    assert!(
        fence.manifest.contains("fenceState: Fenced") && fence.manifest.contains("- 10.0.2.15/32"),
        "{}",
        fence.manifest
    );
    assert!(
        fence.manifest.contains("driver: rbd.csi.ceph.com")
            && fence.manifest.contains("clusterID: rook-ceph")
    );
    assert!(fence.note.contains("deleting it alone does not unfence"), "{}", fence.note);
    let taint = cmds.iter().find(|c| c.contains("taint")).expect("the taint");
    assert_eq!(
        *taint,
        "kubectl taint nodes node-old node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
    );
    assert!(
        d.evidence.iter().any(|e| e.contains("its Node is NotReady (Ready=Unknown)")),
        "{:#?}",
        d.evidence
    );
    assert!(
        d.evidence.iter().any(|e| e.contains("as last seen")),
        "the last view and its age: {:#?}",
        d.evidence
    );
}

#[test]
fn a_not_ready_node_whose_agent_still_answers_is_never_fenced() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(true)], pb::Verdict::InUse)], true, "Unknown", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(d.cause, pb::Cause::HeldElsewhere as i32, "{d:#?}");
    assert!(!fences(&d), "{:#?}", d.next);
    assert!(
        d.evidence.iter().any(|e| e.contains("its agent still answers: the machine runs")),
        "{:#?}",
        d.evidence
    );
}

#[test]
fn a_silent_agent_on_a_ready_node_is_unknown_with_its_last_view() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(true)], pb::Verdict::InUse)], false, "True", vec![va("node-old")]);
    let d = explain(&ix, &c);
    assert_eq!(
        (d.cause, d.outcome),
        (pb::Cause::Unknown as i32, pb::ExplainOutcome::Unknown as i32),
        "{d:#?}"
    );
    assert!(!fences(&d), "not believed dead: {:#?}", d.next);
    assert!(d.evidence.iter().any(|e| e.contains("rbd4") && e.contains("as last seen")), "{:#?}", d.evidence);
}

#[test]
fn nothing_blocks_a_volume_only_its_pods_node_uses() {
    let (ix, c) = scene(vec![], true, "True", vec![]);
    c.nodes.replace(vec![
        node("node-old", "10.0.2.15", "True", false),
        node("node-new", "10.0.2.16", "True", true),
    ]);
    ix.write().replace_devices("node-new", vec![rbd4(vec![holder(true)], pb::Verdict::InUse)]);
    let d = explain(&ix, &c);
    assert_eq!(
        (d.cause, d.outcome),
        (pb::Cause::NothingBlocks as i32, pb::ExplainOutcome::NotBlocked as i32),
        "{d:#?}"
    );
    assert!(d.summary.contains("it is on node-new"), "{}", d.summary);
    assert!(commands(&d).contains(&"kubectl -n shop describe pod db-0"));
}

#[test]
fn a_node_that_left_the_fleet_is_explained_from_its_last_view() {
    let (ix, c) =
        scene(vec![rbd4(vec![holder(true)], pb::Verdict::InUse)], true, "True", vec![va("node-old")]);
    ix.write().remove_node("node-old");
    c.nodes.replace(vec![node("node-new", "10.0.2.16", "True", false)]);
    let d = explain(&ix, &c);
    assert_eq!(
        (d.cause, d.node.as_str(), d.device.as_str()),
        (pb::Cause::DeadNode as i32, "node-old", "rbd4"),
        "{d:#?}"
    );
    assert!(d.evidence.iter().any(|e| e.contains("its Node was deleted")), "{:#?}", d.evidence);
    assert_eq!(commands(&d)[0], "ceph osd blocklist add 10.0.2.15:0/3317410129");
}

#[test]
fn requests_are_read_as_kubectl_names_objects() {
    let r = |kind: &str, name: &str, ns: &str| {
        Asked::parse(&pb::ExplainRequest { kind: kind.into(), name: name.into(), namespace: ns.into() })
    };
    assert_eq!(r("pod", "db-0", "shop").ok(), Some(Asked::Pod { ns: "shop".into(), name: "db-0".into() }));
    assert_eq!(r("pv", PV, "").ok(), Some(Asked::Pv { name: PV.into() }));
    for (k, n, ns) in
        [("pod", "db-0", ""), ("deployment", "x", "shop"), ("pvc", "a/b", "shop"), ("pv", "", "")]
    {
        assert_eq!(r(k, n, ns).expect_err(k).code(), tonic::Code::InvalidArgument, "{k} {n} {ns}");
    }
}
