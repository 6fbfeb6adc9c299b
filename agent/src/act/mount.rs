//! The Linux actuator's mount step: detach one planned mount inside its own namespace.
//!
//! Right before it: the namespace entry still enters the planned namespace (its inode: PID
//! reuse), the mount ID still exists there with the planned device, and no mount sits beneath it
//! (detaching would take those too). Then the detach ([`Kernel::unmount_in_ns`]: `openat2`
//! refusing symlinks, the mount ID checked, `umount2` through the open file) on a bounded
//! thread, and the mount must be gone from that namespace's table.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::kernel::{Kernel, Open};
use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::discover::is_gone;
use crate::discover::mountinfo::{self, MountEntry};
use crate::discover::namespaces::NsEntry;
use crate::model::{DevNum, DeviceName, KernelText, MountNsId};

impl<K: Kernel> LinuxActuator<K> {
    /// The namespace's current mount table, read the same way the plan read it.
    fn mount_table(&self, device: &DeviceName, via: &NsEntry) -> Result<Option<Vec<MountEntry>>, ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        let (path, text) = match via {
            NsEntry::Task { pid, tid } => {
                let path = self.host().proc_task(*pid, *tid).join("mountinfo");
                match self.kernel().read(&path) {
                    Ok(t) if !t.is_empty() => (path, t),
                    Ok(_) => return Ok(None),
                    Err(e) if is_gone(&e) => return Ok(None),
                    Err(e) => return Err(fail(format!("cannot read {}: {e}", path.display()))),
                }
            }
            NsEntry::Nsfs { .. } | NsEntry::Fd { .. } | NsEntry::TaskNamespace { .. } => {
                let file = via.ns_file(self.host());
                let (proc, kernel) = (self.host().proc().to_owned(), self.kernel().clone());
                let text = bounded(device, "read mountinfo", self.timeout(), move || {
                    kernel.read_mountinfo_in(&file, &proc)
                });
                match text {
                    Ok(t) => (via.ns_file(self.host()), t),
                    Err(ActError::Syscall { source, .. }) if is_gone(&source) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        };
        mountinfo::parse(&text).map(Some).map_err(|e| fail(format!("malformed {}: {e}", path.display())))
    }

    fn ns_of(&self, via: &NsEntry) -> Option<MountNsId> {
        match via {
            NsEntry::Task { pid, tid } | NsEntry::TaskNamespace { pid, tid } => {
                self.kernel().task_mount_ns(&self.host().proc_task(*pid, *tid))
            }
            NsEntry::Nsfs { .. } | NsEntry::Fd { .. } => {
                self.kernel().stat(&via.ns_file(self.host())).ok().map(|s| MountNsId(s.ino))
            }
        }
    }

    /// `mount_dev` is the mount's own device as mountinfo shows it (a btrfs mount's anonymous
    /// `0:NN`, not the block device the step is for).
    pub(super) fn detach_mount(
        &self,
        device: &DeviceName,
        mount_dev: DevNum,
        namespace: MountNsId,
        via: &NsEntry,
        mount_id: u32,
    ) -> Result<StepOutcome, ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        self.same_namespace(via, namespace).map_err(fail)?;
        let Some(table) = self.mount_table(device, via)? else {
            return Err(fail(format!(
                "the namespace entry ({}) is gone; scan again to re-plan",
                via.describe()
            )));
        };
        let Some(target) = still_planned(&table, mount_id, mount_dev).map_err(fail)? else {
            return Ok(StepOutcome::AlreadyAbsent);
        };
        self.unmount_in_namespace(device, via, &target.mount_point, mount_id)?;
        match self.mount_table(device, via)? {
            Some(t) if t.iter().any(|m| m.mount_id == mount_id) => Err(ActError::NotVerified {
                device: device.clone(),
                op: "umount2(MNT_DETACH)",
                reason: format!("mount {mount_id} is still in namespace {}", namespace.0),
            }),
            _ => Ok(StepOutcome::Done),
        }
    }

    /// Whether `via` still enters `namespace`, on this host's live `/proc`: why not, if not.
    fn same_namespace(&self, via: &NsEntry, namespace: MountNsId) -> Result<(), String> {
        if !self.host().is_live() {
            return Err(format!(
                "{} is not this host's /proc: namespaces cannot be entered",
                self.host().proc().display()
            ));
        }
        match self.ns_of(via) {
            None => Err(format!("the namespace entry ({}) is gone; scan again to re-plan", via.describe())),
            Some(ns) if ns != namespace => Err(format!(
                "{} is now in namespace {} not {}: PID reused?",
                via.describe(),
                ns.0,
                namespace.0
            )),
            Some(_) => Ok(()),
        }
    }

    /// `umount2(MNT_DETACH)` of mount `mount_id` at `mount_point`, inside the namespace `via`
    /// enters, on a thread of its own with a deadline.
    fn unmount_in_namespace(
        &self,
        device: &DeviceName,
        via: &NsEntry,
        mount_point: &KernelText,
        mount_id: u32,
    ) -> Result<(), ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        let ns_file = via.ns_file(self.host());
        // For a task, resolve the mount point from the task's own root (it may be chrooted); for
        // an entered namespace, from the namespace root that setns gives us.
        let root = match via {
            NsEntry::Task { pid, tid } => {
                let p = self.host().proc_task(*pid, *tid).join("root");
                let f = self
                    .kernel()
                    .open(&p, Open::DirPath)
                    .map_err(|e| fail(format!("cannot open {}: {e}", p.display())))?;
                Some(f)
            }
            _ => None,
        };
        // Our procfs, opened before entering: the namespace may have none of its own.
        let proc = self
            .kernel()
            .open(self.host().proc(), Open::Read)
            .map_err(|e| fail(format!("cannot open {}: {e}", self.host().proc().display())))?;
        // The raw bytes, never the escaped text: a name need not be UTF-8.
        let bytes = mount_point.as_bytes();
        let rel = PathBuf::from(match &bytes[bytes.iter().take_while(|&&b| b == b'/').count()..] {
            b"" => OsStr::new("."),
            r => OsStr::from_bytes(r),
        });
        let kernel = self.kernel().clone();
        bounded(device, "umount2(MNT_DETACH)", self.timeout(), move || {
            kernel.unmount_in_ns(&ns_file, root, proc, rel, mount_id)
        })?;
        Ok(())
    }
}

/// Mount `mount_id` in `table`, still of `mount_dev` and with no mount beneath it (detaching
/// would take those too): `None` when it is gone, why not when it has changed.
fn still_planned(
    table: &[MountEntry],
    mount_id: u32,
    mount_dev: DevNum,
) -> Result<Option<&MountEntry>, String> {
    let Some(target) = table.iter().find(|m| m.mount_id == mount_id) else {
        return Ok(None);
    };
    if target.devnum != mount_dev {
        return Err(format!(
            "mount {mount_id} is now device {} at {}, not {mount_dev}",
            target.devnum, target.mount_point
        ));
    }
    let beneath: Vec<&KernelText> =
        table.iter().filter(|m| m.parent_id == mount_id).map(|m| &m.mount_point).collect();
    if !beneath.is_empty() {
        return Err(format!(
            "{} mount(s) sit beneath {} (first: {}); detaching would take them too: release those first",
            beneath.len(),
            target.mount_point,
            beneath[0]
        ));
    }
    Ok(Some(target))
}

#[cfg(test)]
#[path = "mount_tests.rs"]
mod tests;
