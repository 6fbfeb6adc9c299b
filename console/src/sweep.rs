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
//! vouch for (verdict unknown); otherwise it says "incomplete" and names what could not be known,
//! node by node. Pure: the index, the Kubernetes view and the missing nodes come in.
//!
//! Made of parts: a volume's findings ([`volume_part`], from the devices that are it) and a PV's
//! ([`crate::sweep_attach::pv_part`], from its VolumeAttachments); [`sweep`] puts every part
//! together at once, [`crate::sweeper`] keeps the parts current as events arrive and puts them
//! together the same way ([`assemble`]).

use std::collections::{BTreeMap, BTreeSet};

use blockjanitor_proto::v1 as pb;

use crate::cluster::Cluster;
use crate::index::{Inner, Key};
use crate::multiattach::held;
pub use crate::sweep_attach::{pv_part, Attachment, KubeView};
pub use crate::sweep_part::{Missing, Part};

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

/// The nodes answers cannot speak for: agents not reachable and synced (or stale), and, with the
/// Kubernetes API, every Node with no agent at all. By name.
pub fn missing_nodes(ix: &Inner, cluster: Option<&Cluster>) -> Vec<pb::MissingNode> {
    let mut m = ix.missing();
    if let Some(c) = cluster {
        for name in c.nodes.keys() {
            if !ix.nodes.contains_key(&name) {
                m.push(pb::MissingNode { node: name, reason: NO_AGENT.into(), ..Default::default() });
            }
        }
        m.sort_by(|a, b| a.node.cmp(&b.node));
    }
    m
}

/// Why a Node with no agent is missing.
pub const NO_AGENT: &str = "no blockjanitor agent pod on this node";

pub use crate::volume_key::volume_of;

/// One volume: its devices by node, whether it is a snapshot, its PV.
#[derive(Default)]
pub struct Volume<'a> {
    pub by_node: BTreeMap<&'a str, Vec<&'a pb::Device>>,
    pub snapshot: bool,
    pub pv: String,
}

impl<'a> Volume<'a> {
    /// Adds a device (nodes in name order, devices in name order, as the index keeps them): the
    /// PV is the first device's that names one, else `pv_of` the volume.
    fn add(
        &mut self,
        key: &str,
        node: &'a str,
        d: &'a pb::Device,
        snapshot: bool,
        pv_of: &dyn Fn(&str) -> String,
    ) {
        self.snapshot = snapshot;
        if self.pv.is_empty() {
            self.pv = d.pv_names.first().cloned().unwrap_or_else(|| pv_of(key));
        }
        self.by_node.entry(node).or_default().push(d);
    }
}

/// The devices that are volume `key`, found through the index's keys (its image, WWID or nbd
/// backend), by node.
pub fn gather<'a>(ix: &'a Inner, key: &str, pv_of: &dyn Fn(&str) -> String) -> Volume<'a> {
    let base = key.split('@').next().unwrap_or(key);
    let mut found: BTreeSet<(&'a str, &'a str)> = BTreeSet::new();
    for k in [Key::Image(base.to_owned()), Key::Wwid(key.to_owned()), Key::NbdBackend(key.to_owned())] {
        found.extend(ix.keyed(&k));
    }
    let mut v = Volume::default();
    for (node, name) in found {
        let Some(d) = ix.nodes.get(node).and_then(|n| n.devices.get(name)) else { continue };
        match volume_of(d) {
            Some((k, snapshot)) if k == key => v.add(key, node, d, snapshot, pv_of),
            _ => {}
        }
    }
    v
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
        blockjanitor_rpc::view::names::verdict_name(d.verdict)
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

fn multi_node(key: &str, v: &Volume<'_>, missing: &Missing) -> pb::Finding {
    let parts: Vec<String> = v
        .by_node
        .iter()
        .map(|(n, ds)| {
            let last = if missing.contains_key(*n) { ", as last seen" } else { "" };
            let states: Vec<String> = ds.iter().map(|d| format!("{} {}", d.name, device_state(d))).collect();
            format!("{n} ({}{last})", states.join(", "))
        })
        .collect();
    pb::Finding {
        kind: pb::FindingKind::MultiNode as i32,
        volume: key.to_owned(),
        pv: v.pv.clone(),
        nodes: v.by_node.keys().map(|n| (*n).to_owned()).collect(),
        devices: v.by_node.iter().flat_map(|(n, ds)| fleet_devices(n, ds)).collect(),
        clients: v.by_node.values().flat_map(|ds| clients_of(ds)).collect(),
        detail: format!("mapped on {} nodes: {}", v.by_node.len(), parts.join("; ")),
        ..Default::default()
    }
}

/// One volume's findings (from its devices on every node) and its devices the agents cannot
/// vouch for.
pub fn volume_part(key: &str, v: &Volume<'_>, missing: &Missing) -> Part {
    let mut part = Part::default();
    if v.by_node.len() > 1 && !v.snapshot {
        part.findings.push(multi_node(key, v, missing));
    }
    for (n, ds) in &v.by_node {
        if let Some(reason) = missing.get(*n) {
            let rbd: Vec<&pb::Device> = ds.iter().filter(|d| d.rbd.is_some()).copied().collect();
            if rbd.is_empty() {
                continue;
            }
            part.findings.push(pb::Finding {
                kind: pb::FindingKind::DeadNodeWatcher as i32,
                volume: key.to_owned(),
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
            });
            continue;
        }
        part.unvouched.extend(
            ds.iter().filter(|d| d.verdict == pb::Verdict::Unknown as i32).map(|d| format!("{n}/{}", d.name)),
        );
        let Some(idle) = idle_top(ds) else { continue };
        part.findings.push(pb::Finding {
            kind: pb::FindingKind::AttachedNotInUse as i32,
            volume: key.to_owned(),
            pv: v.pv.clone(),
            nodes: vec![(*n).to_owned()],
            clients: clients_of(&idle),
            detail: format!(
                "mapped on {n} and nothing there uses it: {}",
                idle.iter()
                    .map(|d| format!("{} {}", d.name, blockjanitor_rpc::view::names::verdict_name(d.verdict)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            devices: fleet_devices(n, &idle),
            ..Default::default()
        });
    }
    part
}

/// The order findings are listed in: kind, volume, nodes, then what tells two apart.
pub fn finding_order(a: &pb::Finding, b: &pb::Finding) -> std::cmp::Ordering {
    (a.kind, &a.volume, &a.nodes, &a.volume_attachments, &a.detail).cmp(&(
        b.kind,
        &b.volume,
        &b.nodes,
        &b.volume_attachments,
        &b.detail,
    ))
}

/// Every part's findings and gaps put together: the answer (`kinds` limits the findings listed
/// and counted; empty: all).
pub fn assemble<'a>(
    parts: impl Iterator<Item = &'a Part>,
    volumes: u32,
    missing: Vec<pb::MissingNode>,
    not_synced: Option<String>,
    no_kube: bool,
    kinds: &[pb::FindingKind],
) -> pb::SweepResponse {
    let wanted = |f: &pb::Finding| kinds.is_empty() || kinds.iter().any(|k| *k as i32 == f.kind);
    let mut findings = Vec::new();
    let mut unvouched: Vec<&str> = Vec::new();
    let mut unagented: BTreeSet<&str> = BTreeSet::new();
    for p in parts {
        findings.extend(p.findings.iter().filter(|f| wanted(f)).cloned());
        unvouched.extend(p.unvouched.iter().map(String::as_str));
        unagented.extend(p.unagented.iter().map(String::as_str));
    }
    findings.sort_by(finding_order);
    let counts = KINDS
        .iter()
        .filter(|k| kinds.is_empty() || kinds.contains(k))
        .map(|k| (kind_name(*k).to_owned(), findings.iter().filter(|f| f.kind == *k as i32).count() as u32))
        .collect();
    let mut gaps: Vec<String> = not_synced.into_iter().collect();
    // A volume attached to a Node that has no agent at all: nothing on it can be asked, so the
    // sweep cannot vouch for that attachment (it makes no finding either: the node is alive).
    if !unagented.is_empty() {
        gaps.push(format!(
            "volumes are attached to {} node(s) with no agent: {}",
            unagented.len(),
            unagented.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    // An agent that answered but cannot vouch for a device (verdict unknown): nothing is known
    // about that volume there, so the sweep cannot be clean either.
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
    let summary = summary_line(&findings, &missing, &gaps, no_kube);
    pb::SweepResponse {
        findings,
        missing_nodes: missing,
        complete,
        volumes,
        summary,
        counts,
        ..Default::default()
    }
}

/// Sweeps the fleet at once. `missing` are the nodes answers cannot speak for (the service's
/// list: agents not reachable or not synced, Nodes with no agent); `kinds` limits the findings
/// (empty: all). Every lookup is keyed: a volume's PV by its image or WWID, a PV's attachments
/// by PV, a Node by name.
pub fn sweep(
    index: &Inner,
    kube: Option<&KubeView>,
    missing: Vec<pb::MissingNode>,
    kinds: &[pb::FindingKind],
) -> pb::SweepResponse {
    let reasons: Missing = missing.iter().map(|m| (m.node.clone(), m.reason.clone())).collect();
    let pv_of = |volume: &str| kube.and_then(|k| k.pv_of(volume)).unwrap_or_default();
    let mut keys: BTreeSet<String> = BTreeSet::new();
    for n in index.nodes.values() {
        keys.extend(n.devices.values().filter_map(|d| volume_of(d).map(|(k, _)| k)));
    }
    let mut parts: Vec<Part> = Vec::new();
    for key in &keys {
        parts.push(volume_part(key, &gather(index, key, &pv_of), &reasons));
    }
    if let Some(k) = kube {
        for pv in k.attached_pvs() {
            parts.push(pv_part(index, k, &pv, &reasons));
        }
    }
    let not_synced = kube.and_then(|k| k.not_synced.clone());
    assemble(parts.iter(), keys.len() as u32, missing, not_synced, kube.is_none(), kinds)
}

/// The sweep of the index now, with the cluster's view when there is one (read from its tables
/// whole: tests and small fleets; the service answers from [`crate::sweeper`]).
pub fn run(ix: &Inner, cluster: Option<&Cluster>, kinds: &[pb::FindingKind]) -> pb::SweepResponse {
    let kube = cluster.map(KubeView::of);
    sweep(ix, kube.as_ref(), missing_nodes(ix, cluster), kinds)
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
        let shown = missing.iter().take(20).map(|m| m.node.as_str()).collect::<Vec<_>>().join(", ");
        let more = missing.len().saturating_sub(20);
        let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
        gaps.push(format!("{} node(s) did not answer ({shown}{tail})", missing.len()));
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
