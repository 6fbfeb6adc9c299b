//! What changed between two scans, and what the agent did: the stream `WatchEvents` serves.
//!
//! A protected device (the root disk, kubelet's and the runtimes' disks) is never acted on, and the
//! processes working on it come and go all the time: its holders are sent summarised, one per
//! kind with the number of processes, and a change of them is an event only when a kind of holder
//! appears or goes (not at every process that starts or exits), so an idle node stays quiet.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use serde::Serialize;

use crate::engine::view::{DeviceView, View};
use crate::graph::by_kind::count_by_kind;
use crate::graph::Holder;

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
    /// A device stopped answering I/O, or answers again ([`crate::judge::stall`]).
    ResponsivenessChanged,
    /// The node's pin risks changed ([`crate::graph::pin_risks`]): the event carries them all.
    PinRisksChanged,
}

/// One event.
#[derive(Debug, Clone, Serialize)]
pub struct AgentEvent {
    pub kind: EventKind,
    pub device: String,
    pub time: SystemTime,
    pub message: String,
    /// The device as it is now (none once removed).
    pub current: Option<Arc<DeviceView>>,
    /// The scan generation whose view showed the change (0: not a scan's).
    pub scan: u64,
    /// Earlier `holders_changed` of this device that the per-device cap held back and this one
    /// stands for ([`super::event_rate`]).
    pub coalesced: u32,
    /// `PinRisksChanged` only: the node's pin risks now.
    #[serde(skip)]
    pub pin_risks: Option<Arc<crate::graph::pin_risks::PinReport>>,
}

impl AgentEvent {
    pub fn new(kind: EventKind, device: &str, message: String, current: Option<Arc<DeviceView>>) -> Self {
        Self {
            kind,
            device: device.to_owned(),
            time: SystemTime::now(),
            message,
            current,
            scan: 0,
            coalesced: 0,
            pin_risks: None,
        }
    }

    /// The node's pin risks changed to `report`.
    pub fn pin_risks(report: &Arc<crate::graph::pin_risks::PinReport>) -> Self {
        let known = report.known().count();
        let unknown = report.risks.len() - known;
        let mut message =
            format!("pin risks: {known} mount namespace(s) hold private copies of live host mounts");
        if unknown > 0 {
            message.push_str(&format!(", {unknown} could not be judged"));
        }
        if let Some(why) = &report.unknown {
            message = format!("pin risks unknown: {why}");
        }
        Self {
            pin_risks: Some(Arc::clone(report)),
            ..Self::new(EventKind::PinRisksChanged, "", message, None)
        }
    }
}

/// Holders equal but for their processes' run state (which flips between R and S all the time).
/// A holder is copied only where the states differ: a device held thousands of times (a node's
/// image disk, mapped by every container) is compared without an allocation.
fn same_holders(a: &[crate::graph::Holder], b: &[crate::graph::Holder]) -> bool {
    let strip = |h: &crate::graph::Holder| crate::graph::Holder { process_state: None, ..h.clone() };
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x == y || (x.process_state != y.process_state && strip(x) == strip(y)))
}

/// How many holders of `a` are not in `b`, and of `b` not in `a`. The lists are in the scan's
/// order, stable between scans, so they are walked side by side: where they differ, the holder
/// of either list is looked for a few places ahead in the other, and the run before it is
/// taken as added or gone (a new pod's holders land as a few short runs among thousands). A
/// holder matched in place is in both lists; only the few left unmatched are looked for in the
/// whole other list, which keeps the count exact. One pass, no index of thousands of holders.
fn counts_gone_new(a: &[Holder], b: &[Holder]) -> (usize, usize) {
    let (unmatched_a, unmatched_b) = unmatched(a, b);
    (missing_from(&unmatched_a, &unmatched_b, b), missing_from(&unmatched_b, &unmatched_a, a))
}

/// How far ahead a holder is looked for in the other list where the two differ.
const LOOK_AHEAD: usize = 16;

/// The holders of `a` and of `b` not matched in place by walking the two side by side.
fn unmatched<'h>(a: &'h [Holder], b: &'h [Holder]) -> (Vec<&'h Holder>, Vec<&'h Holder>) {
    let (mut only_a, mut only_b) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i] == b[j] {
            (i, j) = (i + 1, j + 1);
            continue;
        }
        let ahead = |list: &[Holder], from: usize, h: &Holder| {
            list[from..].iter().take(LOOK_AHEAD).position(|x| x == h).map(|p| p + 1)
        };
        // `b[j]` a few places on in `a`: those before it are gone; `a[i]` on in `b`: added.
        match (ahead(a, i + 1, &b[j]), ahead(b, j + 1, &a[i])) {
            (Some(gone), Some(added)) if added < gone => {
                only_b.extend(&b[j..j + added]);
                j += added;
            }
            (Some(gone), _) => {
                only_a.extend(&a[i..i + gone]);
                i += gone;
            }
            (None, Some(added)) => {
                only_b.extend(&b[j..j + added]);
                j += added;
            }
            (None, None) => {
                only_a.push(&a[i]);
                only_b.push(&b[j]);
                (i, j) = (i + 1, j + 1);
            }
        }
    }
    only_a.extend(&a[i..]);
    only_b.extend(&b[j..]);
    (only_a, only_b)
}

/// How many of `some` are not in `all`, looking in `near` (a part of `all`) first.
fn missing_from(some: &[&Holder], near: &[&Holder], all: &[Holder]) -> usize {
    const FEW: usize = 8;
    if some.len() < FEW {
        return some.iter().filter(|h| !all.contains(h)).count();
    }
    let near = HolderIndex::new(near.iter().copied());
    let unfound: Vec<&Holder> = some.iter().copied().filter(|h| !near.contains(h)).collect();
    if unfound.len() < FEW {
        return unfound.into_iter().filter(|h| !all.contains(h)).count();
    }
    let all = HolderIndex::new(all.iter());
    unfound.into_iter().filter(|h| !all.contains(h)).count()
}

/// Holders looked up by a few identifying fields, then compared in full (a new pod's holders
/// land at several places in a list of thousands: searching each in the whole list was
/// quadratic, about 12 ms a publish for the image disk's 1,800 holders). The first holder of
/// each key is in a map and the others follow in a chain: no allocation per key.
struct HolderIndex<'a> {
    holders: Vec<&'a Holder>,
    first: HashMap<HolderKey, usize>,
    next: Vec<usize>,
}

type HolderKey = (crate::model::HolderKind, Option<u32>, Option<crate::model::MountNsId>, Option<u32>);

impl<'a> HolderIndex<'a> {
    const END: usize = usize::MAX;

    fn key(h: &Holder) -> HolderKey {
        (h.kind, h.pids.first().copied(), h.mount_namespace, h.mount_id)
    }

    fn new(holders: impl Iterator<Item = &'a Holder>) -> Self {
        let holders: Vec<&Holder> = holders.collect();
        let mut first = HashMap::with_capacity(holders.len());
        let mut next = vec![Self::END; holders.len()];
        for (i, h) in holders.iter().enumerate().rev() {
            if let Some(after) = first.insert(Self::key(h), i) {
                next[i] = after;
            }
        }
        Self { holders, first, next }
    }

    fn contains(&self, h: &Holder) -> bool {
        let mut at = self.first.get(&Self::key(h)).copied().unwrap_or(Self::END);
        while at != Self::END {
            if self.holders[at] == h {
                return true;
            }
            at = self.next[at];
        }
        false
    }
}

/// Holders as events carry them for a protected device: one per kind (in the order the kinds are
/// first seen), with the number of holders of that kind and the processes behind them, and no
/// per-process detail.
pub fn summarised(holders: &[crate::graph::Holder]) -> Vec<crate::graph::Holder> {
    count_by_kind(holders.iter().map(|h| (h.kind, h.pid_count)))
        .into_iter()
        .map(|(kind, count)| crate::graph::Holder { pid_count: count, ..crate::graph::Holder::bare(kind) })
        .collect()
}

/// The kinds of holder present, each once.
fn holder_kinds(holders: &[crate::graph::Holder]) -> Vec<crate::model::HolderKind> {
    count_by_kind(holders.iter().map(|h| (h.kind, h.pid_count))).into_iter().map(|(kind, _)| kind).collect()
}

/// A summary line of a protected device's holders: `2 mount, 140 cwd`.
fn summary_line(holders: &[crate::graph::Holder]) -> String {
    let parts: Vec<String> =
        summarised(holders).iter().map(|h| format!("{} {}", h.pid_count, h.kind.as_str())).collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

fn is_protected(d: &DeviceView) -> bool {
    d.judgement.verdict == crate::judge::Verdict::Protected
}

/// The device as an event carries it: a protected device's holders summarised (a copy), any
/// other shared with the view.
fn for_event(d: &Arc<DeviceView>) -> Arc<DeviceView> {
    if !is_protected(d) {
        return Arc::clone(d);
    }
    let mut d = DeviceView::clone(d);
    d.entry.holders = summarised(&d.entry.holders);
    Arc::new(d)
}

/// A device's I/O stopped completing, or completes again.
fn responsiveness(d: &Arc<DeviceView>) -> AgentEvent {
    let name = d.entry.device.name.as_str();
    let message = match &d.unresponsive {
        Some(s) => format!("{name}: {}", s.describe()),
        None => format!("{name}: answers again (its I/O completes)"),
    };
    AgentEvent::new(EventKind::ResponsivenessChanged, name, message, Some(for_event(d)))
}

/// Events that turn `old` into `new`. Devices are matched by name and number, so a reused name
/// shows as removed then added.
pub fn diff(old: &View, new: &View) -> Vec<AgentEvent> {
    let key = |d: &DeviceView| (d.entry.device.name.clone(), d.entry.device.devnum);
    let before: HashMap<_, &Arc<DeviceView>> = old.devices.iter().map(|d| (key(d), d)).collect();
    let after: HashMap<_, &Arc<DeviceView>> = new.devices.iter().map(|d| (key(d), d)).collect();
    let mut out = Vec::new();
    for d in &new.devices {
        let name = d.entry.device.name.as_str();
        match before.get(&key(d)) {
            None => out.push(AgentEvent::new(
                EventKind::DeviceAdded,
                name,
                format!("{name} ({}, {}) appeared", d.entry.device.devnum, d.entry.device.kind.as_str()),
                Some(for_event(d)),
            )),
            // Kept from the previous view by a re-read that did not touch it: nothing changed.
            Some(prev) if Arc::ptr_eq(prev, d) => {}
            Some(prev) => {
                if is_protected(d) {
                    if holder_kinds(&prev.entry.holders) != holder_kinds(&d.entry.holders) {
                        out.push(AgentEvent::new(
                            EventKind::HoldersChanged,
                            name,
                            format!(
                                "{name} (protected): holders by kind {} -> {}",
                                summary_line(&prev.entry.holders),
                                summary_line(&d.entry.holders)
                            ),
                            Some(for_event(d)),
                        ));
                    }
                } else if !same_holders(&prev.entry.holders, &d.entry.holders) {
                    let (gone, new) = counts_gone_new(&prev.entry.holders, &d.entry.holders);
                    out.push(AgentEvent::new(
                        EventKind::HoldersChanged,
                        name,
                        format!("{name}: {new} holder(s) added, {gone} gone, {} now", d.entry.holders.len()),
                        Some(Arc::clone(d)),
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
                        Some(for_event(d)),
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
    if new.pin_risks.checked && !old.pin_risks.same_findings(&new.pin_risks) {
        out.push(AgentEvent::pin_risks(&new.pin_risks));
    }
    for e in &mut out {
        e.scan = new.scan_number;
    }
    out
}

#[cfg(test)]
#[path = "events_tests.rs"]
pub(crate) mod tests;
