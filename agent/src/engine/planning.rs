//! Planning with the engine: the scan a plan rests on (widened to everything its steps remove),
//! the plan itself and the gates it passes before it is handed out.

use super::error::EngineError;
use super::recheck;
use super::{first_unblocks, Engine, Judged, Operation};
use crate::engine::world::World;
use crate::graph::scan::{Scan, Target};
use crate::judge::gates;
use crate::judge::grace::Clocks;
use crate::judge::{Judgement, Verdict};
use crate::model::DevNum;
use crate::plan::{self, Plan, Step};

impl<W: World> Engine<W> {
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
    /// plan's steps would remove ([`crate::plan::scope::plan_scope`]: an NVMe controller's other
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

    /// A fresh scan of `devnum` that covers everything `step` removes ([`crate::plan::scope::removed_by`]).
    pub(super) fn scan_for_step(&self, step: &Step) -> Result<Scan, EngineError> {
        let mut fresh = self.world.scan(Target::Device(step.devnum))?;
        for _ in 0..MAX_WIDENINGS {
            let want = crate::plan::scope::removed_by(step, &fresh.graph);
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
                // detaches a mount in use unless the operator forces it (plan::release::release_with).
                let mut p = plan::release::release_with(entry, &self.settings.release);
                let why = crate::judge::nvme::release_refusal(entry)
                    .or_else(|| gates::completeness(entry, &scan.blind_spots));
                if let Some(why) = why {
                    p.refuse(why);
                }
                if let (Some(reason), None) = (&p.force_busy, &p.refusal) {
                    tracing::warn!(target: "audit", phase = "override", gate = "mount_users", device = %p.device, identity = %p.identity.token(), reason = %reason, users = %p.notes.join("; "), "release forced with --force-busy: process users of its mounts do not stop it");
                }
                p
            }
            Operation::Clean => plan::clean::for_clean(entry, &scan.graph, self.settings.clean),
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
            .or_else(|| gates::responsive(entry, judged.stalled.get(&devnum), first_unblocks(&p.steps)));
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
                .or_else(|| self.openers_refusal(&p, scan))
                .or_else(|| self.unmap_refusal(&p));
            if let Some(r) = r {
                p.refuse(r);
            }
        }
        if p.refusal.is_none() {
            // Last (it reads mount tables): what a mount release takes with it through
            // propagation (the host's own mount at the same place, another device's) must itself
            // be releasable.
            if let Some(r) = self.propagation_refusal(&p, scan) {
                p.refuse(r);
            }
        }
        Ok(p)
    }

    /// What the plan of `op` for `devnum` would remove by its kind, before the gates (a gate
    /// that refuses it may be refusing for want of the wider scan). A release removes no device.
    pub(super) fn draft_scope(&self, scan: &Scan, devnum: DevNum, op: Operation) -> Vec<DevNum> {
        match (scan.entry(devnum), op) {
            (Some(entry), Operation::Clean) => {
                let draft = plan::clean::for_clean(entry, &scan.graph, self.settings.clean);
                crate::plan::scope::plan_scope(&draft, &scan.graph)
            }
            _ => vec![devnum],
        }
    }

    /// Why the plan must not run because of a device a step removes besides its own (an NVMe
    /// controller's other namespaces, a disk's partitions, a session's other disks): not looked
    /// at by the scan, held, protected, used by a pod, or hidden by a blind spot.
    pub(super) fn side_effects_refusal(&self, p: &Plan, scan: &Scan) -> Option<String> {
        let api = self.world.cluster();
        crate::plan::scope::side_effects(p, &scan.graph).into_iter().find_map(|(d, step)| {
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

    /// Why the plan must not run because the kernel's open count of a dm device it acts on is
    /// not the openers the plan accounts for ([`gates::openers`]: mounts it releases, layers it
    /// removes, the open files of the stuck readers it frees, told apart by the kernel right
    /// after the count), asked once per dm device at planning time (the re-check asks again
    /// right before each dm step).
    pub(super) fn openers_refusal(&self, p: &Plan, scan: &Scan) -> Option<String> {
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
            let files = self.open_files(p, entry);
            if let Some(r) = recheck::planned_openers_refusal(p, entry, &word, files) {
                return Some(r);
            }
        }
        None
    }
}

impl<W: World> Engine<W> {
    /// Why the plan must not run because the kernel's word says a loop, nbd or rbd device it
    /// unbinds is in use (an exclusive claim, sysfs `holders/`, a live filesystem, a loop device
    /// on its node) beyond the filesystem whose mounts the plan releases first: asked at
    /// planning time too, so that a dry run says so (the re-check asks again right before the
    /// step). The kernel gives these devices no open count: an opener no scan sees shows only
    /// when the kernel defers the step (a loop device's autoclear), which is reported as such.
    pub(super) fn unmap_refusal(&self, p: &Plan) -> Option<String> {
        use crate::plan::Action;
        // Where nothing can be carried out (a fixture tree, a PID namespace of its own), the plan
        // is a dry run that can never run, and the kernel cannot be asked about the host's
        // devices: its word is asked again right before every step of a plan that does run.
        if self.world.can_act().is_err() {
            return None;
        }
        p.steps
            .iter()
            .filter(|s| {
                matches!(
                    s.action,
                    Action::DetachLoop { .. } | Action::NbdDisconnect { .. } | Action::RbdUnmap { .. }
                )
            })
            .find_map(|step| {
                let released = p.steps.iter().any(|s| s.is_release() && s.devnum == step.devnum);
                let accounted =
                    gates::Accounted { filesystem_released: released, ..gates::Accounted::default() };
                let word = self.world.kernel_word(&step.device, step.devnum);
                gates::kernel_word(&step.device, &word, &accounted)
            })
    }
}

/// How many times a scan is widened to what a plan removes before what is still outside it is
/// refused (each widening adds what the wider scan showed; two suffice on any real host).
pub(super) const MAX_WIDENINGS: usize = 3;

/// Removes later duplicates, keeping the first (the device asked about) first.
pub(super) fn dedup_keep_first(v: &mut Vec<DevNum>) {
    let mut seen = std::collections::HashSet::new();
    v.retain(|d| seen.insert(*d));
}

/// A cleanup needs a `stale` verdict: observed unheld for the whole grace period.
pub(super) fn not_stale(p: &Plan, judgement: Option<&Judgement>) -> Option<String> {
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
