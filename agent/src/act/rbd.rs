//! The Linux actuator's rbd step: krbd unmap through `/sys/bus/rbd/remove_single_major` (or
//! `remove`), retrying the transient EBUSY udev's blkid causes on last close. Identity (pool,
//! image and image id) is re-verified first.

use std::time::Duration;

use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{lossless_string, DevNum, DeviceName};

/// `rbd unmap` retries EBUSY this often, 250 ms apart.
const EBUSY_RETRIES: u32 = 4;

impl LinuxActuator {
    pub(super) fn rbd_unmap(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        id: u32,
        (pool, image, image_id): (&str, &str, &str),
        force: bool,
    ) -> Result<StepOutcome, ActError> {
        let bus = self.host().sys().join("bus/rbd");
        let dir = bus.join("devices").join(id.to_string());
        if !dir.exists() {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        // Decoded as the scan decoded them (an image name need not be UTF-8).
        let attr = |n: &str| {
            std::fs::read(dir.join(n)).map(|b| lossless_string(b).trim().to_owned()).unwrap_or_default()
        };
        let now =
            (attr("pool"), attr("name"), attr("image_id"), format!("{}:{}", attr("major"), attr("minor")));
        if now != (pool.to_owned(), image.to_owned(), image_id.to_owned(), devnum.to_string()) {
            return Err(ActError::precondition(
                device,
                format!("rbd id {id} is now {}/{} ({}), not {pool}/{image}: id reused?", now.0, now.1, now.3),
            ));
        }
        let control = ["remove_single_major", "remove"].iter().map(|f| bus.join(f)).find(|p| p.exists());
        let Some(control) = control else {
            return Err(ActError::precondition(
                device,
                format!("neither {0}/remove_single_major nor {0}/remove exists", bus.display()),
            ));
        };
        let text = if force { format!("{id} force") } else { id.to_string() };
        let mut attempt = 0;
        loop {
            let (c, t) = (control.clone(), text.clone());
            match bounded(device, "rbd remove", self.timeout(), move || std::fs::write(c, t)) {
                Ok(()) => break,
                Err(ActError::Syscall { source, .. })
                    if source.raw_os_error() == Some(libc::EBUSY) && attempt < EBUSY_RETRIES =>
                {
                    attempt += 1;
                    std::thread::sleep(Duration::from_millis(250));
                }
                Err(ActError::Syscall { source, .. }) if source.raw_os_error() == Some(libc::ENOENT) => {
                    return Ok(StepOutcome::AlreadyAbsent);
                }
                Err(e) => return Err(e),
            }
        }
        if dir.exists() {
            return Err(ActError::NotVerified {
                device: device.clone(),
                op: "rbd remove",
                reason: format!("{} is still there", dir.display()),
            });
        }
        Ok(StepOutcome::Done)
    }
}
