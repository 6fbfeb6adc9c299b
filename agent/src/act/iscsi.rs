//! The Linux actuator's iSCSI step: logging a session out through iscsid, its owner.
//!
//! The kernel session is iscsid's: a logout written to sysfs behind its back would be
//! re-established by iscsid's recovery. So the step runs `iscsiadm -m session -r SID -u` (logout
//! of one session by its SID) in the host's mount namespace (the host's iscsiadm, its
//! `/etc/iscsi`) and the host's network namespace (iscsiadm reaches iscsid through an abstract
//! unix socket, which lives in a network namespace; the agent's pod has `hostPID` but not
//! `hostNetwork`): a child is forked and, before exec, `setns`es into PID 1's `ns/mnt` and
//! `ns/net`. It is waited for up to the step's deadline and killed after it.
//!
//! Right before it runs, the session is re-read from sysfs: it must still exist with the planned
//! target and portal, and no SCSI device may sit on it any more (the disks are deleted first:
//! the other order leaves kernel workers retrying I/O to a session that is gone). Afterwards the
//! session must have left sysfs.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::linux::LinuxActuator;
use super::{ActError, StepOutcome};
use crate::discover::iscsi;
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

impl LinuxActuator {
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
        let Some(now) = iscsi::detail(self.host(), sid).map_err(read)? else {
            return Ok(StepOutcome::AlreadyAbsent);
        };
        let target = iscsi::targetname(self.host(), sid).map_err(read)?.unwrap_or_default();
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
        let luns = iscsi::scsi_devices_of(self.host(), sid).map_err(read)?;
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
        let (code, output) = self.run_in_host_namespaces(device, &program, &args)?;
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
        while iscsi::state(self.host(), sid).map_err(read)?.is_some() {
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
            .find(|p| self.host().host_path(p).is_file())
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

    /// Runs `program args` in PID 1's mount and network namespaces, waits up to the deadline
    /// (then kills it), and returns its exit code and its output (stdout and stderr, bounded).
    fn run_in_host_namespaces(
        &self,
        device: &DeviceName,
        program: &Path,
        args: &[String],
    ) -> Result<(Option<i32>, String), ActError> {
        let op = "iscsiadm -m session -u";
        let sys = |source: std::io::Error| ActError::Syscall { device: device.clone(), op, source };
        let ns_dir = self.host().proc_pid(1).join("ns");
        let open = |name: &str| {
            let p = ns_dir.join(name);
            File::open(&p).map_err(|e| {
                ActError::precondition(
                    device,
                    format!("cannot open {} (the host's namespace; needs hostPID): {e}", p.display()),
                )
            })
        };
        let (mnt, net) = (open("mnt")?, open("net")?);
        let (mnt_fd, net_fd) = (mnt.as_raw_fd(), net.as_raw_fd());
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only makes two setns(2)
        // system calls on file descriptors opened before the fork (kept open by `mnt` and `net`,
        // which outlive `spawn`); it allocates nothing and takes no lock, as required between
        // fork and exec. The child is single-threaded, so joining a mount namespace is allowed.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(net_fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd.spawn().map_err(sys)?;
        drop((mnt, net));
        let mut out = child.stdout.take();
        let mut err = child.stderr.take();
        let reader = std::thread::Builder::new()
            .name("blockjanitor-iscsiadm".into())
            .spawn(move || {
                let mut text = Vec::new();
                for r in [out.as_mut().map(|o| o as &mut dyn Read), err.as_mut().map(|e| e as &mut dyn Read)]
                    .into_iter()
                    .flatten()
                {
                    let _ = r.take(16 * 1024).read_to_end(&mut text);
                }
                String::from_utf8_lossy(&text).into_owned()
            })
            .map_err(sys)?;
        let started = Instant::now();
        let status = loop {
            match child.try_wait().map_err(sys)? {
                Some(s) => break s,
                None if started.elapsed() > self.timeout() => {
                    let _ = child.kill(); // our own child, by its handle
                    let _ = child.wait();
                    return Err(ActError::TimedOut { device: device.clone(), op, after: self.timeout() });
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        let text = reader.join().unwrap_or_default();
        Ok((status.code(), text))
    }
}
