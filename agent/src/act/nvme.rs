//! The Linux actuator's NVMe over Fabrics step: `delete_controller`.
//!
//! Right before the write, the controller must still be the planned one (a controller name,
//! `nvmeN`, is reused by the next connect): same subsystem NQN, transport, target address and
//! cntlid; it must not be live, no other controller of its subsystem may be live, and the kernel
//! must say that none of the namespaces going with it is in use (sysfs `holders/` of every
//! namespace disk under it and of its subsystem's heads; for each head or namespace with a
//! device node, the exclusive open, live filesystems and loop devices of [`crate::discover::probe`]).
//! The write makes the kernel tear the controller down synchronously (`nvme_delete_ctrl_sync`),
//! which waits on the transport: it runs on its own thread with the deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::kernel::Kernel;
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::discover::nvme::{CtrlState, NsName, NvmeAddress};
use crate::discover::probe;
use crate::discover::DiscoverError;
use crate::model::{DevNum, DeviceName};
use crate::plan::step::Action;

/// The planned controller, as the step names it.
struct PlannedController<'a> {
    pub controller: &'a str,
    pub subsysnqn: &'a str,
    pub transport: &'a str,
    pub address: &'a str,
    pub cntlid: Option<u16>,
}

impl<K: Kernel> LinuxActuator<K> {
    /// A sysfs attribute of `dir`, without its trailing newline (`None`: unreadable).
    fn attr(&self, dir: &Path, name: &str) -> Option<String> {
        let text = self.kernel().read_to_string(&dir.join(name));
        text.ok().map(|s| s.trim_end_matches('\n').to_owned())
    }

    /// Runs an `nvme_delete_controller` step as planned.
    pub(super) fn nvme_delete_step(
        &self,
        device: &DeviceName,
        action: &Action,
    ) -> Result<StepOutcome, ActError> {
        let Action::NvmeDeleteController { controller, subsysnqn, transport, address, cntlid } = action
        else {
            return Err(ActError::Precondition {
                device: device.clone(),
                reason: format!("not an NVMe controller deletion: {action:?}"),
            });
        };
        let planned = PlannedController { controller, subsysnqn, transport, address, cntlid: *cntlid };
        self.nvme_delete_controller(device, &planned)
    }

    fn nvme_class(&self) -> PathBuf {
        self.host().sys().join("class/nvme")
    }

    /// The controller's directory if it is still the planned one; `Ok(None)` when it is gone
    /// (or its name now belongs to another controller, which is the planned one gone).
    fn nvme_check(
        &self,
        device: &DeviceName,
        c: &PlannedController<'_>,
    ) -> Result<Option<PathBuf>, ActError> {
        let dir = self.nvme_class().join(c.controller);
        let Some(nqn) = self.attr(&dir, "subsysnqn") else { return Ok(None) };
        let transport = self.attr(&dir, "transport").unwrap_or_default();
        let address = NvmeAddress::parse(&self.attr(&dir, "address").unwrap_or_default()).target();
        let cntlid = self.attr(&dir, "cntlid").and_then(|s| s.trim().parse::<u16>().ok());
        if nqn.trim() != c.subsysnqn
            || transport.trim() != c.transport
            || address != c.address
            || cntlid != c.cntlid
        {
            return Err(ActError::precondition(
                device,
                format!(
                    "{} is now {transport} {address} of subsystem {} (cntlid {}), not the planned controller ({} {} of {}, cntlid {}): its name was reused",
                    c.controller,
                    nqn.trim(),
                    cntlid.map_or("?".into(), |i| i.to_string()),
                    c.transport,
                    c.address,
                    c.subsysnqn,
                    c.cntlid.map_or("?".into(), |i| i.to_string()),
                ),
            ));
        }
        Ok(Some(dir))
    }

    /// Why the kernel says a namespace going with the controller is in use (empty: none).
    fn nvme_users(&self, device: &DeviceName, ctrl_dir: &Path) -> Result<Vec<String>, ActError> {
        let unreadable = |e: DiscoverError| ActError::precondition(device, e.to_string());
        let mut disks: Vec<String> = self
            .kernel()
            .list_dir(ctrl_dir)
            .map_err(unreadable)?
            .into_iter()
            .filter(|n| NsName::parse(n).is_some())
            .collect();
        // The subsystem's heads and its other controllers (the subsystem links each controller).
        let mut others = Vec::new();
        let subsys_class = self.host().sys().join("class/nvme-subsystem");
        for s in self.kernel().list_dir(&subsys_class).map_err(unreadable)? {
            let sdir = subsys_class.join(&s);
            let ctrl = ctrl_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if !self.kernel().exists(&sdir.join(&ctrl)) {
                continue;
            }
            for n in self.kernel().list_dir(&sdir).map_err(unreadable)? {
                if NsName::parse(&n).is_some() {
                    disks.push(n);
                } else if n.starts_with("nvme") && n != ctrl && n.bytes().skip(4).all(|b| b.is_ascii_digit())
                {
                    others.push(n);
                }
            }
        }
        let mut users = Vec::new();
        for o in others {
            let state = self.attr(&self.nvme_class().join(&o), "state").unwrap_or_default();
            if CtrlState::parse(&state).is_live() {
                users.push(format!("controller {o} of the same subsystem is live"));
            }
        }
        disks.sort();
        disks.dedup();
        for disk in disks {
            let dir = self.host().sys_class_block().join(&disk);
            let holders = self.kernel().list_dir(&dir.join("holders")).map_err(unreadable)?;
            if !holders.is_empty() {
                users.push(format!("{disk}: sysfs holders/ lists {}", holders.join(", ")));
            }
            let Some(dev) = self.attr(&dir, "dev").and_then(|d| d.trim().parse::<DevNum>().ok()) else {
                continue;
            };
            let Ok(name) = DeviceName::new(&disk) else { continue };
            if !self.kernel().exists(&self.host().dev_node(&disk)) {
                continue; // a hidden per-path device has no node; its holders/ were read
            }
            let word = self.kernel().kernel_word(self.host(), &name, dev, self.timeout());
            users.extend(word.users().into_iter().map(|u| format!("{disk}: {u}")));
            users.extend(word.unreadable.iter().map(|u| format!("{disk}: cannot read {u}")));
            if let probe::Claim::Inconclusive(why) = &word.claim {
                users.push(format!("{disk}: the exclusive open could not tell ({why})"));
            }
        }
        Ok(users)
    }

    fn nvme_delete_controller(
        &self,
        device: &DeviceName,
        c: &PlannedController<'_>,
    ) -> Result<StepOutcome, ActError> {
        let Some(dir) = self.nvme_check(device, c)? else { return Ok(StepOutcome::AlreadyAbsent) };
        let state = CtrlState::parse(&self.attr(&dir, "state").unwrap_or_default());
        match state {
            CtrlState::Live => {
                return Err(ActError::precondition(
                    device,
                    format!("controller {} is live again: a live controller is never deleted", c.controller),
                ))
            }
            CtrlState::Deleting | CtrlState::DeletingNoio => {
                return self.nvme_wait_gone(device, c, &dir, Duration::from_secs(5))
            }
            _ => {}
        }
        let users = self.nvme_users(device, &dir)?;
        if !users.is_empty() {
            return Err(ActError::precondition(
                device,
                format!("not deleting {}: {}", c.controller, users.join("; ")),
            ));
        }
        let (path, kernel) = (dir.join("delete_controller"), self.kernel().clone());
        bounded(device, "write delete_controller", self.timeout(), move || kernel.write(&path, b"1\n"))?;
        self.nvme_wait_gone(device, c, &dir, Duration::from_secs(5))
    }

    /// Verifies the controller is gone (its directory, or the planned controller behind its name).
    fn nvme_wait_gone(
        &self,
        device: &DeviceName,
        c: &PlannedController<'_>,
        dir: &Path,
        within: Duration,
    ) -> Result<StepOutcome, ActError> {
        let started = Instant::now();
        loop {
            match self.nvme_check(device, c) {
                Ok(None) | Err(ActError::Precondition { .. }) => return Ok(StepOutcome::Done),
                Ok(Some(_)) if started.elapsed() > within => {
                    return Err(ActError::NotVerified {
                        device: device.clone(),
                        op: "write delete_controller",
                        reason: format!("{} is still in sysfs after {within:?}", dir.display()),
                    })
                }
                Ok(Some(_)) => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
#[path = "nvme_tests.rs"]
mod tests;
