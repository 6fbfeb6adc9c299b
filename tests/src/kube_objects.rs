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
        "metadata": {"name": name, "resourceVersion": "17", "finalizers": ["kubernetes.io/pv-protection"],
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
