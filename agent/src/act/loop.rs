//! The Linux actuator's loop step: detach a loop device, its backing file re-verified first.

use super::kernel::{Kernel, Open};
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{DevNum, DeviceName};
use std::time::Duration;

impl<K: Kernel> LinuxActuator<K> {
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
        if !self.kernel().exists(&backing_attr) {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        let node = self.host().dev_node(device.as_str());
        let id =
            self.kernel().stat(&node).map_err(|e| fail(format!("cannot stat {}: {e}", node.display())))?;
        if !id.is_block_device() || id.rdev != devnum {
            return Err(fail(format!("{} is not device {devnum}", node.display())));
        }
        let (dev, kernel) = (device.clone(), self.kernel().clone());
        let outcome = bounded(device, "LOOP_CLR_FD", self.timeout(), move || {
            let f = kernel.open(&node, Open::ReadNonBlocking)?;
            if let Some(planned) = diskseq {
                if kernel.disk_seq(&f)? != planned {
                    return Ok(None);
                }
            }
            let st = match kernel.loop_get_status(&f) {
                Ok(st) => st,
                Err(e) if e.raw_os_error() == Some(libc::ENXIO) => {
                    return Ok(Some(StepOutcome::AlreadyAbsent))
                }
                Err(e) => return Err(e),
            };
            if backing.is_some_and(|b| b != (st.device, st.inode)) {
                return Ok(None);
            }
            match kernel.loop_clear(&f) {
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
        let bound = || self.kernel().exists(&backing_attr);
        while outcome == StepOutcome::Done && bound() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(25));
        }
        if outcome == StepOutcome::Done && bound() {
            return Ok(StepOutcome::Deferred(format!(
                "the kernel set autoclear on {dev}: something still has it open; it detaches on last close"
            )));
        }
        Ok(outcome)
    }
}

#[cfg(test)]
#[path = "loop_tests.rs"]
mod tests;
