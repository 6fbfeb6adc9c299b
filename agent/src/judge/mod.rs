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
pub mod nvme;
pub mod stall;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use crate::graph::identity::Identity;
use crate::graph::scan::Scan;
use crate::graph::stack;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::host::clock::{human, BootTime};
use crate::judge::gates::ApiWord;
use crate::judge::grace::Clocks;
use crate::judge::stall::Stall;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceKind, HolderKind};

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
    let d = &e.device;
    if stack::layer_of(d).is_some() {
        if let [map] = stack::base_maps(e, graph).as_slice() {
            let own = match assess_storage_own(e, graph) {
                Assessment::Final(j) => j,
                _ => Judgement::new(Verdict::Unused, Vec::new()),
            };
            return Assessment::LayerOf(map.clone(), own);
        }
    }
    assess_storage_own(e, graph)
}

fn assess_storage_own(e: &DeviceEntry, graph: &DeviceGraph) -> Assessment {
    let d = &e.device;
    if let Some(a) = crate::judge::nvme::assess(e) {
        return match a {
            crate::judge::nvme::Assessment::PathOf(head) => Assessment::PathOf(head),
            crate::judge::nvme::Assessment::Candidate(text) => Assessment::Candidate(text),
            crate::judge::nvme::Assessment::Final { in_use, unknown, reasons } => fin(
                if in_use {
                    Verdict::InUse
                } else if unknown && e.nvme.as_ref().is_some_and(|n| n.outage.is_some()) {
                    // Every controller to its target is down at once: the transports' outage guard.
                    Verdict::Outage
                } else if unknown {
                    Verdict::Unknown
                } else {
                    Verdict::Unused
                },
                reasons,
            ),
        };
    }
    if let Some(m) = &e.multipath {
        let name = format!("map {} ({})", m.name, d.name);
        let total = m.paths.len();
        if m.queue_if_no_path.is_none() {
            return fin(Verdict::Unused, vec![format!("{name}: its table and status could not be read (no device-mapper control node), so its paths cannot be judged")]);
        }
        if m.active_paths > 0 {
            let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
            reasons.push(format!(
                "{name}: {} of {total} path(s) active: a map with an active path is never stale",
                m.active_paths
            ));
            return fin(if e.holders.is_empty() { Verdict::Unused } else { Verdict::InUse }, reasons);
        }
        // Layers stacked on it (LVs, crypt mappings, partition maps) go with it when nothing
        // holds the top of a stack but what the teardown releases.
        let stacks = stack::above(e, graph);
        let blocking: Vec<String> = e
            .holders
            .iter()
            .filter(|h| !stacks.covers(h) && !h.releasable_from_dead_map(&m.partitions))
            .map(Holder::describe)
            .chain(stacks.blocking.iter().cloned())
            .collect();
        if !blocking.is_empty() {
            let mut reasons = blocking;
            reasons.push(format!("{name}: every path failed, but it is still in use"));
            return fin(Verdict::InUse, reasons);
        }
        let paths = match total {
            0 => "no path left".to_owned(),
            1 => "its only path failed".to_owned(),
            2 => "both paths failed".to_owned(),
            n => format!("all {n} paths failed"),
        };
        let mut notes =
            vec![format!("open count {}", m.open_count.map_or("unknown".into(), |c| c.to_string()))];
        let layer_holders = stacks.releasable.iter().map(|(_, h)| *h);
        let mounts =
            e.holders.iter().chain(layer_holders.clone()).filter(|h| h.kind == HolderKind::Mount).count();
        notes.push(if mounts == 0 {
            "no mount in any namespace".into()
        } else {
            format!("{mounts} mount(s) in other namespaces to release first")
        });
        if !stacks.layers.is_empty() {
            notes.push(format!(
                "{} layer(s) stacked on it removed first: {}",
                stacks.layers.len(),
                stacks.describe()
            ));
        }
        let stuck =
            e.holders.iter().chain(layer_holders).filter(|h| h.kind == HolderKind::OpenDevice).count();
        if stuck > 0 {
            notes.push(format!("{stuck} process(es) stuck in D state on it (stopping queueing frees them)"));
        }
        if m.io_would_hang {
            notes.push("queue_if_no_path: any I/O to it hangs".into());
        }
        return Assessment::Candidate(format!("{name}: {paths} for {{age}}, {}", notes.join(", ")));
    }
    if let Some(sc) = &e.scsi {
        if let Some(map) = &sc.path_of {
            return Assessment::PathOf(map.clone());
        }
        let state = serde_json::to_value(sc.disk.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        if !e.holders.is_empty() {
            return fin(Verdict::InUse, e.holders.iter().map(Holder::describe).collect());
        }
        if sc.is_offline() {
            return Assessment::Candidate(format!(
                "{} ({}) has been {state} for {{age}} with no holder",
                d.name, sc.disk.address
            ));
        }
        if let Some(line) = sc.lun_gone.as_ref().filter(|_| sc.is_dead()) {
            return Assessment::Candidate(format!(
                "{} ({}): its iSCSI target reports the LUN gone (kernel log: \"{line}\"), with no holder for {{age}}",
                d.name, sc.disk.address
            ));
        }
        return fin(Verdict::Unused, vec![format!("nothing holds {} ({}, {state}); a disk is not something the agent cleans while its device is not offline", d.name, sc.disk.address)]);
    }
    if let Some(n) = &e.nbd {
        let server = match (n.pid, n.server_alive) {
            (Some(pid), true) => {
                format!(
                    "served by pid {pid} ({})",
                    n.server_comm.as_ref().map_or("?".into(), |c| c.to_string())
                )
            }
            (Some(pid), false) => format!("its server process {pid} is gone"),
            (None, _) => "no server process recorded".to_owned(),
        };
        if !e.holders.is_empty() {
            let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
            reasons.push(format!("{}: {server}", d.name));
            return fin(Verdict::InUse, reasons);
        }
        return Assessment::Candidate(format!("nothing holds {} for {{age}}; {server}", d.name));
    }
    if !e.holders.is_empty() {
        let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
        if let Some(line) = e.rbd.as_ref().and_then(|r| r.fenced.as_ref()) {
            reasons.push(format!("fenced at the cluster ({line}): release its holders, then unmap it"));
        }
        return fin(Verdict::InUse, reasons);
    }
    if let Some(r) = &e.rbd {
        let fenced = if r.fenced.is_some() {
            "; the cluster fenced this client (blocklisted): the mapping is dead"
        } else {
            ""
        };
        return Assessment::Candidate(format!(
            "nothing holds {} (rbd {}/{}, {} at {}: no mount in any namespace, no open fd) for {{age}}{fenced}",
            d.name, r.pool, r.image, r.watcher_client, r.client_addr
        ));
    }
    if !is_mapping(e) {
        return fin(
            Verdict::Unused,
            vec![format!(
                "nothing holds {}; a {} is not something the agent cleans",
                d.name,
                d.kind.as_str()
            )],
        );
    }
    Assessment::Candidate(format!(
        "nothing holds {} (no mount in any namespace, no open fd, no swap, nothing stacked on it) for {{age}}",
        d.name
    ))
}

/// Kinds the agent may clean once stale.
fn is_mapping(e: &DeviceEntry) -> bool {
    match e.device.kind {
        DeviceKind::Loop => e.device.loop_info.is_some(),
        DeviceKind::Rbd | DeviceKind::Nbd => e.device.size_bytes > 0,
        _ => false,
    }
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
        } else if let Some(o) = outage_of(e, &scan.graph) {
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
                    Some(stall) if !unblocked_by_its_plan(e) => {
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
    // A path follows its map: removable only with it.
    for (devnum, name, map) in paths {
        let map_j =
            scan.graph.devices.iter().find(|e| e.device.name == map).and_then(|e| out.get(&e.device.devnum));
        let j = match map_j {
            Some(mj) if matches!(mj.verdict, Verdict::Stale | Verdict::Suspect | Verdict::Unknown) => {
                Judgement::new(
                    mj.verdict,
                    vec![format!(
                        "{name} is a path of {map}, which is {}: removed with it",
                        mj.verdict.as_str()
                    )],
                )
            }
            Some(mj) if mj.verdict == Verdict::Protected => Judgement::new(
                Verdict::Protected,
                vec![format!("{name} is a path of {map}, which is protected")],
            ),
            _ => Judgement::new(Verdict::InUse, vec![format!("{name} is a path of multipath map {map}")]),
        };
        out.insert(devnum, j);
    }
    // A layer on a map follows it while the map is a candidate: removed with it, top-down.
    for (e, map, own) in layers {
        let d = &e.device;
        let what = stack::layer_of(d)
            .map_or_else(|| d.name.to_string(), |l| format!("{} ({})", l.describe(), d.name));
        let map_j =
            scan.graph.devices.iter().find(|m| m.device.name == map).and_then(|m| out.get(&m.device.devnum));
        let j = match map_j {
            Some(mj) if matches!(mj.verdict, Verdict::Stale | Verdict::Suspect | Verdict::Unknown) => {
                let mut reasons = vec![format!(
                    "{what} is stacked on map {map}, which is {}: removed with it, top-down",
                    mj.verdict.as_str()
                )];
                reasons.extend(own.reasons);
                Judgement::new(mj.verdict, reasons)
            }
            Some(mj) if mj.verdict == Verdict::Protected => Judgement::new(
                Verdict::Protected,
                vec![format!("{what} is stacked on map {map}, which is protected")],
            ),
            _ => {
                let mut j = own;
                j.reasons.push(format!("{what} is stacked on map {map}"));
                if j.summary.is_empty() {
                    j.summary = j.reasons[0].clone();
                }
                j
            }
        };
        let j = weigh_stall(j, e, input.stalled.get(&d.devnum));
        out.insert(d.devnum, weigh_api(j, e, input));
    }
    clocks.retain(|id| !scan.covers(id.devnum) || observed.contains(id));
    out
}

/// The outage a device sits behind: its iSCSI session's, or, for a multipath map with no
/// active path, that of one of its paths.
fn outage_of<'a>(e: &'a DeviceEntry, graph: &'a DeviceGraph) -> Option<&'a crate::graph::outage::Outage> {
    if let Some(o) = e.scsi.as_ref().and_then(|s| s.outage.as_ref()) {
        return Some(o);
    }
    let m = e.multipath.as_ref().filter(|m| m.active_paths == 0)?;
    m.paths
        .iter()
        .filter_map(|p| p.device.as_ref())
        .find_map(|n| graph.devices.iter().find(|x| &x.device.name == n)?.scsi.as_ref()?.outage.as_ref())
}

/// A dead multipath map that queues I/O: its plan starts with `fail_if_no_path`, which fails
/// the I/O that hangs on it.
fn unblocked_by_its_plan(e: &DeviceEntry) -> bool {
    e.multipath.as_ref().is_some_and(|m| m.active_paths == 0 && m.queue_if_no_path == Some(true))
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
    let why = if unblocked_by_its_plan(e) {
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
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::discover::nbd::NbdDevice;
    use crate::graph::DeviceGraph;
    use crate::model::{BlockDevice, DeviceName, KernelText, MountNsId};
    use crate::snapshot::ScanStats;

    /// A qemu-nbd server whose command line carries a secret, as they do.
    const CMDLINE: &str = "qemu-nbd --object secret,id=s0,data=SECRET --connect /dev/nbd0 /var/lib/vm.qcow2";

    fn nbd0(server_alive: bool, holders: Vec<Holder>) -> DeviceEntry {
        let name = DeviceName::new("nbd0").expect("name");
        let devnum = DevNum::new(43, 0);
        let device = BlockDevice {
            diskseq: Some(7),
            ..BlockDevice::new(name.clone(), devnum, DeviceKind::Nbd, 1 << 30)
        };
        let nbd = NbdDevice {
            device: name,
            devnum,
            pid: Some(4242),
            server_alive,
            server_cmdline: Some(KernelText::from(CMDLINE)),
            server_comm: Some(KernelText::from("qemu-nbd")),
            backend: None,
        };
        DeviceEntry { nbd: Some(nbd), ..DeviceEntry::new(device, holders) }
    }

    /// The server holding the device node open, as qemu-nbd does.
    fn server_holds_it() -> Holder {
        let mut h = Holder::bare(HolderKind::OpenDevice);
        h.pids = vec![4242];
        h.pid_count = 1;
        h.comm = Some(KernelText::from("qemu-nbd"));
        h.cmdline = Some(KernelText::from(CMDLINE));
        h.path = Some(KernelText::from("/dev/nbd0"));
        h.fds = vec![9];
        h
    }

    fn judge_alone(entry: DeviceEntry, grace: Duration) -> Judgement {
        judge_stalled(entry, grace, None)
    }

    fn judge_stalled(entry: DeviceEntry, grace: Duration, stall: Option<Stall>) -> Judgement {
        let devnum = entry.device.devnum;
        let scan = Scan::complete(
            DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![entry] },
            BootTime::from_since_boot(Duration::from_secs(100)),
        );
        let mut clocks = Clocks::new(None);
        let input = JudgeInput {
            grace,
            max_gap: Duration::from_secs(120),
            now: BootTime::from_since_boot(Duration::from_secs(100)),
            api: None,
            stalled: &stall.map(|s| HashMap::from([(devnum, s)])).unwrap_or_default(),
        };
        judge(&scan, &mut clocks, &input).remove(&devnum).expect("nbd0 judged")
    }

    #[test]
    fn command_lines_stay_out_of_reasons_and_summaries() {
        let cases = [
            ("stale, served", judge_alone(nbd0(true, Vec::new()), Duration::ZERO), Verdict::Stale),
            (
                "suspect, served",
                judge_alone(nbd0(true, Vec::new()), Duration::from_secs(60)),
                Verdict::Suspect,
            ),
            (
                "in use by its server",
                judge_alone(nbd0(true, vec![server_holds_it()]), Duration::ZERO),
                Verdict::InUse,
            ),
        ];
        for (what, j, verdict) in cases {
            assert_eq!(j.verdict, verdict, "{what}: {j:?}");
            for text in j.reasons.iter().chain([&j.summary]) {
                assert!(
                    !text.contains("SECRET") && !text.contains("--object"),
                    "{what}: a command line in {text:?}"
                );
            }
            // The server is named by its command name.
            assert!(j.reasons.iter().any(|r| r.contains("qemu-nbd")), "{what}: {j:?}");
            assert!(j.summary.contains("qemu-nbd") || verdict == Verdict::InUse, "{what}: {j:?}");
        }
    }

    #[test]
    fn a_stale_summary_has_no_age_and_stays_the_same_across_scans() {
        let entry = nbd0(false, Vec::new());
        let devnum = entry.device.devnum;
        let scan = |at: u64| Scan {
            graph: DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![entry.clone()] },
            blind_spots: Vec::new(),
            protected: HashSet::new(),
            stats: ScanStats::default(),
            warnings: Vec::new(),
            taken_at: BootTime::from_since_boot(Duration::from_secs(at)),
            scope: None,
        };
        let mut clocks = Clocks::new(None);
        let mut summaries = Vec::new();
        for at in [100, 103, 106] {
            let input = JudgeInput {
                grace: Duration::from_secs(2),
                max_gap: Duration::from_secs(120),
                now: BootTime::from_since_boot(Duration::from_secs(at)),
                api: None,
                stalled: &HashMap::new(),
            };
            let j = judge(&scan(at), &mut clocks, &input).remove(&devnum).expect("judged");
            if at > 100 {
                assert_eq!(j.verdict, Verdict::Stale, "{j:?}");
                // The reasons carry the age; the summary does not.
                assert!(j.reasons[0].contains(&format!("for {}s", at - 100)), "{j:?}");
                summaries.push(j.summary);
            }
        }
        assert!(!summaries[0].contains("for 3s"), "{summaries:?}");
        assert_eq!(summaries[0], summaries[1], "the summary is what Events de-duplicate on");
    }

    /// An unheld candidate whose I/O does not complete is unknown (never stale, whatever the
    /// grace), with the evidence first; a held device keeps its verdict with the evidence first.
    #[test]
    fn an_unresponsive_device_is_never_stale() {
        let stall = Stall { in_flight: 2, stalled_for: Duration::from_secs(12) };
        let j = judge_stalled(nbd0(true, Vec::new()), Duration::ZERO, Some(stall.clone()));
        assert_eq!(j.verdict, Verdict::Unknown, "{j:?}");
        assert!(
            j.reasons[0].starts_with("unresponsive: 2 I/O(s) in flight and none completed for 12s"),
            "{j:?}"
        );
        assert!(j.summary.starts_with(Stall::SUMMARY) && !j.summary.contains("12s"), "{j:?}");
        let mut stuck = server_holds_it();
        stuck.process_state = Some('D');
        let held = judge_stalled(nbd0(true, vec![stuck]), Duration::ZERO, Some(stall));
        assert_eq!(held.verdict, Verdict::InUse, "{held:?}");
        assert!(held.reasons[0].starts_with("unresponsive:"), "{held:?}");
        assert!(held.reasons[0].ends_with("; waiting on it in D state: pid 4242 (qemu-nbd)"), "{held:?}");
        assert!(!held.summary.starts_with("unresponsive"), "the summary stays what it was: {held:?}");
    }

    /// A dead multipath map over iSCSI paths whose sessions are all down is an outage, not a
    /// stale map: the map and its paths get `outage`, nothing is a candidate, no clock runs.
    #[test]
    fn a_dead_map_over_an_iscsi_outage_is_an_outage_not_stale() {
        use crate::discover::scsi::{ScsiAddress, ScsiDisk, ScsiState, Transport};
        use crate::graph::multipath::{MultipathView, PathView, ScsiView};
        use crate::graph::outage::{Outage, Scope};
        let judge_all = |outage: Option<Outage>| {
            let mut map = nbd0(false, Vec::new());
            map.nbd = None;
            map.device.name = DeviceName::new("dm-0").expect("name");
            map.device.devnum = DevNum::new(253, 0);
            map.device.kind = DeviceKind::Dm;
            map.multipath = Some(MultipathView {
                name: "mpatha".into(),
                uuid: "mpath-36001405aa".into(),
                wwid: "36001405aa".into(),
                open_count: Some(0),
                suspended: false,
                queue_if_no_path: Some(false),
                paths: vec![PathView {
                    devnum: DevNum::new(8, 0),
                    device: Some(DeviceName::new("sda").expect("name")),
                    state: "failed",
                    fail_count: 1,
                    scsi_state: Some("transport-offline".into()),
                }],
                active_paths: 0,
                io_would_hang: false,
                partitions: Vec::new(),
            });
            let mut disk = nbd0(false, Vec::new());
            disk.nbd = None;
            disk.device.name = DeviceName::new("sda").expect("name");
            disk.device.devnum = DevNum::new(8, 0);
            disk.device.kind = DeviceKind::Disk;
            disk.scsi = Some(ScsiView {
                disk: ScsiDisk {
                    name: DeviceName::new("sda").expect("name"),
                    devnum: DevNum::new(8, 0),
                    address: ScsiAddress { host: 2, channel: 0, target: 0, lun: 1 },
                    state: ScsiState::TransportOffline,
                    vendor: "LIO-ORG".into(),
                    model: "FILEIO".into(),
                    wwid: Some("naa.6001405aa".into()),
                    ioerr_cnt: 0,
                    iorequest_cnt: 0,
                    transport: Transport::Iscsi { session: "session1".into() },
                },
                transport_state: Some("failed".into()),
                path_of: Some(DeviceName::new("dm-0").expect("name")),
                session: None,
                outage,
                lun_gone: None,
            });
            let scan = Scan::complete(
                DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![map, disk] },
                BootTime::from_since_boot(Duration::from_secs(100)),
            );
            let mut clocks = Clocks::new(None);
            let input = JudgeInput {
                grace: Duration::ZERO,
                max_gap: Duration::from_secs(120),
                now: BootTime::from_since_boot(Duration::from_secs(100)),
                api: None,
                stalled: &HashMap::new(),
            };
            let mut out = judge(&scan, &mut clocks, &input);
            let map = out.remove(&DevNum::new(253, 0)).expect("map judged");
            let disk = out.remove(&DevNum::new(8, 0)).expect("disk judged");
            let mut running = 0;
            clocks.retain(|_| {
                running += 1;
                true
            });
            (map, disk, running)
        };
        let (map, disk, clocks) = judge_all(None);
        assert_eq!((map.verdict, disk.verdict), (Verdict::Stale, Verdict::Stale), "{map:?}");
        assert_eq!(clocks, 1);
        let down =
            Outage { scope: Scope::Portal, key: "10.0.0.1:3260".into(), members: vec!["session1".into()] };
        let (map, disk, clocks) = judge_all(Some(down));
        assert_eq!((map.verdict, disk.verdict), (Verdict::Outage, Verdict::Outage), "{map:?} {disk:?}");
        assert!(
            map.reasons[0].starts_with("outage: the only iSCSI session to portal 10.0.0.1:3260 is down"),
            "{map:?}"
        );
        assert_eq!(clocks, 0, "no grace clock runs behind an outage");
    }
}
