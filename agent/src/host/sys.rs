//! Thin, safe wrappers over the few syscalls no crate covers the way we need them.
//!
//! `statx(AT_STATX_DONT_SYNC)` lets us stat `/proc/PID/fd/N` and friends without asking a FUSE
//! daemon or an NFS server for fresh attributes: a hung server must not hang the scan. The loop
//! ioctls read and clear a loop device's binding; the nbd ones disconnect a device.

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
    /// The ID of the mount the file was reached through (mountinfo's first field), when the
    /// kernel gave it (`STATX_MNT_ID`, Linux 5.8). For a file on btrfs this is what ties it to
    /// its filesystem: its `st_dev` is the subvolume's anonymous number, which no mount table
    /// shows (gotcha 23).
    pub mnt_id: Option<u64>,
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
    statx_id(libc::AT_FDCWD, &c, 0)
}

/// `statx(AT_STATX_DONT_SYNC)` of `dirfd` + `path` (`AT_EMPTY_PATH` in `flags` with an empty
/// path: the fd itself), asking for the type, inode and mount ID.
fn statx_id(dirfd: libc::c_int, path: &std::ffi::CStr, flags: libc::c_int) -> io::Result<FileId> {
    let mut buf = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: `path` is a valid NUL-terminated string that outlives the call, `dirfd` is
    // AT_FDCWD or an fd the caller keeps open, and `buf` points to writable memory the size of
    // `struct statx`.
    let rc = unsafe {
        libc::statx(
            dirfd,
            path.as_ptr(),
            libc::AT_STATX_DONT_SYNC | flags,
            libc::STATX_TYPE | libc::STATX_INO | libc::STATX_MNT_ID,
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
        mnt_id: (s.stx_mask & libc::STATX_MNT_ID != 0).then_some(s.stx_mnt_id),
    })
}

/// [`stat_cached`] of an open fd (an `O_PATH` one will do).
pub fn stat_fd(fd: BorrowedFd<'_>) -> io::Result<FileId> {
    statx_id(fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH)
}

/// `struct open_how` from `<linux/openat2.h>` (libc's is `non_exhaustive`).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `path` as if `root` were `/`: `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` on
/// `root`, so `..` and absolute symlinks (`/var/lib/docker -> /data/docker` on the host) stay
/// inside it, which a plain walk of `/proc/1/root/...` does not do (an absolute symlink there
/// resolves in the caller's root). `flags` are `open(2)` flags (`O_CLOEXEC` is added).
pub fn open_in_root(root: &Path, path: &Path, flags: libc::c_int) -> io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(root)?;
    let rel = path.strip_prefix("/").unwrap_or(path);
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let c = cpath(rel)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: openat2 takes a directory fd kept open for the call, a NUL-terminated path that
    // outlives it, and a pointer to an `open_how` of the size passed.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            c.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: openat2 returned a new fd that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

/// [`stat_cached`] of `path` resolved with `root` as `/` ([`open_in_root`], `O_PATH`: the file
/// is not opened, no filesystem's `open` runs).
pub fn stat_in_root(root: &Path, path: &Path) -> io::Result<FileId> {
    use std::os::fd::AsFd;
    let fd = open_in_root(root, path, libc::O_PATH)?;
    stat_fd(fd.as_fd())
}

/// `BLKGETDISKSEQ` (`_IOR(0x12, 128, __u64)`, Linux 5.15).
const BLKGETDISKSEQ: libc::c_ulong = 0x8008_1280;

/// The disk sequence number of the open block device (`diskseq` in sysfs): unique per disk and
/// per loop binding within a boot, so it names the very binding the fd reached.
pub fn disk_seq(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut seq: u64 = 0;
    // SAFETY: the fd is open for the call and `seq` is the 8 writable bytes the ioctl encodes.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETDISKSEQ as _, &mut seq as *mut u64) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(seq)
}

/// `NS_GET_USERNS` (`_IO(0xb7, 0x1)`, `<linux/nsfs.h>`, Linux 4.9).
const NS_GET_USERNS: libc::c_ulong = 0xb701;

/// The inode of the user namespace that owns the namespace `ns` (an open `/proc/.../ns/*`
/// file): `NS_GET_USERNS` gives an fd of it, which is stat'ed and closed.
pub fn owning_user_ns(ns: BorrowedFd<'_>) -> io::Result<u64> {
    // SAFETY: the fd is open for the call; the ioctl takes no argument and returns a new fd.
    let rc = unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_USERNS as _) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    let owner = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(rc) };
    Ok(stat_fd(std::os::fd::AsFd::as_fd(&owner))?.ino)
}

/// `BTRFS_IOC_FS_INFO` (`_IOR(0x94, 31, struct btrfs_ioctl_fs_info_args)`, 1024 bytes).
const BTRFS_IOC_FS_INFO: libc::c_ulong = 0x8400_941f;

/// The fsid of the btrfs filesystem an open fd (not `O_PATH`) is on, as the kernel names the
/// filesystem's directory `/sys/fs/btrfs/<fsid>` (`BTRFS_IOC_FS_INFO`; the ioctl reads the
/// in-memory superblock: no I/O to the device). `ENOTTY`: not btrfs.
pub fn btrfs_fsid(fd: BorrowedFd<'_>) -> io::Result<[u8; 16]> {
    // struct btrfs_ioctl_fs_info_args: max_id u64, num_devices u64, fsid [u8; 16], ...
    let mut args = [0u64; 128];
    // SAFETY: the fd is open for the call, and `args` is 1024 writable bytes, the size the
    // ioctl number encodes.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), BTRFS_IOC_FS_INFO as _, args.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fsid = [0u8; 16];
    fsid[..8].copy_from_slice(&args[2].to_ne_bytes());
    fsid[8..].copy_from_slice(&args[3].to_ne_bytes());
    Ok(fsid)
}

/// An fsid as `/sys/fs/btrfs/` names it (`%pU`: lower-case 8-4-4-4-12).
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
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

/// `KCMP_FILE` and `KCMP_FS` from `<linux/kcmp.h>`: compare two tasks' open file descriptions
/// (`struct file`, by fd) or their `fs_struct` (root, cwd, umask).
const KCMP_FILE: libc::c_int = 0;
const KCMP_FS: libc::c_int = 3;

/// `kcmp(2)`: whether the kernel objects of `kind` (with the fds `idx1`, `idx2` for
/// `KCMP_FILE`) of tasks `tid1` and `tid2` are one object. Errors: `ENOSYS` (no
/// `CONFIG_KCMP`), `EPERM` (no ptrace access), `ESRCH` (a task is gone), `EBADF` (an fd is
/// closed).
fn kcmp(tid1: u32, tid2: u32, kind: libc::c_int, idx1: u32, idx2: u32) -> io::Result<bool> {
    let (a, b) = (libc::pid_t::try_from(tid1), libc::pid_t::try_from(tid2));
    let (Ok(a), Ok(b)) = (a, b) else { return Err(io::Error::from_raw_os_error(libc::ESRCH)) };
    let (i1, i2) = (libc::c_ulong::from(idx1), libc::c_ulong::from(idx2));
    // SAFETY: kcmp takes two pids, a type and two integers (fd numbers for KCMP_FILE, unused
    // for KCMP_FS); it reads no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_kcmp, a, b, kind, i1, i2) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc == 0)
}

/// Whether two tasks (TIDs in this process's PID namespace) share one `fs_struct`, so they have
/// the same working directory and root by construction: `kcmp(KCMP_FS)`, which compares the
/// kernel's pointers without any path walk. Threads share it unless created without `CLONE_FS`
/// or they called `unshare(CLONE_FS)`/`setns`. Errors: `ENOSYS` (no `CONFIG_KCMP`), `EPERM` (no
/// ptrace access), `ESRCH` (a task is gone).
pub fn same_fs_context(tid1: u32, tid2: u32) -> io::Result<bool> {
    kcmp(tid1, tid2, KCMP_FS, 0, 0)
}

/// Whether fd `fd1` of process `pid1` and fd `fd2` of process `pid2` (PIDs in this process's
/// PID namespace) are one open file description: `kcmp(KCMP_FILE)`. Fds made by `dup`, inherited
/// over `fork`, or passed over a unix socket (`SCM_RIGHTS`) share one, and the kernel counts one
/// open of the file for it, however many fds point at it. Errors as [`kcmp`]'s: `ESRCH` (a
/// process is gone), `EBADF` (an fd is closed), `EPERM`, `ENOSYS`.
pub fn same_open_file(pid1: u32, fd1: u32, pid2: u32, fd2: u32) -> io::Result<bool> {
    kcmp(pid1, pid2, KCMP_FILE, fd1, fd2)
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

const NBD_CLEAR_SOCK: libc::c_ulong = 0xab04;
const NBD_DISCONNECT: libc::c_ulong = 0xab08;

/// `NBD_DISCONNECT` on an open nbd device: asks the server to close the connection. `EINVAL`
/// means it is already disconnected.
pub fn nbd_disconnect(fd: BorrowedFd<'_>) -> io::Result<()> {
    nbd_request(fd, NBD_DISCONNECT)
}

/// `NBD_CLEAR_SOCK` on an open nbd device: drops the connection's socket. `EINVAL`: none.
pub fn nbd_clear_sock(fd: BorrowedFd<'_>) -> io::Result<()> {
    nbd_request(fd, NBD_CLEAR_SOCK)
}

fn nbd_request(fd: BorrowedFd<'_>, req: libc::c_ulong) -> io::Result<()> {
    // SAFETY: both nbd requests take no argument; the fd is open for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), req as _, 0) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `listmount(2)`/`statmount(2)` (Linux 6.8; other namespaces by ID since 6.11): the mount
/// table as data, without the kernel rendering mountinfo text. `NS_GET_MNTNS_ID` gives the ID.
/// Puts the calling thread in the idle class (`SCHED_IDLE`): it runs only on a core nothing
/// else wants, and any other thread that wakes takes the core from it at once. For background
/// passes (a new namespace's pass over every task, saving the memo file) that must not delay a
/// mount event on a node of two cores. Threads it starts inherit it. Falls back to nice 19 where
/// the class is refused. Lowering needs no privilege.
pub fn run_at_idle_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for SCHED_IDLE.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) } != 0 {
        // SAFETY: setpriority on this thread's own ID.
        unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
    }
}

#[path = "mount_api.rs"]
pub mod mount_api;

#[cfg(test)]
#[path = "sys_tests.rs"]
pub(crate) mod tests;
