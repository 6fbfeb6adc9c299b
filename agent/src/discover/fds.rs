//! What a process holds through its files: open fds on a device node (by `st_rdev`), open files,
//! working directory, root and memory mappings on a device's filesystem (by `st_dev`).
//!
//! The fd's link text is the process's own path (`/dev/xvda` inside a container), so matching is
//! by device numbers only, from `statx(AT_STATX_DONT_SYNC)`: cached attributes, so a hung FUSE or
//! NFS server cannot hang the scan. `maps` is not read for a process in D state (reading it takes
//! the target's mmap lock, which a stuck process may hold).

use std::collections::HashSet;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

use serde::Serialize;

use super::maps;
use super::namespaces::NsEntry;
use super::numeric_entries;
use super::processes::ProcEntry;
use crate::host::HostRoot;
use crate::model::{DevNum, HolderKind, KernelText, MountNsId};
use crate::sys;

/// One reference from a process to a device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProcRef {
    pub pid: u32,
    /// Set when the reference is a task's own (its cwd/root differ from the leader's).
    pub tid: Option<u32>,
    pub kind: HolderKind,
    pub devnum: DevNum,
    /// The path as the process sees it (fd link text, mapped file), when known.
    pub path: Option<KernelText>,
    pub fd: Option<u32>,
}

/// What one process's files showed.
#[derive(Debug, Default)]
pub struct FdScan {
    pub refs: Vec<ProcRef>,
    /// Mount namespaces kept open by an fd of this process.
    pub pinned_ns: Vec<(MountNsId, NsEntry)>,
    /// The process was in D state, so its mappings were not read.
    pub stuck: bool,
}

/// Scans one process. `nsfs_dev` (live hosts) lets fds on namespace files be recognised;
/// `known_ns` are the namespaces that already have tasks.
pub fn scan_process(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    nsfs_dev: Option<DevNum>,
    known_ns: &HashSet<MountNsId>,
) -> FdScan {
    let mut out = FdScan::default();
    let dir = host.proc_pid(entry.pid);
    let fd_dir = dir.join("fd");
    for fd in numeric_entries(&fd_dir).unwrap_or_default() {
        let path = fd_dir.join(fd.to_string());
        let Ok(id) = sys::stat_cached(&path) else { continue };
        let kind = if id.is_block_device() && targets.contains(&id.rdev) {
            Some((HolderKind::OpenDevice, id.rdev))
        } else if targets.contains(&id.dev) {
            Some((HolderKind::OpenFile, id.dev))
        } else {
            None
        };
        if let Some((kind, devnum)) = kind {
            out.refs.push(ProcRef {
                pid: entry.pid,
                tid: None,
                kind,
                devnum,
                path: link_text(&path),
                fd: Some(fd),
            });
        }
        if nsfs_dev == Some(id.dev) && !known_ns.contains(&MountNsId(id.ino)) {
            if let Some(ns) =
                link_text(&path).as_ref().and_then(KernelText::to_str).and_then(MountNsId::from_link)
            {
                out.pinned_ns.push((ns, NsEntry::Fd { pid: entry.pid, fd }));
            }
        }
    }
    dir_refs(&dir, entry.pid, None, targets, &mut out.refs);
    // A task that unshared its mount namespace has its own fs context: check its cwd and root.
    let leader_ns = entry.mount_ns();
    for &(tid, ns) in &entry.tasks {
        if tid != entry.pid && Some(ns) != leader_ns {
            dir_refs(&host.proc_task(entry.pid, tid), entry.pid, Some(tid), targets, &mut out.refs);
        }
    }
    if entry.state == 'D' {
        out.stuck = true;
    } else if let Ok(text) = std::fs::read(dir.join("maps")) {
        // Bytes: a mapped file's name need not be UTF-8, and must not hide the mapping.
        let mut seen = HashSet::new();
        for m in maps::file_mappings(&text) {
            if targets.contains(&m.devnum) && seen.insert((m.devnum, m.inode)) {
                out.refs.push(ProcRef {
                    pid: entry.pid,
                    tid: None,
                    kind: HolderKind::Mmap,
                    devnum: m.devnum,
                    path: Some(KernelText::from(m.path)),
                    fd: None,
                });
            }
        }
    }
    out
}

fn dir_refs(dir: &Path, pid: u32, tid: Option<u32>, targets: &HashSet<DevNum>, refs: &mut Vec<ProcRef>) {
    for (name, kind) in [("cwd", HolderKind::Cwd), ("root", HolderKind::Root)] {
        let path = dir.join(name);
        if let Ok(id) = sys::stat_cached(&path) {
            if targets.contains(&id.dev) {
                refs.push(ProcRef { pid, tid, kind, devnum: id.dev, path: link_text(&path), fd: None });
            }
        }
    }
}

/// The link's text as bytes (`read_link` gives an `OsString`, which may be any bytes).
fn link_text(path: &Path) -> Option<KernelText> {
    std::fs::read_link(path).ok().map(|p| KernelText::from_bytes(p.into_os_string().into_vec()))
}
