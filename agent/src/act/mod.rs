//! The only code that writes to the kernel. [`Actuator`] has a Linux implementation
//! ([`linux::LinuxActuator`]) and a step-level recording one for the engine's tests
//! ([`recording::RecordingActuator`]). One file per transport (`mount.rs`, `loop.rs`, `rbd.rs`,
//! `nbd.rs`, `multipath.rs` with `multipathd.rs` and `multipathd_remove.rs`, `scsi.rs`,
//! `iscsi.rs`, `nvme.rs`); [`crate::discover::probe`] asks the kernel about a device right before
//! a destructive step, and [`journal`] records every step before and after it runs.
//!
//! The Linux actuator makes every kernel call through [`kernel::Kernel`], the seam: the live
//! kernel is [`kernel_linux::LinuxKernel`]; `recording_kernel::RecordingKernel` (tests only)
//! serves a scripted kernel on a fixture tree and records each call, so every actuator's
//! identity re-check is unit-tested with the writes that did (or did not) reach it.
//!
//! Steps are run by the engine ([`crate::engine::Engine::execute`]): each journaled before and
//! after, audited, re-checked, and skipped when a step it depends on did not finish.

mod host_command;
mod iscsi;
pub mod journal;
mod journal_record;
mod journal_writer;
pub mod kernel;
pub mod kernel_linux;
pub mod linux;
mod r#loop;
mod mount;
mod multipath;
pub mod multipathd;
mod multipathd_remove;
mod nbd;
mod nvme;
pub mod pod_volume;
mod rbd;
pub mod recording;
#[cfg(test)]
pub mod recording_kernel;
mod scsi;
mod unmount;

use std::time::Duration;

use serde::Serialize;

use crate::model::DeviceName;
use crate::plan::step::Step;

/// How a step ended when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// The change was made and verified.
    Done,
    /// The change was made and verified, by the way the text says (e.g. through multipathd).
    DoneVia(String),
    /// The target was already gone: nothing to do.
    AlreadyAbsent,
    /// The kernel accepted the request but will finish it later (e.g. loop autoclear).
    Deferred(String),
}

impl StepOutcome {
    /// True when the step finished (done, whichever way, or nothing to do): steps that depend
    /// on it may run.
    pub fn is_finished(&self) -> bool {
        matches!(self, StepOutcome::Done | StepOutcome::DoneVia(_) | StepOutcome::AlreadyAbsent)
    }
}

/// Why a step failed, naming the device.
#[derive(Debug, thiserror::Error)]
pub enum ActError {
    #[error("{device}: precondition failed: {reason}")]
    Precondition { device: DeviceName, reason: String },
    /// The device at the planned number is another kernel object now (a name reused since the
    /// plan): a refusal of its own kind, so a caller never has to read it out of the words.
    #[error("{device}: precondition failed: {reason}")]
    IdentityChanged { device: DeviceName, reason: String },
    #[error("{device}: {op} failed: {source}")]
    Syscall { device: DeviceName, op: &'static str, source: std::io::Error },
    #[error("{device}: {op} did not finish within {after:?}; it is left running on its own thread and reported as hung")]
    TimedOut { device: DeviceName, op: &'static str, after: Duration },
    #[error("{device}: {op} reported success but {reason}")]
    NotVerified { device: DeviceName, op: &'static str, reason: String },
    /// Not run: a step it depends on did not finish.
    #[error("{device}: not run: {reason}")]
    Skipped { device: DeviceName, reason: String },
}

impl ActError {
    /// The step's precondition does not hold on `device` (the one way every actuator says so).
    pub fn precondition(device: &DeviceName, reason: String) -> Self {
        ActError::Precondition { device: device.clone(), reason }
    }
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
    /// `done`, `already_absent`, `deferred`, `skipped` or `failed`, with the detail (empty for
    /// the first two).
    pub fn word(&self) -> (&'static str, String) {
        let (result, detail) = outcome_word(&self.result);
        (result.as_str(), detail)
    }

    /// How the step ended, as its journal `result` record says it ([`outcome_word`]).
    pub fn result_word(&self) -> journal::StepResult {
        outcome_word(&self.result).0
    }
}

/// A step's result as the journal's word and its detail.
pub fn outcome_word(r: &Result<StepOutcome, ActError>) -> (journal::StepResult, String) {
    use journal::StepResult;
    match r {
        Ok(StepOutcome::Done) => (StepResult::Done, String::new()),
        Ok(StepOutcome::DoneVia(how)) => (StepResult::Done, how.clone()),
        Ok(StepOutcome::AlreadyAbsent) => (StepResult::AlreadyAbsent, String::new()),
        Ok(StepOutcome::Deferred(why)) => (StepResult::Deferred, why.clone()),
        Err(e @ ActError::Skipped { .. }) => (StepResult::Skipped, e.to_string()),
        Err(e) => (StepResult::Failed, e.to_string()),
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
