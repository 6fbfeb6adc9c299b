//! The Linux actuator's loop step: detach a loop device, its backing file re-verified first.

use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::host::sys;
use crate::model::{DevNum, DeviceName};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

impl LinuxActuator {
    /// Detaches a loop device, only if the binding the fd reaches is the planned one: its
    /// `diskseq` (new with every binding) when the plan has it, and its backing file (`lo_device`,
    /// `lo_inode`) when the plan has them. A plan with neither has no identity to check, and is
    /// refused: a number bound again since is indistinguishable from the planned binding.
    pub(super) fn detach_loop(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        diskseq: Option<u64>,
        backing_dev: Option<DevNum>,
        backing_inode: Option<u64>,
    ) -> Result<StepOutcome, ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        let backing = match (backing_dev, backing_inode) {
            (Some(d), Some(i)) => Some((d, i)),
            _ => None,
        };
        if diskseq.is_none() && backing.is_none() {
            return Err(fail(format!(
                "the plan has no identity for {device}'s binding (no diskseq, no backing file device and inode): \
                 nothing to prove the number is still bound to the planned file; scan again where LOOP_GET_STATUS64 answers"
            )));
        }
        let backing_attr = self.host().sys_class_block().join(device.as_str()).join("loop/backing_file");
        if !backing_attr.exists() {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        let node = self.host().dev_node(device.as_str());
        let id = sys::stat_cached(&node).map_err(|e| fail(format!("cannot stat {}: {e}", node.display())))?;
        if !id.is_block_device() || id.rdev != devnum {
            return Err(fail(format!("{} is not device {devnum}", node.display())));
        }
        let dev = device.clone();
        let outcome = bounded(device, "LOOP_CLR_FD", self.timeout(), move || {
            let f =
                File::options().read(true).custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC).open(&node)?;
            if let Some(planned) = diskseq {
                if sys::disk_seq(f.as_fd())? != planned {
                    return Ok(None);
                }
            }
            let st = match sys::loop_get_status(f.as_fd()) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    return Ok(Some(StepOutcome::AlreadyAbsent))
                }
                Err(e) => return Err(e),
            };
            let now = (DevNum::from_dev_t(st.lo_device), st.lo_inode);
            if backing.is_some_and(|b| b != now) {
                return Ok(None);
            }
            match sys::loop_clear(f.as_fd()) {
                Ok(()) => Ok(Some(StepOutcome::Done)),
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(Some(StepOutcome::AlreadyAbsent)),
                Err(e) => Err(e),
            }
        })?;
        let Some(outcome) = outcome else {
            return Err(fail(format!(
                "{dev} is now another binding than planned (its diskseq or backing file changed): device name reused?"
            )));
        };
        // A transient opener (a scan reading LOOP_GET_STATUS64, blkid) turns LOOP_CLR_FD into
        // autoclear; the device detaches when it closes. Give that a moment before saying so.
        let deadline = std::time::Instant::now() + Duration::from_secs(1);
        while outcome == StepOutcome::Done && backing_attr.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(25));
        }
        if outcome == StepOutcome::Done && backing_attr.exists() {
            return Ok(StepOutcome::Deferred(format!(
                "the kernel set autoclear on {dev}: something still has it open; it detaches on last close"
            )));
        }
        Ok(outcome)
    }
}
