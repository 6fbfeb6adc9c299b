//! Thin, safe wrappers over the few syscalls no crate covers the way we need them.
//!
//! `statx(AT_STATX_DONT_SYNC)` lets us stat `/proc/PID/fd/N` and friends without asking a FUSE
//! daemon or an NFS server for fresh attributes: a hung server must not hang the scan. The loop
//! ioctls read and clear a loop device's binding.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::model::DevNum;

/// What a scan needs from a stat: where the file lives, and what device it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// Device of the filesystem holding the file (`st_dev`).
    pub dev: DevNum,
    /// The device a device node stands for (`st_rdev`); meaningful for block/char nodes only.
    pub rdev: DevNum,
    pub ino: u64,
    pub mode: u32,
}

impl FileId {
    pub fn is_block_device(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFBLK
    }
}

fn cpath(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// `statx(path)` following links, from cached attributes only (`AT_STATX_DONT_SYNC`).
pub fn stat_cached(path: &Path) -> io::Result<FileId> {
    let c = cpath(path)?;
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call, and `buf` points to
    // writable memory the size of `struct statx`.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_STATX_DONT_SYNC,
            libc::STATX_TYPE | libc::STATX_INO,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx returned 0, so it filled in the buffer.
    let s = unsafe { buf.assume_init() };
    Ok(FileId {
        dev: DevNum::new(s.stx_dev_major, s.stx_dev_minor),
        rdev: DevNum::new(s.stx_rdev_major, s.stx_rdev_minor),
        ino: s.stx_ino,
        mode: u32::from(s.stx_mode),
    })
}

/// The ID of the mount an open file (or `O_PATH` fd) lives on: what mountinfo's first field
/// says of that mount.
pub fn mount_id(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: the empty path is a valid NUL-terminated string, the fd is open for the call, and
    // `buf` is writable memory the size of `struct statx`.
    let rc = unsafe {
        libc::statx(
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_MNT_ID,
            buf.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: statx returned 0, so it filled in the buffer.
    let s = unsafe { buf.assume_init() };
    if s.stx_mask & libc::STATX_MNT_ID == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    Ok(s.stx_mnt_id)
}

/// `KCMP_FS` from `<linux/kcmp.h>`: compare the tasks' `fs_struct` (root, cwd, umask).
const KCMP_FS: libc::c_int = 3;

/// Whether two tasks (TIDs in this process's PID namespace) share one `fs_struct`, so they have
/// the same working directory and root by construction: `kcmp(KCMP_FS)`, which compares the
/// kernel's pointers without any path walk. Threads share it unless created without `CLONE_FS`
/// or they called `unshare(CLONE_FS)`/`setns`. Errors: `ENOSYS` (no `CONFIG_KCMP`), `EPERM` (no
/// ptrace access), `ESRCH` (a task is gone).
pub fn same_fs_context(tid1: u32, tid2: u32) -> io::Result<bool> {
    let (a, b) = (libc::pid_t::try_from(tid1), libc::pid_t::try_from(tid2));
    let (Ok(a), Ok(b)) = (a, b) else { return Err(io::Error::from_raw_os_error(libc::ESRCH)) };
    // SAFETY: kcmp takes two pids, a type and two unused (for KCMP_FS) integers; no memory.
    let rc = unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_FS, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc == 0)
}

/// `struct loop_info64` from `<linux/loop.h>`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct LoopInfo64 {
    pub lo_device: u64,
    pub lo_inode: u64,
    pub lo_rdevice: u64,
    pub lo_offset: u64,
    pub lo_sizelimit: u64,
    pub lo_number: u32,
    pub lo_encrypt_type: u32,
    pub lo_encrypt_key_size: u32,
    pub lo_flags: u32,
    pub lo_file_name: [u8; 64],
    pub lo_crypt_name: [u8; 64],
    pub lo_encrypt_key: [u8; 32],
    pub lo_init: [u64; 2],
}

const LOOP_CLR_FD: libc::c_ulong = 0x4C01;
const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// `LOOP_GET_STATUS64` on an open loop device. `ENXIO` means the device is not bound.
pub fn loop_get_status(fd: BorrowedFd<'_>) -> io::Result<LoopInfo64> {
    let mut info = std::mem::MaybeUninit::<LoopInfo64>::zeroed();
    // SAFETY: the fd is open for the duration of the call and `info` is a writable
    // `struct loop_info64`, which is what LOOP_GET_STATUS64 fills in.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), LOOP_GET_STATUS64 as _, info.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the ioctl succeeded and filled the struct.
    Ok(unsafe { info.assume_init() })
}

/// `LOOP_CLR_FD`: unbinds the loop device. When others still have it open the kernel only sets
/// autoclear and returns success; callers must check sysfs afterwards.
pub fn loop_clear(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: LOOP_CLR_FD takes no argument; the fd is open for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), LOOP_CLR_FD as _, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `listmount(2)`/`statmount(2)` (Linux 6.8; other namespaces by ID since 6.11): the mount
/// table as data, without the kernel rendering mountinfo text. `NS_GET_MNTNS_ID` gives the ID.
pub mod mount_api {
    use std::io;
    use std::os::fd::{AsRawFd, BorrowedFd};

    use crate::model::DevNum;

    const SYS_STATMOUNT: libc::c_long = 457;
    const SYS_LISTMOUNT: libc::c_long = 458;
    /// `_IOR(0xb7, 0x5, __u64)` from `<linux/nsfs.h>`.
    const NS_GET_MNTNS_ID: libc::c_ulong = 0x8008_b705;
    /// `LSMT_ROOT`: list every mount of the namespace.
    const LSMT_ROOT: u64 = u64::MAX;
    const STATMOUNT_SB_BASIC: u64 = 0x1;
    /// `MNT_ID_REQ_SIZE_VER1`: the request with `mnt_ns_id`.
    const REQ_SIZE_VER1: u32 = 32;

    /// `struct mnt_id_req` (version 1).
    #[repr(C)]
    struct MntIdReq {
        size: u32,
        spare: u32,
        mnt_id: u64,
        param: u64,
        mnt_ns_id: u64,
    }

    /// The fixed part of `struct statmount` up to the fields we read, padded to the 512 bytes
    /// of the published struct so the kernel never finds the buffer short.
    #[repr(C)]
    struct StatmountBuf {
        size: u32,
        mnt_opts: u32,
        mask: u64,
        sb_dev_major: u32,
        sb_dev_minor: u32,
        sb_magic: u64,
        rest: [u64; 60],
    }

    /// True for errors meaning "this kernel does not offer the call": fall back to mountinfo.
    pub fn is_unsupported(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::ENOTTY | libc::EINVAL | libc::EOPNOTSUPP))
    }

    /// The 64-bit ID of the mount namespace behind an open `ns/mnt` file.
    pub fn mntns_id(ns: BorrowedFd<'_>) -> io::Result<u64> {
        let mut id: u64 = 0;
        // SAFETY: NS_GET_MNTNS_ID writes one u64 through the pointer, which is valid for the call.
        let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_MNTNS_ID as _, &mut id as *mut u64) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(id)
    }

    /// Every mount ID of namespace `ns_id`, paging through `listmount`.
    pub fn list(ns_id: u64) -> io::Result<Vec<u64>> {
        const PAGE: usize = 4096;
        let mut out: Vec<u64> = Vec::new();
        let mut last = 0u64;
        loop {
            let req =
                MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id: LSMT_ROOT, param: last, mnt_ns_id: ns_id };
            out.reserve(PAGE);
            let spare = out.spare_capacity_mut();
            // SAFETY: `req` is a valid mnt_id_req; the kernel writes at most PAGE u64s into the
            // vector's spare capacity, which holds at least PAGE elements.
            let n =
                unsafe { libc::syscall(SYS_LISTMOUNT, &req as *const MntIdReq, spare.as_mut_ptr(), PAGE, 0) };
            if n < 0 {
                return Err(io::Error::last_os_error());
            }
            let n = n as usize;
            // SAFETY: the kernel initialised the first `n` (<= PAGE) elements.
            unsafe { out.set_len(out.len() + n) };
            if n < PAGE {
                return Ok(out);
            }
            last = *out.last().unwrap_or(&0);
        }
    }

    /// The superblock device (`sb->s_dev`, mountinfo field 3) of one mount, and its filesystem's
    /// magic number (`BTRFS_SUPER_MAGIC`...).
    pub fn sb_dev(ns_id: u64, mnt_id: u64) -> io::Result<(DevNum, u64)> {
        let req =
            MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id, param: STATMOUNT_SB_BASIC, mnt_ns_id: ns_id };
        let mut buf = std::mem::MaybeUninit::<StatmountBuf>::zeroed();
        // SAFETY: `req` is valid; `buf` is writable for its full size, which we pass.
        let rc = unsafe {
            libc::syscall(
                SYS_STATMOUNT,
                &req as *const MntIdReq,
                buf.as_mut_ptr(),
                std::mem::size_of::<StatmountBuf>(),
                0,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: zero-initialised and then filled by the kernel; every bit pattern is valid.
        let b = unsafe { buf.assume_init() };
        if b.mask & STATMOUNT_SB_BASIC == 0 {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        Ok((DevNum::new(b.sb_dev_major, b.sb_dev_minor), b.sb_magic))
    }

    /// `BTRFS_SUPER_MAGIC` from `<linux/magic.h>`.
    pub const BTRFS_SUPER_MAGIC: u64 = 0x9123_683e;
}

/// The supplementary groups of the process at the other end of a unix socket, as the kernel
/// recorded them when it connected (`SO_PEERGROUPS`, Linux 4.13): unlike `/proc/PID/status`,
/// immune to the peer exiting and its pid being reused.
pub fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = libc::socklen_t::try_from(groups.len() * std::mem::size_of::<libc::gid_t>())
            .map_err(|_| io::Error::other("too many groups"))?;
        // SAFETY: the fd is open for the call; `groups` is writable for `len` bytes, and the
        // kernel writes at most `len` bytes and stores the size it needs (or wrote) in `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let n = usize::try_from(len).unwrap_or(0) / std::mem::size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ERANGE) && n > groups.len() {
            groups.resize(n, 0);
            continue;
        }
        return Err(e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cached_sees_files_and_devices() {
        let me = stat_cached(Path::new("/proc/self/exe")).expect("stat exe");
        assert!(!me.is_block_device());
        assert_eq!(
            stat_cached(Path::new("/nonexistent/x")).expect_err("missing").kind(),
            io::ErrorKind::NotFound
        );
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232, "struct loop_info64 is 232 bytes");
        let root = std::fs::File::open("/").expect("open /");
        let id = mount_id(std::os::fd::AsFd::as_fd(&root)).expect("statx mount id");
        let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
        let root_line = text.lines().find(|l| l.split(' ').nth(4) == Some("/")).expect("a mount on /");
        assert_eq!(root_line.split(' ').next().and_then(|f| f.parse::<u64>().ok()), Some(id), "{root_line}");
    }

    #[test]
    fn mount_api_agrees_with_mountinfo_when_available() {
        use std::os::fd::AsFd;
        let ns = std::fs::File::open("/proc/self/ns/mnt").expect("open ns");
        let id = match mount_api::mntns_id(ns.as_fd()) {
            Ok(id) => id,
            Err(e) if mount_api::is_unsupported(&e) => return, // older kernel: mountinfo is used
            Err(e) => panic!("NS_GET_MNTNS_ID: {e}"),
        };
        let ids = mount_api::list(id).expect("listmount");
        let text = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
        let mut from_text: Vec<DevNum> =
            crate::discover::mountinfo::parse(&text).expect("parse").iter().map(|m| m.devnum).collect();
        let mut from_api: Vec<DevNum> =
            ids.iter().map(|m| mount_api::sb_dev(id, *m).expect("statmount").0).collect();
        from_text.sort();
        from_api.sort();
        assert_eq!(from_api, from_text);
    }
}
