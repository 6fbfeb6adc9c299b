//! What the gRPC service converts itself: a request's `operation` field, with the service's error
//! for a value the schema does not have, and the daemon's events. Everything else the service
//! answers with is the engine's, on the wire ([`crate::engine::wire`]).

use blockjanitor_proto::v1 as pb;

use crate::daemon::events::{AgentEvent, EventKind};
use crate::daemon::state::ApiError;
use crate::engine::wire::{device, pins, secs};
use crate::engine::Operation;

/// The engine's operation for a request's `operation` field (unset: a cleanup).
pub fn operation(op: i32) -> Result<Operation, ApiError> {
    crate::engine::wire::operation(op).ok_or_else(|| {
        ApiError::InvalidArgument(format!("unknown operation {op}: expected CLEAN (1) or RELEASE (2)"))
    })
}

pub fn event(e: &AgentEvent) -> pb::Event {
    let t = match e.kind {
        EventKind::DeviceAdded => pb::event::Type::DeviceAdded,
        EventKind::DeviceRemoved => pb::event::Type::DeviceRemoved,
        EventKind::HoldersChanged => pb::event::Type::HoldersChanged,
        EventKind::VerdictChanged => pb::event::Type::VerdictChanged,
        EventKind::ActionStarted => pb::event::Type::ActionStarted,
        EventKind::ActionFinished => pb::event::Type::ActionFinished,
        EventKind::ResponsivenessChanged => pb::event::Type::ResponsivenessChanged,
        EventKind::PinRisksChanged => pb::event::Type::PinRisksChanged,
    };
    pb::Event {
        r#type: t as i32,
        device: e.device.clone(),
        unix_seconds: secs(e.time),
        message: e.message.clone(),
        current: e.current.as_deref().map(device),
        scan: e.scan,
        coalesced: e.coalesced,
        pin_risks: e.pin_risks.as_deref().map(pins::pin_risks).unwrap_or_default(),
        pin_risks_complete: e.pin_risks.as_ref().is_some_and(|r| r.unknown.is_none()),
    }
}
