//! What a process holds through its files: open fds on a device node (by `st_rdev`), open files,
//! working directory, root and memory mappings on a device's filesystem (by `st_dev`).
//!
//! The fd's link text is the process's own path (`/dev/xvda` inside a container), so matching is
//! by device numbers only, from `statx(AT_STATX_DONT_SYNC)`: cached attributes, so a hung FUSE or
//! NFS server cannot hang the scan. `maps` of a process in D state is read on its own thread with
//! a deadline (reading it takes the target's mmap lock, which a stuck process may hold).
//! Whatever cannot be read is reported, so the scan knows it is incomplete.
//!
//! A file on btrfs stats with its subvolume's anonymous `st_dev`, and its mapping shows the
//! superblock's: neither is a block device (gotcha 23). Both are followed to the filesystem's
//! member devices through the [`AnonIndex`] (the superblock's number, or the mount the file was
//! reached through, by the kernel's mount ID), so a cwd, an open file or a mapping on btrfs is a
//! holder of every device the filesystem sits on.

use std::collections::HashSet;
use std::os::unix::ffi::OsStringExt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::livefs::AnonIndex;
use super::maps;
use super::namespaces::NsEntry;
use super::processes::ProcEntry;
use super::{is_gone, numeric_entries};
use crate::host::sys;
use crate::host::HostRoot;
use crate::model::{DevNum, HolderKind, KernelText, MountNsId};

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
    /// What the process does with it, in `fuser`'s letter: `f` an open file (`F` open for
    /// writing), `c` its working directory, `r` its root, `m` a mapped file, `e` its executable.
    pub access: char,
}

/// Whether fd link `path` (`/proc/PID/fd/N`) is open for writing: the kernel gives the link the
/// owner's write bit then (as `fuser` reads it). Not known (the fd closed meanwhile): not shown as
/// written to.
fn open_for_writing(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path).is_ok_and(|m| m.permissions().mode() & 0o200 != 0)
}

/// The identity (inode, name) of the file a process runs, for telling its executable's mapping
/// from the other files it maps (`e` and `m` in `fuser`'s letters).
fn executable_of(dir: &Path) -> Option<(u64, Vec<u8>)> {
    let exe = dir.join("exe");
    let id = sys::stat_cached(&exe).ok()?;
    Some((id.ino, std::fs::read_link(&exe).ok()?.into_os_string().into_vec()))
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
    /// Subvolume numbers (anonymous `st_dev`) seen on files reached through a mount the
    /// [`AnonIndex`] knows, with that filesystem's members: for a loop device backed by a file
    /// there.
    pub learned: Vec<(DevNum, Vec<DevNum>)>,
    /// The name each working directory or root on a device was found under (its link read).
    pub dir_names: Vec<DirName>,
}

/// A task's working directory or root on a device, and the name its link gave for it.
#[derive(Debug, Clone)]
pub struct DirName {
    pub tid: Option<u32>,
    pub kind: HolderKind,
    /// The directory's identity: filesystem device, inode, and the mount it was reached through.
    pub dir: (DevNum, u64, Option<u64>),
    pub path: Option<KernelText>,
}

/// What a process's last full read found of its tasks' working directories and roots, for a
/// light scan ([`scan_dirs`]; `snapshot::process_read_cache` says what it cannot see).
#[derive(Debug, Clone, Copy)]
pub struct DirsThen<'a> {
    /// Every thread shared the leader's fs_struct then, and it has the same threads now: only
    /// the leader's are read.
    pub shared: bool,
    /// The names found then: a directory with the same identity now (device, inode, mount) is
    /// shown under the same name, without reading its link again (a directory renamed since
    /// shows its old name until the next full read, as a renamed open file does).
    pub names: &'a [DirName],
}

/// The in-scope devices a file's `st_dev` stands for: itself, or the member devices of the
/// btrfs filesystem it lives on (learning its subvolume's number).
fn file_devices(
    id: &sys::FileId,
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    out: &mut FdScan,
) -> Vec<DevNum> {
    if targets.contains(&id.dev) {
        return vec![id.dev];
    }
    let members = anon.members_of(id);
    if !members.is_empty() && anon.members_of_dev(id.dev).is_empty() {
        out.learned.push((id.dev, members.to_vec()));
    }
    members.iter().copied().filter(|m| targets.contains(m)).collect()
}

/// Scans one process. `anon` follows btrfs's anonymous numbers to their member devices;
/// `nsfs_dev` (live hosts) lets fds on namespace files be recognised;
/// `known_ns` are the namespaces that already have tasks; `live` ([`HostRoot::is_live`]) says
/// the PIDs are this process's own, so the kernel can be asked about them directly. What cannot
/// be read (other than the process exiting) is listed in [`FdScan::unreadable`]: it is a blind
/// spot, never a silent skip. The same as [`scan_fds`], [`scan_dirs`] and [`scan_maps`] in turn.
pub fn scan_process(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    nsfs_dev: Option<DevNum>,
    known_ns: &HashSet<MountNsId>,
    live: bool,
    anon: &AnonIndex,
) -> FdScan {
    let mut out = FdScan::default();
    if !scan_fds(host, entry, targets, nsfs_dev, known_ns, live, anon, &mut out) {
        return out;
    }
    scan_dirs(host, entry, targets, live, anon, None, &mut out);
    scan_maps(host, entry, targets, anon, &mut out);
    out
}

/// The open files of one process (see [`scan_process`]), added to `out`. False when the
/// process is gone (nothing more to read).
#[allow(clippy::too_many_arguments)]
pub fn scan_fds(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    nsfs_dev: Option<DevNum>,
    known_ns: &HashSet<MountNsId>,
    live: bool,
    anon: &AnonIndex,
    out: &mut FdScan,
) -> bool {
    let who = format!("pid {} ({})", entry.pid, entry.comm);
    let fd_dir = host.proc_pid(entry.pid).join("fd");
    let fds = match numeric_entries(&fd_dir) {
        Ok(f) => f,
        Err(e) if is_gone(&e) => return false,
        Err(e) => {
            out.unreadable.push(format!("cannot list {} of {who}: {e}", fd_dir.display()));
            Vec::new()
        }
    };
    let mut fd_errors = Vec::new();
    // This agent's own probes blocked on a device (crate::host::bounded) are not holders.
    let me = live && entry.pid == std::process::id();
    for fd in fds {
        if me && i32::try_from(fd).is_ok_and(crate::host::bounded::is_probe_fd) {
            continue;
        }
        let path = fd_dir.join(fd.to_string());
        let id = match sys::stat_cached(&path) {
            Ok(id) => id,
            Err(e) if is_gone(&e) => continue, // closed meanwhile
            Err(e) => {
                fd_errors.push(format!("fd {fd}: {e}"));
                continue;
            }
        };
        let held = if id.is_block_device() && targets.contains(&id.rdev) {
            vec![(HolderKind::OpenDevice, id.rdev)]
        } else {
            file_devices(&id, targets, anon, out).into_iter().map(|d| (HolderKind::OpenFile, d)).collect()
        };
        if !held.is_empty() {
            let text = link_text(&path);
            let access = if open_for_writing(&path) { 'F' } else { 'f' };
            for (kind, devnum) in held {
                out.refs.push(ProcRef {
                    pid: entry.pid,
                    tid: None,
                    kind,
                    devnum,
                    path: text.clone(),
                    fd: Some(fd),
                    access,
                });
            }
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
    true
}

/// The working directory and root of each task of one process (see [`scan_process`]), added
/// to `out`. `then`: what the process's last full read found (a daemon's light scan); when
/// every thread shared the leader's fs_struct then and has the same threads, only the leader's
/// are read. Returns whether every thread shares the leader's fs_struct, as `kcmp` proved (or
/// `then` took as proven).
pub fn scan_dirs(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    live: bool,
    anon: &AnonIndex,
    then: Option<DirsThen<'_>>,
    out: &mut FdScan,
) -> bool {
    let dir = host.proc_pid(entry.pid);
    let names = then.map_or(&[][..], |t| t.names);
    let shared_then = then.is_some_and(|t| t.shared);
    let leader_seen = dir_refs(&dir, (entry.pid, None), targets, anon, names, out);
    // A task can have a working directory and root of its own (it unshared CLONE_FS, or its
    // mount namespace): every task's is checked. A task that shares the leader's fs_struct (the
    // pthread default) has the leader's cwd and root, just seen: `kcmp(KCMP_FS)` proves it in
    // one syscall, without the two procfs path walks a stat of its links costs (on a busy node,
    // 4,000 threads made those most of this phase). Only a live host's PIDs can be compared, and
    // only with a leader whose cwd and root were both seen; any kcmp error (no CONFIG_KCMP, no
    // ptrace access, a task gone) falls back to the task's own links, whose errors are reported.
    let by_kcmp = live && leader_seen;
    if by_kcmp && shared_then {
        return true;
    }
    let mut all_shared = by_kcmp;
    for &(tid, _) in &entry.tasks {
        if tid == entry.pid || (by_kcmp && sys::same_fs_context(entry.pid, tid).unwrap_or(false)) {
            continue;
        }
        all_shared = false;
        dir_refs(&host.proc_task(entry.pid, tid), (entry.pid, Some(tid)), targets, anon, names, out);
    }
    all_shared
}

/// The memory mappings of one process on devices (see [`scan_process`]), added to `out`
/// (which says whether it was in D state, its maps then read on a bounded thread).
pub fn scan_maps(
    host: &HostRoot,
    entry: &ProcEntry,
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    out: &mut FdScan,
) {
    let dir = host.proc_pid(entry.pid);
    out.stuck = entry.state == 'D';
    match read_maps(&dir, entry.pid, out.stuck) {
        Ok(text) => {
            // Bytes: a mapped file's name need not be UTF-8, and must not hide the mapping.
            let mut seen = HashSet::new();
            let mut exe = None;
            for m in maps::file_mappings(&text) {
                // maps shows btrfs's superblock number: follow it to the members.
                let devs: Vec<DevNum> = if targets.contains(&m.devnum) {
                    vec![m.devnum]
                } else {
                    anon.members_of_dev(m.devnum).iter().copied().filter(|d| targets.contains(d)).collect()
                };
                if devs.is_empty() {
                    continue;
                }
                let exe = exe.get_or_insert_with(|| executable_of(&dir));
                let runs = exe.as_ref().is_some_and(|(ino, name)| *ino == m.inode && name[..] == m.path[..]);
                for devnum in devs {
                    if seen.insert((devnum, m.devnum, m.inode)) {
                        out.refs.push(ProcRef {
                            pid: entry.pid,
                            tid: None,
                            kind: HolderKind::Mmap,
                            devnum,
                            path: Some(KernelText::from(m.path)),
                            fd: None,
                            access: if runs { 'e' } else { 'm' },
                        });
                    }
                }
            }
        }
        Err(why) => out
            .unreadable
            .push(format!("cannot read the memory maps of pid {} ({}): {why}", entry.pid, entry.comm)),
    }
}

/// How long reading the maps of a process in D state may take (it takes the target's mmap lock,
/// which a stuck process may hold forever).
const STUCK_MAPS_DEADLINE: Duration = Duration::from_millis(250);

/// `/proc/PID/maps` (empty when the process is gone). For a process in D state the read runs
/// through [`crate::host::bounded`] (its own thread, a deadline, never a second thread while one is
/// blocked), and a read that blocks is reported, never waited for.
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
    crate::host::bounded::read(format!("maps-{pid}"), STUCK_MAPS_DEADLINE, move || read(&path))
        .unwrap_or_else(|b| Err(format!("it is in D state and reading its maps {b}")))
}

/// Checks a task's cwd and root. True when both were seen (not gone, not unreadable). A
/// directory on a device is named as in `names` when it is the same one, else by its link.
fn dir_refs(
    dir: &Path,
    (pid, tid): (u32, Option<u32>),
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    names: &[DirName],
    out: &mut FdScan,
) -> bool {
    let mut seen = true;
    for (name, kind) in [("cwd", HolderKind::Cwd), ("root", HolderKind::Root)] {
        let path = dir.join(name);
        match sys::stat_cached(&path) {
            Ok(id) => {
                let devices = file_devices(&id, targets, anon, out);
                if devices.is_empty() {
                    continue;
                }
                let key = (id.dev, id.ino, id.mnt_id);
                let known = names.iter().find(|n| n.tid == tid && n.kind == kind && n.dir == key);
                let named = known.map_or_else(|| link_text(&path), |n| n.path.clone());
                if known.is_none() {
                    out.dir_names.push(DirName { tid, kind, dir: key, path: named.clone() });
                }
                let access = if kind == HolderKind::Root { 'r' } else { 'c' };
                for devnum in devices {
                    out.refs.push(ProcRef { pid, tid, kind, devnum, path: named.clone(), fd: None, access })
                }
            }
            // Gone, a zombie (no files any more), or reaped after its directory was found (the
            // kernel answers EACCES for a reaped task's links).
            Err(e) if is_gone(&e) || super::processes::reaped(&e, dir) => seen = false,
            Err(e) => {
                seen = false;
                out.unreadable.push(format!("cannot stat {}: {e}", path.display()))
            }
        }
    }
    seen
}

/// The link's text as bytes (`read_link` gives an `OsString`, which may be any bytes).
fn link_text(path: &Path) -> Option<KernelText> {
    std::fs::read_link(path).ok().map(|p| KernelText::from_bytes(p.into_os_string().into_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::processes;

    fn gettid() -> u32 {
        // SAFETY: gettid takes no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_gettid) as u32 }
    }

    /// A thread with an fs context of its own (`unshare(CLONE_FS)`, then `chdir`) is seen with
    /// its own cwd whether or not kcmp proves the other threads share the leader's.
    #[test]
    fn a_thread_with_its_own_cwd_is_seen() {
        use std::sync::mpsc;
        let host = HostRoot::default();
        let procfs = sys::stat_cached(Path::new("/proc")).expect("stat /proc").dev;
        let (tid_tx, tid_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let own = std::thread::spawn(move || {
            // SAFETY: unshare(CLONE_FS) gives this thread its own fs_struct; no memory involved.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_FS) }, 0, "unshare(CLONE_FS)");
            std::env::set_current_dir("/proc").expect("chdir /proc");
            tid_tx.send(gettid()).expect("send");
            let _ = done_rx.recv();
        });
        let (shared_tx, shared_rx) = mpsc::channel();
        let (shared_done_tx, shared_done_rx) = mpsc::channel::<()>();
        let shared = std::thread::spawn(move || {
            shared_tx.send(gettid()).expect("send");
            let _ = shared_done_rx.recv();
        });
        let own_tid = tid_rx.recv().expect("own tid");
        let shared_tid = shared_rx.recv().expect("shared tid");
        let me = std::process::id();

        assert_eq!(sys::same_fs_context(me, shared_tid).ok(), Some(true), "a pthread shares the leader's");
        assert_eq!(sys::same_fs_context(me, own_tid).ok(), Some(false), "unshare(CLONE_FS) gives its own");

        let entry = processes::read_entry(&host, me).expect("readable").expect("alive");
        let targets: HashSet<DevNum> = [procfs].into();
        let dirs = |live: bool| -> Vec<(Option<u32>, HolderKind)> {
            let s = scan_process(&host, &entry, &targets, None, &HashSet::new(), live, &AnonIndex::default());
            assert!(s.unreadable.is_empty(), "{:?}", s.unreadable);
            let mut v: Vec<_> = s
                .refs
                .iter()
                .filter(|r| matches!(r.kind, HolderKind::Cwd | HolderKind::Root))
                .map(|r| (r.tid, r.kind))
                .collect();
            v.sort_by_key(|(t, _)| *t);
            v
        };
        let with_kcmp = dirs(host.is_live());
        assert_eq!(with_kcmp, vec![(Some(own_tid), HolderKind::Cwd)]);
        assert_eq!(dirs(false), with_kcmp, "every task stat'ed gives the same answer");

        done_tx.send(()).expect("done");
        shared_done_tx.send(()).expect("done");
        own.join().expect("join");
        shared.join().expect("join");
    }

    /// A file this agent's own blocked probe holds open (marked through crate::host::bounded) is not
    /// a holder; the same file unmarked is.
    #[test]
    fn the_agents_own_blocked_probe_is_not_a_holder() {
        use std::os::fd::AsRawFd;
        let host = HostRoot::default();
        let procfs = sys::stat_cached(Path::new("/proc")).expect("stat /proc").dev;
        let f = std::fs::File::open("/proc/self/status").expect("open a procfs file");
        let fd = u32::try_from(f.as_raw_fd()).expect("fd");
        let entry = processes::read_entry(&host, std::process::id()).expect("readable").expect("alive");
        let targets: HashSet<DevNum> = [procfs].into();
        let holds = || {
            scan_process(&host, &entry, &targets, None, &HashSet::new(), true, &AnonIndex::default())
                .refs
                .iter()
                .any(|r| r.fd == Some(fd))
        };
        assert!(holds(), "an open file on the filesystem is a holder");
        let mark = crate::host::bounded::mark_fd(f.as_raw_fd());
        assert!(!holds(), "marked as the agent's own probe: not a holder");
        drop(mark);
        assert!(holds());
    }
}
