//! `listmount(2)`, `statmount(2)` and `NS_GET_MNTNS_ID`: a mount namespace's mounts and what the
//! kernel says of each one, without rendering mountinfo text (Linux 6.8; other namespaces by ID
//! since 6.11). Each call is one `unsafe` block with its SAFETY comment; answers are read
//! bounds-checked.

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
        let n = unsafe { libc::syscall(SYS_LISTMOUNT, &req as *const MntIdReq, spare.as_mut_ptr(), PAGE, 0) };
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

/// How one mount receives propagation, and its parent: `(parent's unique ID, mnt_peer_group,
/// mnt_master)`, from `STATMOUNT_MNT_BASIC` alone, read into a 96-byte buffer (no strings: about
/// a quarter of [`stat_paths`]). A mount that is neither shared nor a slave (both 0) is private.
pub fn propagation(ns_id: u64, mnt_id: u64) -> io::Result<(u64, u64, u64)> {
    /// `struct statmount` up to `mnt_master` (bytes 88-95), as u64 slots.
    #[repr(C)]
    struct Head([u64; 12]);
    let req =
        MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id, param: STATMOUNT_MNT_BASIC, mnt_ns_id: ns_id };
    let mut buf = std::mem::MaybeUninit::<Head>::zeroed();
    // SAFETY: `req` is valid; `buf` is writable for its full size, which we pass.
    let rc = unsafe {
        libc::syscall(
            SYS_STATMOUNT,
            &req as *const MntIdReq,
            buf.as_mut_ptr(),
            std::mem::size_of::<Head>(),
            0,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zero-initialised and then filled by the kernel; every bit pattern is valid.
    let Head(h) = unsafe { buf.assume_init() };
    if h[1] & STATMOUNT_MNT_BASIC == 0 {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    // mask at byte 8; mnt_parent_id at 48, mnt_peer_group at 80, mnt_master at 88.
    Ok((h[6], h[10], h[11]))
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
    ask(ns_id, mnt_id, FULL, parse_full)
}

/// What [`stat_paths`] asks for.
const PATHS: u64 = STATMOUNT_MNT_BASIC | STATMOUNT_MNT_ROOT | STATMOUNT_MNT_POINT;

/// Where one mount is and whether it receives propagation: the part of `statmount` a pin risk
/// (`discover::pin_risk`) is judged by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountPaths {
    /// The unique ID of its parent (its own for a namespace's root).
    pub parent: u64,
    /// `mnt_peer_group`: the peer group when it is shared, else 0.
    pub peer_group: u64,
    /// `mnt_master`: the group it is a slave of, else 0.
    pub master: u64,
    /// Its root within its filesystem.
    pub root: Vec<u8>,
    /// Its mount point relative to the namespace's root; empty when not reachable from it.
    pub point: Vec<u8>,
}

/// Where mount `mnt_id` of namespace `ns_id` is ([`MountPaths`]); Linux 6.8.
pub fn stat_paths(ns_id: u64, mnt_id: u64) -> io::Result<MountPaths> {
    ask(ns_id, mnt_id, PATHS, |b| {
        let r = Reader::new(b, PATHS)?;
        Ok(MountPaths {
            parent: r.u64_at(48)?,
            peer_group: r.u64_at(80)?,
            master: r.u64_at(88)?,
            root: r.string(104)?,
            point: r.string(108)?,
        })
    })
}

/// Asks `statmount` for `param` about one mount and reads the answer with `parse`. The answer
/// buffer grows on `EOVERFLOW`.
fn ask<T>(ns_id: u64, mnt_id: u64, param: u64, parse: impl Fn(&[u8]) -> io::Result<T>) -> io::Result<T> {
    let req = MntIdReq { size: REQ_SIZE_VER1, spare: 0, mnt_id, param, mnt_ns_id: ns_id };
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        // Most answers fit in 4 KiB (the strings are a path or two, a type, a source and the
        // options); a longer one says EOVERFLOW and is asked again with more room.
        let mut len = 4 * 1024;
        loop {
            buf.resize(len, 0);
            // SAFETY: `req` is valid; `buf` is writable for `len` bytes, which we pass.
            let rc =
                unsafe { libc::syscall(SYS_STATMOUNT, &req as *const MntIdReq, buf.as_mut_ptr(), len, 0) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EOVERFLOW) && len < 1024 * 1024 {
                    len *= 4;
                    continue;
                }
                return Err(e);
            }
            return parse(&buf[..len]);
        }
    })
}

/// A `struct statmount` answer (native endianness), read bounds-checked.
struct Reader<'a> {
    b: &'a [u8],
    /// Where the strings end (the answer's `size`).
    end: usize,
    mask: u64,
}

impl<'a> Reader<'a> {
    /// The answer, once its mask holds every part of `needed` (else `EOPNOTSUPP`).
    fn new(b: &'a [u8], needed: u64) -> io::Result<Self> {
        let mut r = Reader { b, end: 0, mask: 0 };
        let size = r.u32_at(0)? as usize;
        r.mask = r.u64_at(8)?;
        if r.mask & needed != needed {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        r.end = size.min(b.len());
        Ok(r)
    }

    fn bad(what: &str) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, format!("statmount answer: {what}"))
    }

    fn u32_at(&self, o: usize) -> io::Result<u32> {
        let s = self.b.get(o..o + 4).ok_or_else(|| Self::bad("short"))?;
        Ok(u32::from_ne_bytes(s.try_into().unwrap_or_default()))
    }

    fn u64_at(&self, o: usize) -> io::Result<u64> {
        let s = self.b.get(o..o + 8).ok_or_else(|| Self::bad("short"))?;
        Ok(u64::from_ne_bytes(s.try_into().unwrap_or_default()))
    }

    /// The string whose offset is the `u32` at `field`.
    fn string(&self, field: usize) -> io::Result<Vec<u8>> {
        let off = self.u32_at(field)? as usize;
        let start =
            FIXED.checked_add(off).filter(|&s| s <= self.end).ok_or_else(|| Self::bad("string offset"))?;
        let rest = &self.b[start..self.end];
        let len = rest.iter().position(|&c| c == 0).ok_or_else(|| Self::bad("unterminated string"))?;
        Ok(rest[..len].to_vec())
    }
}

thread_local! {
    /// [`stat_full`]'s answer buffer, kept per thread (the confirmed turn asks about a few
    /// thousand mounts; the answer is read by byte offsets, so it needs no alignment).
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads a [`stat_full`] answer.
fn parse_full(b: &[u8]) -> io::Result<MountStat> {
    let r = Reader::new(b, NEEDED)?;
    let optional = |bit: u64, field: usize| -> io::Result<Option<Vec<u8>>> {
        if r.mask & bit != 0 {
            r.string(field).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(MountStat {
        mnt_id_old: r.u32_at(56)?,
        parent_id_old: r.u32_at(60)?,
        dev: DevNum::new(r.u32_at(16)?, r.u32_at(20)?),
        sb_magic: r.u64_at(24)?,
        sb_flags: r.u32_at(32)?,
        mnt_attr: r.u64_at(64)?,
        propagation: r.u64_at(72)?,
        peer_group: r.u64_at(80)?,
        master: r.u64_at(88)?,
        propagate_from: r.u64_at(96)?,
        root: r.string(104)?,
        point: r.string(108)?,
        fs_type: r.string(36)?,
        fs_subtype: optional(STATMOUNT_FS_SUBTYPE, 120)?,
        source: r.string(124)?,
        fs_opts: optional(STATMOUNT_MNT_OPTS, 4)?,
    })
}
