//! The Linux actuator's device-mapper steps (a multipath map and the layers stacked on it):
//! messages and removal through `/dev/mapper/control`. Each re-verifies the map's uuid right
//! before acting, and every call that may touch a dead device runs on a bounded thread. A
//! multipath map is removed through multipathd while it runs (`act/multipathd.rs`); its paths'
//! SCSI steps are `act/scsi.rs`.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::kernel::Kernel;
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::discover::multipath::{parse_status, PathState};
use crate::model::{DevNum, DeviceName};

/// How long a removal waits for openers to let go (stuck readers exiting after
/// `fail_if_no_path`) before it gives up.
const OPENERS_GRACE: Duration = Duration::from_secs(5);

fn gone(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV | libc::ENOENT))
}

impl<K: Kernel> LinuxActuator<K> {
    fn control_path(&self) -> PathBuf {
        self.host().dev_node("mapper/control")
    }

    /// Opens the control node and looks the device up by its uuid (dm minors are reused at
    /// once; a uuid names one device while it lives), checking it still has the planned number.
    /// `Ok(None)`: gone.
    fn dm_check(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        uuid: &str,
    ) -> Result<Option<(K::Control, i32)>, ActError> {
        if uuid.is_empty() {
            return Err(ActError::precondition(
                device,
                "it has no device-mapper uuid: a device known only by its reusable number is never changed"
                    .into(),
            ));
        }
        let path = self.control_path();
        let control = self
            .kernel()
            .dm_open(&path)
            .map_err(|e| ActError::precondition(device, format!("cannot open {}: {e}", path.display())))?;
        match self.kernel().dm_dev_status(&control, uuid) {
            Ok(h) if h.dev != devnum => Err(ActError::precondition(
                device,
                format!("uuid '{uuid}' is now device {}, not {devnum}: the map was recreated", h.dev),
            )),
            Ok(h) => Ok(Some((control, h.open_count))),
            Err(e) if gone(&e) => Ok(None),
            Err(e) => Err(ActError::precondition(device, format!("DM_DEV_STATUS of uuid '{uuid}': {e}"))),
        }
    }

    pub(super) fn dm_message(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        uuid: &str,
        message: &str,
    ) -> Result<StepOutcome, ActError> {
        if self.dm_check(device, devnum, uuid)?.is_none() {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        let path = self.control_path();
        let (msg, id, kernel) = (message.to_owned(), uuid.to_owned(), self.kernel().clone());
        bounded(device, "DM_TARGET_MSG", self.timeout(), move || {
            kernel.dm_message(&kernel.dm_open(&path)?, &id, &msg)
        })?;
        Ok(StepOutcome::Done)
    }

    pub(super) fn dm_remove(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        uuid: &str,
        deferred: bool,
    ) -> Result<StepOutcome, ActError> {
        let started = Instant::now();
        loop {
            let Some((control, open)) = self.dm_check(device, devnum, uuid)? else {
                return Ok(StepOutcome::AlreadyAbsent);
            };
            // Never remove a map a path has come back to (multipathd can re-add paths).
            if uuid.starts_with("mpath-") {
                let targets = self
                    .kernel()
                    .dm_table_status(&control, uuid)
                    .map_err(|e| ActError::precondition(device, format!("DM_TABLE_STATUS: {e}")))?;
                for t in targets.iter().filter(|t| t.target_type == "multipath") {
                    let status = parse_status(&t.params)
                        .map_err(|e| ActError::precondition(device, format!("status line: {e}")))?;
                    let active = status.paths().find(|p| p.state == PathState::Active).map(|p| p.dev);
                    if let Some(dev) = active {
                        return Err(ActError::precondition(
                            device,
                            format!("path {dev} is active again: the map is not dead"),
                        ));
                    }
                }
            }
            if open == 0 || deferred {
                break;
            }
            if started.elapsed() > OPENERS_GRACE {
                return Err(ActError::precondition(
                    device,
                    format!("still open by {open} opener(s) after {OPENERS_GRACE:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // A multipath map while multipathd runs: through multipathd, never behind its back.
        if let Some(outcome) = self.dm_remove_via_multipathd(device, devnum, uuid, deferred)? {
            return Ok(outcome);
        }
        let (path, id, kernel) = (self.control_path(), uuid.to_owned(), self.kernel().clone());
        bounded(device, "DM_DEV_REMOVE", self.timeout(), move || {
            kernel.dm_remove(&kernel.dm_open(&path)?, &id, deferred)
        })?;
        match self.dm_check(device, devnum, uuid)? {
            None => Ok(StepOutcome::Done),
            Some(_) if deferred => {
                Ok(StepOutcome::Deferred(format!("{device} is removed when its last opener closes it")))
            }
            Some(_) => Err(ActError::NotVerified {
                device: device.clone(),
                op: "DM_DEV_REMOVE",
                reason: "the device is still there".into(),
            }),
        }
    }
}

#[cfg(test)]
#[path = "multipath_tests.rs"]
mod tests;
