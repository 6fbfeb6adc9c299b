//! A snapshot brought up to date, in place, after the kernel reported a change, reading only
//! what the change can have touched, and leaving it as a full scan would list it (mounts in a
//! full scan's order):
//!
//! - mount namespaces whose mounts changed: their tables alone (`listmount`, what `statmount`
//!   said remembered by mount ID, mountinfo text only where a wanted device is mounted), the
//!   filesystems the kernel keeps alive, and whether their kernel threads still run;
//! - block devices a uevent named (added, removed, changed): sysfs and each kind's inventory,
//!   and the mounts of those devices and of what is stacked on them;
//! - mount namespaces new since the last full scan (a program started in one): read in full,
//!   as a full scan reads them, with their processes' files ([`super::new_namespace_read`]).
//!
//! The block layer's I/O counters are always read again (they are judged against time). Open
//! fds, working directories, maps and the process list are carried over from the full scan
//! (except for the processes of a new namespace, read afresh), which stays the safety net. This is an optimisation of what the view shows, never
//! evidence for acting (every action re-scans the device in full). It refuses, and the caller
//! falls back to a full scan, whenever its answer could be less complete than a full scan's: a
//! namespace it does not know (new since the last full scan), one no known task still lives
//! in, an unreadable table or device, a mount `statmount` sees and mountinfo does not show, a
//! namespace pin it has not entered, or btrfs (whose mounts are joined to devices in full only).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::Path;
use std::time::Instant;

use super::inventory::{join_anonymous, read_inventories, read_io, Inventories};
use super::{ScanOptions, Snapshot};
use crate::discover::namespaces::{self, MountNamespace, MountScan, NsMount, TextReuse, Wanted};
use crate::discover::{blockdev, livefs, processes};
use crate::host::sys;
use crate::host::HostRoot;
use crate::model::{DevNum, MountNsId};

/// What changed since the latest snapshot, as the kernel reported it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changes {
    /// Mount namespaces whose mounts changed.
    pub namespaces: HashSet<MountNsId>,
    /// Block devices a uevent named (kernel names).
    pub devices: HashSet<String>,
    /// Mount namespaces the kernel says no longer exist (their last process exited: every
    /// mount was reported detached and the namespace ID is unknown to `listmount`).
    pub gone: HashSet<MountNsId>,
    /// Mount namespaces a program was started in (`execve`) while they were new since the last
    /// full scan, each with the processes found in it ([`super::new_namespace_read::processes_in`]): read in full,
    /// processes and all.
    pub new_namespaces: BTreeMap<MountNsId, BTreeSet<u32>>,
    /// Mount namespaces new since the last full scan whose read in full is on its way (the
    /// pass that finds their processes is running): a mount change in one the snapshot does
    /// not have yet is left to that read, which reads its whole table after it.
    pub awaiting: HashSet<MountNsId>,
}

impl Changes {
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty()
            && self.devices.is_empty()
            && self.gone.is_empty()
            && self.new_namespaces.is_empty()
    }
}

impl Snapshot {
    /// Reads again, in place, what `changes` touched; `Err` says why only a full scan will do,
    /// and leaves this snapshot half updated: the caller must throw it away (and does: it is
    /// updated in place so that an event costs no copy of the whole host's snapshot).
    pub fn update(&mut self, host: &HostRoot, changes: &Changes, opts: &ScanOptions) -> Result<(), String> {
        let started = Instant::now();
        let next = self;
        if !changes.devices.is_empty() {
            next.reread_devices(host, &changes.devices, opts)?;
        }
        if !changes.gone.is_empty() {
            next.drop_namespaces(host, &changes.gone)?;
        }
        let devices = started.elapsed();
        // A namespace that came and went is gone: nothing to read (a full scan would not see it).
        let mut new = changes.new_namespaces.clone();
        new.retain(|id, _| !changes.gone.contains(id));
        if !new.is_empty() {
            next.read_new_namespaces(host, &new, opts)?;
        }
        let new_us = started.elapsed() - devices;
        // A new namespace was just read in full: its mount events need no second read.
        let changed: HashSet<MountNsId> =
            changes.namespaces.iter().copied().filter(|id| !new.contains_key(id)).collect();
        if !changed.is_empty() {
            next.reread_namespaces(host, &changed, &changes.awaiting, opts)?;
        }
        tracing::debug!(
            devices_us = devices.as_micros() as u64,
            new_namespaces_us = new_us.as_micros() as u64,
            namespaces_us = (started.elapsed() - devices - new_us).as_micros() as u64,
            "snapshot re-read"
        );
        // I/O counters are judged against time (a device that does not answer): never carried.
        let mut warnings = Vec::new();
        next.io = read_io(host, &next.devices, &next.in_scope, &mut warnings);
        for w in warnings {
            if !next.warnings.contains(&w) {
                next.warnings.push(w);
            }
        }
        next.stats.duration = started.elapsed();
        Ok(())
    }

    /// Reads the mounts of `changed` again.
    fn reread_namespaces(
        &mut self,
        host: &HostRoot,
        changed: &HashSet<MountNsId>,
        awaiting: &HashSet<MountNsId>,
        opts: &ScanOptions,
    ) -> Result<(), String> {
        let mut to_read: BTreeMap<MountNsId, MountNamespace> = BTreeMap::new();
        for id in changed {
            let Some(ns) = self.namespace(*id) else {
                if awaiting.contains(id) {
                    continue; // its read in full comes next, and reads it all
                }
                return Err(format!("mount namespace {id} is new since the last full scan"));
            };
            to_read.insert(*id, still_there(host, ns)?);
        }
        if to_read.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        let read = read_checked(self, host, &mut to_read, &self.in_scope.clone(), opts)?;
        let tables = started.elapsed();
        self.refresh_filesystems(host)?;
        let filesystems = started.elapsed();
        let mut fresh = read.mounts;
        join_anonymous(host, &mut fresh, &self.devices, &self.live_fs, &mut self.blind_spots, &mut self.anon);
        self.mounts.retain(|m| !changed.contains(&m.ns));
        self.take_mounts(host, &to_read, fresh);
        tracing::debug!(
            tables_us = tables.as_micros() as u64,
            filesystems_us = (filesystems - tables).as_micros() as u64,
            join_us = (started.elapsed() - filesystems).as_micros() as u64,
            "namespaces re-read"
        );
        Ok(())
    }

    /// Forgets namespaces that no longer exist, with their mounts, and what their processes held
    /// if those processes are gone too (one still alive, having moved to another namespace or
    /// under a reused pid, keeps what the full scan saw: a re-read may show more, never less).
    fn drop_namespaces(&mut self, host: &HostRoot, gone: &HashSet<MountNsId>) -> Result<(), String> {
        let mut pids = Vec::new();
        for ns in self.namespaces.iter().filter(|n| gone.contains(&n.id)) {
            if let Some(pin) = &ns.pinned_by {
                return Err(format!(
                    "mount namespace {} was pinned ({}): read in full",
                    ns.id,
                    pin.describe()
                ));
            }
            pids.extend(ns.tasks.iter().map(|t| t.0));
        }
        // Dead: gone from /proc, or a zombie with no live thread (its namespace went with its
        // exit; the kernel reports the detaches before its parent reaps it).
        let dead: HashSet<u32> = pids
            .into_iter()
            .filter(|p| match processes::read_entry(host, *p) {
                Ok(None) => true,
                Ok(Some(e)) => matches!(e.state, 'Z' | 'X') && e.tasks.is_empty(),
                Err(_) => false,
            })
            .collect();
        self.namespaces.retain(|n| !gone.contains(&n.id));
        self.mounts.retain(|m| !gone.contains(&m.ns));
        self.proc_refs.retain(|r| !dead.contains(&r.pid));
        self.processes.retain(|p, _| !dead.contains(p));
        self.stats.mount_namespaces = self.namespaces.len();
        self.stats.mounts = self.namespaces.iter().map(|n| n.mount_count).sum();
        self.refresh_filesystems(host)
    }

    /// Reads sysfs, each kind's inventory, and the mounts of the devices `named` (and of new
    /// ones), with what is stacked on them, again.
    fn reread_devices(
        &mut self,
        host: &HostRoot,
        named: &HashSet<String>,
        opts: &ScanOptions,
    ) -> Result<(), String> {
        if self.live_fs.iter().any(|f| f.fstype == "btrfs") {
            return Err("btrfs mounts are joined to their devices by a full scan only".into());
        }
        let sysfs = blockdev::scan_all(host).map_err(|e| e.to_string())?;
        if let Some((name, e)) = sysfs.unreadable.first() {
            return Err(format!("block device {name} cannot be read: {e}"));
        }
        let devices = sysfs.devices;
        let mut look: HashSet<DevNum> = HashSet::new();
        for d in &devices {
            let known = self.devices.iter().any(|o| o.devnum == d.devnum && o.name == d.name);
            if !known || named.contains(d.name.as_str()) {
                look.extend(blockdev::with_descendants(&devices, d.devnum));
            }
        }
        let all: HashSet<DevNum> = devices.iter().map(|d| d.devnum).collect();
        let mut blind = Vec::new();
        let Inventories { swaps, dm_devices, scsi, rbd, nbd, nvme } =
            read_inventories(host, &devices, &all, &self.anon, &mut blind);
        if let Some(b) = blind.first() {
            return Err(b.what.clone());
        }
        let mut fresh = Vec::new();
        let mut read_ns = BTreeMap::new();
        if !look.is_empty() {
            // A namespace whose known processes all exited is gone, or lives on through a
            // process or pin the last full scan did not see: it is watched, so a mount there
            // (of a device new since) is reported and, unplaceable, makes a full scan.
            for ns in self.namespaces.iter().filter(|n| !n.tasks.is_empty()) {
                if let Ok(live) = still_there(host, ns) {
                    read_ns.insert(ns.id, live);
                }
            }
            let read = read_checked(self, host, &mut read_ns, &look, opts)?;
            fresh = read.mounts.into_iter().filter(|m| look.contains(&m.mount.devnum)).collect();
        }
        self.devices = devices;
        self.in_scope = all;
        self.swaps = swaps;
        self.dm_devices = dm_devices;
        self.scsi = scsi;
        self.rbd = rbd;
        self.nbd = nbd;
        self.nvme = nvme;
        self.refresh_filesystems(host)?;
        let in_scope = &self.in_scope;
        self.mounts.retain(|m| in_scope.contains(&m.device()) && !look.contains(&m.device()));
        self.proc_refs.retain(|r| in_scope.contains(&r.devnum));
        // Namespaces without a fresh mount keep their figures: only the mounts are taken.
        read_ns.retain(|id, _| fresh.iter().any(|m: &NsMount| m.ns == *id));
        self.take_mounts(host, &read_ns, fresh);
        Ok(())
    }

    /// The filesystems the kernel keeps alive (a filesystem outlives its last mount only while
    /// something holds it), and the kernel threads of those that ended.
    pub(super) fn refresh_filesystems(&mut self, host: &HostRoot) -> Result<(), String> {
        let names: HashSet<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
        self.live_fs = livefs::scan(host, &names).map_err(|e| format!("live filesystems: {e}"))?;
        // Only a thread named after a device (a journal thread, a device's worker) is in the
        // graph: only those are looked at again. The others (most of a many-core node's
        // kernel threads) cannot change the view; they are looked at once a device they name
        // appears, since the devices are brought up to date first.
        let devices: Vec<(&str, String)> =
            self.devices.iter().map(|d| (d.name.as_str(), d.devnum.to_string())).collect();
        self.kernel_threads.retain(|k| {
            let comm = k.comm.escaped();
            let named = devices.iter().any(|(name, num)| processes::kthread_serves(&comm, name, num));
            !named
                || std::fs::read(host.proc_pid(k.pid).join("comm"))
                    .is_ok_and(|c| c.strip_suffix(b"\n").unwrap_or(&c) == k.comm.as_bytes())
        });
        Ok(())
    }

    /// Adds freshly read mounts, with the figures of the namespaces they were read from and a
    /// label for the process standing for each namespace that now holds one.
    pub(super) fn take_mounts(
        &mut self,
        host: &HostRoot,
        read: &BTreeMap<MountNsId, MountNamespace>,
        fresh: Vec<NsMount>,
    ) {
        for ns in self.namespaces.iter_mut() {
            if let Some(r) = read.get(&ns.id) {
                ns.read_via.clone_from(&r.read_via);
                ns.mount_count = r.mount_count;
                ns.mountinfo_bytes = r.mountinfo_bytes;
            }
        }
        for m in &fresh {
            let Some(pid) = self.namespace(m.ns).and_then(|n| n.pids.first().copied()) else { continue };
            if self.processes.contains_key(&pid) {
                continue;
            }
            if let Ok(Some(entry)) = processes::read_entry(host, pid) {
                self.processes.insert(pid, processes::describe(host, &entry));
            }
        }
        self.mounts.extend(fresh);
        self.keep_scan_order();
        self.stats.mounts = self.namespaces.iter().map(|n| n.mount_count).sum();
        self.stats.mountinfo_bytes = read.values().map(|n| n.mountinfo_bytes).sum();
    }
}

impl Snapshot {
    /// Puts the mounts back in the order a full scan lists them: namespaces with a task by ID
    /// (each in its table's order), then those entered through a pin, as they were found. The
    /// graph lists a device's holders in this order, and a re-read that left a namespace's fresh
    /// mounts at the end would move them: every device mounted in that namespace (a node's image
    /// disk is mounted in every one) would show "holders changed" with nothing changed, and that
    /// event, with thousands of holders, would be diffed, converted and sent to every watcher
    /// ahead of the one that matters.
    fn keep_scan_order(&mut self) {
        let pinned: HashSet<MountNsId> =
            self.namespaces.iter().filter(|n| n.tasks.is_empty()).map(|n| n.id).collect();
        // A stable sort: the order within a namespace, and among pinned ones, stays.
        self.mounts.sort_by_key(|m| if pinned.contains(&m.ns) { (1, MountNsId(0)) } else { (0, m.ns) });
    }
}

/// A namespace of the snapshot with the tasks that still live in it (a pid can be reused and a
/// task can move to another namespace), to be read through them.
fn still_there(host: &HostRoot, ns: &MountNamespace) -> Result<MountNamespace, String> {
    if ns.tasks.is_empty() {
        return Err(format!("mount namespace {} has no process (it is read by entering its pin)", ns.id));
    }
    let tasks: Vec<(u32, u32)> = ns
        .tasks
        .iter()
        .copied()
        .filter(|&(pid, tid)| processes::task_mount_ns(&host.proc_task(pid, tid)) == Some(ns.id))
        .take(4)
        .collect();
    if tasks.is_empty() {
        return Err(format!("no process known to live in mount namespace {} is left", ns.id));
    }
    Ok(MountNamespace { tasks, read_via: None, ..ns.clone() })
}

/// Reads the mount tables of `namespaces`, keeping the mounts of `targets`; `Err` for anything
/// a full scan would report as a blind spot or would have to enter.
pub(super) fn read_checked(
    snap: &Snapshot,
    host: &HostRoot,
    namespaces: &mut BTreeMap<MountNsId, MountNamespace>,
    targets: &HashSet<DevNum>,
    opts: &ScanOptions,
) -> Result<MountScan, String> {
    let nsfs_dev = host
        .is_live()
        .then(|| sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev))
        .flatten();
    let read = namespaces::read_some(
        host,
        namespaces,
        Wanted { targets, nsfs_dev, reuse_text: TextReuse::WhileSameIds, kernel_names: None },
        opts.reader,
    );
    if let Some((ns, e)) = read.unreadable.first() {
        return Err(format!("the mount table of {ns} cannot be read: {e}"));
    }
    if let Some((_, _, why)) = read.hidden.first() {
        return Err(why.clone());
    }
    if let Some((id, entry)) = read.nsfs_pins.iter().find(|(id, _)| snap.namespace(*id).is_none()) {
        return Err(format!("mount namespace {id} is newly pinned ({})", entry.describe()));
    }
    if let Some(ns) = namespaces.values().find(|n| n.read_via.is_none()) {
        return Err(format!("every process of mount namespace {} exited while it was read", ns.id));
    }
    Ok(read)
}
