//! The one request workflow: every way in (the one-shot CLI's `release`/`clean`, the daemon's
//! modes, the gRPC Apply and the console's forwarded Apply, the property test) carries a
//! request out through [`Engine::carry_out`], and nothing else strings plan and execute together.
//!
//! For a request that acts (`apply`), in this order:
//!
//! 1. **sight and may-act**: an agent that may not act on the host, or that lacks the privileges
//!    to see other processes and namespaces ([`World::sight`]), refuses before anything else, in
//!    one line saying what it cannot see and what to do;
//! 2. **one writer**: the journal's lock ([`journal::lock`]) is taken for the whole request (a
//!    second writer waits a bounded time, then is refused naming the holder's pid);
//! 3. **recovery**: the intents a run that died left open are closed ([`Engine::recover`]); an
//!    unfinished journaled plan that the request names (its argument, a device of it) is
//!    resumed: its remaining steps run through the usual re-check before each (identity: an
//!    impostor reusing a name is refused), or are found already gone. This happens before the
//!    argument is resolved, so an argument naming a device the plan already removed resumes it;
//! 4. **a fresh plan**: the argument is resolved, the device scanned, judged and planned through
//!    every gate; bound to the identity the caller was shown when one is given;
//! 5. **the caller's may-act** on the plan (the daemon's per-minute budget);
//! 6. **the plan journaled whole** (argument, operation, devices with their identities, every
//!    step), then executed (each step journaled before and after and re-checked), then closed;
//! 7. **the after-state**: a fresh scan of the device.
//!
//! A dry run (no `apply`) goes through the same resolution, fresh plan and identity binding and
//! stops before the lock and the journal. [`Outcome::class`] says what a script needs to know:
//! free or done, held, unknown (could not see), refused, error.

use std::path::Path;
use std::time::Duration;

use super::{Engine, EngineError, World};
use crate::act::journal::{
    self, Journal, OpenPlan, PlanBody, PlanDevice, PlanEndResult, PlanRecord, PlanRequest, PlanStep,
};
use crate::act::{ActError, StepOutcome, StepReport};
use crate::graph::identity::Identity;
use crate::graph::scan::{Scan, Target};
use crate::model::DevNum;
use crate::plan::{Action, Plan, Step};

/// Default bound on waiting for another writer of the journal.
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// Who resumes the journal's unfinished plans at start, and their own may-act on each.
#[derive(Clone, Copy)]
pub struct Resumer<'a> {
    pub by: &'a str,
    pub admit: Option<super::outcome::Admit<'a>>,
}
use super::outcome::{Outcome, OutcomeClass, Request, ResumeRefusal, Resumed, Subject};

impl<W: World> Engine<W> {
    /// Carries `req` out (see the module docs): the only caller of [`Engine::plan_fresh`] and
    /// [`Engine::execute`] outside the engine. `Err` only when the host or the journal cannot
    /// be read at all, or the device named does not exist and no unfinished plan owes it.
    pub fn carry_out(&self, req: &Request<'_>) -> Result<Outcome, EngineError> {
        let mut out = Outcome::default();
        let mut lock_and_journal = None;
        if req.apply {
            let Some(held) = self.writer_and_owed_plans(req, &mut out)? else { return Ok(out) };
            lock_and_journal = Some(held);
        }
        // 4. A fresh plan.
        let Some(devnum) = self.fresh_device(req, &mut out)? else { return Ok(out) };
        let judged = {
            let scan = match self.plan_scan(devnum, req.op) {
                Ok(s) => s,
                Err(EngineError::NotFound(_)) if !out.resumed.is_empty() => return Ok(out),
                Err(e) => return Err(e),
            };
            let mut clocks = req.clocks.lock().unwrap_or_else(|p| p.into_inner());
            self.judge(scan, &mut clocks)
        };
        let plan = self.plan(&judged, devnum, req.op)?;
        if let Some(token) = &req.expected_identity {
            if let Err(e) = self.expect_identity(&judged, devnum, token) {
                out.refusal = Some((OutcomeClass::Refused, e.to_string()));
            }
        }
        out.judged = Some(judged);
        let runnable = plan.refusal.is_none() && !plan.steps.is_empty();
        out.plan = Some(plan);
        let Some((_lock, mut j)) = lock_and_journal else { return Ok(out) };
        if out.refusal.is_some() || !runnable {
            return Ok(out);
        }
        self.apply_plan(req, &mut j, devnum, &mut out)?;
        Ok(out)
    }

    /// Steps 1 to 3 of a request that acts: sight and may-act, the journal's lock, recovery and
    /// the unfinished plans the request owes. `None`: `out` is complete (refused, or a journaled
    /// plan resumed alone); else the lock and the journal, held for the rest of the request.
    fn writer_and_owed_plans(
        &self,
        req: &Request<'_>,
        out: &mut Outcome,
    ) -> Result<Option<(journal::JournalLock, Journal)>, EngineError> {
        // 1. Sight and may-act: one line, before the journal is touched.
        if let Err(why) = self.world.can_act().and_then(|()| self.world.sight()) {
            out.refusal = Some((OutcomeClass::Refused, format!("--apply refused: {why}")));
            return Ok(None);
        }
        // 2. One writer.
        let lock = match journal::lock(req.journal, req.lock_wait) {
            Ok(l) => l,
            Err(e) if journal::is_busy(&e) => {
                out.refusal = Some((OutcomeClass::Refused, format!("--apply refused: {e}")));
                return Ok(None);
            }
            Err(source) => return Err(EngineError::Journal { path: req.journal.to_owned(), source }),
        };
        let mut j = Journal::open(req.journal)
            .map_err(|source| EngineError::Journal { path: req.journal.to_owned(), source })?;
        // 3. Recovery, then the unfinished plans this request owes.
        out.recovery = self
            .recover(&mut j)
            .map_err(|source| EngineError::Journal { path: req.journal.to_owned(), source })?;
        let open = journal::open_plans(req.journal)
            .map_err(|source| EngineError::Journal { path: req.journal.to_owned(), source })?;
        for p in open {
            let owed = match &req.subject {
                Subject::Device(d) => owed_by(&p, &req.argument, Some(*d)),
                Subject::Argument(_) => owed_by(&p, &req.argument, None),
                Subject::Journaled(id) => p.id == *id,
            };
            if owed {
                out.resumed.push(self.resume(&p, &mut j, req)?);
            } else {
                out.unfinished.push(unfinished_words(&p));
            }
        }
        // A journaled plan is resumed alone: nothing is planned afresh.
        if matches!(req.subject, Subject::Journaled(_)) {
            return Ok(None);
        }
        // A resumed step refused because its device is now another one (an impostor reusing
        // the name): the argument is not planned afresh against that other device in the same
        // run; the operator sees why and decides.
        if let Some(why) = impostor(&out.resumed) {
            out.refusal = Some((
                OutcomeClass::Refused,
                format!(
                    "the interrupted plan '{}' owed is not finished: {why}; the device now under that name is not planned in this run: run the command again to plan it on its own",
                    req.argument
                ),
            ));
            return Ok(None);
        }
        Ok(Some((lock, j)))
    }

    /// Step 4's device: the request's, or its argument resolved. `None`: `out` is complete (the
    /// argument names no device, but unfinished plans were resumed for it, or a finished plan
    /// of the journal removed it: said so in `out.gone`).
    fn fresh_device(&self, req: &Request<'_>, out: &mut Outcome) -> Result<Option<DevNum>, EngineError> {
        match &req.subject {
            Subject::Device(d) => Ok(Some(*d)),
            Subject::Journaled(id) => {
                Err(EngineError::NotFound(format!("journal plan {id} is resumed only with --apply")))
            }
            Subject::Argument(a) => match self.world.resolve(a) {
                Ok(d) => Ok(Some(d)),
                Err(EngineError::NotFound(_)) if !out.resumed.is_empty() => Ok(None),
                Err(EngineError::NotFound(why)) => {
                    // Gone: said so when a finished plan of the journal removed it (a run killed
                    // after its last record, run again), else unknown.
                    let finished =
                        journal::last_closed_plan(req.journal, |p| owed_by_record(p, a, None)).ok().flatten();
                    let Some((plan, end)) = finished else { return Err(EngineError::NotFound(why)) };
                    out.gone = Some(format!(
                        "{a} is gone: the {} of {} (journal plan {}) ended {}: {}",
                        or_unknown(&plan.body.request.operation),
                        or_unknown(&plan.body.device),
                        plan.id,
                        end.result,
                        end.detail
                    ));
                    Ok(None)
                }
                Err(e) => Err(e),
            },
        }
    }

    /// Steps 5 to 7 for `out.plan`, runnable and unrefused: the caller's may-act, the plan
    /// journaled whole, executed and closed, then the after-state of `devnum`.
    fn apply_plan(
        &self,
        req: &Request<'_>,
        j: &mut Journal,
        devnum: DevNum,
        out: &mut Outcome,
    ) -> Result<(), EngineError> {
        let plan = out.plan.as_ref().expect("set above");
        // 5. The caller's may-act.
        if let Some(admit) = req.admit {
            if let Err(why) = admit(plan) {
                out.refusal = Some((OutcomeClass::Refused, why));
                return Ok(());
            }
        }
        // 6. The plan journaled whole, executed, closed.
        let body = plan_record(plan, out.judged.as_ref().map(|j| &j.scan), req);
        let plan_id =
            j.plan(&body).map_err(|source| EngineError::Journal { path: req.journal.to_owned(), source })?;
        tracing::info!(target: "audit", phase = "plan", operation = plan.operation, device = %plan.device, argument = %req.argument, by = %req.by, steps = plan.steps.len(), force_busy = plan.force_busy.as_deref().unwrap_or(""), journal_id = %plan_id);
        let reports = self.execute_indexed(plan, j, None, &req.by)?;
        let (word, detail) = plan_end_words(&reports);
        if let Err(e) = j.plan_end(&plan_id, word, &detail) {
            tracing::error!(journal_id = %plan_id, "cannot close the plan in the journal: {e}");
        }
        out.reports = reports;
        out.applied = true;
        // 7. The after-state.
        out.after = match self.scan(Target::Device(devnum)) {
            Ok(s) => Some(s),
            Err(EngineError::NotFound(_)) => None,
            Err(e) => return Err(e),
        };
        Ok(())
    }

    /// At daemon start: takes the lock and closes the interrupted intents; then, with `resume`,
    /// carries every unfinished plan on through the one request workflow ([`Engine::carry_out`]
    /// with [`Subject::Journaled`], by `resume`'s caller): sight and may-act, the journal's lock,
    /// each remaining step's re-check (the Kubernetes API's gate among them: the daemon calls
    /// this once the API's view is up), the caller's may-act and the audit, as for a new plan.
    /// Without `resume` (a daemon that does not act by itself), the plans are listed.
    pub fn recover_all(
        &self,
        path: &Path,
        lock_wait: Duration,
        resume: Option<Resumer<'_>>,
    ) -> Result<Outcome, EngineError> {
        let mut out = Outcome::default();
        let jerr = |source| EngineError::Journal { path: path.to_owned(), source };
        if journal::pending(path).map_err(jerr)?.is_empty()
            && journal::open_plans(path).map_err(jerr)?.is_empty()
        {
            return Ok(out);
        }
        {
            let _lock = match journal::lock(path, lock_wait) {
                Ok(l) => l,
                Err(e) if journal::is_busy(&e) => {
                    out.refusal = Some((OutcomeClass::Refused, e.to_string()));
                    return Ok(out);
                }
                Err(e) => return Err(jerr(e)),
            };
            let mut j = Journal::open(path).map_err(jerr)?;
            out.recovery = self.recover(&mut j).map_err(jerr)?;
        }
        let open = journal::open_plans(path).map_err(jerr)?;
        let Some(resumer) = resume else {
            out.unfinished = open.iter().map(unfinished_words).collect();
            return Ok(out);
        };
        // Unused: a journaled plan is resumed, never planned afresh.
        let clocks = std::sync::Mutex::new(crate::judge::grace::Clocks::new(None));
        for p in &open {
            let request = &p.record.body.request;
            let op = if request.operation == "release" {
                super::Operation::Release
            } else {
                super::Operation::Clean
            };
            let req = Request {
                op,
                subject: Subject::Journaled(p.id.clone()),
                argument: request.argument.clone(),
                expected_identity: None,
                apply: true,
                by: format!("{} (resuming journal plan {} asked by {})", resumer.by, p.id, request.by),
                journal: path,
                lock_wait,
                clocks: &clocks,
                admit: resumer.admit,
            };
            let o = self.carry_out(&req)?;
            out.resumed.extend(o.resumed);
            if let Some(refusal) = o.refusal {
                out.unfinished.push(format!("{}: not resumed: {}", unfinished_words(p), refusal.1));
                out.refusal.get_or_insert(refusal);
            }
        }
        Ok(out)
    }

    /// Finishes an unfinished journaled plan for `req`: the caller's may-act on what is left
    /// (the daemon's budget: refused, it stays open for a later run), then its remaining steps,
    /// each re-checked right before it runs (identity, holders, the API, the kernel's word) or
    /// found already absent, audited by `req.by`; then closes it.
    fn resume(&self, p: &OpenPlan, j: &mut Journal, req: &Request<'_>) -> Result<Resumed, EngineError> {
        let path = j.path().to_owned();
        let jerr = |source| EngineError::Journal { path: path.clone(), source };
        let r = &p.record;
        let mut resumed = Resumed {
            plan_id: p.id.clone(),
            operation: r.body.request.operation.clone(),
            argument: r.body.request.argument.clone(),
            device: r.body.device.clone(),
            already_done: p.finished.len(),
            reports: Vec::new(),
            refused: None,
        };
        let plan = match journaled_plan(r) {
            Ok(plan) => plan,
            Err(why) => {
                let detail = format!("the journaled plan cannot be read back ({why}): not resumed");
                tracing::error!(journal_id = %p.id, "{detail}");
                j.plan_end(&p.id, PlanEndResult::Unreadable, &detail).map_err(jerr)?;
                return Ok(resumed);
            }
        };
        if let Some(&k) = p.changed.iter().next() {
            // The interrupted step's device is another one now: nothing of this plan runs again
            // (its other steps depend on that one); the devices are judged afresh on their own.
            let step = plan.steps.get(k).map_or_else(|| format!("step {}", k + 1), Step::describe);
            let why = format!(
                "'{step}' was interrupted and its device is another one now (identity changed): the plan is closed, and what is left is judged afresh"
            );
            j.plan_end(&p.id, PlanEndResult::Incomplete, &why).map_err(jerr)?;
            resumed.refused = Some(ResumeRefusal::IdentityChanged(why));
            return Ok(resumed);
        }
        let remaining: Vec<usize> = (0..plan.steps.len()).filter(|i| !p.finished.contains(i)).collect();
        if let Some(admit) = req.admit {
            let left =
                Plan { steps: remaining.iter().map(|&i| plan.steps[i].clone()).collect(), ..plan.clone() };
            if let Err(why) = admit(&left) {
                resumed.refused =
                    Some(ResumeRefusal::NotAdmitted(format!("{why}: left open for a later run")));
                return Ok(resumed);
            }
        }
        j.resume_plan(&p.id);
        tracing::warn!(target: "audit", phase = "resume", operation = plan.operation, device = %plan.device, journal_id = %p.id, remaining = remaining.len(), by = %req.by, "resuming an unfinished plan");
        let reports = self.execute_indexed(&plan, j, Some(&remaining), &req.by)?;
        let (word, detail) = plan_end_words(&reports);
        let word = if word == PlanEndResult::Finished { PlanEndResult::Resumed } else { word };
        j.plan_end(&p.id, word, &detail).map_err(jerr)?;
        resumed.reports = reports;
        Ok(resumed)
    }
}

/// Why a resumed plan's device is now another one (an impostor reusing its name), if one is:
/// a resumption refused for it, or a resumed step that found it changed.
fn impostor(resumed: &[Resumed]) -> Option<String> {
    resumed
        .iter()
        .find_map(|r| match &r.refused {
            Some(ResumeRefusal::IdentityChanged(why)) => Some(why.clone()),
            _ => None,
        })
        .or_else(|| {
            resumed.iter().flat_map(|r| &r.reports).find_map(|r| match &r.result {
                Err(e @ ActError::IdentityChanged { .. }) => Some(e.to_string()),
                _ => None,
            })
        })
}

/// Whether the request names the unfinished plan `p`: its argument, or a device of it (name,
/// `/dev/` path, dm name, number).
fn owed_by(p: &OpenPlan, argument: &str, devnum: Option<DevNum>) -> bool {
    owed_by_record(&p.record, argument, devnum)
}

fn owed_by_record(r: &PlanRecord, argument: &str, devnum: Option<DevNum>) -> bool {
    let arg = argument.trim();
    if !arg.is_empty() && arg == r.body.request.argument {
        return true;
    }
    let bare = arg.trim_start_matches("/dev/mapper/").trim_start_matches("/dev/");
    r.body.devices.iter().any(|d| {
        let dm = d.dm_name.as_deref().unwrap_or_default();
        (!bare.is_empty() && (bare == d.name || bare == dm || d.devnum.to_string() == bare))
            || devnum == Some(d.devnum)
    })
}

/// A word of a journaled plan, `?` when it is missing.
fn or_unknown(word: &str) -> &str {
    if word.is_empty() {
        "?"
    } else {
        word
    }
}

fn unfinished_words(p: &OpenPlan) -> String {
    let b = &p.record.body;
    let (op, arg) = (or_unknown(&b.request.operation), or_unknown(&b.request.argument));
    format!(
        "journal plan {} ({op} of {}, asked as '{arg}', by process {}) is unfinished: run `{op} {arg} --apply` again to finish it",
        p.id,
        or_unknown(&b.device),
        p.writer_pid.map_or("?".to_owned(), |p| p.to_string())
    )
}

/// A part of a plan record as JSON (read back by [`journaled_plan`]).
fn to_value<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// The plan record's body: what a re-run needs to finish the plan.
fn plan_record(plan: &Plan, scan: Option<&Scan>, req: &Request<'_>) -> PlanBody {
    let mut devices: Vec<PlanDevice> = Vec::new();
    for (devnum, name, identity) in std::iter::once((plan.devnum, &plan.device, &plan.identity))
        .chain(plan.steps.iter().map(|s| (s.devnum, &s.device, &s.identity)))
    {
        if devices.iter().any(|d| d.devnum == devnum) {
            continue;
        }
        let e = scan.and_then(|s| s.entry(devnum));
        devices.push(PlanDevice {
            name: name.to_string(),
            devnum,
            identity: identity.token(),
            dm_name: e.and_then(|e| e.device.dm.as_ref()).map(|d| d.name.clone()),
            uuid: e.and_then(|e| e.device.dm.as_ref()).map(|d| d.uuid.clone()),
            wwid: e.and_then(|e| e.scsi.as_ref()).and_then(|s| s.disk.wwid.clone()),
        });
    }
    PlanBody {
        request: PlanRequest {
            argument: req.argument.clone(),
            operation: plan.operation.to_owned(),
            by: req.by.clone(),
        },
        device: plan.device.to_string(),
        devnum: Some(plan.devnum),
        identity: plan.identity.token(),
        identity_parts: to_value(&plan.identity),
        devices,
        steps: plan
            .steps
            .iter()
            .map(|s| PlanStep { step: to_value(s), identity_parts: to_value(&s.identity) })
            .collect(),
        expected_openers: plan.expected_openers.clone(),
        // The operator's reason for detaching despite process users (`--force-busy`), kept
        // with the plan it overrode; a resumed plan is re-checked without it.
        force_busy: plan.force_busy.clone(),
        notes: plan.notes.clone(),
    }
}

/// Reads a plan record back into a plan (its steps with their identities).
pub fn journaled_plan(r: &PlanRecord) -> Result<Plan, String> {
    // A plan's operation word, as its planner names it.
    const OPERATIONS: [&str; 6] = ["clean", "release", "teardown", "delete", "unmap", "disconnect"];
    let word = &r.body.request.operation;
    let Some(operation) = OPERATIONS.iter().copied().find(|o| o == word) else {
        return Err(format!("unknown operation {word:?}"));
    };
    let identity: Identity =
        serde_json::from_value(r.body.identity_parts.clone()).map_err(|e| format!("identity_parts: {e}"))?;
    let mut steps = Vec::new();
    for (i, s) in r.body.steps.iter().enumerate() {
        if s.step.is_null() {
            return Err(format!("step {i}: missing"));
        }
        let identity: Identity = serde_json::from_value(s.identity_parts.clone())
            .map_err(|e| format!("step {i}: identity_parts: {e}"))?;
        let action: Action = serde_json::from_value(s.step.clone()).map_err(|e| format!("step {i}: {e}"))?;
        steps.push(Step { device: identity.name.clone(), devnum: identity.devnum, identity, action });
    }
    Ok(Plan {
        operation,
        device: identity.name.clone(),
        devnum: identity.devnum,
        identity,
        steps,
        left_alone: Vec::new(),
        refusal: None,
        unsupported: false,
        notes: Vec::new(),
        expected_openers: r.body.expected_openers.clone(),
        // A resumed release is re-checked without an override: users refuse it again.
        force_busy: None,
    })
}

/// How a plan's run ends in the journal: `finished` when every step finished, else
/// `incomplete` naming the steps that did not (a step the kernel deferred did not: the device
/// is still there until its last opener closes it).
fn plan_end_words(reports: &[StepReport]) -> (PlanEndResult, String) {
    let not: Vec<String> = reports
        .iter()
        .filter(|r| !r.result.as_ref().is_ok_and(StepOutcome::is_finished))
        .map(|r| {
            let (w, d) = r.word();
            format!("{}: {w} {d}", r.step.describe())
        })
        .collect();
    if not.is_empty() {
        (PlanEndResult::Finished, format!("{} step(s) finished", reports.len()))
    } else {
        (
            PlanEndResult::Incomplete,
            format!(
                "{} of {} step(s) did not finish (not repeated by a re-run: plan the device again): {}",
                not.len(),
                reports.len(),
                not.join("; ")
            ),
        )
    }
}
