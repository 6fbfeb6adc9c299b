//! Which mount namespace a process uses a device from: a thread is not its process (gotcha 30).
//!
//! A task's own working directory or root (a thread that unshared its filesystem context, or
//! joined another mount namespace with `setns`) is used from that task's namespace, and its
//! holder names the task. What the whole process holds (its open files, its mappings, the
//! working directory and root its threads share with the leader) is used from every namespace the
//! process has a task in: a thread that joined a pod's namespace reaches the same files through
//! them. Such a holder carries the leader's namespace and the others
//! ([`super::Holder::other_namespaces`]), so a release in any of them sees the user.

use std::collections::{HashMap, HashSet};

use crate::model::{DevNum, HolderKind, MountNsId};
use crate::snapshot::Snapshot;

/// A process holder's key: device, kind, pid, and the task when it is that task's own.
pub(super) type Key = (DevNum, HolderKind, u32, Option<u32>);

/// The tasks of the processes that hold something, with each task's namespace (a node has
/// thousands of tasks; a handful of holders).
pub(super) struct Tasks(HashMap<u32, Vec<(u32, MountNsId)>>);

impl Tasks {
    /// The tasks of the processes `holding`, from the snapshot's namespaces.
    pub(super) fn of(s: &Snapshot, holding: impl Iterator<Item = u32>) -> Self {
        let holding: HashSet<u32> = holding.collect();
        let mut tasks: HashMap<u32, Vec<(u32, MountNsId)>> = HashMap::new();
        if holding.is_empty() {
            return Self(tasks);
        }
        for n in &s.namespaces {
            for &(pid, tid) in n.tasks.iter().filter(|(pid, _)| holding.contains(pid)) {
                tasks.entry(pid).or_default().push((tid, n.id));
            }
        }
        Self(tasks)
    }

    /// The namespace a reference of process `pid` is used from, and the other namespaces it is
    /// used from too (see [`namespaces_of`]).
    pub(super) fn namespaces_of(&self, pid: u32, tid: Option<u32>) -> (Option<MountNsId>, Vec<MountNsId>) {
        namespaces_of(self.0.get(&pid).map_or(&[][..], Vec::as_slice), pid, tid)
    }
}

/// The namespace a reference is used from, and the other namespaces it is used from too: a
/// task's own (`tid`) in that task's namespace alone; the whole process's in its leader's (or
/// its first task's) and every other one it has a task in. `(None, [])` when no task of it was
/// read (the release gate then counts it in every namespace).
fn namespaces_of(
    tasks: &[(u32, MountNsId)],
    pid: u32,
    tid: Option<u32>,
) -> (Option<MountNsId>, Vec<MountNsId>) {
    if let Some(t) = tid {
        return (tasks.iter().find(|(x, _)| *x == t).map(|(_, ns)| *ns), Vec::new());
    }
    let leader = tasks.iter().find(|(t, _)| *t == pid).or(tasks.first()).map(|(_, ns)| *ns);
    let mut others: Vec<MountNsId> =
        tasks.iter().map(|(_, ns)| *ns).filter(|ns| Some(*ns) != leader).collect();
    others.sort_unstable();
    others.dedup();
    (leader, others)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_own_directory_is_in_its_namespace_and_the_process_in_all_of_its() {
        let (host, pod) = (MountNsId(1), MountNsId(2));
        let tasks = [(10, host), (11, host), (12, pod)];
        assert_eq!(namespaces_of(&tasks, 10, Some(12)), (Some(pod), vec![]), "the thread's own cwd");
        assert_eq!(namespaces_of(&tasks, 10, None), (Some(host), vec![pod]), "fds: every namespace");
        // A leader gone (a zombie leader keeps its pid): its first task's.
        assert_eq!(namespaces_of(&[(12, pod), (11, host)], 10, None), (Some(pod), vec![host]));
        assert_eq!(namespaces_of(&[], 10, Some(12)), (None, vec![]), "not read: unknown");
    }
}
