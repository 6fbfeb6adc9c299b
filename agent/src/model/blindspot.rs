//! What a scan could not see, and which devices that could hide a holder of.
//!
//! A scan that skips something (a process whose `ns/mnt`, `fd/` or `maps` cannot be read, a
//! namespace that cannot be entered, mounts hidden outside a chrooted task's root, a failed
//! device-mapper or sysfs read) is not a complete scan, and "nothing holds it" is then not
//! evidence. Every such gap is recorded as a [`BlindSpot`] with its [`Reach`]; policy makes a
//! cleanup candidate within reach of one `unknown`, never `stale`, and the engine refuses a
//! destructive step while one reaches the device.

use std::fmt;

use serde::Serialize;

use crate::model::{BlockDevice, DeviceKind, DeviceName};

/// Which devices a blind spot could hide a holder of.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reach {
    /// Any device: an unreadable process could mount, open or map anything.
    AnyDevice,
    /// These devices (mounts of them hidden from the task whose table was read, a device whose
    /// sysfs directory could not be read, the members of a filesystem whose mount was not joined).
    Devices(Vec<DeviceName>),
    /// Every device of this kind (the device-mapper tables, the rbd or nbd inventory, the SCSI
    /// inventory could not be read).
    Kind(DeviceKind),
}

impl fmt::Display for Reach {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::AnyDevice => f.write_str("any device"),
            Self::Devices(d) => {
                let names: Vec<&str> = d.iter().map(DeviceName::as_str).collect();
                f.write_str(&names.join(", "))
            }
            Self::Kind(k) => write!(f, "every {} device", k.as_str()),
        }
    }
}

/// One thing a scan could not see.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlindSpot {
    /// What could not be read, and why: one line naming the file, process or device.
    pub what: String,
    pub reach: Reach,
    /// Whether it could hide a whole mount namespace (a process or task whose namespace or fds
    /// could not be read, a namespace that could not be entered or read, processes the run
    /// cannot see at all, a mount a namespace's table lacks), and so a mount anywhere: what the
    /// question "is anything mounted on this directory" cannot rest on. False for what hides only
    /// a device's holder while every process and every namespace's whole table was seen (a loop
    /// device's backing, swap, a live filesystem, a protected path, a device's sysfs).
    pub hides_mount_namespace: bool,
}

impl Serialize for BlindSpot {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            what: &'a str,
            could_hide: String,
        }
        Flat { what: &self.what, could_hide: self.reach.to_string() }.serialize(s)
    }
}

impl fmt::Display for BlindSpot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (could hide a holder of {})", self.what, self.reach)
    }
}

impl BlindSpot {
    /// Could hide a holder of any device, a mount namespace among them.
    pub fn any(what: impl Into<String>) -> Self {
        Self { what: what.into(), reach: Reach::AnyDevice, hides_mount_namespace: true }
    }

    /// Could hide a holder of any device, while every process and mount namespace was seen.
    pub fn any_device(what: impl Into<String>) -> Self {
        Self { what: what.into(), reach: Reach::AnyDevice, hides_mount_namespace: false }
    }

    pub fn kind(kind: DeviceKind, what: impl Into<String>) -> Self {
        Self { what: what.into(), reach: Reach::Kind(kind), hides_mount_namespace: false }
    }

    pub fn devices(devices: Vec<DeviceName>, what: impl Into<String>) -> Self {
        Self { what: what.into(), reach: Reach::Devices(devices), hides_mount_namespace: false }
    }

    /// The same, said to hide a mount of a namespace whose table was read (a mount `statmount`
    /// sees that the table's text lacks): the table is not whole, so a mount anywhere may be
    /// missing from it.
    pub fn hiding_a_mount(self) -> Self {
        Self { hides_mount_namespace: true, ..self }
    }

    /// Whether this blind spot could hide a holder of `d`.
    pub fn reaches(&self, d: &BlockDevice) -> bool {
        match &self.reach {
            Reach::AnyDevice => true,
            Reach::Devices(list) => list.contains(&d.name),
            Reach::Kind(k) => d.kind == *k,
        }
    }
}

/// The blind spots among `spots` that reach `device`.
pub fn reaching<'a>(spots: &'a [BlindSpot], device: &BlockDevice) -> Vec<&'a BlindSpot> {
    spots.iter().filter(|b| b.reaches(device)).collect()
}
