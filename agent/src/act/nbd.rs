//! The Linux actuator's nbd step: disconnect through the kernel's ioctls, the device number
//! re-verified first.

use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::model::{DevNum, DeviceName};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const NBD_DISCONNECT: libc::c_ulong = 0xab08;
const NBD_CLEAR_SOCK: libc::c_ulong = 0xab04;

impl LinuxActuator {
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
