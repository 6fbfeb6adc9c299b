//! The check right before a destructive step: a fresh scan of the step's device and the
//! kernel's own word must agree with the plan. Pure: the engine hands in what it read.
//!
//! A dm device's open count must equal the openers the plan accounts for, its stuck readers'
//! fds counted per open file as the kernel compares them right after the count ([`openers`]).
//! Whatever else the step removes (an NVMe controller's other namespaces, a disk's partitions)
//! passes the same gates and must be unheld ([`side_effect`]).
//!
//! The device must still be the one planned (identity), fully seen (no blind spot reaches it),
//! not protected, used by no pod (kubelet, the API), and held by nothing the plan does not
//! account for: before `fail_if_no_path` the plan may still hold the mounts it is about to
//! release, the readers stuck on the map (or on a layer stacked on it) and the layers stacked
//! on it (LVs, crypt mappings, partition maps, removed next, top-down); before a removal,
//! nothing but the stuck readers that are exiting: the layers above a layer are gone by then.
//!
//! Before a mount release ([`release_refusal`]): the device is still the one planned and fully
//! seen, the host's namespace is known, the planned mount (namespace, mount ID, superblock) is
//! still that mount and still not tied to a mount live in the host's namespace through any chain
//! of peer groups, and nothing in its namespace uses the filesystem (`--force-busy` lets process
//! users through, never the kernel's own holders); and ([`propagation_refusal`], from whole mount
//! tables read right then) nothing its unmount takes with it through the parent's peer group is
//! anything but a releasable copy of the same device.

use crate::discover::probe::KernelWord;
use crate::graph::identity::Identity;
use crate::graph::propagation::{HostChain, Reach};
use crate::graph::scan::Scan;
use crate::graph::{DeviceEntry, Holder};
use crate::host::clock::BootTime;
use crate::judge::gates::{self, Accounted};
use crate::kube::ClusterView;
use crate::model::HolderKind;
use crate::plan::{Action, Plan, Step};

/// Why `step` must not run now (`None`: it may). A dm step is then held to its openers too
/// ([`openers`], once the kernel has compared the stuck readers' fds).
pub fn refusal(
    plan: &Plan,
    step: &Step,
    fresh: &Scan,
    entry: &DeviceEntry,
    word: &KernelWord,
    api: Option<&ClusterView>,
    now: BootTime,
) -> Option<String> {
    gates::identity(&step.identity, &Identity::of(entry))
        .or_else(|| gates::completeness(entry, &fresh.blind_spots))
        .or_else(|| gates::protection(entry, &fresh.protected))
        .or_else(|| gates::kubelet_pods(entry))
        .or_else(|| gates::api(entry, api, now).refusal())
        .or_else(|| unaccounted_holders(plan, step, entry))
        .or_else(|| gates::kernel_word(&step.device, word, &accounted(plan, step)))
}

/// Whether `step` acts on a dm device (its open count is compared with its openers).
pub fn is_dm_step(step: &Step) -> bool {
    matches!(step.action, Action::DmMessage { .. } | Action::DmRemove { .. })
}

/// Why a dm step must not run: the kernel's open count of its device is not the openers the
/// plan accounts for ([`gates::openers`]). `files`: how many open files the stuck readers' fds
/// ([`expected_fds`]) are, asked of the kernel after `word` was read. `None` for other steps.
pub fn openers(
    plan: &Plan,
    step: &Step,
    entry: &DeviceEntry,
    word: &KernelWord,
    files: Result<usize, String>,
) -> Option<String> {
    if !is_dm_step(step) {
        return None;
    }
    gates::openers(&step.device, word.dm_open_count, &expected_openers(plan, step, entry, word, files))
}

/// The openers of `step`'s device that the plan accounts for right before it runs, from the
/// fresh scan's `entry` and the kernel's `word`: the filesystem whose mounts the plan releases
/// after stopping the queueing (one per superblock), the layers stacked on it that the plan
/// removes after it (one per table), and the open files of the stuck readers it expects to exit
/// (`files`, for their fds).
pub fn expected_openers(
    plan: &Plan,
    step: &Step,
    entry: &DeviceEntry,
    word: &KernelWord,
    files: Result<usize, String>,
) -> gates::Openers {
    let a = accounted(plan, step);
    openers_of(plan, entry, word, (a.filesystem_released, &a.stacked_removed), files)
}

/// The openers of dm device `entry` that the plan accounts for when it is made, before any step
/// ran: the filesystem whose mounts it releases, every layer stacked on it that it removes, the
/// open files of the stuck readers it frees (`files`).
pub fn planned_openers(
    plan: &Plan,
    entry: &DeviceEntry,
    word: &KernelWord,
    files: Result<usize, String>,
) -> gates::Openers {
    let devnum = entry.device.devnum;
    let released = plan.steps.iter().any(|s| s.is_release() && s.devnum == devnum);
    let removed: Vec<crate::model::DeviceName> = plan
        .steps
        .iter()
        .filter(|s| matches!(s.action, Action::DmRemove { .. }) && s.devnum != devnum)
        .map(|s| s.device.clone())
        .collect();
    openers_of(plan, entry, word, (released, &removed), files)
}

/// Why the plan must not run: the kernel's open count of `entry`, a dm device a step acts on,
/// is not the openers the plan accounts for when it is made ([`planned_openers`]).
pub fn planned_openers_refusal(
    plan: &Plan,
    entry: &DeviceEntry,
    word: &KernelWord,
    files: Result<usize, String>,
) -> Option<String> {
    gates::openers(&entry.device.name, word.dm_open_count, &planned_openers(plan, entry, word, files))
}

/// The stuck readers' open fds of `entry`'s node that the plan expects to let go, as (pid, fd):
/// what the kernel is asked to tell apart into open files. `Err`: a reader the scan saw without
/// its fd numbers (then it cannot be asked).
pub fn expected_fds(plan: &Plan, entry: &DeviceEntry) -> Result<Vec<(u32, u32)>, String> {
    let mut out = Vec::new();
    for h in expected_readers(plan, entry) {
        if h.fds.is_empty() {
            return Err(format!("{}: the scan has no fd numbers for it", h.describe()));
        }
        for &pid in &h.pids {
            out.extend(h.fds.iter().map(|&fd| (pid, fd)));
        }
    }
    Ok(out)
}

/// The holders of `entry` that are readers the plan expects to let go (stuck on a dead map).
fn expected_readers<'a>(plan: &'a Plan, entry: &'a DeviceEntry) -> impl Iterator<Item = &'a Holder> {
    entry.holders.iter().filter(|h| {
        h.kind == HolderKind::OpenDevice
            && !h.pids.is_empty()
            && h.pids.iter().all(|p| plan.expected_openers.contains(p))
    })
}

fn openers_of(
    plan: &Plan,
    entry: &DeviceEntry,
    word: &KernelWord,
    (filesystem_released, stacked_removed): (bool, &[crate::model::DeviceName]),
    files: Result<usize, String>,
) -> gates::Openers {
    let mounted = entry.holders.iter().any(|h| h.kind == HolderKind::Mount);
    let filesystems =
        if filesystem_released { word.live_filesystems.len().max(usize::from(mounted)) } else { 0 };
    let stacked = word.sysfs_holders.iter().filter(|h| stacked_removed.contains(h)).cloned().collect();
    let fds = expected_readers(plan, entry).map(|h| h.fds.len() * h.pids.len()).sum();
    gates::Openers { filesystems, stacked, fds, files }
}

/// Why `step` must not run because of `entry`, a device it removes besides its own (an NVMe
/// controller's other namespace, a partition, a session's other disk), as the fresh scan sees
/// it: it must have been looked at, pass the same gates and be held by nothing at all, not even
/// per the kernel. `None`: it may go.
pub fn side_effect(
    step: &Step,
    fresh: &Scan,
    entry: &DeviceEntry,
    word: Option<&KernelWord>,
    api: Option<&ClusterView>,
    now: BootTime,
) -> Option<String> {
    let name = &entry.device.name;
    let why = if !fresh.covers(entry.device.devnum) {
        Some("the scan did not look for its holders, so it cannot be vouched for".to_owned())
    } else {
        gates::completeness(entry, &fresh.blind_spots)
            .or_else(|| gates::protection(entry, &fresh.protected))
            .or_else(|| gates::kubelet_pods(entry))
            .or_else(|| gates::api(entry, api, now).refusal())
            .or_else(|| {
                (!entry.holders.is_empty()).then(|| {
                    let held: Vec<String> = entry.holders.iter().map(Holder::describe).collect();
                    format!("it is held: {}", held.join("; "))
                })
            })
            .or_else(|| {
                // A hidden NVMe path has no device node: the exclusive open cannot tell.
                let hidden =
                    entry.nvme.as_ref().is_some_and(|v| v.role == crate::graph::nvme::NvmeRole::Path);
                let accounted = Accounted { open_may_fail: hidden, ..Accounted::default() };
                word.and_then(|w| gates::kernel_word(name, w, &accounted))
            })
    };
    why.map(|w| {
        format!(
            "{name} goes too when {} runs ({}): {w}; nothing that something still uses is removed: resolve what holds {name}, or leave {} alone",
            step.action(),
            step.describe(),
            step.device
        )
    })
}

/// What the plan accounts for on the step's device, for the kernel's word.
pub fn accounted(plan: &Plan, step: &Step) -> Accounted {
    let stops_queueing = matches!(step.action, Action::DmMessage { .. });
    Accounted {
        filesystem_released: stops_queueing
            && plan.steps.iter().any(|s| s.is_release() && s.devnum == step.devnum),
        stacked_removed: if stops_queueing { removed_devices(plan, step) } else { Vec::new() },
        open_may_fail: matches!(step.action, Action::ScsiOffline { .. } | Action::ScsiDelete { .. }),
    }
}

/// Devices other than the step's own that the plan removes (the layers stacked on a map: LVs,
/// crypt mappings, partition maps).
fn removed_devices(plan: &Plan, step: &Step) -> Vec<crate::model::DeviceName> {
    plan.steps
        .iter()
        .filter(|s| matches!(s.action, Action::DmRemove { .. }) && s.devnum != step.devnum)
        .map(|s| s.device.clone())
        .collect()
}

/// A holder the fresh scan shows that the plan does not account for.
fn unaccounted_holders(plan: &Plan, step: &Step, entry: &DeviceEntry) -> Option<String> {
    let stops_queueing = matches!(step.action, Action::DmMessage { .. });
    // Removing the map, or a layer stacked on it (the readers may be stuck on a layer).
    let removes_dm = matches!(step.action, Action::DmRemove { .. });
    let removed = removed_devices(plan, step);
    let accounted = |h: &Holder| match h.kind {
        // Mounts this plan releases after stopping the queueing.
        HolderKind::Mount if stops_queueing => plan.steps.iter().any(|s| match &s.action {
            Action::DetachMount { namespace, mount_id, .. } => {
                s.devnum == step.devnum
                    && h.mount_namespace == Some(*namespace)
                    && h.mount_id == Some(*mount_id)
            }
            _ => false,
        }),
        // Readers stuck on the dead map: stopping the queueing frees them, and they exit.
        HolderKind::OpenDevice if stops_queueing || removes_dm => {
            !h.pids.is_empty() && h.pids.iter().all(|p| plan.expected_openers.contains(p))
        }
        // Its partition maps, which the plan removes first.
        HolderKind::StackedDevice if stops_queueing => h.device.as_ref().is_some_and(|d| removed.contains(d)),
        _ => false,
    };
    let unexpected: Vec<String> =
        entry.holders.iter().filter(|h| !accounted(h)).map(Holder::describe).collect();
    if unexpected.is_empty() {
        return None;
    }
    Some(format!(
        "a fresh scan finds {} holder(s) of {} the plan does not account for: {}",
        unexpected.len(),
        step.device,
        unexpected.join("; ")
    ))
}

/// Why the mount release `step` must not run now (`None`: it may). `fresh` is a new scan of the
/// step's device. A planned mount that the fresh, complete scan no longer shows is let through:
/// the actuator finds it gone in the namespace's own table and reports it already absent.
pub fn release_refusal(
    plan: &Plan,
    step: &Step,
    fresh: &Scan,
    api: Option<&ClusterView>,
    now: BootTime,
) -> Option<String> {
    let Action::DetachMount { namespace, mount_id, mount_dev, .. } = &step.action else {
        return None;
    };
    let Some(entry) = fresh.entry(step.devnum) else {
        return Some(format!(
            "a fresh scan does not find {} ({}): what its mount is cannot be re-checked",
            step.device, step.devnum
        ));
    };
    let mount = entry.holders.iter().find(|h| {
        h.kind == HolderKind::Mount && h.mount_namespace == Some(*namespace) && h.mount_id == Some(*mount_id)
    });
    gates::identity(&step.identity, &Identity::of(entry))
        .or_else(|| gates::completeness(entry, &fresh.blind_spots))
        .or_else(|| {
            fresh
                .graph
                .host_ns_unsure
                .as_ref()
                .map(|why| format!("{why}: no mount can be told host from foreign, so none is released"))
        })
        .or_else(|| gates::protection(entry, &fresh.protected))
        .or_else(|| gates::kubelet_pods(entry))
        .or_else(|| gates::api(entry, api, now).refusal())
        .or_else(|| {
            let m = mount?;
            if m.in_host_namespace != Some(false) {
                return Some(format!(
                    "mount {mount_id} is now in the host's mount namespace ({}): never released",
                    namespace.0
                ));
            }
            if m.mount_dev != Some(*mount_dev) {
                return Some(format!(
                    "mount {mount_id} in mount namespace {} is now of {}, not the planned {mount_dev}",
                    namespace.0,
                    m.mount_dev.map_or_else(|| "?".to_owned(), |d| d.to_string())
                ));
            }
            crate::plan::release::host_copy(m, &HostChain::of(&entry.holders))
                .map(|why| format!("a fresh scan ties it to the host's mount: {why}"))
        })
        .or_else(|| gates::mount_users(entry, &[*namespace], &releasing(plan, &removed_devices(plan, step))))
}

/// What the plan carries besides the step's mount, for the release gates.
fn releasing<'a>(plan: &'a Plan, removed: &'a [crate::model::DeviceName]) -> gates::Releasing<'a> {
    gates::Releasing {
        expected_openers: &plan.expected_openers,
        removed,
        force_busy: plan.force_busy.is_some(),
    }
}

/// Why the mount release `step` must not run because of what its unmount takes with it through
/// mount propagation (`reach`, from whole tables read right after `scan`: [`gates::umount_propagation`]).
/// `None` for other steps, and for a planned mount `scan` no longer shows (the actuator finds it
/// gone).
pub fn propagation_refusal(plan: &Plan, step: &Step, scan: &Scan, reach: &Reach) -> Option<String> {
    let Action::DetachMount { namespace, mount_id, .. } = &step.action else { return None };
    let entry = scan.entry(step.devnum)?;
    let removed = removed_devices(plan, step);
    gates::umount_propagation(
        entry,
        scan.graph.host_ns,
        (*namespace, *mount_id),
        reach,
        &releasing(plan, &removed),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::discover::namespaces::NsEntry;
    use crate::graph::DeviceGraph;
    use crate::model::blindspot::BlindSpot;
    use crate::model::{DevNum, MountNsId};

    const DEV: DevNum = DevNum { major: 7, minor: 3 };

    fn mount(ns: u64, shared: Option<u32>, master: Option<u32>) -> Holder {
        let mut h = Holder::bare(HolderKind::Mount);
        h.mount_namespace = Some(MountNsId(ns));
        h.in_host_namespace = Some(ns == 1);
        h.mount_id = Some(40 + ns as u32);
        h.mount_dev = Some(DEV);
        h.mount_point = Some("/mnt/x".into());
        h.shared_group = shared;
        h.master_group = master;
        h.namespace_entry = Some(NsEntry::Task { pid: 100, tid: 100 });
        h
    }

    fn cwd(ns: u64) -> Holder {
        let mut h = Holder::bare(HolderKind::Cwd);
        h.pids = vec![777];
        h.comm = Some("db".into());
        h.mount_namespace = Some(MountNsId(ns));
        h.in_host_namespace = Some(ns == 1);
        h.path = Some("/mnt/x".into());
        h
    }

    fn entry(holders: Vec<Holder>) -> DeviceEntry {
        crate::graph::test_support::loop3(holders)
    }

    fn scan(holders: Vec<Holder>) -> Scan {
        let graph =
            DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: vec![entry(holders)] };
        Scan::complete(graph, now())
    }

    fn now() -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(100))
    }

    /// The plan made when only the leaked copy in namespace 2 held the device.
    fn planned() -> Plan {
        let p = crate::plan::release::release(&entry(vec![mount(2, None, None)]));
        assert_eq!(p.steps.len(), 1);
        p
    }

    fn check(p: &Plan, fresh: &Scan) -> Option<String> {
        release_refusal(p, &p.steps[0], fresh, None, now())
    }

    #[test]
    fn the_same_unused_copy_may_go() {
        assert_eq!(check(&planned(), &scan(vec![mount(2, None, None)])), None);
        // Gone since (propagation took it, someone unmounted it): the actuator says so.
        assert_eq!(check(&planned(), &scan(Vec::new())), None);
    }

    #[test]
    fn a_user_that_came_since_the_plan_vetoes_the_detach_unless_forced() {
        let fresh = scan(vec![mount(2, None, None), cwd(2)]);
        let why = check(&planned(), &fresh).expect("refused");
        assert!(why.contains("pid 777 (db) has its working directory on it"), "{why}");
        let mut forced = planned();
        forced.force_busy = Some("operator said so".into());
        assert_eq!(check(&forced, &fresh), None);
        // A user in another namespace is not this detach's concern.
        assert_eq!(check(&planned(), &scan(vec![mount(2, None, None), cwd(1), mount(1, None, None)])), None);
    }

    #[test]
    fn a_copy_that_became_tied_to_the_host_through_a_chain_is_kept() {
        // Since the plan: the host mounted it shared:5, A copies it (shared:7 master:5) and the
        // planned mount became a slave of A's group.
        let fresh = scan(vec![mount(1, Some(5), None), mount(3, Some(7), Some(5)), mount(2, None, Some(7))]);
        let why = check(&planned(), &fresh).expect("refused");
        assert!(why.contains("master:7"), "{why}");
        let mut forced = planned();
        forced.force_busy = Some("operator said so".into());
        assert!(check(&forced, &fresh).is_some(), "--force-busy never overrides a host copy");
    }

    #[test]
    fn a_blind_spot_an_unknown_host_or_a_vanished_device_refuses() {
        let mut fresh = scan(vec![mount(2, None, None)]);
        fresh.blind_spots.push(BlindSpot::any("process 9: mountinfo unreadable"));
        let mut forced = planned();
        forced.force_busy = Some("operator said so".into());
        assert!(check(&forced, &fresh).is_some_and(|w| w.contains("blind spot")));
        let mut fresh = scan(vec![mount(2, None, None)]);
        fresh.graph.host_ns_unsure = Some("PID 1 cannot be read".into());
        assert!(check(&planned(), &fresh).is_some_and(|w| w.contains("host from foreign")));
        let mut fresh = scan(vec![mount(2, None, None)]);
        fresh.graph.devices.clear();
        assert!(check(&planned(), &fresh).is_some_and(|w| w.contains("does not find")));
    }

    #[test]
    fn a_mount_id_that_now_names_another_mount_refuses() {
        let mut other = mount(2, None, None);
        other.mount_dev = Some(DevNum::new(0, 77));
        let why = check(&planned(), &scan(vec![other])).expect("refused");
        assert!(why.contains("not the planned 7:3"), "{why}");
    }
}
