//! New mount namespaces, noticed when a process in one starts a program: the kernel's process
//! events (the netlink proc connector, `PROC_EVENT_EXEC`) name every `execve`, and a process
//! whose namespace is not watched yet has its namespace marked for mount events at once
//! ([`MountWatch::watch_new`]) and read in full by a re-read of that namespace and its processes
//! (`snapshot/new_namespace_read.rs`), not by a full scan of the host; what that re-read cannot read
//! as completely as a full scan would, it refuses, and a full scan runs instead.
//!
//! The namespace's processes are found by a pass over every task on the host (a process can
//! join a namespace without starting a program): about 11 ms at 200 namespaces, made here on a
//! thread of its own at the lowest priority before the read is asked for
//! ([`crate::snapshot::new_namespace_read::processes_in`]), so that a pod's start holds up neither the mount events
//! of other namespaces in the scanner's queue nor the scanner on the node's cores.
//! Until the read is asked for, the namespace is awaited ([`AgentState::await_new_namespaces`]):
//! a mount event in it is left to that read, which comes after and reads the whole table.
//!
//! Without this, a namespace made since the last full scan (a pod that just started: the
//! runtime makes the namespace, mounts the pod's root and volumes in it, then starts the
//! container's program) is not watched, so mounts made in it are not reported until the next
//! periodic full scan. Marking before the namespace is read means a mount made after that read
//! is reported, and one made before it is in the read. Until a full scan reads the namespace, a
//! program started in it has it read again [`SETTLE`] later (a pod's shell runs `mount` and
//! `mkdir`, then `exec`s its program: the program's maps, cwd and files, once it has opened
//! them; the programs started meanwhile share one read), and the namespace's first program has
//! it read once more [`FOLLOW_UP`] after it started. A namespace made by a process that never
//! calls `execve` afterwards (`unshare(2)` in a running program) is still found by the periodic
//! full scan only.
//!
//! The subscription asks the kernel for exec events alone (Linux 6.6 filters them; an older
//! kernel sends every process event, which are parsed and dropped). Needs `CAP_NET_ADMIN`; where
//! the socket cannot be opened, nothing changes from before.

use std::collections::HashSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::Interest;
use tokio::sync::watch;

use super::mount_watch::{MountWatch, Started};
use super::state::AgentState;
use crate::model::MountNsId;

/// `NETLINK_CONNECTOR` and the proc connector's IDs from `<linux/connector.h>`.
const NETLINK_CONNECTOR: libc::c_int = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
/// `PROC_CN_MCAST_LISTEN` from `<linux/cn_proc.h>`.
const PROC_CN_MCAST_LISTEN: u32 = 1;
/// `PROC_EVENT_EXEC`.
const PROC_EVENT_EXEC: u32 = 2;
/// `struct nlmsghdr` and `struct cn_msg` sizes.
const NLMSG_HDR: usize = 16;
const CN_MSG: usize = 20;

/// The proc connector socket, subscribed to exec events.
struct ProcEvents(OwnedFd);

impl AsRawFd for ProcEvents {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl ProcEvents {
    fn open() -> io::Result<Self> {
        // SAFETY: plain socket(2); the fd is checked and owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                NETLINK_CONNECTOR,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        let me = Self(unsafe { OwnedFd::from_raw_fd(fd) });
        // SAFETY: sockaddr_nl is plain data; all-zero is a valid value before the fields are set.
        let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        addr.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        addr.nl_groups = CN_IDX_PROC;
        // SAFETY: addr is a valid sockaddr_nl of the length given.
        let rc = unsafe {
            libc::bind(
                fd,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let msg = listen_message();
        // SAFETY: msg is valid for reads of its length; the socket is bound.
        let n = unsafe { libc::send(fd, msg.as_ptr().cast(), msg.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(me)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::recv(self.0.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n as usize)
    }
}

/// `nlmsghdr` + `cn_msg` + `struct proc_input { PROC_CN_MCAST_LISTEN, PROC_EVENT_EXEC }`.
fn listen_message() -> Vec<u8> {
    let payload = 8u16;
    let len = (NLMSG_HDR + CN_MSG) as u32 + u32::from(payload);
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid
    m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
    m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // ack
    m.extend_from_slice(&payload.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes()); // flags
    m.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
    m.extend_from_slice(&PROC_EVENT_EXEC.to_ne_bytes());
    m
}

/// The processes (thread group IDs) that called `execve`, from one datagram of netlink
/// messages; anything short or foreign is skipped.
pub fn exec_pids(mut buf: &[u8]) -> Vec<u32> {
    let u32_at = |b: &[u8], i: usize| b.get(i..i + 4).map(|s| u32::from_ne_bytes([s[0], s[1], s[2], s[3]]));
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR {
        let len = u32_at(buf, 0).unwrap_or(0) as usize;
        if len < NLMSG_HDR || len > buf.len() {
            break;
        }
        let msg = &buf[NLMSG_HDR..len];
        // cn_msg, then proc_event { what, cpu, timestamp_ns, exec { process_pid, process_tgid } }.
        let ev = msg.get(CN_MSG..).unwrap_or_default();
        if u32_at(msg, 0) == Some(CN_IDX_PROC) && u32_at(ev, 0) == Some(PROC_EVENT_EXEC) {
            if let Some(tgid) = u32_at(ev, 20) {
                out.push(tgid);
            }
        }
        // Messages are 4-byte aligned (NLMSG_ALIGN).
        let next = (len + 3) & !3;
        buf = buf.get(next..).unwrap_or_default();
    }
    out
}

/// Watches for processes starting programs in mount namespaces not watched yet, until
/// `shutdown`; returns at once where the kernel's process events cannot be had.
pub async fn run(state: Arc<AgentState>, watch: Arc<MountWatch>, mut shutdown: watch::Receiver<bool>) {
    let events = match ProcEvents::open() {
        Ok(e) => e,
        Err(e) => {
            tracing::info!("no process events ({e}): a namespace made since the last full scan is watched from the next one");
            return;
        }
    };
    let fd = match super::triggers::register(events, Interest::READABLE) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot poll process events ({e})");
            return;
        }
    };
    tracing::info!("watching for programs started in new mount namespaces (proc connector)");
    let mut buf = vec![0u8; 16 * 1024];
    let settling = Settling::default();
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { return };
                let mut new = Vec::new();
                let mut full = None;
                loop {
                    match fd.get_ref().recv(&mut buf) {
                        Ok(n) => {
                            for pid in exec_pids(&buf[..n]) {
                                match watch.watch_new(pid) {
                                    Started::Known => {}
                                    Started::New { id, ns_id, fresh } => new.push((id, ns_id, pid, fresh)),
                                    Started::Unwatchable => full = Some("a new mount namespace cannot be watched"),
                                }
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            // ENOBUFS: events were lost; a full scan finds what they named.
                            tracing::debug!("process events: {e}; scanning in full");
                            full = Some("process events were lost");
                            break;
                        }
                    }
                }
                guard.clear_ready();
                if let Some(why) = full {
                    tracing::debug!("{why}: scanning in full");
                    state.request_rescan("namespace");
                }
                if !new.is_empty() {
                    tracing::debug!(?new, "programs started in mount namespaces no full scan has read");
                    let fresh: Vec<(MountNsId, u64)> =
                        new.iter().filter(|n| n.3).map(|&(id, ns_id, _, _)| (id, ns_id)).collect();
                    ask_for(&state, fresh);
                    for (id, ns_id, pid, fresh) in new {
                        if fresh {
                            read_later(&state, FOLLOW_UP, (id, ns_id, pid), None);
                        }
                        if settling.lock().unwrap_or_else(|p| p.into_inner()).insert(id) {
                            read_later(&state, SETTLE, (id, ns_id, pid), Some(Arc::clone(&settling)));
                        }
                    }
                }
            }
        }
    }
}

/// Namespaces with a read asked for within [`SETTLE`].
type Settling = Arc<std::sync::Mutex<HashSet<MountNsId>>>;

/// How long after a program started in a new namespace that namespace is read again (what the
/// program opened, mapped or changed to once started); programs started meanwhile share it.
const SETTLE: Duration = Duration::from_millis(100);
/// When a new namespace is read once more after its first program started.
const FOLLOW_UP: Duration = Duration::from_millis(1000);

/// Asks for namespace `started` (`(inode, 64-bit ID, pid)`) to be read again `after` from now
/// (taking it out of `settling` then), if it still exists (one that ended meanwhile is dropped
/// by the mount watch, whose events say its mounts were detached).
fn read_later(
    state: &Arc<AgentState>,
    after: Duration,
    started: (MountNsId, u64, u32),
    settling: Option<Settling>,
) {
    let state = Arc::clone(state);
    tokio::spawn(async move {
        tokio::time::sleep(after).await;
        let (id, ns_id, pid) = started;
        if let Some(s) = settling {
            s.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        }
        tracing::trace!(pid, "reading again the namespace {id} a program started in");
        ask_for(&state, vec![(id, ns_id)]);
    });
}

/// One pass over every task at a time: a burst of pods waits its turn rather than starting a
/// thread (and its helpers) each.
static PASS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// Asks for the read in full of the new namespaces `ids` (`(inode, 64-bit ID)`) that still
/// exist, with the processes found in each by a pass over every task on the host, made here on
/// a thread of its own at the lowest priority ([`PASS`]: one at a time) and not on the
/// scanner's path: a mount event elsewhere meanwhile is read at once, and one in these
/// namespaces is left to their read ([`AgentState::await_new_namespaces`]). When the pass
/// cannot read a task, a full scan.
fn ask_for(state: &Arc<AgentState>, ids: Vec<(MountNsId, u64)>) {
    use crate::host::sys::mount_api::ns_exists;
    let ids: Vec<(MountNsId, u64)> = ids.into_iter().filter(|&(_, ns_id)| ns_exists(ns_id)).collect();
    if ids.is_empty() {
        return;
    }
    state.await_new_namespaces(ids.iter().map(|(id, _)| *id));
    let state = Arc::clone(state);
    tokio::spawn(async move {
        let inodes: Vec<MountNsId> = ids.iter().map(|(id, _)| *id).collect();
        let me = Arc::clone(&state);
        let wanted: HashSet<MountNsId> = inodes.iter().copied().collect();
        let _turn = PASS.acquire().await.ok(); // never closed
        let (tx, rx) = tokio::sync::oneshot::channel();
        // A thread of its own in the idle class, and one only (the pass is not spread over the
        // cores): on a busy node of two cores it never holds both, and the scanner, whose mount
        // events come first, takes a core from it the moment it wakes.
        let spawned = std::thread::Builder::new().name("bj-new-ns-pass".into()).spawn(move || {
            crate::host::sys::run_at_idle_priority();
            let _ = tx.send(me.find_processes_in(&wanted));
        });
        let found = match spawned {
            Ok(_) => rx.await.unwrap_or_else(|_| Err("the pass over every task stopped".into())),
            Err(e) => Err(format!("cannot start the pass over every task: {e}")),
        };
        match found {
            Ok(mut found) => {
                // One that ended meanwhile is dropped by the mount watch (its mounts detached).
                let gone: Vec<MountNsId> =
                    ids.iter().filter(|&&(_, ns_id)| !ns_exists(ns_id)).map(|(id, _)| *id).collect();
                found.retain(|id, _| !gone.contains(id));
                state.stop_awaiting(&gone);
                state.request_new_namespaces(found);
            }
            Err(why) => {
                tracing::debug!("{why}: scanning in full");
                state.stop_awaiting(&inodes);
                state.request_rescan("namespace");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec_message(tgid: u32) -> Vec<u8> {
        let mut m = Vec::new();
        let len = (NLMSG_HDR + CN_MSG + 24) as u32;
        m.extend_from_slice(&len.to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        m.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
        m.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
        m.extend_from_slice(&[0; 12]);
        m.extend_from_slice(&PROC_EVENT_EXEC.to_ne_bytes());
        m.extend_from_slice(&[0; 12]); // cpu, timestamp
        m.extend_from_slice(&(tgid + 1).to_ne_bytes()); // the thread
        m.extend_from_slice(&tgid.to_ne_bytes());
        m
    }

    #[test]
    fn exec_events_name_their_process() {
        let mut buf = exec_message(4242);
        buf.extend(exec_message(7));
        assert_eq!(exec_pids(&buf), vec![4242, 7]);
        // A fork event (what = 1) and a short buffer name nobody.
        let mut fork = exec_message(9);
        fork[NLMSG_HDR + CN_MSG] = 1;
        assert_eq!(exec_pids(&fork), Vec::<u32>::new());
        assert_eq!(exec_pids(&buf[..30]), Vec::<u32>::new());
    }

    #[test]
    fn the_subscription_asks_for_exec_events() {
        let m = listen_message();
        assert_eq!(m.len(), NLMSG_HDR + CN_MSG + 8);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().expect("four bytes")) as usize, m.len());
        assert_eq!(&m[m.len() - 8..m.len() - 4], &PROC_CN_MCAST_LISTEN.to_ne_bytes());
        assert_eq!(&m[m.len() - 4..], &PROC_EVENT_EXEC.to_ne_bytes());
    }
}
