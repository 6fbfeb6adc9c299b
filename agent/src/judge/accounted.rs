//! What a plan accounts for on a device right before a step, as the gates compare the kernel's
//! word with it ([`crate::judge::gates::kernel_word`]: the claims it expects) and a dm device's
//! open count ([`crate::judge::gates::openers`]: the opens it expects).

use crate::model::DeviceName;

/// What a plan accounts for on one device, so the kernel's claims from it are expected: mounts
/// it releases before this step, and devices stacked on it that it removes first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accounted {
    /// The plan releases mounts of the device's filesystem before this step (so the filesystem
    /// legitimately claims the device, and lives on it, until then).
    pub filesystem_released: bool,
    /// Devices stacked on it that the plan removes after this step and before the device's
    /// own removal (LVs, crypt mappings, kpartx partition maps): their tables claim it.
    pub stacked_removed: Vec<DeviceName>,
    /// An inconclusive exclusive open is acceptable (an offline SCSI disk refuses opens).
    pub open_may_fail: bool,
}

/// The openers of a dm device a plan accounts for right before a step on it: each is one open
/// of the device in the kernel's count (`md->open_count`, one per open file description, per
/// mounted superblock, per dm table stacked on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Openers {
    /// Filesystems on it that the plan releases (a mounted superblock opens the device once).
    pub filesystems: usize,
    /// Devices stacked on it that the plan removes (each table opens the device once).
    pub stacked: Vec<DeviceName>,
    /// Open fds of the device node the scan saw, held by processes the plan expects to let go
    /// (readers stuck on a dead map), counted per fd.
    pub fds: usize,
    /// The distinct open files (open file descriptions) those fds are, as the kernel compared
    /// them after the count was read (`kcmp`, [`crate::discover::open_files`]): fds that share
    /// one (dup, fork, `SCM_RIGHTS`) are one open of the device. `Err`: it cannot tell, and why.
    pub files: Result<usize, String>,
}

impl Default for Openers {
    fn default() -> Self {
        Self { filesystems: 0, stacked: Vec::new(), fds: 0, files: Ok(0) }
    }
}

impl Openers {
    /// How many opens of the device the plan accounts for (`Err`: the stuck readers' fds could
    /// not be told apart into open files).
    pub fn total(&self) -> Result<usize, &str> {
        let files = self.files.as_ref().map_err(String::as_str)?;
        Ok(self.filesystems + self.stacked.len() + files)
    }

    /// The openers in words, for a refusal.
    pub(super) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.filesystems > 0 {
            parts.push(format!("{} filesystem(s) released", self.filesystems));
        }
        if !self.stacked.is_empty() {
            let names: Vec<&str> = self.stacked.iter().map(DeviceName::as_str).collect();
            parts.push(format!("stacked {} removed", names.join(", ")));
        }
        match &self.files {
            Ok(0) if self.fds == 0 => {}
            Ok(n) => parts.push(format!("{n} open file(s) of stuck readers, {} fd(s)", self.fds)),
            Err(_) => parts.push(format!("{} fd(s) of stuck readers", self.fds)),
        }
        if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join(", ")
        }
    }
}
