//! Tests of the per-device cap: one state event per device a second, the held ones folded into
//! one that says what it stands for, and every other event at once, after the device's held one.

use super::*;
use crate::daemon::events::tests::{device, process};
use crate::judge::Verdict;
use crate::model::HolderKind;

fn ev(kind: EventKind, name: &str, verdict: Verdict, holders: usize, message: &str) -> AgentEvent {
    let hs = (0..holders as u32).map(|p| process(HolderKind::Mount, 100 + p)).collect();
    AgentEvent::new(kind, name, message.into(), Some(device(name, 1, verdict, hs)))
}

fn bare(kind: EventKind, name: &str, message: &str) -> AgentEvent {
    AgentEvent::new(kind, name, message.into(), None)
}

fn lines(v: &[AgentEvent]) -> Vec<String> {
    v.iter().map(|e| format!("{:?} {}", e.kind, e.message)).collect()
}

#[test]
fn one_state_event_per_device_a_second_standing_for_the_rest() {
    let rate = EventRate::new(true);
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let (h, v) = (EventKind::HoldersChanged, EventKind::VerdictChanged);
    assert_eq!(rate.admit(ev(h, "loop1", Verdict::InUse, 1, "mounted"), at(0)).len(), 1);
    // Another device has its own second.
    assert_eq!(rate.admit(ev(h, "loop2", Verdict::InUse, 1, "x"), at(10)).len(), 1);
    // Unmounted (holders and verdict), mounted again, unmounted: held.
    assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 0, "unmounted"), at(100)).is_empty());
    assert!(rate.admit(ev(v, "loop1", Verdict::Unused, 0, "in_use -> unused"), at(100)).is_empty());
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 1, "mounted"), at(200)).is_empty());
    assert!(rate.admit(ev(v, "loop1", Verdict::InUse, 1, "unused -> in_use"), at(200)).is_empty());
    assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 0, "unmounted"), at(300)).is_empty());
    assert!(rate.admit(ev(v, "loop1", Verdict::Unused, 0, "in_use -> unused"), at(300)).is_empty());
    assert!(rate.due(at(999)).is_empty(), "not before the second is up");
    let out = rate.due(at(1000));
    assert_eq!(out.len(), 1, "{:?}", lines(&out));
    assert_eq!(out[0].kind, v, "the verdict differs from the one watchers saw");
    assert_eq!(out[0].coalesced, 5);
    assert_eq!(
        out[0].message,
        "loop1: 6 changes (holders, verdict) in the last second, folded into one (at most one event per \
         device a second): verdict in_use -> unused, 0 holder(s) now"
    );
    assert!(rate.due(at(1500)).is_empty(), "nothing left held");
    // Mounted and unmounted within the next second: the verdict is back where watchers saw it,
    // so the folded event is a holders change.
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 1, "mounted"), at(1100)).is_empty());
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 0, "unmounted"), at(1200)).is_empty());
    let out = rate.due(at(2000));
    assert_eq!((out.len(), out[0].kind, out[0].coalesced), (1, h, 1), "{:?}", lines(&out));
    assert!(out[0].message.contains("verdict unused, 0 holder(s) now"), "{}", out[0].message);
    // One held event alone goes as it was.
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 2, "two"), at(2500)).is_empty());
    let out = rate.due(at(3000));
    assert_eq!(lines(&out), ["HoldersChanged two"]);
    assert_eq!(out[0].coalesced, 0);
    assert_eq!(rate.admit(ev(h, "loop1", Verdict::Unused, 1, "later"), at(4100)).len(), 1);
}

#[test]
fn off_by_default_every_event_goes_at_once() {
    let rate = EventRate::default();
    let t0 = Instant::now();
    for m in ["a", "b", "c"] {
        assert_eq!(rate.admit(ev(EventKind::HoldersChanged, "loop1", Verdict::InUse, 1, m), t0).len(), 1);
    }
    assert!(rate.due(t0 + Duration::from_secs(5)).is_empty());
}

#[test]
fn other_events_go_at_once_after_the_devices_held_one() {
    let rate = EventRate::new(true);
    let t0 = Instant::now();
    let h = EventKind::HoldersChanged;
    rate.admit(ev(h, "loop1", Verdict::InUse, 1, "a"), t0);
    assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 2, "b"), t0).is_empty());
    let out = rate.admit(bare(EventKind::ActionStarted, "loop1", "unmap"), t0);
    assert_eq!(lines(&out), ["HoldersChanged b", "ActionStarted unmap"]);
    assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 1, "c"), t0).is_empty());
    let out = rate.admit(bare(EventKind::DeviceRemoved, "loop1", "gone"), t0);
    assert_eq!(lines(&out), ["HoldersChanged c", "DeviceRemoved gone"]);
    assert_eq!(rate.admit(ev(h, "loop1", Verdict::InUse, 1, "new"), t0).len(), 1, "a new device");
    assert_eq!(rate.admit(bare(EventKind::DeviceAdded, "loop9", "added"), t0).len(), 1);
    assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 2, "d"), t0).is_empty());
    let out = rate.admit(ev(EventKind::ResponsivenessChanged, "loop1", Verdict::InUse, 2, "hangs"), t0);
    assert_eq!(lines(&out), ["HoldersChanged d", "ResponsivenessChanged hangs"], "an alarm is never held");
}
