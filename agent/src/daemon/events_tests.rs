//! Tests of the event diff: a protected device's process churn is no event, a new kind of holder
//! on it is one (summarised), and every other device's holder change is sent in full.

use super::*;
use crate::graph::identity::Identity;
use crate::graph::{DeviceEntry, Holder};
use crate::judge::{Judgement, Verdict};
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName, HolderKind};

pub(crate) fn process(kind: HolderKind, pid: u32) -> Holder {
    let mut h = Holder::bare(kind);
    h.pids = vec![pid];
    h.pid_count = 1;
    h.comm = Some("sh".into());
    h.cmdline = Some(format!("sh -c job-{pid}").into());
    h
}

pub(crate) fn device(name: &str, minor: u32, verdict: Verdict, holders: Vec<Holder>) -> DeviceView {
    let dev = BlockDevice::new(
        DeviceName::new(name).expect("name"),
        DevNum::new(252, minor),
        DeviceKind::Disk,
        1 << 30,
    );
    let entry = DeviceEntry::new(dev, holders);
    DeviceView {
        identity: Identity::of(&entry),
        judgement: Judgement { verdict, reasons: Vec::new(), summary: String::new() },
        entry,
        unresponsive: None,
        last_seen_scan: 1,
        last_seen: None,
        api_word: 0,
    }
}

fn view(devices: Vec<DeviceView>) -> View {
    let mut v = View::empty();
    v.devices = devices.into_iter().map(std::sync::Arc::new).collect();
    v
}

#[test]
fn a_protected_disks_process_churn_is_no_event() {
    let before = view(vec![device(
        "vda",
        0,
        Verdict::Protected,
        (1..=40).map(|p| process(HolderKind::Cwd, p)).collect(),
    )]);
    // Other processes, more of them, the same kinds: what an idle node's root disk does.
    let after = view(vec![device(
        "vda",
        0,
        Verdict::Protected,
        (100..=160).map(|p| process(HolderKind::Cwd, p)).collect(),
    )]);
    assert!(diff(&before, &after).is_empty(), "{:?}", diff(&before, &after));

    // A kind of holder appears (swap on the root disk): one event, its holders one per kind.
    let mut with_swap: Vec<Holder> = (100..=160).map(|p| process(HolderKind::Cwd, p)).collect();
    with_swap.push(Holder::bare(HolderKind::Swap));
    let swapped = view(vec![device("vda", 0, Verdict::Protected, with_swap)]);
    let events = diff(&after, &swapped);
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].kind, EventKind::HoldersChanged);
    assert!(events[0].message.contains("61 cwd -> 61 cwd, 1 swap"), "{}", events[0].message);
    let holders = &events[0].current.as_ref().expect("current").entry.holders;
    assert_eq!(holders.len(), 2, "one holder per kind: {holders:?}");
    assert!(
        holders.iter().all(|h| h.pids.is_empty() && h.cmdline.is_none()),
        "no process detail: {holders:?}"
    );
    assert_eq!(holders[0].pid_count, 61);
}

#[test]
fn any_other_devices_holder_change_is_sent_in_full() {
    let before = view(vec![device("loop0", 7, Verdict::InUse, vec![process(HolderKind::OpenDevice, 1)])]);
    let after = view(vec![device("loop0", 7, Verdict::InUse, vec![process(HolderKind::OpenDevice, 2)])]);
    let events = diff(&before, &after);
    assert_eq!(events.len(), 1, "{events:?}");
    let holders = &events[0].current.as_ref().expect("current").entry.holders;
    assert_eq!(holders[0].pids, vec![2], "{holders:?}");
    assert!(holders[0].cmdline.is_some());
}

/// Holders added and gone at many places of a long list are counted as a search of each in
/// the other list counts them, including holders that differ only past the indexed fields.
#[test]
fn holders_added_and_gone_across_a_long_list_are_counted_exactly() {
    let before: Vec<Holder> = (0..2000).map(|p| process(HolderKind::Mmap, p)).collect();
    let mut after = before.clone();
    // A new pod's holders land in several places; some go; one changes its command line only.
    for at in [1900, 1200, 700, 5] {
        after.insert(at, process(HolderKind::Cwd, 10_000 + at as u32));
    }
    after.remove(1500);
    after.remove(300);
    after[1000].cmdline = Some("sh -c rewritten".into());
    assert_eq!(counts_gone_new(&before, &after), searched(&before, &after));
    assert_eq!(counts_gone_new(&before, &after), (3, 5));
    assert_eq!(counts_gone_new(&after, &after), (0, 0));
    // A holder listed twice (two fds of one file), one of them moved from the head into the
    // middle, and many changed at once past the indexed fields: still as the search counts.
    let mut twice = before.clone();
    twice.insert(1000, before[3].clone());
    twice.remove(3);
    twice.insert(1500, before[10].clone());
    for h in &mut twice[400..420] {
        h.cmdline = Some("changed".into());
    }
    assert_eq!(counts_gone_new(&before, &twice), searched(&before, &twice));
    assert_eq!(counts_gone_new(&twice, &before), searched(&twice, &before));
}

/// Random edits of a list (runs added and removed, holders changed, moved or listed twice),
/// counted as a search of each holder in the other list counts them, both ways.
#[test]
fn random_edits_are_counted_as_the_search_counts_them() {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |below: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % below as u64) as usize
    };
    let before: Vec<Holder> = (0..300).map(|p| process(HolderKind::Mmap, p)).collect();
    for round in 0..300 {
        let mut after = before.clone();
        for _ in 0..next(12) {
            let at = next(after.len() + 1);
            match next(5) {
                0 => {
                    for k in 0..next(40) {
                        after.insert(
                            at.min(after.len()),
                            process(HolderKind::Cwd, 1_000 + (round * 50 + k) as u32),
                        );
                    }
                }
                1 => {
                    let end = (at + next(40)).min(after.len());
                    after.drain(at.min(end)..end);
                }
                2 if at < after.len() => after[at].cmdline = Some(format!("changed {round}").into()),
                3 if at < after.len() => {
                    let h = after.remove(at);
                    let to = next(after.len() + 1);
                    after.insert(to, h);
                }
                _ if at < after.len() => {
                    let h = after[at].clone();
                    after.insert(next(after.len() + 1), h);
                }
                _ => {}
            }
        }
        assert_eq!(counts_gone_new(&before, &after), searched(&before, &after), "round {round}");
        assert_eq!(counts_gone_new(&after, &before), searched(&after, &before), "round {round}");
    }
}

/// How many holders of `a` are not in `b`, and of `b` not in `a`, by searching each in the
/// other list: what `counts_gone_new` must count.
fn searched(a: &[Holder], b: &[Holder]) -> (usize, usize) {
    (a.iter().filter(|h| !b.contains(h)).count(), b.iter().filter(|h| !a.contains(h)).count())
}
