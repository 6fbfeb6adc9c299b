//! Judging one scan: every device by its transport (NVMe-oF, multipath, SCSI, nbd, rbd, loop),
//! kubelet's word on it, then the paths and the layers of each map after their map, the grace
//! clock of each candidate, the stall watch and the API weighed in.

use super::weigh_stall_and_api::{stall_evidence, weigh_api, weigh_stall};
use super::{fin, gates, iscsi, multipath, nbd, nvme, r#loop, rbd, scsi, stack};
use super::{Assessment, JudgeInput, Judgement, Verdict};
use crate::graph::identity::Identity;
use crate::graph::scan::Scan;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::host::clock::human;
use crate::judge::grace::Clocks;
use crate::judge::stall::Stall;
use crate::model::DevNum;
use std::collections::{HashMap, HashSet};

/// What kubelet says about a device, as evidence: the PV, and the pods on this node using it.
pub(super) fn kubelet_evidence(e: &DeviceEntry) -> Option<(bool, String)> {
    let k = e.kubernetes.as_ref()?;
    let pv = if k.pv_names.is_empty() {
        "an unnamed volume".to_owned()
    } else {
        format!("PV {}", k.pv_names.join(", "))
    };
    let driver = k.drivers.first().map(|d| format!(" ({d})")).unwrap_or_default();
    if k.pod_uids.is_empty() {
        Some((
            false,
            format!("kubelet knows it as {pv}{driver} at {}, with no pod on this node", k.paths.join(", ")),
        ))
    } else {
        Some((
            true,
            format!(
                "pod(s) {} on this node use {pv}{driver} per kubelet ({})",
                k.pod_uids.join(", "),
                k.paths.join(", ")
            ),
        ))
    }
}

pub(super) fn assess(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
    match (assess_storage(e, graph), kubelet_evidence(e)) {
        (Assessment::LayerOf(map, _), Some((true, why))) => {
            let mut reasons = vec![why];
            reasons.extend(e.holders.iter().map(Holder::describe));
            Assessment::LayerOf(map, Judgement::new(Verdict::InUse, reasons))
        }
        (Assessment::LayerOf(map, mut own), Some((false, why))) => {
            own.reasons.push(why);
            Assessment::LayerOf(map, own)
        }
        // A pod on this node uses it: never a cleanup candidate, whatever else is true.
        (Assessment::Candidate(_) | Assessment::Final(_), Some((true, why))) => {
            let mut reasons = vec![why];
            reasons.extend(e.holders.iter().map(Holder::describe));
            fin(Verdict::InUse, reasons)
        }
        (Assessment::Candidate(text), Some((false, why))) => Assessment::Candidate(format!("{text}; {why}")),
        (Assessment::Final(mut j), Some((false, why))) => {
            j.reasons.push(why);
            Assessment::Final(j)
        }
        (a, _) => a,
    }
}

pub(super) fn assess_storage(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
    if let Some(map) = stack::on_one_map(e, graph) {
        let own = match assess_storage_own(e, graph) {
            Assessment::Final(j) => j,
            _ => Judgement::new(Verdict::Unused, Vec::new()),
        };
        return Assessment::LayerOf(map, own);
    }
    assess_storage_own(e, graph)
}

/// A device's assessment by its transport: NVMe-oF, multipath, SCSI, nbd, rbd, then loop (and
/// the other mappings the agent may clean).
pub(super) fn assess_storage_own(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
    if let Some(a) = nvme::judge(e) {
        return a;
    }
    if let Some(m) = &e.multipath {
        return multipath::assess(e, m, graph);
    }
    if let Some(sc) = &e.scsi {
        return scsi::assess(e, sc);
    }
    if let Some(n) = &e.nbd {
        return nbd::assess(e, n);
    }
    if !e.holders.is_empty() {
        let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
        reasons.extend(rbd::fenced_while_held(e));
        return fin(Verdict::InUse, reasons);
    }
    if let Some(r) = &e.rbd {
        return rbd::assess(e, r);
    }
    r#loop::assess(e)
}

/// Judges every device `scan` covers, advancing `clocks`: a candidate observed unheld by this
/// complete scan keeps (or starts) its clock; one a blind spot reaches, one that is held and
/// one that is gone lose it.
pub fn judge(scan: &Scan, clocks: &mut Clocks, input: &JudgeInput<'_>) -> HashMap<DevNum, Judgement> {
    let mut out = HashMap::new();
    let mut paths = Vec::new();
    let mut layers = Vec::new();
    let mut observed: HashSet<Identity> = HashSet::new();
    for e in scan.graph.devices.iter().filter(|e| scan.covers(e.device.devnum)) {
        let d = &e.device;
        let j = if let Some(r) = gates::protection(e, &scan.protected) {
            Judgement::new(Verdict::Protected, vec![r])
        } else if let Some(o) = iscsi::outage_of(e, &scan.graph) {
            // Not an observation of a stale device: its grace clock stops.
            let mut reasons = vec![o.describe("iSCSI session")];
            reasons.extend(e.holders.iter().map(Holder::describe));
            Judgement::new(Verdict::Outage, reasons)
        } else {
            match assess(e, &scan.graph) {
                Assessment::Final(j) => j,
                Assessment::PathOf(map) => {
                    paths.push((d.devnum, d.name.clone(), map));
                    continue;
                }
                Assessment::LayerOf(map, own) => {
                    layers.push((e, map, own));
                    continue;
                }
                Assessment::Candidate(text) => match input.stalled.get(&d.devnum) {
                    // Not an observation of an unheld device: its grace clock stops.
                    Some(stall) if !multipath::unblocked_by_its_plan(e) => {
                        let timeless = text.replace(" for {age}", "");
                        Judgement {
                            verdict: Verdict::Unknown,
                            summary: format!("{}; {timeless}", Stall::SUMMARY),
                            reasons: vec![
                                format!("{}: nothing destructive is done to it", stall_evidence(e, stall)),
                                timeless,
                            ],
                        }
                    }
                    _ => candidate(e, &text, scan, clocks, input, &mut observed),
                },
            }
        };
        let j = weigh_stall(j, e, input.stalled.get(&d.devnum));
        out.insert(d.devnum, weigh_api(j, e, input));
    }
    multipath::follow_maps(paths, scan, &mut out);
    stack::follow_maps(layers, scan, &mut out, input);
    clocks.retain(|id| !scan.covers(id.devnum) || observed.contains(id));
    out
}

/// A candidate's verdict: unknown through a blind spot, else suspect or stale by its clock.
pub(super) fn candidate(
    e: &DeviceEntry,
    text: &str,
    scan: &Scan,
    clocks: &mut Clocks,
    input: &JudgeInput<'_>,
    observed: &mut HashSet<Identity>,
) -> Judgement {
    let id = Identity::of(e);
    let timeless = text.replace(" for {age}", "");
    let blind = gates::completeness(e, &scan.blind_spots)
        .or_else(|| stack::layers_blind(e, &scan.graph, &scan.blind_spots));
    if let Some(blind) = blind {
        // Not a complete observation: the clock cannot go on.
        clocks.forget(&id);
        // Why it is unknown comes first: it is what an operator looks for.
        return Judgement {
            verdict: Verdict::Unknown,
            summary: format!("{blind}; {timeless}"),
            reasons: vec![blind, timeless],
        };
    }
    let (since, restarted) = clocks.observe(&id, input.now, input.max_gap);
    observed.insert(id);
    let age = input.now.since(since);
    let base = text.replace("{age}", &human(age));
    let grace = human(input.grace);
    if age >= input.grace {
        Judgement {
            verdict: Verdict::Stale,
            reasons: vec![format!("{base}: stale (grace {grace})")],
            summary: format!("{timeless}: stale after the grace period of {grace}"),
        }
    } else {
        let mut reasons = vec![format!("{base}: stale after the grace period of {grace}")];
        reasons.extend(restarted);
        Judgement { verdict: Verdict::Suspect, summary: reasons[0].clone(), reasons }
    }
}
