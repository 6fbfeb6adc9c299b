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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_cached_sees_files_and_devices() {
        let me = stat_cached(Path::new("/proc/self/exe")).expect("stat exe");
        assert!(!me.is_block_device());
        assert_eq!(stat_cached(Path::new("/nonexistent/x")).expect_err("missing").kind(), io::ErrorKind::NotFound);
        assert_eq!(std::mem::size_of::<LoopInfo64>(), 232, "struct loop_info64 is 232 bytes");
    }
}
