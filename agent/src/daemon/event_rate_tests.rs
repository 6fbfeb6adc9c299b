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
         device a second at once): verdict in_use -> unused, 0 holder(s) now"
    );
    assert!(rate.due(at(1500)).is_empty(), "nothing left held");
    // A full second after the event sent at once: at once (the folded one opened no second).
    assert_eq!(rate.admit(ev(h, "loop1", Verdict::Unused, 1, "mounted"), at(1100)).len(), 1);
    // Unmounted and mounted again within its second: the verdict is where watchers saw it, so
    // the folded event is a holders change.
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 0, "unmounted"), at(1200)).is_empty());
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 1, "mounted"), at(1300)).is_empty());
    assert!(rate.due(at(2099)).is_empty(), "not before the second of the event sent at once is up");
    let out = rate.due(at(2100));
    assert_eq!((out.len(), out[0].kind, out[0].coalesced), (1, h, 1), "{:?}", lines(&out));
    assert!(out[0].message.contains("verdict unused, 1 holder(s) now"), "{}", out[0].message);
    // One held event alone goes as it was.
    assert_eq!(rate.admit(ev(h, "loop1", Verdict::Unused, 2, "two"), at(2500)).len(), 1);
    assert!(rate.admit(ev(h, "loop1", Verdict::Unused, 3, "three"), at(2600)).is_empty());
    let out = rate.due(at(3500));
    assert_eq!(lines(&out), ["HoldersChanged three"]);
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
    // The folded event opens no second: a change a full second after the event sent at once
    // (the boundary included) goes at once, however recently the folded one went, its verdict
    // with it...
    assert_eq!(rate.admit(of_scan(9, h, "loop1", Verdict::InUse, 1, "mounted"), at(1000)).len(), 1);
    assert_eq!(rate.admit(of_scan(9, v, "loop1", Verdict::InUse, 1, "unused -> in_use"), at(1000)).len(), 1);
    // ...and opens one: a change within it is held, and sent when it is up.
    assert!(rate.admit(of_scan(10, h, "loop1", Verdict::InUse, 2, "two"), at(1500)).is_empty());
    assert_eq!(rate.next_due(), Some(at(2000)));
    assert_eq!(lines(&rate.due(at(2000))), ["HoldersChanged two"]);
    // An action does not open a device's second: the state change after it goes at once.
    assert_eq!(rate.admit(bare(EventKind::ActionStarted, "loop2", "unmap"), at(3000)).len(), 1);
    assert_eq!(rate.admit(of_scan(11, h, "loop2", Verdict::Unused, 0, "y"), at(3001)).len(), 1);
    // A held event is not followed at once by its scan's other event: order is kept.
    assert!(rate.admit(of_scan(12, h, "loop2", Verdict::InUse, 1, "a"), at(3100)).is_empty());
    assert!(rate.admit(of_scan(12, v, "loop2", Verdict::InUse, 1, "b"), at(3100)).is_empty());
    assert_eq!(rate.due(at(4001)).len(), 1, "folded into one");
}

/// An event sent, at `ms`, and whether it went at once (else a held one, sent by the flusher).
struct Sent {
    ms: u64,
    at_once: bool,
    e: AgentEvent,
}

/// Admits `changes` (each at its time in ms, in order), the flusher sending the held events when
/// they are due as the daemon's does, then flushes what is left.
fn drive(rate: &EventRate, changes: Vec<(u64, AgentEvent)>) -> Vec<Sent> {
    let t0 = Instant::now();
    let ms_of = |t: Instant| t.duration_since(t0).as_millis() as u64;
    let mut sent = Vec::new();
    let flush_until = |sent: &mut Vec<Sent>, until: Option<u64>| {
        while let Some(due) = rate.next_due().filter(|d| until.is_none_or(|u| ms_of(*d) <= u)) {
            sent.extend(rate.due(due).into_iter().map(|e| Sent { ms: ms_of(due), at_once: false, e }));
        }
    };
    for (ms, e) in changes {
        flush_until(&mut sent, Some(ms));
        let now = t0 + Duration::from_millis(ms);
        sent.extend(rate.admit(e, now).into_iter().map(|e| Sent { ms, at_once: true, e }));
    }
    flush_until(&mut sent, None);
    sent
}

/// The scene of issue 38: a mount or unmount every 1.1 s (past the cap's second), each unmount's
/// filesystem ending 20 ms after it. Every mount and unmount goes at once: none waits behind the
/// folded event of the filesystem's end before it. (Counted from the folded event, the end's
/// flush a second after the unmount held the mount 0.1 s later for another ~0.9 s.)
#[test]
fn a_change_paced_past_the_second_never_waits_behind_a_folded_one() {
    let rate = EventRate::new(true);
    let (h, v) = (EventKind::HoldersChanged, EventKind::VerdictChanged);
    let mut changes = Vec::new();
    let mut paced = Vec::new();
    let mut scan = 0;
    for k in 0..12u64 {
        let ms = k * 1100;
        scan += 1;
        if k % 2 == 0 {
            changes.push((ms, of_scan(scan, h, "loop1", Verdict::InUse, 1, &format!("mounted at {ms}"))));
            changes.push((ms, of_scan(scan, v, "loop1", Verdict::InUse, 1, &format!("in use at {ms}"))));
            paced.push(format!("mounted at {ms}"));
        } else {
            // Unmounted: its filesystem lives on a moment (held by it, still in use)...
            changes.push((ms, of_scan(scan, h, "loop1", Verdict::InUse, 1, &format!("unmounted at {ms}"))));
            paced.push(format!("unmounted at {ms}"));
            // ...and ends 20 ms later: free.
            scan += 1;
            changes.push((ms + 20, of_scan(scan, h, "loop1", Verdict::Unused, 0, &format!("ended at {ms}"))));
            changes.push((ms + 20, of_scan(scan, v, "loop1", Verdict::Unused, 0, "in_use -> unused")));
        }
    }
    let sent = drive(&rate, changes);
    let shown: Vec<String> = sent.iter().map(|s| format!("{} {}", s.ms, s.e.message)).collect();
    for p in &paced {
        let ms: u64 = p.rsplit(' ').next().and_then(|n| n.parse().ok()).expect("a time");
        assert!(
            sent.iter().any(|s| s.at_once && s.ms == ms && s.e.message == *p && s.e.coalesced == 0),
            "{p:?} did not go at once: {shown:#?}"
        );
    }
    // Each filesystem's end is sent (folded with its verdict), a second after its unmount.
    for k in (1..12u64).step_by(2) {
        let ms = k * 1100;
        assert!(
            sent.iter().any(|s| !s.at_once && s.ms == ms + 1000 && s.e.message.contains("0 holder(s) now")),
            "the end after the unmount at {ms} was not sent when its second was up: {shown:#?}"
        );
    }
    let last = sent.last().expect("events");
    assert_eq!(last.e.current.as_ref().map(|d| d.entry.holders.len()), Some(0), "the device as it ended");
}

/// However fast a device churns, its state events in any second stand for at most two sends (a
/// change sent at once, with its verdict, and one folded event), a change a full second after
/// the device's last change sent at once goes at once, and the last event shows the device as it
/// ended.
#[test]
fn under_churn_at_most_two_sends_a_second_and_the_last_state_is_sent() {
    let rate = EventRate::new(true);
    let (h, v) = (EventKind::HoldersChanged, EventKind::VerdictChanged);
    let mut changes = Vec::new();
    for i in 0..1000u64 {
        let (verdict, holders) = if i % 2 == 0 { (Verdict::InUse, 1) } else { (Verdict::Unused, 0) };
        let ms = i * 10 + (i % 7);
        changes.push((ms, of_scan(i + 1, h, "loop1", verdict, holders, &format!("change {i}"))));
        changes.push((ms, of_scan(i + 1, v, "loop1", verdict, holders, &format!("verdict {i}"))));
    }
    let sent = drive(&rate, changes.clone());
    // One send: the events of one scan sent at once together, or one folded event.
    let mut sends: Vec<(u64, bool, u64)> = Vec::new();
    for s in &sent {
        if s.at_once && sends.last().is_some_and(|l| l.1 && l.2 == s.e.scan) {
            continue;
        }
        sends.push((s.ms, s.at_once, s.e.scan));
    }
    for (i, (ms, ..)) in sends.iter().enumerate() {
        let within = sends[i..].iter().take_while(|(t, ..)| *t < ms + 1000).count();
        assert!(within <= 2, "{within} sends in the second from {ms} ms: {sends:?}");
    }
    assert!(sends.len() <= 2 * 10 + 2, "{} sends in 10 s: {sends:?}", sends.len());
    // Each change a full second after the previous one sent at once went at once.
    let mut last_at_once: Option<u64> = None;
    for (ms, e) in changes.iter().filter(|(_, e)| e.kind == h) {
        let went = sent.iter().any(|s| s.at_once && s.e.scan == e.scan);
        if last_at_once.is_none_or(|t| *ms >= t + 1000) {
            assert!(went, "change at {ms} ms came a second after the last sent at once: {sends:?}");
        }
        if went {
            last_at_once = Some(*ms);
        }
    }
    let last = sent.last().expect("events");
    assert_eq!(last.e.current.as_ref().map(|d| d.entry.holders.len()), Some(0), "the device as it ended");
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

/// A change that comes when the device's second is up but before the flusher has sent what is
/// held goes at once, after the held one (older first): the held state is neither lost nor sent
/// after the newer one.
#[test]
fn a_change_at_the_end_of_the_second_goes_after_the_held_one_not_instead_of_it() {
    let rate = EventRate::new(true);
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let (h, v) = (EventKind::HoldersChanged, EventKind::VerdictChanged);
    assert_eq!(rate.admit(of_scan(1, h, "loop1", Verdict::InUse, 1, "unmounted"), at(0)).len(), 1);
    assert!(rate.admit(of_scan(2, h, "loop1", Verdict::Unused, 0, "ended"), at(20)).is_empty());
    assert!(rate.admit(of_scan(2, v, "loop1", Verdict::Unused, 0, "in_use -> unused"), at(20)).is_empty());
    // The flusher is late: the next mount comes first.
    let out = rate.admit(of_scan(3, h, "loop1", Verdict::InUse, 1, "mounted"), at(1000));
    assert_eq!(lines(&out).len(), 2, "{:?}", lines(&out));
    assert_eq!(out[0].kind, v, "the held end first, as the verdict change it was: {:?}", lines(&out));
    assert!(out[0].message.contains("verdict in_use -> unused, 0 holder(s) now"), "{}", out[0].message);
    assert_eq!(out[1].message, "mounted");
    // Its verdict, from the same scan, goes with it; nothing is left for the flusher.
    assert_eq!(rate.admit(of_scan(3, v, "loop1", Verdict::InUse, 1, "unused -> in_use"), at(1000)).len(), 1);
    assert!(rate.due(at(5000)).is_empty());
}
