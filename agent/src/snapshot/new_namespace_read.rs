//! Mount namespaces new since the last full scan, read in full by a re-read: a pod that just
//! started costs a read of its own namespace and processes, not a scan of the whole host.
//!
//! The daemon learns of such a namespace when a program starts in it (`daemon::new_namespace_watch`,
//! the kernel's exec events). What a full scan would read of it is read here, the same way:
//! which processes live in it (every task's `ns/mnt` on the host: a process can join a namespace
//! without starting a program, and a thread can live elsewhere than its leader; that pass,
//! [`processes_in`], runs off the scanner's path, before the daemon asks for the read, so
//! that other namespaces' mount events are not held up by it), its mount table
//! through one of them ([`namespaces::read_some`], as a re-read of a known namespace), and those
//! processes' fds, working directories, roots and maps ([`fds::scan_process`], as a full scan
//! reads a process), labelled as a full scan labels holders. The snapshot then lists the
//! namespace, its mounts and its processes' files where a full scan would (namespaces by ID).
//! A namespace already read this way is read again the same way (another program started in it
//! before the next full scan): its processes that exited are forgotten, the others read again.
//!
//! Fail closed: whatever this cannot read as completely as a full scan is an `Err`, and the
//! caller scans in full (as it did for every new namespace before): a task whose namespace cannot
//! be read, a namespace no process lives in any more (gone, or kept by a pin, which a full scan
//! enters), a namespace known to be pinned, a process of it that lives partly in a namespace
//! unknown since the last full scan, an unreadable table, fd, cwd or map, an fd keeping another
//! unknown namespace alive. A process that exits while it is read (its `/proc` directory gone:
//! it holds nothing any more) is left out, as a full scan leaves it out: a pod's start runs many
//! short programs (`mount`, `mkdir`) in its new namespace, and each would otherwise cost the full
//! scan this replaces; if that leaves a namespace with no process, that is an `Err`. And this only ever shows: every plan and
//! every step scans its device afresh in full (`engine::planning`, `engine::execute` through
//! `World::scan`, checked by `engine::recheck`), never from this re-read.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use super::inventory::join_anonymous;
use super::reread::read_checked;
use super::{ScanOptions, Snapshot};
use crate::discover::fds;
use crate::discover::is_gone;
use crate::discover::namespaces::MountNamespace;
use crate::discover::processes::{self, ProcEntry};
use crate::host::{parallel, sys, HostRoot};
use crate::model::MountNsId;

impl Snapshot {
    /// Reads the namespaces `new` in full, with their processes: each given with the
    /// processes [`processes_in`] found in it when it was asked for (off the scanner's path, so
    /// that a pod's start does not hold up other namespaces' mount events); `Err` says why only
    /// a full scan will do.
    pub(super) fn read_new_namespaces(
        &mut self,
        host: &HostRoot,
        new: &BTreeMap<MountNsId, BTreeSet<u32>>,
        opts: &ScanOptions,
    ) -> Result<(), String> {
        let started = Instant::now();
        let ids: HashSet<MountNsId> = new.keys().copied().collect();
        if let Some(ns) = self.namespaces.iter().find(|n| ids.contains(&n.id) && n.pinned_by.is_some()) {
            return Err(format!("mount namespace {} is pinned: a full scan enters it", ns.id));
        }
        // The processes the pass over every task found in them when each was asked for, and
        // those the snapshot has in them (read this way before): read again if alive.
        let mut pids: BTreeSet<u32> = new.values().flatten().copied().collect();
        let mut dead = HashSet::new();
        for n in self.namespaces.iter().filter(|n| ids.contains(&n.id)) {
            for p in &n.pids {
                if !pids.contains(p) {
                    if host.proc_pid(*p).exists() {
                        pids.insert(*p);
                    } else {
                        dead.insert(*p);
                    }
                }
            }
        }
        let asked: Vec<u32> = pids.into_iter().collect();
        let mut entries = read_entries(host, &asked)?;
        // Those that exited before they were read are forgotten like the dead.
        let read: HashSet<u32> = entries.iter().map(|e| e.pid).collect();
        dead.extend(asked.into_iter().filter(|p| !read.contains(p)));
        let had_tasks: HashSet<MountNsId> =
            self.namespaces.iter().filter(|n| !n.tasks.is_empty()).map(|n| n.id).collect();
        self.place_tasks(&ids, &entries, &dead)?;
        self.lived_in(&ids, &had_tasks)?;

        let mut to_read: BTreeMap<MountNsId, MountNamespace> =
            self.namespaces.iter().filter(|n| ids.contains(&n.id)).map(|n| (n.id, n.clone())).collect();
        let in_scope = self.in_scope.clone();
        let read = read_checked(self, host, &mut to_read, &in_scope, opts)?;
        let mut fresh = read.mounts;
        join_anonymous(host, &mut fresh, &self.devices, &self.live_fs, &mut self.blind_spots, &mut self.anon);
        let table_read = started.elapsed();

        let moved: HashSet<u32> = entries.iter().map(|e| e.pid).chain(dead.iter().copied()).collect();
        let exited = self.read_files(host, &entries, &moved)?;
        if !exited.is_empty() {
            entries.retain(|e| !exited.contains(&e.pid));
            for n in &mut self.namespaces {
                n.tasks.retain(|(p, _)| !exited.contains(p));
                n.pids.retain(|p| !exited.contains(p));
            }
            self.lived_in(&ids, &had_tasks)?;
        }
        let files_read = started.elapsed();

        self.mounts.retain(|m| !ids.contains(&m.ns));
        self.take_mounts(host, &to_read, fresh);
        self.label(host, &entries, &moved);
        self.refresh_filesystems(host)?;
        self.stats.mount_namespaces = self.namespaces.len();
        tracing::debug!(
            namespaces = ?new,
            processes = entries.len(),
            table_us = table_read.as_micros() as u64,
            files_us = (files_read - table_read).as_micros() as u64,
            rest_us = (started.elapsed() - files_read).as_micros() as u64,
            "new mount namespaces read"
        );
        Ok(())
    }

    /// Lists each of `entries`' tasks in the namespace it is in now (adding the namespaces `ids`
    /// the snapshot does not have, by ID), and forgets `dead` processes.
    fn place_tasks(
        &mut self,
        ids: &HashSet<MountNsId>,
        entries: &[ProcEntry],
        dead: &HashSet<u32>,
    ) -> Result<(), String> {
        for e in entries {
            if let Some((_, ns)) =
                e.tasks.iter().find(|(_, ns)| !ids.contains(ns) && self.namespace(*ns).is_none())
            {
                return Err(format!(
                    "pid {} ({}) lives in mount namespace {ns} too, unknown since the last full scan",
                    e.pid, e.comm
                ));
            }
        }
        let moved: HashSet<u32> = entries.iter().map(|e| e.pid).chain(dead.iter().copied()).collect();
        for n in &mut self.namespaces {
            n.tasks.retain(|(p, _)| !moved.contains(p));
            n.pids.retain(|p| !moved.contains(p));
        }
        for id in ids {
            if self.namespace(*id).is_none() {
                let at = self.namespaces.partition_point(|n| n.id < *id);
                self.namespaces.insert(at, MountNamespace::empty(*id));
            }
        }
        let index: HashMap<MountNsId, usize> =
            self.namespaces.iter().enumerate().map(|(i, n)| (n.id, i)).collect();
        let mut touched = HashSet::new();
        for e in entries {
            for &(tid, ns) in &e.tasks {
                let Some(&i) = index.get(&ns) else { continue }; // checked above
                let n = &mut self.namespaces[i];
                n.tasks.push((e.pid, tid));
                n.pids.push(e.pid);
                touched.insert(i);
            }
        }
        for i in touched {
            let n = &mut self.namespaces[i];
            n.tasks.sort_unstable();
            n.pids.sort_unstable();
            n.pids.dedup();
        }
        Ok(())
    }

    /// `Err` when one of `ids`, or a namespace that had a process (`had_tasks`), has none now.
    fn lived_in(&self, ids: &HashSet<MountNsId>, had_tasks: &HashSet<MountNsId>) -> Result<(), String> {
        if let Some(n) = self
            .namespaces
            .iter()
            .find(|n| n.tasks.is_empty() && (ids.contains(&n.id) || had_tasks.contains(&n.id)))
        {
            return Err(format!(
                "no process lives in mount namespace {} any more (gone, or kept by a pin a full scan enters)",
                n.id
            ));
        }
        Ok(())
    }

    /// Reads the files of `entries` as a full scan reads a process, in place of what the
    /// snapshot had of the processes `moved` (those read again, and those that exited); returns
    /// those of `entries` that exited meanwhile (nothing of theirs is kept).
    fn read_files(
        &mut self,
        host: &HostRoot,
        entries: &[ProcEntry],
        moved: &HashSet<u32>,
    ) -> Result<HashSet<u32>, String> {
        let live = host.is_live();
        let nsfs_dev =
            live.then(|| sys::stat_cached(Path::new("/proc/self/ns/mnt")).ok().map(|s| s.dev)).flatten();
        let known: HashSet<MountNsId> = self.namespaces.iter().map(|n| n.id).collect();
        let (targets, anon) = (&self.in_scope, &self.anon);
        let scans =
            parallel::map(entries, |e| fds::scan_process(host, e, targets, nsfs_dev, &known, live, anon));
        self.proc_refs.retain(|r| !moved.contains(&r.pid));
        self.stuck_pids.retain(|p| !moved.contains(p));
        let mut exited = HashSet::new();
        for (e, s) in entries.iter().zip(scans) {
            // Gone (reaped): it holds nothing, and a full scan would not list it.
            if !host.proc_pid(e.pid).exists() {
                exited.insert(e.pid);
                continue;
            }
            if let Some(what) = s.unreadable.first() {
                return Err(what.clone());
            }
            if let Some((id, pin)) = s.pinned_ns.first() {
                return Err(format!("mount namespace {id} is newly pinned ({})", pin.describe()));
            }
            for (dev, members) in s.learned {
                self.anon.add_dev(dev, &members);
            }
            if s.stuck {
                self.stuck_pids.push(e.pid);
            }
            self.proc_refs.extend(s.refs);
        }
        self.stuck_pids.sort_unstable();
        Ok(exited)
    }

    /// Labels the processes read again as a full scan labels holders: those holding a file on a
    /// device in scope, and the first process of each namespace that mounts one.
    fn label(&mut self, host: &HostRoot, entries: &[ProcEntry], moved: &HashSet<u32>) {
        for p in moved {
            self.processes.remove(p);
        }
        let mut holders: BTreeSet<u32> =
            self.proc_refs.iter().filter(|r| moved.contains(&r.pid)).map(|r| r.pid).collect();
        let mounting: HashSet<MountNsId> = self.mounts.iter().map(|m| m.ns).collect();
        holders.extend(
            self.namespaces
                .iter()
                .filter(|n| mounting.contains(&n.id))
                .filter_map(|n| n.pids.first().copied()),
        );
        let by_pid: HashMap<u32, &ProcEntry> = entries.iter().map(|e| (e.pid, e)).collect();
        for p in holders {
            if self.processes.contains_key(&p) {
                continue;
            }
            let info = match by_pid.get(&p) {
                Some(e) => Some(processes::describe(host, e)),
                None => processes::read_entry(host, p).ok().flatten().map(|e| processes::describe(host, &e)),
            };
            if let Some(info) = info {
                self.processes.insert(p, info);
            }
        }
    }
}

/// Each of `ids` with the processes that have a task in it, from every task's `ns/mnt` on the
/// host (but the kernel threads `skip`: they live in the initial namespace): the pass over the
/// whole host a new namespace's read needs (about 11 ms at 200 namespaces), which the daemon
/// runs off its scanner's path, on one thread in the idle class. A task that cannot be read (other than gone) is an `Err`, as a
/// full scan would report it; PID 1 is trusted when the operator vouches for it, as a full
/// scan trusts it.
pub fn processes_in(
    host: &HostRoot,
    ids: &HashSet<MountNsId>,
    skip: &HashSet<u32>,
    opts: &ScanOptions,
) -> Result<BTreeMap<MountNsId, BTreeSet<u32>>, String> {
    let all = processes::pids(host).map_err(|e| format!("cannot list {}: {e}", host.proc().display()))?;
    let list: Vec<u32> = all.into_iter().filter(|p| !skip.contains(p)).collect();
    let links: Vec<(MountNsId, Vec<u8>)> =
        ids.iter().map(|id| (*id, format!("mnt:[{}]", id.0).into_bytes())).collect();
    // On the calling thread alone: the daemon runs it in the idle class, and spread over the
    // cores it would hold every core of a small node while a pod starts.
    let results: Vec<_> = list.iter().map(|&pid| lives_in(host, pid, &links)).collect();
    let mut out: BTreeMap<MountNsId, BTreeSet<u32>> = ids.iter().map(|id| (*id, BTreeSet::new())).collect();
    for (pid, r) in list.into_iter().zip(results) {
        match r {
            Ok(found) => {
                for id in found {
                    out.entry(id).or_default().insert(pid);
                }
            }
            Err(_) if pid == 1 && opts.trust_unreadable_init => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// The namespaces among `links` (each with the text of its `ns/mnt` link) that a task of
/// process `pid` is in.
fn lives_in(host: &HostRoot, pid: u32, links: &[(MountNsId, Vec<u8>)]) -> Result<Vec<MountNsId>, String> {
    let dir = host.proc_pid(pid).join("task");
    let (task_dir, tids) = match processes::TaskDir::list(&dir) {
        Ok(t) => t,
        Err(e) if is_gone(&e) => return Ok(Vec::new()),
        Err(e) => return Err(format!("cannot list {}: {e}", dir.display())),
    };
    let mut found = Vec::new();
    for tid in tids {
        match task_dir.mount_ns_link(tid) {
            Ok(l) => {
                let l = l.as_bytes();
                if let Some((id, _)) = links.iter().find(|(id, x)| x.as_slice() == l && !found.contains(id)) {
                    found.push(*id);
                }
            }
            Err(e) if is_gone(&e) || processes::reaped(&e, &host.proc_task(pid, tid)) => {}
            Err(e) => return Err(format!("cannot read {}/ns/mnt: {e}", host.proc_task(pid, tid).display())),
        }
    }
    Ok(found)
}

/// Reads the processes `pids` (leaving out those that exited meanwhile); any that cannot be read
/// in full is an `Err`.
fn read_entries(host: &HostRoot, pids: &[u32]) -> Result<Vec<ProcEntry>, String> {
    let mut out = Vec::with_capacity(pids.len());
    for r in parallel::map(pids, |&p| processes::read_entry(host, p)) {
        match r {
            Ok(Some(e)) if e.kthread => {}
            Ok(Some(e)) => match e.unreadable.first() {
                Some(what) => return Err(what.clone()),
                None => out.push(e),
            },
            Ok(None) => {}
            Err(issue) => return Err(issue.what),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process is found in its own namespace by the every-task read; no process lives in a
    /// namespace that does not exist.
    #[test]
    fn a_namespace_s_processes_are_found_by_every_task_s_link() {
        let host = HostRoot::default();
        let me = std::process::id();
        let ns = processes::task_mount_ns(&host.proc_pid(me)).expect("this process's namespace");
        // PID 1 may not be inspectable in a sandbox: trusted, as the agent's tests run it.
        let opts = ScanOptions { trust_unreadable_init: true, ..Default::default() };
        let found = processes_in(&host, &[ns].into(), &HashSet::new(), &opts).expect("every task readable");
        assert!(found[&ns].contains(&me), "{me} not among {found:?}");
        let none = processes_in(&host, &[MountNsId(1)].into(), &HashSet::new(), &opts).expect("readable");
        assert!(none[&MountNsId(1)].is_empty(), "{none:?}");
    }
}
