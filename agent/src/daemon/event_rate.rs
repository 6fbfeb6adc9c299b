//! The per-device cap on events about a device's state: at most one sent at once per device a
//! second, the rest folded into one sent when that second is up.
//!
//! Mount churn on a busy node (pods starting, a CSI plugin remounting, processes coming and going
//! on a volume) can change one device's holders, and with them its verdict (`in_use` <->
//! `unused`), many times a second, and every change would go to every watcher and, through the
//! console, to the fleet. A state event (`holders_changed`, `verdict_changed`) that comes less
//! than [`EVERY`] after the device's previous event *sent at once* is held back; later ones fold
//! into it, and it is sent when that second is up (a second after the event sent at once):
//!
//! - carrying the device as it is now (`current`, the latest);
//! - saying how many changes it stands for (`coalesced`, and the message: which kinds, the verdict
//!   from the one watchers last saw to the one now, the number of holders now);
//! - as a `verdict_changed` when the verdict differs from the one last sent, else a
//!   `holders_changed`.
//!
//! The second counts from the device's last event sent at once, never from a folded one sent
//! later: a change that comes at least [`EVERY`] after the previous change the device sent at
//! once goes at once, however recently a folded event went. (Counted from the folded event, a
//! change paced a little over a second apart could be held behind an older one: an unmount sent
//! at once, its filesystem's end a moment later held and sent a second later, and the next mount,
//! a second after the unmount, held again ~0.9 s behind that end.) A change is one scan's (or
//! re-read's) view: its `holders_changed` and the `verdict_changed` it caused come in the same
//! view, and go together. So a device's state events in any second stand for at most two sends:
//! one change sent at once (with its verdict) and one folded event; under continuous churn about
//! that, whatever the rate of its changes.
//!
//! A device added or removed, one that stops or starts answering I/O (rare, and an alarm) and an
//! action are never held: they go at once, after the device's held event if there is one, so a
//! watcher never sees a device's events out of order. They do not start the device's second.
//!
//! On by default (`cap_device_events = true`; `serve --no-cap-device-events` or the config set to
//! false turns it off). Held events are sent by [`EventRate::flush_held`], which sleeps while
//! nothing is held (woken by the first held event, then until the earliest one is due): an idle
//! agent does not wake for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use super::events::{AgentEvent, EventKind};

/// At most one state event sent at once per device this often.
pub const EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
struct Slot {
    /// When this device's latest state event sent at once went out (a folded one sent later
    /// does not move it: the device's second counts from this).
    at_once: Instant,
    /// The scan whose view that event showed, if it was a scan's (its other state events, from
    /// the same change, go with it).
    scan: u64,
    /// The verdict the device's latest state event showed, at once or folded (what watchers
    /// last saw).
    verdict: Option<&'static str>,
    /// The events held back since, in order.
    held: Vec<AgentEvent>,
}

impl Slot {
    /// The held events folded into one, to send now (then the device's latest; its second still
    /// counts from the event sent at once).
    fn send_held(&mut self) -> Option<AgentEvent> {
        let e = fold(self.verdict, std::mem::take(&mut self.held))?;
        self.scan = 0;
        self.verdict = verdict_of(&e).or(self.verdict);
        Some(e)
    }
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
    /// Off (`cap_device_events = false`; [`Default`] is off too): every event goes at once.
    on: bool,
    slots: Mutex<HashMap<String, Slot>>,
    /// Told when a device's first event is held: the flusher, asleep, looks again.
    held: Notify,
    /// How often the flusher woke and looked (tests, debugging).
    wakes: AtomicU64,
}

impl EventRate {
    /// The cap, on or off.
    pub fn new(on: bool) -> Self {
        Self { on, ..Self::default() }
    }

    /// How often [`EventRate::flush_held`] has woken to look at held events.
    pub fn wakes(&self) -> u64 {
        self.wakes.load(Ordering::Relaxed)
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
                _ => slots.get_mut(&e.device).and_then(Slot::send_held),
            };
            return held.into_iter().chain(std::iter::once(e)).collect();
        }
        match slots.get_mut(&e.device) {
            // The same change as the event that just went (its verdict after its holders).
            Some(slot) if e.scan != 0 && e.scan == slot.scan && slot.held.is_empty() => {
                slot.verdict = verdict_of(&e).or(slot.verdict);
                vec![e]
            }
            Some(slot) if now.saturating_duration_since(slot.at_once) < EVERY => {
                tracing::debug!(
                    device = %e.device,
                    scan = e.scan,
                    previous_scan = slot.scan,
                    since_ms = now.saturating_duration_since(slot.at_once).as_millis() as u64,
                    "state event held back (at most one a second per device at once)"
                );
                if slot.held.is_empty() {
                    self.held.notify_one();
                }
                slot.held.push(e);
                Vec::new()
            }
            // A second since the device's last event sent at once: this one goes at once, after
            // what is still held if the flusher has not sent it yet (older first, never lost).
            old => {
                let mut out: Vec<AgentEvent> = old.and_then(Slot::send_held).into_iter().collect();
                let slot = Slot { at_once: now, scan: e.scan, verdict: verdict_of(&e), held: Vec::new() };
                slots.insert(e.device.clone(), slot);
                out.push(e);
                out
            }
        }
    }

    /// When the earliest held event is due (none held: `None`).
    pub fn next_due(&self) -> Option<Instant> {
        self.slots().values().filter(|s| !s.held.is_empty()).map(|s| s.at_once + EVERY).min()
    }

    /// Sends the held events through `send` when their second is up, until `shutdown` changes (or
    /// its sender is gone). Sleeps while nothing is held: woken by the first held event, then
    /// until the earliest held one is due.
    pub async fn flush_held(&self, mut send: impl FnMut(AgentEvent), mut shutdown: watch::Receiver<bool>) {
        loop {
            // A permit stored by a hold since the last look wakes this at once: none is lost.
            let held = self.held.notified();
            let until = self.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = held => {}
                _ = sleep_until(until) => {}
                _ = shutdown.changed() => return,
            }
            self.wakes.fetch_add(1, Ordering::Relaxed);
            for e in self.due(Instant::now()) {
                send(e);
            }
        }
    }

    /// The held events whose second is up, each folded into one. Devices quiet for ten seconds
    /// are forgotten (when the flusher next looks; a device's slot is small, one per name).
    pub fn due(&self, now: Instant) -> Vec<AgentEvent> {
        let mut out = Vec::new();
        let mut slots = self.slots();
        for slot in slots.values_mut() {
            if slot.held.is_empty() || now.saturating_duration_since(slot.at_once) < EVERY {
                continue;
            }
            out.extend(slot.send_held());
        }
        slots.retain(|_, s| !s.held.is_empty() || now.saturating_duration_since(s.at_once) < EVERY * 10);
        out
    }
}

/// Sleeps until `until`, or for ever if there is none.
async fn sleep_until(until: Option<tokio::time::Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
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
        "{}: {count} changes ({}) in the last second, folded into one (at most one event per device a second at once): {verdict}, {holders} holder(s) now",
        e.device,
        names.join(", ")
    );
    e.coalesced = (count - 1) as u32;
    Some(e)
}

#[cfg(test)]
#[path = "event_rate_tests.rs"]
mod tests;
