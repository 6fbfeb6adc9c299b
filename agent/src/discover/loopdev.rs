//! Loop devices: `loop/` in sysfs (Documentation/ABI/testing/sysfs-block-loop) plus
//! `LOOP_GET_STATUS64` for the backing file's device and inode, which sysfs does not show.
//!
//! The ioctl needs the device node; on fixture trees (no node) the backing device stays unknown.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{read_attr_bytes_opt, read_bool, read_u64, DiscoverError};
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, KernelText, LoopInfo};
use crate::sys;

const LO_FLAGS_READ_ONLY: u32 = 1;

/// Reads `loop/`. `None` for an unbound loop device (no `backing_file`).
pub fn read(
    host: &HostRoot,
    dir: &Path,
    name: &DeviceName,
    devnum: DevNum,
) -> Result<Option<LoopInfo>, DiscoverError> {
    // A path: any bytes, not necessarily UTF-8.
    let Some(backing) = read_attr_bytes_opt(&dir.join("backing_file"))? else {
        return Ok(None);
    };
    let (backing_file, backing_deleted) = match backing.as_bytes().strip_suffix(b" (deleted)") {
        Some(p) => (KernelText::from(p), true),
        None => (backing, false),
    };
    let mut info = LoopInfo {
        backing_file,
        backing_deleted,
        offset: read_u64(&dir.join("offset"))?,
        sizelimit: read_u64(&dir.join("sizelimit"))?,
        autoclear: read_bool(&dir.join("autoclear"))?,
        read_only: false,
        backing_dev: None,
        backing_inode: None,
        backing_rdev: None,
    };
    if let Some(st) = status_from_node(host, name, devnum) {
        info.backing_dev = Some(DevNum::from_dev_t(st.lo_device));
        info.backing_inode = Some(st.lo_inode);
        info.backing_rdev = (st.lo_rdevice != 0).then(|| DevNum::from_dev_t(st.lo_rdevice));
        info.read_only = st.lo_flags & LO_FLAGS_READ_ONLY != 0;
    }
    Ok(Some(info))
}

/// `LOOP_GET_STATUS64` through `/dev/<name>`, only if that node really is this device.
fn status_from_node(host: &HostRoot, name: &DeviceName, devnum: DevNum) -> Option<sys::LoopInfo64> {
    let node = host.dev_node(name.as_str());
    let id = sys::stat_cached(&node).ok()?;
    if !id.is_block_device() || id.rdev != devnum {
        return None;
    }
    let f = File::options().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(&node).ok()?;
    sys::loop_get_status(f.as_fd()).ok()
}
