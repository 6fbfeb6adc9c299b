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
