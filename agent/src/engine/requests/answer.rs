//! The types the engine's answers are made of, for a front that writes its own text of them
//! (the agent's one-shot report of a request, `cli/render.rs`): an [`crate::engine::outcome::Outcome`]
//! carries a plan, its step reports and the scans of its device, with holders. They are defined
//! by the stages that make them and named here, so that a front reads an answer through the
//! engine alone. A front that prints the wire (JSON, YAML, `scan`'s and `holders`' tables) needs
//! none of them ([`crate::engine::wire`]). Types only, and the one accessor of a device's stack
//! layer; no stage's work.

pub use crate::act::journal::StepResult;
pub use crate::act::StepReport;
pub use crate::discover::scsi::Transport as ScsiTransport;
pub use crate::graph::identity::Identity;
pub use crate::graph::scan::Scan;
pub use crate::graph::stack::layer_of;
pub use crate::graph::{DeviceEntry, Holder};
pub use crate::plan::Plan;
