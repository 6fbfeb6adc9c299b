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
//! - [`openers`]: a dm device's open count equals the openers the plan accounts for, its stuck
//!   readers' fds counted per open file (what the fd scan cannot see, an fd in flight over a
//!   unix socket or an io_uring fixed file, still counts in the kernel);
//! - [`protection`], [`kubelet_pods`]: not behind the host, the kubelet or the runtime; no pod on
//!   this node uses it per the kubelet directory;
//! - [`unplaced_volume`]: once a resumed plan's subject is gone, no volume the API says is used on this
//!   node is left without a device that serves it (it may be the subject's, and what is left of
//!   the subject's stack, its paths, is then that volume's);
//! - [`responsive`]: the device answers I/O, or the plan's first step is the one that unblocks it;
//! - [`mount_users`]: nothing uses the filesystem through a namespace whose mount a release
//!   detaches (a detached mount lives on for its users and frees nothing);
//! - [`umount_propagation`]: nothing the unmount takes with it through the parent's peer group
//!   (the host's own mount at the same place, another device's) is anything but a releasable
//!   copy of the same device.
//!
//! And for a pod volume directory's `rmdir` ([`crate::judge::orphans`]):
//! - [`pod_api`]: the API vouches that no pod with the directory's pod UID is on this node;
//! - [`pod_node`]: nothing of the pod runs here (a process in its cgroup, a mount of its files);
//! - [`dir_mounts`]: nothing is mounted at or below the directory, or rooted in it, in any
//!   namespace, and every namespace could be read;
//! - [`dir_identity`]: the directory is still the one planned (its device and inode).

pub use super::accounted::{Accounted, Openers};
pub use super::api_evidence::{ApiWord, PodWord};
use crate::discover::probe::{Claim, KernelWord};
use crate::graph::identity::Identity;
use crate::graph::pod_volumes::Pin;
use crate::graph::propagation::{HostChain, Reach};
use crate::graph::{DeviceEntry, Holder};
use crate::host::beneath::FileKey;
use crate::host::clock::BootTime;
use crate::judge::stall::Stall;
use crate::kube::ClusterView;
use crate::model::blindspot::{self, BlindSpot};
use crate::model::{DeviceName, HolderKind, MountNsId};

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
    let pvs = crate::graph::volume_objects::pv_names(entry, view);
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

/// Once the plan's subject is gone (removed by an earlier step, maybe before an interruption
/// and a resume), what the API says about its volume can no longer be read from it: a step on
/// what is left of its stack (a path, a partition's disk) must not run while the API names a
/// volume in use on this node (`in_use`: PV and why) that no device the scan sees serves
/// (`placed`): it may be the subject's, about to be staged again on what this step removes.
pub fn unplaced_volume(
    subject: &DeviceName,
    in_use: &[(String, String)],
    placed: &std::collections::HashSet<String>,
) -> Option<String> {
    // mutation-check: unplaced-volume
    removable!("unplaced-volume", None);
    let unplaced: Vec<String> = in_use
        .iter()
        .filter(|(pv, _)| !placed.contains(pv))
        .map(|(pv, why)| format!("PV {pv} ({why})"))
        .collect();
    let first = unplaced.first()?;
    let more = if unplaced.len() > 1 { format!(" and {} more", unplaced.len() - 1) } else { String::new() };
    Some(format!(
        "{subject}, the plan's subject, is gone, and {first}{more} is in use on this node {PER_THE_API} with no device this scan sees serving it: it may be {subject}'s volume, staged again on what this step removes; nothing of {subject}'s stack is removed by this resumed plan until the API no longer says so (once that volume is known to be another's, `clean` the device on its own)"
    ))
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

/// The kernel's open count of a dm device (`open_count`, `None`: it could not be read) must equal
/// the openers the plan accounts for ([`Openers::total`]: filesystems it releases, layers it
/// removes, the distinct open files of the stuck readers it frees).
///
/// More is an opener the scan cannot see (an fd in flight over a unix socket, an io_uring fixed
/// file, a mapping of the node whose fd was closed), whose I/O stopping the queueing or removing
/// the map would fail. Fewer cannot come from an opener that left: the open files are counted
/// after the count was read, and an fd closed since is not counted; so fewer means the plan's
/// picture of the device's openers is wrong somewhere, and a wrong picture could be hiding one:
/// refused too. An unreadable count, or fds that cannot be told apart into open files: refused,
/// with why.
pub fn openers(device: &DeviceName, open_count: Option<i32>, accounted: &Openers) -> Option<String> {
    // mutation-check: openers
    removable!("openers", None);
    // mutation-check: openers-exact
    removable!("openers-exact", openers_at_most(device, open_count, accounted));
    let Some(open) = open_count else {
        return Some(format!(
            "the open count of {device} cannot be read (DM_DEV_STATUS): its openers cannot be accounted for, so nothing is done to it"
        ));
    };
    let total = match accounted.total() {
        Ok(t) => t,
        Err(why) => {
            return Some(format!(
                "open count {open}, but which of the {} fd(s) of its stuck readers are one open file cannot be told ({why}): the openers of {device} cannot be accounted for, so nothing is done to it; plan again",
                accounted.fds
            ))
        }
    };
    let open = usize::try_from(open).ok();
    match open {
        Some(n) if n == total => None,
        Some(n) if n > total => Some(format!(
            "open count {n}, accounted {total} ({}): something the scan cannot see holds {device} open (an fd in flight over a unix socket, an io_uring fixed file, a mapping of its node); find it (fuser -v /dev/{device}, ss -xp for unix sockets, /proc/PID/fdinfo of io_uring instances), stop it, and plan again",
            accounted.describe()
        )),
        _ => Some(format!(
            "open count {}, accounted {total} ({}): fewer openers than the plan accounts for, so its picture of what opens {device} is wrong and could be hiding one; nothing is done to it: plan again",
            open.map_or_else(|| "negative".to_owned(), |n| n.to_string()),
            accounted.describe()
        )),
    }
}

/// The gate as it was before issue 34 (the `openers-exact` mutant): the count no more than the
/// openers, fds counted one by one, an unreadable count let through.
#[cfg(feature = "mutation-check")]
fn openers_at_most(device: &DeviceName, open_count: Option<i32>, accounted: &Openers) -> Option<String> {
    let open = open_count?;
    let total = accounted.filesystems + accounted.stacked.len() + accounted.fds;
    (usize::try_from(open).is_err() || open as usize > total).then(|| {
        format!("open count {open}, accounted {total}: something the scan cannot see holds {device} open")
    })
}

/// The prefix of every reason [`protection`] gives: how a refusal names a protection rule.
pub const PROTECTED: &str = "is protected:";

/// The device is protected (behind the host root, the kubelet or the runtime, or listed): which
/// rule protects it.
pub fn protection(entry: &DeviceEntry, protected: &crate::graph::protect::Protected) -> Option<String> {
    protected.get(&entry.device.devnum).map(|why| format!("{} {PROTECTED} {why}", entry.device.name))
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

/// What a release carries besides its mounts, for [`mount_users`] and [`umount_propagation`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Releasing<'a> {
    /// Openers stuck on a dead map that the plan frees (`fail_if_no_path` first).
    pub expected_openers: &'a [u32],
    /// Devices stacked on it that the plan removes.
    pub removed: &'a [DeviceName],
    /// The operator forced the release (`--force-busy REASON`): process users do not refuse it.
    pub force_busy: bool,
}

/// What still uses a device through the mount namespaces `detached` whose mounts of it a release
/// would detach: a process with a task in one of them whose cwd, root, an open file, the device
/// node or a mapping is on it (a task's own cwd and root count in that task's namespace; what the
/// whole process holds, in every namespace it has a task in); a process holder whose namespace is
/// unknown; anything the kernel holds with no namespace (swap, a loop device's backing file, a
/// stacked device, a filesystem with no mount). `umount2(MNT_DETACH)` removes only the mount: the
/// filesystem stays alive for every such user, who loses only path lookups (gotcha 24), so the
/// detach breaks them and frees nothing. Exempt: openers stuck on a dead map that the plan frees
/// and devices stacked on it that the plan removes ([`Releasing`]). A process in a namespace
/// the release does not touch is not its concern: its own mount stays. `--force-busy`
/// ([`Releasing::force_busy`]) lets process users through, never the kernel's own holders.
pub fn mount_users(entry: &DeviceEntry, detached: &[MountNsId], with: &Releasing<'_>) -> Option<String> {
    // mutation-check: mount-users
    removable!("mount-users", None);
    let in_detached = |h: &Holder| {
        h.mount_namespace.is_none_or(|n| detached.contains(&n))
            || h.other_namespaces.iter().any(|n| detached.contains(n))
    };
    let mut processes = Vec::new();
    let mut kernel = Vec::new();
    for h in &entry.holders {
        match h.kind {
            HolderKind::Mount => {}
            HolderKind::OpenDevice
                if !h.pids.is_empty() && h.pids.iter().all(|p| with.expected_openers.contains(p)) => {}
            HolderKind::StackedDevice if h.device.as_ref().is_some_and(|d| with.removed.contains(d)) => {}
            HolderKind::OpenDevice
            | HolderKind::OpenFile
            | HolderKind::Cwd
            | HolderKind::Root
            | HolderKind::Mmap => {
                if in_detached(h) {
                    processes.push(h.describe_in_namespace());
                }
            }
            HolderKind::StackedDevice
            | HolderKind::Swap
            | HolderKind::LoopBacking
            | HolderKind::Filesystem => kernel.push(h.describe()),
        }
    }
    if with.force_busy {
        processes.clear();
    }
    if processes.is_empty() && kernel.is_empty() {
        return None;
    }
    let namespaces: Vec<String> = detached.iter().map(|n| n.0.to_string()).collect();
    let mut why = format!(
        "{}: a release would detach its mount(s) in mount namespace {}",
        entry.device.name,
        namespaces.join(", ")
    );
    if !processes.is_empty() {
        why.push_str(&format!(
            ", but the filesystem is still used there: {}: a detached mount stays alive for its users and frees nothing, and they lose their path to it: stop those processes (or have them let go of the files) first, or pass --force-busy REASON to detach anyway",
            processes.join("; ")
        ));
    }
    if !kernel.is_empty() {
        why.push_str(&format!(
            "{} the kernel holds the device outside any mount: {}: detaching frees nothing while it does, and --force-busy does not cover these (it overrides process users only): swapoff it, detach the loop device, remove the stacked device or unmount the overlay first",
            if processes.is_empty() { ", but" } else { "; and" },
            kernel.join("; ")
        ));
    }
    Some(why)
}

/// What unmounting a mount a release detaches (`mount`: namespace and mount ID) takes with it
/// through mount propagation (`reach`, from whole tables read now: [`crate::graph::propagation`]):
/// the kernel unmounts, through the parent's peer group, the mount at the same place in every peer
/// and slave of the parent (gotcha 29). Each such mount must itself be releasable: a mount of the
/// same device in a namespace other than the host's, tied to no host mount ([`HostChain`]), that
/// nothing in its namespace uses ([`mount_users`] for its namespace, `--force-busy` as for the
/// release). Anything else (the host's own mount, a copy of one, another device's mount, one the
/// scan did not see, one something uses) refuses the detach, naming it; so does a reach that
/// could not be told (a namespace that could not be read).
pub fn umount_propagation(
    entry: &DeviceEntry,
    host_ns: MountNsId,
    mount: (MountNsId, u32),
    reach: &Reach,
    with: &Releasing<'_>,
) -> Option<String> {
    // mutation-check: umount-propagation
    removable!("umount-propagation", None);
    let (ns, id) = mount;
    let taken = match reach {
        Ok(t) => t,
        Err(why) => {
            return Some(format!(
                "what unmounting mount {id} of {} in mount namespace {} would take with it through mount propagation cannot be told ({why}): nothing is unmounted blind",
                entry.device.name, ns.0
            ))
        }
    };
    let chain = HostChain::of(&entry.holders);
    for t in taken.iter().filter(|t| (t.ns, t.mount_id) != mount) {
        let holder = entry.holders.iter().find(|h| {
            h.kind == HolderKind::Mount && h.mount_namespace == Some(t.ns) && h.mount_id == Some(t.mount_id)
        });
        let why_not = match holder {
            None if t.ns == host_ns => Some("it is a mount in the host's mount namespace".to_owned()),
            None if entry
                .holders
                .iter()
                .any(|h| h.kind == HolderKind::Mount && h.mount_dev == Some(t.devnum)) =>
            {
                Some(format!("the scan of {} does not see that mount", entry.device.name))
            }
            None => Some(format!(
                "it is another device's mount ({}), which this release does not vouch for",
                t.devnum
            )),
            Some(h) if h.in_host_namespace != Some(false) => Some("it is the host's own mount".to_owned()),
            Some(h) => chain.ties(h).or_else(|| mount_users(entry, &[t.ns], with)),
        };
        if let Some(why) = why_not {
            let place = if t.ns == host_ns {
                "the host's mount namespace".to_owned()
            } else {
                format!("mount namespace {}", t.ns.0)
            };
            return Some(format!(
                "unmounting mount {id} of {} in mount namespace {} would also unmount {} ({} {}, {}, mount {}) in {place}: the kernel propagates an unmount through the parent mount's peer group (its parent {} is shared:{}) to the mount at the same place in every peer and slave of that parent: {why}; to release the copy alone, stop its parent propagating first (in its namespace: nsenter -t PID -m mount --make-rslave {}), or unmount the other mount where it lives",
                entry.device.name,
                ns.0,
                t.mount_point,
                t.fstype,
                t.source,
                t.devnum,
                t.mount_id,
                t.through_parent,
                t.through_group,
                t.through_parent
            ));
        }
    }
    None
}

/// Asks the cluster's view about pod `uid` at `now` (`None`: the API is not asked, `off` why).
pub fn pod_api(uid: &str, view: Option<&ClusterView>, off: &str, now: BootTime) -> PodWord {
    // mutation-check: pod-api
    removable!("pod-api", PodWord::Gone("(the pod-api gate is removed)".into()));
    let Some(view) = view else {
        return PodWord::CannotVouch(format!("it is not asked: {off}"));
    };
    if let Err(why) = view.vouch(now) {
        return PodWord::CannotVouch(why);
    }
    match view.pod_by_uid(uid) {
        Some(p) => PodWord::OnNode(format!(
            "pod {}/{} (UID {}, phase {}) is on node {} {PER_THE_API}",
            p.namespace,
            p.name,
            p.uid,
            if p.phase.is_empty() { "unknown" } else { &p.phase },
            view.node_name
        )),
        None => PodWord::Gone(format!(
            "no pod with UID {uid} is on node {} {PER_THE_API} ({} pods there, mirror pods' config hashes included)",
            view.node_name,
            view.pods_on_node.len()
        )),
    }
}

/// Something of pod `uid` still runs on this node: a process in its cgroup (`pids`), or a mount
/// of one of its files (etc-hosts, a termination log, a volume: `rooted` in its directory) in
/// some namespace, a container of the pod or a copy of its mounts; or it cannot be told
/// (`cannot_tell`: processes whose cgroup could not be read).
pub fn pod_node(uid: &str, pids: &[u32], rooted: &[Pin], cannot_tell: &[String]) -> Option<String> {
    // mutation-check: pod-node
    removable!("pod-node", None);
    if !pids.is_empty() {
        let shown: Vec<String> = pids.iter().take(5).map(u32::to_string).collect();
        return Some(format!(
            "pod {uid} still has {} process(es) on this node (pid {})",
            pids.len(),
            shown.join(", ")
        ));
    }
    if let Some(p) = rooted.first() {
        return Some(format!(
            "{}, is rooted in the pod's directory: a container of pod {uid}, or a copy of its mounts, still uses it",
            p.describe()
        ));
    }
    cannot_tell.first().map(|w| format!("cannot tell whether a process of pod {uid} runs here: {w}"))
}

/// Something is mounted at or below the directory, or rooted in it, in some namespace (`pins`),
/// or it cannot be told (`cannot_tell`: a namespace whose table could not be read, a blind spot
/// of the scan, a directory that could not be located): `rmdir` must not run. (The kernel
/// refuses it with `EBUSY` only in the namespace where the mount is; from any other it removes
/// the directory and detaches that mount.)
pub fn dir_mounts(pins: &[Pin], cannot_tell: &[String]) -> Option<String> {
    // mutation-check: dir-mounts
    removable!("dir-mounts", None);
    if let Some(p) = pins.first() {
        let more = if pins.len() > 1 { format!(" (and {} more)", pins.len() - 1) } else { String::new() };
        return Some(format!("still mounted: {}{more}", p.describe()));
    }
    cannot_tell
        .first()
        .map(|w| format!("cannot tell whether anything is mounted on it in every mount namespace: {w}"))
}

/// The directory at `rel` is not the one planned (its device and inode now: `None`, gone).
pub fn dir_identity(rel: &std::path::Path, planned: FileKey, now: Option<FileKey>) -> Option<String> {
    // mutation-check: dir-identity
    removable!("dir-identity", None);
    match now {
        Some(k) if k == planned => None,
        Some(k) => Some(format!(
            "{} is another directory now (device/inode {k}, planned for {planned}): recreated since it was planned",
            rel.display()
        )),
        None => Some(format!("{} is no longer there to check", rel.display())),
    }
}

#[cfg(test)]
#[path = "gates_release_tests.rs"]
mod release_tests;
