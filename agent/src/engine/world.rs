//! What the engine needs from the machine, and the real machine behind it.
//!
//! [`World`] is the engine's only way out: reading the host, asking the kernel about one device,
//! the Kubernetes API's view, whether this agent may act at all, and running a step.
//! [`LinuxWorld`] is the live host (or a fixture tree, which can be read but never acted on); the
//! property test has a simulated world with hidden holders, identity swaps and failing steps.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::error::EngineError;
use crate::act::linux::LinuxActuator;
use crate::act::{ActError, Actuator, StepOutcome};
use crate::discover::probe::{self, KernelWord};
use crate::discover::{blockdev, DiscoverError};
use crate::graph::protect::protected_devices;
use crate::graph::scan::{Scan, Target};
use crate::graph::DeviceGraph;
use crate::host::clock::BootTime;
use crate::host::parallel::Stop;
use crate::host::HostRoot;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceName, MountNsId};
use crate::plan::Step;
use crate::snapshot::process_memo::ProcessMemo;
use crate::snapshot::reread::Changes;
use crate::snapshot::touched::{self, Touched};
use crate::snapshot::{ScanOptions, Scope, Snapshot};

/// The machine, as the engine sees it.
pub trait World {
    /// Reads the host: every device, or one device and what is stacked on it
    /// ([`EngineError::NotFound`] when that device is not there).
    fn scan(&self, target: Target) -> Result<Scan, EngineError>;
    /// The latest full scan brought up to date after what the kernel reported changed (mount
    /// namespaces, block devices), reading nothing else; `Err` says why only a full scan will
    /// do. What it returns is for showing: fds and processes are as the full scan saw them, so
    /// grace clocks and actions never rest on it.
    ///
    /// `reusable`: devices whose entry and verdict the caller can keep from its previous view
    /// if the re-read did not touch them; the scan then builds and covers only the others
    /// ([`Reread::rebuilt`]).
    fn rescan_changed(&self, changes: &Changes, reusable: &HashSet<DevNum>) -> Result<Reread, String> {
        let _ = (changes, reusable);
        Err("this world rescans only in full".into())
    }
    /// The kernel's own word about one device (exclusive-open probe, sysfs holders, live
    /// filesystems, loop devices on its node, dm open count), read right before a destructive
    /// step and never in routine scans.
    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord;
    /// The Kubernetes API's view of this node, when the API is in use.
    fn cluster(&self) -> Option<ClusterView>;
    /// Whether this agent may act on the host at all; why not otherwise.
    fn can_act(&self) -> Result<(), String>;
    /// Carries out one step (the engine has re-checked it).
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError>;
    /// Now, on a clock that cannot jump.
    fn now(&self) -> BootTime;
    /// Whether process `pid` is alive and is this agent's program (the writer of a journal
    /// intent still at work, not crashed). A world without processes has none.
    fn agent_alive(&self, _pid: u32) -> bool {
        false
    }
    /// iSCSI session `sid` as sysfs shows it now: `(target, portal)`, `None` when it is gone
    /// (crash recovery of a logout). A world without iSCSI cannot say.
    fn iscsi_session(&self, sid: u32) -> Result<Option<(String, Option<String>)>, String> {
        Err(format!("this world cannot read iSCSI session{sid}"))
    }
    /// The device an operator's argument names now (`/dev/loop3`, `loop3`, a dm name,
    /// `MAJ:MIN`); `NotFound` when none.
    fn resolve(&self, arg: &str) -> Result<DevNum, EngineError> {
        Err(EngineError::NotFound(format!("unknown device '{arg}'")))
    }
    /// Whether this agent has the privileges to see every process and mount namespace (why
    /// not, in one line with what to do): without them, "nothing holds it" is no evidence.
    fn sight(&self) -> Result<(), String> {
        Ok(())
    }
}

/// A re-read's scan, and which devices it built.
#[derive(Debug)]
pub struct Reread {
    /// Its graph has, and its scope covers, the rebuilt devices only (all when `rebuilt` is
    /// `None`).
    pub scan: Scan,
    /// The devices built and to be judged; every other device of the latest snapshot is as the
    /// caller's previous view shows it (`None`: every device was built).
    pub rebuilt: Option<HashSet<DevNum>>,
    /// Every device of the snapshot, in its order.
    pub devices: Vec<DevNum>,
}

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace, fixed by the kernel.
const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// The live host (or a fixture tree).
pub struct LinuxWorld {
    pub host: HostRoot,
    pub options: ScanOptions,
    /// Deadline of each kernel call that may block on a device.
    pub timeout: Duration,
    /// Filled in once the daemon connects to the Kubernetes API.
    pub cluster: Arc<OnceLock<tokio::sync::watch::Receiver<ClusterView>>>,
    /// The latest snapshot of the whole host and when its scan started: what
    /// [`World::rescan_changed`] brings up to date, in place (none after a re-read failed).
    latest: Mutex<Option<(Arc<Snapshot>, BootTime)>>,
    /// What the daemon's own full scans remember of each process ([`LinuxWorld::scan_periodic`]);
    /// `None`: every scan reads every process in full.
    process_memo: Mutex<Option<ProcessMemo>>,
}

impl LinuxWorld {
    pub fn new(host: HostRoot, options: ScanOptions, timeout: Duration) -> Self {
        Self {
            host,
            options,
            timeout,
            cluster: Arc::new(OnceLock::new()),
            latest: Mutex::new(None),
            process_memo: Mutex::new(None),
        }
    }

    /// Lets [`LinuxWorld::scan_periodic`] keep what a process's last full read found while its
    /// signs of change are the same, reading every process in full every `full_read_every`th
    /// such scan ([`crate::snapshot::process_memo`]).
    pub fn remember_processes(&self, full_read_every: u64) {
        *self.process_memo.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(ProcessMemo::new(full_read_every));
    }

    /// A scan of the whole host for the daemon's scanner: like `scan(Target::All)`, but using
    /// the process memo when [`LinuxWorld::remember_processes`] set one. Only for showing and
    /// the grace clocks: every action re-checks its device with a fresh `scan` that reads
    /// every process in full. `Ok(None)`: `stop` said stop before the scan was done (the
    /// latest snapshot stays the previous scan's).
    pub fn scan_periodic(&self, stop: Stop<'_>) -> Result<Option<Scan>, EngineError> {
        let mut memo = self.process_memo.lock().unwrap_or_else(|p| p.into_inner());
        match self.scan_with(Target::All, memo.as_mut(), stop) {
            Err(EngineError::Discover(DiscoverError::Stopped)) => Ok(None),
            scanned => scanned.map(Some),
        }
    }

    /// The processes with a task in each of `ids` ([`crate::snapshot::new_namespaces::processes_in`]; the
    /// latest snapshot's kernel threads are passed over). Blocking.
    pub fn processes_in(
        &self,
        ids: &HashSet<MountNsId>,
    ) -> Result<BTreeMap<MountNsId, BTreeSet<u32>>, String> {
        let kthreads: HashSet<u32> = {
            let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            latest.as_ref().map(|(s, _)| s.kernel_threads.iter().map(|k| k.pid).collect()).unwrap_or_default()
        };
        crate::snapshot::new_namespaces::processes_in(&self.host, ids, &kthreads, &self.options)
    }

    /// The mount namespaces of the latest full scan, each with its 64-bit ID when the scan
    /// read it from the namespace's own file, and a file that names it (`ns/mnt` of a task in
    /// it, or its pin): what the mount watch marks.
    pub fn namespace_files(&self) -> Vec<(MountNsId, Option<u64>, PathBuf)> {
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        let Some((snap, _)) = latest.as_ref() else { return Vec::new() };
        snap.namespaces
            .iter()
            .filter_map(|n| {
                let entry = n.pinned_by.clone().or_else(|| {
                    n.tasks.first().map(|&(pid, tid)| crate::discover::namespaces::NsEntry::Task { pid, tid })
                })?;
                Some((n.id, n.kernel_id, entry.ns_file(&self.host)))
            })
            .collect()
    }

    /// A [`Scan`] of a snapshot: its graph, blind spots and protected devices.
    fn scan_of(&self, snap: &Snapshot, taken_at: BootTime, scope: Option<Vec<DevNum>>) -> Scan {
        self.scan_of_only(snap, taken_at, scope, None)
    }

    /// [`Self::scan_of`] with the graph built for `only` (`None`: every device).
    fn scan_of_only(
        &self,
        snap: &Snapshot,
        taken_at: BootTime,
        scope: Option<Vec<DevNum>>,
        only: Option<&HashSet<DevNum>>,
    ) -> Scan {
        let started = Instant::now();
        let graph = DeviceGraph::build_only(snap, only);
        let built = started.elapsed();
        let mut blind_spots = snap.blind_spots.clone();
        let protected = protected_devices(
            &self.host,
            &graph,
            &self.options.protected_paths,
            &self.options.protected_devices,
            &mut blind_spots,
        );
        tracing::trace!(
            build_us = built.as_micros() as u64,
            protect_us = (started.elapsed() - built).as_micros() as u64,
            devices = graph.devices.len(),
            "graph built"
        );
        Scan {
            graph,
            blind_spots,
            protected,
            stats: snap.stats.clone(),
            warnings: snap.warnings.clone(),
            taken_at,
            scope,
        }
    }
}

impl LinuxWorld {
    /// Reads the host (see [`World::scan`]); `memo` only for the daemon's own full scans.
    fn scan_with(
        &self,
        target: Target,
        memo: Option<&mut ProcessMemo>,
        stop: Stop<'_>,
    ) -> Result<Scan, EngineError> {
        let taken_at = BootTime::now();
        let started = Instant::now();
        let devices = blockdev::scan_all(&self.host)?;
        let (scope, covered) = match target {
            Target::All => (Scope::All, None),
            Target::Device(d) => {
                if !devices.devices.iter().any(|x| x.devnum == d) {
                    return Err(EngineError::NotFound(format!(
                        "no block device {d} in {}",
                        self.host.sys_class_block().display()
                    )));
                }
                let s = blockdev::with_descendants(&devices.devices, d);
                (Scope::Devices(s.clone()), Some(s))
            }
            // A plan's scope: the device asked about must be there; the others as they are.
            Target::Devices(ds) => {
                if let Some(d) = ds.first().filter(|d| !devices.devices.iter().any(|x| x.devnum == **d)) {
                    return Err(EngineError::NotFound(format!(
                        "no block device {d} in {}",
                        self.host.sys_class_block().display()
                    )));
                }
                let mut s: Vec<DevNum> = Vec::new();
                for d in ds.iter().filter(|d| devices.devices.iter().any(|x| x.devnum == **d)) {
                    for x in blockdev::with_descendants(&devices.devices, *d) {
                        if !s.contains(&x) {
                            s.push(x);
                        }
                    }
                }
                (Scope::Devices(s.clone()), Some(s))
            }
        };
        let snap = Snapshot::take_with(&self.host, devices, &scope, started, &self.options, memo, stop)?;
        let scan = self.scan_of(&snap, taken_at, covered);
        if scope == Scope::All {
            *self.latest.lock().unwrap_or_else(|p| p.into_inner()) = Some((Arc::new(snap), taken_at));
        }
        Ok(scan)
    }
}

impl World for LinuxWorld {
    fn scan(&self, target: Target) -> Result<Scan, EngineError> {
        self.scan_with(target, None, Stop::NEVER)
    }

    fn rescan_changed(&self, changes: &Changes, reusable: &HashSet<DevNum>) -> Result<Reread, String> {
        // Taken out while it is updated in place: a re-read that fails leaves none, so the next
        // change is read by a full scan too (a half-updated snapshot is never kept).
        let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((snap, taken_at)) = latest else { return Err("no full scan yet".into()) };
        let started = std::time::Instant::now();
        // Nobody else holds it (the lock is held only to swap it): no copy.
        let mut next = Arc::try_unwrap(snap).unwrap_or_else(|shared| (*shared).clone());
        let read: HashSet<MountNsId> = changes.namespaces.union(&changes.gone).copied().collect();
        let refs_change = !changes.gone.is_empty() || !changes.new_namespaces.is_empty();
        let before = next.device_inputs(&read, None, refs_change);
        next.update(&self.host, changes, &self.options)?;
        let updated = started.elapsed();
        let touched_at = std::time::Instant::now();
        let touched = if changes.devices.is_empty() {
            touched::touched(&before, &next.device_inputs(&read, Some(&before), refs_change), &next)
        } else {
            Touched::All("a block device changed")
        };
        let rebuilt = match touched {
            Touched::Some(t) => {
                let rebuilt: HashSet<DevNum> = next
                    .devices
                    .iter()
                    .map(|d| d.devnum)
                    .filter(|d| t.contains(d) || !reusable.contains(d))
                    .collect();
                // A device judged with others is never judged alone.
                match rebuilt.iter().find(|d| touched::stacked(&next, **d)) {
                    Some(_) => None,
                    None => Some(rebuilt),
                }
            }
            Touched::All(why) => {
                tracing::debug!("every device rebuilt: {why}");
                None
            }
        };
        let touched_us = touched_at.elapsed().as_micros() as u64;
        // Judged as of the full scan whose fds and processes it carries.
        let scope = rebuilt.as_ref().map(|r| r.iter().copied().collect());
        let scan = self.scan_of_only(&next, taken_at, scope, rebuilt.as_ref());
        tracing::debug!(
            updated_us = updated.as_micros() as u64,
            graph_us = (started.elapsed() - updated).as_micros() as u64,
            touched_us,
            rebuilt = rebuilt.as_ref().map_or(next.devices.len(), HashSet::len),
            devices = next.devices.len(),
            "re-read snapshot joined"
        );
        let devices = next.devices.iter().map(|d| d.devnum).collect();
        // Put back only if no full scan replaced it meanwhile (a re-read that overran its
        // deadline finishes late): the newer full scan wins, never an older snapshot.
        let mut slot = self.latest.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_none() {
            *slot = Some((Arc::new(next), taken_at));
        }
        Ok(Reread { scan, rebuilt, devices })
    }

    fn kernel_word(&self, device: &DeviceName, devnum: DevNum) -> KernelWord {
        probe::kernel_word(&self.host, device, devnum, self.timeout)
    }

    fn resolve(&self, arg: &str) -> Result<DevNum, EngineError> {
        let devices = blockdev::scan(&self.host)?;
        crate::graph::resolve::device(&self.host, &devices, arg)
            .map(|d| d.devnum)
            .map_err(|e| EngineError::NotFound(e.to_string()))
    }

    fn sight(&self) -> Result<(), String> {
        let euid = nix::unistd::geteuid();
        if self.host.is_live() && !euid.is_root() {
            return Err(format!(
                "this run is not root (uid {euid}), so it cannot see other processes' mount namespaces, open files, working directories and memory maps: it cannot tell whether anything holds the device; run it as root on the host (in a pod: privileged, hostPID: true)"
            ));
        }
        // Root without the capabilities that open other processes' namespaces and fd tables.
        let status = std::fs::read_to_string(self.host.proc().join("self/status")).unwrap_or_default();
        let eff = status
            .lines()
            .find_map(|l| l.strip_prefix("CapEff:"))
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        if let (true, Some(eff)) = (self.host.is_live(), eff) {
            let missing: Vec<&str> =
                [(2, "CAP_DAC_READ_SEARCH"), (19, "CAP_SYS_PTRACE"), (21, "CAP_SYS_ADMIN")]
                    .iter()
                    .filter(|(bit, _)| eff & (1 << bit) == 0)
                    .map(|(_, name)| *name)
                    .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "this run lacks {}, so it cannot see every process's mount namespace, open files and memory maps: it cannot tell whether anything holds the device; run it as root with every capability (in a pod: privileged, hostPID: true)",
                    missing.join(", ")
                ));
            }
        }
        Ok(())
    }

    fn cluster(&self) -> Option<ClusterView> {
        self.cluster.get().map(|rx| rx.borrow().clone())
    }

    fn can_act(&self) -> Result<(), String> {
        if !self.host.is_live() {
            return Err(format!(
                "{} is not this process's procfs (a fixture tree?): namespaces and devices cannot be acted on through it",
                self.host.proc().display()
            ));
        }
        let ns = std::fs::read_link(self.host.proc().join("self/ns/pid"))
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|e| format!("unreadable ({e})"));
        if ns != INITIAL_PID_NS {
            return Err(format!(
                "acting needs the host's PID namespace (hostPID: true in the pod spec): this agent runs in PID namespace {ns}, \
                 where it sees only its own processes and would miss every holder outside them"
            ));
        }
        Ok(())
    }

    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        LinuxActuator::new(self.host.clone(), self.timeout).run(step)
    }

    fn now(&self) -> BootTime {
        BootTime::now()
    }

    fn iscsi_session(&self, sid: u32) -> Result<Option<(String, Option<String>)>, String> {
        use crate::discover::iscsi;
        let Some(d) = iscsi::detail(&self.host, sid).map_err(|e| e.to_string())? else { return Ok(None) };
        let target = iscsi::targetname(&self.host, sid).map_err(|e| e.to_string())?.unwrap_or_default();
        Ok(Some((target, d.portal())))
    }

    fn agent_alive(&self, pid: u32) -> bool {
        // `comm` is the executable's name cut to 15 bytes: `blockjanitor-ag`.
        std::fs::read_to_string(self.host.proc().join(pid.to_string()).join("comm"))
            .is_ok_and(|c| c.trim_end().starts_with("blockjanitor"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// The namespace of task `tid` of this process in the latest snapshot.
    fn listed_ns(world: &LinuxWorld, tid: u32) -> Option<MountNsId> {
        let latest = world.latest.lock().expect("latest");
        let (snap, _) = latest.as_ref()?;
        let me = std::process::id();
        snap.namespaces.iter().find(|n| n.tasks.contains(&(me, tid))).map(|n| n.id)
    }

    fn ns_of(tid: u32) -> MountNsId {
        crate::discover::processes::task_mount_ns(&HostRoot::default().proc_task(std::process::id(), tid))
            .expect("ns link")
    }

    /// The live host's world as the daemon has it (its process memo reading every process in
    /// full every `full_read_every`th scan); `None` (skipped, with `why` printed) unless root,
    /// which CI always is.
    fn live_world(full_read_every: u64, why: &str) -> Option<LinuxWorld> {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: needs root ({why})");
            return None;
        }
        let options = ScanOptions { trust_unreadable_init: true, ..ScanOptions::default() };
        let world = LinuxWorld::new(HostRoot::default(), options, Duration::from_secs(30));
        world.remember_processes(full_read_every);
        Some(world)
    }

    /// On the live kernel (root): a periodic scan asked to stop, at its first ask or its last
    /// (before the files are read), ends without a snapshot: the previous one stays the
    /// latest, and the process memo does not count it as a turn.
    #[test]
    fn a_stopped_scan_keeps_the_latest_snapshot_and_is_no_turn() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        // Even turns read every process in full, odd ones are light.
        let Some(world) = live_world(2, "every process's files") else { return };
        world.scan_periodic(Stop::NEVER).expect("scan").expect("not stopped");
        let latest = || Arc::clone(&world.latest.lock().expect("latest").as_ref().expect("a snapshot").0);
        let light_next = || world.process_memo.lock().expect("memo").as_ref().expect("memo").next_is_light();
        let stops_at = |n: usize, asks: &AtomicUsize| asks.fetch_add(1, Ordering::Relaxed) + 1 >= n;

        let (before, light) = (latest(), light_next());
        let asks = AtomicUsize::new(0);
        let first = || stops_at(1, &asks);
        assert!(world.scan_periodic(Stop::when(&first)).expect("no error").is_none());
        assert!(Arc::ptr_eq(&before, &latest()), "a stopped scan left its snapshot");
        assert_eq!(light_next(), light, "a stopped scan counted as a turn");

        // One ask per process, one before the mount tables, and the last before the files (the
        // count of processes may change between the count and the scan: tried again then).
        let mut stopped_last = false;
        for _ in 0..5 {
            let (before, light) = (latest(), light_next());
            let last = crate::discover::processes::pids(&world.host).expect("pids").len() + 2;
            let asks = AtomicUsize::new(0);
            let at_last = || stops_at(last, &asks);
            if world.scan_periodic(Stop::when(&at_last)).expect("no error").is_some() {
                continue;
            }
            assert!(Arc::ptr_eq(&before, &latest()), "a stopped scan left its snapshot");
            assert_eq!(light_next(), light, "a scan stopped before its files counted as a turn");
            stopped_last = true;
            break;
        }
        assert!(stopped_last, "no scan reached its last ask in five tries");
    }

    /// On the live kernel (root): the daemon's light scans take each task's namespace as the last
    /// scan read it only while no mount namespace was made or went away, so a thread that
    /// unshares its own is seen by the very next light scan; a thread that joins an existing
    /// namespace (`setns`) is seen by the next full read (`snapshot::task_memo`).
    #[test]
    fn a_light_scan_sees_a_task_unshare_and_a_full_read_sees_it_join() {
        use nix::sched::CloneFlags;
        // Scans 1 and 4 read every task; 2 and 3 are light.
        let Some(world) = live_world(3, "unshare, setns") else { return };
        let (to_unsharer, unsharer_rx) = mpsc::channel::<()>();
        let (to_test, from_threads) = mpsc::channel::<u32>();
        let tx = to_test.clone();
        let unsharer = std::thread::spawn(move || {
            tx.send(nix::unistd::gettid().as_raw() as u32).expect("send");
            unsharer_rx.recv().expect("go");
            nix::sched::unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).expect("unshare");
            tx.send(0).expect("send");
            let _ = unsharer_rx.recv(); // stays in its namespace until told
        });
        let t = from_threads.recv().expect("tid");
        let original = ns_of(t);
        world.scan_periodic(Stop::NEVER).expect("scan 1").expect("not stopped");
        assert_eq!(listed_ns(&world, t), Some(original));
        to_unsharer.send(()).expect("go");
        from_threads.recv().expect("unshared");
        let private = ns_of(t);
        assert_ne!(private, original);
        world.scan_periodic(Stop::NEVER).expect("scan 2 (light)").expect("not stopped");
        assert_eq!(listed_ns(&world, t), Some(private), "a namespace was made: every task read");

        let (to_joiner, joiner_rx) = mpsc::channel::<()>();
        let joiner = std::thread::spawn(move || {
            to_test.send(nix::unistd::gettid().as_raw() as u32).expect("send");
            joiner_rx.recv().expect("go");
            let ns = std::fs::File::open(format!("/proc/self/task/{t}/ns/mnt")).expect("its namespace");
            nix::sched::unshare(CloneFlags::CLONE_FS).expect("own fs");
            nix::sched::setns(ns, CloneFlags::CLONE_NEWNS).expect("setns");
            to_test.send(0).expect("send");
            let _ = joiner_rx.recv();
        });
        let j = from_threads.recv().expect("tid");
        world.scan_periodic(Stop::NEVER).expect("scan 3 (light)").expect("not stopped");
        to_joiner.send(()).expect("go");
        from_threads.recv().expect("joined");
        assert_eq!(ns_of(j), private);
        world.scan_periodic(Stop::NEVER).expect("scan 4 (full read)").expect("not stopped");
        assert_eq!(listed_ns(&world, j), Some(private), "the full read reads every task");
        drop((to_unsharer, to_joiner));
        unsharer.join().expect("unsharer");
        joiner.join().expect("joiner");
    }
}
