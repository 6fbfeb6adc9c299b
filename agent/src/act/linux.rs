//! The Linux actuator: dispatches each step to its transport's file (`mount.rs`, `loop.rs`,
//! `rbd.rs`, `nbd.rs`, `multipath.rs`, `scsi.rs`, `iscsi.rs`, `nvme.rs`).
//!
//! Every step re-reads the kernel's state right before acting (the device is still the planned
//! one), refuses anything that would take more than planned, runs the write on its own thread
//! with a deadline ([`bounded`]), and verifies the result. Every kernel call goes through the
//! actuator's [`Kernel`]: the live one ([`LinuxKernel`]) in production, a recording double in the
//! actuators' unit tests.

use crate::host::bounded::CallError;
use std::io;
use std::time::Duration;

use super::kernel::Kernel;
use super::kernel_linux::LinuxKernel;
use super::{ActError, Actuator, StepOutcome};
use crate::host::HostRoot;
use crate::model::DeviceName;
use crate::plan::step::{Action, Step};

/// Default deadline for one kernel call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What tells one attach of an rbd image from the next at the same id and number: the device's
/// `diskseq`, or on a kernel without it the sequence number of the kernel's attach record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachStamp {
    pub diskseq: Option<u64>,
    pub record: Option<u64>,
}

/// Acts on the kernel `K` (the live one unless a test says otherwise).
#[derive(Debug, Clone)]
pub struct LinuxActuator<K: Kernel = LinuxKernel> {
    host: HostRoot,
    timeout: Duration,
    kernel: K,
}

impl LinuxActuator {
    /// Acts on the live kernel.
    pub fn new(host: HostRoot, timeout: Duration) -> Self {
        Self::with_kernel(host, timeout, LinuxKernel)
    }
}

impl<K: Kernel> LinuxActuator<K> {
    /// Acts through `kernel` (a test's recording double).
    pub fn with_kernel(host: HostRoot, timeout: Duration, kernel: K) -> Self {
        Self { host, timeout, kernel }
    }

    pub(crate) fn host(&self) -> &HostRoot {
        &self.host
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The kernel every call goes to.
    pub(crate) fn kernel(&self) -> &K {
        &self.kernel
    }
}

impl<K: Kernel> Actuator for LinuxActuator<K> {
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        let (device, devnum) = (&step.device, step.devnum);
        match &step.action {
            Action::DetachMount { namespace, via, mount_id, mount_dev, .. } => {
                self.detach_mount(device, *mount_dev, *namespace, via, *mount_id)
            }
            Action::DetachLoop { backing_dev, backing_inode, .. } => {
                self.detach_loop(device, devnum, step.identity.diskseq, *backing_dev, *backing_inode)
            }
            Action::DmMessage { uuid, message } => self.dm_message(device, devnum, uuid, message),
            Action::DmRemove { uuid, deferred } => self.dm_remove(device, devnum, uuid, *deferred),
            Action::ScsiOffline { wwid, require_offline, .. } => {
                self.scsi_offline(device, devnum, wwid, *require_offline)
            }
            Action::ScsiDelete { wwid, .. } => self.scsi_delete(device, devnum, wwid),
            Action::RbdUnmap { id, pool, image, image_id, force } => {
                let record = match &step.identity.backing {
                    crate::graph::identity::Backing::Rbd { attach_record, .. } => *attach_record,
                    _ => None,
                };
                let stamp = AttachStamp { diskseq: step.identity.diskseq, record };
                self.rbd_unmap(device, devnum, *id, (pool, image, image_id), stamp, *force)
            }
            Action::NbdDisconnect { server_pid, backend } => {
                self.nbd_disconnect(device, devnum, *server_pid, backend.as_deref())
            }
            // Each kind's module takes the action as planned (no name of theirs is needed here).
            Action::NvmeDeleteController { .. } => self.nvme_delete_step(device, &step.action),
            Action::IscsiLogout { .. } => self.iscsi_logout_step(device, &step.action),
        }
    }
}

/// Runs `f` on its own thread and waits at most `timeout`. A call that hangs (a dead device)
/// keeps its thread, which is never joined; the caller gets [`ActError::TimedOut`].
pub fn bounded<R: Send + 'static>(
    device: &DeviceName,
    op: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> Result<R, ActError> {
    crate::host::bounded::call(device, op, timeout, f).map_err(|e| match e {
        CallError::Failed(source) => ActError::Syscall { device: device.clone(), op, source },
        CallError::TimedOut => ActError::TimedOut { device: device.clone(), op, after: timeout },
    })
}
