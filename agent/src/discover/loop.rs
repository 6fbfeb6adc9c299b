//! Loop devices: `loop/` in sysfs (Documentation/ABI/testing/sysfs-block-loop) plus
//! `LOOP_GET_STATUS64` for the backing file's device and inode, which sysfs does not show.
//!
//! The ioctl needs the device node; on fixture trees (no node) the backing device stays unknown.
//! It also asks the backing file's filesystem for fresh attributes, which never come back when
//! that filesystem's server (FUSE, NFS) stopped answering: it runs through [`crate::host::bounded`]
//! with a short deadline. A binding's answer is kept for as long as the binding lives (the
//! device's `diskseq` changes with every new binding), so a hung backing filesystem costs only
//! the first scan of a binding its answer; without one, [`LoopInfo::status_blocked`] says why
//! the backing device is not known (the snapshot makes that a blind spot).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::{read_attr_bytes_opt, read_bool, read_u64, DiscoverError};
use crate::host::sys;
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, KernelText, LoopInfo};

const LO_FLAGS_READ_ONLY: u32 = 1;

/// How long `LOOP_GET_STATUS64` may take before the scan goes on without it.
pub const STATUS_DEADLINE: Duration = Duration::from_millis(500);

/// The answers of bindings still live, by device number and `diskseq`.
static ANSWERS: Mutex<Option<HashMap<(DevNum, u64), sys::LoopInfo64>>> = Mutex::new(None);

/// Why `LOOP_GET_STATUS64` gave no answer.
enum NoStatus {
    /// Not asked (no node, not this device, not bound, an error): the backing device stays
    /// unknown, as on fixture trees.
    Unavailable,
    /// The read blocked (the backing file's filesystem does not answer).
    Blocked(String),
}

/// Reads `loop/`. `None` for an unbound loop device (no `backing_file`).
pub fn read(
    host: &HostRoot,
    dir: &Path,
    name: &DeviceName,
    devnum: DevNum,
    diskseq: Option<u64>,
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
        status_blocked: None,
    };
    match status(host, name, devnum, diskseq) {
        Ok(st) => {
            info.backing_dev = Some(DevNum::from_dev_t(st.lo_device));
            info.backing_inode = Some(st.lo_inode);
            info.backing_rdev = (st.lo_rdevice != 0).then(|| DevNum::from_dev_t(st.lo_rdevice));
            info.read_only = st.lo_flags & LO_FLAGS_READ_ONLY != 0;
        }
        Err(NoStatus::Unavailable) => {}
        Err(NoStatus::Blocked(why)) => info.status_blocked = Some(why),
    }
    Ok(Some(info))
}

/// The binding's `LOOP_GET_STATUS64`: remembered for this `diskseq`, else asked on a bounded
/// thread (and remembered).
fn status(
    host: &HostRoot,
    name: &DeviceName,
    devnum: DevNum,
    diskseq: Option<u64>,
) -> Result<sys::LoopInfo64, NoStatus> {
    let key = diskseq.map(|s| (devnum, s));
    if let Some(k) = key {
        let answers = ANSWERS.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = answers.as_ref().and_then(|a| a.get(&k)) {
            return Ok(*st);
        }
    }
    let node = host.dev_node(name.as_str());
    let id = sys::stat_cached(&node).map_err(|_| NoStatus::Unavailable)?;
    if !id.is_block_device() || id.rdev != devnum {
        return Err(NoStatus::Unavailable);
    }
    let st = crate::host::bounded::read(format!("loop-status-{devnum}"), STATUS_DEADLINE, move || {
        let f = File::options().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(&node)?;
        // Dropped before `f`: the number is unmarked before it is closed.
        let _probe = crate::host::bounded::mark_fd(f.as_raw_fd());
        sys::loop_get_status(f.as_fd())
    })
    .map_err(|b| {
        NoStatus::Blocked(format!(
            "LOOP_GET_STATUS64 on /dev/{name} {b} (the filesystem its backing file lives on does not answer)"
        ))
    })?
    .map_err(|_| NoStatus::Unavailable)?;
    if let Some(k) = key {
        let mut answers = ANSWERS.lock().unwrap_or_else(|p| p.into_inner());
        let map = answers.get_or_insert_with(HashMap::new);
        // A binding that went is never asked about again: keep one answer per device number.
        map.retain(|(d, _), _| *d != devnum);
        map.insert(k, st);
    }
    Ok(st)
}
