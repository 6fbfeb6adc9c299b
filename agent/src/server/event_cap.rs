//! The size cap on one `WatchEvents` event: at most [`EVENT_BYTES_MAX`] as a watcher prints it.
//!
//! A device held by thousands of processes, or mounted in every pod's namespace (a node's image
//! disk), would otherwise send every holder, reason and pod to every watcher (and through the
//! console, to the fleet) at each change. An event over the cap has, in turn:
//! 1. its device's holders summarised by kind (a count per kind, no process);
//! 2. its device's other lists (kubelet paths, pod UIDs, PVs, volume handles, CSI drivers,
//!    kernel threads, stacked devices) cut to their first [`LIST_KEPT`];
//! 3. its reasons cut to the first that fit;
//!
//! and its message says what was left out, and that `GetDevice` shows each. A
//! `PIN_RISKS_CHANGED` event over the cap carries no pin risk (`pin_risks_complete` false): the
//! watcher reads them with `ListDevices`.
//!
//! The size counted is the larger of the event's protobuf encoding (what goes on the wire) and
//! its JSON line as `agentctl watch -o json` prints it (the one renderer, `blockjanitor_rpc::view`:
//! field names and escaped text make it the larger one, about 1.3x for a busy device), so the cap
//! holds for what a watcher receives and for what it shows.

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view::doc::event_doc;
use prost::Message as _;

use super::convert;
use crate::engine::wire;

/// Most bytes of one event, on the wire and as JSON.
pub const EVENT_BYTES_MAX: usize = 4096;

/// How many entries of each of a device's other lists an event over the cap keeps.
pub const LIST_KEPT: usize = 3;

/// Bytes kept free for the message's note when something is left out.
const NOTE_BYTES: usize = 200;

/// The event's size as a watcher gets it: the larger of its protobuf encoding and its JSON line.
/// An encoding already over the cap is that size: its JSON line (the larger, and for a device
/// held thousands of times about a megabyte, some 10 ms to make) is not made.
pub fn printed_len(ev: &pb::Event) -> usize {
    let wire = ev.encoded_len();
    if wire > EVENT_BYTES_MAX {
        return wire;
    }
    let json = serde_json::to_vec(&event_doc(ev)).map_or(usize::MAX, |v| v.len());
    wire.max(json)
}

/// A device with more holders than this cannot fit the cap (a holder costs at least 4 bytes on
/// the wire: its tag and length, and its kind, which is never left unspecified): its event is made with its holders by kind from the start
/// ([`wire::device_by_kind`], with at most [`REASONS_MADE`] reasons).
pub const HOLDERS_NEVER_FIT: usize = EVENT_BYTES_MAX / 4;
/// The reasons made for such an event: a reason costs at least 2 bytes on the wire (its tag and
/// length), so no event within the cap carries more, and the cap keeps of these exactly the
/// reasons it would keep of all.
const REASONS_MADE: usize = EVENT_BYTES_MAX / 2;

/// `e` as a watcher with `role` receives it: converted, its device as `role` may see it
/// (`for_role`), within the cap ([`capped`]). A device no event of which can fit is never
/// converted in full.
pub fn event_for(
    e: &crate::daemon::events::AgentEvent,
    for_role: impl FnOnce(pb::Device) -> pb::Device,
) -> pb::Event {
    let big = e.current.as_deref().filter(|d| d.entry.holders.len() > HOLDERS_NEVER_FIT);
    let Some(d) = big else {
        let mut ev = convert::event(e);
        ev.current = ev.current.map(for_role);
        return capped(ev);
    };
    let (held, reasons) = (d.entry.holders.len(), d.judgement.reasons.len());
    let mut ev = convert::event(&crate::daemon::events::AgentEvent { current: None, ..e.clone() });
    ev.current = Some(for_role(wire::device_by_kind(d, REASONS_MADE)));
    summarised_within(ev, held, reasons)
}

/// The event within [`EVENT_BYTES_MAX`] (see the module doc), or as it is when it fits.
pub fn capped(ev: pb::Event) -> pb::Event {
    if printed_len(&ev) <= EVENT_BYTES_MAX {
        return ev;
    }
    let mut ev = ev;
    if !ev.pin_risks.is_empty() {
        // A node's pin risks too many to send: none, and the watcher re-reads them.
        let n = std::mem::take(&mut ev.pin_risks).len();
        ev.pin_risks_complete = false;
        ev.message = format!("{} ({n} pin risks: too many for an event, ListDevices has them)", ev.message);
        return ev;
    }
    let Some(d) = ev.current.as_mut() else { return ev };
    let (held, reasons) = (d.holders.len(), d.reasons.len());
    d.holders = wire::holders_by_kind(&d.holders);
    summarised_within(ev, held, reasons)
}

/// An event whose device's `held` holders are summarised by kind already (and whose reasons
/// may be the first of `total_reasons`), within the cap: its other lists cut, then its reasons.
fn summarised_within(ev: pb::Event, held: usize, total_reasons: usize) -> pb::Event {
    let mut ev = ev;
    let mut cut = Vec::new();
    let summarised = format!("{held} holders summarised by kind");
    if printed_len(&ev) <= EVENT_BYTES_MAX {
        return with_note(ev, &summarised, &cut);
    }
    let Some(d) = ev.current.as_mut() else { return ev };
    for (name, list) in [
        ("kubelet paths", &mut d.kubelet_paths),
        ("pod UIDs", &mut d.pod_uids),
        ("PVs", &mut d.pv_names),
        ("volume handles", &mut d.volume_handles),
        ("CSI drivers", &mut d.csi_drivers),
        ("kernel threads", &mut d.kernel_threads),
        ("devices stacked on it", &mut d.stacked_on_top),
        ("devices it is stacked on", &mut d.stacked_below),
    ] {
        if list.len() > LIST_KEPT {
            cut.push(format!("{} of {} {name}", LIST_KEPT, list.len()));
            list.truncate(LIST_KEPT);
        }
    }
    let reasons = std::mem::take(&mut d.reasons);
    // The JSON costs more per reason than the protobuf (quotes, escapes, a comma), so the room is
    // counted in JSON: the event without reasons, then each reason's JSON string and its comma.
    let mut room = EVENT_BYTES_MAX.saturating_sub(printed_len(&ev) + NOTE_BYTES);
    let mut kept = Vec::new();
    for r in &reasons {
        let cost = serde_json::to_string(r).map_or(usize::MAX, |s| s.len()) + 1;
        if cost > room {
            break;
        }
        room -= cost;
        kept.push(r.clone());
    }
    if kept.len() < total_reasons {
        cut.insert(0, format!("{} of {} reasons", kept.len(), total_reasons));
    }
    if let Some(d) = ev.current.as_mut() {
        d.reasons = kept;
    }
    with_note(ev, &summarised, &cut)
}

/// The event with its message saying what the cap left out.
fn with_note(mut ev: pb::Event, summarised: &str, cut: &[String]) -> pb::Event {
    ev.message.push_str(&format!(" ({summarised}"));
    if !cut.is_empty() {
        ev.message.push_str(&format!("; {} shown", cut.join(", ")));
    }
    ev.message.push_str(&format!(
        ": an event carries at most {} KB; GetDevice shows each)",
        EVENT_BYTES_MAX / 1024
    ));
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event_with(holders: usize) -> pb::Event {
        let h = |i: usize| pb::Holder {
            kind: if i.is_multiple_of(2) { pb::HolderKind::Cwd } else { pb::HolderKind::Mmap } as i32,
            pids: vec![i as u32],
            pid_count: 1,
            comm: "python3".into(),
            cmdline: format!("python3 /srv/app/worker.py --queue jobs-{i}"),
            ..Default::default()
        };
        pb::Event {
            r#type: pb::event::Type::HoldersChanged as i32,
            device: "vdb".into(),
            message: "vdb: 1 holder(s) added, 0 gone".into(),
            current: Some(pb::Device {
                name: "vdb".into(),
                holders: (0..holders).map(h).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The JSON line `agentctl watch -o json` prints for the event.
    fn json_len(ev: &pb::Event) -> usize {
        serde_json::to_vec(&event_doc(ev)).expect("json").len()
    }

    /// Within the cap on the wire and as printed.
    fn assert_fits(c: &pb::Event) {
        assert!(c.encoded_len() <= EVENT_BYTES_MAX, "{} bytes of protobuf", c.encoded_len());
        assert!(json_len(c) <= EVENT_BYTES_MAX, "{} bytes of JSON", json_len(c));
    }

    /// A small event goes as it is; a large one has its holders summarised by kind, fits the cap,
    /// and says so.
    #[test]
    fn an_event_over_the_cap_has_its_holders_summarised_and_says_so() {
        let small = event_with(3);
        assert_eq!(capped(small.clone()), small);
        let big = event_with(500);
        assert!(big.encoded_len() > EVENT_BYTES_MAX);
        let c = capped(big);
        assert_fits(&c);
        let holders = &c.current.as_ref().expect("current").holders;
        assert_eq!(holders.len(), 2, "{holders:?}");
        assert_eq!(holders.iter().map(|h| h.pid_count).sum::<u32>(), 500);
        assert!(c.message.contains("500 holders summarised by kind"), "{}", c.message);
        assert!(!c.message.contains("reasons"), "{}", c.message);
    }

    /// An event whose protobuf fits but whose JSON line would not (every field of the device is
    /// printed, with its name) is capped too: what a watcher prints stays under the cap.
    #[test]
    fn an_event_whose_json_is_over_the_cap_is_capped_though_its_protobuf_fits() {
        let mut ev = event_with(40);
        assert!(ev.encoded_len() <= EVENT_BYTES_MAX, "{} bytes of protobuf", ev.encoded_len());
        if let Some(d) = ev.current.as_mut() {
            d.reasons =
                (0..12).map(|i| format!("pid {i} (python3) has its working directory on it")).collect();
        }
        assert!(json_len(&ev) > EVENT_BYTES_MAX, "{} bytes of JSON", json_len(&ev));
        let c = capped(ev);
        assert_fits(&c);
        assert!(c.message.contains("40 holders summarised by kind"), "{}", c.message);
    }

    /// An in-use device held thousands of times has a reason per holder: with its holders
    /// summarised the event is still over the cap, so only its first reasons go, in order, and
    /// the message says how many of how many.
    #[test]
    fn an_event_still_over_the_cap_keeps_its_first_reasons_and_says_so() {
        let mut big = event_with(1600);
        let reasons: Vec<String> =
            (0..1600).map(|i| format!("pid {i} (python3) maps a file on it (/srv/app/lib{i}.so)")).collect();
        big.current.as_mut().expect("current").reasons = reasons.clone();
        let c = capped(big);
        assert_fits(&c);
        let d = c.current.as_ref().expect("current");
        assert_eq!(d.holders.iter().map(|h| h.pid_count).sum::<u32>(), 1600);
        assert!(!d.reasons.is_empty() && d.reasons.len() < 1600, "{} reasons", d.reasons.len());
        assert_eq!(d.reasons[..], reasons[..d.reasons.len()]);
        let note = format!("{} of 1600 reasons shown", d.reasons.len());
        assert!(c.message.contains(&note) && c.message.contains("1600 holders summarised"), "{}", c.message);
    }

    /// A device mounted in every namespace has a reason per mount and a pod UID per pod:
    /// summarising its holders is not enough, so its other lists are cut to their first entries
    /// and its reasons to those that fit, and the message says so.
    #[test]
    fn an_event_still_over_the_cap_has_its_lists_cut_and_says_so() {
        let mut big = event_with(500);
        if let Some(d) = big.current.as_mut() {
            d.reasons =
                (0..1800).map(|i| format!("mounted at /run/pods/{i}/image in mount namespace {i}")).collect();
            d.pod_uids = (0..200).map(|i| format!("5d1c7c2e-8a0b-11e8-9a3b-{i:012}")).collect();
            d.volume_handles = (0..50).map(|i| format!("0001-0009-rook-ceph-{i:016}")).collect();
        }
        let c = capped(big);
        assert_fits(&c);
        let d = c.current.as_ref().expect("current");
        assert_eq!(d.pod_uids.len(), LIST_KEPT);
        assert_eq!(d.volume_handles.len(), LIST_KEPT);
        assert_eq!(d.reasons[0], "mounted at /run/pods/0/image in mount namespace 0", "the first ones kept");
        let note =
            format!("{} of 1800 reasons, 3 of 200 pod UIDs, 3 of 50 volume handles shown", d.reasons.len());
        assert!(c.message.contains(&note), "{}", c.message);
    }

    /// A device held more times than any event can carry is made by kind from the start, and
    /// the watcher gets exactly what converting it in full and capping it gives.
    #[test]
    fn a_device_no_event_of_which_fits_is_summarised_before_it_is_converted() {
        use crate::daemon::events::tests::{device, process};
        use crate::daemon::events::{AgentEvent, EventKind};
        use crate::model::HolderKind;
        for n in [HOLDERS_NEVER_FIT + 1, 3000] {
            let holders = (0..n as u32)
                .map(|p| process(if p % 3 == 0 { HolderKind::Cwd } else { HolderKind::Mmap }, p))
                .collect();
            let mut d = device("loop0", 0, crate::judge::Verdict::InUse, holders);
            d.judgement.reasons = (0..n).map(|i| format!("pid {i} maps /image/lib/libc.so.6")).collect();
            let e = AgentEvent::new(
                EventKind::HoldersChanged,
                "loop0",
                "loop0: 1 holder(s) added".into(),
                Some(d.into()),
            );
            let strip = |mut d: pb::Device| {
                d.holders.iter_mut().for_each(|h| h.cmdline.clear());
                d
            };
            let mut full = convert::event(&e);
            full.current = full.current.map(strip);
            let lean = event_for(&e, strip);
            assert_eq!(lean, capped(full), "{n} holders");
            assert_fits(&lean);
            assert!(lean.message.contains(&format!("{n} holders summarised by kind")), "{}", lean.message);
            assert!(lean.message.contains(&format!(" of {n} reasons")), "{}", lean.message);
        }
    }
}
