//! Verdicts with reasons: in use, unused, suspect, stale, protected, unknown. Pure: the caller
//! hands in one [`Scan`], the grace clocks and the Kubernetes API's view.
//!
//! Only devices the agent could clean (bound loop devices, rbd and nbd mappings nothing holds,
//! multipath maps with no active path and nothing but releasable holders, offline standalone
//! disks) are candidates, and a candidate becomes stale only after complete scans have observed
//! it unheld for the whole grace period ([`crate::judge::grace`]). A candidate that a blind spot of the
//! scan could hide a holder of is `unknown`, and so is one the Kubernetes API should vouch for
//! but cannot: nothing destructive rests on missing evidence.

mod accounted;
pub mod api_evidence;
pub mod gates;
pub mod grace;
mod iscsi;
mod r#loop;
mod multipath;
mod nbd;
pub mod nvme;
pub mod orphans;
mod rbd;
mod scsi;
pub mod stack;
pub mod stall;
pub mod verdicts;
mod weigh_stall_and_api;

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::host::clock::BootTime;
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
    /// Nothing holds it, and there is nothing of it for the agent to clean (a disk, an unbound
    /// loop device, a stack layer whose map or disk is not being cleaned).
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

#[cfg(test)]
mod tests;
