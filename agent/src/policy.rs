//! Verdicts with reasons: in use, unused, suspect, stale, protected. Pure: the caller supplies
//! the graph, the protected device numbers and the clock.
//!
//! Only mappings the agent could clean (bound loop devices, rbd, nbd) can become stale, and only
//! after nothing has held them for the whole grace period across consecutive scans ([`Tracker`]).
//! Identity is the device number plus what the mapping points at (loop backing device and inode),
//! so a reused name never inherits another device's history.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{DevNum, DeviceKind, HolderKind};
use crate::plan::holder_reason;

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
    /// A mapping nothing holds, not yet for the whole grace period.
    Suspect,
    /// A mapping nothing has held for at least the grace period.
    Stale,
    /// Backs the host root, the kubelet or the runtime, or is listed in the config.
    Protected,
    /// A candidate the Kubernetes API should vouch for but cannot (unreachable, not synced):
    /// nothing destructive rests on missing evidence.
    Unknown,
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
        }
    }
}

/// The suffix of the reasons [`with_api`] gives when the API says a device is in use.
const PER_THE_API: &str = "per the API";

/// True when the verdict rests on the API saying a pod or an attachment uses the device, or on
/// the API being unable to vouch for it: then nothing at all is done to it.
pub fn api_forbids(j: &Judgement) -> bool {
    j.verdict == Verdict::Unknown
        || j.reasons.iter().any(|r| r.ends_with(NO_API))
        || (j.verdict == Verdict::InUse && j.reasons.iter().any(|r| r.ends_with(PER_THE_API)))
}

/// The suffix of the reason [`with_api`] adds when the API is configured but cannot vouch.
const NO_API: &str = "nothing destructive rests on missing API evidence";

/// Weighs what the Kubernetes API says about a device (protected ones aside): a running pod on
/// this node using its PV, or a VolumeAttachment of its PV attached to this node, makes it in use
/// (and forbids every plan for it, including releasing its foreign mounts); an API that is
/// configured but not synced makes a candidate unknown and forbids every plan too.
/// `api` is `None` when the agent runs without the API.
pub fn with_api(j: Judgement, e: &DeviceEntry, api: Option<&crate::kube::ClusterView>) -> Judgement {
    let Some(view) = api else { return j };
    if !view.synced && j.verdict != Verdict::Protected {
        // Whatever the node's evidence says, a plan for it would rest on missing API evidence.
        let why = view.last_error.as_deref().unwrap_or("not synced yet");
        let mut reasons = j.reasons.clone();
        reasons.push(format!("the Kubernetes API cannot vouch for it ({why}): {NO_API}"));
        let verdict =
            if matches!(j.verdict, Verdict::Stale | Verdict::Suspect) { Verdict::Unknown } else { j.verdict };
        return Judgement { verdict, reasons };
    }
    if j.verdict == Verdict::Protected {
        return j;
    }
    let mut reasons = j.reasons.clone();
    let mut pvs: Vec<String> = e.kubernetes.as_ref().map(|k| k.pv_names.clone()).unwrap_or_default();
    if let Some(k) = &e.kubernetes {
        for pv in &view.pvs {
            if pv.csi.as_ref().is_some_and(|c| k.volume_handles.contains(&c.volume_handle))
                && !pvs.contains(&pv.name)
            {
                pvs.push(pv.name.clone());
            }
        }
    }
    if let Some(pv) = e.rbd.as_ref().and_then(|r| view.pv_for_rbd(&r.pool, &r.image)) {
        if !pvs.contains(&pv.name) {
            pvs.push(pv.name.clone());
        }
    }
    let mut users = Vec::new();
    for pv in &pvs {
        for pod in view.running_pods_using_pv(pv) {
            users.push(format!(
                "pod {}/{} ({}) uses PV {pv} {PER_THE_API}",
                pod.namespace, pod.name, pod.phase
            ));
        }
        if view.pv_attached_to_node(pv) {
            users.push(format!("a VolumeAttachment of PV {pv} is attached to this node {PER_THE_API}"));
        }
    }
    if !users.is_empty() {
        users.extend(reasons);
        return Judgement { verdict: Verdict::InUse, reasons: users };
    }
    if !matches!(j.verdict, Verdict::Stale | Verdict::Suspect) {
        return j;
    }
    reasons.push(if pvs.is_empty() {
        "the API knows no PV for it".to_owned()
    } else {
        format!(
            "no running pod on this node and no attached VolumeAttachment for PV {} per the API",
            pvs.join(", ")
        )
    });
    Judgement { verdict: j.verdict, reasons }
}

/// A verdict and the evidence behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
}

/// What identifies a cleanup candidate across scans: device number and name, plus what it
/// points at (a loop device's backing file) or who it is (a map's uuid, a disk's wwid), so a
/// reused name never inherits another device's history.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Identity {
    devnum: DevNum,
    name: String,
    target: Option<(DevNum, u64)>,
    tag: String,
}

fn identity(e: &DeviceEntry) -> Identity {
    let l = e.device.loop_info.as_ref();
    let tag = e
        .multipath
        .as_ref()
        .map(|m| m.uuid.clone())
        .or_else(|| e.rbd.as_ref().map(|r| format!("{}/{}/{}", r.cluster_fsid, r.image_id, r.client_id)))
        .or_else(|| e.nbd.as_ref().and_then(|n| n.pid.map(|p| format!("pid {p}"))))
        .or_else(|| e.scsi.as_ref().and_then(|s| s.disk.wwid.clone()))
        .unwrap_or_default();
    Identity {
        devnum: e.device.devnum,
        name: e.device.name.as_str().to_owned(),
        target: l.and_then(|l| Some((l.backing_dev?, l.backing_inode?))),
        tag,
    }
}

/// A holder the teardown of a dead map can get rid of: a mount in another namespace (released),
/// a process stuck in D state on the device (freed by `fail_if_no_path`), a kpartx partition map
/// of it (removed first).
pub fn releasable(h: &Holder, partitions: &[crate::model::DeviceName]) -> bool {
    h.is_foreign_mount()
        || (h.kind == HolderKind::OpenDevice && h.process_state == Some('D'))
        || (h.kind == HolderKind::StackedDevice && h.device.as_ref().is_some_and(|d| partitions.contains(d)))
}

/// First look at a device: a final verdict, or a cleanup candidate (stale after the grace).
enum Assessment {
    Final(Judgement),
    Candidate(String),
    /// A path of a multipath map: judged after the map.
    PathOf(crate::model::DeviceName),
}

fn fin(verdict: Verdict, reasons: Vec<String>) -> Assessment {
    Assessment::Final(Judgement { verdict, reasons })
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

fn assess(e: &DeviceEntry) -> Assessment {
    match (assess_storage(e), kubelet_evidence(e)) {
        // A pod on this node uses it: never a cleanup candidate, whatever else is true.
        (Assessment::Candidate(_) | Assessment::Final(_), Some((true, why))) => {
            let mut reasons = vec![why];
            reasons.extend(e.holders.iter().map(holder_reason));
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

fn assess_storage(e: &DeviceEntry) -> Assessment {
    let d = &e.device;
    if let Some(m) = &e.multipath {
        let name = format!("map {} ({})", m.name, d.name);
        let total = m.paths.len();
        if m.queue_if_no_path.is_none() {
            return fin(Verdict::Unused, vec![format!("{name}: its table and status could not be read (no device-mapper control node), so its paths cannot be judged")]);
        }
        if m.active_paths > 0 {
            let mut reasons: Vec<String> = e.holders.iter().map(holder_reason).collect();
            reasons.push(format!(
                "{name}: {} of {total} path(s) active: a map with an active path is never stale",
                m.active_paths
            ));
            return fin(if e.holders.is_empty() { Verdict::Unused } else { Verdict::InUse }, reasons);
        }
        let blocking: Vec<String> =
            e.holders.iter().filter(|h| !releasable(h, &m.partitions)).map(holder_reason).collect();
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
        let mounts = e.holders.iter().filter(|h| h.kind == HolderKind::Mount).count();
        notes.push(if mounts == 0 {
            "no mount in any namespace".into()
        } else {
            format!("{mounts} mount(s) in other namespaces to release first")
        });
        let stuck = e.holders.iter().filter(|h| h.kind == HolderKind::OpenDevice).count();
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
            return fin(Verdict::InUse, e.holders.iter().map(holder_reason).collect());
        }
        if sc.is_offline() {
            return Assessment::Candidate(format!(
                "{} ({}) has been {state} for {{age}} with no holder",
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
                    n.server_cmdline.as_ref().map_or("?".into(), |c| c.escaped())
                )
            }
            (Some(pid), false) => format!("its server process {pid} is gone"),
            (None, _) => "no server process recorded".to_owned(),
        };
        if !e.holders.is_empty() {
            let mut reasons: Vec<String> = e.holders.iter().map(holder_reason).collect();
            reasons.push(format!("{}: {server}", d.name));
            return fin(Verdict::InUse, reasons);
        }
        return Assessment::Candidate(format!("nothing holds {} for {{age}}; {server}", d.name));
    }
    if !e.holders.is_empty() {
        let mut reasons: Vec<String> = e.holders.iter().map(holder_reason).collect();
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

/// Remembers since when each mapping has been unheld.
#[derive(Debug, Default)]
pub struct Tracker {
    unheld_since: HashMap<Identity, SystemTime>,
}

/// One remembered clock, as saved between runs of the one-shot CLI.
#[derive(Debug, Serialize, serde::Deserialize)]
struct SavedClock {
    major: u32,
    minor: u32,
    name: String,
    target: Option<(DevNum, u64)>,
    #[serde(default)]
    tag: String,
    since_unix: f64,
}

impl Tracker {
    /// Loads the clocks a previous run saved; a missing or unreadable file starts afresh (the
    /// grace period then starts now, which only ever delays a verdict).
    pub fn load(path: &std::path::Path) -> Self {
        let Ok(text) = std::fs::read_to_string(path) else { return Self::default() };
        let Ok(saved) = serde_json::from_str::<Vec<SavedClock>>(&text) else {
            tracing::warn!(path = %path.display(), "ignoring an unreadable state file");
            return Self::default();
        };
        let unheld_since = saved
            .into_iter()
            .map(|c| {
                let id = Identity {
                    devnum: DevNum::new(c.major, c.minor),
                    name: c.name,
                    target: c.target,
                    tag: c.tag,
                };
                (id, std::time::UNIX_EPOCH + Duration::from_secs_f64(c.since_unix.max(0.0)))
            })
            .collect();
        Self { unheld_since }
    }

    /// Saves the clocks (atomically: a temp file renamed over the old one).
    pub fn save(&self, path: &std::path::Path) -> std::io::Result<()> {
        let saved: Vec<SavedClock> = self
            .unheld_since
            .iter()
            .map(|(id, t)| SavedClock {
                major: id.devnum.major,
                minor: id.devnum.minor,
                name: id.name.clone(),
                target: id.target,
                tag: id.tag.clone(),
                since_unix: t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0),
            })
            .collect();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(&saved).map_err(std::io::Error::other)?)?;
        std::fs::rename(tmp, path)
    }
}

/// Kinds the agent may clean once stale.
fn is_mapping(e: &DeviceEntry) -> bool {
    match e.device.kind {
        DeviceKind::Loop => e.device.loop_info.is_some(),
        DeviceKind::Rbd | DeviceKind::Nbd => e.device.size_bytes > 0,
        _ => false,
    }
}

fn human(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

impl Tracker {
    /// Like [`Tracker::judge`], but clocks of devices outside `graph` are kept: for scans of a
    /// few devices, which say nothing about the others.
    pub fn judge_some(
        &mut self,
        graph: &DeviceGraph,
        protected: &HashSet<DevNum>,
        grace: Duration,
        now: SystemTime,
    ) -> HashMap<DevNum, Judgement> {
        let outside: HashMap<Identity, SystemTime> = self
            .unheld_since
            .iter()
            .filter(|(id, _)| !graph.devices.iter().any(|e| e.device.devnum == id.devnum))
            .map(|(id, t)| (id.clone(), *t))
            .collect();
        let out = self.judge(graph, protected, grace, now);
        self.unheld_since.extend(outside);
        out
    }

    /// Judges every device of `graph` at `now`, updating the candidate clocks (a device absent
    /// from this scan forgets its history).
    pub fn judge(
        &mut self,
        graph: &DeviceGraph,
        protected: &HashSet<DevNum>,
        grace: Duration,
        now: SystemTime,
    ) -> HashMap<DevNum, Judgement> {
        let mut seen = HashSet::new();
        let mut out = HashMap::new();
        let mut paths = Vec::new();
        for e in &graph.devices {
            let d = &e.device;
            let j = if protected.contains(&d.devnum) {
                Judgement {
                    verdict: Verdict::Protected,
                    reasons: vec![format!(
                        "{} backs the host root, the kubelet or container runtime directories, or is listed as protected",
                        d.name
                    )],
                }
            } else {
                match assess(e) {
                    Assessment::Final(j) => j,
                    Assessment::PathOf(map) => {
                        paths.push((d.devnum, d.name.clone(), map));
                        continue;
                    }
                    Assessment::Candidate(text) => {
                        let id = identity(e);
                        let since = *self.unheld_since.entry(id.clone()).or_insert(now);
                        seen.insert(id);
                        let age = now.duration_since(since).unwrap_or_default();
                        let base = text.replace("{age}", &human(age));
                        if age >= grace {
                            Judgement {
                                verdict: Verdict::Stale,
                                reasons: vec![format!("{base}: stale (grace {})", human(grace))],
                            }
                        } else {
                            Judgement {
                                verdict: Verdict::Suspect,
                                reasons: vec![format!(
                                    "{base}: stale after the grace period of {}",
                                    human(grace)
                                )],
                            }
                        }
                    }
                }
            };
            out.insert(d.devnum, j);
        }
        // A path follows its map: removable only with it.
        for (devnum, name, map) in paths {
            let map_j = graph
                .devices
                .iter()
                .find(|e| e.device.name == map)
                .and_then(|e| out.get(&e.device.devnum))
                .cloned();
            let j = match map_j {
                Some(mj) if matches!(mj.verdict, Verdict::Stale | Verdict::Suspect) => Judgement {
                    verdict: mj.verdict,
                    reasons: vec![format!(
                        "{name} is a path of {map}, which is {}: removed with it",
                        mj.verdict.as_str()
                    )],
                },
                Some(mj) if mj.verdict == Verdict::Protected => Judgement {
                    verdict: Verdict::Protected,
                    reasons: vec![format!("{name} is a path of {map}, which is protected")],
                },
                _ => Judgement {
                    verdict: Verdict::InUse,
                    reasons: vec![format!("{name} is a path of multipath map {map}")],
                },
            };
            out.insert(devnum, j);
        }
        self.unheld_since.retain(|id, _| seen.contains(id));
        out
    }
}
