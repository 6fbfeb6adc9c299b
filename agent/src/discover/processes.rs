//! Processes and their tasks from `/proc`: state, kernel-thread flag, mount namespace per task,
//! and for holders the bounded command line and cgroup identity.
//!
//! Kernel threads (`PF_KTHREAD`) such as `jbd2/loop0-8` or `rbd3-task` never hold a device: they
//! are symptoms of a live mount, reported as such.

use std::io::Read;
use std::path::Path;

use procfs::FromRead;

use super::{cgroup, is_gone, numeric_entries};
use crate::host::HostRoot;
use crate::model::{KernelText, MountNsId, ProcessInfo};

/// At most this many bytes of a command line are read.
pub const CMDLINE_MAX: usize = 4096;
const PF_KTHREAD: u32 = 0x0020_0000;

/// One process (thread group) and the mount namespace of each of its tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcEntry {
    pub pid: u32,
    /// `comm` as the kernel has it: bytes (a process names itself, any bytes but NUL).
    pub comm: KernelText,
    pub state: char,
    pub ppid: u32,
    pub kthread: bool,
    /// When it started, in clock ticks after boot (`stat` field 22): with the pid, its
    /// identity (a reused pid is another process).
    pub start_time: u64,
    /// Its virtual memory size in bytes (`stat` field 23): changes with every `mmap`/`munmap`
    /// of a different size (a cheap sign its mappings changed, see `snapshot::process_read_cache`).
    pub vsize: u64,
    /// `(tid, namespace)` for every task that could be read; empty for kernel threads.
    pub tasks: Vec<(u32, MountNsId)>,
    /// Tasks whose namespace could not be read (a thread can unshare its own namespace): what
    /// the scan therefore cannot see, naming each.
    pub unreadable: Vec<String>,
}

impl ProcEntry {
    /// The namespace of the thread-group leader (or of its first readable task).
    pub fn mount_ns(&self) -> Option<MountNsId> {
        self.tasks.iter().find(|(t, _)| *t == self.pid).or(self.tasks.first()).map(|(_, ns)| *ns)
    }
}

/// What went wrong reading one process, other than it exiting.
#[derive(Debug)]
pub struct ProcReadIssue {
    pub pid: u32,
    pub what: String,
}

/// All process IDs in `/proc`.
pub fn pids(host: &HostRoot) -> std::io::Result<Vec<u32>> {
    numeric_entries(host.proc())
}

/// The tasks' namespaces a scan may take as an earlier scan read them: per pid, the process's
/// start time then and its `(tid, namespace)` sorted by tid (`snapshot::task_namespace_cache` says when).
pub type KnownTasks = std::collections::HashMap<u32, (u64, Vec<(u32, MountNsId)>)>;

/// Reads one process: `Ok(None)` when it exited while we looked.
pub fn read_entry(host: &HostRoot, pid: u32) -> Result<Option<ProcEntry>, ProcReadIssue> {
    read_entry_knowing(host, pid, None)
}

/// Like [`read_entry`], taking the namespace of a task `known` has for the same process (pid
/// and start time) as it is there, without reading its link.
pub fn read_entry_knowing(
    host: &HostRoot,
    pid: u32,
    known: Option<&KnownTasks>,
) -> Result<Option<ProcEntry>, ProcReadIssue> {
    let dir = host.proc_pid(pid);
    let stat_path = dir.join("stat");
    let bytes = match std::fs::read(&stat_path) {
        Ok(b) => b,
        Err(e) if is_gone(&e) => return Ok(None),
        Err(e) => {
            return Err(ProcReadIssue { pid, what: format!("cannot read {}: {e}", stat_path.display()) })
        }
    };
    let stat = procfs::process::Stat::from_read(bytes.as_slice())
        .map_err(|e| ProcReadIssue { pid, what: format!("malformed {}: {e}", stat_path.display()) })?;
    // procfs replaces invalid UTF-8 in comm lossily: take the bytes from the stat line itself.
    let comm = stat_comm(&bytes).map_or_else(|| KernelText::from(stat.comm.as_str()), KernelText::from);
    let kthread = stat.flags & PF_KTHREAD != 0;
    let mut tasks = Vec::new();
    let mut unreadable = Vec::new();
    let kept = known.and_then(|k| k.get(&pid)).filter(|(start, _)| *start == stat.starttime).map(|(_, t)| t);
    // The same process with as many threads as then, all in one namespace then: its tasks as
    // then (a thread made since, in place of one gone, is in its maker's namespace, the one
    // namespace; `snapshot::task_namespace_cache` says what this cannot see).
    let same_tasks = kept.filter(|t| {
        usize::try_from(stat.num_threads).is_ok_and(|n| n == t.len())
            && t.first().is_some_and(|&(_, ns)| t.iter().all(|&(_, n)| n == ns))
    });
    if let (false, Some(same)) = (kthread, same_tasks) {
        tasks = same.clone();
    } else if !kthread {
        let (task_dir, tids) = match TaskDir::list(&dir.join("task")) {
            Ok(t) => t,
            Err(e) if is_gone(&e) => return Ok(None),
            Err(e) => {
                return Err(ProcReadIssue { pid, what: format!("cannot list {}/task: {e}", dir.display()) })
            }
        };
        let mut denied = None;
        // Every task's own link: a thread that shares its leader's `fs_struct` can still be in
        // another mount namespace (`setns` through a pidfd with CLONE_NEWNS and another flag
        // installs the namespace on a private copy of the fs_struct, then writes its root and
        // cwd back into the shared one: discover::namespaces' root test shows it on 6.18), so
        // `kcmp(KCMP_FS)` cannot stand for the readlink.
        for tid in tids {
            if let Some(&(_, ns)) =
                kept.and_then(|t| t.binary_search_by_key(&tid, |&(t, _)| t).ok().map(|i| &t[i]))
            {
                tasks.push((tid, ns));
                continue;
            }
            let link = || host.proc_task(pid, tid).join("ns/mnt");
            match task_dir.mount_ns_link(tid) {
                Ok(text) => match text.to_str().and_then(MountNsId::from_link) {
                    Some(ns) => tasks.push((tid, ns)),
                    None => unreadable.push(format!(
                        "{} of pid {pid} ({comm}) reads {text:?}, not mnt:[INODE]",
                        link().display()
                    )),
                },
                Err(e) if is_gone(&e) || reaped(&e, &host.proc_task(pid, tid)) => {}
                Err(e) => {
                    unreadable.push(format!("cannot read {} of pid {pid} ({comm}): {e}", link().display()));
                    denied = Some(e);
                }
            }
        }
        if let (true, Some(e)) = (tasks.is_empty(), denied) {
            return Err(ProcReadIssue {
                pid,
                what: format!("cannot inspect pid {pid} ({comm}): reading its ns/mnt: {e}; its mounts and files are not seen"),
            });
        }
    }
    Ok(Some(ProcEntry {
        pid,
        comm,
        state: stat.state,
        ppid: u32::try_from(stat.ppid).unwrap_or(0),
        kthread,
        start_time: stat.starttime,
        vsize: stat.vsize,
        tasks,
        unreadable,
    }))
}

/// A process's `task` directory, opened once: its tasks listed, and each task's `ns/mnt` read
/// relative to it. A full scan at 400 namespaces of 20 threads reads 8,000 such links, and most
/// of a link's cost was walking `/proc/PID/task` again for each (`pid_revalidate` per part).
pub(crate) struct TaskDir(nix::dir::Dir);

impl TaskDir {
    /// The directory at `path` and its tasks' IDs, ascending.
    pub(crate) fn list(path: &Path) -> std::io::Result<(Self, Vec<u32>)> {
        use nix::fcntl::OFlag;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let mut dir = nix::dir::Dir::open(path, flags, nix::sys::stat::Mode::empty())?;
        let mut tids = Vec::new();
        for entry in dir.iter() {
            let entry = entry?;
            if let Some(tid) = entry.file_name().to_str().ok().and_then(|n| n.parse().ok()) {
                tids.push(tid);
            }
        }
        tids.sort_unstable();
        Ok((Self(dir), tids))
    }

    /// The text of task `tid`'s `ns/mnt` link.
    pub(crate) fn mount_ns_link(&self, tid: u32) -> std::io::Result<std::ffi::OsString> {
        Ok(nix::fcntl::readlinkat(&self.0, format!("{tid}/ns/mnt").as_str())?)
    }
}

/// Whether a task whose `ns/*` link read failed with EACCES is simply gone: the kernel answers
/// EACCES, not ENOENT, for the namespace link of a task reaped after its directory was listed
/// (`proc_ns_readlink` finds no task). Gone when its `stat` no longer resolves; a task still
/// there that denies us stays a blind spot.
pub(crate) fn reaped(e: &std::io::Error, task_dir: &Path) -> bool {
    e.kind() == std::io::ErrorKind::PermissionDenied
        && matches!(std::fs::symlink_metadata(task_dir.join("stat")), Err(ref g) if is_gone(g))
}

/// `comm` from a `stat` line: between the first `(` and the last `)` (the name itself may hold
/// parentheses, spaces and any byte but NUL).
pub fn stat_comm(stat: &[u8]) -> Option<&[u8]> {
    let open = memchr::memchr(b'(', stat)?;
    let close = memchr::memrchr(b')', stat)?;
    (close > open).then(|| &stat[open + 1..close])
}

/// The mount namespace of a task directory, from the text of its `ns/mnt` link.
pub fn task_mount_ns(task_dir: &Path) -> Option<MountNsId> {
    let link = std::fs::read_link(task_dir.join("ns/mnt")).ok()?;
    MountNsId::from_link(link.to_str()?)
}

/// Labels a holder process: command line (unless it is in D state, where reading it can block
/// on the target's mmap lock), container ID and pod UID.
pub fn describe(host: &HostRoot, entry: &ProcEntry) -> ProcessInfo {
    let dir = host.proc_pid(entry.pid);
    let cmdline = if entry.state == 'D' { None } else { read_cmdline(&dir.join("cmdline")) };
    // A cgroup name can be any bytes; container IDs and pod UIDs are ASCII.
    let id = std::fs::read(dir.join("cgroup"))
        .map(|b| cgroup::identify(&String::from_utf8_lossy(&b)))
        .unwrap_or_default();
    ProcessInfo {
        pid: entry.pid,
        comm: entry.comm.clone(),
        cmdline,
        state: entry.state,
        container_id: id.container_id,
        pod_uid: id.pod_uid,
    }
}

fn read_cmdline(path: &Path) -> Option<KernelText> {
    let mut buf = Vec::with_capacity(256);
    std::fs::File::open(path).ok()?.take(CMDLINE_MAX as u64).read_to_end(&mut buf).ok()?;
    Some(cmdline_text(buf))
}

/// A `cmdline` as one line: trailing NULs dropped, the others turned into spaces.
pub fn cmdline_text(mut buf: Vec<u8>) -> KernelText {
    while buf.last() == Some(&0) {
        buf.pop();
    }
    for b in &mut buf {
        if *b == 0 {
            *b = b' ';
        }
    }
    KernelText::from_bytes(buf)
}

/// True when a kernel thread's name says it serves `device` (`jbd2/loop0-8`, `rbd3-task`,
/// `kdmflush/253:0`): the device name or `MAJ:MIN` as a whole token.
pub fn kthread_serves(comm: &str, device: &str, devnum: &str) -> bool {
    token_in(comm, device) || token_in(comm, devnum)
}

/// The filesystem type whose journal or writeback kernel thread this is, when it serves
/// `device`: `jbd2/loop0-8` (ext4), `xfsaild/dm-3` and `xfs-buf/dm-3` (xfs), `f2fs_gc-7:0` (f2fs).
/// Such a thread lives exactly as long as a filesystem on the device, mounted or not. (Device
/// threads like `kdmflush/253:0` or `rbd3-task` serve the device itself, not a filesystem.)
pub fn fs_kthread_serves(comm: &str, device: &str, devnum: &str) -> Option<&'static str> {
    if !kthread_serves(comm, device, devnum) {
        return None;
    }
    if comm.starts_with("jbd2/") {
        Some("ext4")
    } else if comm.starts_with("xfs") {
        Some("xfs")
    } else if comm.starts_with("f2fs_") {
        Some("f2fs")
    } else {
        None
    }
}

fn token_in(hay: &str, needle: &str) -> bool {
    let boundary = |c: Option<char>| c.is_none_or(|c| !c.is_ascii_alphanumeric() && c != ':');
    hay.match_indices(needle).any(|(i, _)| {
        let before = hay[..i].chars().next_back();
        let after = hay[i + needle.len()..].chars().next();
        boundary(before) && boundary(after)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's EACCES for the namespace link of a task reaped after the link was looked up
    /// (as a scan that listed the task a moment before sees it) is told apart from a denial: the
    /// task is gone, so it is no blind spot. A task still alive is never called reaped.
    #[test]
    fn the_eacces_of_a_reaped_tasks_namespace_link_means_gone() {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: gettid has no preconditions.
            tx.send(unsafe { libc::gettid() } as u32).expect("send tid");
            stop_rx.recv().ok();
        });
        let tid = rx.recv().expect("tid");
        let task = Path::new("/proc/self/task").join(tid.to_string());
        let link = std::fs::File::options()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
            .open(task.join("ns/mnt"))
            .expect("open ns/mnt O_PATH");
        let read = |fd: &std::fs::File| {
            let mut buf = [0u8; 64];
            // SAFETY: `buf` is valid for its length; an empty path reads the fd's own link.
            let n =
                unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
            if n < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(n)
            }
        };
        assert!(read(&link).is_ok(), "the live task's link reads");
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert!(!reaped(&denied, &task), "a live task is not reaped");
        stop_tx.send(()).expect("stop");
        thread.join().expect("join");
        let e = read(&link).expect_err("the reaped task's link");
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "the kernel's answer for a reaped task: {e}");
        assert!(reaped(&e, &task), "gone, not a blind spot");
    }

    /// A light scan's known tasks of a process (same start time) stand for its task list while
    /// its thread count is theirs and they were all in one namespace; otherwise the list is
    /// read (a known task keeps its namespace, an unknown one is read).
    #[test]
    fn a_known_task_list_is_kept_only_at_the_same_count_in_one_namespace() {
        let host = HostRoot::default();
        let mut child = std::process::Command::new("sleep").arg("100").spawn().expect("spawn sleep");
        let pid = child.id();
        let fresh = read_entry(&host, pid).expect("readable").expect("alive");
        assert_eq!(fresh.tasks.len(), 1, "sleep has one thread: {:?}", fresh.tasks);
        let (real, other) = (fresh.tasks[0].1, MountNsId(u64::MAX));
        let read_with = |tasks: Vec<(u32, MountNsId)>| {
            let known: KnownTasks = [(pid, (fresh.start_time, tasks))].into();
            read_entry_knowing(&host, pid, Some(&known)).expect("readable").expect("alive").tasks
        };
        // A tid that is not there: the list was not read.
        let bogus = vec![(u32::MAX - 1, real)];
        assert_eq!(read_with(bogus.clone()), bogus, "the same count, one namespace: kept");
        let two = vec![(pid, other), (u32::MAX - 1, other)];
        assert_eq!(read_with(two), vec![(pid, other)], "another count: read, the known task kept");
        let known: KnownTasks = [(pid, (fresh.start_time + 1, bogus))].into();
        let e = read_entry_knowing(&host, pid, Some(&known)).expect("readable").expect("alive");
        assert_eq!(e.tasks, fresh.tasks, "another process (start time): read");
        let _ = child.kill();
        let _ = child.wait();

        // Two threads known in two namespaces, two threads now: the list is read.
        let py = "import threading, time\nthreading.Thread(target=time.sleep, args=(100,)).start()\ntime.sleep(100)";
        let Ok(mut child) = std::process::Command::new("python3").args(["-c", py]).spawn() else {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI has python3 (scripts/test.sh)");
            eprintln!("SKIPPED: no python3 for a process of two threads");
            return;
        };
        let pid = child.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let fresh = loop {
            let e = read_entry(&host, pid).expect("readable").expect("alive");
            if e.tasks.len() == 2 {
                break e;
            }
            assert!(std::time::Instant::now() < deadline, "the thread never started");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let split = vec![(u32::MAX - 2, real), (u32::MAX - 1, other)];
        let known: KnownTasks = [(pid, (fresh.start_time, split))].into();
        let e = read_entry_knowing(&host, pid, Some(&known)).expect("readable").expect("alive");
        assert_eq!(e.tasks, fresh.tasks, "two namespaces: read");
        let _ = child.kill();
        let _ = child.wait();
    }

    /// A thread in a mount namespace of its own (unshare(CLONE_NEWNS), which unshares its
    /// fs_struct too) is read with its own namespace; a thread sharing the leader's fs_struct
    /// (kcmp) is given the leader's, which its own link agrees with. Root only (unshare).
    #[test]
    fn a_thread_in_its_own_mount_namespace_is_seen() {
        use std::sync::mpsc;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: unshare(CLONE_NEWNS) needs root");
            return;
        }
        let host = HostRoot::default();
        let gettid = || {
            // SAFETY: gettid takes no arguments and cannot fail.
            unsafe { libc::syscall(libc::SYS_gettid) as u32 }
        };
        let (tx, rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let own = std::thread::spawn(move || {
            // SAFETY: unshare(CLONE_NEWNS) gives this thread a mount namespace of its own.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNS) }, 0, "unshare(CLONE_NEWNS)");
            tx.send(gettid()).expect("send");
            let _ = done_rx.recv();
        });
        let (stx, srx) = mpsc::channel();
        let (sdone_tx, sdone_rx) = mpsc::channel::<()>();
        let shared = std::thread::spawn(move || {
            stx.send(gettid()).expect("send");
            let _ = sdone_rx.recv();
        });
        let (own_tid, shared_tid) = (rx.recv().expect("tid"), srx.recv().expect("tid"));
        let me = std::process::id();
        let e = read_entry(&host, me).expect("readable").expect("alive");
        let ns_of = |tid: u32| e.tasks.iter().find(|(t, _)| *t == tid).map(|(_, ns)| *ns);
        let link = |tid: u32| task_mount_ns(&host.proc_task(me, tid));
        assert_eq!(ns_of(own_tid), link(own_tid), "its own namespace, as its link says");
        assert_ne!(ns_of(own_tid), ns_of(me), "not the leader's");
        assert_eq!(ns_of(shared_tid), ns_of(me), "a thread sharing the leader's fs_struct");
        assert_eq!(ns_of(shared_tid), link(shared_tid), "which its own link agrees with");
        done_tx.send(()).expect("done");
        sdone_tx.send(()).expect("done");
        own.join().expect("join");
        shared.join().expect("join");
    }

    #[test]
    fn kernel_thread_names() {
        assert!(kthread_serves("jbd2/loop0-8", "loop0", "7:0"));
        assert!(kthread_serves("rbd3-task", "rbd3", "252:48"));
        assert!(kthread_serves("kdmflush/253:0", "dm-0", "253:0"));
        assert!(!kthread_serves("jbd2/loop01-8", "loop0", "7:0"));
        assert!(!kthread_serves("kdmflush/253:01", "dm-0", "253:0"));
        assert!(!kthread_serves("ext4-rsv-conver", "loop0", "7:0"));
        assert_eq!(fs_kthread_serves("jbd2/loop0-8", "loop0", "7:0"), Some("ext4"));
        assert_eq!(fs_kthread_serves("xfsaild/dm-3", "dm-3", "253:3"), Some("xfs"));
        assert_eq!(fs_kthread_serves("f2fs_gc-7:0", "loop0", "7:0"), Some("f2fs"));
        assert_eq!(fs_kthread_serves("kdmflush/253:0", "dm-0", "253:0"), None, "a device thread");
        assert_eq!(fs_kthread_serves("rbd3-task", "rbd3", "252:48"), None);
        assert_eq!(fs_kthread_serves("jbd2/loop01-8", "loop0", "7:0"), None);
    }

    #[test]
    fn comm_and_cmdline_are_bytes() {
        let mut stat = b"4242 (a) (".to_vec();
        stat.push(0xff);
        stat.extend_from_slice(b" x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 100 1000 10");
        assert_eq!(stat_comm(&stat), Some(&b"a) (\xff x)"[..]));
        assert_eq!(stat_comm(b"1 (init) S"), Some(&b"init"[..]));
        assert_eq!(stat_comm(b"garbage"), None);
        assert_eq!(stat_comm(b"1 )( S"), None);
        let c = cmdline_text(b"sleep\0d\xff\0\0".to_vec());
        assert_eq!(c.as_bytes(), b"sleep d\xff");
        assert_eq!(c.escaped(), r"sleep d\xff");
    }

    #[test]
    fn reads_this_process() {
        let host = HostRoot::default();
        let me = std::process::id();
        let e = read_entry(&host, me).expect("readable").expect("alive");
        assert!(!e.kthread);
        assert!(e.tasks.iter().any(|(t, _)| *t == me));
        let info = describe(&host, &e);
        assert!(info.cmdline.is_some());
        assert!(read_entry(&host, u32::MAX - 1).expect("no error").is_none());
    }
}
