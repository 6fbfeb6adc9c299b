//! The only code that writes to the kernel. [`Actuator`] has a Linux implementation
//! ([`linux::LinuxActuator`]) and a recording one for tests ([`recording::RecordingActuator`]).
//!
//! [`execute`] runs a plan's steps in order: each is journaled before and after, audited as one
//! structured log line, and its failure is collected rather than stopping the rest.

pub mod linux;
mod mapping;
pub mod recording;
mod storage;

use std::time::Duration;

use serde::Serialize;

use crate::journal::Journal;
use crate::model::DeviceName;
use crate::plan::{Plan, Step};

/// How a step ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// The change was made and verified.
    Done,
    /// The target was already gone: nothing to do.
    AlreadyAbsent,
    /// The kernel accepted the request but will finish it later (e.g. loop autoclear).
    Deferred(String),
}

/// Why a step failed, naming the device.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("{device}: precondition failed: {reason}")]
    Precondition { device: DeviceName, reason: String },
    #[error("{device}: {op} failed: {source}")]
    Syscall { device: DeviceName, op: &'static str, source: std::io::Error },
    #[error("{device}: {op} did not finish within {after:?}; it is left running on its own thread and reported as hung")]
    TimedOut { device: DeviceName, op: &'static str, after: Duration },
    #[error("{device}: {op} reported success but {reason}")]
    NotVerified { device: DeviceName, op: &'static str, reason: String },
}

/// Carries out steps.
pub trait Actuator {
    /// Re-checks and runs one step.
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError>;
}

/// One step's result.
#[derive(Debug)]
pub struct StepReport {
    pub step: Step,
    pub result: Result<StepOutcome, ActError>,
}

impl StepReport {
    /// `done`, `already_absent`, `deferred` or `failed`, with the detail (empty for the first two).
    pub fn word(&self) -> (&'static str, String) {
        outcome_word(&self.result)
    }
}

fn outcome_word(r: &Result<StepOutcome, ActError>) -> (&'static str, String) {
    match r {
        Ok(StepOutcome::Done) => ("done", String::new()),
        Ok(StepOutcome::AlreadyAbsent) => ("already_absent", String::new()),
        Ok(StepOutcome::Deferred(why)) => ("deferred", why.clone()),
        Err(e) => ("failed", e.to_string()),
    }
}

impl Serialize for StepReport {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            step: &'a Step,
            result: &'static str,
            #[serde(skip_serializing_if = "String::is_empty")]
            detail: String,
        }
        let (result, detail) = self.word();
        Flat { step: &self.step, result, detail }.serialize(s)
    }
}

/// Runs every step of `plan`. `recheck` is called right before each step and may veto it (for
/// example after a fresh scan found a new holder).
pub fn execute(
    plan: &Plan,
    actuator: &dyn Actuator,
    journal: &mut Journal,
    mut recheck: impl FnMut(&Step) -> Result<(), String>,
) -> Vec<StepReport> {
    let mut out = Vec::new();
    for step in &plan.steps {
        let id = match journal.begin(step) {
            Ok(id) => id,
            Err(e) => {
                // No journal, no action: a crash must always be recoverable from it.
                let reason = format!("cannot write the journal {}: {e}", journal.path().display());
                out.push(StepReport {
                    step: step.clone(),
                    result: Err(ActError::Precondition { device: step.device().clone(), reason }),
                });
                continue;
            }
        };
        tracing::info!(target: "audit", phase = "intent", action = step.action(), device = %step.device(), step = %step.describe(), journal_id = %id);
        let result = match recheck(step) {
            Err(reason) => Err(ActError::Precondition { device: step.device().clone(), reason }),
            Ok(()) => actuator.run(step),
        };
        let (word, detail) = outcome_word(&result);
        if let Err(e) = journal.finish(&id, word, &detail) {
            tracing::error!(device = %step.device(), journal_id = %id, "cannot record the step's result in the journal: {e}");
        }
        tracing::info!(target: "audit", phase = "result", action = step.action(), device = %step.device(), result = word, detail = %detail, journal_id = %id);
        out.push(StepReport { step: step.clone(), result });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::recording::RecordingActuator;
    use super::*;
    use crate::model::{DevNum, DeviceName};
    use crate::plan::Plan;

    fn loop_step(n: u32) -> Step {
        Step::DetachLoop {
            device: DeviceName::new(&format!("loop{n}")).expect("name"),
            devnum: DevNum::new(7, n),
            backing_file: format!("/img{n}").into(),
            backing_dev: None,
            backing_inode: None,
        }
    }

    fn plan_of(steps: Vec<Step>) -> Plan {
        Plan {
            operation: "clean",
            device: DeviceName::new("loop1").expect("name"),
            devnum: DevNum::new(7, 1),
            steps,
            left_alone: Vec::new(),
            refusal: None,
            unsupported: false,
            notes: Vec::new(),
        }
    }

    fn journal(dir: &tempfile::TempDir) -> Journal {
        Journal::open(&dir.path().join("j.jsonl")).expect("journal")
    }

    #[test]
    fn runs_every_step_in_order_and_collects_failures() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        let act = RecordingActuator::default();
        act.script.borrow_mut().extend([
            Err(ActError::Syscall {
                device: DeviceName::new("loop1").expect("n"),
                op: "LOOP_CLR_FD",
                source: std::io::Error::other("boom"),
            }),
            Ok(StepOutcome::AlreadyAbsent),
        ]);
        let reports =
            execute(&plan_of(vec![loop_step(1), loop_step(2), loop_step(3)]), &act, &mut j, |_| Ok(()));
        let words: Vec<&str> = reports.iter().map(|r| r.word().0).collect();
        assert_eq!(words, vec!["failed", "already_absent", "done"], "a failure does not stop the rest");
        assert_eq!(act.calls.borrow().len(), 3);
        assert_eq!(act.calls.borrow()[2], loop_step(3), "in plan order");
        let text = std::fs::read_to_string(dir.path().join("j.jsonl")).expect("journal text");
        assert_eq!(text.lines().count(), 6, "an intent and a result per step:\n{text}");
        assert!(crate::journal::pending(&dir.path().join("j.jsonl")).expect("pending").is_empty());
    }

    #[test]
    fn a_vetoed_step_never_reaches_the_kernel() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut j = journal(&dir);
        let act = RecordingActuator::default();
        let reports = execute(&plan_of(vec![loop_step(1), loop_step(2)]), &act, &mut j, |s| {
            if s == &loop_step(1) {
                Err("a fresh scan found 1 holder(s)".into())
            } else {
                Ok(())
            }
        });
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("fresh scan"))
        );
        assert_eq!(
            act.calls.borrow().as_slice(),
            &[loop_step(2)],
            "only the step that passed its re-check ran"
        );
    }

    #[test]
    fn no_journal_no_action() {
        // /dev/full opens but every write fails with ENOSPC.
        let mut j = Journal::open(std::path::Path::new("/dev/full")).expect("/dev/full opens on Linux");
        let act = RecordingActuator::default();
        let reports = execute(&plan_of(vec![loop_step(1)]), &act, &mut j, |_| Ok(()));
        assert!(act.calls.borrow().is_empty(), "nothing acts without its intent on record");
        assert!(
            matches!(&reports[0].result, Err(ActError::Precondition { reason, .. }) if reason.contains("cannot write the journal"))
        );
    }
}
