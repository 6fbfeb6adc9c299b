//! The safety contract of orphaned pod volume directories as a property of their request
//! workflow (`blockjanitor::engine::Engine::carry_out_dir`: `clean pod-volume:...`, the daemon's
//! clean mode), driven over a simulated node whose truth the engine can only partly see.
//!
//! Each case is a few pods, each with one or two CSI volume directories (`<name>/mount`), some
//! holding a file; each pod maybe on this node per the API (by its UID, or as the mirror of a
//! static pod), maybe with a process in its cgroup, maybe with its etc-hosts bind-mounted in a
//! container's namespace; each directory maybe mounted in the host's namespace, in a foreign one
//! (node_exporter's copy under `/host`; or there but missing from its table's text, which the
//! scan's `statmount` tells), or in a namespace whose table cannot be read, maybe
//! bind-mounted itself somewhere; the API vouching, silent or not asked. Between the plan and a
//! step the node may change (a mount appears, a process starts, the pod shows in the API, the API
//! falls silent, the directory is made again with another inode, a file appears). The simulated
//! kernel's `rmdir` is the real one's: `ENOTEMPTY`, `EBUSY` only for a mount in the agent's own
//! (the host's) namespace, otherwise the directory goes and every other namespace's mount on it
//! is detached. At the instant an `rmdir` reaches it, the machine checks against the truth:
//!
//! - the directory is the one planned (same inode);
//! - the API vouched, and no pod on this node per the API is the directory's pod;
//! - nothing of the pod runs here (no process, no mount of its files);
//! - nothing is mounted at or below the directory, or rooted in it, in any namespace, and every
//!   namespace could be read.
//!
//! `scripts/mutation-check.sh` removes each of the gates `pod-api`, `pod-node`, `dir-mounts` and
//! `dir-identity` in turn and requires this test to fail.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::time::Duration;

use blockjanitor::act::pod_volume::DirActError;
use blockjanitor::act::{ActError, StepOutcome};
use blockjanitor::discover::kubelet::pod_dirs::{Content, PodDir, PodDirs, PodVolumeEntry, PodVolumeKind};
use blockjanitor::discover::mountinfo;
use blockjanitor::discover::namespaces::MountNamespace;
use blockjanitor::discover::pod_processes::PodProcesses;
use blockjanitor::discover::probe::KernelWord;
use blockjanitor::engine::dir_workflow::DirRequest;
use blockjanitor::engine::error::EngineError;
use blockjanitor::engine::world::World;
use blockjanitor::engine::{Engine, Settings};
use blockjanitor::graph::propagation::NsTable;
use blockjanitor::graph::scan::{Scan, Target};
use blockjanitor::graph::DeviceGraph;
use blockjanitor::host::beneath::FileKey;
use blockjanitor::host::clock::BootTime;
use blockjanitor::judge::grace::Clocks;
use blockjanitor::kube::{ClusterView, PodInfo, WatchHealth};
use blockjanitor::model::blindspot::BlindSpot;
use blockjanitor::model::{DevNum, DeviceName, MountNsId};
use blockjanitor::plan::pod_volume::DirStep;
use blockjanitor::plan::Step;
use proptest::prelude::*;

const HOST: MountNsId = MountNsId(4026531840);
const FOREIGN: MountNsId = MountNsId(4026532700);
const CONTAINER: MountNsId = MountNsId(4026532800);
const HIDDEN: MountNsId = MountNsId(4026532900);
const KUBELET: &str = "/var/lib/kubelet";
const ROOT_DEV: DevNum = DevNum { major: 254, minor: 1 };

/// Where a directory's `mount` is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    /// In the host's namespace (the agent's own): the kernel refuses `rmdir` with `EBUSY`.
    Host,
    /// In node_exporter's namespace, under `/host`.
    Foreign,
    /// In a namespace whose table cannot be read.
    Hidden,
    /// In node_exporter's namespace, but its table's text lacks it: the scan's `statmount` sees
    /// it (a blind spot over its device alone, hiding a mount of that namespace).
    Unlisted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Api {
    Vouches,
    Silent,
    NotAsked,
}

/// What changes before the Nth gathering of evidence (1: the plan; 2 and 3: the re-checks before
/// the two `rmdir`s).
#[derive(Debug, Clone, Copy)]
enum Change {
    Mount(usize, Where),
    Process(usize),
    InApi(usize),
    ApiSilent,
    Recreated(usize),
    File(usize),
}

#[derive(Debug, Clone)]
struct DirCase {
    full: bool,
    mount: Option<Where>,
    bound: bool,
}

#[derive(Debug, Clone)]
struct PodCase {
    in_api: bool,
    mirror: bool,
    process: bool,
    etc_hosts_bound: bool,
    dirs: Vec<DirCase>,
}

#[derive(Debug, Clone)]
struct Case {
    pods: Vec<PodCase>,
    api: Api,
    /// A mount namespace whose table cannot be read exists (also when a mount is hidden there).
    hidden: bool,
    change: Option<(usize, Change)>,
}

/// One volume directory of the simulated node.
#[derive(Debug, Clone)]
struct Dir {
    pod: usize,
    name: String,
    key: u64,
    mount_key: u64,
    present: bool,
    mount_present: bool,
    full: bool,
    mounts: Vec<Where>,
    bound: bool,
}

#[derive(Debug)]
struct Machine {
    pods: Vec<PodCase>,
    uids: Vec<String>,
    dirs: Vec<Dir>,
    api: Api,
    hidden: bool,
    change: Option<(usize, Change)>,
    looks: usize,
    next_key: u64,
    violations: Vec<String>,
}

struct Sim(RefCell<Machine>);

fn uid(i: usize) -> String {
    format!("0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d{i:02}")
}

impl Machine {
    fn new(c: &Case) -> Self {
        let mut m = Machine {
            pods: c.pods.clone(),
            uids: (0..c.pods.len()).map(uid).collect(),
            dirs: Vec::new(),
            api: c.api,
            hidden: c.hidden,
            change: c.change,
            looks: 0,
            next_key: 100,
            violations: Vec::new(),
        };
        for (p, pod) in c.pods.iter().enumerate() {
            for (i, d) in pod.dirs.iter().enumerate() {
                let (key, mount_key) = (m.key(), m.key());
                m.dirs.push(Dir {
                    pod: p,
                    name: format!("pvc-{p}-{i}"),
                    key,
                    mount_key,
                    present: true,
                    mount_present: true,
                    full: d.full,
                    mounts: d.mount.into_iter().collect(),
                    bound: d.bound,
                });
            }
        }
        m
    }

    /// Whether a namespace whose table cannot be read exists.
    fn has_hidden(&self) -> bool {
        self.hidden || self.dirs.iter().any(|d| d.mounts.contains(&Where::Hidden))
    }

    fn key(&mut self) -> u64 {
        self.next_key += 1;
        self.next_key
    }

    fn rel(&self, d: &Dir) -> PathBuf {
        PathBuf::from(format!("pods/{}/volumes/kubernetes.io~csi/{}", self.uids[d.pod], d.name))
    }

    /// Applies the case's change when its look comes.
    fn look(&mut self) {
        self.looks += 1;
        let Some((at, change)) = self.change else { return };
        if at != self.looks {
            return;
        }
        let n = self.dirs.len();
        match change {
            Change::Mount(d, w) => self.dirs[d % n].mounts.push(w),
            Change::Process(p) => self.pods[p % self.uids.len()].process = true,
            Change::InApi(p) => self.pods[p % self.uids.len()].in_api = true,
            Change::ApiSilent => self.api = Api::Silent,
            Change::Recreated(d) => {
                let (k, mk) = (self.key(), self.key());
                let d = &mut self.dirs[d % n];
                if d.present {
                    (d.key, d.mount_key, d.mount_present) = (k, mk, true);
                }
            }
            Change::File(d) => self.dirs[d % n].full = true,
        }
    }

    /// What is true of directory `d` now that makes removing it a violation.
    fn why_not(&self, d: &Dir) -> Vec<String> {
        let pod = &self.pods[d.pod];
        let mut v = Vec::new();
        if self.api != Api::Vouches {
            v.push(format!("the API could not vouch ({:?})", self.api));
        }
        if pod.in_api {
            v.push("its pod is on this node per the API".into());
        }
        if pod.process {
            v.push("its pod has a process".into());
        }
        if pod.etc_hosts_bound {
            v.push("its pod's etc-hosts is bind-mounted in a container".into());
        }
        if !d.mounts.is_empty() {
            v.push(format!("something is mounted on it ({:?})", d.mounts));
        }
        if d.bound {
            v.push("it is bind-mounted in a container".into());
        }
        if self.has_hidden() {
            v.push("a mount namespace could not be read".into());
        }
        v
    }
}

fn key(ino: u64) -> FileKey {
    FileKey { dev: ROOT_DEV, ino }
}

fn now() -> BootTime {
    BootTime::from_since_boot(Duration::from_secs(10_000))
}

impl Sim {
    fn tables(&self) -> Vec<(MountNsId, String)> {
        let m = self.0.borrow();
        let mut host = "1 0 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n".to_owned();
        let mut foreign =
            "100 99 0:50 / / rw - overlay overlay rw\n101 100 254:1 / /host rw - ext4 /dev/vda1 rw\n"
                .to_owned();
        let mut container = "200 199 0:60 / / rw - overlay overlay rw\n".to_owned();
        let mut hidden = String::new();
        let mut id = 300;
        for d in m.dirs.iter().filter(|d| d.present) {
            let path = Path::new(KUBELET).join(m.rel(d)).join("mount");
            for w in &d.mounts {
                id += 1;
                let line = |parent: u32, at: String| {
                    format!("{id} {parent} 7:{id} / {at} rw - ext4 /dev/loop{id} rw\n")
                };
                match w {
                    Where::Host => host.push_str(&line(1, path.display().to_string())),
                    Where::Foreign => foreign.push_str(&line(101, format!("/host{}", path.display()))),
                    Where::Hidden => hidden.push_str(&line(1, path.display().to_string())),
                    Where::Unlisted => {}
                }
            }
            if d.bound {
                id += 1;
                let root = Path::new(KUBELET).join(m.rel(d));
                container.push_str(&format!(
                    "{id} 200 254:1 {} /data{id} rw - ext4 /dev/vda1 rw\n",
                    root.display()
                ));
            }
        }
        for (p, _) in m.pods.iter().enumerate().filter(|(_, p)| p.etc_hosts_bound) {
            id += 1;
            container.push_str(&format!(
                "{id} 200 254:1 {KUBELET}/pods/{}/etc-hosts /etc/hosts{id} rw - ext4 /dev/vda1 rw\n",
                m.uids[p]
            ));
        }
        vec![(HOST, host), (FOREIGN, foreign), (CONTAINER, container), (HIDDEN, hidden)]
    }
}

impl World for Sim {
    fn scan(&self, _target: Target) -> Result<Scan, EngineError> {
        let graph = DeviceGraph { host_ns: HOST, host_ns_unsure: None, devices: Vec::new() };
        let mut s = Scan::complete(graph, now());
        let m = self.0.borrow();
        for (i, _) in m.dirs.iter().filter(|d| d.present && d.mounts.contains(&Where::Unlisted)).enumerate() {
            let loop_dev = DeviceName::new(&format!("loop{}", 90 + i)).expect("name");
            let why = format!(
                "statmount sees a mount of 7:{} in mount namespace {} that its mountinfo does not show",
                90 + i,
                FOREIGN.0
            );
            s.blind_spots.push(BlindSpot::devices(vec![loop_dev], why).hiding_a_mount());
        }
        drop(m);
        let mut ids = vec![HOST, FOREIGN, CONTAINER];
        if self.0.borrow().has_hidden() {
            ids.push(HIDDEN);
        }
        s.namespaces = std::sync::Arc::new(ids.into_iter().map(MountNamespace::empty).collect());
        Ok(s)
    }

    fn kernel_word(&self, _device: &DeviceName, _devnum: DevNum) -> KernelWord {
        KernelWord::unclaimed()
    }

    fn mount_tables(&self, scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
        let tables = self.tables();
        scan.namespaces
            .iter()
            .filter(|n| wanted(n.id))
            .map(|n| {
                let text =
                    tables.iter().find(|(id, _)| *id == n.id).map(|(_, t)| t.clone()).unwrap_or_default();
                if n.id == HIDDEN {
                    return (n.id, Err("cannot read its mountinfo: Permission denied".to_owned()));
                }
                (n.id, mountinfo::parse(text.as_bytes()).map_err(|e| e.to_string()))
            })
            .collect()
    }

    fn cluster(&self) -> Option<ClusterView> {
        let m = self.0.borrow();
        let heard = match m.api {
            Api::NotAsked => return None,
            Api::Vouches => now(),
            Api::Silent => BootTime::from_since_boot(Duration::from_secs(1)),
        };
        let pods = m
            .pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.in_api)
            .map(|(i, p)| PodInfo {
                uid: if p.mirror { format!("mirror-{i}") } else { m.uids[i].clone() },
                mirror_of: p.mirror.then(|| m.uids[i].clone()),
                name: format!("pod-{i}"),
                namespace: "shop".into(),
                phase: "Running".into(),
                ..Default::default()
            })
            .collect();
        Some(ClusterView {
            node_name: "node-a".into(),
            synced: true,
            watches: ["pods", "volumeattachments", "persistentvolumes"]
                .into_iter()
                .map(|resource| WatchHealth { resource, synced: true, error: None, heard: Some(heard) })
                .collect(),
            node_found: Some(true),
            last_contact: Some(heard),
            pods_on_node: pods,
            ..Default::default()
        })
    }

    fn can_act(&self) -> Result<(), String> {
        Ok(())
    }

    fn run(&self, _step: &Step) -> Result<StepOutcome, ActError> {
        unreachable!("no device step in these cases")
    }

    fn now(&self) -> BootTime {
        now()
    }

    fn pod_dirs(&self, survey: &dyn Fn(&str) -> bool) -> Result<PodDirs, String> {
        let m = self.0.borrow();
        let mut pods: Vec<PodDir> = m
            .uids
            .iter()
            .enumerate()
            .map(|(i, u)| PodDir {
                uid: u.clone(),
                key: Some(key(i as u64 + 1)),
                etc_hosts: true,
                containers: Vec::new(),
                volumes: Vec::new(),
            })
            .collect();
        for d in m.dirs.iter().filter(|d| d.present) {
            let rel = m.rel(d);
            // The walk does not look into the volume places of a pod the caller says runs here.
            let content = if !survey(&m.uids[d.pod]) {
                Content::NotSurveyed
            } else if d.full {
                Content::NotEmpty { entries: 2, first: vec!["data (file)".into()] }
            } else {
                let mut dirs = Vec::new();
                if d.mount_present {
                    dirs.push((rel.join("mount"), key(d.mount_key)));
                }
                dirs.push((rel.clone(), key(d.key)));
                Content::Empty { dirs }
            };
            pods[d.pod].volumes.push(PodVolumeEntry {
                pod_uid: m.uids[d.pod].clone(),
                kind: PodVolumeKind::Volume,
                path: Path::new(KUBELET).join(&rel),
                rel,
                plugin: "kubernetes.io/csi".into(),
                name: d.name.clone(),
                key: Some(key(d.key)),
                content,
            });
        }
        Ok(PodDirs { kubelet_dir: KUBELET.into(), pods, warnings: Vec::new() })
    }

    fn pod_processes(&self) -> Result<PodProcesses, String> {
        // The first look of each gathering of evidence: the node changes before it.
        self.0.borrow_mut().look();
        let m = self.0.borrow();
        let mut out = PodProcesses::default();
        for (i, _) in m.pods.iter().enumerate().filter(|(_, p)| p.process) {
            out.by_pod.insert(m.uids[i].clone(), vec![5000 + i as u32]);
        }
        Ok(out)
    }

    fn stat_on_host(&self, path: &Path) -> Result<(FileKey, Option<u64>), String> {
        let m = self.0.borrow();
        if path == Path::new(KUBELET).join("pods") {
            return Ok((key(1_000_000), Some(1)));
        }
        for (i, u) in m.uids.iter().enumerate() {
            if path == Path::new(KUBELET).join("pods").join(u) {
                return Ok((key(i as u64 + 1), Some(1)));
            }
        }
        let d = m.dirs.iter().find(|d| d.present && Path::new(KUBELET).join(m.rel(d)) == path);
        d.map(|d| (key(d.key), Some(1))).ok_or_else(|| format!("{}: not found", path.display()))
    }

    fn remove_dir(&self, step: &DirStep) -> Result<StepOutcome, DirActError> {
        let mut m = self.0.borrow_mut();
        let fail = |e: i32| {
            Err(DirActError::Syscall { path: step.host_path(), source: std::io::Error::from_raw_os_error(e) })
        };
        let Some(i) = m.dirs.iter().position(|d| d.present && step.path.starts_with(m.rel(d))) else {
            return Ok(StepOutcome::AlreadyAbsent);
        };
        let d = m.dirs[i].clone();
        let is_mount = step.path == m.rel(&d).join("mount");
        let (present, now_key) = if is_mount { (d.mount_present, d.mount_key) } else { (true, d.key) };
        if !present {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        // The kernel: not empty, or mounted on in the caller's own namespace.
        if d.full || (!is_mount && d.mount_present) {
            return fail(libc::ENOTEMPTY);
        }
        if is_mount && d.mounts.contains(&Where::Host) {
            return fail(libc::EBUSY);
        }
        let mut why = m.why_not(&d);
        if now_key != step.key.ino {
            why.push(format!("it is not the directory planned (inode {now_key}, planned {})", step.key.ino));
        }
        if !why.is_empty() {
            let v = format!("rmdir {} although {}", step.path.display(), why.join("; "));
            m.violations.push(v);
        }
        let d = &mut m.dirs[i];
        if is_mount {
            d.mount_present = false;
            d.mounts.clear(); // detached in every other namespace
        } else {
            d.present = false;
            d.bound = false;
        }
        Ok(StepOutcome::Done)
    }
}

/// A directory for a case's journal, in memory when the machine has /dev/shm (the journal
/// fsyncs every record; a disk would make every case wait on it).
fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(d) = tempfile::tempdir_in(shm) {
            return d;
        }
    }
    tempfile::tempdir().expect("tempdir")
}

fn drive(c: &Case) -> Vec<String> {
    let sim = Sim(RefCell::new(Machine::new(c)));
    let args: Vec<String> = {
        let m = sim.0.borrow();
        m.dirs
            .iter()
            .map(|d| format!("pod-volume:{}/volumes/kubernetes.io~csi/{}", m.uids[d.pod], d.name))
            .collect()
    };
    let engine = Engine::new(sim, Settings { grace: Duration::ZERO, ..Settings::default() });
    let dir = scratch();
    let journal = dir.path().join("journal.jsonl");
    let clocks = std::sync::Mutex::new(Clocks::new(None));
    for arg in args {
        let req = DirRequest {
            argument: arg,
            apply: true,
            by: "property test".into(),
            journal: &journal,
            lock_wait: Duration::from_secs(1),
            clocks: &clocks,
            admit: None,
        };
        if let Err(e) = engine.carry_out_dir(&req) {
            engine.world.0.borrow_mut().violations.push(format!("the workflow failed: {e}"));
        }
    }
    let v = engine.world.0.borrow().violations.clone();
    v
}

fn any_where() -> impl Strategy<Value = Option<Where>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(Where::Host)),
        2 => Just(Some(Where::Foreign)),
        1 => Just(Some(Where::Hidden)),
        1 => Just(Some(Where::Unlisted)),
    ]
}

fn any_dir() -> impl Strategy<Value = DirCase> {
    (prop::bool::weighted(0.2), any_where(), prop::bool::weighted(0.1))
        .prop_map(|(full, mount, bound)| DirCase { full, mount, bound })
}

fn any_pod() -> impl Strategy<Value = PodCase> {
    (
        prop::bool::weighted(0.25),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.15),
        prop::collection::vec(any_dir(), 1..=2),
    )
        .prop_map(|(in_api, mirror, process, etc_hosts_bound, dirs)| PodCase {
            in_api,
            mirror,
            process,
            etc_hosts_bound,
            dirs,
        })
}

fn any_change() -> impl Strategy<Value = Option<(usize, Change)>> {
    let change = prop_oneof![
        (
            0..4usize,
            prop_oneof![Just(Where::Host), Just(Where::Foreign), Just(Where::Hidden), Just(Where::Unlisted)],
        )
            .prop_map(|(d, w)| Change::Mount(d, w)),
        (0..3usize).prop_map(Change::Process),
        (0..3usize).prop_map(Change::InApi),
        Just(Change::ApiSilent),
        (0..4usize).prop_map(Change::Recreated),
        (0..4usize).prop_map(Change::File),
    ];
    prop_oneof![1 => Just(None), 3 => (2..=3usize, change).prop_map(Some)]
}

fn any_case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(any_pod(), 1..=3),
        prop_oneof![6 => Just(Api::Vouches), 1 => Just(Api::Silent), 1 => Just(Api::NotAsked)],
        prop::bool::weighted(0.1),
        any_change(),
    )
        .prop_map(|(pods, api, hidden, change)| Case { pods, api, hidden, change })
}

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
    fn no_rmdir_of_a_directory_not_proven_orphaned_unmounted_and_the_planned_one(c in any_case()) {
        let v = drive(&c);
        prop_assert!(v.is_empty(), "{:#?}\ncase: {:#?}", v, c);
    }

    #[test]
    fn no_rmdir_of_a_directory_not_proven_orphaned_unmounted_and_the_planned_one_other_half(c in any_case()) {
        let v = drive(&c);
        prop_assert!(v.is_empty(), "{:#?}\ncase: {:#?}", v, c);
    }
}

/// The property is not vacuous: a proven orphaned, empty, unmounted directory is removed.
#[test]
fn a_proven_orphan_is_removed() {
    let c = Case {
        pods: vec![PodCase {
            in_api: false,
            mirror: false,
            process: false,
            etc_hosts_bound: false,
            dirs: vec![DirCase { full: false, mount: None, bound: false }],
        }],
        api: Api::Vouches,
        hidden: false,
        change: None,
    };
    let sim = Sim(RefCell::new(Machine::new(&c)));
    let engine = Engine::new(sim, Settings { grace: Duration::ZERO, ..Settings::default() });
    let dir = scratch();
    let journal = dir.path().join("journal.jsonl");
    let clocks = std::sync::Mutex::new(Clocks::new(None));
    let req = DirRequest {
        argument: format!("pod-volume:{}/volumes/kubernetes.io~csi/pvc-0-0", uid(0)),
        apply: true,
        by: "test".into(),
        journal: &journal,
        lock_wait: Duration::from_secs(1),
        clocks: &clocks,
        admit: None,
    };
    let out = engine.carry_out_dir(&req).expect("carried out");
    let words: Vec<&str> = out.reports.iter().map(|r| r.word().0).collect();
    assert_eq!(words, ["done", "done"], "{out:#?}");
    assert!(!engine.world.0.borrow().dirs[0].present);
}
