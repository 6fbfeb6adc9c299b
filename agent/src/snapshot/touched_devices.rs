//! Which devices a re-read touched: what a device's entry in the graph is built from (its
//! mounts in the namespaces the re-read read, added or dropped, with the process each mount is
//! labelled by; the process references to it; I/O in flight that is not completing) is taken
//! before and after
//! [`Snapshot::update`] and compared. A device whose inputs did not change has the entry and the
//! verdict it had: the daemon keeps them from its previous view, and rebuilds and re-judges only
//! the touched ones ([`crate::engine::view::View::merged`]). That is what keeps an event's cost
//! proportional to the change: a node's image disk, mounted in every namespace and mapped by
//! every container, is not rebuilt and re-judged because a volume was mounted in one pod.
//!
//! Anything scan-wide that changed touches every device: the block devices themselves (a
//! uevent), the blind spots and warnings, the filesystems the kernel keeps alive and the kernel
//! threads, swap, the host's namespace. A touched device that is part of a stack (a partition or
//! its disk, a dm layer or what it sits on, a SCSI path or NVMe namespace, whose verdicts are
//! judged together) touches every device too: the graph is then built whole, as before.

use std::collections::{HashMap, HashSet};

use super::Snapshot;
use crate::discover::iostat::IoStat;
use crate::discover::livefs::LiveFs;
use crate::discover::mountinfo::MountEntry;
use crate::discover::namespaces::NsEntry;
use crate::discover::processes;
use crate::model::blindspot::BlindSpot;
use crate::model::{DevNum, MountNsId};
use crate::snapshot::{KernelThread, SwapUse};

/// The devices a re-read must rebuild.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Touched {
    /// Every device (why, for the debug log).
    All(&'static str),
    /// Only these; every other device's inputs are as they were.
    Some(HashSet<DevNum>),
}

/// A mount as the graph builds its holder from it, with whether the process labelling it (the
/// first of its namespace) is described.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInput {
    ns: MountNsId,
    via: NsEntry,
    mount: MountEntry,
    labelled: bool,
}

/// What the graph of each device is built from, as far as a re-read can change it.
#[derive(Debug, Clone)]
pub struct DeviceInputs {
    /// The mounts in the namespaces looked at, by device, in the snapshot's order.
    mounts: HashMap<DevNum, Vec<MountInput>>,
    /// Per device: how many process references, and a sum over them that changes when one is
    /// swapped for another (a re-read only drops a dead process's references or adds a new
    /// one's).
    refs: HashMap<DevNum, (usize, u64)>,
    io: HashMap<DevNum, IoStat>,
    namespaces: Vec<MountNsId>,
    /// Each namespace's processes, when a namespace came or went (with the references): a
    /// process that moved to a new namespace leaves the one it was in, whose mounts' holders
    /// name their namespace's processes. All in one list, each namespace's a part of it (one
    /// allocation, not one per namespace of the node, twice per event that needs them).
    pids: HashMap<MountNsId, std::ops::Range<usize>>,
    pid_list: Vec<u32>,
    /// The processes described (labels of holders).
    described: Vec<u32>,
    /// Each names the devices it holds (a filesystem's members, a thread's device in its name).
    live_fs: Vec<LiveFs>,
    kernel_threads: Vec<KernelThread>,
    scan_wide: ScanWide,
}

/// What touches every device when it changes.
#[derive(Debug, Clone)]
struct ScanWide {
    host_ns: MountNsId,
    host_ns_unsure: Option<String>,
    devices: usize,
    blind_spots: Vec<BlindSpot>,
    warnings: Vec<String>,
    swaps: Vec<SwapUse>,
}

impl ScanWide {
    /// What changed from `self` to `after`, if anything.
    fn changed(&self, after: &ScanWide) -> Option<&'static str> {
        let checks: [(bool, &'static str); 6] = [
            (self.host_ns != after.host_ns, "the host's namespace changed"),
            (self.host_ns_unsure != after.host_ns_unsure, "the host's namespace changed"),
            (self.devices != after.devices, "the block devices changed"),
            (self.blind_spots != after.blind_spots, "the blind spots changed"),
            (self.warnings != after.warnings, "the warnings changed"),
            (self.swaps != after.swaps, "swap changed"),
        ];
        checks.into_iter().find(|(changed, _)| *changed).map(|(_, what)| what)
    }
}

impl Snapshot {
    /// The inputs of every device's graph entry, looking at the mounts of `namespaces` (those a
    /// re-read reads or drops; taken after it, also every namespace new since `before`).
    ///
    /// `with_refs`: whether to look at the process references too; a re-read changes them only
    /// when a namespace goes or comes ([`super::reread::Changes::gone`], `new_namespace_read`), and
    /// reading thousands of them at every mount event would make its cost grow with the node.
    pub fn device_inputs(
        &self,
        namespaces: &HashSet<MountNsId>,
        before: Option<&DeviceInputs>,
        with_refs: bool,
    ) -> DeviceInputs {
        let ids: Vec<MountNsId> = self.namespaces.iter().map(|n| n.id).collect();
        let mut look = namespaces.clone();
        if let Some(b) = before {
            // A set: a list's `contains` for every namespace was quadratic in the node's size.
            let known: HashSet<&MountNsId> = b.namespaces.iter().collect();
            look.extend(ids.iter().filter(|id| !known.contains(id)));
        }
        let looked_at = crate::model::small_set::member_of(&look);
        let first_pid: HashMap<MountNsId, Option<u32>> = self
            .namespaces
            .iter()
            .filter(|n| looked_at(&n.id))
            .map(|n| (n.id, n.pids.first().copied()))
            .collect();
        let mut mounts: HashMap<DevNum, Vec<MountInput>> = HashMap::new();
        for m in self.mounts.iter().filter(|m| looked_at(&m.ns)) {
            let labelled =
                first_pid.get(&m.ns).copied().flatten().is_some_and(|p| self.processes.contains_key(&p));
            mounts.entry(m.device()).or_default().push(MountInput {
                ns: m.ns,
                via: m.via.clone(),
                mount: m.mount.clone(),
                labelled,
            });
        }
        let mut refs: HashMap<DevNum, (usize, u64)> = HashMap::new();
        for r in self.proc_refs.iter().filter(|_| with_refs) {
            let e = refs.entry(r.devnum).or_default();
            e.0 += 1;
            let one = (u64::from(r.pid) << 32)
                ^ u64::from(r.tid.unwrap_or(0)).rotate_left(16)
                ^ u64::from(r.fd.unwrap_or(u32::MAX))
                ^ ((r.kind as u64) << 56);
            e.1 = e.1.wrapping_add(one.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        let (mut pids, mut pid_list) = (HashMap::new(), Vec::new());
        if with_refs {
            pids.reserve(self.namespaces.len());
            for n in &self.namespaces {
                let start = pid_list.len();
                pid_list.extend_from_slice(&n.pids);
                pids.insert(n.id, start..pid_list.len());
            }
        }
        DeviceInputs {
            mounts,
            refs,
            pids,
            pid_list,
            io: self.io.clone(),
            namespaces: ids,
            described: self.processes.keys().copied().collect(),
            live_fs: self.live_fs.clone(),
            kernel_threads: self.kernel_threads.clone(),
            scan_wide: ScanWide {
                host_ns: self.host_ns,
                host_ns_unsure: self.host_ns_unsure.clone(),
                devices: self.devices.len(),
                blind_spots: self.blind_spots.clone(),
                warnings: self.warnings.clone(),
                swaps: self.swaps.clone(),
            },
        }
    }
}

/// Whether `devnum` is judged with other devices of `snap` (stacked, a path or namespace of a
/// shared transport): then a change of it is a change of them. An unknown device: yes.
pub fn stacked(snap: &Snapshot, devnum: DevNum) -> bool {
    let Some(d) = snap.devices.iter().find(|d| d.devnum == devnum) else { return true };
    d.parent.is_some()
        || !d.slaves.is_empty()
        || !d.holders.is_empty()
        || d.dm.is_some()
        || snap.devices.iter().any(|c| c.parent.as_ref() == Some(&d.name))
        || snap.scsi.disks.iter().any(|k| k.devnum == devnum)
        || (d.name.as_str().starts_with("nvme") && !snap.nvme.controllers.is_empty())
}

/// Those of `a` not in `b`, and of `b` not in `a`.
fn either_only<'a, T: PartialEq>(a: &'a [T], b: &'a [T]) -> impl Iterator<Item = &'a T> {
    a.iter().filter(|x| !b.contains(x)).chain(b.iter().filter(|x| !a.contains(x)))
}

/// The devices whose inputs differ between `before` and `after` (both from
/// [`Snapshot::device_inputs`] over the same namespaces; `snap` the snapshot `after` was taken
/// of).
pub fn touched(before: &DeviceInputs, after: &DeviceInputs, snap: &Snapshot) -> Touched {
    if let Some(what) = before.scan_wide.changed(&after.scan_wide) {
        return Touched::All(what);
    }
    let mut out: HashSet<DevNum> = HashSet::new();
    // A filesystem that came alive or ended (its first mount, its last unmount), and its
    // kernel threads: the devices they name. btrfs joins mounts to devices through its
    // anonymous numbers: every device.
    for fs in either_only(&before.live_fs, &after.live_fs) {
        if fs.fstype == "btrfs" {
            return Touched::All("a btrfs filesystem came or went");
        }
        out.extend(snap.devices.iter().filter(|d| fs.members.contains(&d.name)).map(|d| d.devnum));
    }
    for k in either_only(&before.kernel_threads, &after.kernel_threads) {
        let comm = k.comm.escaped();
        out.extend(
            snap.devices
                .iter()
                .filter(|d| {
                    let (name, num) = (d.name.as_str(), d.devnum.to_string());
                    processes::kthread_serves(&comm, name, &num)
                        || processes::fs_kthread_serves(&comm, name, &num).is_some()
                })
                .map(|d| d.devnum),
        );
    }
    let devs = |m: &HashMap<DevNum, Vec<MountInput>>| m.keys().copied().collect::<Vec<_>>();
    for d in devs(&before.mounts).into_iter().chain(devs(&after.mounts)) {
        if before.mounts.get(&d) != after.mounts.get(&d) {
            out.insert(d);
        }
    }
    for d in before.refs.keys().chain(after.refs.keys()) {
        if before.refs.get(d) != after.refs.get(d) {
            out.insert(*d);
        }
    }
    // I/O in flight with none completed since the last read: a device that may have stopped
    // answering is judged again at every event, with the stall watch. Counters that moved only
    // say that the device answers, which changes neither its holders nor its verdict: a node's
    // image disk, read and written by every container, is not rebuilt at every event for it.
    for (d, io) in &after.io {
        let stalling = |b: &IoStat| io.in_flight > 0 && b.completed == io.completed;
        if before.io.get(d).is_none_or(stalling) {
            out.insert(*d);
        }
    }
    for d in before.io.keys().filter(|d| !after.io.contains_key(d)) {
        out.insert(*d);
    }
    // A namespace whose processes changed: the holders of its mounts name them.
    let moved: HashSet<MountNsId> = before
        .pids
        .iter()
        .filter(|(id, p)| {
            let then = &before.pid_list[(*p).clone()];
            after.pids.get(*id).is_some_and(|q| after.pid_list[q.clone()] != *then)
        })
        .map(|(id, _)| *id)
        .collect();
    out.extend(snap.mounts.iter().filter(|m| moved.contains(&m.ns)).map(|m| m.device()));
    // A process forgotten (it died with its namespace): its references went with it (above),
    // and it may have labelled the mounts of another namespace it lived in.
    let forgotten: HashSet<u32> =
        before.described.iter().filter(|p| after.described.binary_search(p).is_err()).copied().collect();
    if !forgotten.is_empty() {
        let labelled: HashSet<MountNsId> = snap
            .namespaces
            .iter()
            .filter(|n| n.pids.first().is_some_and(|p| forgotten.contains(p)))
            .map(|n| n.id)
            .collect();
        out.extend(snap.mounts.iter().filter(|m| labelled.contains(&m.ns)).map(|m| m.device()));
    }
    Touched::Some(out)
}

#[cfg(test)]
#[path = "touched_tests.rs"]
mod tests;
