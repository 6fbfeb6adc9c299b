//! Tests of dm stacks through every stage: classification, the layers above a map, their verdicts and their teardown.

use super::*;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::blindspot::BlindSpot;
use crate::model::{BlockDevice, DeviceName, HolderKind};
use crate::model::{DevNum, DeviceKind, DmInfo, MountNsId};

// The uuids the guest's kernel showed for stack-on-dead-map.sh (lvm2 2.03.16, cryptsetup
// 2.6.1, kpartx 0.9.4 on Debian's 6.1): `LVM-` + VG uuid + LV uuid (32 characters each),
// `CRYPT-<type>-<header uuid without dashes>-<name>`, `part<N>-<parent uuid>`.
const LV: &str = "LVM-GMQ8q3gvm9eaIFe4dHeeHzvfZqkF9pCWpPUByRRg4t25CCXUrMhTiePIVOYapD8S";
const LUKS2: &str = "CRYPT-LUKS2-daa1f094a6f6461ba20ed0d7b8aa243c-secret";
const LUKS1: &str = "CRYPT-LUKS1-0d8e2e7d7d5c4e1c8f6e1b3c2a1d0e9f-luks-0d8e2e7d-7d5c-4e1c-8f6e-1b3c2a1d0e9f";
const PART: &str = "part1-mpath-333333330000007d0";

#[test]
fn lvm_uuids_and_names() {
    let l = classify(LV, "vg0-lv0").expect("an LV");
    assert_eq!(
        l,
        StackLayer::LvmLv {
            vg: "vg0".into(),
            lv: "lv0".into(),
            sublayer: None,
            vg_uuid: "GMQ8q3gvm9eaIFe4dHeeHzvfZqkF9pCW".into(),
            lv_uuid: "pPUByRRg4t25CCXUrMhTiePIVOYapD8S".into(),
        }
    );
    assert_eq!(l.describe(), "LV vg0/lv0");
    assert_eq!(l.kind().as_str(), "lvm_lv");
    // `-` inside a name is doubled in the dm name.
    let l = classify(LV, "my--vg-data--lv").expect("an LV");
    assert_eq!(l.describe(), "LV my-vg/data-lv");
    // Internal layers: the uuid's suffix (and the name's third part).
    let l = classify(&format!("{LV}-real"), "vg0-lv0-real").expect("origin layer");
    assert_eq!(l.describe(), "LV vg0/lv0 (real layer)");
    let l = classify(&format!("{LV}-tpool"), "vg0-pool-tpool").expect("thin pool layer");
    assert!(matches!(l, StackLayer::LvmLv { sublayer: Some(ref s), .. } if s == "tpool"), "{l:?}");
    // A name that does not decode still leaves the uuid's verdict.
    let l = classify(LV, "odd-").expect("an LV by its uuid");
    assert_eq!(l.describe(), "LV /odd-");
    for bad in ["LVM-", "LVM-short", &format!("{LV}-"), &LV.replace('Q', "-")] {
        assert_eq!(classify(bad, "vg0-lv0"), None, "{bad}");
    }
}

#[test]
fn crypt_uuids() {
    let l = classify(LUKS2, "secret").expect("LUKS2");
    assert_eq!(
        l,
        StackLayer::Crypt {
            format: "LUKS2".into(),
            header_uuid: Some("daa1f094a6f6461ba20ed0d7b8aa243c".into()),
            name: "secret".into()
        }
    );
    assert_eq!(l.describe(), "crypt mapping secret (LUKS2)");
    // systemd-cryptsetup names mappings luks-<uuid with dashes>: the name keeps them.
    let l = classify(LUKS1, "x").expect("LUKS1");
    assert!(
        matches!(&l, StackLayer::Crypt { format, name, .. } if format == "LUKS1" && name == "luks-0d8e2e7d-7d5c-4e1c-8f6e-1b3c2a1d0e9f"),
        "{l:?}"
    );
    let l = classify("CRYPT-PLAIN-swapcrypt", "swapcrypt").expect("plain");
    assert_eq!(l, StackLayer::Crypt { format: "PLAIN".into(), header_uuid: None, name: "swapcrypt".into() });
    assert_eq!(l.kind(), LayerKind::Crypt);
    for bad in ["CRYPT-", "CRYPT-LUKS2", "CRYPT--x", "CRYPT-LUKS2-"] {
        assert_eq!(classify(bad, "x"), None, "{bad}");
    }
}

#[test]
fn partition_maps_and_others() {
    assert_eq!(
        classify(PART, "mpathb1"),
        Some(StackLayer::PartitionMap { number: 1, parent_uuid: "mpath-333333330000007d0".into() })
    );
    assert_eq!(partition("part12-LVM-x"), Some((12, "LVM-x")));
    for other in
        ["mpath-333333330000007d0", "", "part-mpath-1", "partx-mpath-1", "part1-", "CRYPTO-x", "lvm-x"]
    {
        assert_eq!(classify(other, "x"), None, "{other}");
    }
}

fn dm(name: &str, minor: u32, uuid: &str, dm_name: &str, slaves: &[&str], holders: &[&str]) -> DeviceEntry {
    let n = |s: &&str| DeviceName::new(s).expect("name");
    DeviceEntry::new(
        BlockDevice {
            name: DeviceName::new(name).expect("name"),
            devnum: DevNum::new(254, minor),
            kind: DeviceKind::Dm,
            size_bytes: 16 << 20,
            read_only: false,
            parent: None,
            holders: holders.iter().map(n).collect(),
            slaves: slaves.iter().map(n).collect(),
            loop_info: None,
            dm: Some(DmInfo { name: dm_name.into(), uuid: uuid.into(), suspended: false }),
            diskseq: None,
        },
        holders
            .iter()
            .map(|h| {
                let mut x = Holder::bare(HolderKind::StackedDevice);
                x.device = Some(n(h));
                x
            })
            .collect(),
    )
}

fn mount(host: bool) -> Holder {
    let mut h = Holder::bare(HolderKind::Mount);
    h.in_host_namespace = Some(host);
    h.mount_namespace = Some(MountNsId(if host { 1 } else { 2 }));
    h.mount_point = Some("/mnt/x".into());
    h
}

/// map dm-0 ← part1 dm-1 ← LV dm-2 ← crypt dm-3; LV dm-4 directly on the map.
fn graph() -> DeviceGraph {
    let mut map = dm("dm-0", 0, "mpath-333333330000007d0", "mpathb", &["sda", "sdb"], &["dm-1", "dm-4"]);
    map.multipath = Some(crate::graph::multipath::MultipathView {
        name: "mpathb".into(),
        uuid: "mpath-333333330000007d0".into(),
        wwid: "333333330000007d0".into(),
        open_count: Some(2),
        suspended: false,
        queue_if_no_path: Some(true),
        paths: Vec::new(),
        active_paths: 0,
        io_would_hang: true,
        partitions: vec![DeviceName::new("dm-1").expect("n")],
    });
    let lv2 = LV.replace("pPUB", "IPvG");
    DeviceGraph {
        host_ns: MountNsId(1),
        host_ns_unsure: None,
        devices: vec![
            map,
            dm("dm-1", 1, PART, "mpathb1", &["dm-0"], &["dm-2"]),
            dm("dm-2", 2, LV, "vg0-lv0", &["dm-1"], &["dm-3"]),
            dm("dm-3", 3, LUKS2, "secret", &["dm-2"], &[]),
            dm("dm-4", 4, &lv2, "vg1-lv1", &["dm-0"], &[]),
        ],
    }
}

fn names(a: &Above<'_>) -> Vec<String> {
    a.layers.iter().map(|l| l.entry.device.name.to_string()).collect()
}

#[test]
fn layers_go_top_down_and_partition_maps_last() {
    let g = graph();
    let a = above(&g.devices[0], &g);
    assert_eq!(names(&a), ["dm-3", "dm-2", "dm-4", "dm-1"], "{a:?}");
    assert!(a.blocking.is_empty() && a.releasable.is_empty(), "{a:?}");
    assert_eq!(
        a.layers[0].path,
        "crypt mapping secret (LUKS2) (dm-3) on LV vg0/lv0 (dm-2) on partition map 1 (dm-1)"
    );
    assert!(a.covers(&g.devices[0].holders[0]) && a.covers(&g.devices[0].holders[1]));
    assert_eq!(base_maps(&g.devices[3], &g), [DeviceName::new("dm-0").expect("n")]);
    assert!(base_maps(&g.devices[0], &g).is_empty());
    assert_eq!(kind_label(&g.devices[3].device), "crypt");
    assert_eq!(kind_label(&g.devices[0].device), "dm");
}

#[test]
fn a_held_top_blocks_and_names_the_way_to_it() {
    let mut g = graph();
    g.devices[3].holders.push(mount(true));
    g.devices[4].holders.push(mount(false));
    let a = above(&g.devices[0], &g);
    assert_eq!(a.releasable.len(), 1, "the foreign mount on dm-4: {a:?}");
    assert_eq!(a.releasable[0].0.device.name.as_str(), "dm-4");
    assert_eq!(a.blocking.len(), 1, "{a:?}");
    let b = &a.blocking[0];
    assert!(
        b.starts_with("mounted at /mnt/x in the host's mount namespace")
            && b.contains("(on crypt mapping secret (LUKS2) (dm-3) on LV vg0/lv0 (dm-2) on partition map 1 (dm-1), stacked on dm-0)"),
        "{b}"
    );
    // A stuck reader is releasable; an open fd is not.
    let mut g = graph();
    let mut reader = Holder::bare(HolderKind::OpenDevice);
    reader.pids = vec![42];
    reader.process_state = Some('D');
    g.devices[3].holders.push(reader.clone());
    reader.process_state = Some('S');
    g.devices[2].holders.push(reader);
    let a = above(&g.devices[0], &g);
    assert_eq!((a.releasable.len(), a.blocking.len()), (1, 1), "{a:?}");
    assert!(
        a.blocking[0].contains("(on LV vg0/lv0 (dm-2) on partition map 1 (dm-1), stacked on dm-0)"),
        "{a:?}"
    );
}

#[test]
fn foreign_devices_and_outside_slaves_block() {
    // An md device (no dm uuid of a layer) on the LV, and the LV spanning sdc too.
    let mut g = graph();
    g.devices[2].holders.push({
        let mut h = Holder::bare(HolderKind::StackedDevice);
        h.device = Some(DeviceName::new("md0").expect("n"));
        h
    });
    g.devices[4].device.slaves.push(DeviceName::new("sdc").expect("n"));
    let a = above(&g.devices[0], &g);
    assert_eq!(a.blocking.len(), 2, "{a:?}");
    assert!(a.blocking[0].starts_with("device md0 is stacked on it (on LV vg0/lv0 (dm-2)"), "{a:?}");
    assert!(a.blocking[1].starts_with("LV vg1/lv1 (dm-4) also sits on sdc"), "{a:?}");
}

// ---- the policy, the plan and the re-check over a stack -------------------------------

use std::collections::HashMap;
use std::time::Duration;

use crate::discover::namespaces::NsEntry;
use crate::discover::probe::{Claim, KernelWord};
use crate::graph::scan::Scan;
use crate::host::clock::BootTime;
use crate::judge::grace::Clocks;
use crate::judge::{self, Judgement, Verdict};
use crate::plan::{self, Action};

fn scan_of(g: DeviceGraph) -> Scan {
    Scan::complete(g, BootTime::from_since_boot(Duration::from_secs(100)))
}

fn judge(scan: &Scan) -> HashMap<DevNum, Judgement> {
    let mut clocks = Clocks::new(None);
    let input = judge::JudgeInput {
        grace: Duration::ZERO,
        max_gap: Duration::from_secs(120),
        now: BootTime::from_since_boot(Duration::from_secs(100)),
        api: None,
        stalled: &HashMap::new(),
    };
    judge::verdicts::judge(scan, &mut clocks, &input)
}

fn foreign_mount() -> Holder {
    let mut h = mount(false);
    h.pids = vec![300];
    h.mount_id = Some(77);
    h.mount_dev = Some(DevNum::new(254, 3));
    h.fstype = Some("ext4".into());
    h.namespace_entry = Some(NsEntry::Task { pid: 300, tid: 300 });
    h
}

fn verdict(j: &HashMap<DevNum, Judgement>, minor: u32) -> &Judgement {
    j.get(&DevNum::new(254, minor)).expect("judged")
}

#[test]
fn an_unheld_stack_on_a_dead_map_is_stale_with_it_and_planned_top_down() {
    let mut g = graph();
    g.devices[3].holders.push(foreign_mount());
    let scan = scan_of(g);
    let j = judge(&scan);
    let map = verdict(&j, 0);
    assert_eq!(map.verdict, Verdict::Stale, "{map:?}");
    assert!(map.reasons[0].contains("1 mount(s) in other namespaces to release first"), "{map:?}");
    assert!(
        map.reasons[0].contains("4 layer(s) stacked on it removed first: crypt mapping secret (LUKS2) (dm-3), LV vg0/lv0 (dm-2), LV vg1/lv1 (dm-4), partition map 1 (dm-1)"),
        "{map:?}"
    );
    for minor in 1..=4 {
        let l = verdict(&j, minor);
        assert_eq!(l.verdict, Verdict::Stale, "dm-{minor}: {l:?}");
        assert!(l.reasons[0].contains("is stacked on map dm-0, which is stale: removed with it"), "{l:?}");
    }

    let p = plan::multipath::teardown_map(&scan.graph.devices[0], &scan.graph, false);
    assert_eq!(p.refusal, None, "{p:?}");
    let steps: Vec<(&str, &str)> = p.steps.iter().map(|s| (s.action(), s.device.as_str())).collect();
    assert_eq!(
        steps,
        [
            ("dm_message", "dm-0"),
            ("detach_mount", "dm-3"),
            ("dm_remove", "dm-3"),
            ("dm_remove", "dm-2"),
            ("dm_remove", "dm-4"),
            ("dm_remove", "dm-1"),
            ("dm_remove", "dm-0"),
        ]
    );
    // Each removal by the uuid of the device it acts on, with that device's identity.
    for s in &p.steps {
        let e = scan.graph.devices.iter().find(|e| e.device.name == s.device).expect("entry");
        assert_eq!(s.identity, crate::graph::identity::Identity::of(e));
        if let Action::DmRemove { uuid, deferred } = &s.action {
            assert_eq!(Some(uuid), e.device.dm.as_ref().map(|d| &d.uuid));
            assert!(!deferred);
        }
    }
    // A layer is never cleaned on its own.
    let alone = plan::clean::for_clean(
        &scan.graph.devices[2],
        &scan.graph,
        crate::model::opt_ins::CleanOptions::default(),
    );
    assert!(alone.steps.is_empty() && !alone.unsupported, "{alone:?}");
    assert!(alone.refusal.as_deref().is_some_and(|r| r.contains("LV vg0/lv0 stacked on dm-0")), "{alone:?}");
}

#[test]
fn a_held_top_keeps_the_whole_stack_in_use_and_the_map_names_it() {
    let mut g = graph();
    g.devices[3].holders.push(mount(true));
    let scan = scan_of(g);
    let j = judge(&scan);
    let map = verdict(&j, 0);
    assert_eq!(map.verdict, Verdict::InUse, "{map:?}");
    assert!(
        map.reasons[0].starts_with("mounted at /mnt/x in the host's mount namespace")
            && map.reasons[0].contains("on crypt mapping secret (LUKS2) (dm-3) on LV vg0/lv0 (dm-2) on partition map 1 (dm-1), stacked on dm-0"),
        "{map:?}"
    );
    assert_eq!(verdict(&j, 3).verdict, Verdict::InUse, "the held top");
    for minor in [1, 2, 4] {
        let l = verdict(&j, minor);
        assert_ne!(l.verdict, Verdict::Stale, "dm-{minor}: {l:?}");
        assert!(l.reasons.iter().any(|r| r.contains("is stacked on map dm-0")), "{l:?}");
    }
    let p = plan::multipath::teardown_map(&scan.graph.devices[0], &scan.graph, false);
    assert!(p.steps.is_empty(), "{p:?}");
    assert!(p.refusal.as_deref().is_some_and(|r| r.contains("host's mount namespace")), "{p:?}");
}

#[test]
fn a_blind_spot_over_a_layer_makes_the_map_unknown() {
    let mut scan = scan_of(graph());
    scan.blind_spots.push(BlindSpot::devices(vec![DeviceName::new("dm-3").expect("n")], "a namespace"));
    let j = judge(&scan);
    assert_eq!(verdict(&j, 0).verdict, Verdict::Unknown, "{:?}", verdict(&j, 0));
}

fn word(claim: Claim, holders: &[&str]) -> KernelWord {
    KernelWord {
        claim,
        sysfs_holders: holders.iter().map(|h| DeviceName::new(h).expect("n")).collect(),
        live_filesystems: Vec::new(),
        loops_on_top: Vec::new(),
        dm_open_count: Some(holders.len() as i32),
        unreadable: Vec::new(),
    }
}

/// Right before each step the kernel's word must match exactly what the plan accounts for:
/// the layers' claim on the map before `fail_if_no_path`, nothing before a removal.
#[test]
fn the_recheck_accepts_exactly_the_layers_the_plan_removes() {
    use crate::engine::recheck::refusal;
    let mut g = graph();
    g.devices[3].holders.push(foreign_mount());
    let scan = scan_of(g);
    let p = plan::multipath::teardown_map(&scan.graph.devices[0], &scan.graph, false);
    let now = BootTime::from_since_boot(Duration::from_secs(100));
    let map = &scan.graph.devices[0];
    let stop = &p.steps[0];
    assert_eq!(refusal(&p, stop, &scan, map, &word(Claim::Claimed, &["dm-1", "dm-4"]), None, now), None);
    // A stacked device the plan does not remove is refused.
    let r = refusal(&p, stop, &scan, map, &word(Claim::Claimed, &["dm-1", "dm-4", "dm-9"]), None, now);
    assert!(r.as_deref().is_some_and(|r| r.contains("dm-9")), "{r:?}");
    // Removing the LV while the crypt mapping is still on it: refused.
    let lv = &scan.graph.devices[2];
    let remove_lv = p.steps.iter().find(|s| s.device.as_str() == "dm-2").expect("step");
    let r = refusal(&p, remove_lv, &scan, lv, &word(Claim::Claimed, &["dm-3"]), None, now);
    assert!(r.as_deref().is_some_and(|r| r.contains("dm-3")), "{r:?}");
    // Once it is gone, the LV goes.
    let mut bare_lv = lv.clone();
    bare_lv.holders.clear();
    bare_lv.device.holders.clear();
    assert_eq!(refusal(&p, remove_lv, &scan, &bare_lv, &word(Claim::Unclaimed, &[]), None, now), None);
    // Removing the map while a layer is still on it: refused.
    let remove_map = p.steps.last().expect("step");
    let r = refusal(&p, remove_map, &scan, map, &word(Claim::Claimed, &["dm-1"]), None, now);
    assert!(r.is_some(), "{r:?}");
}

/// The map's open count against what the plan accounts for: one open per layer's table the
/// plan removes and per open file of a stuck reader it frees (its fds told apart by the kernel:
/// a dup is the same open file). More is an opener the scan cannot see (an fd in flight over a
/// unix socket, which two fds of one open file used to hide); fewer is a picture of the openers
/// that is wrong somewhere; an unreadable count or fds the kernel cannot tell apart: all refused,
/// with both numbers or why.
#[test]
fn the_dm_open_count_must_equal_the_openers_the_plan_accounts_for() {
    use crate::engine::recheck::{expected_fds, expected_openers, openers};
    let mut g = graph();
    let mut reader = Holder::bare(HolderKind::OpenDevice);
    reader.pids = vec![42];
    reader.fds = vec![3, 4];
    reader.process_state = Some('D');
    g.devices[0].holders.push(reader);
    let scan = scan_of(g);
    let p = plan::multipath::teardown_map(&scan.graph.devices[0], &scan.graph, false);
    assert_eq!(p.expected_openers, vec![42], "{p:?}");
    let map = &scan.graph.devices[0];
    assert_eq!(expected_fds(&p, map), Ok(vec![(42, 3), (42, 4)]));
    let stop = &p.steps[0];
    assert!(matches!(stop.action, Action::DmMessage { .. }), "{stop:?}");
    let mut w = word(Claim::Claimed, &["dm-1", "dm-4"]);
    // fds 3 and 4 are one open file (a dup): three opens in all.
    let e = expected_openers(&p, stop, map, &w, Ok(1));
    assert_eq!((e.filesystems, e.stacked.len(), e.fds, e.total()), (0, 2, 2, Ok(3)), "{e:?}");
    for (count, files, refused) in [(3, 1, false), (4, 2, false), (4, 1, true), (2, 1, true), (0, 1, true)] {
        w.dm_open_count = Some(count);
        let r = openers(&p, stop, map, &w, Ok(files));
        assert_eq!(r.is_some(), refused, "open count {count}, {files} open file(s): {r:?}");
    }
    // The fd in flight the old "at most, per fd" comparison let through (4 <= 2 + 2).
    w.dm_open_count = Some(4);
    let r = openers(&p, stop, map, &w, Ok(1)).unwrap_or_default();
    assert!(
        r.starts_with("open count 4, accounted 3 (stacked dm-1, dm-4 removed, 1 open file(s) of stuck readers, 2 fd(s)): something the scan cannot see holds dm-0 open (an fd in flight over a unix socket"),
        "{r}"
    );
    w.dm_open_count = Some(2);
    let r = openers(&p, stop, map, &w, Ok(1)).unwrap_or_default();
    assert!(
        r.starts_with("open count 2, accounted 3 (")
            && r.contains("fewer openers than the plan accounts for"),
        "{r}"
    );
    // The kernel cannot tell the fds apart (EPERM, a reader gone while compared): refused.
    w.dm_open_count = Some(3);
    let r = openers(&p, stop, map, &w, Err("kcmp(KCMP_FILE) of fd 3 of pid 42 and fd 4 of pid 42 (both on 253:0): Operation not permitted (os error 1)".into()))
        .unwrap_or_default();
    assert!(r.contains("2 fd(s) of its stuck readers are one open file cannot be told (kcmp"), "{r}");
    // A dm step whose open count cannot be read: refused.
    w.dm_open_count = None;
    let r = openers(&p, stop, map, &w, Ok(1)).unwrap_or_default();
    assert!(r.starts_with("the open count of dm-0 cannot be read"), "{r}");
    // Before the map's own removal the layers are gone: only the stuck reader's open file counts.
    let remove_map = p.steps.iter().rfind(|s| matches!(s.action, Action::DmRemove { .. })).expect("step");
    assert_eq!(remove_map.devnum, map.device.devnum);
    let mut bare = map.clone();
    bare.device.holders.clear();
    bare.holders.retain(|h| h.kind == HolderKind::OpenDevice);
    let mut w = word(Claim::Unclaimed, &[]);
    w.dm_open_count = Some(1);
    assert_eq!(openers(&p, remove_map, &bare, &w, Ok(1)), None);
    // The reader exited before the count: its fds are gone, nothing is accounted, nothing open.
    w.dm_open_count = Some(0);
    assert_eq!(openers(&p, remove_map, &bare, &w, Ok(0)), None);
    w.dm_open_count = Some(2);
    let r = openers(&p, remove_map, &bare, &w, Ok(1)).unwrap_or_default();
    assert!(r.starts_with("open count 2, accounted 1 (1 open file(s) of stuck readers, 2 fd(s))"), "{r}");
    // A step that is not a dm step is not compared.
    let scsi = p.steps.iter().find(|s| matches!(s.action, Action::ScsiDelete { .. }));
    if let Some(s) = scsi {
        assert_eq!(openers(&p, s, &bare, &w, Ok(1)), None);
    }
    // A reader the scan saw without its fd numbers cannot be asked about.
    let mut no_fds = map.clone();
    no_fds.holders.iter_mut().filter(|h| h.kind == HolderKind::OpenDevice).for_each(|h| h.fds.clear());
    assert!(expected_fds(&p, &no_fds).is_err_and(|e| e.contains("no fd numbers")));
}

/// Crash recovery closes an interrupted removal of a layer like any dm removal: gone, the
/// same layer still there (planned again with its map), or another device at its number.
#[test]
fn an_interrupted_layer_removal_is_recovered() {
    use crate::act::journal::Resolution;
    use crate::engine::recover::{resolve, Interrupted};
    let scan = scan_of(graph());
    let p = plan::multipath::teardown_map(&scan.graph.devices[0], &scan.graph, false);
    let step = p.steps.iter().find(|s| s.device.as_str() == "dm-2").expect("the LV's removal");
    let record = serde_json::json!({"id": "1-4242-0", "phase": "intent", "step": step});
    let i = Interrupted::from_record(&record).expect("an intent");
    assert_eq!((i.action(), i.device.as_str()), ("dm_remove", "dm-2"));
    assert_eq!(resolve(&i, None).word, Resolution::Gone);
    assert_eq!(resolve(&i, Some(&scan.graph.devices[2])).word, Resolution::Replan);
    let mut other = scan.graph.devices[2].clone();
    other.device.dm.as_mut().expect("dm").uuid = LV.replace("pPUB", "bbbb");
    assert_eq!(resolve(&i, Some(&other)).word, Resolution::IdentityChanged);
}

/// The layer shows in the JSON output (`stack`) and in the API (its own DeviceKind and
/// `Device.stack`), with what its uuid and name say.
#[test]
fn layers_in_the_output_and_the_api() {
    use blockjanitor_proto::v1 as pb;
    use blockjanitor_rpc::view::values::stack_value;
    let g = graph();
    let stack =
        |i: usize| layer_of(&g.devices[i].device).map(|l| stack_value(&crate::engine::wire::stack_layer(&l)));
    let v = stack(2).expect("an LV");
    assert_eq!(v["kind"], "lvm_lv", "{v:#}");
    assert_eq!((v["vg"].as_str(), v["lv"].as_str()), (Some("vg0"), Some("lv0")));
    let v = stack(3).expect("a crypt mapping");
    assert_eq!((v["kind"].as_str(), v["crypt_name"].as_str()), (Some("crypt"), Some("secret")));
    assert!(stack(0).is_none());

    let l = layer_of(&g.devices[1].device).expect("partition map");
    let m = crate::engine::wire::stack_layer(&l);
    assert_eq!(m.kind, pb::DeviceKind::PartitionMap as i32);
    assert_eq!((m.partition_number, m.parent_uuid.as_str()), (1, "mpath-333333330000007d0"));
    assert_eq!(m.description, "partition map 1");
    let m = crate::engine::wire::stack_layer(&layer_of(&g.devices[3].device).expect("crypt"));
    assert_eq!((m.kind, m.crypt_format.as_str()), (pb::DeviceKind::Crypt as i32, "LUKS2"));
    assert_eq!(m.crypt_header_uuid, "daa1f094a6f6461ba20ed0d7b8aa243c");
    let m = crate::engine::wire::stack_layer(&layer_of(&g.devices[2].device).expect("LV"));
    assert_eq!((m.kind, m.vg.as_str(), m.lv.as_str()), (pb::DeviceKind::LvmLv as i32, "vg0", "lv0"));
}
