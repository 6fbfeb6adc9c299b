//! What one judged scan looks like to its readers: every device with its verdict and identity,
//! the scan's figures, blind spots and the Kubernetes API's state. Plain data, built from the
//! engine's [`Judged`] result and replaced whole after each scan; the daemon keeps it, and the
//! server, the event stream and the metrics read it (none of them reach into the daemon for it).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::engine::Judged;
use crate::graph::identity::Identity;
use crate::graph::DeviceEntry;
use crate::host::clock::BootTime;
use crate::judge::stall::Stall;
use crate::judge::{Judgement, Verdict};
use crate::kube::ClusterView;
use crate::model::blindspot::BlindSpot;
use crate::model::scan_stats::ScanStats;
use crate::model::{DevNum, MountNsId};

/// A device with its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub entry: DeviceEntry,
    pub judgement: Judgement,
    pub identity: Identity,
    /// Set when the device does not answer I/O: the evidence ([`crate::judge::stall`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unresponsive: Option<Stall>,
    /// When the agent last read the device itself (sysfs, fds, processes): the latest full
    /// scan, by generation and time.
    pub last_seen_scan: u64,
    pub last_seen: Option<SystemTime>,
    /// What the Kubernetes API said of it when judged ([`crate::judge::gates::api_word_hash`]):
    /// a re-read keeps this view of it only while the API still says the same.
    #[serde(skip)]
    pub api_word: u64,
}

impl DeviceView {
    /// Whether a re-read that did not touch this device may keep it as it is: its verdict
    /// does not run on a clock (held, protected, nothing to clean: a candidate's reasons carry
    /// its age and its grace clock runs), it answers I/O, and the API says of it what it said.
    pub(crate) fn reusable(&self, api: Option<&ClusterView>, now: BootTime) -> bool {
        matches!(self.judgement.verdict, Verdict::InUse | Verdict::Protected | Verdict::Unused)
            && self.unresponsive.is_none()
            && crate::judge::gates::api_word_hash(&self.entry, api, now) == self.api_word
    }
}

/// The result of one scan.
#[derive(Debug, Clone, Serialize)]
pub struct View {
    /// The scan generation: one more for every view published, full scan or re-read.
    pub scan_number: u64,
    pub scanned_at: Option<SystemTime>,
    /// The generation and time at which the devices themselves (sysfs, fds, processes) were
    /// last read: the latest full scan. A namespace re-read after a mount change brings mounts
    /// up to date and carries these over.
    pub devices_read_scan: u64,
    pub devices_read_at: Option<SystemTime>,
    pub stats: ScanStats,
    pub host_ns: MountNsId,
    /// Shared between views: a re-read keeps the devices it did not touch as they were
    /// ([`View::merged`]), and a diff skips those (the same `Arc`).
    pub devices: Vec<Arc<DeviceView>>,
    pub warnings: Vec<String>,
    pub blind_spots: Vec<BlindSpot>,
    /// What the Kubernetes API's word was worth when the verdicts were made.
    pub api_state: crate::kube::ApiState,
    /// The orphaned pod volume directories as the latest full scan judged them (a re-read
    /// keeps them as they were).
    pub pod_volumes: Arc<crate::engine::pod_volumes::PodVolumeReport>,
    /// The pin risks of the host ([`crate::graph::pin_risks`]): set by whoever made the view
    /// from a whole-host scan (unchecked otherwise); a re-read that read no namespace keeps the
    /// previous view's.
    pub pin_risks: Arc<crate::graph::pin_risks::PinReport>,
}

impl View {
    pub(crate) fn empty() -> Self {
        Self {
            scan_number: 0,
            scanned_at: None,
            devices_read_scan: 0,
            devices_read_at: None,
            stats: ScanStats::default(),
            host_ns: MountNsId(0),
            devices: Vec::new(),
            warnings: Vec::new(),
            blind_spots: Vec::new(),
            api_state: crate::kube::ApiState::CannotVouch("no scan yet".to_owned()),
            pod_volumes: Arc::default(),
            pin_risks: Arc::default(),
        }
    }

    pub(crate) fn of(judged: Judged, scan_number: u64) -> Self {
        let Judged { scan, mut verdicts, api_state, mut stalled, api_words, .. } = judged;
        let now = SystemTime::now();
        let devices = scan
            .graph
            .devices
            .into_iter()
            .map(|entry| {
                let judgement = verdicts.remove(&entry.device.devnum).unwrap_or_else(|| Judgement {
                    verdict: Verdict::Unused,
                    reasons: Vec::new(),
                    summary: String::new(),
                });
                let identity = Identity::of(&entry);
                let unresponsive = stalled.remove(&entry.device.devnum);
                let api_word = api_words.get(&entry.device.devnum).copied().unwrap_or_default();
                Arc::new(DeviceView {
                    api_word,
                    entry,
                    judgement,
                    identity,
                    unresponsive,
                    last_seen_scan: scan_number,
                    last_seen: Some(now),
                })
            })
            .collect();
        Self {
            scan_number,
            scanned_at: Some(now),
            devices_read_scan: scan_number,
            devices_read_at: Some(now),
            stats: scan.stats,
            host_ns: scan.graph.host_ns,
            devices,
            warnings: scan.warnings,
            blind_spots: scan.blind_spots,
            api_state,
            pod_volumes: Arc::default(),
            pin_risks: Arc::default(),
        }
    }
}

impl View {
    /// The view after a re-read that rebuilt only `rebuilt` (`judged` has those): the other
    /// devices of `previous` are kept as they are (the same `Arc`, which the diff skips).
    /// `devices` is every device of the re-read's snapshot, in order; `None` when `previous`
    /// does not list exactly those (it is not the view of that snapshot: the caller scans in
    /// full).
    pub(crate) fn merged(
        judged: Judged,
        previous: &View,
        rebuilt: Option<&HashSet<DevNum>>,
        devices: &[DevNum],
        scan_number: u64,
    ) -> Option<Self> {
        let fresh = Self::of(judged, scan_number).carrying_device_reads_of(previous);
        let Some(rebuilt) = rebuilt else { return Some(fresh) };
        let same_devices = previous.devices.len() == devices.len()
            && previous.devices.iter().zip(devices).all(|(d, n)| d.entry.device.devnum == *n);
        if !same_devices || fresh.devices.len() != rebuilt.len() {
            return None;
        }
        let mut built: HashMap<DevNum, Arc<DeviceView>> =
            fresh.devices.iter().map(|d| (d.entry.device.devnum, Arc::clone(d))).collect();
        let devices = previous
            .devices
            .iter()
            .map(|d| built.remove(&d.entry.device.devnum).unwrap_or_else(|| Arc::clone(d)))
            .collect();
        Some(Self { devices, ..fresh })
    }

    /// This view, built from a namespace re-read, with the device-read generation and time of
    /// the view it updates (whose full scan read the devices).
    pub(crate) fn carrying_device_reads_of(mut self, previous: &View) -> Self {
        self.pod_volumes = Arc::clone(&previous.pod_volumes);
        if previous.devices_read_at.is_some() {
            self.devices_read_scan = previous.devices_read_scan;
            self.devices_read_at = previous.devices_read_at;
            for d in &mut self.devices {
                let d = Arc::make_mut(d);
                d.last_seen_scan = previous.devices_read_scan;
                d.last_seen = previous.devices_read_at;
            }
        }
        self
    }
}
