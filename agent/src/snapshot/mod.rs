//! One scan of the host: every block device, mount namespace, holder process and swap area, as
//! seen at one instant. The scanners in [`crate::discover`] each read one source; this file runs
//! them in order and keeps what matters for the devices in scope.
//!
//! Nothing that could not be read is dropped silently: a process, namespace, file or inventory
//! the scan could not see becomes a [`BlindSpot`] saying which devices it could hide a holder of
//! (only things that cannot hide a holder, like a holder's command line, are mere warnings).
//! Anonymous-device filesystems are joined to their block devices here: a btrfs mount (`0:NN`)
//! becomes a mount of each member device listed in `/sys/fs/btrfs/<fsid>/devices/`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::discover::fds::{self, ProcRef};
use crate::discover::iostat::{self, IoStat};
use crate::discover::livefs::{self, AnonIndex, LiveFs};
use crate::discover::namespaces::{self, MountNamespace, MountReader, NsEntry, NsMount, Wanted};
use crate::discover::processes::{self, ProcEntry};
use crate::discover::swaps::{self, SwapType};
use crate::discover::{blockdev, dm, kmsg, kubelet, nbd, nvme, rbd, scsi, DiscoverError};
use crate::host::HostRoot;
use crate::model::blindspot::BlindSpot;
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName, KernelText, MountNsId, ProcessInfo};
use crate::{host::parallel, host::sys};

mod reread;
pub use reread::Changes;

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
    /// Why the host's namespace is only a guess (`None`: it is known). Mounts cannot then be
    /// told host from foreign, so nothing is released.
    pub host_ns_unsure: Option<String>,
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
    /// Processes in D state.
    pub stuck_pids: Vec<u32>,
    pub stats: ScanStats,
    /// Things that could not be read and cannot hide a holder (labels, command lines).
    pub warnings: Vec<String>,
    /// Things that could not be read and could hide a holder, with the devices they reach.
    pub blind_spots: Vec<BlindSpot>,
    /// Filesystems the kernel keeps alive on block devices (`/sys/fs`).
    #[serde(skip)]
    pub live_fs: Vec<LiveFs>,
    /// The devices whose holders this scan looked for.
    #[serde(skip)]
    pub in_scope: HashSet<DevNum>,
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
    /// NVMe controllers and subsystems (fabrics and PCIe).
    #[serde(skip)]
    pub nvme: nvme::NvmeScan,
    /// The kubelet directory's volumes (empty on nodes without kubelet).
    #[serde(skip)]
    pub kubelet: kubelet::KubeletScan,
    /// I/O counters of the devices in scope (those whose `stat` could be read).
    #[serde(skip)]
    pub io: HashMap<DevNum, IoStat>,
    /// btrfs's anonymous numbers and mounts, followed to the filesystem's member devices (for
    /// a loop device whose backing file lives on btrfs: `lo_device` is a subvolume's number).
    #[serde(skip)]
    pub anon: AnonIndex,
}

/// How a scan reads the host.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub reader: MountReader,
    /// The kubelet directory as the host sees it.
    pub kubelet_dir: std::path::PathBuf,
    /// PID 1 cannot be inspected here and the operator vouches that it holds no device: it is a
    /// warning, not a blind spot.
    pub trust_unreadable_init: bool,
    /// Paths whose devices are protected (the host root, the kubelet and runtime directories).
    pub protected_paths: Vec<std::path::PathBuf>,
    /// Device or dm names that are protected.
    pub protected_devices: Vec<String>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            reader: MountReader::Auto,
            kubelet_dir: kubelet::DEFAULT_KUBELET_DIR.into(),
            trust_unreadable_init: false,
            protected_paths: crate::host::DEFAULT_PROTECTED_PATHS
                .iter()
                .map(std::path::PathBuf::from)
                .collect(),
            protected_devices: Vec::new(),
        }
    }
}

/// What could not be read of a process: a blind spot, or (PID 1, trusted) a warning.
fn unreadable_process(
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
    /// those that could not be read (each a blind spot reaching it).
    pub fn take_with(
        host: &HostRoot,
        blockdev::SysfsDevices { devices, unreadable: unreadable_devices }: blockdev::SysfsDevices,
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
                blind.push(BlindSpot::any(format!(
                    "{why}: the device that backing file lives on, which {} holds, is not known",
                    d.name
                )));
            }
        }

        let pids = processes::pids(host).map_err(|e| DiscoverError::read(host.proc(), e))?;
        let mut entries = Vec::new();
        for r in parallel::map(&pids, |&pid| processes::read_entry(host, pid)) {
            match r {
                Ok(Some(e)) => entries.push(e),
                Ok(None) => {} // exited while we looked
                Err(issue) => unreadable_process(issue.pid, issue.what, opts, &mut warnings, &mut blind),
            }
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
        tracing::debug!(
            phase = "processes",
            ms = started.elapsed().as_secs_f64() * 1e3,
            count = entries.len()
        );

        let live_fs = {
            let names: HashSet<&str> = devices.iter().map(|d| d.name.as_str()).collect();
            livefs::scan(host, &names).unwrap_or_else(|e| {
                blind.push(BlindSpot::any(format!("live filesystems: {e}")));
                Vec::new()
            })
        };

        let mut ns_map = namespaces::group(&entries);
        let live = host.is_live();
        let nsfs_dev =
            if live { sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev) } else { None };
        // A scan of every device only shows (every action scans its device afresh): it may reuse
        // the text of namespaces whose mount IDs did not change, but not on every turn.
        let reuse_text = *scope == Scope::All && crate::discover::mount_memo::shallow_turn();
        let scan = namespaces::read_mounts(
            host,
            &mut ns_map,
            Wanted { targets: &targets, nsfs_dev, reuse_text },
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
            namespaces = ns_map.len()
        );

        let known: HashSet<MountNsId> = ns_map.keys().copied().collect();
        let user_procs: Vec<&ProcEntry> = entries.iter().filter(|e| !e.kthread).collect();
        let fd_scans = parallel::map(&user_procs, |e| {
            fds::scan_process(host, e, &targets, nsfs_dev, &known, live, &anon)
        });
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
            processes = user_procs.len()
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
        let kubelet = kubelet::scan(host, &opts.kubelet_dir).unwrap_or_else(|e| {
            blind.push(BlindSpot::any(format!(
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
fn host_namespace(
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

/// The block layer's counters of the devices in `targets`: never touch the device. One that
/// cannot be read only leaves the device's responsiveness unjudged (a warning).
fn read_io(
    host: &HostRoot,
    devices: &[BlockDevice],
    targets: &HashSet<DevNum>,
    warnings: &mut Vec<String>,
) -> HashMap<DevNum, IoStat> {
    let mut io = HashMap::new();
    for d in devices.iter().filter(|d| targets.contains(&d.devnum)) {
        match iostat::read(&host.sys_class_block().join(d.name.as_str())) {
            Ok(Some(s)) => {
                io.insert(d.devnum, s);
            }
            Ok(None) => {}
            Err(e) => warnings.push(e.to_string()),
        }
    }
    io
}

/// What each kind's sysfs (and the kernel log, for fenced rbd clients) says of the devices:
/// cheap reads, done again whenever the set of devices changes.
struct Inventories {
    swaps: Vec<SwapUse>,
    dm_devices: Vec<dm::DmDevice>,
    scsi: scsi::ScsiScan,
    rbd: Vec<rbd::RbdMapping>,
    nbd: Vec<nbd::NbdDevice>,
    nvme: nvme::NvmeScan,
}

fn read_inventories(
    host: &HostRoot,
    devices: &[BlockDevice],
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    blind: &mut Vec<BlindSpot>,
) -> Inventories {
    let swaps = read_swaps(host, targets, anon, blind);
    let dm_devices = dm::scan_any(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Dm, format!("device-mapper: {e}")));
        Vec::new()
    });
    let scsi = scsi::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Disk, format!("SCSI: {e}")));
        scsi::ScsiScan::default()
    });
    let mut rbd = rbd::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Rbd, format!("rbd: {e}")));
        Vec::new()
    });
    if !rbd.is_empty() {
        let log = kmsg::read_rbd(host);
        for m in &mut rbd {
            m.fenced = log.fenced.get(m.device.as_str()).cloned();
        }
    }
    let nbd = nbd::scan(host, devices).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Nbd, format!("nbd: {e}")));
        Vec::new()
    });
    let nvme = nvme::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::NvmeNamespace, format!("NVMe: {e}")));
        nvme::NvmeScan::default()
    });
    Inventories { swaps, dm_devices, scsi, rbd, nbd, nvme }
}

/// The swap areas on devices in `targets`. `/proc/swaps` names each area by its path from the
/// host's root (a swap file the host turned on is not in this container's root), so each is
/// resolved on the host ([`HostRoot::stat_on_host`]); a swap file on btrfs (its subvolume's
/// anonymous number) is followed to the filesystem's devices through `anon`. An area that
/// cannot be resolved is a blind spot: any device could be the one it sits on.
fn read_swaps(
    host: &HostRoot,
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    blind: &mut Vec<BlindSpot>,
) -> Vec<SwapUse> {
    let path = host.proc().join("swaps");
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            blind.push(BlindSpot::any(format!("swap areas: cannot read {}: {e}", path.display())));
            return Vec::new();
        }
    };
    let areas = match swaps::parse(&text) {
        Ok(a) => a,
        Err((line, reason)) => {
            blind.push(BlindSpot::any(format!(
                "swap areas: malformed {}: line {line}: {reason}",
                path.display()
            )));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for a in areas {
        let id = match host.stat_on_host(a.filename.as_path()) {
            Ok(id) => id,
            Err(e) => {
                blind.push(BlindSpot::any(format!(
                    "swap area {}: cannot resolve it on the host ({e}), so its device is not known",
                    a.filename
                )));
                continue;
            }
        };
        let devnums: Vec<DevNum> = match a.swap_type {
            SwapType::Partition => vec![id.rdev],
            SwapType::File if id.dev.major == 0 => anon.members_of(&id).to_vec(),
            SwapType::File => vec![id.dev],
        };
        for devnum in devnums.into_iter().filter(|d| targets.contains(d)) {
            out.push(SwapUse { devnum, filename: a.filename.clone(), swap_type: a.swap_type });
        }
    }
    out
}

/// A loop device whose backing file is on btrfs has the subvolume's anonymous number as
/// `lo_device`, which the index knows only when a mount root or an open file showed it (a file
/// in a nested subvolume shows neither). For the others, the backing file is looked up by its
/// path (`loop/backing_file`, printed from the root of the namespace that mounts it) on the host
/// and through a task of each namespace that mounts a tied btrfs, and only if the kernel says it
/// is the very file (`lo_device` and `lo_inode` match) does the mount it was reached through tie
/// the number to its filesystem's members.
fn learn_loop_backing(host: &HostRoot, devices: &[BlockDevice], mounts: &[NsMount], anon: &mut AnonIndex) {
    if anon.is_empty() {
        return;
    }
    let mut roots: Vec<Option<std::path::PathBuf>> = vec![None];
    for m in mounts.iter().filter(|m| m.mount.devnum.major == 0 && m.block.is_some()) {
        if let NsEntry::Task { pid, tid } = m.via {
            let r = Some(host.proc_task(pid, tid).join("root"));
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
    }
    for l in devices.iter().filter_map(|d| d.loop_info.as_ref()) {
        let (Some(dev), Some(ino)) = (l.backing_dev, l.backing_inode) else { continue };
        if dev.major != 0 || !anon.members_of_dev(dev).is_empty() || l.backing_deleted {
            continue;
        }
        let (h, path, tries) = (host.clone(), l.backing_file.as_path().to_path_buf(), roots.clone());
        let looked =
            crate::host::bounded::read(format!("loop-backing-{dev}"), BTRFS_FSID_DEADLINE, move || {
                tries.iter().find_map(|root| {
                    let id = match root {
                        None => h.stat_on_host(&path),
                        Some(r) => sys::stat_in_root(r, &path),
                    };
                    id.ok().filter(|id| id.dev == dev && id.ino == ino)
                })
            });
        if let Ok(Some(id)) = looked {
            let members = anon.members_of(&id).to_vec();
            anon.add_dev(dev, &members);
        }
    }
}

/// Joins btrfs mounts (anonymous `0:NN`) to their member devices by the filesystem's fsid as the
/// kernel gives it, never by the mount's source text (which whoever made the mount chose: a
/// container can name any device there). For each superblock, one of its mounts is opened
/// through the root of a task of its namespace, checked to be that very mount (the kernel's
/// mount ID), and asked its fsid (`BTRFS_IOC_FS_INFO`), which names the filesystem's directory
/// `/sys/fs/btrfs/<fsid>/devices`. A superblock's number is the kernel's, one per filesystem
/// instance: every other mount of it (in any namespace, a pinned one included) follows, as do
/// the superblocks `index` already knows (a full scan's, for a re-read). The mounts, the
/// superblock's number and the subvolume number of each opened mount root go into `index` (for
/// files, mappings and loop backing files on btrfs). A mount that cannot be tied is a blind spot
/// over every btrfs member device.
fn join_anonymous(
    host: &HostRoot,
    mounts: &mut Vec<NsMount>,
    devices: &[BlockDevice],
    live_fs: &[LiveFs],
    blind: &mut Vec<BlindSpot>,
    index: &mut AnonIndex,
) {
    let btrfs: Vec<&LiveFs> = live_fs.iter().filter(|f| f.fstype == "btrfs").collect();
    let anonymous = |m: &NsMount| m.mount.devnum.major == 0 && m.mount.fstype == "btrfs";
    let (anon, rest): (Vec<NsMount>, Vec<NsMount>) = std::mem::take(mounts).into_iter().partition(anonymous);
    *mounts = rest;
    let members_of = |fs: &LiveFs| -> Vec<DevNum> {
        fs.members.iter().filter_map(|n| devices.iter().find(|d| &d.name == n)).map(|d| d.devnum).collect()
    };
    let live: Vec<Vec<DevNum>> = btrfs.iter().map(|f| members_of(f)).collect();
    index.retain(|m| live.iter().any(|l| l.as_slice() == m));
    let mut why: HashMap<DevNum, String> = HashMap::new();
    for m in &anon {
        let sb = m.mount.devnum;
        if !index.members_of_dev(sb).is_empty() || why.get(&sb).is_some_and(|w| w.is_empty()) {
            continue;
        }
        match btrfs_fsid_of(host, m) {
            Ok((fsid, root)) => match btrfs.iter().find(|f| f.id == fsid) {
                Some(fs) => {
                    let members = members_of(fs);
                    index.add_mount(u64::from(m.mount.mount_id), sb, &members);
                    index.add_dev(root.dev, &members);
                    why.insert(sb, String::new());
                }
                None => {
                    why.insert(sb, format!("its fsid {fsid} has no /sys/fs/btrfs/{fsid}/devices"));
                }
            },
            Err(e) => {
                why.entry(sb).or_insert(e);
            }
        }
    }
    for m in anon {
        let members = index.members_of_dev(m.mount.devnum).to_vec();
        if members.is_empty() {
            let all: Vec<DeviceName> = btrfs.iter().flat_map(|f| f.members.iter().cloned()).collect();
            let what = format!(
                "a btrfs mount at {} (source {}, device {}) in mount namespace {} cannot be tied to its devices: {}",
                m.mount.mount_point,
                m.mount.source,
                m.mount.devnum,
                m.ns.0,
                why.get(&m.mount.devnum).map_or("no mount of it could be opened", String::as_str)
            );
            if !all.is_empty() {
                blind.push(BlindSpot::devices(all, what));
            }
            continue;
        }
        index.by_mount.insert(u64::from(m.mount.mount_id), members.clone());
        for d in members {
            mounts.push(NsMount { block: Some(d), ..m.clone() });
        }
    }
}

/// How long opening a btrfs mount's root to ask its fsid may take (the path walk crosses the
/// namespace's other mounts, one of which may be a FUSE or NFS mount that no longer answers).
const BTRFS_FSID_DEADLINE: Duration = Duration::from_millis(500);

/// The fsid of the filesystem mounted at `m` (as `/sys/fs/btrfs/` names it) and the stat of the
/// mount's root: opened through the root of the task the table was read through, and only
/// when the kernel says the directory reached is on that very mount (its mount ID: a mount
/// stacked on top, or a path a container swapped, is refused).
fn btrfs_fsid_of(host: &HostRoot, m: &NsMount) -> Result<(String, sys::FileId), String> {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let NsEntry::Task { pid, tid } = m.via else {
        return Err(format!("its namespace is reached through {}, not a task's root", m.via.describe()));
    };
    let root = host.proc_task(pid, tid).join("root");
    let point = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(m.mount.mount_point.as_bytes()));
    let expected = u64::from(m.mount.mount_id);
    let what = format!("{} (through {})", m.mount.mount_point, root.display());
    let key = format!("btrfs-fsid-{pid}-{expected}");
    crate::host::bounded::read(key, BTRFS_FSID_DEADLINE, move || -> Result<(String, sys::FileId), String> {
        let fd = sys::open_in_root(&root, &point, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK)
            .map_err(|e| format!("cannot open {what}: {e}"))?;
        let id = sys::stat_fd(fd.as_fd()).map_err(|e| format!("cannot stat {what}: {e}"))?;
        if id.mnt_id != Some(expected) {
            return Err(format!(
                "{what} is not mount {expected} (the kernel says mount {:?}): another mount covers it",
                id.mnt_id
            ));
        }
        let fsid = sys::btrfs_fsid(fd.as_fd()).map_err(|e| format!("BTRFS_IOC_FS_INFO on {what}: {e}"))?;
        Ok((sys::uuid_text(&fsid), id))
    })
    .unwrap_or_else(|b| Err(format!("opening {} {b}", m.mount.mount_point)))
}

/// A mount the statmount list shows but no mountinfo text did: a blind spot over its device (a
/// btrfs superblock: over every btrfs member device).
fn hidden_mount(devnum: DevNum, why: &str, devices: &[BlockDevice], live_fs: &[LiveFs]) -> BlindSpot {
    if let Some(d) = devices.iter().find(|d| d.devnum == devnum) {
        return BlindSpot::devices(vec![d.name.clone()], why);
    }
    let members: Vec<DeviceName> =
        live_fs.iter().filter(|f| f.fstype == "btrfs").flat_map(|f| f.members.iter().cloned()).collect();
    if devnum.major == 0 && !members.is_empty() {
        BlindSpot::devices(members, why)
    } else {
        BlindSpot::any(why)
    }
}
