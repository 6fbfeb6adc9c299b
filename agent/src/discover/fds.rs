//! What a process holds through its files: open fds on a device node (by `st_rdev`), open files,
//! working directory, root and memory mappings on a device's filesystem (by `st_dev`).
//!
//! The fd's link text is the process's own path (`/dev/xvda` inside a container), so matching is
//! by device numbers only, from `statx(AT_STATX_DONT_SYNC)`: cached attributes, so a hung FUSE or
//! NFS server cannot hang the scan. `maps` of a process in D state is read on its own thread with
//! a deadline (reading it takes the target's mmap lock, which a stuck process may hold).
//! Whatever cannot be read is reported, so the scan knows it is incomplete.

use std::collections::{BTreeSet, HashSet};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::maps;
use super::namespaces::NsEntry;
use super::processes::ProcEntry;
use super::{is_gone, numeric_entries};
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
    /// The process was in D state (its mappings were read on a bounded thread).
    pub stuck: bool,
    /// What could not be read, naming the file and the process.
    pub unreadable: Vec<String>,
}

/// Scans one process. `nsfs_dev` (live hosts) lets fds on namespace files be recognised;
/// `known_ns` are the namespaces that already have tasks. What cannot be read (other than the
/// process exiting) is listed in [`FdScan::unreadable`]: it is a blind spot, never a silent skip.
pub fn scan_process(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    nsfs_dev: Option<DevNum>,
    known_ns: &HashSet<MountNsId>,
) -> FdScan {
    let mut out = FdScan::default();
    let who = format!("pid {} ({})", entry.pid, entry.comm);
    let dir = host.proc_pid(entry.pid);
    let fd_dir = dir.join("fd");
    let fds = match numeric_entries(&fd_dir) {
        Ok(f) => f,
        Err(e) if is_gone(&e) => return out,
        Err(e) => {
            out.unreadable.push(format!("cannot list {} of {who}: {e}", fd_dir.display()));
            Vec::new()
        }
    };
    let mut fd_errors = Vec::new();
    for fd in fds {
        let path = fd_dir.join(fd.to_string());
        let id = match sys::stat_cached(&path) {
            Ok(id) => id,
            Err(e) if is_gone(&e) => continue, // closed meanwhile
            Err(e) => {
                fd_errors.push(format!("fd {fd}: {e}"));
                continue;
            }
        };
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
    if let Some(first) = fd_errors.first() {
        out.unreadable.push(format!(
            "cannot stat {} of the open files of {who} in {} (first: {first})",
            fd_errors.len(),
            fd_dir.display()
        ));
    }
    dir_refs(&dir, entry.pid, None, targets, &mut out);
    // A task can have a working directory and root of its own (it unshared CLONE_FS, or its
    // mount namespace): check every task's.
    for &(tid, _) in &entry.tasks {
        if tid != entry.pid {
            dir_refs(&host.proc_task(entry.pid, tid), entry.pid, Some(tid), targets, &mut out);
        }
    }
    out.stuck = entry.state == 'D';
    match read_maps(&dir, entry.pid, out.stuck) {
        Ok(text) => {
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
        Err(why) => out.unreadable.push(format!("cannot read the memory maps of {who}: {why}")),
    }
    out
}

/// How long reading the maps of a process in D state may take (it takes the target's mmap lock,
/// which a stuck process may hold forever).
const STUCK_MAPS_DEADLINE: Duration = Duration::from_millis(250);

/// Processes whose `maps` read is still blocked on a helper thread: not read again (no second
/// thread) until that one returns.
static BLOCKED_MAPS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// `/proc/PID/maps` (empty when the process is gone). For a process in D state the read runs on
/// its own thread with a deadline, and a read that blocks is reported, never waited for.
fn read_maps(dir: &Path, pid: u32, stuck: bool) -> Result<Vec<u8>, String> {
    let path = dir.join("maps");
    let read = move |path: &Path| match std::fs::read(path) {
        Ok(b) => Ok(b),
        Err(e) if is_gone(&e) => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", path.display())),
    };
    if !stuck {
        return read(&path);
    }
    {
        let mut blocked = BLOCKED_MAPS.lock().unwrap_or_else(|p| p.into_inner());
        if blocked.contains(&pid) {
            return Err("it is in D state and an earlier read of its maps is still blocked".into());
        }
        blocked.insert(pid);
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name(format!("blockjanitor-maps-{pid}")).spawn(move || {
        let r = read(&path);
        BLOCKED_MAPS.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid);
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        BLOCKED_MAPS.lock().unwrap_or_else(|p| p.into_inner()).remove(&pid);
        return Err(format!("cannot start a thread to read them: {e}"));
    }
    rx.recv_timeout(STUCK_MAPS_DEADLINE).unwrap_or_else(|_| {
        Err(format!("it is in D state and reading its maps blocked for more than {STUCK_MAPS_DEADLINE:?}"))
    })
}

fn dir_refs(dir: &Path, pid: u32, tid: Option<u32>, targets: &HashSet<DevNum>, out: &mut FdScan) {
    for (name, kind) in [("cwd", HolderKind::Cwd), ("root", HolderKind::Root)] {
        let path = dir.join(name);
        match sys::stat_cached(&path) {
            Ok(id) if targets.contains(&id.dev) => {
                out.refs.push(ProcRef { pid, tid, kind, devnum: id.dev, path: link_text(&path), fd: None })
            }
            Ok(_) => {}
            // Gone, or a zombie (no files any more).
            Err(e) if is_gone(&e) => {}
            Err(e) => out.unreadable.push(format!("cannot stat {}: {e}", path.display())),
        }
    }
}

/// The link's text as bytes (`read_link` gives an `OsString`, which may be any bytes).
fn link_text(path: &Path) -> Option<KernelText> {
    std::fs::read_link(path).ok().map(|p| KernelText::from_bytes(p.into_os_string().into_vec()))
}
