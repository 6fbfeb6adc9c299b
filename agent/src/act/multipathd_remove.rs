//! The Linux actuator's side of removing a multipath map through multipathd
//! (`act/multipathd.rs` says why and speaks the protocol): the map's name looked up by uuid, the
//! daemon found by its control socket and pinned, `del map` asked on its socket from its network
//! namespace, the map verified gone, its wwid forgotten. The pidfd pin and the open of the
//! daemon's `ns/net` are made here directly: they are reached only once a live multipathd was
//! found, which no recording kernel can stand in for.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::kernel::Kernel;
use super::linux::{bounded, LinuxActuator};
use super::multipathd::{Reply, PROBE, SOCKET};
use super::{ActError, StepOutcome};
use crate::model::{DevNum, DeviceName};

impl<K: Kernel> LinuxActuator<K> {
    /// Removes the multipath map `uuid` through multipathd when a multipathd runs: `Ok(None)`
    /// when none does (the caller removes it with the ioctl). Called once the caller's
    /// preconditions (uuid, no active path, open count) hold.
    pub(super) fn dm_remove_via_multipathd(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        uuid: &str,
        deferred: bool,
    ) -> Result<Option<StepOutcome>, ActError> {
        let Some(wwid) = uuid.strip_prefix("mpath-") else { return Ok(None) };
        let left = "the map is left in place: it is never removed behind multipathd's back";
        let Some(daemon) = self.multipathd(device, left)? else { return Ok(None) };
        let pid = daemon.id.pid;
        if deferred {
            return Err(ActError::precondition(
                device,
                format!("multipathd runs (pid {pid}) and a deferred removal cannot go through it; {left}"),
            ));
        }
        // The map's name, looked up by uuid, still the planned number.
        let control_path = self.host().dev_node("mapper/control");
        let kernel = self.kernel();
        let header = kernel
            .dm_open(&control_path)
            .and_then(|c| kernel.dm_dev_status(&c, uuid))
            .map_err(|e| ActError::precondition(device, format!("DM_DEV_STATUS of uuid '{uuid}': {e}")))?;
        if header.dev != devnum {
            return Err(ActError::precondition(
                device,
                format!("uuid '{uuid}' is now device {}, not {devnum}: the map was recreated", header.dev),
            ));
        }
        let name = header.name;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(ActError::precondition(
                device,
                format!("map name {name:?} cannot be passed to multipathd; {left}"),
            ));
        }
        let command = format!("del map {name}");
        self.ask_del_map(device, &daemon, &command, left)?;
        // multipathd said ok: the map must be gone (looked up by uuid again).
        let still = kernel.dm_open(&control_path).and_then(|c| kernel.dm_dev_status(&c, uuid));
        match still {
            Ok(_) => {
                return Err(ActError::NotVerified {
                    device: device.clone(),
                    op: "multipathd del map",
                    reason: format!("the map {name} ({uuid}) is still there"),
                })
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV | libc::ENOENT)) => {}
            Err(e) => {
                return Err(ActError::precondition(
                    device,
                    format!("DM_DEV_STATUS of uuid '{uuid}' after removal: {e}"),
                ))
            }
        }
        let wwid_note = self.forget_wwid(device, wwid);
        let exe = daemon.id.exe_path.as_ref().map_or_else(|| "?".to_owned(), |p| p.display().to_string());
        tracing::info!(target: "audit", device = %device, map = %name, pid, start = daemon.id.start, exe = %exe, "map removed through multipathd");
        Ok(Some(StepOutcome::DoneVia(format!(
            "removed through multipathd (pid {pid}, started at tick {}, {exe}, '{command}'); {wwid_note}",
            daemon.id.start
        ))))
    }

    /// Sends `command` to `daemon` (multipathd, pinned) on its control socket, from a thread in
    /// its network namespace (opened while the pidfd shows it is still that process, and entered
    /// through that open file): `show daemon` first, the command only once that was answered.
    /// `Ok` only on `ok`; anything else fails the step, `left` saying what stays.
    fn ask_del_map(
        &self,
        device: &DeviceName,
        daemon: &crate::discover::process_identity::PinnedProcess,
        command: &str,
        left: &str,
    ) -> Result<(), ActError> {
        let pid = daemon.id.pid;
        // Its network namespace, opened while the pidfd shows it is still the process found
        // (its PID not reused), and entered through that open file.
        let ns_net = File::open(self.host().proc_pid(pid).join("ns/net")).map_err(|e| {
            ActError::precondition(
                device,
                format!("cannot open the network namespace of multipathd (pid {pid}): {e}; {left}"),
            )
        })?;
        if !daemon.still_running() {
            return Err(ActError::precondition(
                device,
                format!("multipathd (pid {pid}) exited while it was being asked; {left}"),
            ));
        }
        let ns_file: PathBuf = self.host().proc().join(format!("self/fd/{}", ns_net.as_raw_fd()));
        // The socket's own deadline ends before the thread's, so a silent daemon is reported as
        // such rather than as a hung thread.
        let io_timeout = self.timeout().mul_f64(0.8);
        let (cmd, ns, kernel) = (command.to_owned(), ns_file.clone(), self.kernel().clone());
        let (probe, reply) = bounded(device, "multipathd del map", self.timeout(), move || {
            kernel.multipathd_ask(&ns, &cmd, io_timeout)
        })
        .map_err(|e| match e {
            ActError::Syscall { source, .. } => ActError::precondition(
                device,
                format!("multipathd (pid {pid}) runs, but asking it to '{command}' through its control socket failed: {source}; {left}"),
            ),
            other => other,
        })?;
        let Some(reply) = reply else {
            return Err(ActError::precondition(
                device,
                format!(
                    "multipathd (pid {pid}) refused '{PROBE}' ({probe:?}); '{command}' was not sent; {left}"
                ),
            ));
        };
        match reply {
            Reply::Ok => {}
            Reply::Fail(why) => {
                let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
                return Err(ActError::precondition(
                    device,
                    format!("multipathd (pid {pid}) refused '{command}'{why}; {left}"),
                ));
            }
            Reply::Text(t) => {
                return Err(ActError::precondition(
                    device,
                    format!(
                        "multipathd (pid {pid}) answered '{command}' with {:?}, not ok; {left}",
                        t.trim()
                    ),
                ));
            }
        }
        drop(ns_net);
        Ok(())
    }

    /// Removes `wwid`'s line from the wwids file once its map is gone; what was done, in words
    /// (a failure is only logged: the map is gone, and multipathd writes a map's wwid again
    /// whenever it sets the map up).
    fn forget_wwid(&self, device: &DeviceName, wwid: &str) -> String {
        let wwids = self.host().multipath_wwids();
        let (path, id, kernel) = (wwids.clone(), wwid.to_owned(), self.kernel().clone());
        let edited =
            bounded(device, "edit the wwids file", self.timeout(), move || kernel.remove_wwid(&path, &id));
        match edited {
            Ok(true) => format!("wwid {wwid} removed from {}", wwids.display()),
            Ok(false) => format!("wwid {wwid} was not in {}", wwids.display()),
            Err(e) => {
                tracing::warn!(device = %device, wwid, "map removed through multipathd, but its wwid stays: {e}");
                format!("but wwid {wwid} could not be removed from {}: {e}", wwids.display())
            }
        }
    }

    /// The multipathd that owns its control socket, pinned (`None`: no multipathd runs). Never
    /// found by name alone: a process named `multipathd` must hold the listening socket bound to
    /// [`SOCKET`] in its network namespace and run as root. Refused (the step fails, `left` says
    /// what stays): a process not root holding that socket (someone squats the name); a root
    /// process named multipathd holding none (a daemon starting, or stopping: which maps it
    /// owns cannot be told); owners in two network namespaces (which one owns the map?).
    pub(super) fn multipathd(
        &self,
        device: &DeviceName,
        left: &str,
    ) -> Result<Option<crate::discover::process_identity::PinnedProcess>, ActError> {
        let found = self.kernel().multipathd_owners(self.host()).map_err(|e| {
            ActError::precondition(device, format!("cannot tell whether multipathd runs ({e}); {left}"))
        })?;
        if let Some(p) = found.owners.iter().find(|p| p.id.euid != Some(0)) {
            return Err(ActError::precondition(
                device,
                format!(
                    "process {} (uid {}) holds multipathd's control socket @{SOCKET} but does not run as root: it is not multipathd, and whether the map is multipathd's cannot be told; {left}",
                    p.id.pid,
                    p.id.euid.map_or("?".to_owned(), |u| u.to_string())
                ),
            ));
        }
        let mut namespaces: Vec<u64> = found
            .owners
            .iter()
            .filter_map(|p| {
                std::fs::metadata(self.host().proc_pid(p.id.pid).join("ns/net")).ok().map(|m| m.ino())
            })
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let pids: Vec<String> = found.owners.iter().map(|p| p.id.pid.to_string()).collect();
        if namespaces.len() > 1 || (found.owners.len() > 1 && namespaces.len() != 1) {
            return Err(ActError::precondition(
                device,
                format!(
                    "multipathd runs in {} network namespaces (pids {}): which one owns the map is unclear; {left}",
                    namespaces.len(),
                    pids.join(", ")
                ),
            ));
        }
        if found.owners.is_empty() {
            let root: Vec<String> = found
                .others
                .iter()
                .filter(|&&pid| {
                    let status = self
                        .kernel()
                        .read_to_string(&self.host().proc_pid(pid).join("status"))
                        .unwrap_or_default();
                    crate::discover::process_identity::effective_uid(&status) == Some(0)
                })
                .map(u32::to_string)
                .collect();
            if !root.is_empty() {
                return Err(ActError::precondition(
                    device,
                    format!(
                        "a root process named multipathd (pid {}) runs but holds no control socket @{SOCKET} (starting, stopping, or a client): whether the map is multipathd's cannot be told; {left}",
                        root.join(", ")
                    ),
                ));
            }
            // Only processes that are not root bear the name: none of them is multipathd.
            return Ok(None);
        }
        Ok(found.owners.into_iter().next())
    }
}
