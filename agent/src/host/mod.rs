//! Where the host's pseudo-filesystems live.
//!
//! Every path to `/proc`, `/sys`, `/dev` is built here from a [`HostRoot`], so the same scanners
//! run on this host (`/`), inside a pod that sees the host under `/host`, and on fixture trees in
//! `tests/fixtures/<scenario>/`.

pub mod beneath;
pub mod bounded;
pub mod clock;
pub mod dmioctl;
pub mod durable;
pub mod nsenter;
pub mod nsfs;
pub mod parallel;
pub mod pidfd;
pub mod sys;

use std::path::{Path, PathBuf};

/// Host paths whose devices are never touched by default: the root, and the kubelet's and the
/// container runtimes' directories.
pub const DEFAULT_PROTECTED_PATHS: [&str; 5] =
    ["/", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker", "/var/lib/containers"];

/// The roots of the host's `/`, `/proc`, `/sys` and `/dev`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoot {
    root: PathBuf,
    proc: PathBuf,
    sys: PathBuf,
    dev: PathBuf,
}

impl Default for HostRoot {
    fn default() -> Self {
        Self::new("/")
    }
}

impl HostRoot {
    /// A host whose `/proc`, `/sys` and `/dev` sit under `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self { proc: root.join("proc"), sys: root.join("sys"), dev: root.join("dev"), root }
    }

    /// Overrides the location of `/proc` (for a pod that mounts the host's procfs elsewhere).
    pub fn with_proc(mut self, proc: impl Into<PathBuf>) -> Self {
        self.proc = proc.into();
        self
    }

    /// Overrides the location of `/sys`.
    pub fn with_sys(mut self, sys: impl Into<PathBuf>) -> Self {
        self.sys = sys.into();
        self
    }

    /// Overrides the location of `/dev`.
    pub fn with_dev(mut self, dev: impl Into<PathBuf>) -> Self {
        self.dev = dev.into();
        self
    }

    /// The host's `/`.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The host's `/proc`.
    pub fn proc(&self) -> &Path {
        &self.proc
    }

    /// The host's `/sys`.
    pub fn sys(&self) -> &Path {
        &self.sys
    }

    /// The host's `/dev`.
    pub fn dev(&self) -> &Path {
        &self.dev
    }

    /// `/proc/<pid>`.
    pub fn proc_pid(&self, pid: u32) -> PathBuf {
        self.proc.join(pid.to_string())
    }

    /// `/proc/<pid>/task/<tid>`.
    pub fn proc_task(&self, pid: u32, tid: u32) -> PathBuf {
        self.proc_pid(pid).join("task").join(tid.to_string())
    }

    /// `/sys/class/block`: one entry per block device and partition.
    pub fn sys_class_block(&self) -> PathBuf {
        self.sys.join("class/block")
    }

    /// `/dev/<name>`.
    pub fn dev_node(&self, name: &str) -> PathBuf {
        self.dev.join(name)
    }

    /// `/etc/multipath/wwids`: the WWIDs multipath-tools treats as multipath devices (a pod
    /// reaches it through a hostPath mount of the host's `/etc/multipath` at the same path).
    pub fn multipath_wwids(&self) -> PathBuf {
        self.root.join("etc/multipath/wwids")
    }

    /// Maps a path as the host sees it (absolute, e.g. from `/proc/swaps`) to where it is
    /// reachable from this process: `/dev/...` goes under the dev root, `/proc/...` under the proc
    /// root, anything else under the host root.
    pub fn host_path(&self, path: &Path) -> PathBuf {
        let rel = path.strip_prefix("/").unwrap_or(path);
        if let Ok(rest) = rel.strip_prefix("dev") {
            return self.dev.join(rest);
        }
        if let Ok(rest) = rel.strip_prefix("proc") {
            return self.proc.join(rest);
        }
        if let Ok(rest) = rel.strip_prefix("sys") {
            return self.sys.join(rest);
        }
        self.root.join(rel)
    }

    /// Where the host's own `/` (as its init sees it, not this process's root: in the
    /// DaemonSet's container that is the image) can be reached from here, in the order to try:
    /// on a live host PID 1's `root` link, then kthreadd's (PID 2: kernel threads share the
    /// initial root, and PID 1 may be shielded, as a sandbox supervisor or an LSM does). Empty on
    /// a fixture tree (see [`Self::stat_on_host`]).
    pub fn host_fs_roots(&self) -> Vec<PathBuf> {
        if !self.is_live() {
            return Vec::new();
        }
        [1, 2].into_iter().map(|pid| self.proc_pid(pid).join("root")).collect()
    }

    /// Stats `path` as the HOST sees it: resolved with the host's `/` as root
    /// ([`Self::host_fs_roots`], through `openat2(RESOLVE_IN_ROOT)`, so the host's absolute
    /// symlinks stay on the host). The first root that can be opened answers (`NotFound`
    /// included); when none can, the first root's error. On a fixture tree: the path under the
    /// tree ([`Self::host_path`]).
    pub fn stat_on_host(&self, path: &Path) -> std::io::Result<crate::host::sys::FileId> {
        let roots = self.host_fs_roots();
        if roots.is_empty() {
            return crate::host::sys::stat_cached(&self.host_path(path));
        }
        let mut first = None;
        for root in roots {
            if let Err(e) = crate::host::sys::stat_cached(&root) {
                first.get_or_insert(std::io::Error::new(e.kind(), format!("{}: {e}", root.display())));
                continue;
            }
            return crate::host::sys::stat_in_root(&root, path);
        }
        Err(first.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound)))
    }

    /// True when the proc root is a live procfs of our own PID namespace (its `self` link
    /// names this process), so the PIDs it lists can be entered. False on fixture trees.
    pub fn is_live(&self) -> bool {
        std::fs::read_link(self.proc.join("self")).ok().and_then(|p| p.to_str()?.parse::<u32>().ok())
            == Some(std::process::id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_and_host_paths() {
        let h = HostRoot::new("/host").with_proc("/hostproc");
        assert_eq!(h.proc_task(5, 6), PathBuf::from("/hostproc/5/task/6"));
        assert_eq!(h.sys_class_block(), PathBuf::from("/host/sys/class/block"));
        assert_eq!(h.host_path(Path::new("/dev/loop0")), PathBuf::from("/host/dev/loop0"));
        assert_eq!(h.host_path(Path::new("/swapfile")), PathBuf::from("/host/swapfile"));
        assert_eq!(h.host_path(Path::new("/proc/1/fd/3")), PathBuf::from("/hostproc/1/fd/3"));
        assert_eq!(h.multipath_wwids(), PathBuf::from("/host/etc/multipath/wwids"));
        assert!(!h.is_live());
        assert!(h.host_fs_roots().is_empty(), "a fixture tree has no init to ask");
        assert!(HostRoot::default().is_live());
        assert_eq!(
            HostRoot::default().host_fs_roots(),
            [PathBuf::from("/proc/1/root"), PathBuf::from("/proc/2/root")]
        );
        let fixture = HostRoot::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/iscsi"));
        assert!(fixture.stat_on_host(Path::new("/sys")).is_ok());
        let host = HostRoot::default();
        assert_eq!(
            host.stat_on_host(Path::new("/nonexistent-protected-path")).map_err(|e| e.kind()).err(),
            Some(std::io::ErrorKind::NotFound)
        );
    }
}
