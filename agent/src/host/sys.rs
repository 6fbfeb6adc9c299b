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

    /// The head of `struct statmount` up to the last field we read (`mnt_id_old`, bytes 56-59),
    /// 64 bytes. The kernel copies `min(bufsize, sizeof(struct statmount))` bytes and no strings
    /// are asked for, so a short buffer is the documented way to ask for less: copying and
    /// zeroing the whole 512-byte struct was about 5 % of a one-shot `holders` on the busy-node
    /// scene (200,000 calls).
    #[repr(C)]
    struct StatmountBuf {
        size: u32,
        mnt_opts: u32,
        mask: u64,
        sb_dev_major: u32,
        sb_dev_minor: u32,
        sb_magic: u64,
        rest: [u64; 4],
    }
    const _: () = assert!(std::mem::size_of::<StatmountBuf>() == 64);

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

    /// Whether mount namespace `ns_id` still exists: `false` only when the kernel says it does
    /// not (`ENOENT`); any other answer counts as "it may".
    pub fn ns_exists(ns_id: u64) -> bool {
        let req = MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id: LSMT_ROOT, param: 0, mnt_ns_id: ns_id };
        let mut one = [0u64; 1];
        // SAFETY: `req` is a valid mnt_id_req; the kernel writes at most one u64 into `one`.
        let n = unsafe { libc::syscall(SYS_LISTMOUNT, &req as *const MntIdReq, one.as_mut_ptr(), 1usize, 0) };
        !(n < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT))
    }

    /// The superblock device (`sb->s_dev`, mountinfo field 3) of one mount, and its filesystem's
    /// magic number (`BTRFS_SUPER_MAGIC`...).
    pub fn sb_dev(ns_id: u64, mnt_id: u64) -> io::Result<(DevNum, u64)> {
        sb_dev_with_old_id(ns_id, mnt_id).map(|(dev, magic, _)| (dev, magic))
    }

    /// Like [`sb_dev`], with the mount's mountinfo ID (`mnt_id_old`, field 1 of its line),
    /// which the same call gives at no extra cost.
    pub fn sb_dev_with_old_id(ns_id: u64, mnt_id: u64) -> io::Result<(DevNum, u64, u32)> {
        let req = MntIdReq {
            size: REQ_SIZE_VER1,
            spare: 0,
            mnt_id,
            param: STATMOUNT_SB_BASIC | STATMOUNT_MNT_BASIC,
            mnt_ns_id: ns_id,
        };
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
        let want = STATMOUNT_SB_BASIC | STATMOUNT_MNT_BASIC;
        if b.mask & want != want {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        // `mnt_id_old` is the first u32 of the u64 slot at byte 56 (`rest` starts at byte 32).
        let slot = b.rest[3].to_ne_bytes();
        let old = u32::from_ne_bytes([slot[0], slot[1], slot[2], slot[3]]);
        Ok((DevNum::new(b.sb_dev_major, b.sb_dev_minor), b.sb_magic, old))
    }

    /// `BTRFS_SUPER_MAGIC` from `<linux/magic.h>`.
    pub const BTRFS_SUPER_MAGIC: u64 = 0x9123_683e;

    const STATMOUNT_MNT_BASIC: u64 = 0x2;
    const STATMOUNT_PROPAGATE_FROM: u64 = 0x4;
    const STATMOUNT_MNT_ROOT: u64 = 0x8;
    const STATMOUNT_MNT_POINT: u64 = 0x10;
    const STATMOUNT_FS_TYPE: u64 = 0x20;
    const STATMOUNT_MNT_OPTS: u64 = 0x80;
    const STATMOUNT_FS_SUBTYPE: u64 = 0x100;
    const STATMOUNT_SB_SOURCE: u64 = 0x200;
    /// What [`stat_full`] asks for: everything a mountinfo line says.
    const FULL: u64 = STATMOUNT_SB_BASIC
        | STATMOUNT_MNT_BASIC
        | STATMOUNT_PROPAGATE_FROM
        | STATMOUNT_MNT_ROOT
        | STATMOUNT_MNT_POINT
        | STATMOUNT_FS_TYPE
        | STATMOUNT_MNT_OPTS
        | STATMOUNT_FS_SUBTYPE
        | STATMOUNT_SB_SOURCE;
    /// The part of the answer that every mountinfo field needs (`MNT_OPTS` and `FS_SUBTYPE` are
    /// left out of the answer's mask when the filesystem has none).
    const NEEDED: u64 = STATMOUNT_SB_BASIC
        | STATMOUNT_MNT_BASIC
        | STATMOUNT_PROPAGATE_FROM
        | STATMOUNT_MNT_ROOT
        | STATMOUNT_MNT_POINT
        | STATMOUNT_FS_TYPE
        | STATMOUNT_SB_SOURCE;
    /// The fixed part of `struct statmount` (`<linux/mount.h>`, Linux 6.13 and later); the
    /// strings follow it, each field naming an offset into them.
    const FIXED: usize = 512;

    /// One mount as `statmount` describes it: what a mountinfo line says, as data. Strings are
    /// the kernel's raw bytes (mountinfo escapes them; `statmount` does not).
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct MountStat {
        pub mnt_id_old: u32,
        pub parent_id_old: u32,
        pub dev: DevNum,
        pub sb_magic: u64,
        /// `SB_RDONLY`, `SB_SYNCHRONOUS`, `SB_DIRSYNC`, `SB_LAZYTIME`.
        pub sb_flags: u32,
        /// `MOUNT_ATTR_*`.
        pub mnt_attr: u64,
        /// `MS_SHARED`, `MS_SLAVE`, `MS_PRIVATE`, `MS_UNBINDABLE`.
        pub propagation: u64,
        pub peer_group: u64,
        pub master: u64,
        pub propagate_from: u64,
        pub root: Vec<u8>,
        /// Empty when the mount is not reachable from the namespace's root (mountinfo does not
        /// show such a mount).
        pub point: Vec<u8>,
        pub fs_type: Vec<u8>,
        pub fs_subtype: Option<Vec<u8>>,
        pub source: Vec<u8>,
        /// The filesystem's own options (`show_options`), `None` when it has none.
        pub fs_opts: Option<Vec<u8>>,
    }

    /// Everything `statmount` says of one mount of namespace `ns_id`. `EOPNOTSUPP` when the
    /// kernel left out a part mountinfo would show (kernels before 6.13 have no `SB_SOURCE`).
    pub fn stat_full(ns_id: u64, mnt_id: u64) -> io::Result<MountStat> {
        let req = MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id, param: FULL, mnt_ns_id: ns_id };
        BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            // Most answers fit in 4 KiB (the strings are a path or two, a type, a source and the
            // options); a longer one says EOVERFLOW and is asked again with more room.
            let mut len = 4 * 1024;
            loop {
                buf.resize(len, 0);
                // SAFETY: `req` is valid; `buf` is writable for `len` bytes, which we pass.
                let rc = unsafe {
                    libc::syscall(SYS_STATMOUNT, &req as *const MntIdReq, buf.as_mut_ptr(), len, 0)
                };
                if rc != 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::EOVERFLOW) && len < 1024 * 1024 {
                        len *= 4;
                        continue;
                    }
                    return Err(e);
                }
                return parse_full(&buf[..len]);
            }
        })
    }

    thread_local! {
        /// [`stat_full`]'s answer buffer, kept per thread (the confirmed turn asks about a few
        /// thousand mounts; the answer is read by byte offsets, so it needs no alignment).
        static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// Reads a `struct statmount` answer (native endianness), bounds-checked.
    fn parse_full(b: &[u8]) -> io::Result<MountStat> {
        let bad =
            |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("statmount answer: {what}"));
        let u32_at = |o: usize| b.get(o..o + 4).map(|s| u32::from_ne_bytes(s.try_into().unwrap_or_default()));
        let u64_at = |o: usize| b.get(o..o + 8).map(|s| u64::from_ne_bytes(s.try_into().unwrap_or_default()));
        let size = u32_at(0).ok_or_else(|| bad("short"))? as usize;
        let mask = u64_at(8).ok_or_else(|| bad("short"))?;
        if mask & NEEDED != NEEDED {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        let end = size.min(b.len());
        let string = |field: usize| -> io::Result<Vec<u8>> {
            let off = u32_at(field).ok_or_else(|| bad("short"))? as usize;
            let start = FIXED.checked_add(off).filter(|&s| s <= end).ok_or_else(|| bad("string offset"))?;
            let len = b[start..end].iter().position(|&c| c == 0).ok_or_else(|| bad("unterminated string"))?;
            Ok(b[start..start + len].to_vec())
        };
        let get = |o: usize| u64_at(o).ok_or_else(|| bad("short"));
        let get32 = |o: usize| u32_at(o).ok_or_else(|| bad("short"));
        Ok(MountStat {
            mnt_id_old: get32(56)?,
            parent_id_old: get32(60)?,
            dev: DevNum::new(get32(16)?, get32(20)?),
            sb_magic: get(24)?,
            sb_flags: get32(32)?,
            mnt_attr: get(64)?,
            propagation: get(72)?,
            peer_group: get(80)?,
            master: get(88)?,
            propagate_from: get(96)?,
            root: string(104)?,
            point: string(108)?,
            fs_type: string(36)?,
            fs_subtype: if mask & STATMOUNT_FS_SUBTYPE != 0 { Some(string(120)?) } else { None },
            source: string(124)?,
            fs_opts: if mask & STATMOUNT_MNT_OPTS != 0 { Some(string(4)?) } else { None },
        })
    }
}

#[cfg(test)]
#[path = "sys_tests.rs"]
pub(crate) mod tests;
