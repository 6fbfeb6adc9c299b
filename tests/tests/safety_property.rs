//! The safety contract as a property of the one request workflow every way in runs
//! (`blockjanitor::engine::Engine::carry_out`: the one-shot CLI, the daemon's modes, the gRPC and
//! the console's forwarded Apply), driven over a simulated machine whose truth the engine can
//! only partly see.
//!
//! Each case is a device (loop, rbd, nbd, a multipath map with two paths, an offline disk) with
//! holders the scan sees, maybe a holder it cannot see (a filesystem claim no mount table shows,
//! an open fd of a process it cannot read, which comes with a blind spot, or an fd of a map in
//! flight over a unix socket, which only the dm open count shows, maybe beside a reader whose
//! two dup'd fds are one open file), a history of
//! observations (gaps in time, incomplete scans, moments it was held), mounts in chains of peer
//! groups (a copy of a copy of a host mount), each mount below a parent with peer groups of its
//! own (at the place other mounts share below theirs, or its own; the parents may join a group
//! between plan and step), another device's mount at that place, process holders with a thread in
//! another mount namespace (their own cwd there, or the process's fds used from both),
//! `--force-busy`, the Kubernetes API's state (one watch silent among answering ones included),
//! protection, kubelet's pods, failing steps, and maybe the device number reused by another
//! device between plan and execute. The engine scans, judges (with grace clocks that persist
//! across observations), plans `clean` or `release` and executes; the simulated machine checks,
//! at the instant each step reaches it, against the truth:
//!
//! - a destructive step acts only on the device it was planned for (same identity);
//! - nothing the plan does not release holds the device (no hidden holder, no visible one but the
//!   mounts it releases and the readers stuck on a dead map);
//! - the device was seen unheld by complete scans, continuously (no gap over the allowed one),
//!   for the whole grace period;
//! - the API, when in use, vouches and says no pod or attachment uses it; it is not protected
//!   and no pod uses it per kubelet;
//! - a step runs only after every step it depends on finished;
//! - a release never detaches a mount in the host's namespace or a copy of one through any chain
//!   of peer groups (the oracle computes the chain on its own), nor a mount in a
//!   namespace where a process (through any of its tasks) uses the filesystem unless forced, nor
//!   one of a device the kernel holds otherwise (swap, a loop backing file, a stacked device),
//!   forced or not: that frees nothing;
//! - what the kernel's unmount takes with it through the parent's peer group (the oracle works it
//!   out on its own, as `fs/pnode.c` does) is only ever a copy of the same device that could have
//!   been released itself: never the host's mount, a copy of one, another device's, or one in use.
//!
//! `scripts/mutation-check.sh` removes each gate in turn (completeness, identity, the API, the
//! kernel's word, the users of a mount a release detaches, what an unmount takes with it through
//! propagation, the dm openers, a volume in use per the API that no device serves once the plan's
//! subject is gone, and the openers compared as they were before issue 34: at most,
//! fds counted one by one) and requires this test to fail; the journal must end with no intent
//! and no plan left open.

use std::cell::{Cell, RefCell};
use std::collections::{HashSet, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use blockjanitor::act::{ActError, StepOutcome};
use blockjanitor::discover::mountinfo;
use blockjanitor::discover::namespaces::NsEntry;
use blockjanitor::discover::nbd::NbdDevice;
use blockjanitor::discover::probe::{Claim, KernelWord};
use blockjanitor::discover::rbd::RbdMapping;
use blockjanitor::discover::scsi::{ScsiAddress, ScsiDisk, ScsiState, Transport};
use blockjanitor::engine::error::EngineError;
use blockjanitor::engine::outcome::{Request, Subject};
use blockjanitor::engine::workflow::Resumer;
use blockjanitor::engine::world::World;
use blockjanitor::engine::{Engine, Operation, Settings};
use blockjanitor::graph::identity::Identity;
use blockjanitor::graph::multipath::{MultipathView, PathView, ScsiView};
use blockjanitor::graph::nvme::{NvmeRole, NvmeView};
use blockjanitor::graph::owner::KubeOwner;
use blockjanitor::graph::propagation::NsTable;
use blockjanitor::graph::scan::{Scan, Target};
use blockjanitor::graph::{DeviceEntry, DeviceGraph, Holder};
use blockjanitor::host::clock::BootTime;
use blockjanitor::judge::grace::Clocks;
use blockjanitor::kube::{ClusterView, PodInfo, VaInfo, WatchHealth};
use blockjanitor::model::blindspot::BlindSpot;
use blockjanitor::model::opt_ins::{CleanOptions, ReleaseOptions};
use blockjanitor::model::scan_stats::ScanStats;
use blockjanitor::model::{BlockDevice, DevNum, DeviceKind, DeviceName, HolderKind, LoopInfo, MountNsId};
use blockjanitor::plan::{Action, Step};
use proptest::prelude::*;

const HOST_NS: MountNsId = MountNsId(4026531840);
const GRACE: Duration = Duration::from_secs(300);
const MAX_GAP: Duration = Duration::from_secs(120);

fn name(s: &str) -> DeviceName {
    DeviceName::new(s).expect("name")
}

/// What kind of device the case is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Loop,
    Rbd,
    Nbd,
    Map,
    Disk,
    /// An NVMe-oF namespace head served by one controller: live when `paths_active` > 0, else
    /// reconnecting for ever.
    Nvme,
}

/// A holder the scan cannot see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hidden {
    /// A filesystem alive on the device that no mount table shows (btrfs not joined, an overlay
    /// upper directory): only the kernel's word (its claim, /sys/fs) tells.
    Claim,
    /// An open fd of a process the scan could not read: the scan knows it is blind.
    Open,
    /// An fd of the map in flight over a unix socket (SCM_RIGHTS), or an io_uring fixed file:
    /// no process shows it and the scan is not blind; only the dm open count tells (maps only).
    InFlight,
}

/// The Kubernetes API's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    NotConfigured,
    Vouches,
    Unsynced,
    Silent,
    NoNode,
    PodUses,
    Attached,
    /// The Node answers and two watches hear from the server, but the pods watch has heard
    /// nothing (no event, no bookmark) for longer than the silence bound.
    SilentWatch,
}

/// A holder the scan sees: (kind, in the host's namespace, D state, its mount's propagation).
type Seen = (usize, bool, bool, Option<Group>);

/// A mount's place in the peer groups (`shared:N`, `master:N`, both: a copy of a copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Shared(u32),
    Slave(u32),
    /// `shared:N master:M`: a peer group of its own that receives from M (chains of copies).
    SharedSlave(u32, u32),
}

/// One observation before the plan: seconds since the last one, whether the scan was blind,
/// whether something held the device at that moment.
type Observation = (u64, bool, bool);

/// A mount's parent, for the propagation of its unmount (gotcha 29): the parent's peer groups
/// (`None`: private) and whether the mount sits at the place every such mount of the case
/// shares below its parent (`/k{i}/v`), or at one of its own (`/k{i}/v{i}`).
type Parent = (Option<Group>, bool);

/// A thread of a process holder in another mount namespace (gotcha 30): the index of the holder
/// whose namespace it joined, and whether the holder is that thread's own cwd or root (else
/// what the whole process holds, used from both namespaces).
type Thread = (usize, bool);

#[derive(Debug, Clone)]
struct Case {
    kind: Kind,
    op: Operation,
    holders: Vec<Seen>,
    hidden: Option<Hidden>,
    extra_blind: bool,
    history: Vec<Observation>,
    protected: bool,
    kubelet_pods: bool,
    api: Api,
    paths_active: usize,
    /// The device number is reused by another device between plan and execute.
    swap: bool,
    /// Step indexes whose run fails.
    failing: Vec<usize>,
    /// Each process holding the device node open has two fds of one open file (a `dup`): the
    /// kernel counts one open for both, the fd scan sees two.
    dup: bool,
    /// The run is killed mid-plan, and the daemon's start recovers it (through the workflow).
    crash: Option<Crash>,
    /// Each holder's mount's parent (missing: private, a place of its own).
    parents: Vec<Parent>,
    /// Each process holder's thread in another namespace, if any.
    threads: Vec<Option<Thread>>,
    /// Another device's mount at the shared place in a namespace of its own (or the host's,
    /// `true`), below a parent with these peer groups: what a propagated unmount may take.
    bystander: Option<(Group, bool)>,
    /// The operator forces a release (`--force-busy`): process users do not stop it.
    force_busy: bool,
    /// Between the plan and its first step, every mount's parent becomes a peer of group 1:
    /// only the re-check right before a detach can see what its unmount would take then.
    late_share: bool,
}

/// A run killed (SIGKILL) right after the intent of the `at`th step to reach the kernel was
/// journaled, before the kernel saw it; then the world moves on (the API's state, the device
/// number reused, a holder the scan cannot see) and the daemon's start recovers the journal
/// through the one workflow (`Engine::recover_all`): every resumed step is held to the same
/// oracle as a new one.
#[derive(Debug, Clone, Copy)]
struct Crash {
    at: usize,
    api: Api,
    swap: bool,
    hidden: Option<Hidden>,
}

/// The payload of the simulated kill (so the panic hook keeps quiet about it).
struct SimulatedCrash;

fn case() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![
        Just(Kind::Loop),
        Just(Kind::Rbd),
        Just(Kind::Nbd),
        Just(Kind::Map),
        Just(Kind::Disk),
        Just(Kind::Nvme)
    ];
    let op = prop_oneof![4 => Just(Operation::Clean), 1 => Just(Operation::Release)];
    let seen = (0usize..10, any::<bool>(), any::<bool>(), proptest::option::of(group()));
    let hidden =
        proptest::option::of(prop_oneof![Just(Hidden::Claim), Just(Hidden::Open), Just(Hidden::InFlight)]);
    let api = prop_oneof![
        3 => Just(Api::NotConfigured),
        3 => Just(Api::Vouches),
        1 => Just(Api::Unsynced),
        1 => Just(Api::Silent),
        1 => Just(Api::SilentWatch),
        1 => Just(Api::NoNode),
        1 => Just(Api::PodUses),
        1 => Just(Api::Attached),
    ];
    let observation =
        (prop_oneof![3 => 1u64..100, 1 => 100u64..400], prop::bool::weighted(0.1), prop::bool::weighted(0.1));
    (
        (kind, op, proptest::collection::vec(seen, 0..3), hidden.clone(), prop::bool::weighted(0.1)),
        (
            proptest::collection::vec(observation, 0..8),
            prop::bool::weighted(0.1),
            prop::bool::weighted(0.1),
            api.clone(),
        ),
        (0usize..3, prop::bool::weighted(0.15), proptest::collection::vec(0usize..8, 0..2), any::<bool>()),
        proptest::option::weighted(
            0.2,
            (0usize..4, api, prop::bool::weighted(0.2), hidden).prop_map(|(at, api, swap, hidden)| Crash {
                at,
                api,
                swap,
                hidden,
            }),
        ),
        propagation(),
    )
        .prop_map(
            |(
                (kind, op, holders, hidden, extra_blind),
                (history, protected, kubelet_pods, api),
                (paths_active, swap, failing, dup),
                crash,
                (parents, threads, bystander, force_busy, late_share),
            )| Case {
                kind,
                op,
                holders,
                hidden,
                extra_blind,
                history,
                protected,
                kubelet_pods,
                api,
                paths_active,
                swap,
                failing,
                dup,
                crash,
                parents,
                threads,
                bystander,
                force_busy,
                late_share,
            },
        )
}

fn group() -> impl Strategy<Value = Group> {
    prop_oneof![
        (1u32..4).prop_map(Group::Shared),
        (1u32..4).prop_map(Group::Slave),
        (1u32..4, 1u32..4).prop_map(|(g, m)| Group::SharedSlave(g, m)),
    ]
}

/// The parents of the mounts (their peer groups, the place below them), threads of process
/// holders in other namespaces, another device's mount at the shared place, `--force-busy`.
type Propagation = (Vec<Parent>, Vec<Option<Thread>>, Option<(Group, bool)>, bool, bool);

/// A [`Propagation`] for a case.
fn propagation() -> impl Strategy<Value = Propagation> {
    let shared = prop_oneof![2 => (1u32..3).prop_map(Group::Shared), 1 => group()];
    let parent = (proptest::option::weighted(0.6, shared), prop::bool::weighted(0.7));
    let thread = proptest::option::weighted(0.3, (0usize..4, any::<bool>()));
    (
        proptest::collection::vec(parent, 0..4),
        proptest::collection::vec(thread, 0..4),
        proptest::option::weighted(0.2, (group(), prop::bool::weighted(0.3))),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
    )
}

/// Releases of a device mounted in several namespaces below parents that propagate: the scenes
/// of gotchas 29 and 30 come up often, next to the general cases.
fn release_scene() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![3 => Just(0usize), 2 => 0usize..10];
    let seen = (kind, prop::bool::weighted(0.3), Just(false), proptest::option::weighted(0.2, group()));
    (
        proptest::collection::vec(seen, 1..4),
        propagation(),
        prop_oneof![Just(Api::NotConfigured), Just(Api::Vouches)],
    )
        .prop_map(|(holders, (parents, threads, bystander, force_busy, late_share), api)| Case {
            holders,
            parents,
            threads,
            bystander,
            force_busy,
            late_share,
            ..plain(Kind::Loop, Operation::Release, api)
        })
}

/// Clean-ups of a dead map (or disk) killed mid-plan and resumed at the daemon's start once the
/// world moved on: the scene where the subject is gone before the crash and the API speaks of
/// its volume only after comes up often, next to the general cases.
fn resume_scene() -> impl Strategy<Value = Case> {
    let api = prop_oneof![
        Just(Api::NotConfigured),
        Just(Api::Vouches),
        Just(Api::PodUses),
        Just(Api::Attached),
        Just(Api::Silent),
    ];
    (
        prop_oneof![3 => Just(Kind::Map), 1 => Just(Kind::Disk)],
        prop_oneof![Just(Api::NotConfigured), Just(Api::Vouches)],
        (0usize..6, api, prop::bool::weighted(0.2)),
    )
        .prop_map(|(kind, api, (at, after, swap))| Case {
            history: vec![(60, false, false); 6],
            crash: Some(Crash { at, api: after, swap, hidden: None }),
            ..plain(kind, Operation::Clean, api)
        })
}

/// A case of `kind` and `op` with the API in state `api` and nothing else going on (no holder,
/// history, failure, crash or propagation): what the scenes and the fixed tests build on.
fn plain(kind: Kind, op: Operation, api: Api) -> Case {
    Case {
        kind,
        op,
        holders: Vec::new(),
        hidden: None,
        extra_blind: false,
        history: Vec::new(),
        protected: false,
        kubelet_pods: false,
        api,
        paths_active: 0,
        swap: false,
        failing: Vec::new(),
        dup: false,
        crash: None,
        parents: Vec::new(),
        threads: Vec::new(),
        bystander: None,
        force_busy: false,
        late_share: false,
    }
}

fn any_case() -> impl Strategy<Value = Case> {
    prop_oneof![6 => case(), 2 => release_scene(), 1 => resume_scene()]
}

/// One device of the simulated machine.
#[derive(Debug, Clone)]
struct Dev {
    name: DeviceName,
    devnum: DevNum,
    /// The kernel's disk sequence: a new device at the same number gets a new one.
    seq: u64,
    holders: Vec<Holder>,
    gone: bool,
}

/// The simulated machine: its truth, its clock, and what reached its "kernel".
struct Machine {
    case: Case,
    /// The Kubernetes API's state now (the case's, until a crash moves the world on).
    api: Cell<Api>,
    /// The index of the step to reach the kernel at which the run is killed.
    crash_at: Cell<Option<usize>>,
    devs: RefCell<Vec<Dev>>,
    hidden: Cell<Option<Hidden>>,
    blind: Cell<bool>,
    now: Cell<BootTime>,
    /// Complete, unheld observations of the subject's current identity, as (time, seq).
    history: RefCell<Vec<(BootTime, Option<u64>)>>,
    runs: RefCell<Vec<Step>>,
    violations: RefCell<Vec<String>>,
    failing: RefCell<VecDeque<usize>>,
    /// The bystander's mount (another device's) was taken by a propagated unmount.
    bystander_gone: Cell<bool>,
    /// Each mount's parent now (the case's, until `late_share` changes them).
    parents: RefCell<Vec<Parent>>,
}

/// The mount namespace of holder `i`: the host's, or one of its own.
fn ns_of(i: usize, host: bool) -> MountNsId {
    if host {
        HOST_NS
    } else {
        MountNsId(4026532000 + i as u64)
    }
}

/// The namespace of the bystander (another device's mount at the shared place).
fn bystander_ns(host: bool) -> MountNsId {
    if host {
        HOST_NS
    } else {
        MountNsId(4026533000)
    }
}

/// Where holder `i`'s mount sits: below its parent `/k{i}`, at the shared place `v` or its own.
fn mount_point(i: usize, common: bool) -> String {
    if common {
        format!("/k{i}/v")
    } else {
        format!("/k{i}/v{i}")
    }
}

fn holder(i: usize, (kind_ix, host, stuck, group): Seen) -> Holder {
    let kind = HolderKind::ALL[kind_ix % 9]; // every kind the scan reports (not the kernel-only one)
    let n = i as u32;
    let (shared, master) = match group {
        Some(Group::Shared(g)) => (Some(g), None),
        Some(Group::Slave(m)) => (None, Some(m)),
        Some(Group::SharedSlave(g, m)) => (Some(g), Some(m)),
        None => (None, None),
    };
    Holder {
        kind,
        pids: vec![1000 + n],
        pid_count: 1,
        comm: Some("proc".into()),
        cmdline: None,
        process_state: Some(if stuck { 'D' } else { 'S' }),
        mount_namespace: Some(ns_of(i, host)),
        tid: None,
        other_namespaces: Vec::new(),
        in_host_namespace: Some(host),
        mount_point: Some(format!("/mnt/v{n}").as_str().into()),
        container_id: None,
        pod_uid: None,
        mount_id: Some(100 + n),
        fstype: Some("ext4".into()),
        source: None,
        shared_group: shared,
        master_group: master,
        upstream_groups: Vec::new(),
        mount_dev: Some(DevNum::new(7, 0)),
        namespace_entry: Some(NsEntry::Task { pid: 1000 + n, tid: 1000 + n }),
        path: Some(format!("/p{n}").as_str().into()),
        fds: vec![3],
        device: Some(name(&format!("dm-{}", 10 + n))),
        access: String::new(),
    }
}

impl Machine {
    /// The mount ids of the `detach_mount` steps run so far.
    fn detached_mounts(&self) -> Vec<u32> {
        self.runs
            .borrow()
            .iter()
            .filter_map(|s| match &s.action {
                Action::DetachMount { mount_id, .. } => Some(*mount_id),
                _ => None,
            })
            .collect()
    }

    fn new(case: &Case) -> Self {
        let (subject, devnum) = match case.kind {
            Kind::Loop => ("loop3", DevNum::new(7, 3)),
            Kind::Rbd => ("rbd0", DevNum::new(252, 0)),
            Kind::Nbd => ("nbd0", DevNum::new(43, 0)),
            Kind::Map => ("dm-0", DevNum::new(253, 0)),
            Kind::Disk => ("sdx", DevNum::new(8, 240)),
            Kind::Nvme => ("nvme0n1", DevNum::new(259, 1)),
        };
        let mut devs = vec![Dev { name: name(subject), devnum, seq: 1, holders: Vec::new(), gone: false }];
        if case.kind == Kind::Map {
            for (i, p) in ["sda", "sdb"].iter().enumerate() {
                let mut h = Holder { device: Some(name("dm-0")), ..holder(50, (7, true, false, None)) };
                h.kind = HolderKind::StackedDevice;
                devs.push(Dev {
                    name: name(p),
                    devnum: DevNum::new(8, 16 * i as u32),
                    seq: 10 + i as u64,
                    holders: vec![h],
                    gone: false,
                });
            }
        }
        Self {
            case: case.clone(),
            api: Cell::new(case.api),
            crash_at: Cell::new(case.crash.map(|c| c.at)),
            devs: RefCell::new(devs),
            hidden: Cell::new(None),
            blind: Cell::new(false),
            now: Cell::new(BootTime::from_since_boot(Duration::from_secs(10_000))),
            history: RefCell::new(Vec::new()),
            runs: RefCell::new(Vec::new()),
            violations: RefCell::new(Vec::new()),
            failing: RefCell::new(case.failing.iter().copied().collect()),
            bystander_gone: Cell::new(false),
            parents: RefCell::new(case.parents.clone()),
        }
    }

    fn subject(&self) -> Dev {
        self.devs.borrow()[0].clone()
    }

    fn entry(&self, d: &Dev, i: usize) -> DeviceEntry {
        let c = &self.case;
        let kind = match (i, c.kind) {
            (0, Kind::Loop) => DeviceKind::Loop,
            (0, Kind::Rbd) => DeviceKind::Rbd,
            (0, Kind::Nbd) => DeviceKind::Nbd,
            (0, Kind::Map) => DeviceKind::Dm,
            (0, Kind::Nvme) => DeviceKind::NvmeNamespace,
            _ => DeviceKind::Disk,
        };
        let device = BlockDevice {
            name: d.name.clone(),
            devnum: d.devnum,
            kind,
            size_bytes: 1 << 30,
            read_only: false,
            parent: None,
            holders: d
                .holders
                .iter()
                .filter(|h| h.kind == HolderKind::StackedDevice)
                .filter_map(|h| h.device.clone())
                .collect(),
            slaves: Vec::new(),
            loop_info: (kind == DeviceKind::Loop).then(|| LoopInfo {
                backing_file: "/var/lib/images/v.img".into(),
                backing_deleted: false,
                offset: 0,
                sizelimit: 0,
                autoclear: false,
                read_only: false,
                backing_dev: Some(DevNum::new(254, 0)),
                backing_inode: Some(d.seq),
                backing_rdev: None,
                status_blocked: None,
            }),
            dm: (kind == DeviceKind::Dm).then(|| blockjanitor::model::DmInfo {
                name: "mpatha".into(),
                uuid: format!("mpath-3600{}", d.seq),
                suspended: false,
            }),
            diskseq: Some(d.seq),
        };
        let multipath = (kind == DeviceKind::Dm).then(|| MultipathView {
            name: "mpatha".into(),
            uuid: format!("mpath-3600{}", d.seq),
            wwid: "3600".into(),
            open_count: Some(0),
            suspended: false,
            queue_if_no_path: Some(true),
            active_paths: c.paths_active.min(2),
            io_would_hang: c.paths_active == 0,
            paths: (0..2)
                .map(|p| PathView {
                    devnum: DevNum::new(8, 16 * p as u32),
                    device: Some(name(["sda", "sdb"][p])),
                    state: if p < c.paths_active { "active" } else { "failed" },
                    fail_count: 1,
                    scsi_state: None,
                })
                .collect(),
            partitions: Vec::new(),
        });
        let scsi = (i > 0 || c.kind == Kind::Disk).then(|| ScsiView {
            disk: ScsiDisk {
                name: d.name.clone(),
                devnum: d.devnum,
                address: ScsiAddress { host: i as u32, channel: 0, target: 0, lun: 1 },
                state: if i > 0 || c.paths_active == 0 { ScsiState::Offline } else { ScsiState::Running },
                vendor: "V".into(),
                model: "M".into(),
                wwid: Some(format!("naa.{}", d.seq)),
                ioerr_cnt: 0,
                iorequest_cnt: 0,
                transport: Transport::Other,
            },
            transport_state: None,
            path_of: (i > 0 && !self.devs.borrow()[0].gone).then(|| name("dm-0")),
            session: None,
            outage: None,
            lun_gone: None,
        });
        // The kubelet directory names the device's PV whenever the API's state (now: a crash
        // moves the world on) has a pod or an attachment using it.
        let kubernetes = (i == 0
            && (c.kubelet_pods || matches!(self.api.get(), Api::PodUses | Api::Attached)))
        .then(|| KubeOwner {
            pv_names: vec!["pvc-1".into()],
            pod_uids: if c.kubelet_pods { vec!["uid-1".into()] } else { Vec::new() },
            paths: vec!["/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~csi/pvc-1/mount".into()],
            ..Default::default()
        });
        DeviceEntry {
            device,
            holders: d.holders.clone(),
            kernel_threads: Vec::new(),
            multipath,
            scsi,
            rbd: (i == 0 && c.kind == Kind::Rbd).then(|| RbdMapping {
                id: 0,
                device: d.name.clone(),
                devnum: d.devnum,
                pool: "k8s".into(),
                pool_ns: String::new(),
                image: format!("img{}", d.seq),
                image_id: format!("abc{}", d.seq),
                snap: "-".into(),
                client_id: "client4122".into(),
                watcher_client: "client.4122".into(),
                client_addr: "10.0.0.1:0/1".into(),
                cluster_fsid: "f".into(),
                dev_paths: Vec::new(),
                fenced: None,
                attach_record: None,
            }),
            nbd: (i == 0 && c.kind == Kind::Nbd).then(|| NbdDevice {
                device: d.name.clone(),
                devnum: d.devnum,
                pid: Some(4000 + d.seq as u32),
                server_alive: false,
                server_cmdline: None,
                server_comm: None,
                backend: None,
            }),
            nvme: (i == 0 && c.kind == Kind::Nvme).then(|| nvme_view(c.paths_active > 0)),
            kubernetes,
            io: None,
        }
    }

    /// Whether the subject is held now, by anything (seen or hidden) but what `allowed` accepts.
    fn held_beyond(&self, allowed: impl Fn(&Holder) -> bool) -> Option<String> {
        if let Some(h) = self.hidden.get() {
            return Some(format!("a hidden holder ({h:?})"));
        }
        self.subject().holders.iter().find(|h| !allowed(h)).map(|h| format!("a {:?} holder", h.kind))
    }

    /// Records one observation of the subject as it is now: complete and unheld, or not.
    fn observe(&self, complete: bool) {
        let s = self.subject();
        let unheld = self.hidden.get().is_none() && candidate_holders(&s.holders, self.case.kind);
        let mut h = self.history.borrow_mut();
        if complete && unheld && !s.gone {
            h.push((self.now.get(), Some(s.seq)));
        } else {
            h.push((self.now.get(), None));
        }
    }

    /// Since when the subject's current identity has been seen unheld by complete scans with no
    /// gap over `MAX_GAP`, up to now (`None`: not now).
    fn unheld_since(&self) -> Option<BootTime> {
        let seq = self.subject().seq;
        let h = self.history.borrow();
        let mut since = None;
        let mut last: Option<BootTime> = None;
        for (t, s) in h.iter() {
            match (s, last) {
                (Some(q), Some(l)) if *q == seq && since.is_some() && t.since(l) <= MAX_GAP => {}
                (Some(q), _) if *q == seq => since = Some(*t),
                _ => since = None,
            }
            last = Some(*t);
        }
        since
    }

    fn violation(&self, v: String) {
        self.violations.borrow_mut().push(v);
    }
}

/// Holders a cleanup candidate may have: none, or for a map only mounts in other namespaces (not
/// copies of host mounts) and readers stuck in D state on it.
fn candidate_holders(holders: &[Holder], kind: Kind) -> bool {
    holders.iter().all(|h| kind == Kind::Map && (foreign_plain_mount(h, holders) || stuck_reader(h)))
}

/// A mount in another namespace that is tied to no mount live in the host's namespace by
/// propagation, through any chain of peer groups: the truth, computed here on its own (not by
/// the agent's code). Groups carrying the host's mount: the host mounts' own, and every group
/// whose mounts receive from one of those (a copy of a copy...). Groups the host's mount
/// receives from: the host mounts' masters, and their masters in turn. A mount in or receiving
/// from the first kind, or in the second, is tied to the host's mount.
fn foreign_plain_mount(h: &Holder, all: &[Holder]) -> bool {
    let mounts: Vec<&Holder> = all.iter().filter(|x| x.kind == HolderKind::Mount).collect();
    let host = |x: &&&Holder| x.in_host_namespace == Some(true);
    let mut carrying: HashSet<u32> = mounts.iter().filter(host).filter_map(|x| x.shared_group).collect();
    let mut feeding: HashSet<u32> = mounts.iter().filter(host).filter_map(|x| x.master_group).collect();
    loop {
        let before = (carrying.len(), feeding.len());
        for x in &mounts {
            if let (Some(g), Some(m)) = (x.shared_group, x.master_group) {
                if carrying.contains(&m) {
                    carrying.insert(g);
                }
                if feeding.contains(&g) {
                    feeding.insert(m);
                }
            }
        }
        if (carrying.len(), feeding.len()) == before {
            break;
        }
    }
    h.kind == HolderKind::Mount
        && h.in_host_namespace == Some(false)
        && !h.shared_group.is_some_and(|g| carrying.contains(&g) || feeding.contains(&g))
        && !h.master_group.is_some_and(|g| carrying.contains(&g))
}

/// The subject of a [`Kind::Nvme`] case: a head of subsystem `nqn.test:a` behind one NVMe/TCP
/// controller.
fn nvme_view(live: bool) -> NvmeView {
    use blockjanitor::discover::nvme::{CtrlState, NvmeAddress, NvmeController, Timeout};
    NvmeView {
        role: NvmeRole::Head,
        subsystem: Some("nvme-subsys0".into()),
        subsysnqn: "nqn.test:a".into(),
        head: None,
        controllers: vec![NvmeController {
            name: "nvme0".into(),
            transport: "tcp".into(),
            subsysnqn: "nqn.test:a".into(),
            address: NvmeAddress::parse("traddr=10.0.0.5,trsvcid=4420"),
            state: if live { CtrlState::Live } else { CtrlState::Connecting },
            ctrl_loss_tmo: Some(Timeout::Off),
            reconnect_delay: Some(Timeout::Seconds(10)),
            cntlid: Some(1),
            hostnqn: None,
            subsystem: Some("nvme-subsys0".into()),
            namespaces: vec![name("nvme0c0n1")],
            fabrics: true,
        }],
        live: usize::from(live),
        outage: None,
        siblings: Vec::new(),
        siblings_held: Vec::new(),
    }
}

fn stuck_reader(h: &Holder) -> bool {
    h.kind == HolderKind::OpenDevice && h.process_state == Some('D')
}

#[derive(Clone)]
struct Sim(Rc<Machine>);

impl World for Sim {
    fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        let m = &self.0;
        let devs = m.devs.borrow().clone();
        if let Target::Device(d) = target {
            if !devs.iter().any(|x| x.devnum == d && !x.gone) {
                return Err(EngineError::NotFound(format!("no {d}")));
            }
        }
        let devices = devs.iter().enumerate().filter(|(_, d)| !d.gone).map(|(i, d)| m.entry(d, i)).collect();
        let mut blind_spots = Vec::new();
        if m.blind.get() || m.hidden.get() == Some(Hidden::Open) {
            blind_spots.push(BlindSpot::any("pid 999 (hidden) cannot be inspected"));
        }
        let protected = if m.case.protected {
            devs.iter().map(|d| (d.devnum, "it is listed".to_owned())).collect()
        } else {
            Default::default()
        };
        Ok(Scan {
            graph: DeviceGraph { host_ns: HOST_NS, host_ns_unsure: None, devices },
            blind_spots,
            protected,
            stats: ScanStats::default(),
            warnings: Vec::new(),
            taken_at: m.now.get(),
            scope: None,
            // The simulated world answers the tables from its own model (`mount_tables`).
            namespaces: Default::default(),
        })
    }

    fn kernel_word(&self, device: &DeviceName, _devnum: DevNum) -> KernelWord {
        let m = &self.0;
        let dev = m.devs.borrow().iter().find(|d| &d.name == device).cloned();
        let holders = dev.map(|d| d.holders).unwrap_or_default();
        let subject = *device == m.subject().name;
        let fs = holders.iter().any(|h| h.kind == HolderKind::Mount)
            || (subject && m.hidden.get() == Some(Hidden::Claim));
        let offline_disk = m.case.kind == Kind::Disk || !subject;
        KernelWord {
            claim: if fs {
                Claim::Claimed
            } else if offline_disk {
                Claim::Inconclusive("the kernel refuses opens of an offline disk (ENXIO)".into())
            } else {
                Claim::Unclaimed
            },
            sysfs_holders: holders
                .iter()
                .filter(|h| h.kind == HolderKind::StackedDevice)
                .filter_map(|h| h.device.clone())
                .collect(),
            live_filesystems: if fs { vec!["ext4 at /sys/fs/ext4/x".into()] } else { Vec::new() },
            loops_on_top: Vec::new(),
            // The map's opens: its filesystem's superblock, each open file of it (a process's
            // fds are one open file: dup'd, or a single fd), each device stacked on it, swap, a
            // loop device on its node, and an fd in flight.
            dm_open_count: (m.case.kind == Kind::Map && subject).then(|| {
                let opens: usize = holders
                    .iter()
                    .map(|h| match h.kind {
                        HolderKind::OpenDevice => 1,
                        HolderKind::StackedDevice | HolderKind::Swap | HolderKind::LoopBacking => 1,
                        _ => 0,
                    })
                    .sum();
                i32::from(fs) + opens as i32 + i32::from(m.hidden.get() == Some(Hidden::InFlight))
            }),
            unreadable: Vec::new(),
        }
    }

    fn mount_tables(&self, _scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
        // Real mountinfo lines: each mount of the subject below its parent tmpfs `/k{i}` (with
        // the case's peer groups), the bystander's below its own, in each namespace.
        let m = &self.0;
        let c = &m.case;
        let mut text: std::collections::BTreeMap<MountNsId, String> =
            (0..c.holders.len().max(c.threads.len())).map(|i| (ns_of(i, false), String::new())).collect();
        text.insert(HOST_NS, String::new());
        for h in m.subject().holders.iter().filter(|h| h.kind == HolderKind::Mount) {
            let (Some(id), Some(ns)) = (h.mount_id, h.mount_namespace) else { continue };
            let i = id.saturating_sub(100) as usize;
            let (g, common) = parent(&m.parents.borrow(), i);
            let own = match (h.shared_group, h.master_group) {
                (Some(g), Some(m)) => format!(" shared:{g} master:{m}"),
                (Some(g), None) => format!(" shared:{g}"),
                (None, Some(m)) => format!(" master:{m}"),
                (None, None) => String::new(),
            };
            let t = text.entry(ns).or_default();
            t.push_str(&format!("{} 1 0:50 / /k{i} rw{} - tmpfs tmpfs rw\n", 500 + i, parent_fields(g)));
            t.push_str(&format!(
                "{id} {} 7:0 / {} rw{own} - ext4 /dev/loop3 rw\n",
                500 + i,
                mount_point(i, common)
            ));
        }
        if let (Some((g, host)), false) = (c.bystander, m.bystander_gone.get()) {
            let t = text.entry(bystander_ns(host)).or_default();
            t.push_str(&format!("950 1 0:51 / /k950 rw{} - tmpfs tmpfs rw\n", parent_fields(Some(g))));
            t.push_str("900 950 7:99 / /k950/v rw - ext4 /dev/loop99 rw\n");
        }
        text.into_iter()
            .filter(|(ns, _)| wanted(*ns))
            .map(|(ns, t)| (ns, mountinfo::parse(t.as_bytes()).map_err(|e| e.to_string())))
            .collect()
    }

    /// The kernel's `kcmp`: the fds still open on the device, one open file per process.
    fn open_files(&self, devnum: DevNum, fds: &[(u32, u32)]) -> Result<usize, String> {
        let devs = self.0.devs.borrow();
        let holders = devs.iter().find(|d| d.devnum == devnum && !d.gone).map_or(&[][..], |d| &d.holders[..]);
        let open = |&(pid, fd): &(u32, u32)| {
            holders
                .iter()
                .any(|h| h.kind == HolderKind::OpenDevice && h.pids.contains(&pid) && h.fds.contains(&fd))
        };
        let pids: HashSet<u32> = fds.iter().filter(|f| open(f)).map(|(pid, _)| *pid).collect();
        Ok(pids.len())
    }

    fn cluster(&self) -> Option<ClusterView> {
        let now = self.0.now.get();
        let vouching = ClusterView {
            node_name: "node-a".into(),
            synced: true,
            node_found: Some(true),
            last_contact: Some(now),
            ..Default::default()
        };
        let pod = PodInfo {
            uid: "uid-9".into(),
            namespace: "ns".into(),
            name: "app".into(),
            phase: "Running".into(),
            pvc_names: vec!["data".into()],
            pv_names: vec!["pvc-1".into()],
            mirror_of: None,
            containers: Vec::new(),
            host_paths: Vec::new(),
        };
        let va = VaInfo {
            name: "csi-1".into(),
            attacher: "x".into(),
            node: "node-a".into(),
            pv: Some("pvc-1".into()),
            attached: true,
        };
        match self.0.api.get() {
            Api::NotConfigured => None,
            Api::Vouches => Some(vouching),
            Api::Unsynced => Some(ClusterView {
                synced: false,
                last_error: Some("pods: connection refused".into()),
                ..vouching
            }),
            Api::Silent => Some(ClusterView {
                last_contact: Some(BootTime::from_since_boot(Duration::from_secs(1))),
                ..vouching
            }),
            Api::NoNode => Some(ClusterView { node_found: Some(false), ..vouching }),
            Api::SilentWatch => {
                let long_ago = BootTime::from_since_boot(Duration::from_secs(1));
                let watch =
                    |resource, heard| WatchHealth { resource, synced: true, error: None, heard: Some(heard) };
                Some(ClusterView {
                    watches: vec![
                        watch("pods", long_ago),
                        watch("volumeattachments", now),
                        watch("persistentvolumes", now),
                    ],
                    ..vouching
                })
            }
            Api::PodUses => Some(ClusterView { pods_on_node: vec![pod], ..vouching }),
            Api::Attached => Some(ClusterView { volume_attachments: vec![va], ..vouching }),
        }
    }

    fn can_act(&self) -> Result<(), String> {
        Ok(())
    }

    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        let m = &self.0;
        if let Action::DetachMount { mount_id, .. } = &step.action {
            // The actuator's own check: the planned mount must still be there.
            let present =
                m.devs.borrow().iter().any(|d| {
                    d.devnum == step.devnum && d.holders.iter().any(|h| h.mount_id == Some(*mount_id))
                });
            if !present {
                return Ok(StepOutcome::AlreadyAbsent);
            }
        }
        let index = m.runs.borrow().len();
        if m.crash_at.get() == Some(index) {
            // Killed after the intent was journaled, before the kernel saw anything.
            m.crash_at.set(None);
            std::panic::panic_any(SimulatedCrash);
        }
        m.runs.borrow_mut().push(step.clone());
        m.check(step);
        if m.failing.borrow().contains(&index) {
            return Err(ActError::Syscall {
                device: step.device.clone(),
                op: "simulated",
                source: std::io::Error::other("simulated failure"),
            });
        }
        m.apply(step);
        Ok(StepOutcome::Done)
    }

    fn now(&self) -> BootTime {
        self.0.now.get()
    }
}

impl Machine {
    /// The oracle: what must hold, in truth, when `step` reaches the kernel.
    fn check(&self, step: &Step) {
        let c = &self.case;
        let devs = self.devs.borrow().clone();
        let Some(dev) = devs.iter().find(|d| d.devnum == step.devnum && !d.gone) else {
            return; // already gone: the step finds nothing to do
        };
        let i = devs.iter().position(|d| d.devnum == dev.devnum).unwrap_or(0);
        if Identity::of(&self.entry(dev, i)) != step.identity {
            self.violation(format!(
                "{} ran on {} although the device there changed identity",
                step.action(),
                step.device
            ));
        }
        if c.protected {
            self.violation(format!("{} ran on a protected device", step.action()));
        }
        if c.kubelet_pods {
            self.violation(format!("{} ran on a device a pod uses per kubelet", step.action()));
        }
        if !matches!(self.api.get(), Api::NotConfigured | Api::Vouches) {
            self.violation(format!("{} ran while the API said {:?}", step.action(), self.api.get()));
        }
        if let Action::DetachMount { mount_id, .. } = &step.action {
            if c.kind == Kind::Nvme && c.paths_active == 0 {
                self.violation(format!(
                    "mount {mount_id} of an NVMe namespace with no live controller was released (its flush could hang)"
                ));
            }
            match dev.holders.iter().find(|h| h.mount_id == Some(*mount_id) && h.kind == HolderKind::Mount) {
                Some(h) if !foreign_plain_mount(h, &dev.holders) => self.violation(format!(
                    "a mount in the host's namespace or a copy of one was detached: {h:?}"
                )),
                _ => {}
            }
            // A detached mount lives on for its users (gotcha 24): none in its namespace (a
            // thread there, or a process with a task there), and no holder the kernel keeps
            // without one (a dead map's stuck readers and layers are the teardown's to free).
            let Action::DetachMount { namespace, .. } = &step.action else { unreachable!() };
            if let Some(h) = dev.holders.iter().find(|h| stops_detach_in(c, h, *namespace)) {
                self.violation(format!("mount {mount_id} was detached while it was in use: {h:?}"));
            }
            // What the kernel takes with it through the parent's peer group (gotcha 29) must be
            // a copy of the same device that may go as well: foreign, tied to no host mount,
            // used by nothing in its own namespace.
            let (taken, bystander) = self.taken_by(*mount_id);
            if bystander {
                self.violation(format!(
                    "unmounting mount {mount_id} also unmounted another device's mount at the same place (through its parent's peer group)"
                ));
            }
            for t in
                taken.iter().filter_map(|j| dev.holders.iter().find(|h| h.mount_id == Some(100 + *j as u32)))
            {
                let ns = t.mount_namespace.unwrap_or(HOST_NS);
                if !foreign_plain_mount(t, &dev.holders) {
                    self.violation(format!(
                        "unmounting mount {mount_id} also unmounted the host's mount or a copy of one: {t:?}"
                    ));
                }
                if let Some(h) = dev.holders.iter().find(|h| stops_detach_in(c, h, ns)) {
                    self.violation(format!(
                        "unmounting mount {mount_id} also unmounted mount {:?}, which was in use: {h:?}",
                        t.mount_id
                    ));
                }
            }
            return;
        }
        if i != 0 {
            // A path of a map: only once the map is gone.
            if !devs[0].gone {
                self.violation(format!(
                    "{} on path {} while its map is still there",
                    step.action(),
                    step.device
                ));
            }
            return;
        }
        if c.kind == Kind::Map && c.paths_active > 0 {
            self.violation(format!("{} on a map with an active path", step.action()));
        }
        if c.kind == Kind::Nvme && c.paths_active > 0 {
            self.violation(format!("{} on an NVMe namespace with a live controller", step.action()));
        }
        let stops_queueing = matches!(step.action, Action::DmMessage { .. });
        let released = self.detached_mounts();
        let allowed = |h: &Holder| {
            (stops_queueing
                && foreign_plain_mount(h, &dev.holders)
                && !released.contains(&h.mount_id.unwrap_or(0)))
                || (stuck_reader(h) && c.kind == Kind::Map)
        };
        if let Some(what) = self.held_beyond(allowed) {
            self.violation(format!("{} ran on {} while {what} held it", step.action(), step.device));
        }
        let stale = self.unheld_since().is_some_and(|since| self.now.get().since(since) >= GRACE);
        if !stale {
            self.violation(format!(
                "{} ran on {} before it was seen unheld, continuously, for the grace period",
                step.action(),
                step.device
            ));
        }
    }

    /// What unmounting mount `mount_id` of the subject takes with it now (the truth): the
    /// indexes of the subject's mounts taken, and whether the bystander's is.
    fn taken_by(&self, mount_id: u32) -> (Vec<usize>, bool) {
        let present: Vec<usize> = self.devs.borrow()[0]
            .holders
            .iter()
            .filter(|h| h.kind == HolderKind::Mount)
            .filter_map(|h| Some(h.mount_id?.checked_sub(100)? as usize))
            .collect();
        let Some(i) = mount_id.checked_sub(100).map(|i| i as usize).filter(|i| present.contains(i)) else {
            return (Vec::new(), false);
        };
        taken_truth(&self.case, &self.parents.borrow(), i, &present, !self.bystander_gone.get())
    }

    /// What a step does to the truth.
    fn apply(&self, step: &Step) {
        if let Action::DetachMount { mount_id, .. } = &step.action {
            let (taken, bystander) = self.taken_by(*mount_id);
            self.bystander_gone.set(self.bystander_gone.get() || bystander);
            let gone: Vec<u32> = taken.iter().map(|j| 100 + *j as u32).collect();
            self.devs.borrow_mut()[0]
                .holders
                .retain(|h| h.kind != HolderKind::Mount || !h.mount_id.is_some_and(|m| gone.contains(&m)));
        }
        let mut devs = self.devs.borrow_mut();
        let Some(i) = devs.iter().position(|d| d.devnum == step.devnum && !d.gone) else { return };
        match &step.action {
            Action::DetachMount { mount_id, .. } => devs[i].holders.retain(|h| h.mount_id != Some(*mount_id)),
            // Stuck readers get EIO and exit.
            Action::DmMessage { .. } => devs[i].holders.retain(|h| !stuck_reader(h)),
            Action::ScsiOffline { .. } => {}
            _ => {
                devs[i].gone = true;
                if i == 0 {
                    for d in devs.iter_mut().skip(1) {
                        d.holders.clear(); // the map on top is gone
                    }
                }
            }
        }
    }
}

/// The holders the scan sees when the case is planned. A device carries one filesystem: a
/// hidden claim next to visible mounts of the device is a user of that same filesystem, which
/// the kernel's claim cannot tell from those mounts (what makes such users visible is the scan:
/// btrfs joined through /sys/fs, live filesystems, fds, loop backing, swap). So a hidden claim
/// is generated only where no mount of the device is visible: the filesystem is alive with no
/// mount table showing it (an unjoined btrfs, an overlay's upper directory), which only the
/// kernel's word reveals.
fn final_holders(c: &Case) -> Vec<Holder> {
    c.holders
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let mut h = holder(i, *s);
            h.mount_point = Some(mount_point(i, parent(&c.parents, i).1).as_str().into());
            // A thread in another holder's namespace: the holder, as the scan attributes it
            // per task (its own cwd or root there; what the process holds, in both).
            if let (Some((j, own)), false) =
                (c.threads.get(i).copied().flatten(), h.kind == HolderKind::Mount)
            {
                let there = ns_of(j, c.holders.get(j).is_some_and(|s| s.1));
                if own && matches!(h.kind, HolderKind::Cwd | HolderKind::Root) {
                    h.mount_namespace = Some(there);
                    h.in_host_namespace = Some(there == HOST_NS);
                    h.tid = Some(2000 + i as u32);
                } else if Some(there) != h.mount_namespace {
                    h.other_namespaces = vec![there];
                }
            }
            if c.dup && h.kind == HolderKind::OpenDevice {
                h.fds = vec![3, 4];
            }
            h
        })
        .filter(|h| c.hidden != Some(Hidden::Claim) || h.kind != HolderKind::Mount)
        .collect()
}

/// Holder `i`'s mount's parent (private, a place of its own, when the case names none).
fn parent(parents: &[Parent], i: usize) -> Parent {
    parents.get(i).copied().unwrap_or((None, false))
}

/// A parent's peer groups as mountinfo's optional fields (parents' groups are numbered apart
/// from the device's mounts': a peer group holds mounts of one superblock).
fn parent_fields(g: Option<Group>) -> String {
    match g {
        None => String::new(),
        Some(Group::Shared(g)) => format!(" shared:{}", g + 10),
        Some(Group::Slave(m)) => format!(" master:{}", m + 10),
        Some(Group::SharedSlave(g, m)) => format!(" shared:{} master:{}", g + 10, m + 10),
    }
}

/// What unmounting holder `i`'s mount takes with it through its parent's peer group, as the
/// kernel does it (fs/pnode.c), computed here on its own: the indexes of the subject's mounts
/// taken, and whether the bystander's is. `present`: the mounts still there, by index.
fn taken_truth(
    c: &Case,
    parents: &[Parent],
    i: usize,
    present: &[usize],
    bystander_there: bool,
) -> (Vec<usize>, bool) {
    let (Some(Group::Shared(g) | Group::SharedSlave(g, _)), common) = parent(parents, i) else {
        return (Vec::new(), false);
    };
    if !common {
        return (Vec::new(), false);
    }
    // Every parent that takes part: the subject's mounts' (index) and the bystander's (None).
    let parents: Vec<(Option<usize>, Option<Group>, bool)> = present
        .iter()
        .map(|&j| (Some(j), parent(parents, j).0, parent(parents, j).1))
        .chain(c.bystander.filter(|_| bystander_there).map(|(g, _)| (None, Some(g), true)))
        .collect();
    let mut groups: HashSet<u32> = HashSet::from([g]);
    loop {
        let n = groups.len();
        for (_, p, _) in &parents {
            if let Some(Group::SharedSlave(s, m)) = p {
                if groups.contains(m) {
                    groups.insert(*s);
                }
            }
        }
        if groups.len() == n {
            break;
        }
    }
    let receives = |p: &Option<Group>| match p {
        Some(Group::Shared(s)) => groups.contains(s),
        Some(Group::Slave(m)) => groups.contains(m),
        Some(Group::SharedSlave(s, m)) => groups.contains(s) || groups.contains(m),
        None => false,
    };
    let hit: Vec<&(Option<usize>, Option<Group>, bool)> =
        parents.iter().filter(|(j, p, at)| *j != Some(i) && *at && receives(p)).collect();
    (hit.iter().filter_map(|(j, ..)| *j).collect(), hit.iter().any(|(j, ..)| j.is_none()))
}

/// Whether holder `h` (not a mount) keeps a detach in namespace `ns` from freeing anything: a
/// process using the filesystem from there (unless the release is forced), or anything the
/// kernel holds with no namespace. A dead map's stuck readers and layers are the teardown's.
fn stops_detach_in(c: &Case, h: &Holder, ns: MountNsId) -> bool {
    let kernel = matches!(
        h.kind,
        HolderKind::Swap | HolderKind::LoopBacking | HolderKind::StackedDevice | HolderKind::Filesystem
    );
    let forced = c.force_busy && c.op == Operation::Release;
    h.kind != HolderKind::Mount
        && !(c.kind == Kind::Map && (stuck_reader(h) || h.kind == HolderKind::StackedDevice))
        && (kernel
            || (!forced && (h.mount_namespace.is_none_or(|n| n == ns) || h.other_namespaces.contains(&ns))))
}

/// A directory for a case's journal, in memory when the machine has /dev/shm (the journal
/// fsyncs every record; a disk would make the 100,000 cases wait on it).
fn scratch() -> tempfile::TempDir {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

/// Drives the engine through one case, as the daemon and the CLI do: observations by scans over
/// time (grace clocks kept across them), then one request through the workflow every way in
/// uses ([`Engine::carry_out`]): a plan from a fresh scan, maybe the device number reused
/// between the plan and its first step, then the steps. Returns the machine (what reached it, what it saw) and the
/// step reports (none when the device could not be planned).
fn drive(c: &Case) -> (Rc<Machine>, Vec<blockjanitor::act::StepReport>) {
    let machine = Rc::new(Machine::new(c));
    let engine = Engine::new(
        Sim(Rc::clone(&machine)),
        Settings {
            grace: GRACE,
            max_gap: MAX_GAP,
            clean: CleanOptions::default(),
            release: ReleaseOptions { force_busy: c.force_busy.then(|| "property test: forced".to_owned()) },
            ..Settings::default()
        },
    );
    let mut clocks = Clocks::new(Some("boot".into()));
    // The history: observations by complete (or blind) scans, the device held at some.
    for &(gap, blind, held) in &c.history {
        machine.now.set(machine.now.get().after(Duration::from_secs(gap)));
        machine.blind.set(blind);
        if held {
            machine.devs.borrow_mut()[0].holders.push(holder(40, (1, false, false, None)));
        }
        if let Ok(scan) = engine.scan(Target::All) {
            engine.judge(scan, &mut clocks);
        }
        machine.observe(!blind);
        machine.devs.borrow_mut()[0].holders.clear();
    }
    // The final state: then plan from a fresh scan, as every caller does.
    machine.now.set(machine.now.get().after(Duration::from_secs(30)));
    machine.blind.set(c.extra_blind);
    // An fd in flight is modelled on maps only: for other kinds the kernel exposes no count.
    machine.hidden.set(c.hidden.filter(|h| *h != Hidden::InFlight || c.kind == Kind::Map));
    machine.devs.borrow_mut()[0].holders = final_holders(c);
    let devnum = machine.subject().devnum;
    let dir = scratch();
    let journal = dir.path().join("journal.jsonl");
    let clocks = std::sync::Mutex::new(clocks);
    // Right after the plan, before its first step: what the machine looked like when planned,
    // and maybe the device number reused by another device meanwhile.
    let between = |_: &blockjanitor::plan::Plan| {
        machine.observe(!(c.extra_blind || c.hidden == Some(Hidden::Open)));
        if c.late_share {
            // Every mount's parent joins peer group 1 (its place below the parent unchanged).
            let mut parents = machine.parents.borrow_mut();
            let n = c.holders.len().max(parents.len());
            *parents = (0..n).map(|i| (Some(Group::Shared(1)), parent(&c.parents, i).1)).collect();
        }
        if c.swap {
            // The device was let go and another one took its number: a new disk sequence and
            // backing, and none of the old one's mounts (a mounted device cannot be let go).
            let mut devs = machine.devs.borrow_mut();
            devs[0].seq += 100;
            devs[0].holders.retain(|h| h.kind != HolderKind::Mount);
        }
        Ok(())
    };
    let request = Request {
        op: c.op,
        subject: Subject::Device(devnum),
        argument: machine.subject().name.to_string(),
        expected_identity: None,
        apply: true,
        by: "property test".into(),
        journal: &journal,
        lock_wait: Duration::from_secs(5),
        clocks: &clocks,
        admit: Some(&between),
    };
    quiet_crashes();
    let carried = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| engine.carry_out(&request)));
    let reports = match carried {
        Ok(Ok(outcome)) => {
            assert!(
                outcome.refusal.is_none(),
                "the simulated machine lets the engine act: {:?}",
                outcome.refusal
            );
            outcome.reports
        }
        Ok(Err(_)) => return (machine, Vec::new()),
        Err(payload) if payload.is::<SimulatedCrash>() => {
            let crash = c.crash.expect("a crash only where the case has one");
            recover_after(&machine, &engine, &journal, c, crash)
        }
        Err(payload) => std::panic::resume_unwind(payload),
    };
    // The workflow leaves nothing open in its journal: every intent has a result, every plan
    // its end.
    let open = blockjanitor::act::journal::pending(&journal).map(|p| p.len()).unwrap_or(usize::MAX);
    let plans = blockjanitor::act::journal::open_plans(&journal).map(|p| p.len()).unwrap_or(usize::MAX);
    if open != 0 || plans != 0 {
        machine.violation(format!("the journal has {open} open intent(s) and {plans} open plan(s)"));
    }
    (machine, reports)
}

/// After the simulated kill: the world moves on (the API's state, the device number reused, a
/// hidden holder), then the daemon's start recovers the journal through the one workflow; the
/// resumed steps' reports.
fn recover_after(
    machine: &Machine,
    engine: &Engine<Sim>,
    journal: &std::path::Path,
    c: &Case,
    crash: Crash,
) -> Vec<blockjanitor::act::StepReport> {
    machine.now.set(machine.now.get().after(Duration::from_secs(5)));
    machine.api.set(crash.api);
    machine.hidden.set(crash.hidden.filter(|h| *h != Hidden::InFlight || c.kind == Kind::Map));
    if crash.swap {
        let mut devs = machine.devs.borrow_mut();
        devs[0].seq += 100;
        devs[0].holders.retain(|h| h.kind != HolderKind::Mount);
    }
    let resumer = Resumer { by: "property test (daemon start)", admit: None };
    match engine.recover_all(journal, Duration::from_secs(5), Some(resumer)) {
        Ok(out) => out.resumed.into_iter().flat_map(|r| r.reports).collect(),
        Err(_) => Vec::new(),
    }
}

/// Keeps the panic hook quiet about the simulated kill (it prints every other panic as usual).
fn quiet_crashes() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<SimulatedCrash>() {
                default(info);
            }
        }));
    });
}

/// Runs one case; returns the violations the machine saw.
fn run(c: &Case) -> Vec<String> {
    let (machine, reports) = drive(c);
    // A step whose prerequisite did not finish never reached the kernel.
    let runs = machine.runs.borrow().clone();
    for (k, r) in reports.iter().enumerate() {
        if !runs.iter().any(|s| s == &r.step) {
            continue;
        }
        for earlier in &reports[..k] {
            let finished = earlier.result.as_ref().is_ok_and(StepOutcome::is_finished);
            let depends = !r.step.is_release() || !earlier.step.is_release();
            if depends && !finished {
                machine.violation(format!(
                    "{} ran although {} before it did not finish",
                    r.step.action(),
                    earlier.step.action()
                ));
            }
        }
    }
    let v = machine.violations.borrow().clone();
    v
}

/// Cases in CI: `BLOCKJANITOR_PROPERTY_CASES` (at least 100,000 in CI; fewer for the mutation
/// check, which only needs each gate's counterexample to come up).
fn cases() -> u32 {
    std::env::var("BLOCKJANITOR_PROPERTY_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000)
}

/// Half of [`cases`] (rounded up): each of the two property functions runs this many.
fn half_of_the_cases() -> u32 {
    cases().div_ceil(2)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: half_of_the_cases(), failure_persistence: None, ..ProptestConfig::default() })]

    // The cases in two halves of random cases each, which libtest runs side by side (one per
    // core): `cases()` in all.
    #[test]
    fn no_destructive_step_on_blind_stale_or_reused_evidence(c in any_case()) {
        let v = run(&c);
        prop_assert!(v.is_empty(), "{:#?}\ncase: {:#?}", v, c);
    }

    #[test]
    fn no_destructive_step_on_blind_stale_or_reused_evidence_other_half(c in any_case()) {
        let v = run(&c);
        prop_assert!(v.is_empty(), "{:#?}\ncase: {:#?}", v, c);
    }
}

/// The property is not vacuous: the engine does act in the cases where it may (a stale loop
/// device, a dead map with a foreign mount and a stuck reader), and refuses when a gate says no.
#[test]
fn the_engine_acts_when_it_may_and_not_when_a_gate_says_no() {
    let base =
        Case { history: vec![(60, false, false); 6], ..plain(Kind::Loop, Operation::Clean, Api::Vouches) };
    assert!(run(&base).is_empty());
    let count_runs = |c: &Case| -> usize { drive(c).0.runs.borrow().len() };
    assert_eq!(count_runs(&base), 1, "a loop device unheld for 6 minutes is unbound");
    let map = Case {
        kind: Kind::Map,
        holders: vec![(0, false, false, None), (1, false, true, None)],
        ..base.clone()
    };
    assert_eq!(count_runs(&map), 7, "fail_if_no_path, release, remove, then offline and delete both paths");
    // A chain of copies: host `shared:1`, A `shared:2 master:1`, B `master:2`, and a private
    // copy C that nothing ties to the host: a release detaches C alone.
    let chain = Case {
        op: Operation::Release,
        holders: vec![
            (0, true, false, Some(Group::Shared(1))),
            (0, false, false, Some(Group::SharedSlave(2, 1))),
            (0, false, false, Some(Group::Slave(2))),
            (0, false, false, None),
        ],
        ..base.clone()
    };
    let (machine, _) = drive(&chain);
    let detached = machine.detached_mounts();
    assert_eq!(detached, [103], "only the private copy C (mount 103), never A or B of the chain");
    assert!(machine.violations.borrow().is_empty(), "{:?}", machine.violations.borrow());
    // Killed as its second step reached the kernel, then recovered at the daemon's start through
    // the workflow: the rest of the plan runs when the world allows it, and not once the API
    // went silent meanwhile, or the number names another device now.
    let crashed = |api, swap| Case { crash: Some(Crash { at: 1, api, swap, hidden: None }), ..map.clone() };
    for (what, c, runs) in [
        ("recovered", crashed(Api::Vouches, false), 7),
        ("the API silent since", crashed(Api::Silent, false), 1),
        ("the number reused since", crashed(Api::Vouches, true), 1),
    ] {
        assert!(run(&c).is_empty(), "{what}: {:?}", run(&c));
        assert_eq!(count_runs(&c), runs, "{what}: steps that reached the kernel, before and after the crash");
    }
    // Killed as its first path step reached the kernel, the map removed: the API, silent about
    // the volume before (not configured, or knowing no PV of the map), says a pod on this node
    // uses a volume no device serves now. The map's paths are not deleted: it may be theirs.
    for api in [Api::NotConfigured, Api::Vouches] {
        let crash = Some(Crash { at: 2, api: Api::PodUses, swap: false, hidden: None });
        let c = Case { api, holders: Vec::new(), crash, ..map.clone() };
        assert!(run(&c).is_empty(), "{api:?}: {:?}", run(&c));
        let ran: Vec<&str> = drive(&c).0.runs.borrow().iter().map(|s| s.action()).collect();
        assert_eq!(ran, ["dm_message", "dm_remove"], "{api:?}: only the steps before the crash");
    }
    let in_flight = Case { hidden: Some(Hidden::InFlight), ..map.clone() };
    assert_eq!(count_runs(&in_flight), 0, "an fd of the map in flight: its open count says so");
    // A stuck reader with a dup'd fd: two fds, one open file. Alone it is accounted for exactly;
    // with an fd in flight beside it, the count is one more than its open files (and no more
    // than its fds, which is what the old "at most, per fd" comparison let through).
    let dup = Case { dup: true, ..map.clone() };
    assert_eq!(count_runs(&dup), 7, "a dup'd reader is one open file: the teardown runs");
    assert!(run(&dup).is_empty());
    assert_eq!(
        count_runs(&Case { hidden: Some(Hidden::InFlight), ..dup }),
        0,
        "a dup'd reader does not hide an fd in flight"
    );
    for (what, c) in [
        ("hidden claim", Case { hidden: Some(Hidden::Claim), ..base.clone() }),
        ("blind scan", Case { extra_blind: true, ..base.clone() }),
        ("API silent", Case { api: Api::Silent, ..base.clone() }),
        ("one watch silent", Case { api: Api::SilentWatch, ..base.clone() }),
        ("no Node", Case { api: Api::NoNode, ..base.clone() }),
        (
            "gap in observation",
            Case {
                history: vec![(60, false, false), (200, false, false), (60, false, false)],
                ..base.clone()
            },
        ),
    ] {
        assert_eq!(count_runs(&c), 0, "{what}: nothing may run");
    }
    let nvme = Case { kind: Kind::Nvme, ..base.clone() };
    assert_eq!(count_runs(&nvme), 1, "an NVMe controller reconnecting for 6 minutes is deleted");
    assert_eq!(count_runs(&Case { paths_active: 1, ..nvme.clone() }), 0, "a live one never");
    let mounted = Case { holders: vec![(0, false, false, None)], ..nvme.clone() };
    assert_eq!(count_runs(&mounted), 0, "never deleted under a mount, never released");
    assert_eq!(count_runs(&Case { op: Operation::Release, ..mounted }), 0, "no release under a dead path");
    let swapped = Case { swap: true, ..base.clone() };
    assert!(run(&swapped).is_empty());
}
