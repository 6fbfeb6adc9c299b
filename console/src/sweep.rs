//! The fleet-wide sweep (issue 18): every volume the index knows of, and every VolumeAttachment,
//! looked at together, with one finding per volume and kind:
//!
//! - `multi_node`: the volume (an rbd image, a WWID, an nbd backend) is mapped on more than one
//!   node (a snapshot, read-only, is left out);
//! - `attached_not_in_use`: mapped on a node whose agent answered and nothing there uses it; or
//!   attached to such a node by a VolumeAttachment while its agent finds no mapping of it and the
//!   Node does not list it in use;
//! - `dead_node_watcher`: mapped (as last seen) or attached on a node whose agent cannot be asked
//!   (stopped, partitioned, no agent pod): its client may still watch the image, and nothing can
//!   vouch that it does not.
//!
//! Fails closed: the answer is `complete` (and may say "clean") only when every node answered, the
//! Kubernetes view, when there is one, is synced, and no agent reports a volume's device it cannot
//! vouch for (verdict unknown); otherwise it says "incomplete" and names what could not be known. Pure: the index, the Kubernetes objects and the missing nodes come in.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use crate::cluster::Cluster;
use crate::index::{image_key, Inner};
use crate::multiattach::{held, names_volume, volume_id, VolumeId};

/// Every kind, in the order answers and metrics list them.
pub const KINDS: [pb::FindingKind; 3] =
    [pb::FindingKind::MultiNode, pb::FindingKind::AttachedNotInUse, pb::FindingKind::DeadNodeWatcher];

/// A kind's name as metrics, JSON and tables print it.
pub fn kind_name(k: pb::FindingKind) -> &'static str {
    match k {
        pb::FindingKind::Unspecified => "unspecified",
        pb::FindingKind::MultiNode => "multi_node",
        pb::FindingKind::AttachedNotInUse => "attached_not_in_use",
        pb::FindingKind::DeadNodeWatcher => "dead_node_watcher",
    }
}

/// What Kubernetes says, when the console has its API.
#[derive(Default)]
pub struct KubeView {
    pub pvs: Vec<Arc<PersistentVolume>>,
    pub vas: Vec<Arc<VolumeAttachment>>,
    pub nodes: Vec<Arc<Node>>,
    /// Why the view cannot be trusted now (not synced), `None` when it can.
    pub not_synced: Option<String>,
}

impl KubeView {
    /// The cluster's tables now.
    pub fn of(c: &Cluster) -> Self {
        KubeView { pvs: c.pvs.all(), vas: c.vas.all(), nodes: c.nodes.all(), not_synced: c.not_synced() }
    }
}

/// The nodes answers cannot speak for: agents not reachable and synced, and, with the Kubernetes
/// API, every Node with no agent at all. By name.
pub fn missing_nodes(ix: &Inner, cluster: Option<&Cluster>) -> Vec<pb::MissingNode> {
    let mut m = ix.missing();
    if let Some(c) = cluster {
        for n in c.nodes.all() {
            let name = n.metadata.name.clone().unwrap_or_default();
            if !ix.nodes.contains_key(&name) {
                m.push(pb::MissingNode {
                    node: name,
                    reason: "no blockjanitor agent pod on this node".into(),
                });
            }
        }
        m.sort_by(|a, b| a.node.cmp(&b.node));
    }
    m
}

/// The sweep of the index now, with the cluster's view when there is one.
pub fn run(ix: &Inner, cluster: Option<&Cluster>, kinds: &[pb::FindingKind]) -> pb::SweepResponse {
    let kube = cluster.map(KubeView::of);
    sweep(ix, kube.as_ref(), missing_nodes(ix, cluster), kinds)
}

/// [`run`] for counting (metrics): the same findings, counts, completeness and summary, but each
/// finding carries only its kind.
pub fn counts(ix: &Inner, cluster: Option<&Cluster>) -> pb::SweepResponse {
    let kube = cluster.map(KubeView::of);
    sweep_with(ix, kube.as_ref(), missing_nodes(ix, cluster), &[], false)
}

/// The volume a device is a view of (`None`: not a volume, such as a loop device).
pub fn volume_of(d: &pb::Device) -> Option<(String, bool)> {
    if let Some(r) = &d.rbd {
        let image = image_key(&r.pool, &r.pool_namespace, &r.image);
        let snap = !(r.snap.is_empty() || r.snap == "-");
        return Some(if snap { (format!("{image}@{}", r.snap), true) } else { (image, false) });
    }
    if !d.wwid.is_empty() {
        return Some((d.wwid.to_ascii_lowercase(), false));
    }
    (!d.nbd_backend.is_empty()).then(|| (d.nbd_backend.clone(), false))
}

/// One volume: its devices by node, whether it is a snapshot, its PV.
#[derive(Default)]
struct Volume<'a> {
    by_node: BTreeMap<&'a str, Vec<&'a pb::Device>>,
    snapshot: bool,
    pv: String,
}

fn clients_of(devices: &[&pb::Device]) -> Vec<String> {
    let mut out: Vec<String> = devices
        .iter()
        .filter_map(|d| d.rbd.as_ref())
        .map(|r| format!("{} {}", r.client_id, r.client_addr).trim().to_owned())
        .filter(|c| !c.is_empty())
        .collect();
    out.dedup();
    out
}

fn fleet_devices(node: &str, devices: &[&pb::Device]) -> Vec<pb::FleetDevice> {
    devices.iter().map(|d| pb::FleetDevice { node: node.to_owned(), device: Some((*d).clone()) }).collect()
}

fn device_state(d: &pb::Device) -> String {
    if held(d) {
        d.holders.first().map(|h| h.description.clone()).unwrap_or_else(|| "in use".to_owned())
    } else {
        blockjanitor_ctl::names::verdict_name(d.verdict)
    }
}

/// Whether nothing on an answering node uses the device, and the agent can vouch for it.
fn unused(d: &pb::Device) -> bool {
    !held(d)
        && [pb::Verdict::Stale, pb::Verdict::Suspect, pb::Verdict::Unused]
            .iter()
            .any(|v| *v as i32 == d.verdict)
}

/// A node's devices of one volume when nothing there uses it: the top of the group (a multipath
/// map over its paths, which share its WWID and are held only by it), every one unused, and no
/// holder anywhere in the group. `None` when something uses it or the agent cannot vouch.
fn idle_top<'a>(ds: &[&'a pb::Device]) -> Option<Vec<&'a pb::Device>> {
    if let [d] = ds {
        // One device (the usual case): no group to look inside.
        let quiet = d.holders.is_empty() && d.stacked_on_top.is_empty();
        return (quiet && unused(d)).then(|| vec![*d]);
    }
    let names: BTreeSet<&str> = ds.iter().map(|d| d.name.as_str()).collect();
    let top: Vec<&pb::Device> =
        ds.iter().filter(|d| !d.stacked_on_top.iter().any(|t| names.contains(t.as_str()))).copied().collect();
    let outside = |d: &pb::Device| d.stacked_on_top.iter().any(|t| !names.contains(t.as_str()));
    let quiet = ds.iter().all(|d| {
        d.holders.is_empty()
            && !outside(d)
            && d.verdict != pb::Verdict::Unknown as i32
            && d.verdict != pb::Verdict::Protected as i32
    });
    (quiet && !top.is_empty() && top.iter().all(|d| unused(d))).then_some(top)
}

/// Sweeps the fleet. `missing` are the nodes answers cannot speak for (the service's list: agents
/// not reachable or not synced, Nodes with no agent); `kinds` limits the findings (empty: all).
pub fn sweep(
    index: &Inner,
    kube: Option<&KubeView>,
    missing: Vec<pb::MissingNode>,
    kinds: &[pb::FindingKind],
) -> pb::SweepResponse {
    sweep_with(index, kube, missing, kinds, true)
}

/// [`sweep`], with every finding in full or (`full` false, for counting) only its kind.
fn sweep_with(
    index: &Inner,
    kube: Option<&KubeView>,
    missing: Vec<pb::MissingNode>,
    kinds: &[pb::FindingKind],
    full: bool,
) -> pb::SweepResponse {
    let missing_names: BTreeSet<&str> = missing.iter().map(|m| m.node.as_str()).collect();
    let pv_ids: Vec<VolumeId> =
        kube.map(|k| k.pvs.iter().map(|p| volume_id(p)).collect()).unwrap_or_default();
    let pv_by_volume: HashMap<&str, &str> = pv_ids
        .iter()
        .flat_map(|v| v.images.iter().chain(&v.wwids).map(move |i| (i.as_str(), v.pv.as_str())))
        .collect();
    let pv_of = |volume: &str| pv_by_volume.get(volume).map(|p| (*p).to_owned()).unwrap_or_default();

    let mut volumes: BTreeMap<String, Volume> = BTreeMap::new();
    for n in index.nodes.values() {
        for d in n.devices.values() {
            let Some((key, snapshot)) = volume_of(d) else { continue };
            let v = volumes.entry(key.clone()).or_default();
            v.snapshot = snapshot;
            if v.pv.is_empty() {
                v.pv = d.pv_names.first().cloned().unwrap_or_else(|| pv_of(&key));
            }
            v.by_node.entry(n.name.as_str()).or_default().push(d);
        }
    }

    let mut findings = Vec::new();
    // Counting only (metrics): no device copied, no detail written.
    let mut add = |kind: pb::FindingKind, build: &dyn Fn() -> pb::Finding| {
        if !kinds.is_empty() && !kinds.contains(&kind) {
            return;
        }
        let mut f = if full { build() } else { pb::Finding::default() };
        f.kind = kind as i32;
        findings.push(f);
    };
    for (key, v) in &volumes {
        if v.by_node.len() > 1 && !v.snapshot {
            add(pb::FindingKind::MultiNode, &|| {
                let parts: Vec<String> = v
                    .by_node
                    .iter()
                    .map(|(n, ds)| {
                        let last = if missing_names.contains(n) { ", as last seen" } else { "" };
                        let states: Vec<String> =
                            ds.iter().map(|d| format!("{} {}", d.name, device_state(d))).collect();
                        format!("{n} ({}{last})", states.join(", "))
                    })
                    .collect();
                pb::Finding {
                    volume: key.clone(),
                    pv: v.pv.clone(),
                    nodes: v.by_node.keys().map(|n| (*n).to_owned()).collect(),
                    devices: v.by_node.iter().flat_map(|(n, ds)| fleet_devices(n, ds)).collect(),
                    clients: v.by_node.values().flat_map(|ds| clients_of(ds)).collect(),
                    detail: format!("mapped on {} nodes: {}", v.by_node.len(), parts.join("; ")),
                    ..Default::default()
                }
            });
        }
        for (n, ds) in &v.by_node {
            if missing_names.contains(n) {
                let rbd: Vec<&pb::Device> = ds.iter().filter(|d| d.rbd.is_some()).copied().collect();
                if rbd.is_empty() {
                    continue;
                }
                let reason = missing.iter().find(|m| m.node == *n).map(|m| m.reason.as_str()).unwrap_or("");
                add(pb::FindingKind::DeadNodeWatcher, &|| {
                    pb::Finding {
                    volume: key.clone(),
                    pv: v.pv.clone(),
                    nodes: vec![(*n).to_owned()],
                    clients: clients_of(&rbd),
                    detail: format!(
                        "last seen mapped on {n} ({}), whose agent cannot be asked ({reason}): its client may \
                         still watch the image; never unfence or delete on this evidence",
                        rbd.iter().map(|d| d.name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                    devices: fleet_devices(n, &rbd),
                    ..Default::default()
                }
                });
                continue;
            }
            let Some(idle) = idle_top(ds) else { continue };
            add(pb::FindingKind::AttachedNotInUse, &|| pb::Finding {
                volume: key.clone(),
                pv: v.pv.clone(),
                nodes: vec![(*n).to_owned()],
                clients: clients_of(&idle),
                detail: format!(
                    "mapped on {n} and nothing there uses it: {}",
                    idle.iter()
                        .map(|d| format!("{} {}", d.name, blockjanitor_ctl::names::verdict_name(d.verdict)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                devices: fleet_devices(n, &idle),
                ..Default::default()
            });
        }
    }
    if let Some(k) = kube {
        findings.extend(attachment_findings(index, k, &pv_ids, &missing));
        if !kinds.is_empty() {
            findings.retain(|f| kinds.iter().any(|k| *k as i32 == f.kind));
        }
    }
    findings.sort_by(|a, b| (a.kind, &a.volume, &a.nodes).cmp(&(b.kind, &b.volume, &b.nodes)));
    let counts = KINDS
        .iter()
        .filter(|k| kinds.is_empty() || kinds.contains(k))
        .map(|k| (kind_name(*k).to_owned(), findings.iter().filter(|f| f.kind == *k as i32).count() as u32))
        .collect();
    let mut gaps: Vec<String> = kube.and_then(|k| k.not_synced.clone()).into_iter().collect();
    // A volume attached to a Node that has no agent at all: nothing on it can be asked, so the
    // sweep cannot vouch for that attachment (it makes no finding either: the node is alive).
    let unagented: BTreeSet<&str> = kube
        .map(|k| {
            k.vas
                .iter()
                .filter(|va| va.status.as_ref().is_some_and(|s| s.attached))
                .map(|va| va.spec.node_name.as_str())
                .filter(|n| !index.nodes.contains_key(*n))
                .filter(|n| k.nodes.iter().any(|node| node.metadata.name.as_deref() == Some(*n)))
                .collect()
        })
        .unwrap_or_default();
    if !unagented.is_empty() {
        gaps.push(format!(
            "volumes are attached to {} node(s) with no agent: {}",
            unagented.len(),
            unagented.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    // An agent that answered but cannot vouch for a device (verdict unknown): nothing is known
    // about that volume there, so the sweep cannot be clean either.
    let unvouched: Vec<String> = volumes
        .values()
        .flat_map(|v| v.by_node.iter())
        .filter(|(n, _)| !missing_names.contains(*n))
        .flat_map(|(n, ds)| {
            ds.iter()
                .filter(|d| d.verdict == pb::Verdict::Unknown as i32)
                .map(move |d| format!("{n}/{}", d.name))
        })
        .collect();
    if !unvouched.is_empty() {
        let more = unvouched.len().saturating_sub(10);
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        gaps.push(format!(
            "the agents cannot vouch for {} device(s) (verdict unknown): {}{tail}",
            unvouched.len(),
            unvouched[..unvouched.len().min(10)].join(", ")
        ));
    }
    let complete = missing.is_empty() && gaps.is_empty();
    let summary = summary_line(&findings, &missing, &gaps, kube.is_none());
    pb::SweepResponse {
        findings,
        missing_nodes: missing,
        complete,
        volumes: volumes.len() as u32,
        summary,
        counts,
    }
}

/// VolumeAttachments that attach a volume to a node that cannot be asked (`dead_node_watcher`)
/// or to an answering node that neither maps it nor lists it in use (`attached_not_in_use`).
fn attachment_findings(
    index: &Inner,
    k: &KubeView,
    pv_ids: &[VolumeId],
    missing: &[pb::MissingNode],
) -> Vec<pb::Finding> {
    let mut out = Vec::new();
    for va in &k.vas {
        if !va.status.as_ref().is_some_and(|s| s.attached) {
            continue;
        }
        let Some(pv) = va.spec.source.persistent_volume_name.as_deref() else { continue };
        let Some(v) = pv_ids.iter().find(|v| v.pv == pv) else { continue };
        let node = va.spec.node_name.as_str();
        let va_text =
            format!("{} (node={node}, attached=true)", va.metadata.name.clone().unwrap_or_default());
        let volume = v.images.first().or(v.wwids.first()).cloned().unwrap_or_else(|| format!("pv/{pv}"));
        // The one finding an attachment makes: of `kind`, on this node, saying `detail`.
        let finding = |kind: pb::FindingKind, detail: String| pb::Finding {
            kind: kind as i32,
            volume: volume.clone(),
            pv: pv.to_owned(),
            nodes: vec![node.to_owned()],
            volume_attachments: vec![va_text.clone()],
            detail,
            ..Default::default()
        };
        if let Some(m) = missing.iter().find(|m| m.node == node) {
            // Its last-seen mappings already make a finding; the attachment alone does too.
            let mapped = crate::multiattach::devices_of(index, v).contains_key(node);
            if !mapped {
                out.push(finding(
                    pb::FindingKind::DeadNodeWatcher,
                    format!(
                        "attached to {node}, whose agent cannot be asked ({}): its client may still watch \
                         the volume",
                        m.reason
                    ),
                ));
            }
            continue;
        }
        let is_node = k.nodes.iter().any(|n| n.metadata.name.as_deref() == Some(node));
        if !index.nodes.contains_key(node) {
            if !is_node {
                out.push(finding(
                    pb::FindingKind::DeadNodeWatcher,
                    format!(
                        "attached to {node}, which is no Node of the cluster any more and has no agent: if the \
                         machine still runs, its client may still watch the volume"
                    ),
                ));
            }
            continue;
        }
        if crate::multiattach::devices_of(index, v).contains_key(node) {
            continue;
        }
        let in_use = k.nodes.iter().any(|n| {
            n.metadata.name.as_deref() == Some(node)
                && n.status
                    .as_ref()
                    .and_then(|s| s.volumes_in_use.as_ref())
                    .is_some_and(|l| l.iter().any(|u| names_volume(u, v)))
        });
        if !in_use {
            out.push(finding(
                pb::FindingKind::AttachedNotInUse,
                format!(
                    "VolumeAttachment {va_text} attaches it to {node}, whose agent finds no mapping of it, and \
                     the Node does not list it in use"
                ),
            ));
        }
    }
    out
}

fn summary_line(
    findings: &[pb::Finding],
    missing: &[pb::MissingNode],
    other_gaps: &[String],
    no_kube: bool,
) -> String {
    let found = match findings.len() {
        0 => "no finding".to_owned(),
        n => format!("{n} finding(s)"),
    };
    let mut gaps = Vec::new();
    if !missing.is_empty() {
        let names: Vec<&str> = missing.iter().map(|m| m.node.as_str()).collect();
        gaps.push(format!("{} node(s) did not answer ({})", missing.len(), names.join(", ")));
    }
    gaps.extend(other_gaps.iter().cloned());
    let tail = if no_kube { " (without the Kubernetes API: VolumeAttachments not examined)" } else { "" };
    match (gaps.is_empty(), findings.is_empty()) {
        (false, _) => format!("incomplete: {}; {found} among what answered{tail}", gaps.join("; ")),
        (true, true) => format!("clean: every node answered and no volume needs attention{tail}"),
        (true, false) => format!("{found}; every node answered{tail}"),
    }
}

#[cfg(test)]
#[path = "sweep_tests.rs"]
mod tests;
