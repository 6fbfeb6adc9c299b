//! Objects as the API server returns them (Pods, PersistentVolumes, VolumeAttachments, the
//! Node), for the stand-in API server ([`crate::kube_mock`]) and the tests that fill it.

use serde_json::{json, Value};

use crate::kube_mock::NODE;

pub fn pod(name: &str, phase: &str, claim: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"),
                     "resourceVersion": "42", "creationTimestamp": "2025-11-03T08:12:44Z",
                     "labels": {"app": "shop"}},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "app", "image": "registry.example/shop:1.4",
                            "volumeMounts": [{"name": "vol", "mountPath": "/var/lib/shop"}]}],
            "volumes": [
                {"name": "vol", "persistentVolumeClaim": {"claimName": claim}},
                {"name": "kube-api-access-x2k9p", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}
            ]
        },
        "status": {"phase": phase, "podIP": "10.244.1.17", "qosClass": "BestEffort"}
    })
}

pub fn pv(name: &str, ns: &str, claim: &str, image: &str) -> Value {
    json!({
        "metadata": {"name": name, "uid": format!("uid-pv-{name}"), "resourceVersion": "17",
                     "finalizers": ["kubernetes.io/pv-protection"],
                     "annotations": {"pv.kubernetes.io/provisioned-by": "rbd.csi.ceph.com"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "10Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns,
                         "name": claim, "uid": format!("uid-claim-{claim}"), "resourceVersion": "16"},
            "csi": {
                "driver": "rbd.csi.ceph.com",
                "fsType": "ext4",
                "volumeHandle": format!("0001-0009-rook-ceph-0000000000000002-{image}"),
                "volumeAttributes": {"clusterID": "rook-ceph", "imageFeatures": "layering",
                                     "imageName": image, "journalPool": "replicapool",
                                     "pool": "replicapool",
                                     "storage.kubernetes.io/csiProvisionerIdentity": "1730000000000-8081-rbd.csi.ceph.com"},
                "nodeStageSecretRef": {"name": "rook-csi-rbd-node", "namespace": "rook-ceph"}
            },
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "ceph-block",
            "volumeMode": "Filesystem"
        },
        "status": {"phase": "Bound"}
    })
}

pub fn volume_attachment(name: &str, node: &str, pv: &str, attached: bool, rv: u32) -> Value {
    json!({
        "metadata": {"name": name, "resourceVersion": rv.to_string(),
                     "annotations": {"csi.alpha.kubernetes.io/node-id": node},
                     "finalizers": ["external-attacher/rbd-csi-ceph-com"]},
        "spec": {"attacher": "rbd.csi.ceph.com", "nodeName": node,
                 "source": {"persistentVolumeName": pv}},
        "status": {"attached": attached}
    })
}

pub fn node_object(conditions: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": NODE, "uid": "7d3c1e2f-node", "resourceVersion": "9000",
                     "labels": {"kubernetes.io/hostname": NODE}},
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {"conditions": conditions}
    })
}

pub fn ready_only() -> Value {
    json!([{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2025-12-01T00:00:00Z"}])
}

/// A pod as the API server returns it: `node` ("" when unscheduled), its volumes
/// (`(name, volume source)`), its containers (`(name, container id)`, with hostPath mounts
/// `(volume, mountPath)` for the first), its phase and, when `waiting`, every container waiting
/// with that reason.
pub struct PodSpec<'a> {
    pub name: &'a str,
    pub namespace: &'a str,
    pub uid: &'a str,
    pub node: &'a str,
    pub phase: &'a str,
    pub waiting: Option<&'a str>,
    pub volumes: Vec<Value>,
    pub containers: Vec<(&'a str, &'a str)>,
    pub mounts: Vec<(&'a str, &'a str)>,
}

pub fn pod_object(p: &PodSpec<'_>) -> Value {
    let containers: Vec<Value> = p
        .containers
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let mounts: Vec<Value> = if i == 0 {
                p.mounts.iter().map(|(v, at)| json!({"name": v, "mountPath": at, "readOnly": true})).collect()
            } else {
                Vec::new()
            };
            json!({"name": name, "image": format!("registry.example/{name}:1"), "volumeMounts": mounts})
        })
        .collect();
    let statuses: Vec<Value> = p
        .containers
        .iter()
        .map(|(name, id)| {
            let state = match p.waiting {
                Some(reason) => json!({"waiting": {"reason": reason}}),
                None => json!({"running": {"startedAt": "2026-01-01T00:00:00Z"}}),
            };
            let mut s = json!({"name": name, "image": format!("registry.example/{name}:1"), "imageID": "",
                               "ready": p.waiting.is_none(), "restartCount": 0, "started": p.waiting.is_none(),
                               "state": state});
            if !id.is_empty() {
                s["containerID"] = json!(format!("containerd://{id}"));
            }
            s
        })
        .collect();
    let mut spec = json!({"containers": containers, "volumes": p.volumes, "restartPolicy": "Always"});
    if !p.node.is_empty() {
        spec["nodeName"] = json!(p.node);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "resourceVersion": "700",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
        "status": {"phase": p.phase, "containerStatuses": statuses, "qosClass": "BestEffort"}
    })
}

/// A core/v1 Event about `kind` `namespace/name` (`namespace` "" for a cluster-scoped object,
/// whose events live in `default`), as kubelet or a controller records it.
pub fn core_event(
    (kind, namespace, name, uid): (&str, &str, &str, &str),
    (reason, message): (&str, &str),
    component: &str,
    count: i32,
    last: &str,
) -> Value {
    let ns = if namespace.is_empty() { "default" } else { namespace };
    let mut involved = json!({"kind": kind, "name": name, "uid": uid, "apiVersion": "v1"});
    if !namespace.is_empty() {
        involved["namespace"] = json!(namespace);
    }
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{name}.{:x}", reason.len() * 7919 + count as usize), "namespace": ns,
                     "uid": format!("ev-{name}-{reason}"), "resourceVersion": "800",
                     "creationTimestamp": last},
        "involvedObject": involved, "reason": reason, "message": message, "type": "Warning",
        "source": {"component": component}, "count": count, "firstTimestamp": last, "lastTimestamp": last,
        "eventTime": null, "reportingComponent": component, "reportingInstance": ""
    })
}

/// The time `secs` seconds ago, as the API server prints times (RFC 3339, UTC).
pub fn ago(secs: i64) -> String {
    let t = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(secs);
    k8s_openapi::jiff::Timestamp::from_second(t.as_second()).map(|t| t.to_string()).unwrap_or_default()
}

/// A Node `name` with its InternalIP, its Ready condition (`True`, `False`, `Unknown`) and the
/// volumes its status lists attached and in use (unique names). A Ready node's kubelet posted
/// status 10 s ago; a NotReady one's last 80 s ago, and the node turned NotReady 40 s ago.
pub fn node_status(name: &str, ip: &str, ready: &str, attached: &[&str], in_use: &[&str]) -> Value {
    let (reason, message, heartbeat, transition) = match ready {
        "True" => ("KubeletReady", "kubelet is posting ready status", ago(10), ago(3 * 86_400)),
        _ => ("NodeStatusUnknown", "Kubelet stopped posting node status.", ago(80), ago(40)),
    };
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "900",
                     "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {
            "addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
            "conditions": [{"type": "Ready", "status": ready, "reason": reason, "message": message,
                            "lastHeartbeatTime": heartbeat, "lastTransitionTime": transition}],
            "volumesAttached": attached.iter().map(|v| json!({"name": v, "devicePath": ""})).collect::<Vec<_>>(),
            "volumesInUse": in_use
        }
    })
}

/// A bound PVC `namespace/name` of `pv`.
pub fn pvc_object(namespace: &str, name: &str, pv: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-claim-{name}"), "resourceVersion": "16"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                 "storageClassName": "standard", "volumeName": pv, "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}}
    })
}

/// A CSI PV `name` of `driver` with `handle` and `attributes`, bound to `namespace/claim`.
pub fn csi_pv(
    name: &str,
    driver: &str,
    handle: &str,
    attributes: Value,
    (namespace, claim): (&str, &str),
) -> Value {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "resourceVersion": "17", "finalizers": ["kubernetes.io/pv-protection"],
                     "annotations": {"pv.kubernetes.io/provisioned-by": driver}},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": namespace, "name": claim,
                         "uid": format!("uid-claim-{claim}"), "resourceVersion": "16"},
            "csi": {"driver": driver, "fsType": "ext4", "volumeHandle": handle, "volumeAttributes": attributes},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "standard", "volumeMode": "Filesystem"
        },
        "status": {"phase": "Bound"}
    })
}
