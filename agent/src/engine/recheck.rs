//! The check right before a destructive step: a fresh scan of the step's device and the
//! kernel's own word must agree with the plan. Pure: the engine hands in what it read.
//!
//! The device must still be the one planned (identity), fully seen (no blind spot reaches it),
//! not protected, used by no pod (kubelet, the API), and held by nothing the plan does not
//! account for: before `fail_if_no_path` the plan may still hold the mounts it is about to
//! release, the readers stuck on the map (or on a layer stacked on it) and the layers stacked
//! on it (LVs, crypt mappings, partition maps, removed next, top-down); before a removal,
//! nothing but the stuck readers that are exiting: the layers above a layer are gone by then.

use crate::act::probe::KernelWord;
use crate::clock::BootTime;
use crate::gates::{self, Accounted};
use crate::graph::{DeviceEntry, Holder};
use crate::identity::Identity;
use crate::kube::ClusterView;
use crate::model::HolderKind;
use crate::plan::{Action, Plan, Step};
use crate::scan::Scan;

/// Why `step` must not run now (`None`: it may).
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
