//! The safety contract as a property, over 10,000 generated devices: whatever the device, its
//! holders, its kubelet evidence and its grace clock, no destructive step is ever planned for a
//! device that is protected or that a pod on this node uses, a device is never removed while
//! something holds it that its plan cannot release, and `release` never detaches a mount in the
//! host's namespace or a shared peer of one.
//!
//! It runs the same code paths as `clean`, `release` and the daemon's Plan: verdicts
//! (`Tracker::judge`, `policy::with_api`), then `plan::for_clean` / `plan::cleanup` /
//! `plan::release`, then `plan::gate` (release: `plan::safety_gate`).

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use blockjanitor::discover::namespaces::NsEntry;
use blockjanitor::discover::nbd::NbdDevice;
use blockjanitor::discover::rbd::RbdMapping;
use blockjanitor::discover::scsi::{ScsiAddress, ScsiDisk, ScsiState, Transport};
use blockjanitor::graph::{DeviceEntry, DeviceGraph, Holder};
use blockjanitor::kube::{ClusterView, PodInfo, VaInfo};
use blockjanitor::model::{BlockDevice, DevNum, DeviceKind, DeviceName, HolderKind, LoopInfo, MountNsId};
use blockjanitor::owner::KubeOwner;
use blockjanitor::plan::{self, CleanOptions, Plan, Step};
use blockjanitor::policy::{self, Tracker};
use blockjanitor::storage::{MultipathView, PathView, ScsiView};
use proptest::prelude::*;

const HOST_NS: MountNsId = MountNsId(4026531840);
const KINDS: [HolderKind; 9] = HolderKind::ALL;

fn name(s: &str) -> DeviceName {
    DeviceName::new(s).expect("name")
}

fn holder(kind_ix: usize, host: bool, stuck: bool, shared: Option<u32>, n: u32) -> Holder {
    Holder {
        kind: KINDS[kind_ix % KINDS.len()],
        pids: vec![1000 + n],
        pid_count: 1,
        comm: Some("proc".into()),
        cmdline: None,
        process_state: Some(if stuck { 'D' } else { 'S' }),
        mount_namespace: Some(if host { HOST_NS } else { MountNsId(4026532000 + u64::from(n)) }),
        in_host_namespace: Some(host),
        mount_point: Some(format!("/mnt/v{n}").into()),
        container_id: None,
        pod_uid: None,
        mount_id: Some(100 + n),
        fstype: Some("ext4".into()),
        source: None,
        shared_group: shared,
        namespace_entry: Some(NsEntry::Task { pid: 1000 + n, tid: 1000 + n }),
        path: Some(format!("/p{n}").into()),
        fds: vec![3],
        device: Some(name(&format!("dm-{n}"))),
    }
}

#[derive(Debug, Clone)]
struct Case {
    kind: u8,
    holders: Vec<(usize, bool, bool, Option<u32>)>,
    pods: bool,
    kubelet: bool,
    protected: bool,
    grace_zero: bool,
    paths_active: Vec<bool>,
    scsi_offline: bool,
    /// The Kubernetes API, when in use: (synced, a running pod uses pvc-1, pvc-1 attached here).
    api: Option<(bool, bool, bool)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        0u8..5,
        proptest::collection::vec(
            (0usize..9, any::<bool>(), any::<bool>(), proptest::option::of(1u32..4)),
            0..4,
        ),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(any::<bool>(), 0..3),
        any::<bool>(),
        proptest::option::of((any::<bool>(), any::<bool>(), any::<bool>())),
    )
        .prop_map(
            |(kind, holders, pods, kubelet, protected, grace_zero, paths_active, scsi_offline, api)| Case {
                kind,
                holders,
                pods,
                kubelet,
                protected,
                grace_zero,
                paths_active,
                scsi_offline,
                api,
            },
        )
}

fn entry(c: &Case) -> DeviceEntry {
    let (kind, dev_name, devnum) = match c.kind {
        0 => (DeviceKind::Loop, "loop3", DevNum::new(7, 3)),
        1 => (DeviceKind::Rbd, "rbd0", DevNum::new(252, 0)),
        2 => (DeviceKind::Nbd, "nbd0", DevNum::new(43, 0)),
        3 => (DeviceKind::Dm, "dm-0", DevNum::new(253, 0)),
        _ => (DeviceKind::Disk, "sdx", DevNum::new(8, 240)),
    };
    let device = BlockDevice {
        name: name(dev_name),
        devnum,
        kind,
        size_bytes: 1 << 30,
        read_only: false,
        parent: None,
        holders: Vec::new(),
        slaves: Vec::new(),
        loop_info: (kind == DeviceKind::Loop).then(|| LoopInfo {
            backing_file: "/var/lib/images/v.img".into(),
            backing_deleted: false,
            offset: 0,
            sizelimit: 0,
            autoclear: true,
            read_only: false,
            backing_dev: Some(DevNum::new(254, 0)),
            backing_inode: Some(12),
        }),
        dm: None,
    };
    let holders = c
        .holders
        .iter()
        .enumerate()
        .map(|(i, (k, host, stuck, shared))| holder(*k, *host, *stuck, *shared, i as u32))
        .collect();
    let multipath = (c.kind == 3).then(|| MultipathView {
        name: "mpatha".into(),
        uuid: "mpath-3600".into(),
        wwid: "3600".into(),
        open_count: Some(0),
        suspended: false,
        queue_if_no_path: Some(true),
        active_paths: c.paths_active.iter().filter(|a| **a).count(),
        io_would_hang: !c.paths_active.iter().any(|a| *a),
        paths: c
            .paths_active
            .iter()
            .enumerate()
            .map(|(i, a)| PathView {
                devnum: DevNum::new(8, 16 * i as u32),
                device: None,
                state: if *a { "active" } else { "failed" },
                fail_count: 1,
                scsi_state: None,
            })
            .collect(),
        partitions: Vec::new(),
    });
    let scsi = (c.kind == 4).then(|| ScsiView {
        disk: ScsiDisk {
            name: name("sdx"),
            devnum,
            address: ScsiAddress { host: 0, channel: 0, target: 0, lun: 1 },
            state: if c.scsi_offline { ScsiState::Offline } else { ScsiState::Running },
            vendor: "V".into(),
            model: "M".into(),
            wwid: Some("naa.1".into()),
            ioerr_cnt: 0,
            iorequest_cnt: 0,
            transport: Transport::Other,
        },
        transport_state: None,
        path_of: None,
    });
    DeviceEntry {
        device,
        holders,
        kernel_threads: Vec::new(),
        multipath,
        scsi,
        rbd: (c.kind == 1).then(|| RbdMapping {
            id: 0,
            device: name("rbd0"),
            devnum,
            pool: "k8s".into(),
            pool_ns: String::new(),
            image: "img".into(),
            image_id: "abc".into(),
            snap: "-".into(),
            client_id: "client4122".into(),
            watcher_client: "client.4122".into(),
            client_addr: "10.0.0.1:0/1".into(),
            cluster_fsid: "f".into(),
            dev_paths: Vec::new(),
            fenced: None,
        }),
        nbd: (c.kind == 2).then(|| NbdDevice {
            device: name("nbd0"),
            devnum,
            pid: Some(4242),
            server_alive: false,
            server_cmdline: None,
            backend: None,
        }),
        kubernetes: c.kubelet.then(|| KubeOwner {
            pv_names: vec!["pvc-1".into()],
            pod_uids: if c.pods { vec!["uid-1".into()] } else { Vec::new() },
            paths: vec!["/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount".into()],
            ..Default::default()
        }),
    }
}

/// Steps that remove or unbind the device itself.
fn removes_device(s: &Step) -> bool {
    matches!(
        s,
        Step::DetachLoop { .. }
            | Step::DmRemove { .. }
            | Step::ScsiDelete { .. }
            | Step::ScsiOffline { .. }
            | Step::RbdUnmap { .. }
            | Step::NbdDisconnect { .. }
    )
}

/// A holder no plan may release: anything but a mount in another namespace (not shared with
/// the host), a reader stuck in D state (maps only, freed by fail_if_no_path).
fn blocking(h: &Holder, is_map: bool) -> bool {
    let foreign_mount = h.kind == HolderKind::Mount && h.in_host_namespace == Some(false);
    let stuck_reader = is_map && h.kind == HolderKind::OpenDevice && h.process_state == Some('D');
    !(foreign_mount || stuck_reader)
}

fn plans(c: &Case) -> (DeviceEntry, Vec<Plan>) {
    let e = entry(c);
    let graph = DeviceGraph { host_ns: HOST_NS, devices: vec![e.clone()] };
    let mut protected = HashSet::new();
    if c.protected {
        protected.insert(e.device.devnum);
    }
    let grace = if c.grace_zero { Duration::ZERO } else { Duration::from_secs(300) };
    let verdicts = Tracker::default().judge(&graph, &protected, grace, SystemTime::now());
    let view = c.api.map(|(synced, pod, attached)| ClusterView {
        node_name: "node-a".into(),
        pods_on_node: if pod {
            vec![PodInfo {
                uid: "uid-9".into(),
                namespace: "ns".into(),
                name: "app".into(),
                phase: "Running".into(),
                pvc_names: vec!["data".into()],
                pv_names: vec!["pvc-1".into()],
            }]
        } else {
            Vec::new()
        },
        volume_attachments: if attached {
            vec![VaInfo {
                name: "csi-1".into(),
                attacher: "rbd.csi.ceph.com".into(),
                node: "node-a".into(),
                pv: Some("pvc-1".into()),
                attached: true,
            }]
        } else {
            Vec::new()
        },
        pvs: Vec::new(),
        synced,
        last_error: (!synced).then(|| "connection refused".into()),
        ..Default::default()
    });
    let judged = verdicts.get(&e.device.devnum).cloned().map(|j| policy::with_api(j, &e, view.as_ref()));
    let j = judged.as_ref();
    // The same gates `clean`, the daemon's Plan/Apply and its modes apply.
    let mut clean = plan::for_clean(&e, &graph, CleanOptions::default());
    plan::gate(&mut clean, &e, j);
    let mut cleanup = plan::cleanup(&e);
    plan::gate(&mut cleanup, &e, j);
    let mut release = plan::release(&e);
    plan::safety_gate(&mut release, &e, j);
    (e, vec![clean, cleanup, release])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10_000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn no_destructive_step_for_protected_or_pod_used_or_held_devices(c in case()) {
        let (e, plans) = plans(&c);
                // The API's word counts for a device it can tie to pvc-1 (kubelet names that PV); an API
        // that is not synced vouches for nothing.
        let api_user = c.api.is_some_and(|(synced, pod, attached)| !synced || (c.kubelet && (pod || attached)));
        let pod_user = c.kubelet && c.pods;
        let is_map = e.multipath.is_some();
        let held = e.holders.iter().any(|h| blocking(h, is_map));
        let host_groups: Vec<u32> = e.holders.iter().filter(|h| h.in_host_namespace == Some(true) && h.kind == HolderKind::Mount).filter_map(|h| h.shared_group).collect();
        for p in &plans {
                        if c.protected || pod_user || api_user {
                prop_assert!(p.steps.is_empty(), "{:?} planned {:?} for a protected or pod-used device, or one the API cannot vouch for", p.operation, p.steps);
            }
            if held {
                prop_assert!(!p.steps.iter().any(removes_device), "{:?} removes a held device: {:?}", p.operation, p.steps);
            }
            if is_map && c.paths_active.iter().any(|a| *a) {
                prop_assert!(!p.steps.iter().any(removes_device), "a map with an active path was torn down: {:?}", p.steps);
            }
            for s in &p.steps {
                if let Step::DetachMount { mount_id, .. } = s {
                    let h = e.holders.iter().find(|h| h.mount_id == Some(*mount_id)).expect("planned from a holder");
                    prop_assert_eq!(h.in_host_namespace, Some(false), "a host mount was detached");
                    prop_assert!(h.shared_group.is_none_or(|g| !host_groups.contains(&g)), "a shared peer of a host mount was detached");
                }
            }
        }
    }
}
