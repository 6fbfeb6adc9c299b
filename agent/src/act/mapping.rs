//! The Linux actuator's rbd and nbd steps: krbd unmap through `/sys/bus/rbd/remove_single_major`
//! (or `remove`), retrying the transient EBUSY udev's blkid causes on last close, and nbd
//! disconnect through the kernel's ioctls. Identity is re-verified first (pool, image and image
//! id for rbd; the device number for nbd).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{lossless_string, DevNum, DeviceName};

/// `rbd unmap` retries EBUSY this often, 250 ms apart.
const EBUSY_RETRIES: u32 = 4;
const NBD_DISCONNECT: libc::c_ulong = 0xab08;
const NBD_CLEAR_SOCK: libc::c_ulong = 0xab04;

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

    /// Disconnects the device if it is still set up by the planned server process with the
    /// planned backend (nbd indexes are reused as soon as a device is free).
    pub(super) fn nbd_disconnect(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        server_pid: Option<u32>,
        backend: Option<&str>,
    ) -> Result<StepOutcome, ActError> {
        let sys = self.host().sys_class_block().join(device.as_str());
        let connected = || {
            sys.join("pid").exists()
                || std::fs::read_to_string(sys.join("size")).is_ok_and(|s| s.trim() != "0")
        };
        if !connected() {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        let attr = |n: &str| std::fs::read_to_string(sys.join(n)).ok().map(|s| s.trim().to_owned());
        let pid_now = attr("pid").and_then(|p| p.parse::<u32>().ok());
        let backend_now = attr("backend").filter(|b| !b.is_empty());
        if pid_now != server_pid || backend_now.as_deref() != backend {
            return Err(ActError::precondition(
                device,
                format!(
                    "it is now set up by pid {} with backend {}, not pid {} with backend {}: reconnected or reused",
                    pid_now.map_or("?".into(), |p| p.to_string()),
                    backend_now.as_deref().unwrap_or("none"),
                    server_pid.map_or("?".into(), |p| p.to_string()),
                    backend.unwrap_or("none"),
                ),
            ));
        }
        let node = self.host().dev_node(device.as_str());
        let id = crate::host::sys::stat_cached(&node)
            .map_err(|e| ActError::precondition(device, format!("cannot stat {}: {e}", node.display())))?;
        if !id.is_block_device() || id.rdev != devnum {
            return Err(ActError::precondition(device, format!("{} is not device {devnum}", node.display())));
        }
        bounded(device, "NBD_DISCONNECT", self.timeout(), move || {
            let f = File::options().read(true).write(true).open(&node)?;
            for req in [NBD_DISCONNECT, NBD_CLEAR_SOCK] {
                // SAFETY: both ioctls take no argument; the fd is open for the call.
                let rc = unsafe { libc::ioctl(f.as_raw_fd(), req as _, 0) };
                if rc != 0 {
                    let e = std::io::Error::last_os_error();
                    // EINVAL: already disconnected (the socket is gone); not an error here.
                    if e.raw_os_error() != Some(libc::EINVAL) {
                        return Err(e);
                    }
                }
            }
            Ok(())
        })?;
        let started = Instant::now();
        while connected() {
            if started.elapsed() > Duration::from_secs(3) {
                return Err(ActError::NotVerified {
                    device: device.clone(),
                    op: "NBD_DISCONNECT",
                    reason: "still connected".into(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(StepOutcome::Done)
    }
}
