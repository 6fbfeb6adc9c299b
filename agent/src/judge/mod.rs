//! Verdicts with reasons: in use, unused, suspect, stale, protected, unknown. Pure: the caller
//! hands in one [`Scan`], the grace clocks and the Kubernetes API's view.
//!
//! Only devices the agent could clean (bound loop devices, rbd and nbd mappings nothing holds,
//! multipath maps with no active path and nothing but releasable holders, offline standalone
//! disks) are candidates, and a candidate becomes stale only after complete scans have observed
//! it unheld for the whole grace period ([`crate::judge::grace`]). A candidate that a blind spot of the
//! scan could hide a holder of is `unknown`, and so is one the Kubernetes API should vouch for
//! but cannot: nothing destructive rests on missing evidence.

pub mod gates;
pub mod grace;
mod iscsi;
mod r#loop;
mod multipath;
mod nbd;
pub mod nvme;
mod rbd;
mod scsi;
pub mod stack;
pub mod stall;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::graph::identity::Identity;
use crate::graph::scan::Scan;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::host::clock::{human, BootTime};
use crate::judge::gates::ApiWord;
use crate::judge::grace::Clocks;
use crate::judge::stall::Stall;
use crate::kube::ClusterView;
use crate::model::DevNum;

/// The agent's judgement of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum Verdict {
    /// Something holds it.
    #[value(alias = "in-use")]
    InUse,
    /// Nothing holds it, and it is not a kind the agent cleans.
    Unused,
    /// A candidate nothing holds, not yet for the whole grace period.
    Suspect,
    /// A candidate nothing has held for at least the grace period, observed by complete scans.
    Stale,
    /// Backs the host root, the kubelet or the runtime, or is listed in the config.
    Protected,
    /// A candidate the agent cannot vouch for: a blind spot of the scan could hide a holder of
    /// it, or the Kubernetes API should vouch for it but cannot.
    Unknown,
    /// Behind a transport outage: every iSCSI session (NVMe-oF controller) to its target or
    /// portal is down at once. An array or network outage, not staleness: never cleaned.
    Outage,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InUse => "in_use",
            Self::Unused => "unused",
            Self::Suspect => "suspect",
            Self::Stale => "stale",
            Self::Protected => "protected",
            Self::Unknown => "unknown",
            Self::Outage => "outage",
        }
    }
}

/// A verdict and the evidence behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    /// One sentence per piece of evidence (ages included), for operators.
    pub reasons: Vec<String>,
    /// One line that stays the same while the facts do (no age, no command line): what Node
    /// Events say, so that repeated scans de-duplicate.
    pub summary: String,
}

impl Judgement {
    fn new(verdict: Verdict, reasons: Vec<String>) -> Self {
        let summary = reasons.first().cloned().unwrap_or_default();
        Self { verdict, reasons, summary }
    }
}

/// What [`judge`] weighs besides the scan.
#[derive(Debug, Clone)]
pub struct JudgeInput<'a> {
    pub grace: Duration,
    /// The largest gap between observations that keeps a grace clock running.
    pub max_gap: Duration,
    pub now: BootTime,
    /// The Kubernetes API's view (`None`: the agent runs without the API).
    pub api: Option<&'a ClusterView>,
    /// Devices that do not answer I/O ([`crate::judge::stall`]), with the evidence.
    pub stalled: &'a HashMap<DevNum, Stall>,
}

/// First look at a device: a final verdict, or a cleanup candidate (stale after the grace).
enum Assessment {
    Final(Judgement),
    Candidate(String),
    /// A path of a multipath map: judged after the map.
    PathOf(crate::model::DeviceName),
    /// A dm layer (LV, crypt, partition map) on a multipath map: judged after the map, and
    /// on its own (`own`) when the map is no candidate.
    LayerOf(crate::model::DeviceName, Judgement),
}

fn fin(verdict: Verdict, reasons: Vec<String>) -> Assessment {
    Assessment::Final(Judgement::new(verdict, reasons))
}

/// What kubelet says about a device, as evidence: the PV, and the pods on this node using it.
fn kubelet_evidence(e: &DeviceEntry) -> Option<(bool, String)> {
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

fn assess(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
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

fn assess_storage(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
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
fn assess_storage_own(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
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

/// The evidence that a device does not answer: its counters, and the holders waiting in D state.
fn stall_evidence(e: &DeviceEntry, stall: &Stall) -> String {
    let stuck: Vec<String> = e
        .holders
        .iter()
        .filter(|h| h.process_state == Some('D'))
        .filter_map(|h| {
            let pid = h.pids.first()?;
            Some(match &h.comm {
                Some(c) => format!("pid {pid} ({c})"),
                None => format!("pid {pid}"),
            })
        })
        .collect();
    if stuck.is_empty() {
        return stall.describe();
    }
    format!("{}; waiting on it in D state: {}", stall.describe(), stuck.join(", "))
}

/// Puts the evidence that a device does not answer first among its reasons (an unknown
/// candidate already has it).
fn weigh_stall(mut j: Judgement, e: &DeviceEntry, stall: Option<&Stall>) -> Judgement {
    let Some(stall) = stall else { return j };
    if j.reasons.first().is_some_and(|r| r.starts_with("unresponsive:")) {
        return j;
    }
    let why = if multipath::unblocked_by_its_plan(e) {
        format!(
            "{}: stopping the map's queueing (fail_if_no_path, its plan's first step) fails that I/O",
            stall_evidence(e, stall)
        )
    } else {
        stall_evidence(e, stall)
    };
    j.reasons.insert(0, why);
    j
}

/// A candidate's verdict: unknown through a blind spot, else suspect or stale by its clock.
fn candidate(
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

/// Weighs what the Kubernetes API says (protected devices aside): a running pod on this node
/// using the device's PV, or its VolumeAttachment attached here, makes it in use; an API that
/// cannot vouch (not synced, a watch broken, silent, no such Node) makes a candidate unknown.
fn weigh_api(j: Judgement, e: &DeviceEntry, input: &JudgeInput<'_>) -> Judgement {
    if j.verdict == Verdict::Protected {
        return j;
    }
    let candidate = matches!(j.verdict, Verdict::Stale | Verdict::Suspect);
    match gates::api(e, input.api, input.now) {
        ApiWord::NotConfigured => j,
        word @ ApiWord::CannotVouch(_) => {
            let why = word.refusal().unwrap_or_default();
            if candidate {
                // Why it is unknown comes first.
                let mut reasons = vec![why.clone()];
                reasons.extend(j.reasons);
                Judgement { verdict: Verdict::Unknown, summary: format!("{why}; {}", j.summary), reasons }
            } else {
                let mut reasons = j.reasons;
                reasons.push(why);
                Judgement { verdict: j.verdict, summary: j.summary, reasons }
            }
        }
        ApiWord::InUse(mut users) => {
            users.extend(j.reasons);
            Judgement::new(Verdict::InUse, users)
        }
        ApiWord::NoUser(why) if candidate => {
            let mut reasons = j.reasons;
            reasons.push(why);
            Judgement { verdict: j.verdict, summary: j.summary, reasons }
        }
        ApiWord::NoUser(_) => j,
    }
}

#[cfg(test)]
mod tests;
