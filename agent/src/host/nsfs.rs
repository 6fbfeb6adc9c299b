//! The host's mount namespaces as the kernel lists them (`NS_MNT_GET_NEXT`/`PREV` on an nsfs
//! file, Linux 6.12): each by its 64-bit ID and the inode of its `ns/mnt` file, without going
//! through any process (`snapshot::task_namespace_cache` compares two such lists).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

use super::sys::mount_api::mntns_id;

/// `struct mnt_ns_info` from `<linux/nsfs.h>` (`MNT_NS_INFO_SIZE_VER0`).
#[repr(C)]
struct MntNsInfo {
    size: u32,
    nr_mounts: u32,
    mnt_ns_id: u64,
}
/// `_IOR(0xb7, 11, struct mnt_ns_info)` and `_IOR(0xb7, 12, ...)` (Linux 6.12).
const NS_MNT_GET_NEXT: libc::c_ulong = 0x8010_b70b;
const NS_MNT_GET_PREV: libc::c_ulong = 0x8010_b70c;

/// One mount namespace of the host: its 64-bit ID (never reused within a boot) and the
/// inode of its `ns/mnt` file (what `readlink` shows, which a later namespace may reuse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NsName {
    pub id: u64,
    pub inode: u64,
}

/// Every mount namespace the kernel lets this process name, walking its list of them from
/// the namespace of `start` both ways (`NS_MNT_GET_NEXT`/`PREV`, each step an fd of the
/// next namespace, closed after). Sorted by ID. The kernel leaves out namespaces whose owner
/// this process lacks `CAP_SYS_ADMIN` over and those being torn down; before 6.12 the call
/// is unsupported ([`super::sys::mount_api::is_unsupported`]).
pub fn namespaces(start: BorrowedFd<'_>) -> io::Result<Vec<NsName>> {
    use std::os::fd::{AsFd, FromRawFd, OwnedFd};
    let name = |fd: BorrowedFd<'_>, id: u64| -> io::Result<NsName> {
        let st = nix::sys::stat::fstat(fd).map_err(io::Error::from)?;
        Ok(NsName { id, inode: st.st_ino })
    };
    let mut out = vec![name(start, mntns_id(start)?)?];
    for step in [NS_MNT_GET_NEXT, NS_MNT_GET_PREV] {
        let mut here: Option<OwnedFd> = None;
        loop {
            let mut info = MntNsInfo { size: 16, nr_mounts: 0, mnt_ns_id: 0 };
            let from = here.as_ref().map_or(start, |f| f.as_fd());
            // SAFETY: the fd is open for the call; the kernel writes one mnt_ns_info into
            // `info` and returns a new fd it hands over to us, or -1.
            let fd = unsafe { libc::ioctl(from.as_raw_fd(), step as _, &mut info as *mut MntNsInfo) };
            if fd < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOENT) {
                    break; // the end of the list
                }
                return Err(e);
            }
            // SAFETY: the kernel just returned this fd; nothing else owns it.
            let next = unsafe { OwnedFd::from_raw_fd(fd) };
            out.push(name(next.as_fd(), info.mnt_ns_id)?);
            here = Some(next);
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the live kernel (root, Linux 6.12+): the kernel's list of mount namespaces has a new
    /// one, by ID and inode, while it exists, and not after it went away.
    #[test]
    fn the_kernel_lists_every_mount_namespace() {
        use std::os::fd::AsFd;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIPPED: needs root (a mount namespace of its own)");
            return;
        }
        let list = || {
            let me = std::fs::File::open("/proc/self/ns/mnt").expect("ns file");
            namespaces(me.as_fd())
        };
        if let Err(e) = list() {
            assert!(crate::host::sys::mount_api::is_unsupported(&e), "{e}");
            eprintln!("SKIPPED: this kernel does not list mount namespaces ({e})");
            return;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        crate::host::sys::tests::in_private_mount_namespace(move || {
            let ns = std::fs::File::open("/proc/thread-self/ns/mnt").expect("ns file");
            let id = mntns_id(ns.as_fd()).expect("id");
            let inode = nix::sys::stat::fstat(&ns).expect("fstat").st_ino;
            let name = NsName { id, inode };
            assert!(list().expect("list").contains(&name), "{name:?} listed while it exists");
            tx.send(name).expect("send");
        });
        let gone = rx.recv().expect("name");
        // The thread is joined before the kernel drops its namespaces (`do_exit` wakes the joiner
        // first): give it a moment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while list().expect("list").iter().any(|n| n.id == gone.id) {
            assert!(std::time::Instant::now() < deadline, "{gone:?} still listed 5 s after it went away");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
