//! Kubernetes objects at issue 36's scale, shaped as the API server returns them (managed
//! fields, labels, annotations, a Node's 40 images and 5 conditions), and named so that they
//! agree with each other: volume `v` is a PV, its bound PVC and a VolumeAttachment to node
//! `v % nodes`, whose status lists it attached and in use; pod `p` claims volume `p / 2` when `p`
//! is even (and runs on that volume's node), else only a projected token. Node `i`'s addresses are
//! the IP its agent's rbd client reports (`10.a.b.c`).
//!
//! Shared by the console's memory measurement (`kube_scale_tests.rs`) and the acceptance bench
//! of issue 36 (`tests/benches/console_cluster.rs`, which serves them from the stand-in API
//! server and makes its stand-in agents' devices agree with them). Not part of the console: built
//! for its tests and with the `scale-objects` feature only.

use serde_json::{json, Value};

/// How many of each object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub nodes: usize,
    /// PVs, and as many PVCs and VolumeAttachments.
    pub volumes: usize,
    pub pods: usize,
}

/// Issue 36's cluster: 5,000 Nodes, 50,000 PVs, PVCs and VolumeAttachments, 100,000 pods.
pub const ISSUE_36: Shape = Shape { nodes: 5_000, volumes: 50_000, pods: 100_000 };

/// The CSI driver of every PV.
pub const DRIVER: &str = "rbd.csi.ceph.com";
/// The Ceph pool of every volume.
pub const POOL: &str = "replicapool";
/// How many namespaces the PVCs and pods are spread over.
pub const NAMESPACES: usize = 500;

/// Node `i`'s name.
pub fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// Node `i`'s InternalIP (and its agent's rbd client IP).
pub fn node_ip(i: usize) -> String {
    format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)
}

/// Volume `v`'s PV name.
pub fn pv_name(v: usize) -> String {
    format!("pvc-{v:08x}-8a0b-11e8-9a3b-fa163e6f1a5c")
}

/// Volume `v`'s rbd image (in [`POOL`]).
pub fn image_name(v: usize) -> String {
    format!("csi-vol-{v:08x}-8a0b-11e8-9a3b-fa163e6f1a5c")
}

/// Volume `v`'s CSI volume handle.
pub fn volume_handle(v: usize) -> String {
    format!("0001-0009-rook-ceph-0000000000000002-{v:08x}-8a0b-11e8-9a3b-fa163e6f1a5c")
}

/// The name Node status uses for volume `v` (`volumesAttached`, `volumesInUse`).
pub fn unique_name(v: usize) -> String {
    format!("kubernetes.io/csi/{DRIVER}^{}", volume_handle(v))
}

/// Volume `v`'s PVC: namespace and name.
pub fn pvc_of(v: usize) -> (String, String) {
    (format!("ns-{}", v % NAMESPACES), format!("data-{v}"))
}

/// Volume `v`'s VolumeAttachment name.
pub fn va_name(v: usize) -> String {
    format!("csi-{v:064x}")
}

impl Shape {
    /// The node volume `v` is attached to.
    pub fn volume_node(&self, v: usize) -> usize {
        v % self.nodes.max(1)
    }

    /// The volumes attached to node `i`.
    pub fn volumes_of_node(&self, i: usize) -> impl Iterator<Item = usize> {
        (i..self.volumes).step_by(self.nodes.max(1))
    }

    /// The volume pod `p` claims, if any.
    pub fn pod_claim(&self, p: usize) -> Option<usize> {
        (p.is_multiple_of(2) && p / 2 < self.volumes).then_some(p / 2)
    }

    /// The pod that claims volume `v`.
    pub fn pod_of_volume(&self, v: usize) -> Option<usize> {
        (2 * v < self.pods).then_some(2 * v)
    }

    /// The node pod `p` runs on: its volume's, else `p % nodes`.
    pub fn pod_node(&self, p: usize) -> usize {
        self.pod_claim(p).map_or(p % self.nodes.max(1), |v| self.volume_node(v))
    }

    /// Pod `p`'s namespace and name (a claiming pod lives in its claim's namespace).
    pub fn pod_of(&self, p: usize) -> (String, String) {
        let ns = self.pod_claim(p).map_or(format!("ns-{}", (p / 2) % NAMESPACES), |v| pvc_of(v).0);
        (ns, format!("app-{p}-7d9f8c6b5-x2k4q"))
    }
}

/// Pod `p`'s uid.
pub fn pod_uid(p: usize) -> String {
    format!("uid-pod-{p}")
}

fn managed() -> Value {
    json!([{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-03T08:12:44Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:pv.kubernetes.io/bind-completed": {}}},
                          "f:spec": {"f:volumeName": {}}, "f:status": {"f:phase": {}}}}])
}

/// Node `i`, Ready, with its volumes attached and in use.
pub fn node(s: &Shape, i: usize) -> Value {
    let name = node_name(i);
    let images: Vec<Value> = (0..40)
        .map(|k| {
            json!({"names": [format!("registry.example.com/team-{k}/service@sha256:{:064x}", k * 7919 + i),
                                   format!("registry.example.com/team-{k}/service:v1.{k}.0")],
                        "sizeBytes": 123_456_789 + k})
        })
        .collect();
    let volumes: Vec<String> = s.volumes_of_node(i).map(unique_name).collect();
    let attached: Vec<Value> = volumes.iter().map(|u| json!({"name": u, "devicePath": ""})).collect();
    let conditions: Vec<Value> =
        ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
            .iter()
            .map(|t| {
                json!({"type": t, "status": if *t == "Ready" { "True" } else { "False" },
                   "lastHeartbeatTime": "2026-12-07T06:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z",
                   "reason": "KubeletReady", "message": "kubelet is posting ready status"})
            })
            .collect();
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "uid": format!("uid-node-{i}"), "resourceVersion": "9000",
                        "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                   "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "m5.2xlarge"},
                        "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                        "managedFields": managed()},
           "spec": {"podCIDR": "10.244.1.0/24", "providerID": format!("aws:///zone-a/i-{i:017x}")},
           "status": {"addresses": [{"type": "InternalIP", "address": node_ip(i)},
                                    {"type": "Hostname", "address": name}],
                      "conditions": conditions,
                      "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                      "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110"},
                      "nodeInfo": {"kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://1.7",
                                   "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux",
                                   "architecture": "amd64", "machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                                   "bootID": format!("{i:032x}")},
                      "images": images, "volumesAttached": attached, "volumesInUse": volumes}})
}

/// Volume `v`'s PV (ceph-csi rbd, bound).
pub fn pv(v: usize) -> Value {
    let (ns, claim) = pvc_of(v);
    json!({"apiVersion": "v1", "kind": "PersistentVolume",
           "metadata": {"name": pv_name(v), "uid": format!("uid-pv-{v}"), "resourceVersion": "17",
                        "finalizers": ["kubernetes.io/pv-protection", "external-attacher/rbd-csi-ceph-com"],
                        "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER}, "managedFields": managed()},
           "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
                    "claimRef": {"kind": "PersistentVolumeClaim", "namespace": ns,
                                 "name": claim, "uid": format!("uid-pvc-{v}"), "resourceVersion": "16"},
                    "csi": {"driver": DRIVER, "fsType": "ext4",
                            "volumeHandle": volume_handle(v),
                            "volumeAttributes": {"clusterID": "rook-ceph", "pool": POOL, "imageFeatures": "layering",
                                                 "imageName": image_name(v),
                                                 "journalPool": POOL, "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-rbd.csi.ceph.com"},
                            "nodeStageSecretRef": {"name": "rook-csi-rbd-node", "namespace": "rook-ceph"}},
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "rook-ceph-block", "volumeMode": "Filesystem"},
           "status": {"phase": "Bound"}})
}

/// Volume `v`'s PVC, bound to its PV.
pub fn pvc(v: usize) -> Value {
    let (ns, name) = pvc_of(v);
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": name, "namespace": ns, "uid": format!("uid-pvc-{v}"),
                        "resourceVersion": "16", "labels": {"app": format!("app-{}", v % 1000)},
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/storage-provisioner": DRIVER},
                        "finalizers": ["kubernetes.io/pvc-protection"], "managedFields": managed()},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "rook-ceph-block", "volumeMode": "Filesystem",
                    "volumeName": pv_name(v)},
           "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}}})
}

/// Volume `v`'s VolumeAttachment to its node (`attached` as given).
pub fn va(s: &Shape, v: usize, attached: bool) -> Value {
    let node = node_name(s.volume_node(v));
    json!({"apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
           "metadata": {"name": va_name(v), "resourceVersion": "95",
                        "annotations": {"csi.alpha.kubernetes.io/node-id": node.clone()},
                        "finalizers": ["external-attacher/rbd-csi-ceph-com"], "managedFields": managed()},
           "spec": {"attacher": DRIVER, "nodeName": node,
                    "source": {"persistentVolumeName": pv_name(v)}},
           "status": {"attached": attached}})
}

/// Pod `p` in `phase` (`Running`; or `Pending`, its container waiting in `ContainerCreating`),
/// restarted `restarts` times.
pub fn pod(s: &Shape, p: usize, phase: &str, restarts: u32) -> Value {
    let mut volumes = vec![json!({"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}})];
    if let Some(v) = s.pod_claim(p) {
        volumes.push(json!({"name": "data", "persistentVolumeClaim": {"claimName": pvc_of(v).1}}));
    }
    let container = |n: &str| {
        json!({"name": n, "image": "registry.example.com/team/service:v1.2.3",
        "env": (0..8).map(|k| json!({"name": format!("VAR_{k}"), "value": "some-value"})).collect::<Vec<_>>(),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]})
    };
    let state = if phase == "Running" {
        json!({"running": {"startedAt": "2026-11-03T08:12:44Z"}})
    } else {
        json!({"waiting": {"reason": "ContainerCreating"}})
    };
    let (ns, name) = s.pod_of(p);
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns,
                        "uid": pod_uid(p), "resourceVersion": "4242", "labels": {"app": "shop", "pod-template-hash": "7d9f8c6b5"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-7d9f8c6b5", "uid": "uid-rs", "controller": true}],
                        "managedFields": managed()},
           "spec": {"nodeName": node_name(s.pod_node(p)), "containers": [container("app"), container("sidecar")],
                    "volumes": volumes, "serviceAccountName": "default"},
           "status": {"phase": phase, "podIP": "10.244.1.7",
                      "conditions": [{"type": "Ready", "status": if phase == "Running" { "True" } else { "False" }},
                                     {"type": "PodScheduled", "status": "True"}],
                      "containerStatuses": [{"name": "app", "ready": phase == "Running", "restartCount": restarts,
                                             "image": "registry.example.com/team/service:v1.2.3",
                                             "imageID": "sha256:abc", "state": state}]}})
}
