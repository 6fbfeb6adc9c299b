//! The gates between evidence and a destructive step. Each gate is one pure function, used
//! everywhere its question is asked: by policy (a verdict), by planning (a refusal) and by the
//! engine right before a step runs (a veto). So no path can skip one, and removing one is
//! visible everywhere at once: `scripts/mutation-check.sh` removes each (at its `mutation-check`
//! marker: a build with the `mutation-check` feature lets everything through the gate named by
//! `BLOCKJANITOR_MUTANT`) and requires the property test to fail.
//!
//! - [`completeness`]: no blind spot of the scan could hide a holder of the device;
//! - [`identity`]: the number still stands for the device the plan was made for;
//! - [`api`]: the Kubernetes API vouches (watches synced and answering, this Node exists) and
//!   no running pod on this node or attached VolumeAttachment uses the device;
//! - [`kernel_word`]: the kernel's own claims on the device are all accounted for by the plan;
//! - [`openers`]: a dm device's open count is no more than the openers the plan accounts for
//!   (what the fd scan cannot see, an fd in flight over a unix socket or an io_uring fixed
//!   file, still counts in the kernel);
//! - [`protection`], [`kubelet_pods`]: not behind the host, the kubelet or the runtime; no pod on
//!   this node uses it per the kubelet directory;
//! - [`responsive`]: the device answers I/O, or the plan's first step is the one that unblocks it;
//! - [`mount_users`]: nothing uses the filesystem through a namespace whose mount a release
//!   detaches (a detached mount lives on for its users and frees nothing).

use std::collections::HashSet;

use crate::discover::probe::{Claim, KernelWord};
use crate::graph::identity::Identity;
use crate::graph::{DeviceEntry, Holder};
use crate::host::clock::BootTime;
use crate::judge::stall::Stall;
use crate::kube::ClusterView;
use crate::model::blindspot::{self, BlindSpot};
use crate::model::{DevNum, DeviceName, HolderKind, MountNsId};

/// The early "let everything through" of a gate, taken only in a `mutation-check` build when
/// `BLOCKJANITOR_MUTANT` names it (scripts/mutation-check.sh); nothing in any other build.
macro_rules! removable {
    ($gate:literal, $through:expr) => {
        #[cfg(feature = "mutation-check")]
        if removed($gate) {
            return $through;
        }
    };
}

/// Whether `BLOCKJANITOR_MUTANT` names `gate` (read once).
#[cfg(feature = "mutation-check")]
fn removed(gate: &str) -> bool {
    static MUTANT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MUTANT.get_or_init(|| std::env::var("BLOCKJANITOR_MUTANT").unwrap_or_default()) == gate
}

/// A blind spot that could hide a holder of the device: nothing destructive rests on an
/// incomplete scan.
pub fn completeness(entry: &DeviceEntry, blind_spots: &[BlindSpot]) -> Option<String> {
    // mutation-check: completeness
    removable!("completeness", None);
    let reaching = blindspot::reaching(blind_spots, &entry.device);
    if reaching.is_empty() {
        return None;
    }
    let what: Vec<String> = reaching.iter().take(3).map(|b| b.what.clone()).collect();
    let more = if reaching.len() > 3 { format!(" and {} more", reaching.len() - 3) } else { String::new() };
    Some(format!(
        "blind spot: the scan could not see everything that could hold {} ({}{more}): nothing destructive rests on an incomplete scan",
        entry.device.name,
        what.join("; ")
    ))
}

/// The device at the planned number is no longer the device the plan was made for.
pub fn identity(planned: &Identity, now: &Identity) -> Option<String> {
    // mutation-check: identity
    removable!("identity", None);
    (planned != now).then(|| {
        format!(
            "{} changed identity since it was planned: planned for {} [{}], now {} [{}]",
            planned.name,
            planned,
            planned.token(),
            now,
            now.token()
        )
    })
}

/// What the Kubernetes API says about a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ApiWord {
    /// The agent runs without the API: the node's own evidence decides.
    NotConfigured,
    /// The API is configured but cannot vouch now (why).
    CannotVouch(String),
    /// Running pods or attached VolumeAttachments use it (one reason each).
    InUse(Vec<String>),
    /// The API vouches that nothing in the cluster uses it (why it believes so).
    NoUser(String),
}

impl ApiWord {
    /// Why nothing destructive may be done, if the API forbids it.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Self::NotConfigured | Self::NoUser(_) => None,
            Self::CannotVouch(why) => {
                Some(format!("the Kubernetes API cannot vouch for it ({why}): nothing destructive rests on missing API evidence"))
            }
            Self::InUse(users) => Some(users.join("; ")),
        }
    }
}

/// The suffix of every reason [`api`] gives for a user.
pub const PER_THE_API: &str = "per the API";

/// [`api`]'s word as a number: equal numbers, the same word (what a kept verdict is checked
/// against before a re-read reuses it).
pub fn api_word_hash(entry: &DeviceEntry, view: Option<&ClusterView>, now: BootTime) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    api(entry, view, now).hash(&mut h);
    h.finish()
}

/// Asks the cluster's view about `entry` at `now` (`None`: no API configured).
pub fn api(entry: &DeviceEntry, view: Option<&ClusterView>, now: BootTime) -> ApiWord {
    // mutation-check: api
    removable!("api", ApiWord::NotConfigured);
    let Some(view) = view else { return ApiWord::NotConfigured };
    if let Err(why) = view.vouch(now) {
        return ApiWord::CannotVouch(why);
    }
    let mut pvs: Vec<String> = entry.kubernetes.as_ref().map(|k| k.pv_names.clone()).unwrap_or_default();
    if let Some(k) = &entry.kubernetes {
        for pv in &view.pvs {
            if pv.csi.as_ref().is_some_and(|c| k.volume_handles.contains(&c.volume_handle))
                && !pvs.contains(&pv.name)
            {
                pvs.push(pv.name.clone());
            }
        }
    }
    if let Some(pv) = entry.rbd.as_ref().and_then(|r| view.pv_for_rbd(&r.pool, &r.image)) {
        if !pvs.contains(&pv.name) {
            pvs.push(pv.name.clone());
        }
    }
    let mut users = Vec::new();
    for pv in &pvs {
        for pod in view.running_pods_using_pv(pv) {
            users.push(format!(
                "pod {}/{} ({}) uses PV {pv} {PER_THE_API}",
                pod.namespace, pod.name, pod.phase
            ));
        }
        if view.pv_attached_to_node(pv) {
            users.push(format!("a VolumeAttachment of PV {pv} is attached to this node {PER_THE_API}"));
        }
    }
    if !users.is_empty() {
        return ApiWord::InUse(users);
    }
    ApiWord::NoUser(if pvs.is_empty() {
        "the API knows no PV for it".to_owned()
    } else {
        format!(
            "no running pod on this node and no attached VolumeAttachment for PV {} {PER_THE_API}",
            pvs.join(", ")
        )
    })
}

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

/// The kernel says the device is used in a way the plan does not account for.
pub fn kernel_word(device: &DeviceName, word: &KernelWord, accounted: &Accounted) -> Option<String> {
    // mutation-check: kernel-word
    removable!("kernel-word", None);
    let mut unexplained = Vec::new();
    // A dm table claims the devices it sits on: every device stacked on it is one the plan
    // removes first (an exclusive claimant other than dm would keep the tables out, and the
    // other way round).
    let stacked_claim = !word.sysfs_holders.is_empty()
        && word.sysfs_holders.iter().all(|h| accounted.stacked_removed.contains(h));
    match &word.claim {
        Claim::Unclaimed => {}
        Claim::Claimed if accounted.filesystem_released || stacked_claim => {}
        Claim::Claimed => {
            unexplained.push("an exclusive open fails with EBUSY: something claims it".to_owned())
        }
        Claim::Inconclusive(_) if accounted.open_may_fail => {}
        Claim::Inconclusive(why) => {
            unexplained.push(format!("the exclusive-open probe could not tell ({why})"))
        }
    }
    let stacked: Vec<&str> = word
        .sysfs_holders
        .iter()
        .filter(|h| !accounted.stacked_removed.contains(h))
        .map(DeviceName::as_str)
        .collect();
    if !stacked.is_empty() {
        unexplained.push(format!("sysfs holders/ lists {}", stacked.join(", ")));
    }
    if !accounted.filesystem_released {
        unexplained.extend(word.live_filesystems.iter().map(|fs| format!("a filesystem lives on it ({fs})")));
    }
    if !word.loops_on_top.is_empty() {
        let names: Vec<&str> = word.loops_on_top.iter().map(DeviceName::as_str).collect();
        unexplained.push(format!("loop device(s) {} are backed by its device node", names.join(", ")));
    }
    unexplained.extend(word.unreadable.iter().map(|u| format!("cannot ask the kernel: {u}")));
    if unexplained.is_empty() {
        return None;
    }
    Some(format!("the kernel says {device} is in use: {}", unexplained.join("; ")))
}

/// The openers of a dm device a plan accounts for right before a step on it: each is one open
/// of the device in the kernel's count (`md->open_count`, one per open file description, per
/// mounted superblock, per dm table stacked on it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Openers {
    /// Filesystems on it that the plan releases (a mounted superblock opens the device once).
    pub filesystems: usize,
    /// Devices stacked on it that the plan removes (each table opens the device once).
    pub stacked: Vec<DeviceName>,
    /// Open fds of the device node the scan saw, held by processes the plan expects to let go
    /// (readers stuck on a dead map). Counted per fd: fds that share one open file description
    /// (dup, fork) make this larger than the kernel's count, never smaller.
    pub fds: usize,
}

impl Openers {
    /// How many opens of the device the plan accounts for.
    pub fn total(&self) -> usize {
        self.filesystems + self.stacked.len() + self.fds
    }

    fn describe(&self) -> String {
        let mut parts = Vec::new();
        if self.filesystems > 0 {
            parts.push(format!("{} filesystem(s) released", self.filesystems));
        }
        if !self.stacked.is_empty() {
            let names: Vec<&str> = self.stacked.iter().map(DeviceName::as_str).collect();
            parts.push(format!("stacked {} removed", names.join(", ")));
        }
        if self.fds > 0 {
            parts.push(format!("{} fd(s) of stuck readers", self.fds));
        }
        if parts.is_empty() {
            "nothing".to_owned()
        } else {
            parts.join(", ")
        }
    }
}

/// The kernel counts more openers of a dm device than the plan accounts for: something the scan
/// cannot see holds it open (an fd in flight over a unix socket, an io_uring fixed file, a
/// process that passed its fd on during the scan), and stopping the queueing or removing the
/// map would fail its I/O. Fewer is fine (fds sharing one open file description, an opener
/// that left since the scan). Not a dm device (no count): nothing to compare.
pub fn openers(device: &DeviceName, word: &KernelWord, accounted: &Openers) -> Option<String> {
    // mutation-check: openers
    removable!("openers", None);
    let open = word.dm_open_count?;
    let total = accounted.total();
    if usize::try_from(open).is_ok_and(|n| n <= total) {
        return None;
    }
    Some(format!(
        "open count {open}, accounted {total} ({}): something the scan cannot see holds {device} open (an fd in flight over a unix socket, an io_uring fixed file, a process passing its fd on during the scan); find it (fuser -v /dev/{device}, ss -xp for unix sockets, /proc/PID/fdinfo of io_uring instances), stop it, and plan again",
        accounted.describe()
    ))
}

/// The device is protected (behind the host root, the kubelet or the runtime, or listed).
pub fn protection(entry: &DeviceEntry, protected: &HashSet<DevNum>) -> Option<String> {
    protected.contains(&entry.device.devnum).then(|| {
        format!(
            "{} backs the host root, the kubelet or container runtime directories, or is listed as protected",
            entry.device.name
        )
    })
}

/// A pod on this node uses the device, per the kubelet directory.
pub fn kubelet_pods(entry: &DeviceEntry) -> Option<String> {
    entry.kubernetes.as_ref().filter(|k| !k.pod_uids.is_empty()).map(|k| {
        format!("pod(s) {} on this node use {} per kubelet", k.pod_uids.join(", "), entry.device.name)
    })
}

/// The device does not answer I/O ([`crate::judge::stall`]), and the plan does not start by unblocking
/// it (a dead multipath map's `fail_if_no_path`; `first_step_unblocks`, from the plan's
/// [`Step::unblocks`](crate::plan::Step::unblocks)): what a hung device's holders see cannot be
/// trusted, and a step on it may hang or fail half-way.
pub fn responsive(entry: &DeviceEntry, stall: Option<&Stall>, first_step_unblocks: bool) -> Option<String> {
    let stall = stall?;
    if first_step_unblocks {
        return None;
    }
    Some(format!(
        "{} is {}: nothing destructive is done to a device that does not answer unless the plan's first step unblocks it",
        entry.device.name,
        stall.describe()
    ))
}

/// What still uses a device through the mount namespaces `detached` whose mounts of it a release
/// would detach: a process in one of them with its cwd, root, an open file, the device node or a
/// mapping on it; a process holder whose namespace is unknown; anything the kernel holds with no
/// namespace (swap, a loop device's backing file, a stacked device, a filesystem with no mount).
/// `umount2(MNT_DETACH)` removes only the mount: the filesystem stays alive for every such user,
/// who loses only path lookups (gotcha 24), so the detach breaks them and frees nothing.
/// Exempt: openers stuck on a dead map that the plan frees (`expected_openers`), and devices
/// stacked on it that the plan removes (`removed`). A process in a namespace the release does
/// not touch is not its concern: its own mount stays.
pub fn mount_users(
    entry: &DeviceEntry,
    detached: &[MountNsId],
    expected_openers: &[u32],
    removed: &[DeviceName],
) -> Option<String> {
    // mutation-check: mount-users
    removable!("mount-users", None);
    let in_detached = |h: &Holder| h.mount_namespace.is_none_or(|n| detached.contains(&n));
    let users: Vec<String> = entry
        .holders
        .iter()
        .filter(|h| match h.kind {
            HolderKind::Mount => false,
            HolderKind::OpenDevice
                if !h.pids.is_empty() && h.pids.iter().all(|p| expected_openers.contains(p)) =>
            {
                false
            }
            HolderKind::StackedDevice => h.device.as_ref().is_none_or(|d| !removed.contains(d)),
            HolderKind::OpenDevice
            | HolderKind::OpenFile
            | HolderKind::Cwd
            | HolderKind::Root
            | HolderKind::Mmap => in_detached(h),
            HolderKind::Swap | HolderKind::LoopBacking | HolderKind::Filesystem => true,
        })
        .map(|h| match h.mount_namespace {
            Some(ns) if !h.pids.is_empty() && detached.len() > 1 => {
                format!("{} in mount namespace {}", h.describe(), ns.0)
            }
            _ => h.describe(),
        })
        .collect();
    if users.is_empty() {
        return None;
    }
    let namespaces: Vec<String> = detached.iter().map(|n| n.0.to_string()).collect();
    Some(format!(
        "{}: a release would detach its mount(s) in mount namespace {}, but the filesystem is still used there: {}: a detached mount stays alive for its users and frees nothing, and they lose their path to it: stop those processes (or have them let go of the files) first, or pass --force-busy REASON to detach anyway",
        entry.device.name,
        namespaces.join(", "),
        users.join("; ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{BlockDevice, DeviceKind};

    fn entry(holders: Vec<Holder>) -> DeviceEntry {
        DeviceEntry::new(
            BlockDevice {
                diskseq: Some(1),
                ..BlockDevice::new(
                    DeviceName::new("dm-0").expect("name"),
                    DevNum::new(253, 0),
                    DeviceKind::Dm,
                    1 << 20,
                )
            },
            holders,
        )
    }

    fn process(kind: HolderKind, ns: u64, pid: u32, state: char) -> Holder {
        let mut h = Holder::bare(kind);
        h.pids = vec![pid];
        h.comm = Some("reader".into());
        h.process_state = Some(state);
        h.mount_namespace = Some(MountNsId(ns));
        h
    }

    #[test]
    fn mount_users_exempts_only_what_the_plan_frees() {
        let ns = [MountNsId(2)];
        // A reader stuck on a dead map, which stopping its queueing frees.
        let stuck = entry(vec![process(HolderKind::OpenDevice, 2, 9, 'D')]);
        assert_eq!(mount_users(&stuck, &ns, &[9], &[]), None);
        assert!(mount_users(&stuck, &ns, &[], &[]).is_some_and(|w| w.contains("pid 9 (reader)")));
        // A layer the plan removes after the releases.
        let mut layer = Holder::bare(HolderKind::StackedDevice);
        layer.device = Some(DeviceName::new("dm-1").expect("name"));
        let stacked = entry(vec![layer]);
        assert_eq!(mount_users(&stacked, &ns, &[], &[DeviceName::new("dm-1").expect("name")]), None);
        assert!(mount_users(&stacked, &ns, &[], &[]).is_some_and(|w| w.contains("dm-1 is stacked")));
        // A cwd elsewhere is not this release's concern; a cwd in its namespace is.
        let cwd = entry(vec![process(HolderKind::Cwd, 3, 5, 'S')]);
        assert_eq!(mount_users(&cwd, &ns, &[], &[]), None);
        assert!(mount_users(&cwd, &[MountNsId(3)], &[], &[]).is_some_and(|w| w.contains("--force-busy")));
    }
}
