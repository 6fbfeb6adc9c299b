//! One scan of the host: every block device, mount namespace, holder process and swap area, as
//! seen at one instant. The scanners in [`crate::discover`] each read one source; this file runs
//! them in order and keeps what matters for the devices in scope.
//!
//! Nothing that could not be read is dropped silently: a process, namespace, file or inventory
//! the scan could not see becomes a [`BlindSpot`] saying which devices it could hide a holder of
//! (only things that cannot hide a holder, like a holder's command line, are mere warnings).
//! Anonymous-device filesystems are joined to their block devices here: a btrfs mount (`0:NN`)
//! becomes a mount of each member device listed in `/sys/fs/btrfs/<fsid>/devices/`.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::Serialize;

use crate::discover::fds::ProcRef;
use crate::discover::iostat::IoStat;
use crate::discover::livefs::{AnonIndex, LiveFs};
use crate::discover::namespaces::{MountNamespace, MountReader, NsMount};
use crate::discover::swaps::SwapType;
use crate::discover::{dm, kubelet, nbd, nvme, rbd, scsi};
use crate::model::blindspot::BlindSpot;
use crate::model::scan_stats::ScanStats;
use crate::model::{BlockDevice, DevNum, KernelText, MountNsId, ProcessInfo};

mod inventory;
pub mod new_namespace_read;
pub mod process_read_cache;
pub mod reread;
mod take;
pub mod task_namespace_cache;
pub mod touched_devices;

/// Which devices a scan looks for holders of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every block device in sysfs.
    All,
    /// These devices (callers add descendants themselves, see [`blockdev::with_descendants`]).
    Devices(Vec<DevNum>),
}

/// An active swap area on a device in scope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SwapUse {
    pub devnum: DevNum,
    pub filename: KernelText,
    pub swap_type: SwapType,
}

/// A kernel thread, by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KernelThread {
    pub pid: u32,
    pub comm: KernelText,
}

/// Everything one scan saw.
#[derive(Debug, Clone, Serialize)]
pub struct Snapshot {
    pub host_ns: MountNsId,
    /// Why the host's namespace is only a guess (`None`: it is known). Mounts cannot then be
    /// told host from foreign, so nothing is released.
    pub host_ns_unsure: Option<String>,
    pub devices: Vec<BlockDevice>,
    pub namespaces: Vec<MountNamespace>,
    /// Mounts of in-scope devices, in every namespace.
    pub mounts: Vec<NsMount>,
    /// Fds, cwd, root and mappings on in-scope devices.
    pub proc_refs: Vec<ProcRef>,
    pub swaps: Vec<SwapUse>,
    pub kernel_threads: Vec<KernelThread>,
    /// Holder processes, labelled.
    pub processes: BTreeMap<u32, ProcessInfo>,
    /// Processes in D state.
    pub stuck_pids: Vec<u32>,
    pub stats: ScanStats,
    /// Things that could not be read and cannot hide a holder (labels, command lines).
    pub warnings: Vec<String>,
    /// Things that could not be read and could hide a holder, with the devices they reach.
    pub blind_spots: Vec<BlindSpot>,
    /// Filesystems the kernel keeps alive on block devices (`/sys/fs`).
    #[serde(skip)]
    pub live_fs: Vec<LiveFs>,
    /// The devices whose holders this scan looked for.
    #[serde(skip)]
    pub in_scope: HashSet<DevNum>,
    /// Device-mapper devices, with their tables and status when the control node is there.
    #[serde(skip)]
    pub dm_devices: Vec<dm::DmDevice>,
    /// SCSI disks with their state and transport (iSCSI sessions, FC remote ports).
    #[serde(skip)]
    pub scsi: scsi::ScsiScan,
    /// krbd mappings.
    #[serde(skip)]
    pub rbd: Vec<rbd::RbdMapping>,
    /// Connected nbd devices and their server processes.
    #[serde(skip)]
    pub nbd: Vec<nbd::NbdDevice>,
    /// NVMe controllers and subsystems (fabrics and PCIe).
    #[serde(skip)]
    pub nvme: nvme::NvmeScan,
    /// The kubelet directory's volumes (empty on nodes without kubelet).
    #[serde(skip)]
    pub kubelet: kubelet::KubeletScan,
    /// I/O counters of the devices in scope (those whose `stat` could be read).
    #[serde(skip)]
    pub io: HashMap<DevNum, IoStat>,
    /// btrfs's anonymous numbers and mounts, followed to the filesystem's member devices (for
    /// a loop device whose backing file lives on btrfs: `lo_device` is a subvolume's number).
    #[serde(skip)]
    pub anon: AnonIndex,
}

/// How a scan reads the host.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    pub reader: MountReader,
    /// The kubelet directory as the host sees it.
    pub kubelet_dir: std::path::PathBuf,
    /// PID 1 cannot be inspected here and the operator vouches that it holds no device: it is a
    /// warning, not a blind spot.
    pub trust_unreadable_init: bool,
    /// Paths whose devices are protected (the host root, the kubelet and runtime directories).
    pub protected_paths: Vec<std::path::PathBuf>,
    /// Device or dm names that are protected.
    pub protected_devices: Vec<String>,
}

impl Default for ScanOptions {
    fn default() -> Self {
        Self {
            reader: MountReader::Auto,
            kubelet_dir: kubelet::DEFAULT_KUBELET_DIR.into(),
            trust_unreadable_init: false,
            protected_paths: crate::host::DEFAULT_PROTECTED_PATHS
                .iter()
                .map(std::path::PathBuf::from)
                .collect(),
            protected_devices: Vec::new(),
        }
    }
}
