//! The Linux actuator's SCSI steps: offline and delete through sysfs, the disk's device number
//! and wwid re-verified first, on a bounded thread.

use super::kernel::Kernel;
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{DevNum, DeviceName};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// SCSI device states in which the disk takes no commands (`scsi_device_state` names).
const OFFLINE: [&str; 2] = ["offline", "transport-offline"];

impl<K: Kernel> LinuxActuator<K> {
    /// The disk's sysfs directory, checked to still be this device (number and wwid) with
    /// nothing stacked on it: `Ok(None)` when it is gone.
    pub(super) fn scsi_check(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        wwid: &str,
    ) -> Result<Option<PathBuf>, ActError> {
        let dir = self.host().sys_class_block().join(device.as_str());
        let Ok(dev) = self.kernel().read_to_string(&dir.join("dev")) else { return Ok(None) };
        if dev.trim() != devnum.to_string() {
            return Err(ActError::precondition(
                device,
                format!("{} is now {}, not {devnum}: name reused?", device, dev.trim()),
            ));
        }
        let now = self.kernel().read_to_string(&dir.join("device/wwid")).unwrap_or_default();
        if now.trim() != wwid {
            return Err(ActError::precondition(
                device,
                format!("wwid is now '{}', not '{wwid}': another disk", now.trim()),
            ));
        }
        let holders = self.kernel().list_dir(&dir.join("holders")).unwrap_or_default();
        if !holders.is_empty() {
            return Err(ActError::precondition(device, format!("still held by {}", holders.join(", "))));
        }
        Ok(Some(dir))
    }

    /// The disk's SCSI state (`device/state`), trimmed.
    pub(super) fn scsi_state(&self, dir: &std::path::Path) -> String {
        let state = self.kernel().read_to_string(&dir.join("device/state"));
        state.map(|s| s.trim().to_owned()).unwrap_or_default()
    }

    pub(super) fn scsi_offline(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        wwid: &str,
        require_offline: bool,
    ) -> Result<StepOutcome, ActError> {
        let Some(dir) = self.scsi_check(device, devnum, wwid)? else { return Ok(StepOutcome::AlreadyAbsent) };
        let state = self.scsi_state(&dir);
        if OFFLINE.contains(&state.as_str()) {
            return Ok(StepOutcome::Done);
        }
        if require_offline {
            return Err(ActError::precondition(
                device,
                format!("it was planned as an offline disk, but its state is now '{state}': it came back"),
            ));
        }
        let (path, kernel) = (dir.join("device/state"), self.kernel().clone());
        bounded(device, "write device/state", self.timeout(), move || kernel.write(&path, b"offline\n"))?;
        Ok(StepOutcome::Done)
    }

    pub(super) fn scsi_delete(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        wwid: &str,
    ) -> Result<StepOutcome, ActError> {
        let Some(dir) = self.scsi_check(device, devnum, wwid)? else { return Ok(StepOutcome::AlreadyAbsent) };
        let state = self.scsi_state(&dir);
        if !OFFLINE.contains(&state.as_str()) {
            return Err(ActError::precondition(
                device,
                format!("its state is '{state}', not offline: a disk is deleted only while offline"),
            ));
        }
        let (delete, kernel) = (dir.join("device/delete"), self.kernel().clone());
        bounded(device, "write device/delete", self.timeout(), move || kernel.write(&delete, b"1\n"))?;
        let started = Instant::now();
        while self.kernel().exists(&dir.join("dev")) {
            if started.elapsed() > Duration::from_secs(2) {
                return Err(ActError::NotVerified {
                    device: device.clone(),
                    op: "write device/delete",
                    reason: "the disk is still in sysfs".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(StepOutcome::Done)
    }
}

#[cfg(test)]
#[path = "scsi_tests.rs"]
mod tests;
