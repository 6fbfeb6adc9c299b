//! The one engine: scan → judge → plan → execute. The one-shot CLI, the daemon (its scans, its
//! Plan and Apply, its modes) and the property test all drive this, and nothing else strings the
//! stages together.
//!
//! - [`Engine::scan`] reads the host (all of it, or one device and what is stacked on it) into a
//!   [`Scan`], with its blind spots;
//! - [`Engine::judge`] gives every device of that scan a verdict, advancing the grace clocks and
//!   the watch on devices that do not answer ([`crate::judge::stall`]);
//! - [`Engine::plan`] turns one device of a judged scan into ordered steps and passes them
//!   through the gates: a verdict and the plan built on it always come from the same scan;
//! - [`Engine::execute`] runs a plan: no journal, no action; before every destructive step a
//!   fresh scan of its device and the kernel's own word must agree with the plan (identity,
//!   completeness, holders, claims, the API); a step whose prerequisite failed does not run.
//!
//! After a crash, [`Engine::recover`] closes the steps the journal has open ([`recover`]).
//!
//! Every way in (the one-shot CLI, the daemon's modes and Apply, the property test) goes through
//! one request workflow, [`Engine::carry_out`] ([`workflow`]): journal lock and recovery first,
//! a fresh plan bound to the identity the caller saw, may-act, the plan journaled whole, execute,
//! the after-state. Nothing else calls [`Engine::plan_fresh`] or [`Engine::execute`].
//!
//! The engine reaches the machine only through a [`World`]: [`world::LinuxWorld`] on a real
//! host, [`sim::SimWorld`] for the daemon and the gRPC service without root, a simulated one in
//! the property test.
//!
//! The fronts (the one-shot CLI, the gRPC service) reach the engine only through its request
//! API ([`requests`]) and return its answers on the wire ([`wire`]), built once for all of them.

pub mod dir_recover;
pub mod dir_workflow;
pub mod error;
pub mod execute;
pub mod outcome;
pub mod pins;
pub mod planning;
pub mod pod_volumes;
mod propagation;
pub mod recheck;
pub mod recover;
pub mod requests;
pub mod sim;
pub mod statmount_cache_file;
pub mod view;
pub mod wire;
pub mod workflow;
pub mod world;

#[cfg(test)]
mod tests;

use crate::graph::scan::{Scan, Target};
use crate::host::clock::BootTime;
use crate::judge::grace::Clocks;
use crate::judge::stall::{Stall, StallWatch};
use crate::judge::{self, Judgement};
use crate::model::opt_ins::{CleanOptions, ReleaseOptions};
use crate::model::DevNum;
use crate::plan::Step;
use error::EngineError;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;
use world::World;

/// Whether a plan starts by unblocking its device (the hung-device gate lets such a plan through).
pub(super) fn first_unblocks(steps: &[Step]) -> bool {
    steps.first().is_some_and(Step::unblocks)
}

/// What an engine is asked to do to a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Detach the device's mounts in namespaces other than the host's (never a copy of a mount
    /// live in the host's namespace), nothing else.
    Release,
    /// Tear the device down by its kind (releasing its foreign mounts first where that kind
    /// allows): unbind a loop device, disconnect nbd, unmap rbd, tear down a dead multipath map
    /// and its paths, delete an offline SCSI disk. Only once it is stale.
    Clean,
}

/// The engine's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How long a candidate must be observed unheld before it is stale.
    pub grace: Duration,
    /// The largest gap between observations that keeps a grace clock running (twice the
    /// rescan interval).
    pub max_gap: Duration,
    /// Opt-ins for clean.
    pub clean: CleanOptions,
    /// Opt-ins for release (`--force-busy`).
    pub release: ReleaseOptions,
    /// How long I/O in flight may go without any completing before the device is unresponsive.
    pub unresponsive_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(300),
            max_gap: Duration::from_secs(120),
            clean: CleanOptions::default(),
            release: ReleaseOptions::default(),
            unresponsive_after: crate::judge::stall::DEFAULT_THRESHOLD,
        }
    }
}

/// A scan with a verdict for every device in it.
#[derive(Debug, Clone)]
pub struct Judged {
    pub scan: Scan,
    pub verdicts: HashMap<DevNum, Judgement>,
    /// What the Kubernetes API's word was worth when judged.
    pub api_state: crate::kube::ApiState,
    pub judged_at: BootTime,
    /// The devices of the scan that do not answer, with the evidence.
    pub stalled: HashMap<DevNum, Stall>,
    /// What the Kubernetes API said of each device judged ([`judge::gates::api_word_hash`]).
    pub api_words: HashMap<DevNum, u64>,
}

impl Judged {
    /// The verdict of one device.
    pub fn verdict(&self, devnum: DevNum) -> Option<&Judgement> {
        self.verdicts.get(&devnum)
    }
}

/// The engine over one world.
pub struct Engine<W: World> {
    pub world: W,
    pub settings: Settings,
    /// Every observation of the devices' I/O counters so far.
    stalls: Mutex<StallWatch>,
}

impl<W: World> Engine<W> {
    pub fn new(world: W, settings: Settings) -> Self {
        Self { world, settings, stalls: Mutex::new(StallWatch::new()) }
    }

    /// Observes the I/O counters of the devices `scan` covers: those that do not answer.
    pub(super) fn observe_io(&self, scan: &Scan, now: BootTime) -> HashMap<DevNum, Stall> {
        let mut watch = self.stalls.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = HashMap::new();
        for e in scan.graph.devices.iter().filter(|e| scan.covers(e.device.devnum)) {
            let Some(io) = e.io else { continue };
            let d = &e.device;
            if let Some(s) = watch.observe(d.devnum, d.diskseq, io, now, self.settings.unresponsive_after) {
                out.insert(d.devnum, s);
            }
        }
        if scan.scope.is_none() {
            let present: std::collections::HashSet<(DevNum, Option<u64>)> =
                scan.graph.devices.iter().map(|e| (e.device.devnum, e.device.diskseq)).collect();
            watch.retain(|d, s| present.contains(&(d, s)));
        }
        out
    }

    /// Reads the host.
    pub fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        self.world.scan(target)
    }

    /// Judges every device of `scan` now, advancing `clocks` (only for the devices the scan
    /// covers: a scan of one device says nothing about the others).
    pub fn judge(&self, scan: Scan, clocks: &mut Clocks) -> Judged {
        let now = self.world.now();
        let api = self.world.cluster();
        let stalled = self.observe_io(&scan, now);
        let verdicts = judge::verdicts::judge(
            &scan,
            clocks,
            &judge::JudgeInput {
                grace: self.settings.grace,
                max_gap: self.settings.max_gap,
                now,
                api: api.as_ref(),
                stalled: &stalled,
            },
        );
        let api_state = crate::kube::ApiState::of(api.as_ref(), &self.world.api_off(), now);
        let api_words = scan
            .graph
            .devices
            .iter()
            .filter(|e| scan.covers(e.device.devnum))
            .map(|e| (e.device.devnum, judge::gates::api_word_hash(e, api.as_ref(), now)))
            .collect();
        Judged { scan, verdicts, api_state, judged_at: now, stalled, api_words }
    }
}
