//! What a re-read touched, on snapshots made by hand: a mount in one namespace touches its own
//! device and not the image disk mounted in every namespace; a process reference dropped
//! touches its device; anything scan-wide touches all.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{touched, Touched};
use crate::discover::fds::ProcRef;
use crate::discover::iostat::IoStat;
use crate::discover::mountinfo::parse_line;
use crate::discover::namespaces::{MountNamespace, NsEntry, NsMount};
use crate::model::scan_stats::ScanStats;
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName, HolderKind, MountNsId};
use crate::snapshot::Snapshot;

const IMAGE: DevNum = DevNum::new(7, 0);
const VOLUME: DevNum = DevNum::new(7, 1);

fn mount(ns: u64, id: u32, dev: DevNum, at: &str) -> NsMount {
    let line = format!("{id} 1 {}:{} / {at} rw - ext4 /dev/x rw", dev.major, dev.minor);
    NsMount {
        ns: MountNsId(ns),
        via: NsEntry::Task { pid: ns as u32, tid: ns as u32 },
        mount: parse_line(line.as_bytes(), 1).expect("mountinfo line"),
        block: None,
    }
}

fn namespace(id: u64) -> MountNamespace {
    MountNamespace {
        id: MountNsId(id),
        pids: vec![id as u32],
        tasks: vec![(id as u32, id as u32)],
        pinned_by: None,
        read_via: None,
        mount_count: 1,
        mountinfo_bytes: 0,
        kernel_id: None,
    }
}

/// Three namespaces, each with the image disk mounted, a process mapping a file on it.
fn node() -> Snapshot {
    let dev = |name: &str, devnum| {
        BlockDevice::new(DeviceName::new(name).expect("name"), devnum, DeviceKind::Loop, 1 << 20)
    };
    Snapshot {
        host_ns: MountNsId(1),
        host_ns_unsure: None,
        devices: vec![dev("loop0", IMAGE), dev("loop1", VOLUME)],
        namespaces: (1..=3).map(namespace).collect(),
        mounts: (1..=3).map(|n| mount(n, 100 + n as u32, IMAGE, "/image")).collect(),
        proc_refs: (1..=3)
            .map(|n| ProcRef {
                pid: n,
                tid: None,
                kind: HolderKind::Mmap,
                devnum: IMAGE,
                path: None,
                fd: None,
                access: 'm',
            })
            .collect(),
        swaps: Vec::new(),
        kernel_threads: Vec::new(),
        processes: BTreeMap::new(),
        stuck_pids: Vec::new(),
        stats: ScanStats::default(),
        warnings: Vec::new(),
        blind_spots: Vec::new(),
        live_fs: Vec::new(),
        in_scope: [IMAGE, VOLUME].into_iter().collect(),
        dm_devices: Vec::new(),
        scsi: Default::default(),
        rbd: Vec::new(),
        nbd: Vec::new(),
        nvme: Default::default(),
        kubelet: Default::default(),
        io: HashMap::from([(IMAGE, IoStat::default()), (VOLUME, IoStat::default())]),
        anon: Default::default(),
    }
}

fn ns(ids: &[u64]) -> HashSet<MountNsId> {
    ids.iter().map(|i| MountNsId(*i)).collect()
}

#[test]
fn a_mount_in_one_namespace_touches_its_device_only() {
    let mut snap = node();
    let read = ns(&[2]);
    let before = snap.device_inputs(&read, None, true);
    // What a re-read of namespace 2 leaves: its image mount read again (equal), a new mount.
    snap.mounts.retain(|m| m.ns != MountNsId(2));
    snap.mounts.push(mount(2, 102, IMAGE, "/image"));
    snap.mounts.push(mount(2, 200, VOLUME, "/data"));
    let after = snap.device_inputs(&read, Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([VOLUME].into_iter().collect()));
    // And the unmount.
    let before = after;
    snap.mounts.retain(|m| m.mount.mount_id != 200);
    let after = snap.device_inputs(&read, Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([VOLUME].into_iter().collect()));
}

#[test]
fn a_changed_mount_of_a_device_touches_it() {
    let mut snap = node();
    let read = ns(&[3]);
    let before = snap.device_inputs(&read, None, true);
    snap.mounts.retain(|m| m.ns != MountNsId(3));
    // Same device, remounted elsewhere (a new mount ID).
    snap.mounts.push(mount(3, 300, IMAGE, "/elsewhere"));
    let after = snap.device_inputs(&read, Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([IMAGE].into_iter().collect()));
}

#[test]
fn a_gone_namespace_touches_what_it_and_its_processes_held() {
    let mut snap = node();
    snap.mounts.push(mount(3, 301, VOLUME, "/data"));
    let read = ns(&[3]);
    let before = snap.device_inputs(&read, None, true);
    snap.namespaces.retain(|n| n.id != MountNsId(3));
    snap.mounts.retain(|m| m.ns != MountNsId(3));
    snap.proc_refs.retain(|r| r.pid != 3);
    let after = snap.device_inputs(&read, Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([IMAGE, VOLUME].into_iter().collect()));
}

#[test]
fn a_new_namespace_is_looked_at_though_nobody_named_it() {
    let mut snap = node();
    let before = snap.device_inputs(&HashSet::new(), None, true);
    snap.namespaces.push(namespace(4));
    snap.mounts.push(mount(4, 401, VOLUME, "/data"));
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([VOLUME].into_iter().collect()));
}

#[test]
fn io_in_flight_that_does_not_complete_touches_the_device_and_moving_counters_do_not() {
    let mut snap = node();
    let before = snap.device_inputs(&HashSet::new(), None, true);
    // I/O completed, none in flight (then some in flight, with more completed): it answers.
    snap.io.insert(VOLUME, IoStat { completed: 5, ..IoStat::default() });
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some(HashSet::new()));
    let before = after;
    snap.io.insert(VOLUME, IoStat { completed: 9, in_flight: 2 });
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some(HashSet::new()));
    // In flight, and nothing completed since the last read: it may be stalling.
    let before = after;
    snap.io.insert(IMAGE, IoStat { in_flight: 1, ..IoStat::default() });
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    let t = touched(&before, &after, &snap);
    assert_eq!(t, Touched::Some([IMAGE, VOLUME].into_iter().collect()));
    // Still in flight, counters unchanged: touched again (the stall watch must look).
    let again = snap.device_inputs(&HashSet::new(), Some(&after), true);
    assert_eq!(touched(&after, &again, &snap), t);
    // Counters newly readable (none before): touched (the other device's I/O completed).
    let mut before = again.clone();
    before.io.remove(&IMAGE);
    snap.io.insert(IMAGE, IoStat::default());
    snap.io.insert(VOLUME, IoStat { completed: 10, in_flight: 1 });
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([IMAGE].into_iter().collect()));
}

#[test]
fn anything_scan_wide_touches_every_device() {
    let mut snap = node();
    let before = snap.device_inputs(&HashSet::new(), None, true);
    snap.warnings.push("a command line could not be read".into());
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert!(matches!(touched(&before, &after, &snap), Touched::All(_)));
    let mut snap = node();
    let before = snap.device_inputs(&HashSet::new(), None, true);
    snap.blind_spots.push(crate::model::blindspot::BlindSpot::any("a namespace cannot be read"));
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert!(matches!(touched(&before, &after, &snap), Touched::All(_)));
}

#[test]
fn nothing_changed_touches_nothing() {
    let snap = node();
    let read = ns(&[1, 2, 3]);
    let before = snap.device_inputs(&read, None, true);
    let after = snap.device_inputs(&read, Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some(HashSet::new()));
}

#[test]
fn a_stacked_device_is_never_judged_alone() {
    let mut snap = node();
    assert!(!super::stacked(&snap, VOLUME));
    let mut part = BlockDevice::new(
        DeviceName::new("loop1p1").expect("name"),
        DevNum::new(259, 0),
        DeviceKind::Partition,
        1,
    );
    part.parent = Some(DeviceName::new("loop1").expect("name"));
    snap.devices.push(part);
    assert!(super::stacked(&snap, VOLUME), "a disk with a partition");
    assert!(super::stacked(&snap, DevNum::new(259, 0)), "a partition");
    assert!(super::stacked(&snap, DevNum::new(9, 9)), "a device the snapshot does not know");
}

#[test]
fn a_filesystem_coming_alive_touches_its_device_and_btrfs_touches_all() {
    use crate::discover::livefs::LiveFs;
    let mut snap = node();
    let before = snap.device_inputs(&HashSet::new(), None, true);
    let member = DeviceName::new("loop1").expect("name");
    snap.live_fs.push(LiveFs { fstype: "ext4".into(), id: "loop1".into(), members: vec![member.clone()] });
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([VOLUME].into_iter().collect()));
    snap.live_fs.push(LiveFs { fstype: "btrfs".into(), id: "f00d".into(), members: vec![member] });
    let btrfs = snap.device_inputs(&HashSet::new(), Some(&after), true);
    assert!(matches!(touched(&after, &btrfs, &snap), Touched::All(_)));
}

#[test]
fn a_forgotten_process_touches_the_mounts_it_labelled() {
    let mut snap = node();
    snap.processes.insert(2, Default::default());
    let before = snap.device_inputs(&HashSet::new(), None, true);
    // Process 2 died; namespace 2 lives on (another namespace's re-read dropped it).
    snap.processes.remove(&2);
    let after = snap.device_inputs(&HashSet::new(), Some(&before), true);
    assert_eq!(touched(&before, &after, &snap), Touched::Some([IMAGE].into_iter().collect()));
}

#[test]
fn a_namespace_whose_processes_changed_touches_its_mounts() {
    let mut snap = node();
    snap.mounts.push(mount(2, 202, VOLUME, "/data"));
    let before = snap.device_inputs(&HashSet::new(), None, true);
    // Process 22 moved from namespace 2 into a new one (4) that holds nothing.
    snap.namespaces[1].pids.push(22);
    let moved = snap.device_inputs(&HashSet::new(), Some(&before), true);
    snap.namespaces[1].pids.pop();
    snap.namespaces.push(namespace(4));
    let after = snap.device_inputs(&HashSet::new(), Some(&moved), true);
    assert_eq!(touched(&moved, &after, &snap), Touched::Some([IMAGE, VOLUME].into_iter().collect()));
}

/// A mount change in a namespace the snapshot does not have is read by a full scan, unless that
/// namespace is awaiting its read in full (its processes being looked for off the scanner's
/// path): the change is left to that read, and nothing else is touched.
#[test]
fn a_change_in_an_awaited_new_namespace_is_left_to_its_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let host = crate::host::HostRoot::new(dir.path());
    let opts = crate::snapshot::ScanOptions::default();
    let changes = crate::snapshot::reread::Changes {
        namespaces: [MountNsId(9)].into_iter().collect(),
        ..Default::default()
    };
    let why = node().update(&host, &changes, &opts).expect_err("not awaited: only a full scan will do");
    assert!(why.contains("new since the last full scan"), "{why}");
    let awaited =
        crate::snapshot::reread::Changes { awaiting: [MountNsId(9)].into_iter().collect(), ..changes };
    let mut snap = node();
    snap.update(&host, &awaited, &opts).expect("left to the namespace's own read");
    let ids = |s: &Snapshot| s.mounts.iter().map(|m| (m.ns, m.mount.mount_id)).collect::<Vec<_>>();
    assert_eq!((ids(&snap), snap.namespaces.len()), (ids(&node()), 3), "nothing else read or dropped");
}
