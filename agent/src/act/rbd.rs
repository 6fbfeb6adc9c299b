//! The Linux actuator's rbd step: krbd unmap through `/sys/bus/rbd/remove_single_major` (or
//! `remove`), retrying the transient EBUSY udev's blkid causes on last close. Identity (pool,
//! image, image id and device number) is re-verified first, and so is the attach stamp the plan
//! was made for (the device's `diskseq`, or the kernel's attach record where there is none): the
//! same image unmapped and mapped again at the same id is another mapping, someone else's now.

use std::time::Duration;

use super::kernel::Kernel;
use super::linux::{bounded, AttachStamp, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{lossless_string, DevNum, DeviceName};

/// `rbd unmap` retries EBUSY this often, 250 ms apart.
const EBUSY_RETRIES: u32 = 4;

impl<K: Kernel> LinuxActuator<K> {
    pub(super) fn rbd_unmap(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        id: u32,
        (pool, image, image_id): (&str, &str, &str),
        stamp: AttachStamp,
        force: bool,
    ) -> Result<StepOutcome, ActError> {
        let bus = self.host().sys().join("bus/rbd");
        let dir = bus.join("devices").join(id.to_string());
        if !self.kernel().exists(&dir) {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        // Decoded as the scan decoded them (an image name need not be UTF-8).
        let attr = |n: &str| {
            let read = self.kernel().read(&dir.join(n));
            read.map(|b| lossless_string(b).trim().to_owned()).unwrap_or_default()
        };
        let now =
            (attr("pool"), attr("name"), attr("image_id"), format!("{}:{}", attr("major"), attr("minor")));
        if now != (pool.to_owned(), image.to_owned(), image_id.to_owned(), devnum.to_string()) {
            return Err(ActError::precondition(
                device,
                format!("rbd id {id} is now {}/{} ({}), not {pool}/{image}: id reused?", now.0, now.1, now.3),
            ));
        }
        self.same_attach(device, id, stamp)?;
        let control =
            ["remove_single_major", "remove"].iter().map(|f| bus.join(f)).find(|p| self.kernel().exists(p));
        let Some(control) = control else {
            return Err(ActError::precondition(
                device,
                format!("neither {0}/remove_single_major nor {0}/remove exists", bus.display()),
            ));
        };
        let text = if force { format!("{id} force") } else { id.to_string() };
        let mut attempt = 0;
        loop {
            let (c, t, kernel) = (control.clone(), text.clone(), self.kernel().clone());
            match bounded(device, "rbd remove", self.timeout(), move || kernel.write(&c, t.as_bytes())) {
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
        if self.kernel().exists(&dir) {
            return Err(ActError::NotVerified {
                device: device.clone(),
                op: "rbd remove",
                reason: format!("{} is still there", dir.display()),
            });
        }
        Ok(StepOutcome::Done)
    }

    /// Refuses unless `device` is still the attach the plan was made for: its `diskseq` now is
    /// the planned one, or (planned without one) the kernel's latest attach record for its name
    /// is. Planned with neither (an old kernel whose record left the log's buffer): the other
    /// checks (id, pool, image, image id, number) are all there is.
    fn same_attach(&self, device: &DeviceName, id: u32, stamp: AttachStamp) -> Result<(), ActError> {
        let refuse = |what: String| {
            Err(ActError::precondition(
                device,
                format!("rbd id {id} is {what}: the image was unmapped and mapped again since it was planned; plan again"),
            ))
        };
        if let Some(planned) = stamp.diskseq {
            let path = self.host().sys_class_block().join(device.as_str()).join("diskseq");
            let now = self.kernel().read_to_string(&path).map_err(|e| {
                ActError::precondition(
                    device,
                    format!("cannot read {} to check the attach: {e}", path.display()),
                )
            })?;
            return match now.trim().parse::<u64>() {
                Ok(n) if n == planned => Ok(()),
                Ok(n) => refuse(format!("now diskseq {n}, not the planned {planned}")),
                Err(_) => Err(ActError::precondition(
                    device,
                    format!("{} says {:?}, not a disk sequence number", path.display(), now.trim()),
                )),
            };
        }
        if let Some(planned) = stamp.record {
            return match self.kernel().rbd_attach_records(self.host()).get(device.as_str()) {
                Some(&n) if n == planned => Ok(()),
                Some(&n) => refuse(format!("now announced by kernel record #{n}, not #{planned}")),
                None => refuse(format!(
                    "no longer announced by kernel record #{planned} (the record cannot be found)"
                )),
            };
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "rbd_tests.rs"]
mod tests;
