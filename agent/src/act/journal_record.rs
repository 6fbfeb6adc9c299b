//! The journal's records as types: one [`Record`] a line, tagged by its `phase` (`plan`,
//! `plan_end`, `intent`, `result`, `recovered`, `rotated`), and the words a record carries as
//! enums ([`StepResult`], [`Resolution`], [`PlanEndResult`]) serialised as the words themselves.
//!
//! The on-disk format is the one the journal has always had, byte for byte:
//! - an intent, a result, a recovered record and the rotated note write their fields in this
//!   order: `ts`, `id`, `phase`, then their own (`step`, `plan`?, `index`?, `writer`; `result`,
//!   `detail`?; `result`, `detail`; `detail`), a field that is absent left out;
//! - a plan and a plan's end write every key in alphabetical order, at every level (they were
//!   JSON objects built whole), an absent optional field as `null`;
//! - a journaled step (an intent's `step`, a plan's `steps[].step`) has its keys in alphabetical
//!   order too.
//!
//! Reading ([`Record::parse`]) tolerates fields it does not know (a later version's). A line
//! that is not a record (a torn write, garbage, a phase or a word this version does not know) is
//! `None`, and the journal skips it as it always did: an intent whose result cannot be read stays
//! open and is re-checked by recovery, a plan whose end cannot be read is re-checked when resumed.
//!
//! What an intent's step or a plan's steps say is read into types where it is used
//! ([`Intent::step`], [`crate::engine::workflow::journaled_plan`]), so that a step this version
//! cannot read keeps its record (reported as malformed, or closed as unreadable) instead of
//! vanishing with it.

use serde::ser::{Error as _, SerializeMap};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

use super::journal_writer::Writer;
use crate::model::DevNum;
use crate::plan::pod_volume::DirStep;
use crate::plan::Action;

/// How a step ended (a `result` record's `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepResult {
    /// The change was made and verified.
    Done,
    /// What the step removes was gone already.
    AlreadyAbsent,
    /// The kernel finishes it later (at the device's last close).
    Deferred,
    /// Not run: a step it depends on did not finish.
    Skipped,
    /// Refused by a re-check, or the kernel said no.
    Failed,
}

impl StepResult {
    pub const ALL: [StepResult; 5] = [
        StepResult::Done,
        StepResult::AlreadyAbsent,
        StepResult::Deferred,
        StepResult::Skipped,
        StepResult::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StepResult::Done => "done",
            StepResult::AlreadyAbsent => "already_absent",
            StepResult::Deferred => "deferred",
            StepResult::Skipped => "skipped",
            StepResult::Failed => "failed",
        }
    }

    /// The step finished (done, or nothing to do): a resumed plan does not run it again. A
    /// deferred step did not: its device is there until its last opener closes it.
    pub fn is_finished(self) -> bool {
        matches!(self, StepResult::Done | StepResult::AlreadyAbsent)
    }
}

/// How recovery closed an interrupted step (a `recovered` record's `result`; see
/// [`crate::engine::recover`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// Nothing has the step's device number any more.
    Gone,
    /// The same device, with the step's effect visible.
    InPlace,
    /// The number stands for another device now: the step is never repeated against it.
    IdentityChanged,
    /// The same device, the effect not in place: planned again.
    Replan,
}

impl Resolution {
    pub const ALL: [Resolution; 4] =
        [Resolution::Gone, Resolution::InPlace, Resolution::IdentityChanged, Resolution::Replan];

    pub fn as_str(self) -> &'static str {
        match self {
            Resolution::Gone => "gone",
            Resolution::InPlace => "in_place",
            Resolution::IdentityChanged => "identity_changed",
            Resolution::Replan => "replan",
        }
    }

    /// The step took effect: a resumed plan counts it finished.
    pub fn is_finished(self) -> bool {
        matches!(self, Resolution::Gone | Resolution::InPlace)
    }
}

/// How a plan's run ended (a `plan_end` record's `result`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PlanEndResult {
    /// Every step finished.
    Finished,
    /// Some step did not (or the plan was closed without running them: its device changed).
    Incomplete,
    /// An unfinished plan of an earlier run, finished by a re-run.
    Resumed,
    /// What the plan was about is gone.
    Gone,
    /// The plan record cannot be read back into a plan: closed, not resumed.
    Unreadable,
}

impl PlanEndResult {
    pub fn as_str(self) -> &'static str {
        match self {
            PlanEndResult::Finished => "finished",
            PlanEndResult::Incomplete => "incomplete",
            PlanEndResult::Resumed => "resumed",
            PlanEndResult::Gone => "gone",
            PlanEndResult::Unreadable => "unreadable",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(StepResult, Resolution, PlanEndResult);

/// One line of the journal.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Record {
    Plan(Box<PlanRecord>),
    PlanEnd(PlanEnd),
    Intent(Intent),
    Result(StepEnd),
    Recovered(Recovered),
    Rotated(Rotated),
}

impl Record {
    /// The record on a line (without its newline); `None` when the line is not one (see the
    /// module docs).
    pub fn parse(line: &[u8]) -> Option<Record> {
        serde_json::from_slice(line).ok()
    }

    /// The line the journal writes for it, newline included.
    pub fn to_line(&self) -> serde_json::Result<Vec<u8>> {
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        Ok(line)
    }

    /// The record's ID (a `rotated` note's is `rotate-<pid>`, or empty).
    pub fn id(&self) -> &str {
        match self {
            Record::Plan(r) => &r.id,
            Record::PlanEnd(r) => &r.id,
            Record::Intent(r) => &r.id,
            Record::Result(r) => &r.id,
            Record::Recovered(r) => &r.id,
            Record::Rotated(r) => &r.id,
        }
    }
}

impl Serialize for Record {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Record::Plan(r) => r.serialize(s),
            Record::PlanEnd(r) => r.serialize(s),
            Record::Intent(r) => r.serialize(s),
            Record::Result(r) => r.serialize(s),
            Record::Recovered(r) => r.serialize(s),
            Record::Rotated(r) => r.serialize(s),
        }
    }
}

/// The intent to run a step, written before it touches the kernel.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Intent {
    #[serde(default)]
    pub ts: f64,
    pub id: String,
    /// The step as journaled: a device's [`crate::plan::Step`] (`device`, `devnum`, `identity`
    /// and its action's fields) or a pod volume directory's [`DirStep`]; read with
    /// [`Intent::step`].
    #[serde(default)]
    pub step: Value,
    /// The plan it belongs to, and the step's place in it.
    #[serde(default)]
    pub plan: Option<String>,
    #[serde(default)]
    pub index: Option<usize>,
    /// The process that wrote it (records of old versions have none: [`Intent::writer`]).
    #[serde(default)]
    pub writer: Option<Writer>,
}

impl Serialize for Intent {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("ts", &self.ts)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("phase", "intent")?;
        m.serialize_entry("step", &self.step)?;
        if let Some(plan) = &self.plan {
            m.serialize_entry("plan", plan)?;
        }
        if let Some(index) = &self.index {
            m.serialize_entry("index", index)?;
        }
        if let Some(writer) = &self.writer {
            m.serialize_entry("writer", writer)?;
        }
        m.end()
    }
}

/// A journaled step, read into its type.
#[derive(Debug, Clone, PartialEq)]
pub enum JournaledStep {
    /// A step on a block device, planned for the device with that identity token.
    Device { device: String, devnum: DevNum, identity: String, action: Action },
    /// An `rmdir` of a pod volume directory.
    Dir(DirStep),
}

impl JournaledStep {
    /// The action's name ([`crate::plan::ActionKind::as_str`], [`DirStep::ACTION`]).
    pub fn action_name(&self) -> &'static str {
        match self {
            JournaledStep::Device { action, .. } => action.name(),
            JournaledStep::Dir(_) => DirStep::ACTION,
        }
    }
}

impl Intent {
    /// The process that wrote it: its `writer`, or for a record written before records named
    /// one, the PID in its ID (no start time, no boot).
    pub fn writer(&self) -> Option<Writer> {
        Writer::of(self.writer.as_ref(), &self.id)
    }

    /// Whether its step is a pod volume directory's `rmdir`.
    pub fn is_dir_step(&self) -> bool {
        self.step.get("action").and_then(Value::as_str) == Some(DirStep::ACTION)
    }

    /// Its step, read into its type; why not, naming the intent and the field, when it is
    /// malformed.
    pub fn step(&self) -> Result<JournaledStep, String> {
        let id = &self.id;
        let step = &self.step;
        if !step.is_object() {
            return Err(format!("intent {id} has no step"));
        }
        if self.is_dir_step() {
            return serde_json::from_value(step.clone())
                .map(JournaledStep::Dir)
                .map_err(|e| format!("intent {id}: {e}"));
        }
        let text = |k: &str| {
            step.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .ok_or_else(|| format!("intent {id}: no step.{k}"))
        };
        let device = text("device")?;
        let devnum: DevNum =
            step.get("devnum").cloned().ok_or_else(|| format!("intent {id}: no step.devnum")).and_then(
                |d| serde_json::from_value(d).map_err(|e| format!("intent {id}: step.devnum: {e}")),
            )?;
        let identity = text("identity")?;
        let word = text("action")?;
        let action: Action = serde_json::from_value(step.clone())
            .map_err(|e| format!("intent {id}: step.action {word}: {e}"))?;
        Ok(JournaledStep::Device { device, devnum, identity, action })
    }
}

/// How a step ended, written after it ran (phase `result`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct StepEnd {
    #[serde(default)]
    pub ts: f64,
    pub id: String,
    pub result: StepResult,
    /// Left out when empty.
    #[serde(default)]
    pub detail: Option<String>,
}

impl Serialize for StepEnd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("ts", &self.ts)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("phase", "result")?;
        m.serialize_entry("result", &self.result)?;
        if let Some(detail) = &self.detail {
            m.serialize_entry("detail", detail)?;
        }
        m.end()
    }
}

/// An interrupted step closed by recovery: the intent's `id`, how and what was found.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Recovered {
    #[serde(default)]
    pub ts: f64,
    pub id: String,
    pub result: Resolution,
    #[serde(default)]
    pub detail: String,
}

impl Serialize for Recovered {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("ts", &self.ts)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("phase", "recovered")?;
        m.serialize_entry("result", &self.result)?;
        m.serialize_entry("detail", &self.detail)?;
        m.end()
    }
}

/// The note a rotation leaves at the head of the new file.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Rotated {
    #[serde(default)]
    pub ts: f64,
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub detail: Option<String>,
}

impl Serialize for Rotated {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("ts", &self.ts)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("phase", "rotated")?;
        if let Some(detail) = &self.detail {
            m.serialize_entry("detail", detail)?;
        }
        m.end()
    }
}

/// The end of a plan: every step of it has a result, or will never run.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanEnd {
    #[serde(default)]
    pub ts: f64,
    pub id: String,
    pub result: PlanEndResult,
    #[serde(default)]
    pub detail: String,
}

impl Serialize for PlanEnd {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Alphabetical, as the object it always was.
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("detail", &self.detail)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("phase", "plan_end")?;
        m.serialize_entry("result", &self.result)?;
        m.serialize_entry("ts", &self.ts)?;
        m.end()
    }
}

/// A whole plan, journaled before its first intent: what a re-run needs to finish it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct PlanRecord {
    #[serde(default)]
    pub ts: f64,
    pub id: String,
    #[serde(default)]
    pub writer: Option<Writer>,
    #[serde(flatten)]
    pub body: PlanBody,
}

impl PlanRecord {
    /// The process that wrote it (as [`Intent::writer`]).
    pub fn writer(&self) -> Option<Writer> {
        Writer::of(self.writer.as_ref(), &self.id)
    }
}

impl Serialize for PlanRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Alphabetical at every level, as the object it always was: through a JSON value,
        // whose objects keep their keys sorted.
        let mut v = serde_json::to_value(&self.body).map_err(S::Error::custom)?;
        let m = v.as_object_mut().ok_or_else(|| S::Error::custom("a plan body is an object"))?;
        m.insert("ts".into(), self.ts.into());
        m.insert("id".into(), self.id.clone().into());
        m.insert("phase".into(), "plan".into());
        if let Some(w) = &self.writer {
            m.insert("writer".into(), serde_json::to_value(w).map_err(S::Error::custom)?);
        }
        v.serialize(s)
    }
}

/// A plan record's own fields ([`crate::engine::workflow`] writes them). Every field may be
/// missing when read (an absent one is empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanBody {
    pub request: PlanRequest,
    /// The device the plan is for: its name, number and identity token.
    pub device: String,
    pub devnum: Option<DevNum>,
    pub identity: String,
    /// Its identity's parts ([`crate::graph::identity::Identity`]).
    pub identity_parts: Value,
    /// Every device the plan's steps act on, with what names it.
    pub devices: Vec<PlanDevice>,
    pub steps: Vec<PlanStep>,
    pub expected_openers: Vec<u32>,
    /// The operator's reason for detaching despite process users (`--force-busy`).
    pub force_busy: Option<String>,
    pub notes: Vec<String>,
}

/// What the operator asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanRequest {
    /// The argument as given (`/dev/mapper/mpatha`, `sdb`, `8:16`...).
    pub argument: String,
    /// The plan's operation (`clean`, `release`, `teardown`...).
    pub operation: String,
    /// Who asked.
    pub by: String,
}

/// A device a plan acts on, by every name an operator may use for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanDevice {
    #[serde(default)]
    pub name: String,
    pub devnum: DevNum,
    #[serde(default)]
    pub identity: String,
    #[serde(default)]
    pub dm_name: Option<String>,
    #[serde(default)]
    pub uuid: Option<String>,
    #[serde(default)]
    pub wwid: Option<String>,
}

/// A step of a journaled plan: the step as journaled ([`crate::plan::Step`]) and its device's
/// identity parts, read back by [`crate::engine::workflow::journaled_plan`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlanStep {
    pub step: Value,
    pub identity_parts: Value,
}

#[cfg(test)]
#[path = "journal_record_tests.rs"]
mod tests;
