//! Which pods have a process on this node: every process's `cgroup` read for the pod UID its
//! path names ([`super::cgroup::identify`]: kubelet puts every container of a pod, its pause
//! container included, in a cgroup named by the pod's UID, on every cgroup driver and runtime).
//! A pod with no process left is not running here. A process whose `cgroup` cannot be read
//! (other than by exiting) is named: it could be the pod's.

use std::collections::BTreeMap;
use std::io;

use super::{cgroup, is_gone, processes};
use crate::host::HostRoot;

/// The pods with a process here.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodProcesses {
    /// Pod UID (as kubelet names its directory) -> its processes, ascending.
    pub by_pod: BTreeMap<String, Vec<u32>>,
    /// The processes whose `cgroup` could not be read, each with why.
    pub unreadable: Vec<String>,
}

impl PodProcesses {
    /// The processes of pod `uid` (none: nothing of it runs here).
    pub fn of(&self, uid: &str) -> &[u32] {
        self.by_pod.get(uid).map_or(&[], Vec::as_slice)
    }
}

/// Reads every process's `cgroup`. `Err` only when `/proc` cannot be listed.
pub fn scan(host: &HostRoot) -> io::Result<PodProcesses> {
    let mut out = PodProcesses::default();
    for pid in processes::pids(host)? {
        let path = host.proc_pid(pid).join("cgroup");
        match std::fs::read(&path) {
            Ok(bytes) => {
                if let Some(uid) = cgroup::identify(&String::from_utf8_lossy(&bytes)).pod_uid {
                    out.by_pod.entry(uid).or_default().push(pid);
                }
            }
            Err(e) if is_gone(&e) => {}
            Err(e) => out.unreadable.push(format!("{}: {e}", path.display())),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the live host: this test process is in no pod, and every process is read.
    #[test]
    fn reads_every_process() {
        let host = HostRoot::default();
        let found = scan(&host).expect("scan");
        let me = std::process::id();
        assert!(!found.by_pod.values().any(|p| p.contains(&me)), "{found:?}");
    }

    /// On a fixture tree: the pods named by the processes' cgroups.
    #[test]
    fn names_the_pods_of_a_fixture() {
        let root = tempfile::tempdir().expect("tempdir");
        let uid = "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e";
        let write = |pid: u32, text: &str| {
            let dir = root.path().join(format!("proc/{pid}"));
            std::fs::create_dir_all(&dir).expect("mkdir");
            std::fs::write(dir.join("cgroup"), text).expect("cgroup");
        };
        write(7, &format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope\n", uid.replace('-', "_"), "a".repeat(64)));
        write(8, "0::/system.slice/kubelet.service\n");
        write(9, "0::/kubepods/burstable/pod6b1d8f2e9c4a7b3e5d0f1a2c3b4d5e6f/\n");
        let found = scan(&HostRoot::new(root.path())).expect("scan");
        assert_eq!(found.of(uid), [7]);
        assert_eq!(
            found.of("6b1d8f2e9c4a7b3e5d0f1a2c3b4d5e6f"),
            [9],
            "a static pod's UID is its config hash"
        );
        assert!(found.of("other").is_empty());
        assert!(found.unreadable.is_empty());
    }
}
