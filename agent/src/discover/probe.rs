//! The kernel's own word about a device, asked right before a destructive step (never in routine
//! scans): mount tables and `/proc` are only a map to the holders; the kernel's claims are the
//! truth (gotcha 17).
//!
//! - an exclusive open (`O_EXCL` on the block device node) fails with `EBUSY` while a mounted
//!   (or lazily detached but alive) filesystem, a dm/md table, swap or any other exclusive
//!   claimant holds the device. It succeeds while someone merely has the device open, so it is
//!   one witness among several, never proof of "unused" (gotcha 5);
//! - sysfs `holders/` (dm and md devices stacked on it);
//! - live filesystems in `/sys/fs` (ext4, xfs, f2fs, erofs, nilfs2 per device; btrfs member
//!   devices under `/sys/fs/btrfs/<fsid>/devices/`);
//! - loop devices whose backing file is this device's node (`lo_rdevice`; a loop device opens
//!   its backing node without claiming it, so the exclusive open cannot see it);
//! - for dm devices, the open count.
//!
//! The exclusive open is the only call that touches the device; it runs on a bounded thread
//! (a dead device can hang an open) and is closed at once, read-only (no udev "change" event).

use std::collections::HashSet;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use serde::Serialize;

use crate::discover::{livefs, names_in};
use crate::host::bounded::{self, CallError};
use crate::host::dmioctl::Control;
use crate::host::sys;
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName};

/// What an exclusive open of the device said.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "claim", content = "detail", rename_all = "snake_case")]
pub enum Claim {
    /// The open succeeded: no exclusive claimant (mounted filesystem, dm/md table, swap).
    Unclaimed,
    /// `EBUSY`: something claims the device.
    Claimed,
    /// The open could not tell (the kernel refuses opens of an offline disk with `ENXIO`, the
    /// node is missing, the open did not return in time).
    Inconclusive(String),
}

/// The kernel's word about one device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelWord {
    pub claim: Claim,
    /// sysfs `holders/`.
    pub sysfs_holders: Vec<DeviceName>,
    /// Live filesystems on it, as `fstype at /sys/fs/...`.
    pub live_filesystems: Vec<String>,
    /// Loop devices backed by its device node.
    pub loops_on_top: Vec<DeviceName>,
    /// The dm open count (dm devices only; our own probe is closed before it is read).
    pub dm_open_count: Option<i32>,
    /// What could not be read (each makes the word incomplete: the step is refused).
    pub unreadable: Vec<String>,
}

impl KernelWord {
    /// The word on a device nothing claims: no exclusive claim, nothing in `holders/`, no live
    /// filesystem, no loop on top, no dm open count, everything read.
    pub fn unclaimed() -> Self {
        Self {
            claim: Claim::Unclaimed,
            sysfs_holders: Vec::new(),
            live_filesystems: Vec::new(),
            loops_on_top: Vec::new(),
            dm_open_count: None,
            unreadable: Vec::new(),
        }
    }

    /// Every reason the kernel gives that the device is in use, in words (empty: none).
    pub fn users(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.claim == Claim::Claimed {
            out.push("an exclusive open fails with EBUSY: something claims it".to_owned());
        }
        if !self.sysfs_holders.is_empty() {
            out.push(format!("sysfs holders/ lists {}", join(&self.sysfs_holders)));
        }
        for fs in &self.live_filesystems {
            out.push(format!("a filesystem lives on it ({fs})"));
        }
        if !self.loops_on_top.is_empty() {
            out.push(format!("loop device(s) {} are backed by its device node", join(&self.loops_on_top)));
        }
        if let Some(n) = self.dm_open_count.filter(|n| *n > 0) {
            out.push(format!("its dm open count is {n}"));
        }
        out
    }
}

fn join(names: &[DeviceName]) -> String {
    names.iter().map(DeviceName::as_str).collect::<Vec<_>>().join(", ")
}

/// Asks the kernel about `device` (`devnum`). Never fails: what cannot be read is listed in
/// [`KernelWord::unreadable`] (and an unanswered open is [`Claim::Inconclusive`]).
pub fn kernel_word(host: &HostRoot, device: &DeviceName, devnum: DevNum, timeout: Duration) -> KernelWord {
    let mut unreadable = Vec::new();
    let sys_dir = host.sys_class_block().join(device.as_str());
    let sysfs_holders = names_in(&sys_dir.join("holders")).unwrap_or_else(|e| {
        unreadable.push(e.to_string());
        Vec::new()
    });
    let live_filesystems = {
        let names: HashSet<&str> = [device.as_str()].into_iter().collect();
        match livefs::scan(host, &names) {
            Ok(l) => l.iter().map(|fs| format!("{} at {}", fs.fstype, fs.sysfs_path())).collect(),
            Err(e) => {
                unreadable.push(e.to_string());
                Vec::new()
            }
        }
    };
    let loops_on_top = loops_backed_by(host, devnum, &mut unreadable);
    let dm_open_count = if sys_dir.join("dm").is_dir() {
        match Control::open(&host.dev_node("mapper/control")).and_then(|c| c.dev_status(devnum)) {
            Ok(h) => Some(h.open_count),
            Err(e) => {
                unreadable.push(format!("DM_DEV_STATUS of {devnum}: {e}"));
                None
            }
        }
    } else {
        None
    };
    let claim = exclusive_open(host, device, devnum, timeout);
    KernelWord { claim, sysfs_holders, live_filesystems, loops_on_top, dm_open_count, unreadable }
}

/// Opens the device node with `O_EXCL`, read-only and non-blocking, on a bounded thread.
fn exclusive_open(host: &HostRoot, device: &DeviceName, devnum: DevNum, timeout: Duration) -> Claim {
    let node = host.dev_node(device.as_str());
    match sys::stat_cached(&node) {
        Ok(id) if id.is_block_device() && id.rdev == devnum => {}
        Ok(_) => return Claim::Inconclusive(format!("{} is not the node of {devnum}", node.display())),
        Err(e) => return Claim::Inconclusive(format!("cannot stat {}: {e}", node.display())),
    }
    let open = bounded::call(device, "exclusive open", timeout, move || {
        File::options()
            .read(true)
            .custom_flags(libc::O_EXCL | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&node)
            .map(drop)
    });
    match open {
        Ok(()) => Claim::Unclaimed,
        Err(CallError::Failed(source)) if source.raw_os_error() == Some(libc::EBUSY) => Claim::Claimed,
        Err(CallError::Failed(source)) => Claim::Inconclusive(format!("the exclusive open failed: {source}")),
        Err(CallError::TimedOut) => Claim::Inconclusive(format!(
            "{device}: exclusive open did not finish within {timeout:?}; it is left running on its own thread and reported as hung"
        )),
    }
}

/// Loop devices whose backing file is the device node `devnum` (`LOOP_GET_STATUS64`'s
/// `lo_rdevice`).
fn loops_backed_by(host: &HostRoot, devnum: DevNum, unreadable: &mut Vec<String>) -> Vec<DeviceName> {
    let class = host.sys_class_block();
    let names = match crate::discover::list_dir(&class) {
        Ok(n) => n,
        Err(e) => {
            unreadable.push(e.to_string());
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for name in names.iter().filter(|n| class.join(n).join("loop/backing_file").exists()) {
        let node = host.dev_node(name);
        let status = File::options()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&node)
            .and_then(|f| sys::loop_get_status(f.as_fd()));
        match status {
            Ok(st) if st.lo_rdevice != 0 && DevNum::from_dev_t(st.lo_rdevice) == devnum => {
                out.extend(DeviceName::new(name).ok());
            }
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {} // unbound meanwhile
            Err(e) => unreadable.push(format!("LOOP_GET_STATUS64 on {}: {e}", node.display())),
        }
    }
    out
}
