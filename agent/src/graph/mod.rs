//! The join: for every block device, who holds it and how.
//!
//! Built from a [`Snapshot`] without further I/O. A holder is a mount in some namespace (a btrfs
//! mount joined to each member device), a process's fd/cwd/root/mapping, swap, a device stacked
//! on top (dm/md holder or partition), a loop device backed by a file on it or by its node, or a
//! filesystem the kernel keeps alive on it when no mount table shows one (`/sys/fs`, a journal
//! thread). Other kernel threads named after the device are symptoms, kept apart.

pub mod by_kind;
mod holder_text;
pub mod identity;
pub mod multipath;
pub mod nvme;
pub mod outage;
pub mod owner;
pub mod pin_risks;
pub mod pod_volumes;
pub mod propagation;
pub mod protect;
pub mod resolve;
pub mod scan;
pub mod stack;
mod tasks;
pub mod volume_objects;

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::discover::iostat::IoStat;
use crate::discover::namespaces::{MountNamespace, NsEntry};
use crate::discover::nbd::NbdDevice;
use crate::discover::processes::{fs_kthread_serves, kthread_serves};
use crate::discover::rbd::RbdMapping;
use crate::discover::swaps::SwapType;
use crate::graph::multipath::{multipath_view, scsi_view, MultipathView, ScsiView};
use crate::graph::owner::{owner_of, KubeOwner};
use crate::model::small_set::member_of;
use crate::model::{BlockDevice, DevNum, DeviceName, HolderKind, KernelText, MountNsId};
use crate::snapshot::{KernelThread, Snapshot};
use holder_text::{Shown, Who};

/// At most this many PIDs are listed per holder (`pid_count` has the total).
pub const MAX_PIDS: usize = 16;

/// One way a device is held.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Holder {
    pub kind: HolderKind,
    /// The processes involved (for a mount: those living in its namespace), at most [`MAX_PIDS`].
    pub pids: Vec<u32>,
    pub pid_count: usize,
    /// Names from the kernel are bytes ([`KernelText`]); JSON shows them escaped.
    #[serialize_always]
    pub comm: Option<KernelText>,
    pub cmdline: Option<KernelText>,
    /// The first process's state letter (`D`: stuck in uninterruptible sleep).
    pub process_state: Option<char>,
    /// For mounts: the namespace the mount lives in; for a task's own cwd or root: that task's
    /// namespace; for what the whole process holds (fds, mappings, the cwd and root its threads
    /// share): its leader's (and [`Holder::other_namespaces`]).
    #[serialize_always]
    pub mount_namespace: Option<MountNsId>,
    /// For a cwd or root of one task of its own (a thread that unshared its filesystem context
    /// or joined another mount namespace): that task (gotcha 30).
    pub tid: Option<u32>,
    /// For what the whole process holds: the other mount namespaces it has tasks in. It uses
    /// the device from each of them (a thread that joined a pod's namespace reaches the files
    /// through the same fds and mappings).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_namespaces: Vec<MountNsId>,
    /// Whether that namespace is the host's (PID 1's).
    #[serialize_always]
    pub in_host_namespace: Option<bool>,
    #[serialize_always]
    pub mount_point: Option<KernelText>,
    #[serialize_always]
    pub container_id: Option<String>,
    #[serialize_always]
    pub pod_uid: Option<String>,
    pub mount_id: Option<u32>,
    pub fstype: Option<KernelText>,
    pub source: Option<KernelText>,
    /// For mounts: the shared peer group (`shared:N`); an unmount propagates to every peer.
    pub shared_group: Option<u32>,
    /// For mounts: the peer group it is a slave of (`master:N`): a copy that follows it.
    pub master_group: Option<u32>,
    /// For mounts: every peer group it receives propagation from as mountinfo names them
    /// (`master:N` and `propagate_from:N`, which may differ): the links of a chain of copies.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub upstream_groups: Vec<u32>,
    /// For mounts: the mount's own superblock device as mountinfo shows it (an anonymous
    /// `0:NN` for btrfs, joined to this block device through `/sys/fs/btrfs`).
    pub mount_dev: Option<DevNum>,
    /// How the mount's namespace can be entered.
    pub namespace_entry: Option<NsEntry>,
    /// The file or path involved (fd target, mapped file, swap file, loop backing file).
    pub path: Option<KernelText>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fds: Vec<u32>,
    /// For stacked devices and loop backing: the device on top.
    pub device: Option<DeviceName>,
    /// For a process holder: what it does with the device, in `fuser -v`'s letters and order
    /// ([`access_letters`]): `f`/`F` open file (for writing), `r` root, `c` working directory,
    /// `e` its executable, `m` a mapped file. Empty for the others.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub access: String,
}

/// `letters` in `fuser -v`'s order (f or F, r, c, e, m), each once; `F` (open for writing) stands
/// for `f` too.
pub fn access_letters(letters: impl IntoIterator<Item = char>) -> String {
    let got: Vec<char> = letters.into_iter().collect();
    let has = |c: char| got.contains(&c);
    let file = if has('F') { Some('F') } else { has('f').then_some('f') };
    file.into_iter().chain(['r', 'c', 'e', 'm'].into_iter().filter(|c| has(*c))).collect()
}

impl Holder {
    pub(crate) fn bare(kind: HolderKind) -> Self {
        Self {
            kind,
            pids: Vec::new(),
            pid_count: 0,
            comm: None,
            cmdline: None,
            process_state: None,
            mount_namespace: None,
            tid: None,
            other_namespaces: Vec::new(),
            in_host_namespace: None,
            mount_point: None,
            container_id: None,
            pod_uid: None,
            mount_id: None,
            fstype: None,
            source: None,
            shared_group: None,
            master_group: None,
            upstream_groups: Vec::new(),
            mount_dev: None,
            namespace_entry: None,
            path: None,
            fds: Vec::new(),
            device: None,
            access: String::new(),
        }
    }

    /// Why a holder keeps a device busy, in words (process holders by pid and comm: command lines
    /// are shown to operators in the holder listing only).
    pub fn describe(&self) -> String {
        let h = self;
        // Written straight into the one string made ([`holder_text`]).
        let who = Who(h.pids.first().copied(), h.comm.as_ref(), h.tid);
        let path = Shown(h.path.as_ref());
        match h.kind {
            HolderKind::Mount if h.in_host_namespace == Some(true) => format!(
                "mounted at {} in the host's mount namespace: left alone (unmount it on the host)",
                Shown(h.mount_point.as_ref())
            ),
            HolderKind::Mount => format!(
                "mounted at {} in mount namespace {}",
                Shown(h.mount_point.as_ref()),
                h.mount_namespace.map_or("?".into(), |n| n.0.to_string())
            ),
            HolderKind::OpenDevice => format!("{who} has the device node open ({path}, fd {:?})", h.fds),
            HolderKind::OpenFile => format!("{who} has a file on it open ({path}, fd {:?})", h.fds),
            HolderKind::Cwd => format!("{who} has its working directory on it ({path})"),
            HolderKind::Root => format!("{who} has its root directory on it ({path})"),
            HolderKind::Mmap => format!("{who} maps a file on it ({path})"),
            HolderKind::Swap => format!("it is active swap ({path})"),
            HolderKind::StackedDevice => {
                format!("device {} is stacked on it", h.device.as_ref().map_or("?", |d| d.as_str()))
            }
            HolderKind::LoopBacking => format!(
                "loop device {} is backed by {} ({path})",
                h.device.as_ref().map_or("?", |d| d.as_str()),
                if h.source.as_ref().is_some_and(|s| *s == "device node") { "its device node" } else { "a file on it" }
            ),
            HolderKind::Filesystem => format!(
                "a {} filesystem still lives on it with no mount in any namespace ({path}): an overlay, a detached mount with open files, or a namespace the scan cannot see keeps it",
                Shown(h.fstype.as_ref())
            ),
        }
    }

    /// [`Self::describe`], and for a process holder the mount namespace(s) it uses the device
    /// from: what a refusal names, so the operator finds the task.
    pub fn describe_in_namespace(&self) -> String {
        let mut s = self.describe();
        if let (Some(ns), false) = (self.mount_namespace, self.pids.is_empty()) {
            s.push_str(&format!(" in mount namespace {}", ns.0));
            if !self.other_namespaces.is_empty() {
                let others: Vec<String> = self.other_namespaces.iter().map(|n| n.0.to_string()).collect();
                s.push_str(&format!(" (and {}, where it has tasks too)", others.join(", ")));
            }
        }
        s
    }

    /// A holder the teardown of a dead map can get rid of: a mount in another namespace
    /// (released), a process stuck in D state on the device (freed by `fail_if_no_path`), a
    /// kpartx partition map of it (removed first).
    pub fn releasable_from_dead_map(&self, partitions: &[DeviceName]) -> bool {
        self.is_foreign_mount()
            || (self.kind == HolderKind::OpenDevice && self.process_state == Some('D'))
            || (self.kind == HolderKind::StackedDevice
                && self.device.as_ref().is_some_and(|d| partitions.contains(d)))
    }

    /// The peer groups this mount receives propagation from (its master and the dominant group
    /// mountinfo may name besides).
    pub fn upstream(&self) -> impl Iterator<Item = u32> + '_ {
        self.master_group.into_iter().chain(self.upstream_groups.iter().copied())
    }

    /// A mount in a namespace other than the host's: what `release` detaches.
    pub fn is_foreign_mount(&self) -> bool {
        self.kind == HolderKind::Mount && self.in_host_namespace == Some(false)
    }
}

/// A device and everything that holds it.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Serialize)]
pub struct DeviceEntry {
    pub device: BlockDevice,
    pub holders: Vec<Holder>,
    pub kernel_threads: Vec<KernelThread>,
    /// For a multipath map: its paths and their state.
    pub multipath: Option<MultipathView>,
    /// For a SCSI disk: its state, transport and the map it serves.
    pub scsi: Option<ScsiView>,
    /// For a krbd device: the image, and the client the cluster sees as its watcher.
    pub rbd: Option<RbdMapping>,
    /// For a connected nbd device: its server process.
    pub nbd: Option<NbdDevice>,
    /// For an NVMe namespace: its role, subsystem and controllers ([`crate::graph::nvme`]; what
    /// may be done about it: [`crate::judge::nvme`]).
    pub nvme: Option<crate::graph::nvme::NvmeView>,
    /// The Kubernetes volume it is, per the kubelet directory.
    pub kubernetes: Option<KubeOwner>,
    /// Its I/O counters as this scan read them (`None`: not read, as on fixture trees). A
    /// daemon re-read keeps a device whose counters only moved as it was built
    /// ([`crate::snapshot::touched`]): then these are the counters of that build.
    pub io: Option<IoStat>,
}

/// Devices with their holders.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceGraph {
    pub host_ns: MountNsId,
    /// Why the host's namespace is only a guess (`None`: known): then no mount can be told host
    /// from foreign, and none is released.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_ns_unsure: Option<String>,
    pub devices: Vec<DeviceEntry>,
}

impl DeviceEntry {
    /// A device with these holders and nothing else known of it (no transport view, no
    /// Kubernetes owner, no I/O counters): what a scan fills in, and what tests start from.
    pub fn new(device: BlockDevice, holders: Vec<Holder>) -> Self {
        Self {
            device,
            holders,
            kernel_threads: Vec::new(),
            multipath: None,
            scsi: None,
            rbd: None,
            nbd: None,
            nvme: None,
            kubernetes: None,
            io: None,
        }
    }

    /// The WWID multipath-tools uses for a SCSI disk (`3<naa>`, `2<eui>`, else the raw
    /// `device/wwid`) or a multipath map (its dm uuid without `mpath-`); "" otherwise.
    pub fn wwid(&self) -> String {
        if let Some(s) = &self.scsi {
            return s.disk.multipath_wwid().or_else(|| s.disk.wwid.clone()).unwrap_or_default();
        }
        self.device
            .dm
            .as_ref()
            .and_then(|dm| dm.uuid.strip_prefix("mpath-"))
            .map(str::to_owned)
            .unwrap_or_default()
    }
}

impl DeviceGraph {
    /// Joins a snapshot. Only devices that were in the snapshot's scope get process and mount
    /// holders; stacking and loop backing come from sysfs for all.
    pub fn build(s: &Snapshot) -> Self {
        Self::build_only(s, None)
    }

    /// Joins a snapshot for the devices in `only` (`None`: all), as [`Self::build`] would list
    /// them: what a re-read rebuilds when it touched only those ([`crate::snapshot::touched`]).
    /// `only` must hold every device judged with one of them (the touched set says "all" for a
    /// stack): the entries of the others are not built.
    pub fn build_only(s: &Snapshot, only: Option<&HashSet<DevNum>>) -> Self {
        let only = only.map(member_of);
        let wanted = |d: DevNum| only.as_ref().is_none_or(|o| o(&d));
        let mut per_dev: BTreeMap<DevNum, Vec<Holder>> = BTreeMap::new();
        mount_holders(s, &wanted, only.is_some(), &mut per_dev);
        process_holders(s, &wanted, &mut per_dev);
        swap_holders(s, &wanted, &mut per_dev);
        stack_and_loop_holders(s, &wanted, &mut per_dev);
        filesystem_holders(s, &wanted, &mut per_dev);
        let mut devices = device_entries(s, &wanted, per_dev);
        mark_held_siblings(&mut devices);
        Self { host_ns: s.host_ns, host_ns_unsure: s.host_ns_unsure.clone(), devices }
    }

    /// The entry of one device.
    pub fn get(&self, devnum: DevNum) -> Option<&DeviceEntry> {
        self.devices.iter().find(|e| e.device.devnum == devnum)
    }
}

/// A holder for every mount of a wanted device, labelled with its namespace's first process.
/// `only_some`: only some devices are built, so only their mounts' namespaces are looked up.
fn mount_holders(
    s: &Snapshot,
    wanted: &dyn Fn(DevNum) -> bool,
    only_some: bool,
    per_dev: &mut BTreeMap<DevNum, Vec<Holder>>,
) {
    // Each namespace by ID: looked up once per mount holder. Only those the devices built
    // need (a re-read builds one or two devices: not a map of every namespace of the node).
    let mut ns_by_id: HashMap<MountNsId, &MountNamespace> = HashMap::new();
    let ns_needed: Option<HashSet<MountNsId>> =
        only_some.then(|| s.mounts.iter().filter(|m| wanted(m.device())).map(|m| m.ns).collect());
    let ns_needed = ns_needed.as_ref().map(member_of);
    for n in s.namespaces.iter().filter(|n| ns_needed.as_ref().is_none_or(|w| w(&n.id))) {
        ns_by_id.entry(n.id).or_insert(n);
    }
    for m in s.mounts.iter().filter(|m| wanted(m.device())) {
        let ns = ns_by_id.get(&m.ns).copied();
        let pids: &[u32] = ns.map_or(&[], |n| n.pids.as_slice());
        let mut h = Holder::bare(HolderKind::Mount);
        label(&mut h, s, pids.first().copied());
        h.pid_count = pids.len();
        h.pids = pids.iter().copied().take(MAX_PIDS).collect();
        h.mount_namespace = Some(m.ns);
        h.in_host_namespace = Some(m.ns == s.host_ns);
        h.mount_point = Some(m.mount.mount_point.clone());
        h.mount_id = Some(m.mount.mount_id);
        h.fstype = Some(m.mount.fstype.clone());
        h.source = Some(m.mount.source.clone());
        h.shared_group = m.mount.shared_group();
        h.master_group = m.mount.master_group();
        h.upstream_groups = m.mount.upstream_groups();
        h.mount_dev = Some(m.mount.devnum);
        h.namespace_entry = Some(ns.and_then(|n| n.pinned_by.clone()).unwrap_or_else(|| m.via.clone()));
        per_dev.entry(m.device()).or_default().push(h);
    }
}

/// A holder for every swap area on a wanted device (a partition, or a file on it).
fn swap_holders(s: &Snapshot, wanted: &dyn Fn(DevNum) -> bool, per_dev: &mut BTreeMap<DevNum, Vec<Holder>>) {
    for sw in s.swaps.iter().filter(|sw| wanted(sw.devnum)) {
        let mut h = Holder::bare(HolderKind::Swap);
        h.path = Some(sw.filename.clone());
        h.source = Some(match sw.swap_type {
            SwapType::Partition => "partition".into(),
            SwapType::File => "file".into(),
        });
        per_dev.entry(sw.devnum).or_default().push(h);
    }
}

/// For each device in turn: a holder for each partition or device stacked on it (when it is
/// wanted), then, for a loop device, one on each wanted device its backing file lives on.
fn stack_and_loop_holders(
    s: &Snapshot,
    wanted: &dyn Fn(DevNum) -> bool,
    per_dev: &mut BTreeMap<DevNum, Vec<Holder>>,
) {
    for d in &s.devices {
        let children = s
            .devices
            .iter()
            .filter(|c| c.parent.as_ref() == Some(&d.name))
            .map(|c| c.name.clone())
            .chain(d.holders.iter().cloned());
        for child in children.filter(|_| wanted(d.devnum)) {
            let mut h = Holder::bare(HolderKind::StackedDevice);
            h.device = Some(child);
            per_dev.entry(d.devnum).or_default().push(h);
        }
        if let Some(l) = &d.loop_info {
            // The filesystem its backing file lives on, and the device when the backing
            // file is a device node (`losetup /dev/loop5 /dev/nbd0`).
            // A file on btrfs: its subvolume's anonymous number, followed to the members.
            let on_btrfs = l.backing_dev.map_or(&[][..], |b| s.anon.members_of_dev(b));
            let on = [(l.backing_dev, "file"), (l.backing_rdev, "device node")]
                .into_iter()
                .chain(on_btrfs.iter().map(|m| (Some(*m), "file")));
            for (dev, what) in on.filter_map(|(d, w)| Some((d?, w))).filter(|(d, _)| wanted(*d)) {
                let mut h = Holder::bare(HolderKind::LoopBacking);
                h.device = Some(d.name.clone());
                h.path = Some(l.backing_file.clone());
                h.source = Some(what.into());
                per_dev.entry(dev).or_default().push(h);
            }
        }
    }
}

/// A filesystem the kernel keeps alive on a device with no mount of it in any namespace the
/// scan read (an overlay's upper directory, a detached mount with open files): the kernel's
/// claim is the truth, the mount tables only a map to the holder. One holder per such device
/// in scope: its live filesystem, else a kernel thread serving a filesystem on it.
fn filesystem_holders(
    s: &Snapshot,
    wanted: &dyn Fn(DevNum) -> bool,
    per_dev: &mut BTreeMap<DevNum, Vec<Holder>>,
) {
    for d in s.devices.iter().filter(|d| s.in_scope.contains(&d.devnum) && wanted(d.devnum)) {
        let held = per_dev.get(&d.devnum).is_some_and(|hs| hs.iter().any(|h| h.kind == HolderKind::Mount));
        if held {
            continue;
        }
        let live = s
            .live_fs
            .iter()
            .filter(|f| f.members.contains(&d.name))
            .map(|f| (KernelText::from(f.fstype.as_str()), KernelText::from(f.sysfs_path())));
        let threads = s.kernel_threads.iter().filter_map(|k| {
            let fstype = fs_kthread_serves(&k.comm.escaped(), d.name.as_str(), &d.devnum.to_string())?;
            Some((
                KernelText::from(fstype),
                KernelText::from(format!("kernel thread {} (pid {})", k.comm, k.pid)),
            ))
        });
        if let Some((fstype, path)) = live.chain(threads).next() {
            let mut h = Holder::bare(HolderKind::Filesystem);
            h.fstype = Some(fstype);
            h.path = Some(path);
            per_dev.entry(d.devnum).or_default().push(h);
        }
    }
}

/// The entry of every wanted device, in the snapshot's order: its holders (taken from
/// `per_dev`), multipath, SCSI, I/O, Kubernetes owner, rbd, nbd and NVMe views, and the kernel
/// threads serving it.
fn device_entries(
    s: &Snapshot,
    wanted: &dyn Fn(DevNum) -> bool,
    mut per_dev: BTreeMap<DevNum, Vec<Holder>>,
) -> Vec<DeviceEntry> {
    let by_devnum = |dn: DevNum| s.devices.iter().find(|d| d.devnum == dn).map(|d| d.name.clone());
    let maps: Vec<(DevNum, MultipathView)> = s
        .dm_devices
        .iter()
        .filter_map(|dm| Some((dm.devnum, multipath_view(dm, &s.dm_devices, &s.scsi, &by_devnum)?)))
        .collect();
    let nvme_outages = crate::discover::nvme::outages(&s.nvme);
    s.devices
        .iter()
        .filter(|d| wanted(d.devnum))
        .map(|d| {
            let devtext = d.devnum.to_string();
            let multipath = maps.iter().find(|(dn, _)| *dn == d.devnum).map(|(_, m)| m.clone());
            let scsi = s.scsi.disks.iter().find(|k| k.devnum == d.devnum).map(|k| {
                let path_of = maps
                    .iter()
                    .find(|(_, m)| m.paths.iter().any(|p| p.devnum == d.devnum))
                    .and_then(|(dn, _)| by_devnum(*dn));
                scsi_view(k, &s.scsi, path_of)
            });
            DeviceEntry {
                multipath,
                scsi,
                io: s.io.get(&d.devnum).copied(),
                kubernetes: owner_of(
                    d,
                    &s.mounts,
                    s.host_ns,
                    s.rbd.iter().find(|r| r.devnum == d.devnum),
                    &s.kubelet,
                ),
                rbd: s.rbd.iter().find(|r| r.devnum == d.devnum).cloned(),
                nbd: s.nbd.iter().find(|n| n.devnum == d.devnum).cloned(),
                nvme: crate::graph::nvme::view(&s.nvme, &nvme_outages, d),
                holders: per_dev.remove(&d.devnum).unwrap_or_default(),
                kernel_threads: s
                    .kernel_threads
                    .iter()
                    .filter(|k| kthread_serves(&k.comm.escaped(), d.name.as_str(), &devtext))
                    .cloned()
                    .collect(),
                device: d.clone(),
            }
        })
        .collect()
}

/// Process references, one holder per (device, kind, pid, a task's own), in that order, each in
/// the namespace(s) its task or process uses the device from (gotcha 30, [`tasks`]). Built in a
/// list and put in order once: a tree of thousands of holders moved them at every insert.
fn process_holders(
    s: &Snapshot,
    wanted: &dyn Fn(DevNum) -> bool,
    per_dev: &mut BTreeMap<DevNum, Vec<Holder>>,
) {
    let refs: Vec<&crate::discover::fds::ProcRef> = s.proc_refs.iter().filter(|r| wanted(r.devnum)).collect();
    let tasks = tasks::Tasks::of(s, refs.iter().map(|r| r.pid));
    let mut grouped: Vec<Option<Holder>> = Vec::new();
    let mut at: HashMap<tasks::Key, usize> = HashMap::new();
    for r in refs {
        let i = *at.entry((r.devnum, r.kind, r.pid, r.tid)).or_insert_with(|| {
            let mut h = Holder::bare(r.kind);
            label(&mut h, s, Some(r.pid));
            h.pids = vec![r.pid];
            h.pid_count = 1;
            h.tid = r.tid.filter(|t| *t != r.pid);
            let (ns, others) = tasks.namespaces_of(r.pid, h.tid);
            h.mount_namespace = ns;
            h.other_namespaces = others;
            h.in_host_namespace = ns.map(|n| n == s.host_ns);
            h.path = r.path.clone();
            grouped.push(Some(h));
            grouped.len() - 1
        });
        if let Some(h) = grouped[i].as_mut() {
            h.fds.extend(r.fd);
            if !h.access.contains(r.access) {
                h.access = access_letters(h.access.chars().chain([r.access]));
            }
        }
    }
    let mut order: Vec<(tasks::Key, usize)> = at.into_iter().collect();
    order.sort_unstable();
    for ((dev, ..), i) in order {
        per_dev.entry(dev).or_default().extend(grouped[i].take());
    }
}

fn label(h: &mut Holder, s: &Snapshot, pid: Option<u32>) {
    if let Some(p) = pid.and_then(|p| s.processes.get(&p)) {
        h.comm = Some(p.comm.clone());
        h.cmdline = p.cmdline.clone();
        h.process_state = Some(p.state);
        h.container_id = p.container_id.clone();
        h.pod_uid = p.pod_uid.clone();
    }
}

/// Fills in which siblings are in use, once every entry has its holders.
pub(crate) fn mark_held_siblings(devices: &mut [DeviceEntry]) {
    // Only NVMe namespaces have siblings: words only for those named as one (every scan).
    let named: HashSet<&DeviceName> =
        devices.iter().filter_map(|e| e.nvme.as_ref()).flat_map(|v| v.siblings.iter()).collect();
    let held: Vec<(DeviceName, String)> = devices
        .iter()
        .filter(|e| named.contains(&e.device.name))
        .filter_map(|e| {
            let why = if let Some(h) = e.holders.first() {
                h.describe()
            } else if let Some(k) = e.kubernetes.as_ref().filter(|k| !k.pod_uids.is_empty()) {
                format!("pod(s) {} use it per kubelet", k.pod_uids.join(", "))
            } else {
                return None;
            };
            Some((e.device.name.clone(), why))
        })
        .collect();
    for e in devices.iter_mut() {
        if let Some(v) = e.nvme.as_mut() {
            v.siblings_held = held
                .iter()
                .filter(|(n, _)| v.siblings.contains(n))
                .map(|(n, why)| format!("{n}, which goes with the same controller(s): {why}"))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) mod test_support;
