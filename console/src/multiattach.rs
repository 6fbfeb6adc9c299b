//! One diagnosis per node for a volume stuck in Multi-Attach (field notes, incidents 1 and 2):
//! what Kubernetes believes (VolumeAttachments and their `status.attached`, the Node's
//! `status.volumesAttached` and `volumesInUse`) next to what each node's agent finds.
//!
//! - `in_use_correct`: the node maps the volume and something on it holds it.
//! - `stale_mapping`: the node maps it and nothing holds it; the agent's plan clears it (the
//!   service adds the plan's steps).
//! - `safe_to_delete_va`: a VolumeAttachment names the node, its agent answered, and it finds no
//!   mapping and no mount of the volume.
//! - `unknown`: the agent cannot be asked (unreachable, not synced, no agent on the node) or it
//!   cannot vouch (`unknown` verdict): never safe.
//! - `no_mapping`: the Node's status lists the volume, no VolumeAttachment does, and the agent
//!   finds nothing (the controller and kubelet disagree, incident 2).
//!
//! Pure: the inputs are the PV and the objects and index entries that concern it.

use std::collections::{BTreeMap, BTreeSet};

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::index::{image_key, Inner, Key};

/// What identifies a volume on a node and in Kubernetes' lists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeId {
    pub pv: String,
    /// Ceph images, `pool/image` or `pool/namespace/image`.
    pub images: Vec<String>,
    /// SCSI/multipath WWIDs, lower case.
    pub wwids: Vec<String>,
    /// The unique volume names kubelet and the attach/detach controller use in Node status.
    pub unique_names: Vec<String>,
}

/// The volume a PV describes: in-tree RBD (`spec.rbd`), ceph-csi RBD (`spec.csi` with `pool`
/// and `imageName` attributes), FC WWIDs, and the unique names Node status uses for it.
pub fn volume_id(pv: &PersistentVolume) -> VolumeId {
    let mut v = VolumeId { pv: pv.metadata.name.clone().unwrap_or_default(), ..Default::default() };
    let Some(spec) = &pv.spec else { return v };
    if let Some(rbd) = &spec.rbd {
        let pool = rbd.pool.clone().unwrap_or_else(|| "rbd".into());
        v.images.push(image_key(&pool, "", &rbd.image));
        v.unique_names.push(format!("kubernetes.io/rbd/{pool}:{}", rbd.image));
    }
    if let Some(csi) = &spec.csi {
        v.unique_names.push(format!("kubernetes.io/csi/{}^{}", csi.driver, csi.volume_handle));
        if let Some(attrs) = &csi.volume_attributes {
            if let (Some(pool), Some(image)) = (attrs.get("pool"), attrs.get("imageName")) {
                let ns = attrs.get("radosNamespace").map(String::as_str).unwrap_or("");
                v.images.push(image_key(pool, ns, image));
            }
        }
    }
    if let Some(fc) = &spec.fc {
        v.wwids.extend(fc.wwids.iter().flatten().map(|w| w.to_ascii_lowercase()));
    }
    v
}

/// Whether a Node status entry (`volumesAttached[].name`, `volumesInUse[]`) is this volume.
pub fn names_volume(entry: &str, v: &VolumeId) -> bool {
    v.unique_names.iter().any(|u| u == entry)
        || (!v.pv.is_empty() && entry.ends_with(&v.pv))
        || v.images
            .iter()
            .any(|i| i.rsplit('/').next().is_some_and(|img| !img.is_empty() && entry.ends_with(img)))
}

/// Devices for the volume on every node of the index.
pub fn devices_of(index: &Inner, v: &VolumeId) -> BTreeMap<String, Vec<pb::FleetDevice>> {
    let mut keys: Vec<Key> = vec![Key::Pv(v.pv.clone())];
    keys.extend(v.images.iter().cloned().map(Key::Image));
    keys.extend(v.wwids.iter().cloned().map(Key::Wwid));
    let mut seen = BTreeSet::new();
    let mut out: BTreeMap<String, Vec<pb::FleetDevice>> = BTreeMap::new();
    for k in keys {
        for d in index.lookup(&k) {
            let name = d.device.as_ref().map(|x| x.name.clone()).unwrap_or_default();
            if seen.insert((d.node.clone(), name)) {
                out.entry(d.node.clone()).or_default().push(d);
            }
        }
    }
    out
}

/// The Nodes that may list the volume in their status: those listing one of its unique names
/// (the Nodes' index), those its VolumeAttachments name and those whose agent maps it; read
/// back from the table (a question costs these, not every Node).
pub fn nodes_concerned(
    c: &crate::cluster::Cluster,
    v: &VolumeId,
    vas: &[std::sync::Arc<VolumeAttachment>],
    index: &Inner,
) -> Vec<std::sync::Arc<Node>> {
    let mut names: BTreeSet<String> =
        v.unique_names.iter().flat_map(|u| c.nodes.keys_by(&format!("volume:{u}"))).collect();
    names.extend(vas.iter().map(|va| va.spec.node_name.clone()));
    names.extend(devices_of(index, v).into_keys());
    names.iter().filter_map(|n| c.nodes.get(n)).collect()
}

/// Whether something on its node uses the device (a holder, an in-use or protected verdict, a device
/// stacked on it).
pub fn held(d: &pb::Device) -> bool {
    !d.holders.is_empty()
        || d.verdict == pb::Verdict::InUse as i32
        || d.verdict == pb::Verdict::Protected as i32
        || !d.stacked_on_top.is_empty()
}

fn verdict_name(raw: i32) -> String {
    blockjanitor_rpc::view::names::verdict_name(raw)
}

/// One diagnosis per node involved: named by a VolumeAttachment, listed in a Node's status, or
/// mapping the volume per its agent. `missing` gets every node whose diagnosis is `unknown`.
pub fn diagnose(
    v: &VolumeId,
    vas: &[std::sync::Arc<VolumeAttachment>],
    nodes: &[std::sync::Arc<Node>],
    index: &Inner,
    missing: &mut Vec<pb::MissingNode>,
) -> Vec<pb::NodeDiagnosis> {
    let mut per: BTreeMap<String, pb::NodeDiagnosis> = BTreeMap::new();
    let entry = |per: &mut BTreeMap<String, pb::NodeDiagnosis>, n: &str| {
        per.entry(n.to_owned())
            .or_insert_with(|| pb::NodeDiagnosis { node: n.to_owned(), ..Default::default() });
    };
    for va in vas {
        let n = &va.spec.node_name;
        entry(&mut per, n);
        let attached = va.status.as_ref().is_some_and(|s| s.attached);
        if let Some(d) = per.get_mut(n) {
            d.volume_attachments
                .push(format!("{} (attached={attached})", va.metadata.name.clone().unwrap_or_default()));
        }
    }
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        let status = node.status.as_ref();
        let attached = status
            .and_then(|s| s.volumes_attached.as_ref())
            .is_some_and(|l| l.iter().any(|a| names_volume(&a.name, v)));
        let in_use = status
            .and_then(|s| s.volumes_in_use.as_ref())
            .is_some_and(|l| l.iter().any(|a| names_volume(a, v)));
        if attached || in_use {
            entry(&mut per, &name);
            if let Some(d) = per.get_mut(&name) {
                d.in_volumes_attached = attached;
                d.in_volumes_in_use = in_use;
            }
        }
    }
    let devices = devices_of(index, v);
    for (n, devs) in &devices {
        entry(&mut per, n);
        if let Some(d) = per.get_mut(n) {
            d.devices = devs.clone();
        }
    }
    for d in per.values_mut() {
        let not_answered = match index.nodes.get(&d.node) {
            None => Some(pb::MissingNode {
                node: d.node.clone(),
                reason: "no agent is known on this node".to_owned(),
                ..Default::default()
            }),
            Some(e) => e.missing_node(),
        };
        if let Some(m) = not_answered {
            d.diagnosis = pb::Diagnosis::Unknown as i32;
            d.detail = format!("the agent cannot be asked ({}): never safe to delete or detach", m.reason);
            if !missing.iter().any(|x| x.node == d.node) {
                missing.push(m);
            }
            continue;
        }
        let devs: Vec<&pb::Device> = d.devices.iter().filter_map(|f| f.device.as_ref()).collect();
        let names = devs.iter().map(|x| x.name.as_str()).collect::<Vec<_>>().join(", ");
        if devs.is_empty() {
            if d.volume_attachments.is_empty() {
                d.diagnosis = pb::Diagnosis::NoMapping as i32;
                d.detail = "the Node's status lists the volume but no VolumeAttachment does, and the agent finds no \
mapping and no mount of it"
                    .into();
            } else {
                d.diagnosis = pb::Diagnosis::SafeToDeleteVa as i32;
                d.detail = format!(
                    "the agent answered and finds no mapping and no mount of the volume: VolumeAttachment {} can be deleted",
                    d.volume_attachments.join(", ")
                );
            }
        } else if devs.iter().any(|x| x.verdict == pb::Verdict::Unknown as i32) {
            d.diagnosis = pb::Diagnosis::Unknown as i32;
            d.detail = format!("the agent cannot vouch for {names}: {}", devs[0].reasons.join("; "));
        } else if let Some(h) = devs.iter().find(|x| held(x)) {
            d.diagnosis = pb::Diagnosis::InUseCorrect as i32;
            let by =
                h.holders.first().map(|x| x.description.clone()).unwrap_or_else(|| verdict_name(h.verdict));
            d.detail = format!("{} maps the volume and is held: {by}", h.name);
        } else {
            d.diagnosis = pb::Diagnosis::StaleMapping as i32;
            d.detail = format!(
                "{names} maps the volume and nothing holds it ({}): {}",
                devs.iter().map(|x| verdict_name(x.verdict)).collect::<Vec<_>>().join(", "),
                devs[0].reasons.first().cloned().unwrap_or_default()
            );
        }
    }
    per.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv() -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-0a5e"},
            "spec": {"rbd": {"monitors": ["10.0.0.1:6789"], "pool": "k8s", "image": "kubernetes-dynamic-pvc-0a5e"}}
        }))
        .expect("pv")
    }

    #[test]
    fn in_tree_rbd_volume_names() {
        let v = volume_id(&pv());
        assert_eq!(v.images, vec!["k8s/kubernetes-dynamic-pvc-0a5e"]);
        assert!(names_volume("kubernetes.io/rbd/k8s:kubernetes-dynamic-pvc-0a5e", &v));
        assert!(!names_volume("kubernetes.io/rbd/k8s:other", &v));
    }

    fn va(name: &str, node: &str) -> std::sync::Arc<VolumeAttachment> {
        std::sync::Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"attacher": "x", "nodeName": node, "source": {"persistentVolumeName": "pvc-0a5e"}},
                "status": {"attached": true}
            }))
            .expect("va"),
        )
    }

    fn mapping(verdict: pb::Verdict, held: bool) -> pb::Device {
        pb::Device {
            name: "rbd0".into(),
            verdict: verdict as i32,
            holders: if held {
                vec![pb::Holder { description: "mounted at /mnt".into(), ..Default::default() }]
            } else {
                vec![]
            },
            rbd: Some(pb::RbdMapping {
                pool: "k8s".into(),
                image: "kubernetes-dynamic-pvc-0a5e".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn one_diagnosis_per_node() {
        let v = volume_id(&pv());
        let index = crate::index::Index::new();
        {
            let mut w = index.write();
            for (n, devs) in [
                ("stale", vec![mapping(pb::Verdict::Stale, false)]),
                ("used", vec![mapping(pb::Verdict::InUse, true)]),
                ("blind", vec![mapping(pb::Verdict::Unknown, false)]),
                ("free", vec![]),
                ("status-only", vec![]),
            ] {
                w.upsert_node(n, "127.0.0.1:1", "static", None);
                w.replace_devices(n, devs);
                if let Some(e) = w.nodes.get_mut(n) {
                    e.reachable = true;
                    e.synced = true;
                }
            }
        }
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "status-only"},
            "status": {"volumesAttached": [{"name": "kubernetes.io/rbd/k8s:kubernetes-dynamic-pvc-0a5e", "devicePath": ""}]}
        }))
        .expect("node");
        let mut missing = Vec::new();
        let d =
            diagnose(&v, &[va("va-free", "free")], &[std::sync::Arc::new(node)], &index.read(), &mut missing);
        let by = |n: &str| d.iter().find(|x| x.node == n).map(|x| x.diagnosis);
        assert_eq!(by("stale"), Some(pb::Diagnosis::StaleMapping as i32));
        assert_eq!(by("used"), Some(pb::Diagnosis::InUseCorrect as i32));
        assert_eq!(
            by("blind"),
            Some(pb::Diagnosis::Unknown as i32),
            "an agent that cannot vouch is never safe"
        );
        assert_eq!(by("free"), Some(pb::Diagnosis::SafeToDeleteVa as i32));
        assert_eq!(by("status-only"), Some(pb::Diagnosis::NoMapping as i32));
        assert!(missing.is_empty());
    }

    #[test]
    fn an_unknown_node_is_never_safe() {
        let v = volume_id(&pv());
        let va: VolumeAttachment = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-1"},
            "spec": {"attacher": "x", "nodeName": "gone", "source": {"persistentVolumeName": "pvc-0a5e"}},
            "status": {"attached": true}
        }))
        .expect("va");
        let index = crate::index::Index::new();
        let mut missing = Vec::new();
        let d = diagnose(&v, &[std::sync::Arc::new(va)], &[], &index.read(), &mut missing);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].diagnosis, pb::Diagnosis::Unknown as i32);
        assert_eq!(missing[0].node, "gone");
    }
}
