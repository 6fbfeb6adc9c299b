//! The Linux actuator's iSCSI step: logging a session out through iscsid, its owner.
//!
//! The kernel session is iscsid's: a logout written to sysfs behind its back would be
//! re-established by iscsid's recovery. So the step runs `iscsiadm -m session -r SID -u` (logout
//! of one session by its SID) in the host's mount namespace (the host's iscsiadm, its
//! `/etc/iscsi`) and the host's network namespace (iscsiadm reaches iscsid through an abstract
//! unix socket, which lives in a network namespace; the agent's pod has `hostPID` but not
//! `hostNetwork`): a child is forked and, before exec, `setns`es into PID 1's `ns/mnt` and
//! `ns/net` (`act/host_command.rs`). It is waited for up to the step's deadline and killed after
//! it.
//!
//! Right before it runs, the session is re-read from sysfs: it must still exist with the planned
//! target and portal, and no SCSI device may sit on it any more (the disks are deleted first:
//! the other order leaves kernel workers retrying I/O to a session that is gone). Afterwards the
//! session must have left sysfs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::kernel::Kernel;
use super::linux::LinuxActuator;
use super::{ActError, StepOutcome};
use crate::model::DeviceName;
use crate::plan::step::Action;

/// Where open-iscsi installs iscsiadm, as the host sees its file system.
const ISCSIADM: [&str; 4] = ["/usr/sbin/iscsiadm", "/sbin/iscsiadm", "/usr/bin/iscsiadm", "/bin/iscsiadm"];

/// How long the session may take to leave sysfs after iscsiadm returned.
const GONE_WITHIN: Duration = Duration::from_secs(5);

/// What the plan says the session is.
struct PlannedSession<'a> {
    pub sid: u32,
    pub target: &'a str,
    pub portal: &'a str,
}

impl<K: Kernel> LinuxActuator<K> {
    /// Runs an `iscsi_logout` step as planned.
    pub(super) fn iscsi_logout_step(
        &self,
        device: &DeviceName,
        action: &Action,
    ) -> Result<StepOutcome, ActError> {
        let Action::IscsiLogout { sid, target, portal, .. } = action else {
            return Err(ActError::precondition(device, format!("not an iSCSI logout: {action:?}")));
        };
        self.iscsi_logout(device, PlannedSession { sid: *sid, target, portal })
    }

    fn iscsi_logout(
        &self,
        device: &DeviceName,
        planned: PlannedSession<'_>,
    ) -> Result<StepOutcome, ActError> {
        let sid = planned.sid;
        let read =
            |e: crate::discover::DiscoverError| ActError::precondition(device, format!("session{sid}: {e}"));
        let Some(now) = self.kernel().iscsi_detail(self.host(), sid).map_err(read)? else {
            return Ok(StepOutcome::AlreadyAbsent);
        };
        let target = self.kernel().iscsi_targetname(self.host(), sid).map_err(read)?.unwrap_or_default();
        if target != planned.target {
            return Err(ActError::precondition(
                device,
                format!(
                    "session{sid} now logs in to '{target}', not '{}': the SID was reused",
                    planned.target
                ),
            ));
        }
        let portal = now.portal().unwrap_or_default();
        if portal != planned.portal {
            return Err(ActError::precondition(
                device,
                format!(
                    "session{sid} now goes to portal '{portal}', not '{}': the SID was reused",
                    planned.portal
                ),
            ));
        }
        let luns = self.kernel().iscsi_scsi_devices(self.host(), sid).map_err(read)?;
        if !luns.is_empty() {
            return Err(ActError::precondition(
                device,
                format!(
                    "session{sid} still has SCSI device(s) {}: a session is logged out only once its disks are deleted",
                    luns.join(", ")
                ),
            ));
        }
        let program = self.iscsiadm(device)?;
        let args = ["-m".to_owned(), "session".to_owned(), "-r".to_owned(), sid.to_string(), "-u".to_owned()];
        let (code, output) =
            self.kernel().run_in_host_namespaces(self.host(), device, &program, &args, self.timeout())?;
        if code != Some(0) {
            let why = output.trim();
            return Err(ActError::Syscall {
                device: device.clone(),
                op: "iscsiadm -m session -u",
                source: std::io::Error::other(format!(
                    "{} {} exited with {}: {}",
                    program.display(),
                    args.join(" "),
                    code.map_or("a signal".into(), |c| c.to_string()),
                    if why.is_empty() { "no output (is iscsid running on the host?)" } else { why }
                )),
            });
        }
        let started = Instant::now();
        while self.kernel().iscsi_state(self.host(), sid).map_err(read)?.is_some() {
            if started.elapsed() > GONE_WITHIN {
                return Err(ActError::NotVerified {
                    device: device.clone(),
                    op: "iscsiadm -m session -u",
                    reason: format!("session{sid} is still in sysfs"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(StepOutcome::Done)
    }

    /// The host's iscsiadm, as this process reaches it (for the existence check) and as the
    /// host names it (what the child execs once inside the host's mount namespace).
    fn iscsiadm(&self, device: &DeviceName) -> Result<PathBuf, ActError> {
        ISCSIADM
            .iter()
            .map(Path::new)
            .find(|p| self.kernel().is_file(&self.host().host_path(p)))
            .map(Path::to_path_buf)
            .ok_or_else(|| {
                ActError::precondition(
                    device,
                    format!(
                        "no iscsiadm in the host's file system ({}): logging out an iSCSI session needs open-iscsi (iscsiadm and a running iscsid) on the host",
                        ISCSIADM.join(", ")
                    ),
                )
            })
    }
}

#[cfg(test)]
#[path = "iscsi_tests.rs"]
mod tests;
