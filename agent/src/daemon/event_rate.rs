//! The per-device cap on events about a device's state: at most one a second per device.
//!
//! Mount churn on a busy node (pods starting, a CSI plugin remounting, processes coming and going
//! on a volume) can change one device's holders, and with them its verdict (`in_use` <->
//! `unused`), many times a second, and every change would go to every watcher and, through the
//! console, to the fleet. A state event (`holders_changed`, `verdict_changed`) that comes less
//! than [`EVERY`] after the device's previous one is held back; later ones fold into it, and it is
//! sent once the second is up:
//!
//! - carrying the device as it is now (`current`, the latest);
//! - saying how many changes it stands for (`coalesced`, and the message: which kinds, the verdict
//!   from the one watchers last saw to the one now, the number of holders now);
//! - as a `verdict_changed` when the verdict differs from the one last sent, else a
//!   `holders_changed`.
//!
//! A device added or removed, one that stops or starts answering I/O (rare, and an alarm) and an
//! action are never held: they go at once, after the device's held event if there is one, so a
//! watcher never sees a device's events out of order.
//!
//! Off by default (`cap_device_events`, `serve --cap-device-events`): the cap trades latency for
//! volume, and a second change of one device within its second reaches watchers up to a second
//! late, where issue 20 asks a mount to be visible within milliseconds whatever came before it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::events::{AgentEvent, EventKind};

/// At most one state event per device this often.
pub const EVERY: Duration = Duration::from_secs(1);

/// How often held events are looked at (the delay past the second a held event may see).
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Slot {
    /// When this device's latest state event went out.
    sent: Instant,
    /// The verdict that event showed (what watchers last saw).
    verdict: Option<&'static str>,
    /// The events held back since, in order.
    held: Vec<AgentEvent>,
}

fn is_state(kind: EventKind) -> bool {
    matches!(kind, EventKind::HoldersChanged | EventKind::VerdictChanged)
}

fn verdict_of(e: &AgentEvent) -> Option<&'static str> {
    e.current.as_ref().map(|d| d.judgement.verdict.as_str())
}

/// The cap's state: per device, when its last state event was sent and what is held.
#[derive(Debug, Default)]
pub struct EventRate {
    /// Off (the default, `cap_device_events = false`): every event goes at once.
    on: bool,
    slots: Mutex<HashMap<String, Slot>>,
}

impl EventRate {
    /// The cap, on or off.
    pub fn new(on: bool) -> Self {
        Self { on, slots: Mutex::default() }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The events to send now for `e`, in order (none: held back).
    pub fn admit(&self, e: AgentEvent, now: Instant) -> Vec<AgentEvent> {
        if !self.on {
            return vec![e];
        }
        let mut slots = self.slots();
        if !is_state(e.kind) {
            let held = match e.kind {
                EventKind::DeviceRemoved => slots.remove(&e.device).and_then(|s| fold(s.verdict, s.held)),
                _ => slots.get_mut(&e.device).and_then(|s| {
                    s.sent = now;
                    fold(s.verdict, std::mem::take(&mut s.held))
                }),
            };
            return held.into_iter().chain(std::iter::once(e)).collect();
        }
        match slots.get_mut(&e.device) {
            Some(slot) if now.saturating_duration_since(slot.sent) < EVERY => {
                slot.held.push(e);
                Vec::new()
            }
            _ => {
                slots.insert(e.device.clone(), Slot { sent: now, verdict: verdict_of(&e), held: Vec::new() });
                vec![e]
            }
        }
    }

    /// The held events whose second is up, each folded into one. Devices quiet for a while are
    /// forgotten.
    pub fn due(&self, now: Instant) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        let mut slots = self.slots();
        for slot in slots.values_mut() {
            if slot.held.is_empty() || now.saturating_duration_since(slot.sent) < EVERY {
                continue;
            }
            if let Some(e) = fold(slot.verdict, std::mem::take(&mut slot.held)) {
                slot.sent = now;
                slot.verdict = verdict_of(&e).or(slot.verdict);
                out.push(e);
            }
        }
        slots.retain(|_, s| !s.held.is_empty() || now.saturating_duration_since(s.sent) < EVERY * 10);
        out
    }
}

/// One event standing for `held` (in order), watchers having last seen verdict `seen`.
fn fold(seen: Option<&'static str>, mut held: Vec<AgentEvent>) -> Option<AgentEvent> {
    if held.len() <= 1 {
        return held.pop();
    }
    let kinds: Vec<EventKind> = held.iter().map(|e| e.kind).collect();
    let count = held.len() + held.iter().map(|e| e.coalesced as usize).sum::<usize>();
    let mut e = held.pop()?;
    let now = verdict_of(&e);
    e.kind = if now.is_some() && now != seen { EventKind::VerdictChanged } else { EventKind::HoldersChanged };
    let mut names: Vec<&str> = Vec::new();
    for k in kinds {
        let n = if k == EventKind::VerdictChanged { "verdict" } else { "holders" };
        if !names.contains(&n) {
            names.push(n);
        }
    }
    let verdict = match (seen, now) {
        (Some(a), Some(b)) if a != b => format!("verdict {a} -> {b}"),
        (_, Some(b)) => format!("verdict {b}"),
        _ => "verdict unknown".to_owned(),
    };
    let holders = e.current.as_ref().map_or(0, |d| d.entry.holders.len());
    e.message = format!(
        "{}: {count} changes ({}) in the last second, folded into one (at most one event per device a second): {verdict}, {holders} holder(s) now",
        e.device,
        names.join(", ")
    );
    e.coalesced = (count - 1) as u32;
    Some(e)
}

#[cfg(test)]
#[path = "event_rate_tests.rs"]
mod tests;
