//! What changed between two scans, and what the agent did: the stream `WatchEvents` serves.

use std::collections::HashMap;
use std::time::SystemTime;

use serde::Serialize;

use crate::view::{DeviceView, View};

/// Kinds of change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    DeviceAdded,
    DeviceRemoved,
    HoldersChanged,
    VerdictChanged,
    ActionStarted,
    ActionFinished,
    /// A device stopped answering I/O, or answers again ([`crate::stall`]).
    ResponsivenessChanged,
}

/// One event.
#[derive(Debug, Clone, Serialize)]
pub struct AgentEvent {
    pub kind: EventKind,
    pub device: String,
    pub time: SystemTime,
    pub message: String,
    /// The device as it is now (none once removed).
    pub current: Option<DeviceView>,
    /// The scan generation whose view showed the change (0: not a scan's).
    pub scan: u64,
}

impl AgentEvent {
    pub fn new(kind: EventKind, device: &str, message: String, current: Option<DeviceView>) -> Self {
        Self { kind, device: device.to_owned(), time: SystemTime::now(), message, current, scan: 0 }
    }
}

/// Holders equal but for their processes' run state (which flips between R and S all the time).
fn same_holders(a: &[crate::graph::Holder], b: &[crate::graph::Holder]) -> bool {
    let strip = |h: &crate::graph::Holder| crate::graph::Holder { process_state: None, ..h.clone() };
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| strip(x) == strip(y))
}

/// A device's I/O stopped completing, or completes again.
fn responsiveness(d: &DeviceView) -> AgentEvent {
    let name = d.entry.device.name.as_str();
    let message = match &d.unresponsive {
        Some(s) => format!("{name}: {}", s.describe()),
        None => format!("{name}: answers again (its I/O completes)"),
    };
    AgentEvent::new(EventKind::ResponsivenessChanged, name, message, Some(d.clone()))
}

/// Events that turn `old` into `new`. Devices are matched by name and number, so a reused name
/// shows as removed then added.
pub fn diff(old: &View, new: &View) -> Vec<AgentEvent> {
    let key = |d: &DeviceView| (d.entry.device.name.clone(), d.entry.device.devnum);
    let before: HashMap<_, &DeviceView> = old.devices.iter().map(|d| (key(d), d)).collect();
    let after: HashMap<_, &DeviceView> = new.devices.iter().map(|d| (key(d), d)).collect();
    let mut out = Vec::new();
    for d in &new.devices {
        let name = d.entry.device.name.as_str();
        match before.get(&key(d)) {
            None => out.push(AgentEvent::new(
                EventKind::DeviceAdded,
                name,
                format!("{name} ({}, {}) appeared", d.entry.device.devnum, d.entry.device.kind.as_str()),
                Some(d.clone()),
            )),
            Some(prev) => {
                if !same_holders(&prev.entry.holders, &d.entry.holders) {
                    let gone = prev.entry.holders.iter().filter(|h| !d.entry.holders.contains(h)).count();
                    let new = d.entry.holders.iter().filter(|h| !prev.entry.holders.contains(h)).count();
                    out.push(AgentEvent::new(
                        EventKind::HoldersChanged,
                        name,
                        format!("{name}: {new} holder(s) added, {gone} gone, {} now", d.entry.holders.len()),
                        Some(d.clone()),
                    ));
                }
                if prev.unresponsive.is_some() != d.unresponsive.is_some() {
                    out.push(responsiveness(d));
                }
                if prev.judgement.verdict != d.judgement.verdict {
                    out.push(AgentEvent::new(
                        EventKind::VerdictChanged,
                        name,
                        format!(
                            "{name}: {} -> {}",
                            prev.judgement.verdict.as_str(),
                            d.judgement.verdict.as_str()
                        ),
                        Some(d.clone()),
                    ));
                }
            }
        }
    }
    for d in &old.devices {
        if !after.contains_key(&key(d)) {
            let name = d.entry.device.name.as_str();
            out.push(AgentEvent::new(EventKind::DeviceRemoved, name, format!("{name} went away"), None));
        }
    }
    for e in &mut out {
        e.scan = new.scan_number;
    }
    out
}
