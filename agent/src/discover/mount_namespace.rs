//! One mount namespace as a scan knows it (its tasks, what keeps it alive, how it was read),
//! how to get into one, and the grouping of tasks by namespace (`discover::namespaces` reads
//! their mount tables).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::processes::ProcEntry;
use crate::host::HostRoot;
use crate::model::MountNsId;

/// How to get into a namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "via")]
pub enum NsEntry {
    /// A task living in it: `/proc/PID/task/TID/ns/mnt`. Paths in its mountinfo are relative to
    /// this task's root.
    Task { pid: u32, tid: u32 },
    /// An nsfs bind mount, reachable from here at `path`.
    Nsfs { path: PathBuf },
    /// An open fd of a process: `/proc/PID/fd/FD`.
    Fd { pid: u32, fd: u32 },
    /// The namespace of a chrooted task, entered through its `ns/mnt`: paths are relative to
    /// the namespace's root (not the task's).
    TaskNamespace { pid: u32, tid: u32 },
}

impl NsEntry {
    /// The file to open and pass to `setns`.
    pub fn ns_file(&self, host: &HostRoot) -> PathBuf {
        match self {
            Self::Task { pid, tid } | Self::TaskNamespace { pid, tid } => {
                host.proc_task(*pid, *tid).join("ns/mnt")
            }
            Self::Nsfs { path } => path.clone(),
            Self::Fd { pid, fd } => host.proc_pid(*pid).join("fd").join(fd.to_string()),
        }
    }

    /// Short text for reports: `pid 21839 tid 28447`, `nsfs /run/mntns/x`, `fd 5 of pid 9`.
    pub fn describe(&self) -> String {
        match self {
            Self::Task { pid, tid } if pid == tid => format!("pid {pid}"),
            Self::Task { pid, tid } => format!("pid {pid} tid {tid}"),
            Self::Nsfs { path } => format!("nsfs {}", path.display()),
            Self::Fd { pid, fd } => format!("fd {fd} of pid {pid}"),
            Self::TaskNamespace { pid, tid } => format!("the namespace of pid {pid} tid {tid} (entered)"),
        }
    }
}

/// One mount namespace.
#[derive(Debug, Clone, Serialize)]
pub struct MountNamespace {
    pub id: MountNsId,
    /// Processes with at least one task here, ascending.
    pub pids: Vec<u32>,
    /// Tasks here, as `(pid, tid)`.
    #[serde(skip)]
    pub tasks: Vec<(u32, u32)>,
    /// For a namespace with no task: what keeps it alive.
    pub pinned_by: Option<NsEntry>,
    /// Where its mountinfo was read from (`None` if every task exited first).
    pub read_via: Option<NsEntry>,
    pub mount_count: usize,
    pub mountinfo_bytes: usize,
    /// Its 64-bit ID, as this scan's read had it from the namespace's own `ns/mnt` file (`None`:
    /// not read through `listmount`).
    #[serde(skip)]
    pub kernel_id: Option<u64>,
}

impl MountNamespace {
    /// Namespace `id` with nothing known of it yet (no task, pin or table read).
    pub fn empty(id: MountNsId) -> Self {
        Self {
            id,
            pids: Vec::new(),
            tasks: Vec::new(),
            pinned_by: None,
            read_via: None,
            mount_count: 0,
            mountinfo_bytes: 0,
            kernel_id: None,
        }
    }
}

/// Groups tasks by namespace.
pub fn group(entries: &[ProcEntry]) -> BTreeMap<MountNsId, MountNamespace> {
    let mut map: BTreeMap<MountNsId, MountNamespace> = BTreeMap::new();
    for e in entries {
        for &(tid, ns) in &e.tasks {
            let n = map.entry(ns).or_insert_with(|| MountNamespace::empty(ns));
            if n.pids.last() != Some(&e.pid) {
                n.pids.push(e.pid);
            }
            n.tasks.push((e.pid, tid));
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process whose only task in a namespace is a thread is among that namespace's
    /// processes, and the namespace lists the thread as its way in.
    #[test]
    fn a_process_counts_in_a_namespace_it_is_in_through_a_thread_alone() {
        let (host, pod) = (MountNsId(1), MountNsId(2));
        let entry = |pid, tasks| ProcEntry {
            pid,
            comm: "p".into(),
            state: 'S',
            ppid: 1,
            kthread: false,
            start_time: 0,
            vsize: 0,
            tasks,
            unreadable: Vec::new(),
        };
        let g = group(&[entry(10, vec![(10, host), (11, host), (12, pod)]), entry(20, vec![(20, pod)])]);
        assert_eq!(g[&host].pids, [10]);
        assert_eq!(g[&pod].pids, [10, 20]);
        assert_eq!(g[&pod].tasks, [(10, 12), (20, 20)]);
    }
}
