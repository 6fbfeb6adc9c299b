//! One scan of the host: every block device, mount namespace, holder process and swap area, as
//! seen at one instant. The scanners in [`crate::discover`] each read one source; this file runs
//! them in order and keeps what matters for the devices in scope.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::discover::fds::{self, ProcRef};
use crate::discover::namespaces::{self, MountNamespace, MountReader, NsMount};
use crate::discover::processes::{self, ProcEntry};
use crate::discover::swaps::{self, SwapType};
use crate::discover::{blockdev, dm, kmsg, kubelet, nbd, rbd, scsi, DiscoverError};
use crate::host::HostRoot;
use crate::model::{BlockDevice, DevNum, KernelText, MountNsId, ProcessInfo};
use crate::{parallel, sys};

/// Which devices a scan looks for holders of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every block device in sysfs.
    All,
    /// These devices (callers add descendants themselves, see [`blockdev::with_descendants`]).
    Devices(Vec<DevNum>),
}

/// An active swap area on a device in scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwapUse {
    pub devnum: DevNum,
    pub filename: KernelText,
    pub swap_type: SwapType,
}

/// A kernel thread, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelThread {
    pub pid: u32,
    pub comm: KernelText,
}

/// Counters for the summary line and the benchmark.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScanStats {
    pub processes: usize,
    pub tasks: usize,
    pub kernel_threads: usize,
    pub mount_namespaces: usize,
    /// Mounts seen, over all namespaces.
    pub mounts: usize,
    /// Namespaces checked with `statmount` alone (no mountinfo text needed).
    pub namespaces_via_statmount: usize,
    /// mountinfo text read.
    pub mountinfo_bytes: usize,
    #[serde(serialize_with = "ser_ms")]
    pub duration: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Everything one scan saw.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub host_ns: MountNsId,
    pub devices: Vec<BlockDevice>,
    pub namespaces: Vec<MountNamespace>,
    /// Mounts of in-scope devices, in every namespace.
    pub mounts: Vec<NsMount>,
    /// Fds, cwd, root and mappings on in-scope devices.
    pub proc_refs: Vec<ProcRef>,
    pub swaps: Vec<SwapUse>,
    pub kernel_threads: Vec<KernelThread>,
    /// Holder processes, labelled.
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Processes in D state (their mappings were not read).
    pub stuck_pids: Vec<u32>,
    pub stats: ScanStats,
    /// Things that could not be read but did not stop the scan.
    pub warnings: Vec<String>,
    /// Device-mapper devices, with their tables and status when the control node is there.
    #[serde(skip)]
    pub dm_devices: Vec<dm::DmDevice>,
    /// SCSI disks with their state and transport (iSCSI sessions, FC remote ports).
    #[serde(skip)]
    pub scsi: scsi::ScsiScan,
    /// krbd mappings.
    #[serde(skip)]
    pub rbd: Vec<rbd::RbdMapping>,
    /// Connected nbd devices and their server processes.
    #[serde(skip)]
    pub nbd: Vec<nbd::NbdDevice>,
    /// The kubelet directory's volumes (empty on nodes without kubelet).
    #[serde(skip)]
    pub kubelet: kubelet::KubeletScan,
}

/// How a scan reads the host.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub reader: MountReader,
    /// The kubelet directory as the host sees it.
    pub kubelet_dir: std::path::PathBuf,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self { reader: MountReader::Auto, kubelet_dir: kubelet::DEFAULT_KUBELET_DIR.into() }
    }
}

impl Snapshot {
    /// Runs a scan.
    pub fn take(host: &HostRoot, scope: &Scope) -> Result<Self, DiscoverError> {
        let started = Instant::now();
        let devices = blockdev::scan(host)?;
        Self::take_with(host, devices, scope, started, &ScanOptions::default())
    }

    /// Runs a scan with these options.
    pub fn take_opts(host: &HostRoot, scope: &Scope, opts: &ScanOptions) -> Result<Self, DiscoverError> {
        let started = Instant::now();
        let devices = blockdev::scan(host)?;
        Self::take_with(host, devices, scope, started, opts)
    }

    /// Runs a scan on devices already read from sysfs (at `started`).
    pub fn take_with(
        host: &HostRoot,
        devices: Vec<BlockDevice>,
        scope: &Scope,
        started: Instant,
        opts: &ScanOptions,
    ) -> Result<Self, DiscoverError> {
        let reader = opts.reader;
        let targets: HashSet<DevNum> = match scope {
            Scope::All => devices.iter().map(|d| d.devnum).collect(),
            Scope::Devices(v) => v.iter().copied().collect(),
        };
        let mut warnings = Vec::new();

        let pids = processes::pids(host).map_err(|e| DiscoverError::read(host.proc(), e))?;
        let entries: Vec<ProcEntry> = parallel::map(&pids, |&pid| processes::read_entry(host, pid))
            .into_iter()
            .filter_map(|r| {
                r.unwrap_or_else(|issue| {
                    warnings.push(issue.what);
                    None
                })
            })
            .collect();
        let host_ns = host_namespace(host, &mut warnings)?;
        tracing::debug!(
            phase = "processes",
            ms = started.elapsed().as_secs_f64() * 1e3,
            count = entries.len()
        );

        let mut ns_map = namespaces::group(&entries);
        let live = host.is_live();
        let nsfs_dev =
            if live { sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev) } else { None };
        let scan = namespaces::read_mounts(host, &mut ns_map, &targets, nsfs_dev, reader)?;
        warnings.extend(scan.warnings);
        let mut mounts = scan.mounts;
        let via_statmount = scan.via_statmount;
        tracing::debug!(
            phase = "mountinfo",
            ms = started.elapsed().as_secs_f64() * 1e3,
            namespaces = ns_map.len()
        );

        let known: HashSet<MountNsId> = ns_map.keys().copied().collect();
        let user_procs: Vec<&ProcEntry> = entries.iter().filter(|e| !e.kthread).collect();
        let fd_scans = parallel::map(&user_procs, |e| fds::scan_process(host, e, &targets, nsfs_dev, &known));
        let mut proc_refs = Vec::new();
        let mut stuck_pids = Vec::new();
        let mut pins = scan.nsfs_pins;
        for (e, s) in user_procs.iter().zip(fd_scans) {
            proc_refs.extend(s.refs);
            pins.extend(s.pinned_ns);
            if s.stuck {
                stuck_pids.push(e.pid);
            }
        }
        tracing::debug!(
            phase = "files",
            ms = started.elapsed().as_secs_f64() * 1e3,
            processes = user_procs.len()
        );

        // Namespaces no task lives in: enter them through their pin (live host only).
        let mut seen: HashSet<MountNsId> = known.clone();
        for (id, entry) in pins {
            if !seen.insert(id) {
                continue;
            }
            if !live {
                warnings.push(format!(
                    "mount namespace {id} ({}) has no process; not entered (not a live host)",
                    entry.describe()
                ));
                continue;
            }
            match namespaces::read_pinned(host, id, entry.clone(), &targets) {
                Ok((ns, m)) => {
                    mounts.extend(m);
                    ns_map.insert(id, ns);
                }
                Err(e) => warnings.push(format!("mount namespace {id} ({}): {e}", entry.describe())),
            }
        }

        let swaps = read_swaps(host, &targets, &mut warnings)?;
        let dm_devices = match dm::scan_any(host) {
            Ok(d) => d,
            Err(e) => {
                warnings.push(format!("device-mapper: {e}"));
                Vec::new()
            }
        };
        let scsi = scsi::scan(host)?;
        let mut rbd = rbd::scan(host)?;
        if !rbd.is_empty() {
            let log = kmsg::read_rbd(host);
            for m in &mut rbd {
                m.fenced = log.fenced.get(m.device.as_str()).cloned();
            }
        }
        let nbd = nbd::scan(host, &devices)?;
        let kubelet = kubelet::scan(host, &opts.kubelet_dir)?;
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
        let processes: BTreeMap<u32, ProcessInfo> = holder_pids
            .iter()
            .filter_map(|p| by_pid.get(p).map(|e| (*p, processes::describe(host, e))))
            .collect();

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
        Ok(Self {
            host_ns,
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
            dm_devices,
            scsi,
            rbd,
            nbd,
            kubelet,
        })
    }

    /// The namespace with this ID.
    pub fn namespace(&self, id: MountNsId) -> Option<&MountNamespace> {
        self.namespaces.iter().find(|n| n.id == id)
    }
}

/// The host's mount namespace: PID 1's. When PID 1 cannot be inspected (a sandbox supervisor,
/// an LSM), kthreadd's: kernel threads live in the initial mount namespace.
fn host_namespace(host: &HostRoot, warnings: &mut Vec<String>) -> Result<MountNsId, DiscoverError> {
    if let Some(ns) = processes::task_mount_ns(&host.proc_pid(1)) {
        return Ok(ns);
    }
    let path = host.proc_pid(1).join("ns/mnt");
    let why = std::fs::read_link(&path)
        .err()
        .map_or_else(|| "not a mnt:[INODE] link".to_owned(), |e| e.to_string());
    match processes::task_mount_ns(&host.proc_pid(2)) {
        Some(ns) => {
            warnings.push(format!(
                "cannot read {} ({why}); taking the initial mount namespace (kthreadd's, {ns}) as the host's",
                path.display()
            ));
            Ok(ns)
        }
        None => Err(DiscoverError::attr(&path, &why, "expected a link to mnt:[INODE] (is this a procfs?)")),
    }
}

fn read_swaps(
    host: &HostRoot,
    targets: &HashSet<DevNum>,
    warnings: &mut Vec<String>,
) -> Result<Vec<SwapUse>, DiscoverError> {
    let path = host.proc().join("swaps");
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DiscoverError::read(&path, e)),
    };
    let areas = swaps::parse(&text).map_err(|(line, reason)| DiscoverError::Line {
        path: path.clone(),
        line,
        reason,
    })?;
    let mut out = Vec::new();
    for a in areas {
        let file = host.host_path(a.filename.as_path());
        let id = match sys::stat_cached(&file) {
            Ok(id) => id,
            Err(e) => {
                warnings.push(format!("swap area {}: cannot stat {}: {e}", a.filename, file.display()));
                continue;
            }
        };
        let devnum = match a.swap_type {
            SwapType::Partition => id.rdev,
            SwapType::File => id.dev,
        };
        if targets.contains(&devnum) {
            out.push(SwapUse { devnum, filename: a.filename, swap_type: a.swap_type });
        }
    }
    Ok(out)
}
