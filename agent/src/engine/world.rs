//! What the engine needs from the machine, and the real machine behind it.
//!
//! [`World`] is the engine's only way out: reading the host, asking the kernel about one device,
//! the Kubernetes API's view, whether this agent may act at all, and running a step.
//! [`LinuxWorld`] is the live host (or a fixture tree, which can be read but never acted on); the
//! property test has a simulated world with hidden holders, identity swaps and failing steps.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::error::EngineError;
use crate::act::linux::LinuxActuator;
use crate::act::pod_volume::DirActError;
use crate::act::{ActError, Actuator, StepOutcome};
use crate::discover::kubelet::pod_dirs::PodDirs;
use crate::discover::pod_processes::PodProcesses;
use crate::discover::probe::{self, KernelWord};
use crate::discover::sight::INITIAL_PID_NS;
use crate::discover::{blockdev, DiscoverError};
use crate::graph::propagation::NsTable;
use crate::graph::protect::protected_devices;
use crate::graph::scan::{Scan, Target};
use crate::graph::DeviceGraph;
use crate::host::beneath::FileKey;
use crate::host::clock::BootTime;
use crate::host::parallel::Stop;
use crate::host::HostRoot;
use crate::kube::ClusterView;
use crate::model::{DevNum, DeviceName, MountNsId};
use crate::plan::pod_volume::DirStep;
use crate::plan::Step;
use crate::snapshot::process_read_cache::ProcessReadCache;
use crate::snapshot::reread::Changes;
use crate::snapshot::touched_devices::{self, Touched};
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
    /// The whole mount tables of the mount namespaces `scan` found that `wanted` accepts, read
    /// now, each once (`discover::mount_tables`): what an unmount takes with it through mount
    /// propagation is worked out from them (`graph::propagation`). A namespace whose table cannot
    /// be read is there with why; one the world cannot read at all is never left out silently.
    fn mount_tables(&self, scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable>;
    /// How many distinct open files (open file descriptions) the fds `fds` (pid, fd), which a
    /// scan saw open on the node of `devnum`, are now (dup'd, inherited and passed fds are one),
    /// asked of the kernel right after [`World::kernel_word`] read the device's open count; fds
    /// no longer open on it are not counted. `Err`: it cannot tell, and why. A world that cannot
    /// ask the kernel cannot tell for any fd.
    fn open_files(&self, devnum: DevNum, fds: &[(u32, u32)]) -> Result<usize, String> {
        if fds.is_empty() {
            return Ok(0);
        }
        Err(format!("this world cannot ask the kernel which fds on {devnum} are one open file"))
    }
    /// The Kubernetes API's view of this node, when the API is in use.
    fn cluster(&self) -> Option<ClusterView>;
    /// Whether this agent may act on the host at all; why not otherwise.
    fn can_act(&self) -> Result<(), String>;
    /// Why [`World::cluster`] has no view (the API is not asked), as reports show it.
    fn api_off(&self) -> String {
        "not configured".to_owned()
    }
    /// Carries out one step (the engine has re-checked it).
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError>;
    /// Now, on a clock that cannot jump.
    fn now(&self) -> BootTime;
    /// Whether process `pid` is alive and is this agent's program (the writer of a journal
    /// intent still at work, not crashed). A world without processes has none.
    fn agent_alive(&self, _pid: u32) -> bool {
        false
    }
    /// Whether the writer of a journal record is still at work: the same process (its PID and
    /// start time, in this boot) still running. A record written before records carried a
    /// start time: [`World::agent_alive`] of its PID.
    fn writer_alive(&self, writer: &crate::act::journal::Writer) -> bool {
        self.agent_alive(writer.pid)
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
    /// Kubelet's per-pod directories now, each volume place with its device and inode, and its
    /// content for the pods `survey` accepts ([`crate::discover::kubelet::pod_dirs`]). A world
    /// without a kubelet directory says why.
    fn pod_dirs(&self, survey: &dyn Fn(&str) -> bool) -> Result<PodDirs, String> {
        let _ = survey;
        Err("this world has no kubelet directory".into())
    }
    /// Which pods have a process on this node now ([`crate::discover::pod_processes`]).
    fn pod_processes(&self) -> Result<PodProcesses, String> {
        Err("this world cannot read processes' cgroups".into())
    }
    /// A host path's device and inode and the mount a stat of it on the host was reached
    /// through, as the host sees it ([`crate::host::HostRoot::stat_on_host`]).
    fn stat_on_host(&self, path: &Path) -> Result<(FileKey, Option<u64>), String> {
        Err(format!("this world cannot stat {} on the host", path.display()))
    }
    /// The device and inode of the directory `rel` below the kubelet directory `kubelet_dir`
    /// (`None`: not there), looked at without following or crossing anything (crash recovery
    /// of an `rmdir`).
    fn dir_key(&self, kubelet_dir: &Path, rel: &Path) -> Result<Option<FileKey>, String> {
        Err(format!("this world cannot look at {}", kubelet_dir.join(rel).display()))
    }
    /// Whether mount namespace `ns` (found by a scan) is gone now, as the kernel says by its
    /// 64-bit ID: a namespace whose table could not be read because its last task exited holds
    /// no mount any more. `false` whenever that cannot be told.
    fn mount_ns_gone(&self, ns: &crate::discover::namespaces::MountNamespace) -> bool {
        let _ = ns;
        false
    }
    /// Removes one empty pod volume directory (the engine has re-checked it).
    fn remove_dir(&self, step: &DirStep) -> Result<StepOutcome, DirActError> {
        Err(DirActError::Precondition {
            path: step.host_path(),
            reason: "this world cannot remove directories".into(),
        })
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

/// The live host (or a fixture tree).
pub struct LinuxWorld {
    pub host: HostRoot,
    pub options: ScanOptions,
    /// Deadline of each kernel call that may block on a device.
    pub timeout: Duration,
    /// The Kubernetes API's view, set once where the API is asked (a view that cannot vouch
    /// while it cannot be reached); unset when it is not asked, for [`LinuxWorld::api_off`]'s
    /// reason.
    pub cluster: Arc<OnceLock<tokio::sync::watch::Receiver<ClusterView>>>,
    /// Why the API is not asked (`--no-kubernetes`, a one-shot run outside a cluster).
    pub api_off: Arc<OnceLock<String>>,
    /// The latest snapshot of the whole host and when its scan started: what
    /// [`World::rescan_changed`] brings up to date, in place (none after a re-read failed).
    latest: Mutex<Option<(Arc<Snapshot>, BootTime)>>,
    /// What the daemon's own full scans remember of each process ([`LinuxWorld::scan_periodic`]);
    /// `None`: every scan reads every process in full.
    process_read_cache: Mutex<Option<ProcessReadCache>>,
    /// What the last pin-risk pass found (`super::pins`).
    pub(crate) pins: Mutex<crate::discover::pin_read::PinMemo>,
}

impl LinuxWorld {
    pub fn new(host: HostRoot, options: ScanOptions, timeout: Duration) -> Self {
        Self {
            host,
            options,
            timeout,
            cluster: Arc::new(OnceLock::new()),
            api_off: Arc::new(OnceLock::new()),
            latest: Mutex::new(None),
            process_read_cache: Mutex::new(None),
            pins: Mutex::new(Default::default()),
        }
    }

    /// The latest whole-host snapshot, if a full scan made one (and no failed re-read dropped it).
    pub(crate) fn latest_snapshot(&self) -> Option<Arc<Snapshot>> {
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|(s, _)| Arc::clone(s))
    }

    /// Lets [`LinuxWorld::scan_periodic`] keep what a process's last full read found while its
    /// signs of change are the same, reading every process in full every `full_read_every`th
    /// such scan ([`crate::snapshot::process_read_cache`]).
    pub fn remember_processes(&self, full_read_every: u64) {
        *self.process_read_cache.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(ProcessReadCache::new(full_read_every));
    }

    /// A scan of the whole host for the daemon's scanner: like `scan(Target::All)`, but using
    /// the process memo when [`LinuxWorld::remember_processes`] set one. Only for showing and
    /// the grace clocks: every action re-checks its device with a fresh `scan` that reads
    /// every process in full. `Ok(None)`: `stop` said stop before the scan was done (the
    /// latest snapshot stays the previous scan's).
    pub fn scan_periodic(&self, stop: Stop<'_>) -> Result<Option<Scan>, EngineError> {
        let mut memo = self.process_read_cache.lock().unwrap_or_else(|p| p.into_inner());
        match self.scan_with(Target::All, memo.as_mut(), stop) {
            Err(EngineError::Discover(DiscoverError::Stopped)) => Ok(None),
            scanned => scanned.map(Some),
        }
    }

    /// The processes with a task in each of `ids` ([`crate::snapshot::new_namespace_read::processes_in`]; the
    /// latest snapshot's kernel threads are passed over). Blocking.
    pub fn processes_in(
        &self,
        ids: &HashSet<MountNsId>,
    ) -> Result<BTreeMap<MountNsId, BTreeSet<u32>>, String> {
        let kthreads: HashSet<u32> = {
            let latest = self.latest.lock().unwrap_or_else(|p| p.into_inner());
            latest.as_ref().map(|(s, _)| s.kernel_threads.iter().map(|k| k.pid).collect()).unwrap_or_default()
        };
        crate::snapshot::new_namespace_read::processes_in(&self.host, ids, &kthreads, &self.options)
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
            namespaces: Default::default(),
        }
    }
}

impl LinuxWorld {
    /// Reads the host (see [`World::scan`]); `memo` only for the daemon's own full scans.
    fn scan_with(
        &self,
        target: Target,
        memo: Option<&mut ProcessReadCache>,
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
        let mut scan = self.scan_of(&snap, taken_at, covered);
        if scan.scope.is_some() {
            // The ways into each namespace, for a release's whole tables (a plan's and a
            // re-check's scans are of some devices; a scan of all is for showing).
            scan.namespaces = Arc::new(snap.namespaces.clone());
        }
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
            touched_devices::touched(&before, &next.device_inputs(&read, Some(&before), refs_change), &next)
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
                match rebuilt.iter().find(|d| touched_devices::stacked(&next, **d)) {
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

    fn mount_tables(&self, scan: &Scan, wanted: &dyn Fn(MountNsId) -> bool) -> Vec<NsTable> {
        crate::discover::mount_tables::read_tables(&self.host, &scan.namespaces, wanted)
            .into_iter()
            .map(|(ns, table)| (ns, table.map_err(|e| e.to_string())))
            .collect()
    }

    fn open_files(&self, devnum: DevNum, fds: &[(u32, u32)]) -> Result<usize, String> {
        use crate::discover::open_files;
        open_files::count(&self.host, devnum, fds, open_files::MAX_PAIRS).map(|o| o.distinct)
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

    fn pod_dirs(&self, survey: &dyn Fn(&str) -> bool) -> Result<PodDirs, String> {
        crate::discover::kubelet::pod_dirs::scan(&self.host, &self.options.kubelet_dir, survey)
            .map_err(|e| e.to_string())
    }

    fn pod_processes(&self) -> Result<PodProcesses, String> {
        crate::discover::pod_processes::scan(&self.host)
            .map_err(|e| format!("cannot list {}: {e}", self.host.proc().display()))
    }

    fn stat_on_host(&self, path: &Path) -> Result<(FileKey, Option<u64>), String> {
        let id = self
            .host
            .stat_on_host(path)
            .map_err(|e| format!("cannot stat {} on the host: {e}", path.display()))?;
        // A fixture tree's files are reached through this process's mounts, not the tree's.
        let mnt_id = id.mnt_id.filter(|_| self.host.is_live());
        Ok((FileKey { dev: id.dev, ino: id.ino }, mnt_id))
    }

    fn dir_key(&self, kubelet_dir: &Path, rel: &Path) -> Result<Option<FileKey>, String> {
        crate::discover::kubelet::pod_dirs::key_below(&self.host, kubelet_dir, rel)
            .map_err(|e| format!("cannot look at {}: {e}", kubelet_dir.join(rel).display()))
    }

    fn remove_dir(&self, step: &DirStep) -> Result<StepOutcome, DirActError> {
        crate::act::pod_volume::remove(&self.host, step, self.timeout)
    }

    fn mount_ns_gone(&self, ns: &crate::discover::namespaces::MountNamespace) -> bool {
        self.host.is_live() && ns.kernel_id.is_some_and(|id| !crate::host::sys::mount_api::ns_exists(id))
    }

    fn api_off(&self) -> String {
        self.api_off.get().cloned().unwrap_or_else(|| "not asked".to_owned())
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

    /// A process at `pid` running this agent's executable, as root (never its name, which any
    /// process can take). Cannot be told: alive (its intent is left open, never closed under a
    /// writer that may be at work).
    fn agent_alive(&self, pid: u32) -> bool {
        crate::discover::process_identity::runs_this_executable(&self.host, pid).unwrap_or_else(|why| {
            tracing::warn!(pid, "cannot tell whether journal writer {pid} is alive: {why}");
            true
        })
    }

    fn writer_alive(&self, w: &crate::act::journal::Writer) -> bool {
        let (Some(start), Some(boot)) = (w.start, w.boot.as_deref()) else { return self.agent_alive(w.pid) };
        match crate::host::clock::boot_id(&self.host) {
            Some(now) if now != boot => return false, // another boot: every process of it is gone
            Some(_) => {}
            None => return true,
        }
        crate::discover::process_identity::same_process_running(&self.host, w.pid, start).unwrap_or_else(
            |why| {
                tracing::warn!(pid = w.pid, "cannot tell whether journal writer {} is alive: {why}", w.pid);
                true
            },
        )
    }
}

#[cfg(test)]
#[path = "world_tests.rs"]
mod tests;
