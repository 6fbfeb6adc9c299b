//! What a request to the engine is, and what carrying it out gave: the subject, the request,
//! the outcome (plans resumed, the judged scan, the plan, the step reports) and its class (what
//! it came to, in a script's words; how a front says it is the front's).

use super::recover::Recovery;
use super::{Judged, Operation};
use crate::act::{ActError, StepOutcome, StepReport};
use crate::graph::scan::Scan;
use crate::judge::grace::Clocks;
use crate::judge::Verdict;
use crate::model::DevNum;
use crate::plan::Plan;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

/// The device a request is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A device already resolved (the daemon's view).
    Device(DevNum),
    /// What the operator typed (`/dev/loop3`, `loop3`, `mpatha`, `7:3`): resolved only after
    /// recovery, so that a device an unfinished plan already removed still resumes that plan.
    Argument(String),
    /// An unfinished plan of the journal, by its ID: resumed (through every gate, the caller's
    /// may-act and the audit, as a new plan is) and nothing planned afresh: the daemon's
    /// recovery at start.
    Journaled(String),
}

/// One request: an operation on one device, maybe carried out.
pub struct Request<'a> {
    pub op: Operation,
    pub subject: Subject,
    /// What the caller named, in its words, for the journal and the reports.
    pub argument: String,
    /// The identity token the caller was shown (a Plan's answer): the device must still be it.
    pub expected_identity: Option<String>,
    /// Carry the plan out; false is a dry run through the same workflow.
    pub apply: bool,
    /// Who asks, for the journal and the audit log (`cli`, `daemon mode clean`, `Apply by X`).
    pub by: String,
    /// The journal (its lock file lives beside it).
    pub journal: &'a Path,
    /// How long to wait for another writer of the journal before refusing.
    pub lock_wait: Duration,
    /// The grace clocks (locked only while judging, never while steps run).
    pub clocks: &'a Mutex<Clocks>,
    /// The caller's own may-act on the plan (the daemon's step budget): why not.
    pub admit: Option<Admit<'a>>,
}

/// A caller's own may-act on a plan, called right before the plan is journaled: why not.
pub type Admit<'a> = &'a dyn Fn(&Plan) -> Result<(), String>;

/// What a request came to, in the words a script needs (each front says it its own way: the
/// CLI as its status, the wire as `DevicePlan.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeClass {
    /// Nothing to do, a dry run that may go, or every step done: the device is free.
    Done,
    /// Something still holds the device: left alone.
    Held,
    /// The agent could not see everything that could hold it: no confident answer.
    Unknown,
    /// A gate other than a holder said no (protected, the API cannot vouch, not stale yet, the
    /// identity changed, not privileged, another run holds the journal, a step re-check).
    Refused,
    /// Something failed (a step, a read).
    Error,
}

impl OutcomeClass {
    /// The word for it on the wire (`DevicePlan.outcome`) and in JSON: done, held, unknown,
    /// refused, error.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeClass::Done => "done",
            OutcomeClass::Held => "held",
            OutcomeClass::Unknown => "unknown",
            OutcomeClass::Refused => "refused",
            OutcomeClass::Error => "error",
        }
    }

    /// The worse of two classes (error > refused > unknown > held > done).
    pub fn worst(self, other: OutcomeClass) -> OutcomeClass {
        let rank = |c: OutcomeClass| match c {
            OutcomeClass::Done => 0,
            OutcomeClass::Held => 1,
            OutcomeClass::Unknown => 2,
            OutcomeClass::Refused => 3,
            OutcomeClass::Error => 4,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// An unfinished journaled plan this request finished (or found gone).
#[derive(Debug)]
pub struct Resumed {
    pub plan_id: String,
    /// The plan's operation and the argument it was asked with.
    pub operation: String,
    pub argument: String,
    pub device: String,
    /// The steps that had finished before the crash.
    pub already_done: usize,
    /// The remaining steps, each re-checked and run (or found already absent).
    pub reports: Vec<StepReport>,
    /// Why the plan was not resumed, or not wholly.
    pub refused: Option<ResumeRefusal>,
}

/// Why an unfinished plan was not resumed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeRefusal {
    /// Its interrupted step's device is another one now: the plan is closed, never resumed
    /// against it (an impostor reusing the name).
    IdentityChanged(String),
    /// The caller's own may-act (the daemon's step budget) said not now: the plan stays open
    /// for a later run.
    NotAdmitted(String),
    /// This run may not act, or cannot see the whole host (sight, may-act): left open.
    CannotAct(String),
}

impl std::fmt::Display for ResumeRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::IdentityChanged(why) | Self::NotAdmitted(why) | Self::CannotAct(why) => f.write_str(why),
        }
    }
}

impl Resumed {
    /// One line for humans.
    pub fn describe(&self) -> String {
        if let Some(why) = &self.refused {
            return format!(
                "the unfinished {} of {} ('{}', journal plan {}) is not resumed: {why}",
                self.operation, self.device, self.argument, self.plan_id
            );
        }
        let total = self.already_done + self.reports.len();
        let words: Vec<String> = self
            .reports
            .iter()
            .map(|r| {
                let (w, d) = r.word();
                if d.is_empty() {
                    format!("{}: {w}", r.step.describe())
                } else {
                    format!("{}: {w}: {d}", r.step.describe())
                }
            })
            .collect();
        format!(
            "resumed the unfinished {} of {} ('{}', journal plan {}): {} of {} step(s) had finished before the interruption{}{}",
            self.operation,
            self.device,
            self.argument,
            self.plan_id,
            self.already_done,
            total,
            if words.is_empty() { "; nothing was left" } else { "; the rest: " },
            words.join("; ")
        )
    }
}

/// What [`Engine::carry_out`] did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// The interrupted steps recovery closed (and those it left open).
    pub recovery: Recovery,
    /// The unfinished plans this request resumed.
    pub resumed: Vec<Resumed>,
    /// Unfinished plans left for their own command, in words.
    pub unfinished: Vec<String>,
    /// The judged fresh scan behind the plan.
    pub judged: Option<Judged>,
    /// The fresh plan (none when the device is gone and a resumed plan accounted for it).
    pub plan: Option<Plan>,
    /// Why the workflow refused before any step (sight, may-act, identity, the caller's
    /// may-act, the journal's lock), with its class.
    pub refusal: Option<(OutcomeClass, String)>,
    /// The fresh plan's steps as run.
    pub reports: Vec<StepReport>,
    /// Whether the fresh plan was carried out.
    pub applied: bool,
    /// A fresh scan of the device after the steps (none: gone).
    pub after: Option<Scan>,
    /// The device named is gone and the journal says which finished plan of it removed it.
    pub gone: Option<String>,
}

impl Outcome {
    /// Why the view behind this answer is incomplete: the blind spots of the plan's scan that
    /// could hide a holder of its device (`None`: it saw everything it needed).
    pub fn incomplete(&self) -> Option<String> {
        let j = self.judged.as_ref()?;
        let plan = self.plan.as_ref()?;
        let entry = j.scan.entry(plan.devnum)?;
        incomplete_view(&j.scan, Some(entry))
    }

    /// What this outcome means to a script.
    pub fn class(&self) -> OutcomeClass {
        if let Some((c, _)) = &self.refusal {
            return *c;
        }
        let mut class = OutcomeClass::Done;
        if self.gone.is_some() {
            return class;
        }
        for r in &self.resumed {
            class = class.worst(reports_class(&r.reports));
            if r.refused.is_some() {
                class = class.worst(OutcomeClass::Refused);
            }
        }
        let Some(plan) = &self.plan else { return class };
        let entry = self.judged.as_ref().and_then(|j| j.scan.entry(plan.devnum));
        let blind = self.incomplete().is_some();
        if plan.refusal.is_some() {
            let verdict = self.judged.as_ref().and_then(|j| j.verdict(plan.devnum)).map(|v| v.verdict);
            // Unknown only for what the scan could not see; a verdict `unknown` for another
            // reason (the Kubernetes API cannot vouch, the device stopped answering) is a
            // safety rule's refusal.
            // A protected device (or a layer of the plan) is a safety rule's refusal, held or not.
            let protected = verdict == Some(Verdict::Protected)
                || plan.refusal.as_deref().is_some_and(|r| r.contains(crate::judge::gates::PROTECTED));
            let c = if plan.unsupported {
                OutcomeClass::Error
            } else if protected {
                OutcomeClass::Refused
            } else if blind {
                OutcomeClass::Unknown
            } else if verdict == Some(Verdict::InUse) || entry.is_some_and(|e| !e.holders.is_empty()) {
                OutcomeClass::Held
            } else {
                OutcomeClass::Refused
            };
            return class.worst(c);
        }
        if !self.applied {
            return class.worst(if blind { OutcomeClass::Unknown } else { OutcomeClass::Done });
        }
        let still_held =
            self.after.as_ref().and_then(|s| s.entry(plan.devnum)).is_some_and(|e| !e.holders.is_empty());
        let deferred = self.reports.iter().any(|r| matches!(r.result, Ok(StepOutcome::Deferred(_))));
        let c = reports_class(&self.reports);
        class.worst(if c == OutcomeClass::Done && (still_held || deferred) { OutcomeClass::Held } else { c })
    }
}

/// The class of a run of steps: a failed step is an error, a step a re-check refused (or not
/// run for it) is refused, a step the kernel deferred (a loop device's autoclear, an nbd device
/// still open) leaves the device held: never done.
pub(super) fn reports_class(reports: &[StepReport]) -> OutcomeClass {
    reports.iter().fold(OutcomeClass::Done, |c, r| {
        c.worst(match &r.result {
            Ok(StepOutcome::Deferred(_)) => OutcomeClass::Held,
            Ok(_) => OutcomeClass::Done,
            Err(
                ActError::Precondition { .. } | ActError::IdentityChanged { .. } | ActError::Skipped { .. },
            ) => OutcomeClass::Refused,
            Err(ActError::Syscall { .. } | ActError::TimedOut { .. } | ActError::NotVerified { .. }) => {
                OutcomeClass::Error
            }
        })
    })
}

/// The first line of a report on `scan` that cannot see everything (for `entry`'s device, or
/// the whole host when `None`); `None` when nothing is hidden from it.
pub fn incomplete_view(scan: &Scan, entry: Option<&crate::graph::DeviceEntry>) -> Option<String> {
    let spots: Vec<&crate::model::blindspot::BlindSpot> = match entry {
        Some(e) => crate::model::blindspot::reaching(&scan.blind_spots, &e.device),
        None => scan.blind_spots.iter().collect(),
    };
    incomplete_line(&spots)
}

/// The INCOMPLETE VIEW line for these blind spots (`None`: there are none), ending with the
/// remedy that applies to them on this host ([`remedy`]).
pub fn incomplete_line(spots: &[&crate::model::blindspot::BlindSpot]) -> Option<String> {
    let first = spots.first()?;
    let is_root = nix::unistd::geteuid().is_root();
    Some(format!(
        "INCOMPLETE VIEW: {} thing(s) could not be read (first: {}), so a holder could be hidden and no answer here is confident; {}",
        spots.len(),
        first.what,
        remedy(spots, is_root)
    ))
}

/// What to do about these blind spots, for a run that is root or not: the remedy a blind spot
/// names itself (the run's sight: not root, a capability missing, another PID namespace); PID 1
/// that a sandbox or an LSM shields even from root (the flag that trusts it); not root (run as
/// root); else, for root, what is left (something shielded or changing while it was read).
pub fn remedy(spots: &[&crate::model::blindspot::BlindSpot], is_root: bool) -> &'static str {
    let says_its_own = |w: &str| w.contains("; run it ") || w.contains("hostPID: true");
    if spots.iter().any(|b| says_its_own(&b.what)) {
        "what to do is said with each (`-o json`: blind_spots)"
    } else if !is_root {
        "run it as root on the host (in a pod: privileged, hostPID: true)"
    } else if spots.iter().any(|b| b.what.contains("pid 1 ") || b.what.contains("PID 1")) {
        "PID 1 is shielded even from root here (a sandbox or an LSM): if it holds no device, \
         --trust-unreadable-init (BLOCKJANITOR_TRUST_UNREADABLE_INIT=1) says so; never on a normal node"
    } else {
        "this run is root: something shielded (an LSM) or changing while it was read hid it; run it again, \
         and if it stays, `-o json` lists every blind spot"
    }
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
