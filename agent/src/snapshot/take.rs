//! Taking one snapshot of the host: the processes, their mount namespaces and open files, the
//! inventories, and what could not be read (blind spots).

use super::inventory::{
    hidden_mount, join_anonymous, learn_loop_backing, read_inventories, read_io, Inventories,
};
use super::process_read_cache::{Context, ProcessReadCache};
use super::task_namespace_cache::TaskNamespaceCache;
use super::{KernelThread, ScanOptions, Scope, Snapshot};
use crate::discover::fds::{self, ProcRef};
use crate::discover::livefs::{self, AnonIndex, LiveFs};
use crate::discover::namespaces::{self, MountNamespace, NsEntry, NsMount, TextReuse, Wanted};
use crate::discover::processes::{self, ProcEntry};
use crate::discover::{blockdev, kubelet, sight, DiscoverError};
use crate::host::HostRoot;
use crate::model::blindspot::BlindSpot;
use crate::model::scan_stats::ScanStats;
use crate::model::{BlockDevice, DevNum, DeviceName, MountNsId, ProcessInfo};
use crate::{host::parallel, host::sys};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Instant;

/// What could not be read of a process: a blind spot, or (PID 1, trusted) a warning.
pub(super) fn unreadable_process(
    pid: u32,
    what: String,
    opts: &ScanOptions,
    warnings: &mut Vec<String>,
    blind: &mut Vec<BlindSpot>,
) {
    if pid == 1 && opts.trust_unreadable_init {
        warnings.push(format!("{what} (PID 1 trusted to hold no device: --trust-unreadable-init)"));
    } else {
        blind.push(BlindSpot::any(what));
    }
}

impl Snapshot {
    /// Runs a scan on devices already read from sysfs (at `started`): the readable ones, and
    /// those that could not be read (each a blind spot reaching it). With `memo` (the daemon's
    /// own full scans only, [`super::process_read_cache`]), a process whose signs of change are the
    /// same keeps what its last full read found of its fds and mappings. `stop` is asked while
    /// the processes are read, and before the mount tables and before the files are read: once
    /// it says stop, the scan ends with [`DiscoverError::Stopped`]. The memories keep what the
    /// kernel said before that (it was true); the process memo does not count the scan.
    pub fn take_with(
        host: &HostRoot,
        blockdev::SysfsDevices { devices, unreadable: unreadable_devices }: blockdev::SysfsDevices,
        scope: &Scope,
        started: Instant,
        opts: &ScanOptions,
        memo: Option<&mut ProcessReadCache>,
        stop: parallel::Stop<'_>,
    ) -> Result<Self, DiscoverError> {
        let targets: HashSet<DevNum> = match scope {
            Scope::All => devices.iter().map(|d| d.devnum).collect(),
            Scope::Devices(v) => v.iter().copied().collect(),
        };
        let mut taking = Taking { host, opts, started, stop, warnings: Vec::new(), blind: Vec::new() };
        taking.unreadable_devices(unreadable_devices);
        let io = read_io(host, &devices, &targets, &mut taking.warnings);
        taking.blocked_loops(&devices);
        // Whole-host scans only: a memo's answers are filtered by every device in scope.
        let mut memo = memo.filter(|_| *scope == Scope::All);
        let procs = taking.processes(memo.as_deref_mut())?;
        let live_fs = taking.live_filesystems(&devices);
        let seen = Seen { devices: &devices, targets: &targets, live_fs: &live_fs };
        let mut tables = taking.mount_tables(&procs, scope, seen)?;
        let files = taking.files(memo.as_deref_mut(), &procs.entries, &targets, &mut tables)?;
        taking.pinned_namespaces(&mut tables, seen);
        let MountTables { ns_map, mounts, mut anon, via_statmount, .. } = tables;
        learn_loop_backing(host, &devices, &mounts, &mut anon);
        let (Inventories { swaps, dm_devices, scsi, rbd, nbd, nvme }, kubelet) =
            taking.inventories(&devices, &targets, &anon);
        let entries = &procs.entries;
        let kernel_threads: Vec<KernelThread> = entries
            .iter()
            .filter(|e| e.kthread)
            .map(|e| KernelThread { pid: e.pid, comm: e.comm.clone() })
            .collect();
        let processes = label_holders(host, memo, entries, &files.proc_refs, &mounts, &ns_map);
        let stats = ScanStats {
            processes: entries.len() - kernel_threads.len(),
            tasks: entries.iter().map(|e| e.tasks.len()).sum(),
            kernel_threads: kernel_threads.len(),
            mount_namespaces: ns_map.len(),
            mounts: ns_map.values().map(|n| n.mount_count).sum(),
            namespaces_via_statmount: via_statmount,
            mountinfo_bytes: ns_map.values().map(|n| n.mountinfo_bytes).sum(),
            duration: started.elapsed(),
        };
        let Taking { warnings, mut blind, .. } = taking;
        blind.sort_by(|a, b| a.what.cmp(&b.what));
        blind.dedup();
        Ok(Self {
            host_ns: procs.host_ns,
            host_ns_unsure: procs.host_ns_guess,
            devices,
            namespaces: ns_map.into_values().collect(),
            mounts,
            proc_refs: files.proc_refs,
            swaps,
            kernel_threads,
            processes,
            stuck_pids: files.stuck_pids,
            stats,
            warnings,
            blind_spots: blind,
            live_fs,
            in_scope: targets,
            dm_devices,
            scsi,
            rbd,
            nbd,
            nvme,
            kubelet,
            io,
            anon,
        })
    }

    /// The namespace with this ID.
    pub fn namespace(&self, id: MountNsId) -> Option<&MountNamespace> {
        self.namespaces.iter().find(|n| n.id == id)
    }
}

/// One snapshot being taken: the warnings and blind spots its phases add to, in the order they
/// run ([`Snapshot::take_with`]).
struct Taking<'a> {
    host: &'a HostRoot,
    opts: &'a ScanOptions,
    started: Instant,
    stop: parallel::Stop<'a>,
    warnings: Vec<String>,
    blind: Vec<BlindSpot>,
}

/// What the processes phase found.
struct Processes {
    entries: Vec<ProcEntry>,
    /// The host's mount namespaces listed before the tasks were read, by inode to ID (with a
    /// memo only): they answer a quiet namespace's table without going through its tasks.
    kernel_names: Option<HashMap<u64, u64>>,
    host_ns: MountNsId,
    /// Why the host's namespace is only a guess.
    host_ns_guess: Option<String>,
}

/// What the phases after the processes look through: the devices, those in scope, and the live
/// filesystems on them.
#[derive(Clone, Copy)]
struct Seen<'a> {
    devices: &'a [BlockDevice],
    targets: &'a HashSet<DevNum>,
    live_fs: &'a [LiveFs],
}

/// The mount namespaces and their mounts, as the mount-table phase read them and the files and
/// pinned-namespace phases complete them.
struct MountTables {
    ns_map: BTreeMap<MountNsId, MountNamespace>,
    mounts: Vec<NsMount>,
    anon: AnonIndex,
    /// Namespaces pinned (by an nsfs bind mount or an fd) that may have no task in them.
    pins: Vec<(MountNsId, NsEntry)>,
    via_statmount: usize,
    nsfs_dev: Option<DevNum>,
    live: bool,
}

/// What the files phase found: the processes' references to devices, and the processes in D
/// state.
struct Files {
    proc_refs: Vec<ProcRef>,
    stuck_pids: Vec<u32>,
}

impl Taking<'_> {
    /// Milliseconds since the scan started, for the phases' tracing.
    fn ms(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e3
    }

    /// A blind spot for each device whose sysfs directory could not be read.
    fn unreadable_devices(&mut self, unreadable: Vec<(String, DiscoverError)>) {
        for (name, e) in unreadable {
            self.blind.push(match DeviceName::new(&name) {
                Ok(n) => BlindSpot::devices(vec![n], e.to_string()),
                Err(_) => BlindSpot::any(e.to_string()),
            });
        }
    }

    /// A loop device whose LOOP_GET_STATUS64 blocked: the device its backing file lives on
    /// (which the loop device holds) is not known.
    fn blocked_loops(&mut self, devices: &[BlockDevice]) {
        for d in devices {
            if let Some(why) = d.loop_info.as_ref().and_then(|l| l.status_blocked.as_ref()) {
                self.blind.push(BlindSpot::any_device(format!(
                    "{why}: the device that backing file lives on, which {} holds, is not known",
                    d.name
                )));
            }
        }
    }

    /// Reads every process (until `stop`), then the host's mount namespace and what this run
    /// cannot see of the host's processes or paths.
    fn processes(&mut self, memo: Option<&mut ProcessReadCache>) -> Result<Processes, DiscoverError> {
        let host = self.host;
        // The host's mount namespaces before any task is read: a light scan takes each task's
        // namespace as the last scan read it while they are the same (`super::task_namespace_cache`).
        let listed = memo.as_ref().and_then(|_| TaskNamespaceCache::list_namespaces(host));
        // The same list answers a quiet namespace's table without going through its tasks.
        let kernel_names: Option<HashMap<u64, u64>> =
            listed.as_ref().map(|l| l.iter().map(|n| (n.inode, n.id)).collect());
        let known = memo.as_deref().and_then(|m| m.tasks.keep(listed.as_deref(), m.next_is_light()));
        let pids = processes::pids(host).map_err(|e| DiscoverError::read(host.proc(), e))?;
        let mut entries = Vec::new();
        let read =
            parallel::map_until(&pids, self.stop, |&pid| processes::read_entry_knowing(host, pid, known));
        for r in read.ok_or(DiscoverError::Stopped)? {
            match r {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => {} // exited while we looked
                Err(issue) => self.unreadable_process(issue.pid, issue.what),
            }
        }
        let tasks_kept = known.is_some();
        if let Some(m) = memo {
            m.tasks.remember(listed, &entries, !tasks_kept, || TaskNamespaceCache::list_namespaces(host));
        }
        for e in &entries {
            for what in &e.unreadable {
                self.unreadable_process(e.pid, what.clone());
            }
        }
        let (host_ns, host_ns_guess) = host_namespace(host, &mut self.warnings)?;
        if let Some(why) = &host_ns_guess {
            self.blind.push(BlindSpot::any(why.clone()));
        }
        // A run in a PID namespace of its own sees only its own processes, with no error for
        // the others; one that cannot reach the host's root cannot resolve the host's paths.
        self.blind.extend(sight::pid_namespace_gaps(host).into_iter().map(BlindSpot::any));
        let own_ns = processes::task_mount_ns(&host.proc().join("self"));
        self.blind.extend(sight::host_root_gap(host, own_ns, host_ns).map(BlindSpot::any));
        tracing::debug!(phase = "processes", ms = self.ms(), count = entries.len(), tasks_kept);
        Ok(Processes { entries, kernel_names, host_ns, host_ns_guess })
    }

    /// The filesystems live on the devices (a blind spot on every device when they cannot be
    /// read).
    fn live_filesystems(&mut self, devices: &[BlockDevice]) -> Vec<LiveFs> {
        let names: HashSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
        livefs::scan(self.host, &names).unwrap_or_else(|e| {
            self.blind.push(BlindSpot::any_device(format!("live filesystems: {e}")));
            Vec::new()
        })
    }

    /// Reads the mount table of every namespace the processes live in (unless `stop`), and ties
    /// btrfs mounts to their devices.
    fn mount_tables(
        &mut self,
        procs: &Processes,
        scope: &Scope,
        seen: Seen<'_>,
    ) -> Result<MountTables, DiscoverError> {
        let host = self.host;
        let mut ns_map = namespaces::group(&procs.entries);
        let live = host.is_live();
        let nsfs_dev =
            if live { sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev) } else { None };
        // A scan of every device only shows (every action scans its device afresh): it may reuse
        // the text of namespaces whose mount IDs did not change, but not on every turn without
        // asking the kernel again.
        // (Only whole-host scans count turns.)
        if self.stop.now() {
            return Err(DiscoverError::Stopped);
        }
        let reuse_text = if *scope != Scope::All {
            TextReuse::Never
        } else if crate::discover::statmount_cache::shallow_turn() {
            TextReuse::WhileSameIds
        } else {
            TextReuse::Confirmed
        };
        let kernel_names = procs.kernel_names.as_ref();
        let scan = namespaces::read_mounts(
            host,
            &mut ns_map,
            Wanted { targets: seen.targets, nsfs_dev, reuse_text, kernel_names },
            self.opts.reader,
        );
        for (_, devnum, why) in &scan.hidden {
            self.blind.push(hidden_mount(*devnum, why, seen.devices, seen.live_fs));
        }
        for (ns, e) in &scan.unreadable {
            self.blind.push(BlindSpot::any(format!(
                "the mount table of mount namespace {} cannot be read: {e}",
                ns.0
            )));
        }
        let mut mounts = scan.mounts;
        // btrfs mounts tied to their devices before the files are read: a file on btrfs is
        // followed to its devices through them (fds.rs).
        let mut anon = AnonIndex::default();
        join_anonymous(host, &mut mounts, seen.devices, seen.live_fs, &mut self.blind, &mut anon);
        tracing::debug!(
            phase = "mountinfo",
            ms = self.ms(),
            namespaces = ns_map.len(),
            text = ?reuse_text,
            text_bytes = ns_map.values().map(|n| n.mountinfo_bytes).sum::<usize>(),
            confirmed_texts = crate::discover::statmount_cache::confirmed(),
            built_texts = crate::discover::statmount_cache::built()
        );
        let (pins, via_statmount) = (scan.nsfs_pins, scan.via_statmount);
        Ok(MountTables { ns_map, mounts, anon, pins, via_statmount, nsfs_dev, live })
    }

    /// Reads the open files and mappings of every user process (unless `stop`), through the
    /// memo when there is one: their references to devices, the namespaces they pin and the
    /// subvolumes they show.
    fn files(
        &mut self,
        memo: Option<&mut ProcessReadCache>,
        entries: &[ProcEntry],
        targets: &HashSet<DevNum>,
        tables: &mut MountTables,
    ) -> Result<Files, DiscoverError> {
        if self.stop.now() {
            return Err(DiscoverError::Stopped);
        }
        let (host, live, nsfs_dev) = (self.host, tables.live, tables.nsfs_dev);
        let known: HashSet<MountNsId> = tables.ns_map.keys().copied().collect();
        let user_procs: Vec<&ProcEntry> = entries.iter().filter(|e| !e.kthread).collect();
        let (fd_scans, turn) = match memo {
            Some(memo) => {
                let context = Context { targets: targets.clone(), nsfs_dev, anon: tables.anon.clone() };
                let (scans, turn) = memo.scan(host, &user_procs, context, live);
                (scans, Some(turn))
            }
            None => (
                parallel::map(&user_procs, |e| {
                    fds::scan_process(host, e, targets, nsfs_dev, &known, live, &tables.anon)
                }),
                None,
            ),
        };
        let mut proc_refs = Vec::new();
        let mut stuck_pids = Vec::new();
        for (e, s) in user_procs.iter().zip(fd_scans) {
            proc_refs.extend(s.refs);
            for (dev, members) in s.learned {
                tables.anon.add_dev(dev, &members);
            }
            tables.pins.extend(s.pinned_ns);
            if s.stuck {
                stuck_pids.push(e.pid);
            }
            for what in s.unreadable {
                self.unreadable_process(e.pid, what);
            }
        }
        tracing::debug!(
            phase = "files",
            ms = self.ms(),
            processes = user_procs.len(),
            full_read = turn.is_none_or(|t| t.full_read),
            read_in_full = turn.map_or(user_procs.len(), |t| t.read),
            kept = turn.map_or(0, |t| t.kept)
        );
        Ok(Files { proc_refs, stuck_pids })
    }

    /// Namespaces no task lives in: enter them through their pin (live host only).
    fn pinned_namespaces(&mut self, tables: &mut MountTables, seen: Seen<'_>) {
        let mut known: HashSet<MountNsId> = tables.ns_map.keys().copied().collect();
        for (id, entry) in std::mem::take(&mut tables.pins) {
            if !known.insert(id) {
                continue;
            }
            if !tables.live {
                self.blind.push(BlindSpot::any(format!(
                    "mount namespace {id} ({}) has no process and was not entered (not a live host)",
                    entry.describe()
                )));
                continue;
            }
            match namespaces::read_pinned(self.host, id, entry.clone(), seen.targets) {
                Ok((ns, m)) => {
                    let mut m = m;
                    let anon = &mut tables.anon;
                    join_anonymous(self.host, &mut m, seen.devices, seen.live_fs, &mut self.blind, anon);
                    tables.mounts.extend(m);
                    tables.ns_map.insert(id, ns);
                }
                Err(e) => self
                    .blind
                    .push(BlindSpot::any(format!("mount namespace {id} ({}): {e}", entry.describe()))),
            }
        }
    }

    /// The kernel's inventories (swaps, maps, SCSI, rbd, nbd, NVMe) and the kubelet's volumes,
    /// with their warnings.
    fn inventories(
        &mut self,
        devices: &[BlockDevice],
        targets: &HashSet<DevNum>,
        anon: &AnonIndex,
    ) -> (Inventories, kubelet::KubeletScan) {
        let inventories = read_inventories(self.host, devices, targets, anon, &mut self.blind);
        self.warnings.extend(inventories.nvme.idle_controllers());
        let kubelet = kubelet::walk::scan(self.host, &self.opts.kubelet_dir).unwrap_or_else(|e| {
            self.blind.push(BlindSpot::any_device(format!(
                "the kubelet directory cannot be read ({e}): which pods use which volumes is not known"
            )));
            kubelet::KubeletScan::default()
        });
        self.warnings.extend(kubelet.warnings.iter().map(|w| format!("kubelet: {w}")));
        (inventories, kubelet)
    }

    /// [`unreadable_process`] into this snapshot's warnings and blind spots.
    fn unreadable_process(&mut self, pid: u32, what: String) {
        unreadable_process(pid, what, self.opts, &mut self.warnings, &mut self.blind);
    }
}

/// Label holder processes: fd holders, and the first process of each namespace that mounts an
/// in-scope device (through the memo when there is one).
fn label_holders(
    host: &HostRoot,
    memo: Option<&mut ProcessReadCache>,
    entries: &[ProcEntry],
    proc_refs: &[ProcRef],
    mounts: &[NsMount],
    ns_map: &BTreeMap<MountNsId, MountNamespace>,
) -> BTreeMap<u32, ProcessInfo> {
    let by_pid: HashMap<u32, &ProcEntry> = entries.iter().map(|e| (e.pid, e)).collect();
    let mut holder_pids: Vec<u32> = proc_refs.iter().map(|r| r.pid).collect();
    for m in mounts {
        if let Some(ns) = ns_map.get(&m.ns) {
            holder_pids.extend(ns.pids.iter().take(1));
        }
    }
    holder_pids.sort_unstable();
    holder_pids.dedup();
    let labelled: Vec<&ProcEntry> = holder_pids.iter().filter_map(|p| by_pid.get(p).copied()).collect();
    let labels = match memo {
        Some(memo) => memo.describe(host, &labelled),
        None => labelled.iter().map(|e| processes::describe(host, e)).collect(),
    };
    labelled.iter().map(|e| e.pid).zip(labels).collect()
}

/// The host's mount namespace: PID 1's. When PID 1 cannot be inspected (a sandbox supervisor,
/// an LSM), kthreadd's: kernel threads live in the initial mount namespace. When neither can be
/// read, this agent's own namespace, which is then only a guess: `None` comes back as the
/// second value with why, and the caller must not act on "foreign" mounts.
pub(super) fn host_namespace(
    host: &HostRoot,
    warnings: &mut Vec<String>,
) -> Result<(MountNsId, Option<String>), DiscoverError> {
    if let Some(ns) = processes::task_mount_ns(&host.proc_pid(1)) {
        return Ok((ns, None));
    }
    let path = host.proc_pid(1).join("ns/mnt");
    let why = std::fs::read_link(&path)
        .err()
        .map_or_else(|| "not a mnt:[INODE] link".to_owned(), |e| e.to_string());
    if let Some(ns) = processes::task_mount_ns(&host.proc_pid(2)) {
        warnings.push(format!(
            "cannot read {} ({why}); taking the initial mount namespace (kthreadd's, {ns}) as the host's",
            path.display()
        ));
        return Ok((ns, None));
    }
    match processes::task_mount_ns(&host.proc().join("self")).filter(|_| host.is_live()) {
        Some(ns) => Ok((
            ns,
            Some(format!(
                "cannot read the mount namespace of PID 1 or kthreadd ({why}): which namespace is the host's is a guess (this agent's own, {ns})"
            )),
        )),
        None => Err(DiscoverError::attr(&path, &why, "expected a link to mnt:[INODE] (is this a procfs?)")),
    }
}
