//! The request workflow for an orphaned pod volume directory (`clean pod-volume:...`, the
//! daemon's clean mode): the same promises as a device's ([`super::workflow`]), for a subject
//! that is a directory rather than a device.
//!
//! For a request that acts (`apply`), in this order: sight and may-act; the journal's lock;
//! recovery of the intents a run that died left open (an interrupted `rmdir` among them); fresh
//! evidence for the directory ([`Engine::pod_volume_evidence`]), judged with the caller's grace
//! clocks and planned ([`crate::plan::pod_volume`]); the caller's may-act (the daemon's budget);
//! then each `rmdir`, deepest first, journaled before and after and audited, right after a
//! re-check from fresh evidence: the pod still gone per the API and the node, nothing mounted at
//! or below it in any namespace (every table read again), still empty, still the planned
//! directory (device and inode). A step runs only once the one before it finished. A dry run is
//! the same minus the lock, the journal and the steps.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::execute::StopReason;
use super::outcome::OutcomeClass;
use super::recover::Recovery;
use super::{Engine, EngineError, World};
use crate::act::journal::{self, Journal, JournaledStep};
use crate::act::pod_volume::{outcome_word, DirActError};
use crate::act::StepOutcome;
use crate::discover::kubelet::pod_dirs::Content;
use crate::judge::gates;
use crate::judge::grace::Clocks;
use crate::judge::orphans::{self, DirEvidence, DirVerdict};
use crate::plan::pod_volume::{self, DirPlan, DirStep};

/// A request about one pod volume directory.
pub struct DirRequest<'a> {
    /// What the caller named: `pod-volume:<uid>/...`, or the directory's host path.
    pub argument: String,
    /// Carry the plan out; false is a dry run through the same workflow.
    pub apply: bool,
    /// Who asks, for the journal and the audit log.
    pub by: String,
    pub journal: &'a Path,
    pub lock_wait: Duration,
    pub clocks: &'a Mutex<Clocks>,
    /// The caller's own may-act on the plan (the daemon's step budget): why not.
    pub admit: Option<AdmitDir<'a>>,
}

/// A caller's own may-act on a directory's plan, right before its first step: why not.
pub type AdmitDir<'a> = &'a dyn Fn(&DirPlan) -> Result<(), String>;

/// One `rmdir`'s result.
#[derive(Debug)]
pub struct DirStepReport {
    pub step: DirStep,
    pub result: Result<StepOutcome, DirActError>,
}

impl DirStepReport {
    pub fn word(&self) -> (&'static str, String) {
        let (result, detail) = outcome_word(&self.result);
        (result.as_str(), detail)
    }

    /// How the step ended, as its journal `result` record says it.
    pub fn result_word(&self) -> crate::act::journal::StepResult {
        outcome_word(&self.result).0
    }
}

/// What a request came to.
#[derive(Debug, Default)]
pub struct DirOutcome {
    /// A refusal before any step (sight, may-act, the journal's lock, the budget).
    pub refusal: Option<(OutcomeClass, String)>,
    pub recovery: Recovery,
    pub evidence: Option<DirEvidence>,
    pub plan: Option<DirPlan>,
    pub reports: Vec<DirStepReport>,
    pub applied: bool,
    /// The directory is gone: an interrupted run of this request removed it.
    pub gone: Option<String>,
}

impl DirOutcome {
    /// What it came to, in a script's words: done, held (kept, mounted, in use), unknown,
    /// refused (not removable yet, a re-check), error (a failed step).
    pub fn class(&self) -> OutcomeClass {
        if let Some((c, _)) = &self.refusal {
            return *c;
        }
        if self.reports.iter().any(|r| {
            matches!(r.result, Err(DirActError::Precondition { .. } | DirActError::IdentityChanged { .. }))
        }) {
            return OutcomeClass::Refused;
        }
        if self.reports.iter().any(|r| r.result.is_err()) {
            return OutcomeClass::Error;
        }
        match self.plan.as_ref().map(|p| p.verdict) {
            None | Some(DirVerdict::Removable) => OutcomeClass::Done,
            Some(DirVerdict::InUse | DirVerdict::Mounted | DirVerdict::Kept) => OutcomeClass::Held,
            Some(DirVerdict::Unknown) => OutcomeClass::Unknown,
            Some(DirVerdict::Pending) => OutcomeClass::Refused,
        }
    }
}

impl<W: World> Engine<W> {
    /// Carries `req` out (see the module docs). `Err` when the journal cannot be opened, or no
    /// pod volume directory is at the place named.
    pub fn carry_out_dir(&self, req: &DirRequest<'_>) -> Result<DirOutcome, EngineError> {
        let mut out = DirOutcome::default();
        let jerr = |source| EngineError::Journal { path: req.journal.to_owned(), source };
        let mut journal = None;
        if req.apply {
            if let Err(why) = self.world.can_act().and_then(|()| self.world.sight()) {
                out.refusal = Some((OutcomeClass::Refused, format!("--apply refused: {why}")));
                return Ok(out);
            }
            let lock = match journal::lock(req.journal, req.lock_wait) {
                Ok(l) => l,
                Err(e) if journal::is_busy(&e) => {
                    out.refusal = Some((OutcomeClass::Refused, format!("--apply refused: {e}")));
                    return Ok(out);
                }
                Err(e) => return Err(jerr(e)),
            };
            let mut j = Journal::open(req.journal).map_err(jerr)?;
            out.recovery = self.recover(&mut j).map_err(jerr)?;
            journal = Some((lock, j));
        }
        let target = pod_volume::parse_argument(&req.argument, Path::new("/"));
        let named = |e: &crate::discover::kubelet::pod_dirs::PodVolumeEntry| {
            Some(&e.rel) == target.as_ref() || e.path == Path::new(&req.argument)
        };
        let gathered = self.pod_volume_evidence(&named).map_err(EngineError::NotFound)?;
        let Some(evidence) = gathered.evidence.into_iter().next() else {
            return self.not_there(out, req, target);
        };
        let judged = {
            let input = self.orphan_input();
            let mut clocks = req.clocks.lock().unwrap_or_else(|p| p.into_inner());
            orphans::judge(&evidence, &(&input).into(), &mut clocks)
        };
        let plan = pod_volume::plan(&evidence.entry, &judged, &gathered.kubelet_dir);
        out.evidence = Some(evidence);
        let runnable = plan.refusal.is_none() && !plan.steps.is_empty();
        out.plan = Some(plan);
        let Some((_lock, mut j)) = journal else { return Ok(out) };
        if !runnable {
            return Ok(out);
        }
        let plan = out.plan.as_ref().expect("set above");
        if let Some(admit) = req.admit {
            if let Err(why) = admit(plan) {
                out.refusal = Some((OutcomeClass::Refused, why));
                return Ok(out);
            }
        }
        tracing::info!(target: "audit", phase = "plan", operation = "clean", argument = %req.argument, by = %req.by, steps = plan.steps.len(), "pod volume directory");
        out.reports = self.execute_dirs(&plan.steps, &mut j, &req.by);
        out.applied = true;
        Ok(out)
    }

    /// Nothing at the place named: gone when an interrupted `rmdir` of it was just recovered,
    /// else an error naming the place.
    fn not_there(
        &self,
        mut out: DirOutcome,
        req: &DirRequest<'_>,
        target: Option<PathBuf>,
    ) -> Result<DirOutcome, EngineError> {
        let recovered =
            out.recovery.resolved.iter().find(
                |(i, _)| matches!(&i.step, JournaledStep::Dir(d) if Some(&d.volume) == target.as_ref()),
            );
        if let Some((i, r)) = recovered {
            out.gone = Some(format!("{} is gone: {} ({})", req.argument, r.detail, i.id));
            return Ok(out);
        }
        Err(EngineError::NotFound(format!(
            "no pod volume directory {} below the kubelet directory's pods/ (name it pod-volume:<pod uid>/volumes/<plugin>/<name>, .../volumeDevices/<plugin>/<name> or .../volume-subpaths/<volume>/<container>/<index>, as `scan` lists them)",
            req.argument
        )))
    }

    /// Runs the `rmdir`s in order, each journaled, audited and re-checked; a step whose
    /// predecessor did not finish is skipped.
    fn execute_dirs(&self, steps: &[DirStep], j: &mut Journal, by: &str) -> Vec<DirStepReport> {
        let mut reports: Vec<DirStepReport> = Vec::new();
        for step in steps {
            let path = step.host_path();
            if let Some(prev) =
                reports.last().filter(|r| !r.result.as_ref().is_ok_and(StepOutcome::is_finished))
            {
                let reason = format!("{} did not finish", prev.step.path.display());
                reports.push(DirStepReport {
                    step: step.clone(),
                    result: Err(DirActError::Skipped { path, reason }),
                });
                continue;
            }
            let id = match j.begin_at(step, None) {
                Ok(id) => id,
                Err(e) => {
                    let reason = format!("cannot write the journal {}: {e}", j.path().display());
                    let result = Err(DirActError::Precondition { path, reason });
                    reports.push(DirStepReport { step: step.clone(), result });
                    continue;
                }
            };
            tracing::info!(target: "audit", phase = "intent", action = step.action(), path = %path.display(), identity = %step.key, step = %step.describe(), journal_id = %id, by = %by);
            let result = match self.recheck_dir(step) {
                Some(StopReason::Refuse(reason)) => {
                    Err(DirActError::Precondition { path: path.clone(), reason })
                }
                Some(StopReason::IdentityChanged(reason)) => {
                    Err(DirActError::IdentityChanged { path: path.clone(), reason })
                }
                Some(StopReason::Absent(why)) => {
                    tracing::info!(path = %path.display(), "{why}");
                    Ok(StepOutcome::AlreadyAbsent)
                }
                None => self.world.remove_dir(step),
            };
            let (word, detail) = outcome_word(&result);
            if let Err(e) = j.finish(&id, word, &detail) {
                tracing::error!(path = %path.display(), journal_id = %id, "cannot record the step's result in the journal: {e}");
            }
            tracing::info!(target: "audit", phase = "result", action = step.action(), path = %path.display(), result = word.as_str(), detail = %detail, journal_id = %id, by = %by);
            reports.push(DirStepReport { step: step.clone(), result });
        }
        reports
    }

    /// Right before an `rmdir`: fresh evidence, every proof again, and the directory's identity.
    fn recheck_dir(&self, step: &DirStep) -> Option<StopReason> {
        let gathered = match self.pod_volume_evidence(&|e| e.rel == step.volume) {
            Ok(g) => g,
            Err(why) => return Some(StopReason::Refuse(format!("cannot re-check it: {why}"))),
        };
        let Some(ev) = gathered.evidence.first() else {
            return Some(StopReason::Absent(format!("{} is gone", step.volume.display())));
        };
        let input = self.orphan_input();
        let proved = orphans::prove(ev, &(&input).into());
        if proved.verdict != DirVerdict::Pending {
            let why = proved.reasons.last().cloned().unwrap_or_default();
            return Some(StopReason::Refuse(format!(
                "no longer removable ({}): {why}",
                proved.verdict.as_str()
            )));
        }
        let Content::Empty { dirs } = &ev.entry.content else {
            return Some(StopReason::Refuse("not empty any more".into()));
        };
        let Some((_, now)) = dirs.iter().find(|(p, _)| *p == step.path) else {
            return Some(StopReason::Absent(format!("{} is gone", step.path.display())));
        };
        gates::dir_identity(&step.path, step.key, Some(*now)).map(StopReason::IdentityChanged)
    }
}
