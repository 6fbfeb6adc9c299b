//! Executing a plan: every step journaled, re-checked against a fresh scan and the kernel's word
//! right before it runs, and skipped when a step it depends on did not finish.

use super::error::EngineError;
use super::recheck;
use super::{first_unblocks, Engine, Judged};
use crate::act::journal::Journal;
use crate::act::{ActError, StepOutcome, StepReport};
use crate::engine::world::World;
use crate::graph::identity::Identity;
use crate::graph::scan::{Scan, Target};
use crate::judge::gates;
use crate::model::DevNum;
use crate::plan::{Plan, Step};

impl<W: World> Engine<W> {
    /// Runs a plan's steps in order. Refuses outright when this agent may not act on the host.
    /// Every step is journaled before and after (no journal, no action) and audited; before
    /// each step that is not a mount release, a fresh scan of its device and the kernel's word
    /// must agree with the plan ([`recheck`]); a step whose prerequisite did not finish is not
    /// run. Failures are collected, not short-circuited across independent steps.
    pub fn execute(&self, plan: &Plan, journal: &mut Journal) -> Result<Vec<StepReport>, EngineError> {
        self.execute_indexed(plan, journal, None, "")
    }

    /// [`Engine::execute`] of the steps of `plan` at `only` (all when `None`): the rest of a
    /// resumed plan, whose other steps finished before the interruption. `by` (the request's
    /// person or caller) is named in every step's audit line.
    pub(super) fn execute_indexed(
        &self,
        plan: &Plan,
        journal: &mut Journal,
        only: Option<&[usize]>,
        by: &str,
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
            tracing::info!(target: "audit", phase = "intent", action = step.action(), device = %step.device, identity = %step.identity.token(), step = %step.describe(), journal_id = %id, by = %by);
            let result = match self.recheck(plan, step, only.is_some()) {
                Some(StopReason::Refuse(reason)) => {
                    Err(ActError::Precondition { device: step.device.clone(), reason })
                }
                Some(StopReason::IdentityChanged(reason)) => {
                    Err(ActError::IdentityChanged { device: step.device.clone(), reason })
                }
                Some(StopReason::Absent(why)) => {
                    tracing::info!(device = %step.device, "{why}");
                    Ok(StepOutcome::AlreadyAbsent)
                }
                None => self.world.run(step),
            };
            let (word, detail) = crate::act::outcome_word(&result);
            if let Err(e) = journal.finish(&id, word, &detail) {
                tracing::error!(device = %step.device, journal_id = %id, "cannot record the step's result in the journal: {e}");
            }
            tracing::info!(target: "audit", phase = "result", action = step.action(), device = %step.device, result = word.as_str(), detail = %detail, journal_id = %id, by = %by);
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
    /// `resumed`: the plan is finished after an interruption, so the world may have moved on
    /// since its subject was removed ([`Engine::recheck_subject_volume`]).
    pub(super) fn recheck(&self, plan: &Plan, step: &Step, resumed: bool) -> Option<StopReason> {
        if step.is_release() {
            // A fresh scan of the device ([`recheck::release_refusal`]); the actuator then
            // re-reads the namespace and the mount (ID, device, nothing beneath) itself.
            let fresh = match self.world.scan(Target::Device(step.devnum)) {
                Ok(s) => s,
                Err(e) => {
                    return Some(StopReason::Refuse(format!("cannot re-check it with a fresh scan: {e}")))
                }
            };
            if let Some(why) =
                fresh.entry(step.devnum).and_then(|e| gates::identity(&step.identity, &Identity::of(e)))
            {
                return Some(StopReason::IdentityChanged(why));
            }
            let stalled = self.observe_io(&fresh, self.world.now());
            return fresh
                .entry(step.devnum)
                .and_then(|e| gates::responsive(e, stalled.get(&step.devnum), first_unblocks(&plan.steps)))
                .or_else(|| {
                    let api = self.world.cluster();
                    recheck::release_refusal(plan, step, &fresh, api.as_ref(), self.world.now())
                })
                .or_else(|| self.propagation_recheck(plan, step, &fresh))
                .map(StopReason::Refuse);
        }
        if matches!(step.action, crate::plan::Action::IscsiLogout { .. }) {
            // Its disk was deleted by the steps before it (which it depends on): the actuator
            // re-reads the session itself (same target and portal, no SCSI device left on it).
            return None;
        }
        let fresh = match self.scan_for_step(step) {
            Ok(s) => s,
            Err(EngineError::NotFound(_)) => return Some(self.vanished(step)),
            Err(e) => return Some(StopReason::Refuse(format!("cannot re-check it with a fresh scan: {e}"))),
        };
        let Some(entry) = fresh.entry(step.devnum) else { return Some(self.vanished(step)) };
        if let Some(why) = gates::identity(&step.identity, &Identity::of(entry)) {
            return Some(StopReason::IdentityChanged(why));
        }
        let stalled = self.observe_io(&fresh, self.world.now());
        if let Some(r) = gates::responsive(entry, stalled.get(&step.devnum), first_unblocks(&plan.steps)) {
            return Some(StopReason::Refuse(r));
        }
        let word = self.world.kernel_word(&step.device, step.devnum);
        let api = self.world.cluster();
        recheck::refusal(plan, step, &fresh, entry, &word, api.as_ref(), self.world.now())
            .or_else(|| {
                // The stuck readers' fds are told apart into open files after the count was read.
                let files = recheck::is_dm_step(step).then(|| self.open_files(plan, entry))?;
                recheck::openers(plan, step, entry, &word, files)
            })
            .or_else(|| self.recheck_side_effects(plan, step, &fresh, api.as_ref()))
            .or_else(|| if resumed { self.recheck_subject_volume(plan, step, api.as_ref()) } else { None })
            .map(StopReason::Refuse)
    }

    /// A step of a resumed plan on another device than the plan's subject, once the subject is
    /// gone: no volume in use on this node per the API may be without a device that serves it
    /// ([`gates::unplaced_volume`]), judged from a scan of the whole host. Only on resume: within
    /// one run the API's word on the subject was read moments before, with the subject there to
    /// name its volume; after an interruption the API may speak of it only now (or only now be
    /// configured). A volume with no block device at all (NFS, say) also counts as unplaced:
    /// the refusal says how to finish the rest on its own.
    fn recheck_subject_volume(
        &self,
        plan: &Plan,
        step: &Step,
        api: Option<&crate::kube::ClusterView>,
    ) -> Option<String> {
        if step.devnum == plan.devnum {
            return None;
        }
        let view = api?;
        let in_use = view.pvs_in_use();
        if in_use.is_empty() {
            return None;
        }
        let all = match self.world.scan(Target::All) {
            Ok(s) => s,
            Err(e) => {
                return Some(format!(
                    "the API says volumes are in use on this node, and the host cannot be read to tell whether {}, the plan's subject, is still there to serve them: {e}",
                    plan.device
                ))
            }
        };
        if all.entry(plan.devnum).is_some_and(|e| Identity::of(e) == plan.identity) {
            return None;
        }
        let placed =
            all.graph.devices.iter().flat_map(|e| crate::graph::volume_objects::pv_names(e, view)).collect();
        gates::unplaced_volume(&plan.device, &in_use, &placed)
    }

    /// How many open files the fds of `entry`'s readers that `plan` expects to let go are now
    /// ([`recheck::expected_fds`], [`World::open_files`]): asked right after the kernel's word.
    pub(super) fn open_files(&self, plan: &Plan, entry: &crate::graph::DeviceEntry) -> Result<usize, String> {
        recheck::expected_fds(plan, entry).and_then(|fds| self.world.open_files(entry.device.devnum, &fds))
    }

    /// The step's device number is gone from a fresh scan: looks for the step's kernel object
    /// (the map's uuid, the disk's wwid and address, the rbd id, the loop binding, the NVMe
    /// controller) anywhere on the host. Absent only when nothing is it any more, as the
    /// actuator's own identity check would find; otherwise, or when the host cannot be read,
    /// refused with why.
    pub(super) fn vanished(&self, step: &Step) -> StopReason {
        let all = match self.world.scan(Target::All) {
            Ok(s) => s,
            Err(e) => {
                return StopReason::Refuse(format!(
                    "{} ({}) is no longer in a fresh scan, and the host cannot be read to tell whether it is gone: {e}",
                    step.device, step.devnum
                ))
            }
        };
        match all.graph.devices.iter().find(|e| is_the_object_of(step, e)) {
            Some(e) => StopReason::Refuse(format!(
                "{} ({}) is no longer in a fresh scan, but the object {} acts on is now {} ({}): not the device it was planned for",
                step.device,
                step.devnum,
                step.action(),
                e.device.name,
                e.device.devnum
            )),
            None if matches!(step.action, crate::plan::Action::NvmeDeleteController { .. }) => {
                StopReason::Refuse(format!(
                    "{} ({}) is no longer in a fresh scan; its controller may remain without a namespace, which a scan does not show: check it with `nvme list-subsys`",
                    step.device, step.devnum
                ))
            }
            None => StopReason::Absent(format!(
                "{} ({}) is gone and nothing on the host is the object {} acts on any more: already absent",
                step.device,
                step.devnum,
                step.action()
            )),
        }
    }

    /// The re-check of what `step` removes besides its own device, in the fresh scan: each such
    /// device still there must be unheld, pass the gates and have the kernel's word agree.
    pub(super) fn recheck_side_effects(
        &self,
        plan: &Plan,
        step: &Step,
        fresh: &Scan,
        api: Option<&crate::kube::ClusterView>,
    ) -> Option<String> {
        crate::plan::scope::side_effects(plan, &fresh.graph).into_iter().filter(|(_, s)| *s == step).find_map(
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
pub(super) enum StopReason {
    /// A gate says no: the step is refused with why.
    Refuse(String),
    /// The device at the step's number is another one now (the identity gate): refused, and
    /// told apart from other refusals by its kind.
    IdentityChanged(String),
    /// What the step would remove is gone already: reported already absent, nothing run.
    Absent(String),
}

/// Whether `e` is the kernel object `step` acts on (the key its actuator checks), whatever its
/// device number now.
pub(super) fn is_the_object_of(step: &Step, e: &crate::graph::DeviceEntry) -> bool {
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

/// Whether `later` may only run once `earlier` finished: a mount release depends only on the
/// steps before it that are not releases (stopping a dead map's queueing first); every other
/// step depends on all the steps before it.
pub(super) fn depends_on(later: &Step, earlier: &Step) -> bool {
    !later.is_release() || !earlier.is_release()
}
