//! Tests of the verdicts: every transport judged together, with the grace clocks, the stall watch and the API.

use super::verdicts::judge;
use super::*;
use crate::discover::nbd::NbdDevice;
use crate::graph::scan::Scan;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::host::clock::BootTime;
use crate::judge::grace::Clocks;
use crate::judge::stall::Stall;
use crate::model::scan_stats::ScanStats;
use crate::model::{BlockDevice, DeviceName, KernelText, MountNsId};
use crate::model::{DevNum, DeviceKind, HolderKind};
use std::collections::HashMap;
use std::time::Duration;

/// A qemu-nbd server whose command line carries a secret, as they do.
const CMDLINE: &str = "qemu-nbd --object secret,id=s0,data=SECRET --connect /dev/nbd0 /var/lib/vm.qcow2";

fn nbd0(server_alive: bool, holders: Vec<Holder>) -> DeviceEntry {
    let name = DeviceName::new("nbd0").expect("name");
    let devnum = DevNum::new(43, 0);
    let device =
        BlockDevice { diskseq: Some(7), ..BlockDevice::new(name.clone(), devnum, DeviceKind::Nbd, 1 << 30) };
    let nbd = NbdDevice {
        device: name,
        devnum,
        pid: Some(4242),
        server_alive,
        server_cmdline: Some(KernelText::from(CMDLINE)),
        server_comm: Some(KernelText::from("qemu-nbd")),
        backend: None,
    };
    DeviceEntry { nbd: Some(nbd), ..DeviceEntry::new(device, holders) }
}

/// The server holding the device node open, as qemu-nbd does.
fn server_holds_it() -> Holder {
    let mut h = Holder::bare(HolderKind::OpenDevice);
    h.pids = vec![4242];
    h.pid_count = 1;
    h.comm = Some(KernelText::from("qemu-nbd"));
    h.cmdline = Some(KernelText::from(CMDLINE));
    h.path = Some(KernelText::from("/dev/nbd0"));
    h.fds = vec![9];
    h
}

fn judge_alone(entry: DeviceEntry, grace: Duration) -> Judgement {
    judge_stalled(entry, grace, None)
}

fn judge_stalled(entry: DeviceEntry, grace: Duration, stall: Option<Stall>) -> Judgement {
    let devnum = entry.device.devnum;
    let scan = Scan::complete(
        DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![entry] },
        BootTime::from_since_boot(Duration::from_secs(100)),
    );
    let mut clocks = Clocks::new(None);
    let input = JudgeInput {
        grace,
        max_gap: Duration::from_secs(120),
        now: BootTime::from_since_boot(Duration::from_secs(100)),
        api: None,
        stalled: &stall.map(|s| HashMap::from([(devnum, s)])).unwrap_or_default(),
    };
    judge(&scan, &mut clocks, &input).remove(&devnum).expect("nbd0 judged")
}

#[test]
fn command_lines_stay_out_of_reasons_and_summaries() {
    let cases = [
        ("stale, served", judge_alone(nbd0(true, Vec::new()), Duration::ZERO), Verdict::Stale),
        ("suspect, served", judge_alone(nbd0(true, Vec::new()), Duration::from_secs(60)), Verdict::Suspect),
        (
            "in use by its server",
            judge_alone(nbd0(true, vec![server_holds_it()]), Duration::ZERO),
            Verdict::InUse,
        ),
    ];
    for (what, j, verdict) in cases {
        assert_eq!(j.verdict, verdict, "{what}: {j:?}");
        for text in j.reasons.iter().chain([&j.summary]) {
            assert!(
                !text.contains("SECRET") && !text.contains("--object"),
                "{what}: a command line in {text:?}"
            );
        }
        // The server is named by its command name.
        assert!(j.reasons.iter().any(|r| r.contains("qemu-nbd")), "{what}: {j:?}");
        assert!(j.summary.contains("qemu-nbd") || verdict == Verdict::InUse, "{what}: {j:?}");
    }
}

#[test]
fn a_stale_summary_has_no_age_and_stays_the_same_across_scans() {
    let entry = nbd0(false, Vec::new());
    let devnum = entry.device.devnum;
    let scan = |at: u64| Scan {
        graph: DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![entry.clone()] },
        blind_spots: Vec::new(),
        protected: Default::default(),
        stats: ScanStats::default(),
        warnings: Vec::new(),
        taken_at: BootTime::from_since_boot(Duration::from_secs(at)),
        scope: None,
        namespaces: Default::default(),
    };
    let mut clocks = Clocks::new(None);
    let mut summaries = Vec::new();
    for at in [100, 103, 106] {
        let input = JudgeInput {
            grace: Duration::from_secs(2),
            max_gap: Duration::from_secs(120),
            now: BootTime::from_since_boot(Duration::from_secs(at)),
            api: None,
            stalled: &HashMap::new(),
        };
        let j = judge(&scan(at), &mut clocks, &input).remove(&devnum).expect("judged");
        if at > 100 {
            assert_eq!(j.verdict, Verdict::Stale, "{j:?}");
            // The reasons carry the age; the summary does not.
            assert!(j.reasons[0].contains(&format!("for {}s", at - 100)), "{j:?}");
            summaries.push(j.summary);
        }
    }
    assert!(!summaries[0].contains("for 3s"), "{summaries:?}");
    assert_eq!(summaries[0], summaries[1], "the summary is what Events de-duplicate on");
}

/// An unheld candidate whose I/O does not complete is unknown (never stale, whatever the
/// grace), with the evidence first; a held device keeps its verdict with the evidence first.
#[test]
fn an_unresponsive_device_is_never_stale() {
    let stall = Stall { in_flight: 2, stalled_for: Duration::from_secs(12) };
    let j = judge_stalled(nbd0(true, Vec::new()), Duration::ZERO, Some(stall.clone()));
    assert_eq!(j.verdict, Verdict::Unknown, "{j:?}");
    assert!(j.reasons[0].starts_with("unresponsive: 2 I/O(s) in flight and none completed for 12s"), "{j:?}");
    assert!(j.summary.starts_with(Stall::SUMMARY) && !j.summary.contains("12s"), "{j:?}");
    let mut stuck = server_holds_it();
    stuck.process_state = Some('D');
    let held = judge_stalled(nbd0(true, vec![stuck]), Duration::ZERO, Some(stall));
    assert_eq!(held.verdict, Verdict::InUse, "{held:?}");
    assert!(held.reasons[0].starts_with("unresponsive:"), "{held:?}");
    assert!(held.reasons[0].ends_with("; waiting on it in D state: pid 4242 (qemu-nbd)"), "{held:?}");
    assert!(!held.summary.starts_with("unresponsive"), "the summary stays what it was: {held:?}");
}

/// A dead multipath map over iSCSI paths whose sessions are all down is an outage, not a
/// stale map: the map and its paths get `outage`, nothing is a candidate, no clock runs.
#[test]
fn a_dead_map_over_an_iscsi_outage_is_an_outage_not_stale() {
    use crate::discover::scsi::{ScsiAddress, ScsiDisk, ScsiState, Transport};
    use crate::graph::multipath::{MultipathView, PathView, ScsiView};
    use crate::graph::outage::{Outage, Scope};
    let judge_all = |outage: Option<Outage>| {
        let mut map = nbd0(false, Vec::new());
        map.nbd = None;
        map.device.name = DeviceName::new("dm-0").expect("name");
        map.device.devnum = DevNum::new(253, 0);
        map.device.kind = DeviceKind::Dm;
        map.multipath = Some(MultipathView {
            name: "mpatha".into(),
            uuid: "mpath-36001405aa".into(),
            wwid: "36001405aa".into(),
            open_count: Some(0),
            suspended: false,
            queue_if_no_path: Some(false),
            paths: vec![PathView {
                devnum: DevNum::new(8, 0),
                device: Some(DeviceName::new("sda").expect("name")),
                state: "failed",
                fail_count: 1,
                scsi_state: Some("transport-offline".into()),
            }],
            active_paths: 0,
            io_would_hang: false,
            partitions: Vec::new(),
        });
        let mut disk = nbd0(false, Vec::new());
        disk.nbd = None;
        disk.device.name = DeviceName::new("sda").expect("name");
        disk.device.devnum = DevNum::new(8, 0);
        disk.device.kind = DeviceKind::Disk;
        disk.scsi = Some(ScsiView {
            disk: ScsiDisk {
                name: DeviceName::new("sda").expect("name"),
                devnum: DevNum::new(8, 0),
                address: ScsiAddress { host: 2, channel: 0, target: 0, lun: 1 },
                state: ScsiState::TransportOffline,
                vendor: "LIO-ORG".into(),
                model: "FILEIO".into(),
                wwid: Some("naa.6001405aa".into()),
                ioerr_cnt: 0,
                iorequest_cnt: 0,
                transport: Transport::Iscsi { session: "session1".into() },
            },
            transport_state: Some("failed".into()),
            path_of: Some(DeviceName::new("dm-0").expect("name")),
            session: None,
            outage,
            lun_gone: None,
        });
        let scan = Scan::complete(
            DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![map, disk] },
            BootTime::from_since_boot(Duration::from_secs(100)),
        );
        let mut clocks = Clocks::new(None);
        let input = JudgeInput {
            grace: Duration::ZERO,
            max_gap: Duration::from_secs(120),
            now: BootTime::from_since_boot(Duration::from_secs(100)),
            api: None,
            stalled: &HashMap::new(),
        };
        let mut out = judge(&scan, &mut clocks, &input);
        let map = out.remove(&DevNum::new(253, 0)).expect("map judged");
        let disk = out.remove(&DevNum::new(8, 0)).expect("disk judged");
        let mut running = 0;
        clocks.retain(|_| {
            running += 1;
            true
        });
        (map, disk, running)
    };
    let (map, disk, clocks) = judge_all(None);
    assert_eq!((map.verdict, disk.verdict), (Verdict::Stale, Verdict::Stale), "{map:?}");
    assert_eq!(clocks, 1);
    let down = Outage { scope: Scope::Portal, key: "10.0.0.1:3260".into(), members: vec!["session1".into()] };
    let (map, disk, clocks) = judge_all(Some(down));
    assert_eq!((map.verdict, disk.verdict), (Verdict::Outage, Verdict::Outage), "{map:?} {disk:?}");
    assert!(
        map.reasons[0].starts_with("outage: the only iSCSI session to portal 10.0.0.1:3260 is down"),
        "{map:?}"
    );
    assert_eq!(clocks, 0, "no grace clock runs behind an outage");
}

/// An unheld device the agent leaves alone says what it is: an unbound loop device has nothing to
/// detach, a LUKS layer goes only with the map or disk under it, a disk is not the agent's to clean.
#[test]
fn an_unheld_device_that_is_not_cleaned_says_what_it_is() {
    let bare = |name: &str, devnum: DevNum, kind: DeviceKind| {
        BlockDevice::new(DeviceName::new(name).expect("name"), devnum, kind, 1 << 30)
    };
    let unbound = DeviceEntry::new(bare("loop7", DevNum::new(7, 7), DeviceKind::Loop), Vec::new());
    let mut crypt = bare("dm-4", DevNum::new(254, 4), DeviceKind::Dm);
    crypt.dm = Some(crate::model::DmInfo {
        name: "luks-data".into(),
        uuid: "CRYPT-LUKS2-0123456789abcdef0123456789abcdef-luks-data".into(),
        suspended: false,
    });
    let crypt = DeviceEntry::new(crypt, Vec::new());
    let disk = DeviceEntry::new(bare("vdb", DevNum::new(252, 16), DeviceKind::Disk), Vec::new());
    for (entry, says) in [
        (unbound, "unbound loop device (no backing file): there is nothing to detach"),
        (crypt, "layer is removed only with the map or disk under it"),
        (disk, "a disk is not something the agent cleans"),
    ] {
        let name = entry.device.name.to_string();
        let j = judge_alone(entry, Duration::ZERO);
        assert_eq!(j.verdict, Verdict::Unused, "{name}: {j:?}");
        assert!(j.reasons.iter().any(|r| r.contains(says)), "{name}: {:?}", j.reasons);
    }
}

/// Issue 34: the kernel keeps a loop device bound with autoclear set only while something has
/// it open (it detaches such a device at its last close): with no holder the scan sees, the
/// device is held all the same, never a candidate (so a deferred detach is not planned again).
#[test]
fn a_loop_device_bound_with_autoclear_is_held_by_an_opener_the_scan_cannot_see() {
    let mut e = crate::graph::test_support::loop3(Vec::new());
    e.device.loop_info = Some(crate::graph::test_support::loop_info(1));
    assert_eq!(judge_alone(e.clone(), Duration::ZERO).verdict, Verdict::Stale);
    e.device.loop_info.as_mut().expect("bound").autoclear = true;
    let j = judge_alone(e, Duration::ZERO);
    assert_eq!(j.verdict, Verdict::InUse, "{j:?}");
    assert!(j.reasons[0].contains("bound with autoclear set, so something has it open"), "{j:?}");
}
