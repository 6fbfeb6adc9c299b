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
//! host, a simulated one in the property test.

pub mod view;

pub mod recheck;
pub mod recover;
pub mod workflow;
pub mod world;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crate::act::journal::Journal;
use crate::act::{ActError, StepOutcome, StepReport};
use crate::graph::identity::Identity;
use crate::graph::scan::{Scan, Target};
use crate::host::clock::BootTime;
use crate::judge::gates;
use crate::judge::grace::Clocks;
use crate::judge::stall::{Stall, StallWatch};
use crate::judge::{self, Judgement, Verdict};
use crate::model::DevNum;
use crate::plan::{self, CleanOptions, Plan, Step};
pub use world::World;

/// Why the engine could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The host could not be read at all (sysfs or procfs missing, a malformed kernel file).
    #[error(transparent)]
    Discover(#[from] crate::discover::DiscoverError),
    /// No such device now.
    #[error("{0}")]
    NotFound(String),
    /// The device's identity is not the one the caller expected (Apply bound to a Plan).
    #[error(
        "{device}: the device changed since it was planned: planned for [{planned}], now [{now}]; plan again"
    )]
    IdentityChanged { device: String, planned: String, now: String },
    /// This agent may not act on the host (not in its PID namespace, not its procfs).
    #[error("{0}")]
    CannotAct(String),
    /// The journal could not be opened: nothing acts without it.
    #[error("cannot open the journal {}: {source}", path.display())]
    Journal { path: std::path::PathBuf, source: std::io::Error },
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
    pub release: plan::ReleaseOptions,
    /// How long I/O in flight may go without any completing before the device is unresponsive.
    pub unresponsive_after: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            grace: Duration::from_secs(300),
            max_gap: Duration::from_secs(120),
            clean: CleanOptions::default(),
            release: plan::ReleaseOptions::default(),
            unresponsive_after: crate::judge::stall::DEFAULT_THRESHOLD,
        }
    }
}

/// A scan with a verdict for every device in it.
#[derive(Debug, Clone)]
pub struct Judged {
    pub scan: Scan,
    pub verdicts: HashMap<DevNum, Judgement>,
    /// What the Kubernetes API could vouch for when judged, in words.
    pub api_state: String,
    pub judged_at: BootTime,
    /// The devices of the scan that do not answer, with the evidence.
    pub stalled: HashMap<DevNum, Stall>,
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
    fn observe_io(&self, scan: &Scan, now: BootTime) -> HashMap<DevNum, Stall> {
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
        let verdicts = judge::judge(
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
        let api_state = match &api {
            None => "not configured".to_owned(),
            Some(v) => match v.vouch(now) {
                Ok(()) => "vouching".to_owned(),
                Err(why) => format!("cannot vouch: {why}"),
            },
        };
        Judged { scan, verdicts, api_state, judged_at: now, stalled }
    }

    /// Scans one device, judges it and plans `op` for it: the usual way to plan. What the plan's
    /// steps would remove besides the device (an NVMe controller's other namespaces, an iSCSI
    /// session's disks, partitions) is scanned too: the scan is widened to the plan's scope
    /// before anything is judged (what stays outside it is refused by [`Engine::plan`]).
    pub fn plan_fresh(
        &self,
        devnum: DevNum,
        op: Operation,
        clocks: &mut Clocks,
    ) -> Result<(Judged, Plan), EngineError> {
        let scan = self.plan_scan(devnum, op)?;
        let judged = self.judge(scan, clocks);
        let plan = self.plan(&judged, devnum, op)?;
        Ok((judged, plan))
    }

    /// The scan a plan for `op` on `devnum` rests on: the device, widened to everything the
    /// plan's steps would remove ([`crate::graph::scan::plan_scope`]: an NVMe controller's other
    /// namespaces, a session's other disks, what is stacked on them).
    pub fn plan_scan(&self, devnum: DevNum, op: Operation) -> Result<Scan, EngineError> {
        let mut scan = self.scan(Target::Device(devnum))?;
        for _ in 0..MAX_WIDENINGS {
            let want = self.draft_scope(&scan, devnum, op);
            if want.iter().all(|d| scan.covers(*d)) {
                break;
            }
            let mut target = vec![devnum];
            target.extend(scan.scope.iter().flatten().copied());
            target.extend(want);
            dedup_keep_first(&mut target);
            tracing::debug!(device = %devnum, devices = target.len(), "widening the scan to what the plan removes");
            scan = self.scan(Target::Devices(target))?;
        }
        Ok(scan)
    }

    /// A fresh scan of `devnum` that covers everything `step` removes ([`crate::graph::scan::removed_by`]).
    fn scan_for_step(&self, step: &Step) -> Result<Scan, EngineError> {
        let mut fresh = self.world.scan(Target::Device(step.devnum))?;
        for _ in 0..MAX_WIDENINGS {
            let want = crate::graph::scan::removed_by(step, &fresh.graph);
            if want.iter().all(|d| fresh.covers(*d)) {
                break;
            }
            let mut target = vec![step.devnum];
            target.extend(fresh.scope.iter().flatten().copied());
            target.extend(want);
            dedup_keep_first(&mut target);
            fresh = self.world.scan(Target::Devices(target))?;
        }
        Ok(fresh)
    }

    /// The plan for `op` on one device of `judged`, through every gate: nothing is done to a
    /// protected device, one a pod uses (kubelet or the API), one the API cannot vouch for; a
    /// cleanup also needs a complete scan of the device and a `stale` verdict.
    pub fn plan(&self, judged: &Judged, devnum: DevNum, op: Operation) -> Result<Plan, EngineError> {
        let scan = &judged.scan;
        let entry = scan
            .entry(devnum)
            .ok_or_else(|| EngineError::NotFound(format!("device {devnum} is not in the scan")))?;
        let judgement = judged.verdict(devnum);
        let mut p = match op {
            Operation::Release => {
                // Held to the clean path's standard: no release rests on a blind scan, and none
                // detaches a mount in use unless the operator forces it (plan::release_with).
                let mut p = plan::release_with(entry, &self.settings.release);
                let why = crate::judge::nvme::release_refusal(entry)
                    .or_else(|| gates::completeness(entry, &scan.blind_spots));
                if let Some(why) = why {
                    p.refuse(why);
                }
                if let (Some(reason), None) = (&p.force_busy, &p.refusal) {
                    tracing::warn!(target: "audit", phase = "override", gate = "mount_users", device = %p.device, identity = %p.identity.token(), reason = %reason, users = %p.notes.join("; "), "release forced although its mounts are in use");
                }
                p
            }
            Operation::Clean => plan::for_clean(entry, &scan.graph, self.settings.clean),
        };
        let api = self.world.cluster();
        // The other devices the plan acts on (the layers stacked on a map) pass the same gates.
        let mut others: Vec<&crate::graph::DeviceEntry> = Vec::new();
        for s in p.steps.iter().filter(|s| s.devnum != devnum && !s.is_release()) {
            if let Some(e) =
                scan.entry(s.devnum).filter(|_| !others.iter().any(|o| o.device.devnum == s.devnum))
            {
                others.push(e);
            }
        }
        let each = |e: &crate::graph::DeviceEntry| {
            gates::protection(e, &scan.protected)
                .or_else(|| gates::api(e, api.as_ref(), self.world.now()).refusal())
                .or_else(|| gates::kubelet_pods(e))
        };
        let safety = each(entry)
            .or_else(|| others.iter().find_map(|e| each(e)))
            .or_else(|| gates::responsive(entry, judged.stalled.get(&devnum), &p.steps));
        let unsure_host = match (&scan.graph.host_ns_unsure, p.steps.iter().any(Step::is_release)) {
            (Some(why), true) => {
                Some(format!("{why}: no mount can be told host from foreign, so none is released"))
            }
            _ => None,
        };
        if let Some(r) = safety.or(unsure_host) {
            p.refuse(r);
        } else if op == Operation::Clean && p.refusal.is_none() {
            // A plan already refused (still held, a path active) keeps its own reason.
            let r = gates::completeness(entry, &scan.blind_spots)
                .or_else(|| others.iter().find_map(|e| gates::completeness(e, &scan.blind_spots)))
                .or_else(|| self.side_effects_refusal(&p, scan))
                .or_else(|| not_stale(&p, judgement))
                .or_else(|| self.openers_refusal(&p, scan));
            if let Some(r) = r {
                p.refuse(r);
            }
        }
        Ok(p)
    }

    /// What the plan of `op` for `devnum` would remove by its kind, before the gates (a gate
    /// that refuses it may be refusing for want of the wider scan). A release removes no device.
    fn draft_scope(&self, scan: &Scan, devnum: DevNum, op: Operation) -> Vec<DevNum> {
        match (scan.entry(devnum), op) {
            (Some(entry), Operation::Clean) => {
                let draft = plan::for_clean(entry, &scan.graph, self.settings.clean);
                crate::graph::scan::plan_scope(&draft, &scan.graph)
            }
            _ => vec![devnum],
        }
    }

    /// Why the plan must not run because of a device a step removes besides its own (an NVMe
    /// controller's other namespaces, a disk's partitions, a session's other disks): not looked
    /// at by the scan, held, protected, used by a pod, or hidden by a blind spot.
    fn side_effects_refusal(&self, p: &Plan, scan: &Scan) -> Option<String> {
        let api = self.world.cluster();
        crate::graph::scan::side_effects(p, &scan.graph).into_iter().find_map(|(d, step)| {
            let Some(e) = scan.entry(d) else {
                return Some(format!(
                    "{d} goes too when {} runs ({}), but it is not in the scan",
                    step.action(),
                    step.describe()
                ));
            };
            recheck::side_effect(step, scan, e, None, api.as_ref(), self.world.now())
        })
    }

    /// Why the plan must not run because the kernel counts more openers of a dm device it acts
    /// on than the plan accounts for ([`gates::openers`]: mounts it releases, layers it removes,
    /// stuck readers it frees), asked once per dm device at planning time (the re-check asks
    /// again right before each dm step).
    fn openers_refusal(&self, p: &Plan, scan: &Scan) -> Option<String> {
        let mut asked = Vec::new();
        for step in &p.steps {
            if !matches!(
                step.action,
                crate::plan::Action::DmMessage { .. } | crate::plan::Action::DmRemove { .. }
            ) || asked.contains(&step.devnum)
            {
                continue;
            }
            asked.push(step.devnum);
            let Some(entry) = scan.entry(step.devnum) else { continue };
            let word = self.world.kernel_word(&step.device, step.devnum);
            if let Some(r) = recheck::planned_openers_refusal(p, entry, &word) {
                return Some(r);
            }
        }
        None
    }

    /// Runs a plan's steps in order. Refuses outright when this agent may not act on the host.
    /// Every step is journaled before and after (no journal, no action) and audited; before
    /// each step that is not a mount release, a fresh scan of its device and the kernel's word
    /// must agree with the plan ([`recheck`]); a step whose prerequisite did not finish is not
    /// run. Failures are collected, not short-circuited across independent steps.
    pub fn execute(&self, plan: &Plan, journal: &mut Journal) -> Result<Vec<StepReport>, EngineError> {
        self.execute_indexed(plan, journal, None)
    }

    /// [`Engine::execute`] of the steps of `plan` at `only` (all when `None`): the rest of a
    /// resumed plan, whose other steps finished before the interruption.
    fn execute_indexed(
        &self,
        plan: &Plan,
        journal: &mut Journal,
        only: Option<&[usize]>,
    ) -> Result<Vec<StepReport>, EngineError> {
        if plan.refusal.is_some() || plan.steps.is_empty() {
            return Ok(Vec::new());
        }
        self.world.can_act().map_err(EngineError::CannotAct)?;
        let mut reports: Vec<StepReport> = Vec::new();
        let mut unfinished: Vec<usize> = Vec::new();
        for (i, step) in plan.steps.iter().enumerate() {
            if only.is_some_and(|o| !o.contains(&i)) {
                continue;
            }
            if let Some(k) = unfinished.iter().copied().find(|&k| depends_on(step, &plan.steps[k])) {
                let earlier = &plan.steps[k];
                reports.push(StepReport {
                    step: step.clone(),
                    result: Err(ActError::Skipped {
                        device: step.device.clone(),
                        reason: format!(
                            "step {} ({} of {}) did not finish",
                            k + 1,
                            earlier.action(),
                            earlier.device
                        ),
                    }),
                });
                unfinished.push(i);
                continue;
            }
            let id = match journal.begin_at(step, Some(i)) {
                Ok(id) => id,
                Err(e) => {
                    let reason = format!("cannot write the journal {}: {e}", journal.path().display());
                    reports.push(StepReport {
                        step: step.clone(),
                        result: Err(ActError::Precondition { device: step.device.clone(), reason }),
                    });
                    unfinished.push(i);
                    continue;
                }
            };
            tracing::info!(target: "audit", phase = "intent", action = step.action(), device = %step.device, identity = %step.identity.token(), step = %step.describe(), journal_id = %id);
            let result = match self.recheck(plan, step) {
                Some(Halt::Refuse(reason)) => {
                    Err(ActError::Precondition { device: step.device.clone(), reason })
                }
                Some(Halt::Absent(why)) => {
                    tracing::info!(device = %step.device, "{why}");
                    Ok(StepOutcome::AlreadyAbsent)
                }
                None => self.world.run(step),
            };
            let (word, detail) = crate::act::outcome_word(&result);
            if let Err(e) = journal.finish(&id, word, &detail) {
                tracing::error!(device = %step.device, journal_id = %id, "cannot record the step's result in the journal: {e}");
            }
            tracing::info!(target: "audit", phase = "result", action = step.action(), device = %step.device, result = word, detail = %detail, journal_id = %id);
            if !result.as_ref().is_ok_and(StepOutcome::is_finished) {
                unfinished.push(i);
            }
            reports.push(StepReport { step: step.clone(), result });
        }
        Ok(reports)
    }

    /// Checks, right before `step` runs, that the device is still what was planned and nothing
    /// the plan does not account for holds it. `None`: go. A device the fresh scan no longer has
    /// is never handed to the actuator: it is already absent only where nothing on the host is
    /// the step's kernel object any more ([`Engine::vanished`]), else refused.
    fn recheck(&self, plan: &Plan, step: &Step) -> Option<Halt> {
        if step.is_release() {
            // A fresh scan of the device ([`recheck::release_refusal`]); the actuator then
            // re-reads the namespace and the mount (ID, device, nothing beneath) itself.
            let fresh = match self.world.scan(Target::Device(step.devnum)) {
                Ok(s) => s,
                Err(e) => return Some(Halt::Refuse(format!("cannot re-check it with a fresh scan: {e}"))),
            };
            let stalled = self.observe_io(&fresh, self.world.now());
            return fresh
                .entry(step.devnum)
                .and_then(|e| gates::responsive(e, stalled.get(&step.devnum), &plan.steps))
                .or_else(|| {
                    let api = self.world.cluster();
                    recheck::release_refusal(plan, step, &fresh, api.as_ref(), self.world.now())
                })
                .map(Halt::Refuse);
        }
        if matches!(step.action, crate::plan::Action::IscsiLogout { .. }) {
            // Its disk was deleted by the steps before it (which it depends on): the actuator
            // re-reads the session itself (same target and portal, no SCSI device left on it).
            return None;
        }
        let fresh = match self.scan_for_step(step) {
            Ok(s) => s,
            Err(EngineError::NotFound(_)) => return Some(self.vanished(step)),
            Err(e) => return Some(Halt::Refuse(format!("cannot re-check it with a fresh scan: {e}"))),
        };
        let Some(entry) = fresh.entry(step.devnum) else { return Some(self.vanished(step)) };
        let stalled = self.observe_io(&fresh, self.world.now());
        if let Some(r) = gates::responsive(entry, stalled.get(&step.devnum), &plan.steps) {
            return Some(Halt::Refuse(r));
        }
        let word = self.world.kernel_word(&step.device, step.devnum);
        let api = self.world.cluster();
        recheck::refusal(plan, step, &fresh, entry, &word, api.as_ref(), self.world.now())
            .or_else(|| self.recheck_side_effects(plan, step, &fresh, api.as_ref()))
            .map(Halt::Refuse)
    }

    /// The step's device number is gone from a fresh scan: looks for the step's kernel object
    /// (the map's uuid, the disk's wwid and address, the rbd id, the loop binding, the NVMe
    /// controller) anywhere on the host. Absent only when nothing is it any more, as the
    /// actuator's own identity check would find; otherwise, or when the host cannot be read,
    /// refused with why.
    fn vanished(&self, step: &Step) -> Halt {
        let all = match self.world.scan(Target::All) {
            Ok(s) => s,
            Err(e) => {
                return Halt::Refuse(format!(
                    "{} ({}) is no longer in a fresh scan, and the host cannot be read to tell whether it is gone: {e}",
                    step.device, step.devnum
                ))
            }
        };
        match all.graph.devices.iter().find(|e| is_the_object_of(step, e)) {
            Some(e) => Halt::Refuse(format!(
                "{} ({}) is no longer in a fresh scan, but the object {} acts on is now {} ({}): not the device it was planned for",
                step.device,
                step.devnum,
                step.action(),
                e.device.name,
                e.device.devnum
            )),
            None if matches!(step.action, crate::plan::Action::NvmeDeleteController { .. }) => {
                Halt::Refuse(format!(
                    "{} ({}) is no longer in a fresh scan; its controller may remain without a namespace, which a scan does not show: check it with `nvme list-subsys`",
                    step.device, step.devnum
                ))
            }
            None => Halt::Absent(format!(
                "{} ({}) is gone and nothing on the host is the object {} acts on any more: already absent",
                step.device,
                step.devnum,
                step.action()
            )),
        }
    }

    /// The re-check of what `step` removes besides its own device, in the fresh scan: each such
    /// device still there must be unheld, pass the gates and have the kernel's word agree.
    fn recheck_side_effects(
        &self,
        plan: &Plan,
        step: &Step,
        fresh: &Scan,
        api: Option<&crate::kube::ClusterView>,
    ) -> Option<String> {
        crate::graph::scan::side_effects(plan, &fresh.graph).into_iter().filter(|(_, s)| *s == step).find_map(
            |(d, _)| {
                let e = fresh.entry(d)?;
                let word = self.world.kernel_word(&e.device.name, d);
                recheck::side_effect(step, fresh, e, Some(&word), api, self.world.now())
            },
        )
    }

    /// Binds an operator's request to the identities they saw (a Plan's answer): refuses when
    /// the device now is another one.
    pub fn expect_identity(
        &self,
        judged: &Judged,
        devnum: DevNum,
        expected: &str,
    ) -> Result<(), EngineError> {
        let Some(entry) = judged.scan.entry(devnum) else {
            return Err(EngineError::NotFound(format!("device {devnum} is gone")));
        };
        let now = Identity::of(entry);
        if now.token() == expected {
            return Ok(());
        }
        Err(EngineError::IdentityChanged {
            device: entry.device.name.to_string(),
            planned: expected.to_owned(),
            now: now.token(),
        })
    }
}

/// Why a step does not reach the actuator ([`Engine::recheck`]).
enum Halt {
    /// A gate says no: the step is refused with why.
    Refuse(String),
    /// What the step would remove is gone already: reported already absent, nothing run.
    Absent(String),
}

/// Whether `e` is the kernel object `step` acts on (the key its actuator checks), whatever its
/// device number now.
fn is_the_object_of(step: &Step, e: &crate::graph::DeviceEntry) -> bool {
    use crate::plan::Action;
    match &step.action {
        Action::DmMessage { uuid, .. } | Action::DmRemove { uuid, .. } => {
            e.device.dm.as_ref().is_some_and(|d| &d.uuid == uuid)
        }
        Action::ScsiOffline { wwid, address, .. } | Action::ScsiDelete { wwid, address } => {
            e.scsi.as_ref().is_some_and(|s| {
                s.disk.address.to_string() == *address || s.disk.wwid.as_deref() == Some(wwid.as_str())
            })
        }
        Action::RbdUnmap { id, image_id, .. } => {
            e.rbd.as_ref().is_some_and(|r| r.id == *id || (!image_id.is_empty() && r.image_id == *image_id))
        }
        Action::DetachLoop { backing_dev, backing_inode, .. } => {
            e.device.loop_info.as_ref().is_some_and(|l| {
                backing_inode.is_some() && l.backing_dev == *backing_dev && l.backing_inode == *backing_inode
            })
        }
        Action::NvmeDeleteController { controller, .. } => {
            e.nvme.as_ref().is_some_and(|n| n.controllers.iter().any(|c| &c.name == controller))
        }
        // A mount, an nbd connection or an iSCSI session is re-read by its actuator itself.
        Action::DetachMount { .. } | Action::NbdDisconnect { .. } | Action::IscsiLogout { .. } => {
            e.device.devnum == step.devnum
        }
    }
}

/// How many times a scan is widened to what a plan removes before what is still outside it is
/// refused (each widening adds what the wider scan showed; two suffice on any real host).
const MAX_WIDENINGS: usize = 3;

/// Removes later duplicates, keeping the first (the device asked about) first.
fn dedup_keep_first(v: &mut Vec<DevNum>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|d| seen.insert(*d));
}

/// Whether `later` may only run once `earlier` finished: a mount release depends only on the
/// steps before it that are not releases (stopping a dead map's queueing first); every other
/// step depends on all the steps before it.
fn depends_on(later: &Step, earlier: &Step) -> bool {
    !later.is_release() || !earlier.is_release()
}

/// A cleanup needs a `stale` verdict: observed unheld for the whole grace period.
fn not_stale(p: &Plan, judgement: Option<&Judgement>) -> Option<String> {
    if p.steps.is_empty() && p.refusal.is_none() {
        return None; // nothing to do (already unbound)
    }
    match judgement {
        Some(j) if j.verdict == Verdict::Stale => None,
        Some(j) => {
            Some(format!("{} is {}, not stale: {}", p.device, j.verdict.as_str(), j.reasons.join("; ")))
        }
        None => Some(format!("{} has not been judged", p.device)),
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;
    use crate::act::recording::RecordingActuator;
    use crate::act::Actuator;
    use crate::discover::namespaces::NsEntry;
    use crate::discover::probe::KernelWord;
    use crate::graph::{DeviceEntry, DeviceGraph, Holder};
    use crate::kube::ClusterView;
    use crate::model::{BlockDevice, DeviceKind, DeviceName, HolderKind, LoopInfo, MountNsId};
    use crate::plan::Action;

    /// A loop device held by two mounts in other namespaces: its release is two independent
    /// steps, its clean two releases and an unbind that depends on both.
    fn entry(seq: u64) -> DeviceEntry {
        let mount = |id: u32| {
            let mut h = Holder::bare(HolderKind::Mount);
            h.pids = vec![100 + id];
            h.mount_namespace = Some(MountNsId(4026532000 + u64::from(id)));
            h.in_host_namespace = Some(false);
            h.mount_id = Some(id);
            h.mount_dev = Some(DevNum::new(7, 3));
            h.mount_point = Some("/mnt/x".into());
            h.namespace_entry = Some(NsEntry::Task { pid: 100 + id, tid: 100 + id });
            h
        };
        DeviceEntry::new(
            BlockDevice {
                name: DeviceName::new("loop3").expect("name"),
                devnum: DevNum::new(7, 3),
                kind: DeviceKind::Loop,
                size_bytes: 1 << 20,
                read_only: false,
                parent: None,
                holders: Vec::new(),
                slaves: Vec::new(),
                loop_info: Some(LoopInfo {
                    backing_file: "/img".into(),
                    backing_deleted: false,
                    offset: 0,
                    sizelimit: 0,
                    autoclear: false,
                    read_only: false,
                    backing_dev: Some(DevNum::new(254, 0)),
                    backing_inode: Some(seq),
                    backing_rdev: None,
                    status_blocked: None,
                }),
                dm: None,
                diskseq: Some(seq),
            },
            vec![mount(1), mount(2)],
        )
    }

    /// A machine of one loop device; what the kernel runs is recorded.
    #[derive(Default)]
    struct Test {
        actuator: RecordingActuator,
        seq: Cell<u64>,
        act_refused: Option<String>,
        /// Fresh scans show the two mounts (else the device is unheld).
        held: bool,
        /// A live agent process (the writer of an intent still in flight).
        live_agent: Option<u32>,
        /// Fresh scans show one I/O in flight that never completes.
        stuck_io: bool,
        /// Fresh scans no longer have loop3 (7:3); `Some(n)`: its backing is bound to loop n now.
        vanished: Option<Option<u32>>,
    }

    impl World for &Test {
        fn scan(&self, target: Target) -> Result<Scan, EngineError> {
            let mut e = entry(self.seq.get().max(1));
            if let Some(moved) = self.vanished {
                if let Target::Device(_) = target {
                    return Err(EngineError::NotFound("no 7:3".into()));
                }
                let devices = match moved {
                    Some(n) => {
                        e.device.devnum = DevNum::new(7, n);
                        e.device.name = DeviceName::new(&format!("loop{n}")).expect("name");
                        e.holders.clear();
                        vec![e]
                    }
                    None => Vec::new(),
                };
                return Ok(Scan::complete(
                    DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices },
                    BootTime::from_since_boot(Duration::from_secs(100)),
                ));
            }
            if !self.held {
                e.holders.clear();
            }
            if self.stuck_io {
                e.io = Some(crate::discover::iostat::IoStat { completed: 5, in_flight: 1 });
            }
            Ok(Scan::complete(
                DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![e] },
                BootTime::from_since_boot(Duration::from_secs(100)),
            ))
        }
        fn kernel_word(&self, _device: &DeviceName, _devnum: DevNum) -> KernelWord {
            KernelWord::unclaimed()
        }
        fn cluster(&self) -> Option<ClusterView> {
            None
        }
        fn can_act(&self) -> Result<(), String> {
            self.act_refused.clone().map_or(Ok(()), Err)
        }
        fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
            self.actuator.run(step)
        }
        fn now(&self) -> BootTime {
            BootTime::from_since_boot(Duration::from_secs(100))
        }
        fn agent_alive(&self, pid: u32) -> bool {
            self.live_agent == Some(pid)
        }
    }

    fn plan_of(op: &'static str, steps: Vec<Action>) -> Plan {
        let e = entry(1);
        let mut p = Plan::new(op, &e);
        p.steps = steps
            .into_iter()
            .map(|action| Step {
                device: e.device.name.clone(),
                devnum: e.device.devnum,
                identity: Identity::of(&e),
                action,
            })
            .collect();
        p
    }

    fn release(id: u32) -> Action {
        Action::DetachMount {
            namespace: MountNsId(4026532000 + u64::from(id)),
            via: NsEntry::Task { pid: 100 + id, tid: 100 + id },
            mount_id: id,
            mount_dev: DevNum::new(7, 3),
            mount_point: "/mnt/x".into(),
            fstype: "ext4".into(),
        }
    }

    fn unbind() -> Action {
        Action::DetachLoop {
            backing_file: "/img".into(),
            backing_dev: Some(DevNum::new(254, 0)),
            backing_inode: Some(1),
        }
    }

    fn journal(dir: &tempfile::TempDir) -> Journal {
        Journal::open(&dir.path().join("j.jsonl")).expect("journal")
    }

    #[test]
    fn independent_releases_run_past_a_failure_and_the_unbind_after_them_is_skipped() {
        let t = Test { seq: Cell::new(1), ..Test::default() };
        t.actuator.script.borrow_mut().push_back(Err(ActError::Syscall {
            device: DeviceName::new("loop3").expect("n"),
            op: "umount2",
            source: std::io::Error::other("boom"),
        }));
        let engine = Engine::new(&t, Settings::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let reports = engine
            .execute(&plan_of("clean", vec![release(1), release(2), unbind()]), &mut journal(&dir))
            .expect("may act");
        let words: Vec<&str> = reports.iter().map(|r| r.word().0).collect();
        assert_eq!(words, ["failed", "done", "skipped"], "a release does not depend on another");
        assert_eq!(t.actuator.calls.borrow().len(), 2, "the unbind never reached the kernel");
        let text = std::fs::read_to_string(dir.path().join("j.jsonl")).expect("journal");
        assert_eq!(text.lines().count(), 4, "an intent and a result for each step that ran:\n{text}");
        assert!(crate::act::journal::pending(&dir.path().join("j.jsonl")).expect("pending").is_empty());
    }

    #[test]
    fn a_step_on_a_device_that_changed_identity_never_reaches_the_kernel() {
        let t = Test { seq: Cell::new(2), ..Test::default() }; // planned for seq 1
        let engine = Engine::new(&t, Settings::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let reports = engine.execute(&plan_of("clean", vec![unbind()]), &mut journal(&dir)).expect("may act");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("changed identity")),
            "{:?}",
            reports[0].result
        );
        assert!(t.actuator.calls.borrow().is_empty());
    }

    #[test]
    fn a_holder_that_appeared_since_the_plan_vetoes_the_step() {
        let t = Test { seq: Cell::new(1), held: true, ..Test::default() };
        let engine = Engine::new(&t, Settings::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let reports = engine.execute(&plan_of("clean", vec![unbind()]), &mut journal(&dir)).expect("may act");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("does not account for")),
            "{:?}",
            reports[0].result
        );
        assert!(t.actuator.calls.borrow().is_empty());
    }

    /// A device whose I/O does not complete gets no destructive plan, and a step planned
    /// before it stopped answering is vetoed right before it runs.
    #[test]
    fn nothing_destructive_is_planned_or_run_on_an_unresponsive_device() {
        let t = Test { seq: Cell::new(1), held: true, stuck_io: true, ..Test::default() };
        let settings = Settings { unresponsive_after: Duration::ZERO, ..Settings::default() };
        let engine = Engine::new(&t, settings);
        let mut clocks = Clocks::new(None);
        let (judged, plan) =
            engine.plan_fresh(DevNum::new(7, 3), Operation::Release, &mut clocks).expect("planned");
        let stall = judged.stalled.get(&DevNum::new(7, 3)).expect("unresponsive");
        assert_eq!(stall.in_flight, 1);
        assert!(plan.steps.is_empty(), "a refused plan has no steps: {plan:?}");
        let refusal = plan.refusal.as_deref().unwrap_or_default();
        assert!(refusal.contains("loop3 is unresponsive: 1 I/O(s) in flight"), "{refusal}");
        let j = judged.verdict(DevNum::new(7, 3)).expect("judged");
        assert!(j.reasons[0].starts_with("unresponsive: 1 I/O(s) in flight"), "{j:?}");

        let dir = tempfile::tempdir().expect("tempdir");
        let reports = engine.execute(&plan_of("clean", vec![unbind()]), &mut journal(&dir)).expect("may act");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("unresponsive")),
            "{:?}",
            reports[0].result
        );
        assert!(t.actuator.calls.borrow().is_empty());

        // The same device answering: the unbind reaches the kernel.
        let t = Test { seq: Cell::new(1), ..Test::default() };
        let engine = Engine::new(&t, Settings { unresponsive_after: Duration::ZERO, ..Settings::default() });
        let reports = engine.execute(&plan_of("clean", vec![unbind()]), &mut journal(&dir)).expect("may act");
        assert!(reports[0].result.is_ok(), "{:?}", reports[0].result);
        assert_eq!(t.actuator.calls.borrow().len(), 1);
    }

    #[test]
    fn no_journal_no_action() {
        let t = Test { seq: Cell::new(1), ..Test::default() };
        let engine = Engine::new(&t, Settings::default());
        // /dev/full opens but every write fails with ENOSPC.
        let mut j = Journal::open(std::path::Path::new("/dev/full")).expect("/dev/full opens on Linux");
        let reports = engine.execute(&plan_of("release", vec![release(1)]), &mut j).expect("may act");
        assert!(t.actuator.calls.borrow().is_empty(), "nothing acts without its intent on record");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("cannot write the journal"))
        );
    }

    #[test]
    fn an_agent_that_may_not_act_acts_on_nothing() {
        let t = Test {
            seq: Cell::new(1),
            act_refused: Some("hostPID: true is needed".into()),
            ..Test::default()
        };
        let engine = Engine::new(&t, Settings::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let e =
            engine.execute(&plan_of("release", vec![release(1)]), &mut journal(&dir)).expect_err("refused");
        assert!(e.to_string().contains("hostPID: true"), "{e}");
        assert!(t.actuator.calls.borrow().is_empty());
        assert!(
            !dir.path().join("j.jsonl").exists()
                || std::fs::read_to_string(dir.path().join("j.jsonl")).is_ok_and(|t| t.is_empty())
        );
    }

    #[test]
    fn recovery_closes_a_dead_writers_open_step_and_leaves_a_live_writers_open() {
        let t = Test { seq: Cell::new(2), live_agent: Some(77), ..Test::default() };
        let engine = Engine::new(&t, Settings::default());
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        // This process's own earlier incarnation (same pid, so not alive elsewhere), planned for
        // loop3's disk sequence 1; loop3 is at sequence 2 now.
        let dead = j.begin(&plan_of("clean", vec![unbind()]).steps[0]).expect("intent");
        // A concurrent run, pid 77, still at work.
        let text = std::fs::read_to_string(j.path()).expect("read");
        let live = text.lines().next().expect("the intent").replace(&dead, "1-77-0");
        let mut f = std::fs::OpenOptions::new().append(true).open(j.path()).expect("append");
        std::io::Write::write_all(&mut f, format!("{live}\n").as_bytes()).expect("write");
        let r = engine.recover(&mut j).expect("recover");
        assert_eq!(r.resolved.len(), 1, "{r:?}");
        assert_eq!(r.resolved[0].0.id, dead);
        assert_eq!(r.resolved[0].1.word, "identity_changed", "{:?}", r.resolved[0].1);
        assert_eq!(r.left_open.len(), 1, "{r:?}");
        assert_eq!(r.left_open[0].0, "1-77-0");
        assert!(r.left_open[0].1.contains("still running"), "{r:?}");
        let open = crate::act::journal::pending(j.path()).expect("pending");
        assert_eq!(open.len(), 1, "only the live writer's step stays open: {open:?}");
        assert_eq!(open[0]["id"], "1-77-0");
        assert!(t.actuator.calls.borrow().is_empty(), "recovery changes nothing on the host");
        // An agent that may not act cannot tell a live writer from a dead one: it closes nothing.
        let blind = Test {
            seq: Cell::new(2),
            act_refused: Some("hostPID: true is needed".into()),
            ..Test::default()
        };
        let r = Engine::new(&blind, Settings::default()).recover(&mut j).expect("recover");
        assert!(r.resolved.is_empty() && r.left_open.len() == 1, "{r:?}");
        assert!(r.left_open[0].1.contains("hostPID"), "{r:?}");
        // Run again: nothing new is written for the step already closed.
        let before = std::fs::read_to_string(j.path()).expect("read").lines().count();
        let again = engine.recover(&mut j).expect("recover again");
        assert!(again.resolved.is_empty(), "{again:?}");
        assert_eq!(std::fs::read_to_string(j.path()).expect("read").lines().count(), before);
    }
    /// A step whose device a fresh scan no longer has never reaches the actuator: already absent
    /// when nothing on the host is its object any more, refused when the object is elsewhere.
    #[test]
    fn a_vanished_device_is_absent_only_when_its_object_is_gone_and_never_run_blind() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut unbind_planned = plan_of("clean", vec![unbind()]);
        if let Action::DetachLoop { backing_inode, .. } = &mut unbind_planned.steps[0].action {
            *backing_inode = Some(1); // the binding the actuator checks
        }
        let gone = Test { seq: Cell::new(1), vanished: Some(None), ..Test::default() };
        let reports = Engine::new(&gone, Settings::default())
            .execute(&unbind_planned, &mut journal(&dir))
            .expect("acts");
        assert!(matches!(reports[0].result, Ok(StepOutcome::AlreadyAbsent)), "{:?}", reports[0].result);
        assert!(gone.actuator.calls.borrow().is_empty(), "nothing handed to the actuator");
        let moved = Test { seq: Cell::new(1), vanished: Some(Some(9)), ..Test::default() };
        let reports = Engine::new(&moved, Settings::default())
            .execute(&unbind_planned, &mut journal(&dir))
            .expect("acts");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("is now loop9")),
            "{:?}",
            reports[0].result
        );
        assert!(moved.actuator.calls.borrow().is_empty());
    }

    /// The one workflow: a dry run writes nothing; an applied request journals its plan whole
    /// before the first intent and closes it; a plan killed midway is resumed by the same request
    /// (its finished steps not repeated), and an expected identity that is not the device's is
    /// refused before anything runs.
    #[test]
    fn the_workflow_journals_the_plan_whole_and_resumes_an_unfinished_one() {
        use super::workflow::{Class, Request, Subject};
        let t = Test { seq: Cell::new(1), held: true, ..Test::default() };
        let engine = Engine::new(&t, Settings { grace: Duration::ZERO, ..Settings::default() });
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("j.jsonl");
        let clocks = Mutex::new(Clocks::new(None));
        let req = |apply: bool, expected: Option<String>| Request {
            op: Operation::Release,
            subject: Subject::Device(DevNum::new(7, 3)),
            argument: "/dev/loop3".into(),
            expected_identity: expected,
            apply,
            by: "test".into(),
            journal: &path,
            lock_wait: Duration::ZERO,
            clocks: &clocks,
            admit: None,
        };
        let dry = engine.carry_out(&req(false, None)).expect("dry run");
        assert_eq!(dry.plan.as_ref().map(|p| p.steps.len()), Some(2), "{:?}", dry.plan);
        assert!(!dry.applied && !path.exists(), "a dry run writes nothing");
        assert_eq!(dry.class(), Class::Done);

        let wrong = engine.carry_out(&req(true, Some("loop3@7:3#99;x".into()))).expect("refused");
        assert_eq!(wrong.class(), Class::Refused, "{:?}", wrong.refusal);
        assert!(t.actuator.calls.borrow().is_empty());

        // A run that died after its plan and the first release: the plan record and one
        // finished step are on disk, the second release is owed.
        let mut j = Journal::open(&path).expect("journal");
        let planned = dry.plan.as_ref().expect("plan");
        let body = serde_json::json!({
            "request": { "argument": "/dev/loop3", "operation": "release" },
            "device": "loop3",
            "identity_parts": &planned.identity,
            "devices": [{ "name": "loop3", "devnum": planned.devnum }],
            "steps": planned.steps.iter().map(|s| serde_json::json!({ "step": s, "identity_parts": &s.identity })).collect::<Vec<_>>(),
        });
        let id = j.plan(&body).expect("plan");
        let first = j.begin_at(&planned.steps[0], Some(0)).expect("intent");
        j.finish(&first, "done", "").expect("result");
        drop(j);
        let text = std::fs::read_to_string(&path).expect("read");
        // Another process wrote it (this test's pid would be this run's own).
        std::fs::write(&path, text.replace(&format!("-{}-", std::process::id()), "-1-")).expect("write");
        let id = id.replace(&format!("-{}-", std::process::id()), "-1-");
        let t2 = Test { seq: Cell::new(1), held: false, ..Test::default() };
        let engine = Engine::new(&t2, Settings { grace: Duration::ZERO, ..Settings::default() });
        let out = engine.carry_out(&req(true, None)).expect("resumed");
        assert_eq!(out.resumed.len(), 1, "{out:?}");
        assert_eq!(out.resumed[0].plan_id, id);
        assert_eq!(out.resumed[0].already_done, 1);
        assert_eq!(out.resumed[0].reports.len(), 1, "only the owed step ran again");
        assert_eq!(t2.actuator.calls.borrow().len(), 1, "{:?}", t2.actuator.calls.borrow());
        assert!(crate::act::journal::open_plans(&path).expect("plans").is_empty(), "closed");
        assert!(crate::act::journal::pending(&path).expect("pending").is_empty());
        assert!(
            out.resumed[0].describe().contains("1 of 2 step(s) had finished"),
            "{}",
            out.resumed[0].describe()
        );
    }
}
