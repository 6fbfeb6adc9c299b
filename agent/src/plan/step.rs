//! What a plan is made of: the actions, the steps that carry them with the identity of the
//! device they act on, what is left alone, and the plan itself. Below every planner (the kinds'
//! own in `plan/stack.rs`, `plan/nvme.rs`, `plan/iscsi.rs`, and [`super`]'s), the gates and `act/`, so that
//! each imports these types without importing the planners.

use serde::{Deserialize, Serialize};

use crate::discover::namespaces::NsEntry;
use crate::graph::identity::Identity;
use crate::graph::{DeviceEntry, Holder};
use crate::model::{DevNum, DeviceName, KernelText, MountNsId};

/// What a step does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// `umount2(MNT_DETACH)` of one mount, inside its own namespace. `mount_dev` is the mount's
    /// own superblock device as mountinfo shows it (an anonymous `0:NN` for btrfs), which may
    /// differ from the step's block device.
    DetachMount {
        namespace: MountNsId,
        via: NsEntry,
        mount_id: u32,
        mount_dev: DevNum,
        mount_point: KernelText,
        fstype: KernelText,
    },
    /// `LOOP_CLR_FD` on a loop device whose binding still matches.
    DetachLoop { backing_file: KernelText, backing_dev: Option<DevNum>, backing_inode: Option<u64> },
    /// A device-mapper target message (`fail_if_no_path`: stop queueing, so I/O that would hang
    /// forever fails instead), to the map with this uuid.
    DmMessage { uuid: String, message: String },
    /// Removes the dm device with this uuid (refused by the kernel while it is open, unless
    /// deferred, which only ever happens on request).
    DmRemove { uuid: String, deferred: bool },
    /// `echo offline > /sys/block/<disk>/device/state`: no more commands (not even the
    /// SYNCHRONIZE CACHE a delete would send to a dead LUN). `require_offline`: the disk must
    /// still be offline (a standalone disk judged stale because it is offline).
    ScsiOffline { wwid: String, address: String, require_offline: bool },
    /// `echo 1 > /sys/block/<disk>/device/delete`: removes the SCSI device, which must be
    /// offline (the step before made it so).
    ScsiDelete { wwid: String, address: String },
    /// `echo <id> > /sys/bus/rbd/remove_single_major` (`<id> force` only on request).
    RbdUnmap { id: u32, pool: String, image: String, image_id: String, force: bool },
    /// `NBD_DISCONNECT` and `NBD_CLEAR_SOCK` on `/dev/nbdN`, still served by the same process
    /// and backend.
    NbdDisconnect { server_pid: Option<u32>, backend: Option<String> },
    /// `echo 1 > /sys/class/nvme/<controller>/delete_controller` (NVMe over Fabrics), while
    /// the controller is still the planned one (subsystem NQN, transport, target address,
    /// cntlid) and not live, and none of its namespaces is held. Planned by [`crate::judge::nvme`].
    NvmeDeleteController {
        controller: String,
        subsysnqn: String,
        transport: String,
        /// `traddr=..,trsvcid=..` (never nvme-tcp's `src_addr`, which comes and goes).
        address: String,
        cntlid: Option<u16>,
    },
    /// Logs out iSCSI session `sid` through iscsid (`iscsiadm -m session -r SID -u`, run in the
    /// host's mount and network namespaces), once its disks are deleted. Carried on the step of
    /// the session's last disk; re-checked right before it runs: the session still exists with
    /// this target and portal, and no SCSI device is left on it.
    IscsiLogout { sid: u32, target: String, portal: String, iface: String },
}

impl Action {
    /// Which action this is, without its fields.
    pub fn kind(&self) -> ActionKind {
        match self {
            Action::DetachMount { .. } => ActionKind::DetachMount,
            Action::DetachLoop { .. } => ActionKind::DetachLoop,
            Action::DmMessage { .. } => ActionKind::DmMessage,
            Action::DmRemove { .. } => ActionKind::DmRemove,
            Action::ScsiOffline { .. } => ActionKind::ScsiOffline,
            Action::ScsiDelete { .. } => ActionKind::ScsiDelete,
            Action::RbdUnmap { .. } => ActionKind::RbdUnmap,
            Action::NbdDisconnect { .. } => ActionKind::NbdDisconnect,
            Action::NvmeDeleteController { .. } => ActionKind::NvmeDeleteController,
            Action::IscsiLogout { .. } => ActionKind::IscsiLogout,
        }
    }

    /// The action's name: its `action` tag in a journaled step, audit lines and metrics.
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }
}

/// The kinds of [`Action`], without their fields: the one list of action names (metrics export
/// each at zero from [`ActionKind::ALL`]). Serialised as [`Action`]'s tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    DetachMount,
    DetachLoop,
    DmMessage,
    DmRemove,
    ScsiOffline,
    ScsiDelete,
    RbdUnmap,
    NbdDisconnect,
    NvmeDeleteController,
    IscsiLogout,
}

impl ActionKind {
    /// Every kind, in plan order.
    pub const ALL: [ActionKind; 10] = [
        ActionKind::DetachMount,
        ActionKind::DetachLoop,
        ActionKind::DmMessage,
        ActionKind::DmRemove,
        ActionKind::ScsiOffline,
        ActionKind::ScsiDelete,
        ActionKind::RbdUnmap,
        ActionKind::NbdDisconnect,
        ActionKind::NvmeDeleteController,
        ActionKind::IscsiLogout,
    ];

    /// The name (the same word as [`Action`]'s serde tag: a test holds them together).
    pub fn as_str(self) -> &'static str {
        match self {
            ActionKind::DetachMount => "detach_mount",
            ActionKind::DetachLoop => "detach_loop",
            ActionKind::DmMessage => "dm_message",
            ActionKind::DmRemove => "dm_remove",
            ActionKind::ScsiOffline => "scsi_offline",
            ActionKind::ScsiDelete => "scsi_delete",
            ActionKind::RbdUnmap => "rbd_unmap",
            ActionKind::NbdDisconnect => "nbd_disconnect",
            ActionKind::NvmeDeleteController => "nvme_delete_controller",
            ActionKind::IscsiLogout => "iscsi_logout",
        }
    }
}

impl std::fmt::Display for ActionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One destructive step on one device. Each is idempotent: a target already gone is a success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Step {
    pub device: DeviceName,
    pub devnum: DevNum,
    /// The device's kernel identity when planned; the engine refuses the step if it changed.
    #[serde(serialize_with = "identity_token")]
    pub identity: Identity,
    #[serde(flatten)]
    pub action: Action,
}

fn identity_token<S: serde::Serializer>(id: &Identity, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&id.token())
}

impl Step {
    pub(crate) fn on(entry: &DeviceEntry, action: Action) -> Self {
        Self {
            device: entry.device.name.clone(),
            devnum: entry.device.devnum,
            identity: Identity::of(entry),
            action,
        }
    }

    /// The action's name, as journals, audit lines and metrics name it ([`ActionKind::as_str`]).
    pub fn action(&self) -> &'static str {
        self.action.name()
    }

    /// A mount release: detaches one mount in one namespace; no data is destroyed.
    pub fn is_release(&self) -> bool {
        matches!(self.action, Action::DetachMount { .. })
    }

    /// Whether this step is the one that unblocks a hung device: stopping a dead multipath
    /// map's queueing (`fail_if_no_path`) fails the I/O that waits for a path.
    pub fn unblocks(&self) -> bool {
        matches!(&self.action, Action::DmMessage { message, .. } if message == "fail_if_no_path")
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        let device = &self.device;
        match &self.action {
            Action::DetachMount { namespace, via, mount_point, mount_id, .. } => format!(
                "detach mount {mount_point} (id {mount_id}) of {device} in mount namespace {} via {} (umount2 MNT_DETACH)",
                namespace.0,
                via.describe()
            ),
            Action::DetachLoop { backing_file, .. } => {
                format!("detach loop device {device} from {backing_file} (LOOP_CLR_FD)")
            }
            Action::DmMessage { uuid, message } => {
                format!("send '{message}' to map {device} ({uuid}): queued and future I/O fails instead of hanging")
            }
            Action::DmRemove { uuid, deferred } => format!(
                "remove dm device {device} ({uuid}){}",
                if *deferred { " on last close (deferred)" } else { "" }
            ),
            Action::ScsiOffline { address, .. } => format!("set SCSI disk {device} ({address}) offline"),
            Action::ScsiDelete { address, .. } => format!("delete SCSI disk {device} ({address})"),
            Action::RbdUnmap { id, pool, image, force, .. } => format!(
                "unmap rbd {pool}/{image} ({device}, id {id}){}",
                if *force { " with force (in-flight I/O fails)" } else { "" }
            ),
            Action::NbdDisconnect { .. } => format!("disconnect nbd device {device} (NBD_DISCONNECT)"),
            Action::NvmeDeleteController { controller, subsysnqn, transport, address, .. } => format!(
                "delete NVMe controller {controller} ({transport} {address}, subsystem {subsysnqn}) serving {device} (delete_controller)"
            ),
            Action::IscsiLogout { sid, target, portal, iface } => format!(
                "log out iSCSI session{sid} ({target} at {portal}, iface {iface}), left with no LUN once {device} is deleted, through iscsid (iscsiadm -m session -r {sid} -u)"
            ),
        }
    }
}

/// A holder the plan does not touch, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftAlone {
    pub holder: Holder,
    pub reason: String,
}

/// What to do to one device.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub operation: &'static str,
    pub device: DeviceName,
    pub devnum: DevNum,
    /// The device's kernel identity the plan was made for.
    #[serde(serialize_with = "identity_token")]
    pub identity: Identity,
    pub steps: Vec<Step>,
    pub left_alone: Vec<LeftAlone>,
    /// Why nothing may be done at all (device still held, a path active, not stale yet).
    pub refusal: Option<String>,
    /// The refusal is because the operation does not apply to this kind of device (an error,
    /// not a judgement about its state).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unsupported: bool,
    /// What the plan leaves for someone else to do, e.g. an iSCSI session left with no LUN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Processes stuck in D state reading a dead map when planned: stopping its queueing frees
    /// them, so the re-checks before the map's steps expect them (and nothing else).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub expected_openers: Vec<u32>,
    /// A release the operator forces although processes use its mounts (`--force-busy`): the
    /// reason they gave. The re-check before each detach then lets those users be.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub force_busy: Option<String>,
}

impl Plan {
    /// An empty plan for `operation` on `entry`'s device.
    pub fn new(operation: &'static str, entry: &DeviceEntry) -> Self {
        Self {
            operation,
            device: entry.device.name.clone(),
            devnum: entry.device.devnum,
            identity: Identity::of(entry),
            steps: Vec::new(),
            left_alone: Vec::new(),
            refusal: None,
            unsupported: false,
            notes: Vec::new(),
            expected_openers: Vec::new(),
            force_busy: None,
        }
    }

    /// Refuses the whole plan: no step is left.
    pub fn refuse(&mut self, reason: String) {
        self.steps.clear();
        self.refusal = Some(reason);
        self.unsupported = false;
    }
}
