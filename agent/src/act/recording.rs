//! A step-level test double for the engine: records the steps it is asked to run and answers
//! from a script, never reaching a kernel (the kernel-call double under the Linux actuator is
//! `recording_kernel.rs`).

use std::cell::RefCell;
use std::collections::VecDeque;

use super::{ActError, Actuator, StepOutcome};
use crate::plan::step::Step;

/// Records steps; answers each with the next scripted outcome (default: `Done`).
#[derive(Debug, Default)]
pub struct RecordingActuator {
    pub calls: RefCell<Vec<Step>>,
    pub script: RefCell<VecDeque<Result<StepOutcome, ActError>>>,
}

impl Actuator for RecordingActuator {
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        self.calls.borrow_mut().push(step.clone());
        self.script.borrow_mut().pop_front().unwrap_or(Ok(StepOutcome::Done))
    }
}
