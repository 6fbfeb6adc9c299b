//! What the console keeps of each Kubernetes object it watches (the [`crate::kube_table::Keep`]
//! functions): what answers read, nothing else. Every object loses its managed fields,
//! annotations, labels and finalizers; a Node its image list, capacity and system info; a pod is
//! reduced to what Explain reads of a stuck pod (name, namespace, uid, node, phase, each
//! container's waiting reason, and the volumes that may be block devices) and is not kept at all
//! when it has none of those (Explain reads such a pod from the API when asked about it).

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateWaiting, ContainerStatus, Node, PersistentVolume, PersistentVolumeClaim,
    Pod, PodSpec, PodStatus, Volume,
};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The metadata answers read: name, namespace, uid, creation and deletion times.
fn meta(m: &mut ObjectMeta) {
    *m = ObjectMeta {
        name: m.name.take(),
        namespace: m.namespace.take(),
        uid: m.uid.take(),
        creation_timestamp: m.creation_timestamp.take(),
        deletion_timestamp: m.deletion_timestamp.take(),
        ..ObjectMeta::default()
    };
}

/// A Node: addresses, conditions, volumes attached and in use, its spec (taints).
pub fn node(n: &mut Node) -> bool {
    meta(&mut n.metadata);
    if let Some(s) = n.status.as_mut() {
        s.images = None;
        s.node_info = None;
        s.capacity = None;
        s.allocatable = None;
        s.daemon_endpoints = None;
        s.config = None;
        s.runtime_handlers = None;
        s.features = None;
    }
    true
}

/// A PersistentVolume: its spec and status whole (every volume source identifies a volume).
pub fn pv(p: &mut PersistentVolume) -> bool {
    meta(&mut p.metadata);
    true
}

/// A PersistentVolumeClaim: its spec (the volume it is bound to) and status (its phase).
pub fn pvc(p: &mut PersistentVolumeClaim) -> bool {
    meta(&mut p.metadata);
    if let Some(s) = p.status.as_mut() {
        s.allocated_resources = None;
        s.allocated_resource_statuses = None;
        s.conditions = None;
        s.modify_volume_status = None;
    }
    true
}

/// A VolumeAttachment: its node, PV (or inline spec) and whether it is attached.
pub fn va(v: &mut VolumeAttachment) -> bool {
    meta(&mut v.metadata);
    if let Some(s) = v.status.as_mut() {
        s.attachment_metadata = None;
    }
    true
}

/// Whether a pod volume may be a block device: a claim, an ephemeral claim, an inline rbd,
/// iSCSI, FC or CSI volume (as [`crate::explain::volumes::of_pod`] reads them).
fn may_be_block(v: &Volume) -> bool {
    v.persistent_volume_claim.is_some()
        || v.ephemeral.is_some()
        || v.rbd.is_some()
        || v.iscsi.is_some()
        || v.fc.is_some()
        || v.csi.is_some()
}

/// A container's status as Explain reads it: its name and, when waiting, why.
fn waiting_only(c: &ContainerStatus) -> ContainerStatus {
    let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref()).map(|w| ContainerState {
        waiting: Some(ContainerStateWaiting { reason: w.reason.clone(), message: None }),
        ..ContainerState::default()
    });
    ContainerStatus { name: c.name.clone(), state: waiting, ..ContainerStatus::default() }
}

/// A pod: kept only when it has a volume that may be a block device, and then only what Explain
/// reads of it.
pub fn pod(p: &mut Pod) -> bool {
    let volumes: Vec<Volume> = p
        .spec
        .as_ref()
        .into_iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter(|v| may_be_block(v))
        .cloned()
        .collect();
    if volumes.is_empty() {
        return false;
    }
    meta(&mut p.metadata);
    let node_name = p.spec.as_ref().and_then(|s| s.node_name.clone());
    p.spec = Some(PodSpec { node_name, volumes: Some(volumes), ..PodSpec::default() });
    let status = p.status.take().unwrap_or_default();
    let statuses =
        |l: &Option<Vec<ContainerStatus>>| l.as_ref().map(|l| l.iter().map(waiting_only).collect());
    p.status = Some(PodStatus {
        phase: status.phase.clone(),
        init_container_statuses: statuses(&status.init_container_statuses),
        container_statuses: statuses(&status.container_statuses),
        ..PodStatus::default()
    });
    true
}

/// A kept pod's secondary keys: `claim:NAMESPACE/NAME` for each claim it uses (its PVCs, and
/// the claims its ephemeral volumes make, named POD-VOLUME).
pub fn pod_claims(p: &Pod) -> Vec<String> {
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let name = p.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    for v in p.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(c) = &v.persistent_volume_claim {
            out.push(format!("claim:{ns}/{}", c.claim_name));
        } else if v.ephemeral.is_some() {
            out.push(format!("claim:{ns}/{name}-{}", v.name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_what_explain_reads_and_one_without_block_volumes_is_not_kept() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1", "labels": {"a": "b"},
                         "annotations": {"x": "y"}, "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "i:1"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                                 {"name": "tmp", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                                 {"name": "cfg", "configMap": {"name": "c"}}]},
            "status": {"phase": "Pending", "podIP": "10.0.0.1",
                       "containerStatuses": [{"name": "app", "image": "i:1", "imageID": "", "ready": false,
                                              "restartCount": 0,
                                              "state": {"waiting": {"reason": "ContainerCreating",
                                                                    "message": "long text"}}}]}
        }))
        .expect("pod");
        assert!(pod(&mut p));
        let text = serde_json::to_string(&p).expect("json");
        assert!(
            !text.contains("configMap") && !text.contains("annotations") && !text.contains("podIP"),
            "{text}"
        );
        let volumes = crate::explain::volumes::of_pod(&p);
        assert_eq!(volumes.len(), 2, "both claims still there: {volumes:?}");
        assert_eq!(pod_claims(&p), vec!["claim:shop/data".to_owned(), "claim:shop/web-0-tmp".to_owned()]);
        let waiting = p.status.as_ref().and_then(|s| s.container_statuses.as_ref()).expect("statuses");
        assert_eq!(
            waiting[0].state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref()),
            Some("ContainerCreating")
        );
        let mut plain: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "batch", "namespace": "shop"},
            "spec": {"containers": [], "volumes": [{"name": "cfg", "configMap": {"name": "c"}}]}
        }))
        .expect("pod");
        assert!(!pod(&mut plain), "no volume that may be a block device: not kept");
    }
}
