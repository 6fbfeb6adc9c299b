//! The plain data every layer shares: device numbers, block devices, holders, namespaces.
//!
//! Kernel identifiers arrive as text from procfs and sysfs; they are validated once, here, into
//! newtypes ([`DevNum`], [`DeviceName`], [`MountNsId`]) so the rest of the code cannot mix them up.

pub mod blindspot;
pub mod opt_ins;
pub mod scan_stats;
pub mod small_set;

use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::str::FromStr;

/// Bytes from the kernel that name something: a path, `comm`, `cmdline`, a filesystem type,
/// mount options. The kernel does not promise UTF-8 (any user with an unprivileged user
/// namespace can mount on a directory named `d\xff`), so these are kept as bytes and only
/// escaped for output, losslessly (see [`KernelText::escaped`]). Shared, never changed once made:
/// a copy is a reference (a node's image disk has thousands of holders, each naming its
/// process's command line and a path, and the graph is joined again at every mount event).
#[derive(Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KernelText(std::sync::Arc<[u8]>);

impl KernelText {
    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        Self(bytes.into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.0.to_vec()
    }

    /// The raw bytes as an OS string, for syscalls (never the escaped text).
    pub fn as_os_str(&self) -> &OsStr {
        OsStr::from_bytes(&self.0)
    }

    /// The raw bytes as a path, for syscalls.
    pub fn as_path(&self) -> &Path {
        Path::new(self.as_os_str())
    }

    /// The text, when it is valid UTF-8.
    pub fn to_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Lossless, readable text: valid UTF-8 passes through, except `\` which becomes `\\`;
    /// control characters (C0, DEL, C1) and every byte of an invalid UTF-8 sequence become
    /// `\xNN` (lower-case hex) per byte. [`KernelText::unescape`] reverses it exactly.
    pub fn escaped(&self) -> Cow<'_, str> {
        escape_bytes(&self.0)
    }

    /// Reverses [`KernelText::escaped`]: `\\` is a backslash, `\xNN` a byte; any other
    /// backslash is kept as it is.
    pub fn unescape(text: &str) -> KernelText {
        let b = text.as_bytes();
        if !b.contains(&b'\\') {
            return Self(b.into());
        }
        let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' {
                match b.get(i + 1) {
                    Some(b'\\') => {
                        out.push(b'\\');
                        i += 2;
                        continue;
                    }
                    Some(b'x') => {
                        if let (Some(h), Some(l)) =
                            (b.get(i + 2).copied().and_then(hex), b.get(i + 3).copied().and_then(hex))
                        {
                            out.push((h << 4) | l);
                            i += 4;
                            continue;
                        }
                    }
                    _ => {}
                }
            }
            out.push(b[i]);
            i += 1;
        }
        Self(out.into())
    }
}

/// The escape of [`KernelText::escaped`], for any bytes.
pub fn escape_bytes(bytes: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(bytes) {
        if !s.chars().any(|c| c == '\\' || c.is_control()) {
            return Cow::Borrowed(s);
        }
    }
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() + 8);
    let hex = |out: &mut String, b: &[u8]| {
        for byte in b {
            let _ = write!(out, "\\x{byte:02x}");
        }
    };
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c == '\\' {
                out.push_str("\\\\");
            } else if c.is_control() {
                hex(&mut out, c.encode_utf8(&mut [0; 4]).as_bytes());
            } else {
                out.push(c);
            }
        }
        hex(&mut out, chunk.invalid());
    }
    Cow::Owned(out)
}

/// Text from sysfs attributes kept as `String`: unchanged when it is UTF-8, escaped as
/// [`KernelText::escaped`] when it is not (so a name can never fail a scan).
pub fn lossless_string(bytes: Vec<u8>) -> String {
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => escape_bytes(e.as_bytes()).into_owned(),
    }
}

impl From<&str> for KernelText {
    fn from(s: &str) -> Self {
        Self(s.as_bytes().into())
    }
}

impl From<String> for KernelText {
    fn from(s: String) -> Self {
        Self(s.into_bytes().into())
    }
}

impl From<&[u8]> for KernelText {
    fn from(b: &[u8]) -> Self {
        Self(b.into())
    }
}

impl From<Vec<u8>> for KernelText {
    fn from(b: Vec<u8>) -> Self {
        Self(b.into())
    }
}

impl PartialEq<str> for KernelText {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other.as_bytes()
    }
}

impl PartialEq<&str> for KernelText {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == *other.as_bytes()
    }
}

impl fmt::Display for KernelText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.escaped())
    }
}

impl fmt::Debug for KernelText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KernelText({:?})", self.escaped())
    }
}

impl Serialize for KernelText {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.escaped())
    }
}

impl<'de> Deserialize<'de> for KernelText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        Ok(Self::unescape(&s))
    }
}

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
    /// An NVMe namespace: a native-multipath head (`nvme<S>n<N>`), one of its hidden per-path
    /// devices (`nvme<S>c<C>n<N>`), or a namespace without multipath (`nvme<C>n<N>`).
    NvmeNamespace,
}

impl DeviceKind {
    /// Every kind, in a fixed order.
    pub const ALL: [DeviceKind; 10] = [
        Self::Disk,
        Self::Partition,
        Self::Loop,
        Self::Dm,
        Self::Md,
        Self::Rbd,
        Self::Nbd,
        Self::Zram,
        Self::Other,
        Self::NvmeNamespace,
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
            Self::NvmeNamespace => "nvme_namespace",
        }
    }
}

/// The loop driver's view of a loop device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopInfo {
    /// `loop/backing_file`, as the kernel prints it (path in the reader's namespace).
    pub backing_file: KernelText,
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
    /// When the backing file is a block device node (`losetup /dev/loop5 /dev/nbd0`): that
    /// device (`lo_rdevice`). A loop device opens its backing node without claiming it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backing_rdev: Option<DevNum>,
    /// Why `LOOP_GET_STATUS64` gave no answer because it blocked (the backing file's filesystem
    /// does not answer): the backing device is then not known, which the scan reports as a blind
    /// spot. `None` when it answered, or was not asked (a fixture tree).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status_blocked: Option<String>,
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
    /// `diskseq` (Linux 5.15+): a number the kernel gives each disk it creates and each loop
    /// attach, never reused within a boot.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diskseq: Option<u64>,
}

impl BlockDevice {
    /// A writable device of `size_bytes` with nothing stacked on or under it, no loop or dm
    /// binding and no `diskseq` yet: what a scanner fills in, and what tests start from.
    pub fn new(name: DeviceName, devnum: DevNum, kind: DeviceKind, size_bytes: u64) -> Self {
        Self {
            name,
            devnum,
            kind,
            size_bytes,
            read_only: false,
            parent: None,
            holders: Vec::new(),
            slaves: Vec::new(),
            loop_info: None,
            dm: None,
            diskseq: None,
        }
    }

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
    /// A loop device whose backing file lives on this device's filesystem, or is its node.
    LoopBacking,
    /// A filesystem the kernel keeps alive on the device although no mount table shows it
    /// (an overlay's upper directory, a detached mount with open files, a namespace the scan
    /// cannot see): `/sys/fs/<type>/<dev>`, btrfs member devices, a journal thread.
    Filesystem,
}

impl HolderKind {
    /// Every kind, in a fixed order (metrics export each, even at zero).
    pub const ALL: [HolderKind; 10] = [
        Self::Mount,
        Self::OpenDevice,
        Self::OpenFile,
        Self::Cwd,
        Self::Root,
        Self::Mmap,
        Self::Swap,
        Self::StackedDevice,
        Self::LoopBacking,
        Self::Filesystem,
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
            Self::Filesystem => "filesystem",
        }
    }
}

/// Who a process is, for reports: enough to find it in `ps` and in Kubernetes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessInfo {
    pub pid: u32,
    pub comm: KernelText,
    /// `cmdline` with NULs turned into spaces, at most [`crate::discover::processes::CMDLINE_MAX`]
    /// bytes; `None` when the process was in D state and reading it could block.
    pub cmdline: Option<KernelText>,
    /// Single-letter state from `stat` (`R`, `S`, `D`, `Z`...).
    pub state: char,
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

#[cfg(test)]
mod tests;
