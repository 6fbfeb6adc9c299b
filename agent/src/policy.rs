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

use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::{DevNum, DeviceKind};
use crate::plan::holder_reason;

/// The agent's judgement of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    InUse,
    Unused,
    Suspect,
    Stale,
    Protected,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InUse => "in_use",
            Self::Unused => "unused",
            Self::Suspect => "suspect",
            Self::Stale => "stale",
            Self::Protected => "protected",
        }
    }
}

/// A verdict and the evidence behind it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Judgement {
    pub verdict: Verdict,
    pub reasons: Vec<String>,
}

/// What identifies a mapping across scans.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Identity {
    devnum: DevNum,
    name: String,
    target: Option<(DevNum, u64)>,
}

fn identity(e: &DeviceEntry) -> Identity {
    let l = e.device.loop_info.as_ref();
    Identity {
        devnum: e.device.devnum,
        name: e.device.name.as_str().to_owned(),
        target: l.and_then(|l| Some((l.backing_dev?, l.backing_inode?))),
    }
}

/// Remembers since when each mapping has been unheld.
#[derive(Debug, Default)]
pub struct Tracker {
    unheld_since: HashMap<Identity, SystemTime>,
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
    /// Judges every device of `graph` at `now`, updating the unheld-since clocks (a device
    /// absent from this scan forgets its history).
    pub fn judge(
        &mut self,
        graph: &DeviceGraph,
        protected: &HashSet<DevNum>,
        grace: Duration,
        now: SystemTime,
    ) -> HashMap<DevNum, Judgement> {
        let mut seen = HashSet::new();
        let mut out = HashMap::new();
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
            } else if !e.holders.is_empty() {
                Judgement { verdict: Verdict::InUse, reasons: e.holders.iter().map(holder_reason).collect() }
            } else if !is_mapping(e) {
                Judgement {
                    verdict: Verdict::Unused,
                    reasons: vec![format!(
                        "nothing holds {}; a {} is not something the agent cleans",
                        d.name,
                        d.kind.as_str()
                    )],
                }
            } else {
                let id = identity(e);
                let since = *self.unheld_since.entry(id.clone()).or_insert(now);
                seen.insert(id);
                let unheld = now.duration_since(since).unwrap_or_default();
                let base = format!(
                    "nothing holds {} (no mount in any namespace, no open fd, no swap, nothing stacked on it) for {}",
                    d.name,
                    human(unheld)
                );
                if unheld >= grace {
                    Judgement {
                        verdict: Verdict::Stale,
                        reasons: vec![format!("{base}: stale (grace {})", human(grace))],
                    }
                } else {
                    Judgement {
                        verdict: Verdict::Suspect,
                        reasons: vec![format!("{base}: stale after the grace period of {}", human(grace))],
                    }
                }
            };
            out.insert(d.devnum, j);
        }
        self.unheld_since.retain(|id, _| seen.contains(id));
        out
    }
}
