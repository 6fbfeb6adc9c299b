//! Taking one snapshot of the host: the processes, their mount namespaces and open files, the
//! inventories, and what could not be read (blind spots).

use super::inventory::{
    hidden_mount, join_anonymous, learn_loop_backing, read_inventories, read_io, Inventories,
};
use super::process_memo::{Context, ProcessMemo};
use super::task_memo::TaskMemo;
use super::{KernelThread, ScanOptions, ScanStats, Scope, Snapshot};
use crate::discover::fds::{self};
use crate::discover::livefs::{self, AnonIndex};
use crate::discover::namespaces::{self, MountNamespace, TextReuse, Wanted};
use crate::discover::processes::{self, ProcEntry};
use crate::discover::{blockdev, kubelet, sight, DiscoverError};
use crate::host::HostRoot;
use crate::model::blindspot::BlindSpot;
use crate::model::{DevNum, DeviceName, MountNsId, ProcessInfo};
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
    /// own full scans only, [`super::process_memo`]), a process whose signs of change are the
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
        memo: Option<&mut ProcessMemo>,
        stop: parallel::Stop<'_>,
    ) -> Result<Self, DiscoverError> {
        let reader = opts.reader;
        let targets: HashSet<DevNum> = match scope {
            Scope::All => devices.iter().map(|d| d.devnum).collect(),
            Scope::Devices(v) => v.iter().copied().collect(),
        };
        let mut warnings = Vec::new();
        let mut blind: Vec<BlindSpot> = Vec::new();
        for (name, e) in unreadable_devices {
            blind.push(match DeviceName::new(&name) {
                Ok(n) => BlindSpot::devices(vec![n], e.to_string()),
                Err(_) => BlindSpot::any(e.to_string()),
            });
        }
        let io = read_io(host, &devices, &targets, &mut warnings);
        // A loop device whose LOOP_GET_STATUS64 blocked: the device its backing file lives on
        // (which the loop device holds) is not known.
        for d in &devices {
            if let Some(why) = d.loop_info.as_ref().and_then(|l| l.status_blocked.as_ref()) {
                blind.push(BlindSpot::any_device(format!(
                    "{why}: the device that backing file lives on, which {} holds, is not known",
                    d.name
                )));
            }
        }

        // Whole-host scans only: a memo's answers are filtered by every device in scope.
        let mut memo = memo.filter(|_| *scope == Scope::All);
        // The host's mount namespaces before any task is read: a light scan takes each task's
        // namespace as the last scan read it while they are the same (`super::task_memo`).
        let listed = memo.as_ref().and_then(|_| TaskMemo::list_namespaces(host));
        // The same list answers a quiet namespace's table without going through its tasks.
        let kernel_names: Option<HashMap<u64, u64>> =
            listed.as_ref().map(|l| l.iter().map(|n| (n.inode, n.id)).collect());
        let known = memo.as_deref().and_then(|m| m.tasks.keep(listed.as_deref(), m.next_is_light()));
        let pids = processes::pids(host).map_err(|e| DiscoverError::read(host.proc(), e))?;
        let mut entries = Vec::new();
        let read = parallel::map_until(&pids, stop, |&pid| processes::read_entry_knowing(host, pid, known));
        for r in read.ok_or(DiscoverError::Stopped)? {
            match r {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => {} // exited while we looked
                Err(issue) => unreadable_process(issue.pid, issue.what, opts, &mut warnings, &mut blind),
            }
        }
        let tasks_kept = known.is_some();
        if let Some(m) = memo.as_deref_mut() {
            m.tasks.remember(listed, &entries, !tasks_kept, || TaskMemo::list_namespaces(host));
        }
        for e in &entries {
            for what in &e.unreadable {
                unreadable_process(e.pid, what.clone(), opts, &mut warnings, &mut blind);
            }
        }
        let (host_ns, host_ns_guess) = host_namespace(host, &mut warnings)?;
        if let Some(why) = &host_ns_guess {
            blind.push(BlindSpot::any(why.clone()));
        }
        // A run in a PID namespace of its own sees only its own processes, with no error for
        // the others; one that cannot reach the host's root cannot resolve the host's paths.
        blind.extend(sight::pid_namespace_gaps(host).into_iter().map(BlindSpot::any));
        let own_ns = processes::task_mount_ns(&host.proc().join("self"));
        blind.extend(sight::host_root_gap(host, own_ns, host_ns).map(BlindSpot::any));
        tracing::debug!(
            phase = "processes",
            ms = started.elapsed().as_secs_f64() * 1e3,
            count = entries.len(),
            tasks_kept
        );

        let live_fs = {
            let names: HashSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            livefs::scan(host, &names).unwrap_or_else(|e| {
                blind.push(BlindSpot::any_device(format!("live filesystems: {e}")));
                Vec::new()
            })
        };

        let mut ns_map = namespaces::group(&entries);
        let live = host.is_live();
        let nsfs_dev =
            if live { sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev) } else { None };
        // A scan of every device only shows (every action scans its device afresh): it may reuse
        // the text of namespaces whose mount IDs did not change, but not on every turn without
        // asking the kernel again.
        // (Only whole-host scans count turns.)
        if stop.now() {
            return Err(DiscoverError::Stopped);
        }
        let reuse_text = if *scope != Scope::All {
            TextReuse::Never
        } else if crate::discover::mount_memo::shallow_turn() {
            TextReuse::WhileSameIds
        } else {
            TextReuse::Confirmed
        };
        let scan = namespaces::read_mounts(
            host,
            &mut ns_map,
            Wanted { targets: &targets, nsfs_dev, reuse_text, kernel_names: kernel_names.as_ref() },
            reader,
        );
        for (_, devnum, why) in &scan.hidden {
            blind.push(hidden_mount(*devnum, why, &devices, &live_fs));
        }
        for (ns, e) in &scan.unreadable {
            blind.push(BlindSpot::any(format!(
                "the mount table of mount namespace {} cannot be read: {e}",
                ns.0
            )));
        }
        let mut mounts = scan.mounts;
        // btrfs mounts tied to their devices before the files are read: a file on btrfs is
        // followed to its devices through them (fds.rs).
        let mut anon = AnonIndex::default();
        join_anonymous(host, &mut mounts, &devices, &live_fs, &mut blind, &mut anon);
        let via_statmount = scan.via_statmount;
        tracing::debug!(
            phase = "mountinfo",
            ms = started.elapsed().as_secs_f64() * 1e3,
            namespaces = ns_map.len(),
            text = ?reuse_text,
            text_bytes = ns_map.values().map(|n| n.mountinfo_bytes).sum::<usize>(),
            confirmed_texts = crate::discover::mount_memo::confirmed(),
            built_texts = crate::discover::mount_memo::built()
        );

        if stop.now() {
            return Err(DiscoverError::Stopped);
        }
        let known: HashSet<MountNsId> = ns_map.keys().copied().collect();
        let user_procs: Vec<&ProcEntry> = entries.iter().filter(|e| !e.kthread).collect();
        let (fd_scans, turn) = match memo.as_deref_mut() {
            Some(memo) => {
                let context = Context { targets: targets.clone(), nsfs_dev, anon: anon.clone() };
                let (scans, turn) = memo.scan(host, &user_procs, context, live);
                (scans, Some(turn))
            }
            None => (
                parallel::map(&user_procs, |e| {
                    fds::scan_process(host, e, &targets, nsfs_dev, &known, live, &anon)
                }),
                None,
            ),
        };
        let mut proc_refs = Vec::new();
        let mut stuck_pids = Vec::new();
        let mut pins = scan.nsfs_pins;
        for (e, s) in user_procs.iter().zip(fd_scans) {
            proc_refs.extend(s.refs);
            for (dev, members) in s.learned {
                anon.add_dev(dev, &members);
            }
            pins.extend(s.pinned_ns);
            if s.stuck {
                stuck_pids.push(e.pid);
            }
            for what in s.unreadable {
                unreadable_process(e.pid, what, opts, &mut warnings, &mut blind);
            }
        }
        tracing::debug!(
            phase = "files",
            ms = started.elapsed().as_secs_f64() * 1e3,
            processes = user_procs.len(),
            full_read = turn.is_none_or(|t| t.full_read),
            read_in_full = turn.map_or(user_procs.len(), |t| t.read),
            kept = turn.map_or(0, |t| t.kept)
        );

        // Namespaces no task lives in: enter them through their pin (live host only).
        let mut seen: HashSet<MountNsId> = known.clone();
        for (id, entry) in pins {
            if !seen.insert(id) {
                continue;
            }
            if !live {
                blind.push(BlindSpot::any(format!(
                    "mount namespace {id} ({}) has no process and was not entered (not a live host)",
                    entry.describe()
                )));
                continue;
            }
            match namespaces::read_pinned(host, id, entry.clone(), &targets) {
                Ok((ns, m)) => {
                    let mut m = m;
                    join_anonymous(host, &mut m, &devices, &live_fs, &mut blind, &mut anon);
                    mounts.extend(m);
                    ns_map.insert(id, ns);
                }
                Err(e) => {
                    blind.push(BlindSpot::any(format!("mount namespace {id} ({}): {e}", entry.describe())))
                }
            }
        }
        learn_loop_backing(host, &devices, &mounts, &mut anon);

        let Inventories { swaps, dm_devices, scsi, rbd, nbd, nvme } =
            read_inventories(host, &devices, &targets, &anon, &mut blind);
        warnings.extend(nvme.idle_controllers());
        let kubelet = kubelet::walk::scan(host, &opts.kubelet_dir).unwrap_or_else(|e| {
            blind.push(BlindSpot::any_device(format!(
                "the kubelet directory cannot be read ({e}): which pods use which volumes is not known"
            )));
            kubelet::KubeletScan::default()
        });
        warnings.extend(kubelet.warnings.iter().map(|w| format!("kubelet: {w}")));
        let kernel_threads: Vec<KernelThread> = entries
            .iter()
            .filter(|e| e.kthread)
            .map(|e| KernelThread { pid: e.pid, comm: e.comm.clone() })
            .collect();

        // Label holder processes: fd holders, and the first process of each namespace that
        // mounts an in-scope device.
        let by_pid: HashMap<u32, &ProcEntry> = entries.iter().map(|e| (e.pid, e)).collect();
        let mut holder_pids: Vec<u32> = proc_refs.iter().map(|r| r.pid).collect();
        for m in &mounts {
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
        let processes: BTreeMap<u32, ProcessInfo> = labelled.iter().map(|e| e.pid).zip(labels).collect();

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
        blind.sort_by(|a, b| a.what.cmp(&b.what));
        blind.dedup();
        Ok(Self {
            host_ns,
            host_ns_unsure: host_ns_guess,
            devices,
            namespaces: ns_map.into_values().collect(),
            mounts,
            proc_refs,
            swaps,
            kernel_threads,
            processes,
            stuck_pids,
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
