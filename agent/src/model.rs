//! The plain data every layer shares: device numbers, block devices, holders, namespaces.
//!
//! Kernel identifiers arrive as text from procfs and sysfs; they are validated once, here, into
//! newtypes ([`DevNum`], [`DeviceName`], [`MountNsId`]) so the rest of the code cannot mix them up.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A block device number (`dev_t`) as major and minor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// From a userspace `dev_t` (as `st_dev`/`st_rdev` or the loop driver's `lo_device`).
    pub fn from_dev_t(dev: u64) -> Self {
        Self::new(libc::major(dev), libc::minor(dev))
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Why a `MAJ:MIN` string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not MAJ:MIN")]
pub struct BadDevNum(pub String);

impl FromStr for DevNum {
    type Err = BadDevNum;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadDevNum(s.chars().take(64).collect());
        let (maj, min) = s.split_once(':').ok_or_else(bad)?;
        let parse = |t: &str| -> Result<u32, BadDevNum> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse().map_err(|_| bad())
        };
        Ok(Self::new(parse(maj)?, parse(min)?))
    }
}

/// A kernel block device name as it appears in `/sys/class/block` (`sda`, `loop0`, `dm-3`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DeviceName(String);

/// Why a device name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a kernel block device name")]
pub struct BadDeviceName(pub String);

impl DeviceName {
    /// Kernel names are short, have no `/` (the kernel writes `!` instead) and no white space.
    pub fn new(name: &str) -> Result<Self, BadDeviceName> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name != "."
            && name != ".."
            && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        if ok {
            Ok(Self(name.to_owned()))
        } else {
            Err(BadDeviceName(name.chars().take(64).collect()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A mount namespace, identified by the inode of its `ns/mnt` file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct MountNsId(pub u64);

impl MountNsId {
    /// Parses the text of an `ns/mnt` link: `mnt:[4026531841]`.
    pub fn from_link(text: &str) -> Option<Self> {
        let inner = text.strip_prefix("mnt:[")?.strip_suffix(']')?;
        inner.parse().ok().map(Self)
    }
}

impl fmt::Display for MountNsId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mnt:[{}]", self.0)
    }
}

/// What sort of block device this is, from its sysfs directory and name.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[value(rename_all = "snake_case")]
pub enum DeviceKind {
    Disk,
    Partition,
    Loop,
    Dm,
    Md,
    Rbd,
    Nbd,
    Zram,
    Other,
}

impl DeviceKind {
    /// Every kind, in a fixed order.
    pub const ALL: [DeviceKind; 9] = [
        Self::Disk,
        Self::Partition,
        Self::Loop,
        Self::Dm,
        Self::Md,
        Self::Rbd,
        Self::Nbd,
        Self::Zram,
        Self::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disk => "disk",
            Self::Partition => "partition",
            Self::Loop => "loop",
            Self::Dm => "dm",
            Self::Md => "md",
            Self::Rbd => "rbd",
            Self::Nbd => "nbd",
            Self::Zram => "zram",
            Self::Other => "other",
        }
    }
}

/// The loop driver's view of a loop device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopInfo {
    /// `loop/backing_file`, as the kernel prints it (path in the reader's namespace).
    pub backing_file: String,
    /// The backing file was deleted (the kernel appends ` (deleted)`).
    pub backing_deleted: bool,
    pub offset: u64,
    pub sizelimit: u64,
    pub autoclear: bool,
    pub read_only: bool,
    /// Device the backing file lives on (`st_dev`), from `LOOP_GET_STATUS64` when readable.
    pub backing_dev: Option<DevNum>,
    /// Inode of the backing file, from `LOOP_GET_STATUS64` when readable.
    pub backing_inode: Option<u64>,
}

/// Device-mapper identity from `dm/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DmInfo {
    pub name: String,
    pub uuid: String,
    pub suspended: bool,
}

/// One block device (or partition) as sysfs shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockDevice {
    pub name: DeviceName,
    pub devnum: DevNum,
    pub kind: DeviceKind,
    /// Size in bytes (`size` is in 512-byte sectors).
    pub size_bytes: u64,
    pub read_only: bool,
    /// The whole disk a partition belongs to.
    pub parent: Option<DeviceName>,
    /// `holders/`: devices stacked on this one (dm, md).
    pub holders: Vec<DeviceName>,
    /// `slaves/`: devices this one is stacked on.
    pub slaves: Vec<DeviceName>,
    pub loop_info: Option<LoopInfo>,
    pub dm: Option<DmInfo>,
}

impl BlockDevice {
    /// A loop device with no backing file: present in /sys but unused.
    pub fn is_unbound_loop(&self) -> bool {
        self.kind == DeviceKind::Loop && self.loop_info.is_none()
    }
}

/// How something holds a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HolderKind {
    /// A mount of the device's filesystem, in some mount namespace.
    Mount,
    /// An open file descriptor on the device node itself (`st_rdev`).
    OpenDevice,
    /// An open file descriptor on a file of the device's filesystem (`st_dev`).
    OpenFile,
    /// A process whose working directory is on the device's filesystem.
    Cwd,
    /// A process whose root directory is on the device's filesystem.
    Root,
    /// A memory mapping of a file on the device's filesystem.
    Mmap,
    /// The device, or a file on it, is active swap.
    Swap,
    /// Another block device is stacked on this one (dm/md holder, or a partition).
    StackedDevice,
    /// A loop device whose backing file lives on this device's filesystem.
    LoopBacking,
}

impl HolderKind {
    /// Every kind, in a fixed order (metrics export each, even at zero).
    pub const ALL: [HolderKind; 9] = [
        Self::Mount,
        Self::OpenDevice,
        Self::OpenFile,
        Self::Cwd,
        Self::Root,
        Self::Mmap,
        Self::Swap,
        Self::StackedDevice,
        Self::LoopBacking,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mount => "mount",
            Self::OpenDevice => "open_device",
            Self::OpenFile => "open_file",
            Self::Cwd => "cwd",
            Self::Root => "root",
            Self::Mmap => "mmap",
            Self::Swap => "swap",
            Self::StackedDevice => "stacked_device",
            Self::LoopBacking => "loop_backing",
        }
    }
}

/// Who a process is, for reports: enough to find it in `ps` and in Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub comm: String,
    /// `cmdline` with NULs turned into spaces, at most [`crate::discover::processes::CMDLINE_MAX`]
    /// bytes; `None` when the process was in D state and reading it could block.
    pub cmdline: Option<String>,
    /// Single-letter state from `stat` (`R`, `S`, `D`, `Z`...).
    pub state: char,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devnum_parses_and_rejects() {
        assert_eq!("250:0".parse::<DevNum>(), Ok(DevNum::new(250, 0)));
        assert_eq!("7:12".parse::<DevNum>().map(|d| d.to_string()).as_deref(), Ok("7:12"));
        for bad in ["", "7", "7:", ":1", "a:b", "7:1:2", "-1:0", "99999999999:0", " 7:0"] {
            assert!(bad.parse::<DevNum>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn devnum_from_dev_t_round_trips() {
        let d = libc::makedev(259, 300);
        assert_eq!(DevNum::from_dev_t(d), DevNum::new(259, 300));
    }

    #[test]
    fn device_names() {
        assert!(DeviceName::new("cciss!c0d0").is_ok());
        for bad in ["", "a/b", "..", "a b", "x\0"] {
            assert!(DeviceName::new(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn ns_links() {
        assert_eq!(MountNsId::from_link("mnt:[4026531841]"), Some(MountNsId(4026531841)));
        assert_eq!(MountNsId::from_link("net:[4026531841]"), None);
        assert_eq!(MountNsId::from_link("mnt:[x]"), None);
    }
}
