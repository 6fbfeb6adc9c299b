//! Tests of the per-device cap: one state event per device a second, the held ones folded into
//! one that says what it stands for, and every other event at once, after the device's held one.

use super::*;
use crate::daemon::events::tests::{device, process};
use crate::judge::Verdict;
use crate::model::HolderKind;

fn ev(kind: EventKind, name: &str, verdict: Verdict, holders: usize, message: &str) -> AgentEvent {
    let hs = (0..holders as u32).map(|p| process(HolderKind::Mount, 100 + p)).collect();
    AgentEvent::new(kind, name, message.into(), Some(std::sync::Arc::new(device(name, 1, verdict, hs))))
}

fn bare(kind: EventKind, name: &str, message: &str) -> AgentEvent {
    AgentEvent::new(kind, name, message.into(), None)
}

/// `ev` as a scan's: the view of scan `scan` showed it.
fn of_scan(
    scan: u64,
    kind: EventKind,
    name: &str,
    verdict: Verdict,
    holders: usize,
    message: &str,
) -> AgentEvent {
    AgentEvent { scan, ..ev(kind, name, verdict, holders, message) }
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
fn off_every_event_goes_at_once() {
    let rate = EventRate::new(false);
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

#[test]
fn the_first_change_after_a_quiet_second_goes_at_once_with_its_verdict() {
    let rate = EventRate::new(true);
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let (h, v) = (EventKind::HoldersChanged, EventKind::VerdictChanged);
    // A mount: its holders and the verdict they changed, in one scan's view, go together.
    assert_eq!(rate.admit(of_scan(7, h, "loop1", Verdict::InUse, 1, "mounted"), at(0)).len(), 1);
    assert_eq!(rate.admit(of_scan(7, v, "loop1", Verdict::InUse, 1, "unused -> in_use"), at(1)).len(), 1);
    // The next scan's change, within the second: held, with its verdict.
    assert!(rate.admit(of_scan(8, h, "loop1", Verdict::Unused, 0, "unmounted"), at(300)).is_empty());
    assert!(rate.admit(of_scan(8, v, "loop1", Verdict::Unused, 0, "in_use -> unused"), at(300)).is_empty());
    assert_eq!(rate.next_due(), Some(at(1000)), "due when the device's second is up");
    let out = rate.due(at(1000));
    assert_eq!((out.len(), out[0].kind, out[0].coalesced), (1, v, 1), "{:?}", lines(&out));
    assert!(out[0].message.contains("verdict in_use -> unused"), "{}", out[0].message);
    assert_eq!(rate.next_due(), None, "nothing held");
    // The flushed event opened a second of its own: a change within it is held...
    assert!(rate.admit(of_scan(9, h, "loop1", Verdict::Unused, 1, "mounted"), at(1500)).is_empty());
    assert_eq!(lines(&rate.due(at(2000))), ["HoldersChanged mounted"]);
    // ...and one a full second after the device's last event goes at once (the boundary
    // included), its verdict with it.
    assert_eq!(rate.admit(of_scan(10, h, "loop1", Verdict::Unused, 0, "unmounted"), at(3000)).len(), 1);
    assert_eq!(rate.admit(of_scan(10, v, "loop1", Verdict::Unused, 0, "x"), at(3000)).len(), 1);
    // An action does not open a device's second: the state change after it goes at once.
    assert_eq!(rate.admit(bare(EventKind::ActionStarted, "loop2", "unmap"), at(3000)).len(), 1);
    assert_eq!(rate.admit(of_scan(11, h, "loop2", Verdict::Unused, 0, "y"), at(3001)).len(), 1);
    // A held event is not followed at once by its scan's other event: order is kept.
    assert!(rate.admit(of_scan(12, h, "loop2", Verdict::InUse, 1, "a"), at(3100)).is_empty());
    assert!(rate.admit(of_scan(12, v, "loop2", Verdict::InUse, 1, "b"), at(3100)).is_empty());
    assert_eq!(rate.due(at(4001)).len(), 1, "folded into one");
}

/// The flusher, run as the daemon runs it: asleep while nothing is held (no wake at all), a held
/// event sent when its device's second is up (not before, and not much after), then asleep
/// again. Real time, generous upper bound (a loaded machine).
#[test]
fn the_flusher_sleeps_while_nothing_is_held_and_sends_a_held_event_on_time() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    rt.block_on(async {
        let rate = std::sync::Arc::new(EventRate::new(true));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let flusher = tokio::spawn({
            let rate = std::sync::Arc::clone(&rate);
            async move { rate.flush_held(|e| tx.send((Instant::now(), e)).expect("receiver"), shutdown).await }
        });
        let h = EventKind::HoldersChanged;
        // One event, sent at once: nothing held, so the flusher does not wake.
        let sent = Instant::now();
        assert_eq!(rate.admit(ev(h, "loop1", Verdict::InUse, 1, "first"), sent).len(), 1);
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(rate.wakes(), 0, "the flusher woke with nothing held");
        assert!(rate.admit(ev(h, "loop1", Verdict::InUse, 2, "second"), Instant::now()).is_empty());
        let (at, e) = tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("the held event within 10 s")
            .expect("an event");
        assert_eq!(e.message, "second");
        let waited = at.duration_since(sent);
        assert!(waited >= EVERY, "sent {waited:?} after the device's previous event: before its second was up");
        assert!(waited < EVERY * 3, "sent {waited:?} after the device's previous event: late");
        // Woken by the hold, then at the deadline (a spurious look or two at most).
        let wakes = rate.wakes();
        assert!((1..=4).contains(&wakes), "{wakes} wakes for one held event");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(rate.wakes(), wakes, "the flusher woke again with nothing held");
        assert!(rx.try_recv().is_err(), "one event for one held");
        stop.send(true).expect("flusher listening");
        tokio::time::timeout(Duration::from_secs(5), flusher).await.expect("flusher stops").expect("joined");
    });
}
