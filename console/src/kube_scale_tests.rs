//! A measurement of the Kubernetes view at issue 36's scale (5,000 Nodes, 50,000 PVs, PVCs and
//! VolumeAttachments, 100,000 pods, half of them with a PVC), with objects shaped as the API
//! server returns them (managed fields, labels, annotations, a Node's images and conditions):
//! the memory the console's tables keep (stripped compact JSON, one copy) against the same
//! objects kept whole as Rust values (how the tables kept them before), in one run, and the time
//! a relist of every collection takes. Ignored: run alone, one thread, for the RSS figures.

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::{json, Value};

use crate::cluster::Cluster;

const NODES: usize = 5_000;
const VOLUMES: usize = 50_000;
const PODS: usize = 100_000;

fn managed() -> Value {
    json!([{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-11-03T08:12:44Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:pv.kubernetes.io/bind-completed": {}}},
                          "f:spec": {"f:volumeName": {}}, "f:status": {"f:phase": {}}}}])
}

fn node(i: usize) -> Value {
    let images: Vec<Value> = (0..40)
        .map(|k| {
            json!({"names": [format!("registry.example.com/team-{k}/service@sha256:{:064x}", k * 7919 + i),
                                   format!("registry.example.com/team-{k}/service:v1.{k}.0")],
                        "sizeBytes": 123_456_789 + k})
        })
        .collect();
    let attached: Vec<Value> = (0..10)
        .map(|k| json!({"name": format!("kubernetes.io/csi/rbd.csi.ceph.com^0001-0009-rook-ceph-{:016x}", i * 10 + k),
                        "devicePath": ""}))
        .collect();
    let conditions: Vec<Value> =
        ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"]
            .iter()
            .map(|t| {
                json!({"type": t, "status": if *t == "Ready" { "True" } else { "False" },
                   "lastHeartbeatTime": "2026-12-07T06:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z",
                   "reason": "KubeletReady", "message": "kubelet is posting ready status"})
            })
            .collect();
    json!({"metadata": {"name": format!("node-{i:05}"), "uid": format!("uid-node-{i}"), "resourceVersion": "9000",
                        "labels": {"kubernetes.io/hostname": format!("node-{i:05}"), "kubernetes.io/os": "linux",
                                   "topology.kubernetes.io/zone": "zone-a", "node.kubernetes.io/instance-type": "m5.2xlarge"},
                        "annotations": {"node.alpha.kubernetes.io/ttl": "0", "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                        "managedFields": managed()},
           "spec": {"podCIDR": "10.244.1.0/24", "providerID": format!("aws:///zone-a/i-{i:017x}")},
           "status": {"addresses": [{"type": "InternalIP", "address": format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256)},
                                    {"type": "Hostname", "address": format!("node-{i:05}")}],
                      "conditions": conditions,
                      "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                      "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110"},
                      "nodeInfo": {"kernelVersion": "6.8.0", "osImage": "Ubuntu 24.04", "containerRuntimeVersion": "containerd://1.7",
                                   "kubeletVersion": "v1.31.2", "kubeProxyVersion": "v1.31.2", "operatingSystem": "linux",
                                   "architecture": "amd64", "machineID": format!("{i:032x}"), "systemUUID": format!("{i:032x}"),
                                   "bootID": format!("{i:032x}")},
                      "images": images, "volumesAttached": attached,
                      "volumesInUse": (0..10).map(|k| format!("kubernetes.io/csi/rbd.csi.ceph.com^0001-0009-rook-ceph-{:016x}", i * 10 + k)).collect::<Vec<_>>()}})
}

fn pv(i: usize) -> Value {
    json!({"metadata": {"name": format!("pvc-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c"), "resourceVersion": "17",
                        "finalizers": ["kubernetes.io/pv-protection", "external-attacher/rbd-csi-ceph-com"],
                        "annotations": {"pv.kubernetes.io/provisioned-by": "rbd.csi.ceph.com"}, "managedFields": managed()},
           "spec": {"accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
                    "claimRef": {"kind": "PersistentVolumeClaim", "namespace": format!("ns-{}", i % 500),
                                 "name": format!("data-{i}"), "uid": format!("uid-pvc-{i}"), "resourceVersion": "16"},
                    "csi": {"driver": "rbd.csi.ceph.com", "fsType": "ext4",
                            "volumeHandle": format!("0001-0009-rook-ceph-0000000000000002-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c"),
                            "volumeAttributes": {"clusterID": "rook-ceph", "pool": "replicapool", "imageFeatures": "layering",
                                                 "imageName": format!("csi-vol-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c"),
                                                 "journalPool": "replicapool", "storage.kubernetes.io/csiProvisionerIdentity": "1700000000000-8081-rbd.csi.ceph.com"},
                            "nodeStageSecretRef": {"name": "rook-csi-rbd-node", "namespace": "rook-ceph"}},
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "rook-ceph-block", "volumeMode": "Filesystem"},
           "status": {"phase": "Bound"}})
}

fn pvc(i: usize) -> Value {
    json!({"metadata": {"name": format!("data-{i}"), "namespace": format!("ns-{}", i % 500), "uid": format!("uid-pvc-{i}"),
                        "resourceVersion": "16", "labels": {"app": format!("app-{}", i % 1000)},
                        "annotations": {"pv.kubernetes.io/bind-completed": "yes", "volume.kubernetes.io/storage-provisioner": "rbd.csi.ceph.com"},
                        "finalizers": ["kubernetes.io/pvc-protection"], "managedFields": managed()},
           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                    "storageClassName": "rook-ceph-block", "volumeMode": "Filesystem",
                    "volumeName": format!("pvc-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c")},
           "status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"}}})
}

fn va(i: usize) -> Value {
    let node = format!("node-{:05}", i % NODES);
    json!({"metadata": {"name": format!("csi-{i:064x}"), "resourceVersion": "95",
                        "annotations": {"csi.alpha.kubernetes.io/node-id": node.clone()},
                        "finalizers": ["external-attacher/rbd-csi-ceph-com"], "managedFields": managed()},
           "spec": {"attacher": "rbd.csi.ceph.com", "nodeName": node,
                    "source": {"persistentVolumeName": format!("pvc-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c")}},
           "status": {"attached": true}})
}

fn pod(i: usize) -> Value {
    let mut volumes = vec![json!({"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}]}})];
    if i.is_multiple_of(2) {
        volumes
            .push(json!({"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{}", i / 2)}}));
    }
    let container = |n: &str| {
        json!({"name": n, "image": "registry.example.com/team/service:v1.2.3",
        "env": (0..8).map(|k| json!({"name": format!("VAR_{k}"), "value": "some-value"})).collect::<Vec<_>>(),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
        "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]})
    };
    json!({"metadata": {"name": format!("app-{i}-7d9f8c6b5-x2k4q"), "namespace": format!("ns-{}", (i / 2) % 500),
                        "uid": format!("uid-pod-{i}"), "resourceVersion": "4242", "labels": {"app": "shop", "pod-template-hash": "7d9f8c6b5"},
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "app-7d9f8c6b5", "uid": "uid-rs", "controller": true}],
                        "managedFields": managed()},
           "spec": {"nodeName": format!("node-{:05}", i % NODES), "containers": [container("app"), container("sidecar")],
                    "volumes": volumes, "serviceAccountName": "default"},
           "status": {"phase": "Running", "podIP": "10.244.1.7",
                      "conditions": [{"type": "Ready", "status": "True"}, {"type": "PodScheduled", "status": "True"}],
                      "containerStatuses": [{"name": "app", "ready": true, "restartCount": 0, "image": "registry.example.com/team/service:v1.2.3",
                                             "imageID": "sha256:abc", "state": {"running": {"startedAt": "2026-11-03T08:12:44Z"}}}]}})
}

/// Resident memory of this process, bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: usize = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("rss pages");
    pages * 4096
}

/// Lists `n` objects into `table` one at a time, as a watch's list pages arrive (no second
/// copy of the collection is ever held).
fn fill<K>(table: &crate::kube_table::Table<K>, n: usize, make: fn(usize) -> Value)
where
    K: kube::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
{
    table.begin_relist();
    for i in 0..n {
        table.relisted(serde_json::from_value(make(i)).expect("a valid object"));
    }
    table.end_relist();
}

fn whole<K: serde::de::DeserializeOwned>(n: usize, make: fn(usize) -> Value) -> Vec<Arc<K>> {
    (0..n).map(|i| Arc::new(serde_json::from_value(make(i)).expect("a valid object"))).collect()
}

#[test]
#[ignore = "a measurement: cargo test -p blockjanitor-console --lib kube_view_at_issue_36_scale -- --ignored --nocapture --test-threads 1"]
fn kube_view_at_issue_36_scale_measured() {
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    let count = NODES + 3 * VOLUMES + PODS;
    // The tables as the console keeps them: every collection listed, then every PV relisted.
    let base = rss();
    let c = Cluster::default();
    let t = Instant::now();
    fill(&c.nodes, NODES, node);
    fill(&c.pvs, VOLUMES, pv);
    fill(&c.pvcs, VOLUMES, pvc);
    fill(&c.vas, VOLUMES, va);
    fill(&c.pods, PODS, pod);
    let listed = t.elapsed();
    let kept = rss().saturating_sub(base);
    let sizes = [c.nodes.size(), c.pvs.size(), c.pvcs.size(), c.vas.size(), c.pods.size()];
    let t = Instant::now();
    fill(&c.pvs, VOLUMES, pv);
    let relist = t.elapsed();
    let after_relist = rss().saturating_sub(base);
    // Questions read objects back: one PV by name, the attachments of a node.
    let t = Instant::now();
    for i in 0..1000 {
        let name = format!("pvc-{i:08x}-8a0b-11e8-9a3b-fa163e6f1a5c");
        assert!(c.pvs.get(&name).is_some());
        assert!(!c.vas.by(&format!("node:node-{:05}", i % NODES)).is_empty());
    }
    let lookups = t.elapsed() / 2000;
    drop(c);
    // The same objects kept whole, as Rust values (the tables before issue 36), from the same
    // base: the freed tables' memory is reused first, so this is the larger of the two.
    let kept_whole = (
        whole::<Node>(NODES, node),
        whole::<PersistentVolume>(VOLUMES, pv),
        whole::<PersistentVolumeClaim>(VOLUMES, pvc),
        whole::<VolumeAttachment>(VOLUMES, va),
        whole::<Pod>(PODS, pod),
    );
    let whole_rss = rss().saturating_sub(base);
    println!("objects: {count} ({NODES} Nodes, {VOLUMES} PVs, PVCs and VolumeAttachments, {PODS} pods)");
    for (name, (n, bytes)) in ["nodes", "pvs", "pvcs", "vas", "pods"].iter().zip(sizes) {
        println!("  {name}: {n} kept, {bytes} bytes, {} bytes each", bytes / n.max(1));
    }
    println!(
        "kept tables: RSS +{:.1} MiB ({} bytes an object listed) after the first lists ({listed:?}), \
         +{:.1} MiB after a relist of every PV ({relist:?})",
        mib(kept),
        kept / count,
        mib(after_relist)
    );
    println!(
        "kept whole as Rust values: RSS +{:.1} MiB ({} bytes an object); whole / kept = {:.1}",
        mib(whole_rss),
        whole_rss / count,
        whole_rss as f64 / kept.max(1) as f64
    );
    println!("a lookup reading an object back: {lookups:?}");
    assert_eq!(kept_whole.4.len(), PODS);
}
