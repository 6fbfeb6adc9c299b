//! A measurement of the Kubernetes view at issue 36's scale (5,000 Nodes, 50,000 PVs, PVCs and
//! VolumeAttachments, 100,000 pods, half of them with a PVC), with objects shaped as the API
//! server returns them (managed fields, labels, annotations, a Node's images and conditions):
//! the memory the console's tables keep (stripped compact JSON, one copy) against the same
//! objects kept whole as Rust values (how the tables kept them before), in one run, and the time
//! a relist of every collection takes. Ignored: run alone, one thread, for the RSS figures. The
//! objects are [`crate::scale_objects`]' (the acceptance bench serves the same ones).

use std::sync::Arc;
use std::time::Instant;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde_json::Value;

use crate::cluster::Cluster;
use crate::scale_objects::{self as objects, pv, pvc, ISSUE_36};

const NODES: usize = ISSUE_36.nodes;
const VOLUMES: usize = ISSUE_36.volumes;
const PODS: usize = ISSUE_36.pods;

fn node(i: usize) -> Value {
    objects::node(&ISSUE_36, i)
}

fn va(v: usize) -> Value {
    objects::va(&ISSUE_36, v, true)
}

fn pod(p: usize) -> Value {
    objects::pod(&ISSUE_36, p, "Running", 0)
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
        assert!(c.pvs.get(&objects::pv_name(i)).is_some());
        assert!(!c.vas.by(&format!("node:{}", objects::node_name(i % NODES))).is_empty());
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
