//! Which mount namespace each task was in, kept between the daemon's light scans: the one part
//! of a light scan that read every task on the node (its `ns/mnt` link: about a third of a
//! light scan's CPU on a node of 8,000 tasks) and that no cheaper sign of change shows.
//!
//! A task changes mount namespace only by making one (`unshare(CLONE_NEWNS)`, or `clone` with
//! it) or by joining one (`setns`). So a light scan keeps a task's namespace from the last scan
//! when all of these hold, and reads its `ns/mnt` otherwise:
//! - the host has the same mount namespaces as at the last scan, by their 64-bit IDs (never
//!   reused within a boot), as the kernel lists them (`NS_MNT_GET_NEXT`, Linux 6.12:
//!   [`nsfs::namespaces`], ~0.25 µs a namespace): none was made, so no task unshared
//!   into a new one, and none went away;
//! - its process is the same (pid and start time) and the task was there at the last scan (a
//!   new task is read);
//! - the kernel's list is trusted: every scan that reads every task checks that each
//!   namespace a task lives in is on the list (by inode); one that is not (this agent lacks
//!   `CAP_SYS_ADMIN` over its owner, so the kernel leaves it out) and the memo is never used
//!   again by this daemon.
//!
//! The same light scan keeps a process's list of tasks (it does not list `/proc/PID/task`, a
//! fifth of a light scan at 400 namespaces of 20 threads) while the thread count of its `stat`
//! is what it was and all its tasks were in one namespace: a thread made since, in place of one
//! gone, was made in its maker's namespace, that one; a task listed that is gone is passed over
//! wherever it is used.
//!
//! **What it cannot see:** a task that joins another namespace that already existed (`setns`;
//! no namespace made or gone). The next full read sees it (every `--full-read-every`th scan
//! reads every task: 10 minutes at the defaults), as it sees an fd swapped at the same count
//! ([`super::process_read_cache`]). Until then that task's process is listed under its old namespace.
//! Nothing reads a mount table through a task without checking the task is in that namespace
//! now (`discover::namespaces`: a task elsewhere is passed over), the daemon's re-read of a new
//! namespace reads every task's link itself, and every plan and action scans afresh, reading
//! every task.

use std::collections::HashSet;

use crate::discover::processes::{KnownTasks, ProcEntry};
use crate::host::nsfs::{self, NsName};
use crate::host::HostRoot;
use crate::model::MountNsId;

/// The tasks' namespaces of the last scan, with the host's namespaces then.
#[derive(Debug, Default)]
pub struct TaskNamespaceCache {
    /// The kernel's list of mount namespaces when `tasks` were read (`None`: not known).
    namespaces: Option<Vec<NsName>>,
    tasks: KnownTasks,
    /// The kernel's list was seen to leave out a namespace a task lives in.
    distrusted: bool,
}

impl TaskNamespaceCache {
    /// The kernel's list of the host's mount namespaces now; `None` when it cannot be had
    /// (not the live host, a kernel before 6.12, an error: logged once at debug).
    pub fn list_namespaces(host: &HostRoot) -> Option<Vec<NsName>> {
        if !host.is_live() {
            return None;
        }
        let listed = std::fs::File::open("/proc/self/ns/mnt").and_then(|f| {
            use std::os::fd::AsFd;
            nsfs::namespaces(f.as_fd())
        });
        match listed {
            Ok(list) => Some(list),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| tracing::debug!("the kernel does not list mount namespaces ({e}): every scan reads every task's namespace"));
                None
            }
        }
    }

    /// The tasks a scan may take as they were, when the host's namespaces are `now` and the
    /// scan is a light one; `None`: it reads every task.
    pub fn keep(&self, now: Option<&[NsName]>, light: bool) -> Option<&KnownTasks> {
        let same = match (self.namespaces.as_deref(), now) {
            (Some(then), Some(now)) => then.iter().map(|n| n.id).eq(now.iter().map(|n| n.id)),
            _ => false,
        };
        (light && same && !self.distrusted).then_some(&self.tasks)
    }

    /// Remembers the tasks of `entries` and the namespaces `listed` at the scan's start.
    /// `read_all`: every task's link was read by this scan, so the list is checked against
    /// them; a namespace missing from it is looked for in a second list, `relist`ed now (one
    /// made during the scan is a race: only this scan's list is dropped).
    pub fn remember(
        &mut self,
        listed: Option<Vec<NsName>>,
        entries: &[ProcEntry],
        read_all: bool,
        relist: impl FnOnce() -> Option<Vec<NsName>>,
    ) {
        let mut listed = listed;
        if let (true, Some(list)) = (read_all, &listed) {
            let missing = |list: &[NsName]| -> Option<MountNsId> {
                let inodes: HashSet<u64> = list.iter().map(|n| n.inode).collect();
                entries.iter().flat_map(|e| &e.tasks).map(|&(_, ns)| ns).find(|ns| !inodes.contains(&ns.0))
            };
            if let Some(ns) = missing(list) {
                if relist().as_deref().is_none_or(|a| missing(a).is_some()) {
                    tracing::debug!(
                        "the kernel's list of mount namespaces leaves out {ns}, where a task lives: every scan reads every task's namespace"
                    );
                    self.distrusted = true;
                }
                listed = None;
            }
        }
        self.namespaces = listed;
        self.tasks = entries
            .iter()
            .filter(|e| !e.tasks.is_empty())
            .map(|e| {
                let mut tasks = e.tasks.clone();
                tasks.sort_unstable();
                (e.pid, (e.start_time, tasks))
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::processes;

    fn own_entry(host: &HostRoot) -> ProcEntry {
        processes::read_entry(host, std::process::id()).expect("readable").expect("alive")
    }

    /// A list of every namespace `e`'s tasks live in (other tests of this binary may have a
    /// thread in a namespace of its own meanwhile), with IDs from 7.
    fn whole_list(e: &ProcEntry) -> Vec<NsName> {
        let inodes: std::collections::BTreeSet<u64> = e.tasks.iter().map(|(_, ns)| ns.0).collect();
        inodes.into_iter().zip(7..).map(|(inode, id)| NsName { id, inode }).collect()
    }

    /// Kept only on a light scan, with the same namespaces as last time, by ID.
    #[test]
    fn kept_only_while_the_namespaces_are_the_same() {
        let host = HostRoot::default();
        let e = own_entry(&host);
        let list = whole_list(&e);
        let mut memo = TaskNamespaceCache::default();
        assert!(memo.keep(Some(&list), true).is_none(), "nothing remembered yet");
        memo.remember(Some(list.clone()), std::slice::from_ref(&e), true, || None);
        assert!(memo.keep(Some(&list), true).is_some_and(|k| k.contains_key(&e.pid)));
        assert!(memo.keep(Some(&list), false).is_none(), "a full read reads every task");
        let mut made = list.clone();
        made.push(NsName { id: 1000, inode: 1 });
        assert!(memo.keep(Some(&made), true).is_none(), "a namespace made since: read");
        let mut reused = list.clone();
        reused[0].id = 999;
        assert!(memo.keep(Some(&reused), true).is_none(), "same inode, another namespace: read");
        assert!(memo.keep(None, true).is_none(), "not listed: read");
    }

    /// A list that leaves out a namespace a task lives in is never trusted again; one made
    /// during the scan (the second list has it) only drops that scan's list.
    #[test]
    fn a_list_that_misses_a_task_s_namespace_is_distrusted() {
        let host = HostRoot::default();
        let e = own_entry(&host);
        let whole = whole_list(&e);
        let partial = vec![NsName { id: 6, inode: 1 }];
        let mut memo = TaskNamespaceCache::default();
        memo.remember(Some(partial.clone()), std::slice::from_ref(&e), true, || Some(whole.clone()));
        assert!(memo.keep(Some(&partial), true).is_none(), "a race: this scan's list dropped");
        memo.remember(Some(whole.clone()), std::slice::from_ref(&e), true, || None);
        assert!(memo.keep(Some(&whole), true).is_some(), "a whole list is trusted");
        memo.remember(Some(partial.clone()), std::slice::from_ref(&e), true, || Some(partial.clone()));
        memo.remember(Some(whole.clone()), std::slice::from_ref(&e), true, || None);
        assert!(memo.keep(Some(&whole), true).is_none(), "distrusted for good");
    }
}
