//! Mount-table change notifications from the kernel: fanotify marks on mount namespaces
//! (`FAN_MARK_MNTNS`, `FAN_MNT_ATTACH`/`FAN_MNT_DETACH`, Linux 6.15).
//!
//! One fanotify group watches every namespace (the kernel allows 128 groups per user, far fewer
//! than a node has namespaces). A mark is placed through an `ns/mnt` file that is opened and
//! closed right away: the mark does not keep the namespace alive (when its last process exits
//! the kernel detaches its mounts, reports them, and drops the mark), so the agent never pins a
//! namespace or a mount by watching it. An event names a mount by its unique 64-bit ID and the
//! task that made the change (`FAN_REPORT_TID`); which namespace it belongs to is for the caller
//! to work out (see `daemon::mount_watch`): the kernel's record names none.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;

/// `FAN_REPORT_MNT` from `<linux/fanotify.h>` (6.15): events carry a mount ID record.
const FAN_REPORT_MNT: libc::c_uint = 0x0000_4000;
/// `FAN_REPORT_TID`: an event's `pid` is the thread that caused it, not its process.
const FAN_REPORT_TID: libc::c_uint = 0x0000_0100;
/// `FAN_MARK_MNTNS`: the mark's object is a mount namespace (an `ns/mnt` fd).
const FAN_MARK_MNTNS: libc::c_uint = 0x0000_0110;
/// A mount was attached to the marked namespace.
pub const FAN_MNT_ATTACH: u64 = 0x0100_0000;
/// A mount was detached from the marked namespace (unmounted, moved, or the namespace died).
pub const FAN_MNT_DETACH: u64 = 0x0200_0000;
/// `FAN_EVENT_INFO_TYPE_MNT`: `struct fanotify_event_info_mnt { hdr; __u64 mnt_id; }`.
const FAN_EVENT_INFO_TYPE_MNT: u8 = 7;
/// `FAN_Q_OVERFLOW`: the queue overflowed and events were lost.
pub const FAN_Q_OVERFLOW: u64 = 0x0000_4000;

/// One mount event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountEvent {
    /// A mount attached, with the task that attached it (0: not known), which is usually, not
    /// always, in the mount's namespace: a hint to check, never an answer.
    Attached(u64, u32),
    Detached(u64),
    /// Events were lost: every namespace must be re-read.
    Overflow,
}

/// A fanotify group reporting mount events.
#[derive(Debug)]
pub struct MountEvents {
    fd: OwnedFd,
}

/// Why the kernel cannot report mount events (too old, no fanotify, no privilege): the caller
/// falls back to polling.
pub fn is_unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS | libc::EPERM | libc::EOPNOTSUPP))
}

impl MountEvents {
    /// Opens a non-blocking group (reporting thread IDs where the kernel allows it).
    pub fn new() -> io::Result<Self> {
        let init = |flags: libc::c_uint| {
            // SAFETY: plain fanotify_init(2) call; the returned fd is checked and owned below.
            unsafe {
                libc::fanotify_init(flags | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK, libc::O_RDONLY as _)
            }
        };
        let mut fd = init(FAN_REPORT_MNT | FAN_REPORT_TID);
        if fd < 0 {
            fd = init(FAN_REPORT_MNT);
        }
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, valid descriptor we own.
        Ok(Self { fd: unsafe { OwnedFd::from_raw_fd(fd) } })
    }

    /// Watches the mount namespace behind `ns_file` (an `ns/mnt` link or nsfs file). The file
    /// is closed before this returns.
    pub fn watch(&self, ns_file: &Path) -> io::Result<()> {
        let ns = std::fs::File::open(ns_file)?;
        self.watch_fd(ns.as_fd())
    }

    /// Watches the mount namespace behind an open `ns/mnt` fd.
    pub fn watch_fd(&self, ns: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: both fds are valid for the call; a NULL path is what FAN_MARK_MNTNS takes.
        let rc = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD | FAN_MARK_MNTNS,
                FAN_MNT_ATTACH | FAN_MNT_DETACH,
                ns.as_raw_fd(),
                std::ptr::null(),
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Reads the events queued now (none: `WouldBlock`).
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Vec<MountEvent>> {
        // SAFETY: buf is valid for writes of its length.
        let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(parse(&buf[..n as usize]))
    }
}

impl AsRawFd for MountEvents {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}

/// Parses a buffer of `struct fanotify_event_metadata` records, each followed by its info
/// records. A record too short or of an unknown version ends the parse (the rest is dropped,
/// and reported as an overflow so the caller re-reads everything rather than trusting less).
pub fn parse(mut buf: &[u8]) -> Vec<MountEvent> {
    const META_LEN: usize = 24; // event_len u32, vers u8, reserved u8, metadata_len u16, mask u64, fd i32, pid i32
    let mut out = Vec::new();
    while buf.len() >= META_LEN {
        let event_len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let version = buf[4];
        let metadata_len = u16::from_ne_bytes([buf[6], buf[7]]) as usize;
        if version != libc::FANOTIFY_METADATA_VERSION || event_len < META_LEN || event_len > buf.len() {
            out.push(MountEvent::Overflow);
            return out;
        }
        let mask = u64::from_ne_bytes(buf[8..16].try_into().unwrap_or_default());
        let by = u32::try_from(i32::from_ne_bytes(buf[20..24].try_into().unwrap_or_default())).unwrap_or(0);
        if mask & FAN_Q_OVERFLOW != 0 {
            out.push(MountEvent::Overflow);
        }
        let mut info = &buf[metadata_len.min(event_len)..event_len];
        while info.len() >= 4 {
            let kind = info[0];
            let len = u16::from_ne_bytes([info[2], info[3]]) as usize;
            if len < 4 || len > info.len() {
                break;
            }
            // struct fanotify_event_info_mnt: the 4-byte header, 4 bytes of padding, the u64.
            if kind == FAN_EVENT_INFO_TYPE_MNT && len >= 16 {
                let id = u64::from_ne_bytes(info[8..16].try_into().unwrap_or_default());
                if mask & FAN_MNT_ATTACH != 0 {
                    out.push(MountEvent::Attached(id, by));
                }
                if mask & FAN_MNT_DETACH != 0 {
                    out.push(MountEvent::Detached(id));
                }
            }
            info = &info[len..];
        }
        buf = &buf[event_len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(mask: u64, mnt_id: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&40u32.to_ne_bytes()); // event_len: 24 + 16
        b.push(libc::FANOTIFY_METADATA_VERSION);
        b.push(0);
        b.extend_from_slice(&24u16.to_ne_bytes());
        b.extend_from_slice(&mask.to_ne_bytes());
        b.extend_from_slice(&(-1i32).to_ne_bytes()); // FAN_NOFD
        b.extend_from_slice(&42i32.to_ne_bytes()); // the thread that made the change
        b.push(FAN_EVENT_INFO_TYPE_MNT);
        b.push(0);
        b.extend_from_slice(&16u16.to_ne_bytes());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&mnt_id.to_ne_bytes());
        b
    }

    #[test]
    fn parses_attach_and_detach_records() {
        let mut buf = record(FAN_MNT_ATTACH, 0x8000_0000_0000_1234);
        buf.extend(record(FAN_MNT_DETACH, 7));
        assert_eq!(
            parse(&buf),
            vec![MountEvent::Attached(0x8000_0000_0000_1234, 42), MountEvent::Detached(7)]
        );
    }

    #[test]
    fn a_truncated_or_foreign_record_means_overflow() {
        let buf = record(FAN_MNT_ATTACH, 1);
        assert_eq!(parse(&buf[..30]), vec![MountEvent::Overflow]);
        let mut bad = buf.clone();
        bad[4] = 2; // another metadata version
        assert_eq!(parse(&bad), vec![MountEvent::Overflow]);
        assert_eq!(parse(&[]), vec![]);
    }

    /// On the live kernel (6.15+, root): a tmpfs mounted and unmounted in a private namespace
    /// created by a child is reported as one attach and one detach of the same mount ID.
    #[test]
    fn root_the_kernel_reports_a_mount_and_its_unmount() {
        let events = match MountEvents::new() {
            Ok(e) => e,
            Err(e) if is_unsupported(&e) => {
                eprintln!("skipped: the kernel cannot report mount events ({e})");
                return;
            }
            Err(e) => panic!("fanotify_init: {e}"),
        };
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        // A thread of our own, in a namespace of its own, mounts and unmounts a tmpfs.
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            use nix::sched::{unshare, CloneFlags};
            let dir = tempfile::tempdir().expect("tempdir");
            unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).expect("unshare");
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .expect("make private");
            let tid = nix::unistd::gettid();
            tx.send(format!("/proc/self/task/{tid}/ns/mnt")).expect("send");
            go_rx.recv().expect("go");
            nix::mount::mount(
                Some("tmpfs"),
                dir.path(),
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                None::<&str>,
            )
            .expect("mount tmpfs");
            nix::mount::umount(dir.path()).expect("umount");
        });
        let ns = rx.recv().expect("namespace path");
        events.watch(Path::new(&ns)).expect("mark the namespace");
        go_tx.send(()).expect("go");
        t.join().expect("mounting thread");
        let mut buf = vec![0u8; 4096];
        let got = events.read(&mut buf).expect("events are queued");
        let attached: Vec<(u64, u32)> = got
            .iter()
            .filter_map(|e| if let MountEvent::Attached(id, by) = e { Some((*id, *by)) } else { None })
            .collect();
        assert_eq!(attached.len(), 1, "{got:?}");
        // The event names the thread that mounted (FAN_REPORT_TID), the hint that places it.
        let tid: u32 = ns.split('/').nth(4).and_then(|t| t.parse().ok()).expect("the thread's id");
        assert_eq!(attached[0].1, tid, "{got:?}");
        let attached: Vec<u64> = attached.iter().map(|a| a.0).collect();
        assert!(got.contains(&MountEvent::Detached(attached[0])), "{got:?}");
    }
}
