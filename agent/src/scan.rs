//! One scan as the engine uses it: the device graph, what the scan could not see, which devices
//! are protected, and when it was taken. Verdicts and plans are always made from one `Scan`.

use std::collections::HashSet;

use serde::Serialize;

use crate::blindspot::BlindSpot;
use crate::clock::BootTime;
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::DevNum;
use crate::snapshot::ScanStats;

/// What a scan looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Every block device.
    All,
    /// One device and everything stacked on it (partitions, sysfs holders), transitively.
    Device(DevNum),
}

/// The result of one scan.
#[derive(Debug, Clone, Serialize)]
pub struct Scan {
    pub graph: DeviceGraph,
    /// What the scan could not see.
    pub blind_spots: Vec<BlindSpot>,
    /// Devices never to be touched: behind the host root and the kubelet and runtime
    /// directories (and everything they sit on), and those the config names.
    #[serde(skip)]
    pub protected: HashSet<DevNum>,
    pub stats: ScanStats,
    /// Things that could not be read but that cannot hide a holder (labels, cmdlines).
    pub warnings: Vec<String>,
    /// When the scan started.
    #[serde(skip)]
    pub taken_at: BootTime,
    /// The devices whose holders were looked for (`None`: all of them).
    #[serde(skip)]
    pub scope: Option<Vec<DevNum>>,
}

impl Scan {
    /// A scan of `graph` that saw everything (no blind spot, nothing protected, no warning),
    /// taken at `taken_at`: what simulated worlds and tests hand the policy.
    pub fn complete(graph: DeviceGraph, taken_at: BootTime) -> Self {
        Self {
            graph,
            blind_spots: Vec::new(),
            protected: HashSet::new(),
            stats: ScanStats::default(),
            warnings: Vec::new(),
            taken_at,
            scope: None,
        }
    }

    /// The entry of one device.
    pub fn entry(&self, devnum: DevNum) -> Option<&DeviceEntry> {
        self.graph.get(devnum)
    }

    /// Whether this scan looked for holders of `devnum`.
    pub fn covers(&self, devnum: DevNum) -> bool {
        self.scope.as_ref().is_none_or(|s| s.contains(&devnum))
    }
}
