//! The seam between the actuators and the kernel (as youki's `Syscall` trait): [`Kernel`] names
//! every call the Linux actuator makes to act, each read of sysfs and procfs right before a step,
//! each open, stat and ioctl, and each write, so the actuators' re-checks can be unit-tested.
//!
//! `LinuxKernel` (`act/kernel_linux.rs`) makes the calls: it is the code the actuators ran
//! before the seam, moved, not changed. `RecordingKernel` (`act/recording_kernel.rs`, tests
//! only) serves a scripted kernel on a copy of a real-kernel fixture tree and records every call,
//! so a test can say which writes reached it (none, for a refusal).
//!
//! The calls that change the kernel are the ones under "Writes" below; every other call only
//! reads. Paths are as the actuators build them from their [`HostRoot`].

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::multipathd::Reply;
use super::ActError;
use crate::discover::control_socket::Owners;
use crate::discover::iscsi::IscsiDetail;
use crate::discover::probe::KernelWord;
use crate::discover::DiscoverError;
use crate::host::sys::FileId;
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, MountNsId};

/// How a file is opened ([`Kernel::open`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Read-only (`File::open`): our procfs, before entering a namespace that may have none.
    Read,
    /// Read-only, `O_NONBLOCK | O_CLOEXEC`: a loop device for its ioctls.
    ReadNonBlocking,
    /// Read-write: an nbd device for its ioctls.
    ReadWrite,
    /// `O_PATH | O_DIRECTORY | O_CLOEXEC`: a task's root, to resolve a mount point from.
    DirPath,
}

/// What `LOOP_GET_STATUS64` says a loop device is bound to: its backing file's device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopBacking {
    pub device: DevNum,
    pub inode: u64,
}

/// What `DM_DEV_STATUS` says of a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MapStatus {
    pub dev: DevNum,
    pub open_count: i32,
    pub name: String,
}

/// One target of a `DM_TABLE_STATUS` reply (status lines): its type and its status parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetStatus {
    pub target_type: String,
    pub params: String,
}

/// What a child run in the host's namespaces ended with: its exit code (`None`: a signal) and
/// its output.
pub type ChildExit = (Option<i32>, String);

/// Every kernel call the Linux actuator makes. Cloned into the bounded threads the calls run on.
pub trait Kernel: Clone + std::fmt::Debug + Send + Sync + 'static {
    /// An open file: a device node, a directory, our procfs.
    type Node: Send + 'static;
    /// An open `/dev/mapper/control`.
    type Control: Send + 'static;

    // Reads of sysfs and procfs.

    /// The whole file (`std::fs::read`): a sysfs attribute, a mountinfo.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// [`Self::read`] as text; not UTF-8 is `InvalidData`, as `std::fs::read_to_string` says it.
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        String::from_utf8(self.read(path)?)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
    }
    /// Whether `path` exists (following links).
    fn exists(&self, path: &Path) -> bool;
    /// Whether `path` is a regular file (following links).
    fn is_file(&self, path: &Path) -> bool;
    /// The names in a directory, sorted; none when it is missing (`discover::list_dir`).
    fn list_dir(&self, path: &Path) -> Result<Vec<String>, DiscoverError>;
    /// `statx` from cached attributes ([`crate::host::sys::stat_cached`]).
    fn stat(&self, path: &Path) -> io::Result<FileId>;
    /// The mount namespace of the task at `task_dir` (its `ns/mnt` link).
    fn task_mount_ns(&self, task_dir: &Path) -> Option<MountNsId>;
    /// The mountinfo of the namespace behind `ns_file`, read from inside it through `proc`.
    fn read_mountinfo_in(&self, ns_file: &Path, proc: &Path) -> io::Result<Vec<u8>>;
    /// The kernel log's latest rbd attach record of each device (`rbdN` → sequence number).
    fn rbd_attach_records(&self, host: &HostRoot) -> HashMap<String, u64>;
    /// iSCSI session `sid` as sysfs shows it (`None`: gone).
    fn iscsi_detail(&self, host: &HostRoot, sid: u32) -> Result<Option<IscsiDetail>, DiscoverError>;
    /// The target session `sid` logs in to.
    fn iscsi_targetname(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError>;
    /// The SCSI devices still on session `sid`.
    fn iscsi_scsi_devices(&self, host: &HostRoot, sid: u32) -> Result<Vec<String>, DiscoverError>;
    /// Session `sid`'s state (`None`: gone).
    fn iscsi_state(&self, host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError>;
    /// The kernel's word on a device: exclusive open, holders, live filesystems, loops on it.
    fn kernel_word(
        &self,
        host: &HostRoot,
        device: &DeviceName,
        devnum: DevNum,
        timeout: Duration,
    ) -> KernelWord;
    /// The processes named `multipathd` and which of them own its control socket.
    fn multipathd_owners(&self, host: &HostRoot) -> Result<Owners, String>;

    // Opens, and the ioctls that only read.

    /// Opens `path` the way `how` says.
    fn open(&self, path: &Path, how: Open) -> io::Result<Self::Node>;
    /// `BLKGETDISKSEQ`: the disk sequence number of an open block device.
    fn disk_seq(&self, node: &Self::Node) -> io::Result<u64>;
    /// `LOOP_GET_STATUS64` (`ENXIO`: not bound).
    fn loop_get_status(&self, node: &Self::Node) -> io::Result<LoopBacking>;
    /// Opens the device-mapper control node (a character device, or an error).
    fn dm_open(&self, path: &Path) -> io::Result<Self::Control>;
    /// `DM_DEV_STATUS` of the map with `uuid`.
    fn dm_dev_status(&self, control: &Self::Control, uuid: &str) -> io::Result<MapStatus>;
    /// `DM_TABLE_STATUS` (status lines) of the map with `uuid`.
    fn dm_table_status(&self, control: &Self::Control, uuid: &str) -> io::Result<Vec<TargetStatus>>;

    // Writes: each changes the kernel.

    /// `LOOP_CLR_FD`: unbinds a loop device (autoclear only, while others have it open).
    fn loop_clear(&self, node: &Self::Node) -> io::Result<()>;
    /// `NBD_DISCONNECT` (`EINVAL`: already disconnected).
    fn nbd_disconnect(&self, node: &Self::Node) -> io::Result<()>;
    /// `NBD_CLEAR_SOCK` (`EINVAL`: no socket).
    fn nbd_clear_sock(&self, node: &Self::Node) -> io::Result<()>;
    /// `DM_TARGET_MSG` to sector 0 of the map with `uuid`.
    fn dm_message(&self, control: &Self::Control, uuid: &str, message: &str) -> io::Result<()>;
    /// `DM_DEV_REMOVE` of the map with `uuid` (on last close when `deferred`).
    fn dm_remove(&self, control: &Self::Control, uuid: &str, deferred: bool) -> io::Result<()>;
    /// Writes `text` to a sysfs attribute (`std::fs::write`).
    fn write(&self, path: &Path, text: &[u8]) -> io::Result<()>;
    /// In the mount namespace behind `ns_file`: opens `rel` beneath `root` (the namespace's own
    /// root when `None`) refusing every symlink, checks it is mount `mount_id`, and detaches
    /// exactly that mount (`umount2(MNT_DETACH)` through the open file, `proc` our procfs).
    fn unmount_in_ns(
        &self,
        ns_file: &Path,
        root: Option<Self::Node>,
        proc: Self::Node,
        rel: PathBuf,
        mount_id: u32,
    ) -> io::Result<()>;
    /// Runs `program args` in PID 1's mount and network namespaces, waits up to `timeout`
    /// (then kills it).
    fn run_in_host_namespaces(
        &self,
        host: &HostRoot,
        device: &DeviceName,
        program: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<ChildExit, ActError>;
    /// Asks multipathd, in the network namespace `ns_file`, `show daemon` and then `command`.
    fn multipathd_ask(
        &self,
        ns_file: &Path,
        command: &str,
        timeout: Duration,
    ) -> io::Result<(Reply, Option<Reply>)>;
    /// Removes `wwid`'s line from multipath-tools' wwids file (`Ok(false)`: not there).
    fn remove_wwid(&self, path: &Path, wwid: &str) -> io::Result<bool>;
}
