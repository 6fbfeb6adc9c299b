//! The Linux actuator's nbd step: disconnect through the kernel's ioctls, the device number
//! re-verified first.

use super::kernel::{Kernel, Open};
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{DevNum, DeviceName};
use std::time::{Duration, Instant};

impl<K: Kernel> LinuxActuator<K> {
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
        let kernel = self.kernel();
        let connected = || {
            kernel.exists(&sys.join("pid"))
                || kernel.read_to_string(&sys.join("size")).is_ok_and(|s| s.trim() != "0")
        };
        if !connected() {
            return Ok(StepOutcome::AlreadyAbsent);
        }
        let attr = |n: &str| kernel.read_to_string(&sys.join(n)).ok().map(|s| s.trim().to_owned());
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
        let id = kernel
            .stat(&node)
            .map_err(|e| ActError::precondition(device, format!("cannot stat {}: {e}", node.display())))?;
        if !id.is_block_device() || id.rdev != devnum {
            return Err(ActError::precondition(device, format!("{} is not device {devnum}", node.display())));
        }
        let k = kernel.clone();
        bounded(device, "NBD_DISCONNECT", self.timeout(), move || {
            let f = k.open(&node, Open::ReadWrite)?;
            for request in [K::nbd_disconnect, K::nbd_clear_sock] {
                match request(&k, &f) {
                    // EINVAL: already disconnected (the socket is gone); not an error here.
                    Err(e) if e.raw_os_error() != Some(libc::EINVAL) => return Err(e),
                    _ => {}
                }
            }
            Ok(())
        })?;
        let started = Instant::now();
        while connected() {
            if started.elapsed() > Duration::from_secs(3) {
                // NBD_CLEAR_SOCK dropped the connection's own reference to the configuration;
                // every open of the node holds another, and the kernel drops the configuration
                // (size, pid) only when the last opener closes it.
                return Ok(StepOutcome::Deferred(format!(
                    "the connection of {device} is shut down (NBD_DISCONNECT, NBD_CLEAR_SOCK), but something still has /dev/{device} open, which the scan did not see: the kernel keeps its configuration until the last close; find the opener (fuser -v /dev/{device}; an fd in flight over a unix socket shows nowhere)"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(StepOutcome::Done)
    }
}

#[cfg(test)]
#[path = "nbd_tests.rs"]
mod tests;
