//! What a step does to the simulated host's state, as the kernel would: a release detaches its
//! one mount; a stuck-map message lets its stuck readers go; taking a disk offline changes
//! nothing visible; every other step (unbind a loop device, unmap, disconnect, remove a map,
//! delete a disk, log out, delete a controller) removes its device, and with it the place it
//! held on the devices below.

use crate::act::StepOutcome;
use crate::graph::DeviceEntry;
use crate::model::HolderKind;
use crate::plan::{Action, Step};

/// Carries out `step` on `devices`. A mount or device already gone is `AlreadyAbsent`, as the
/// real actuators find it.
pub(super) fn apply(devices: &mut Vec<DeviceEntry>, step: &Step) -> StepOutcome {
    let Some(i) = devices.iter().position(|e| e.device.devnum == step.devnum) else {
        return StepOutcome::AlreadyAbsent;
    };
    match &step.action {
        Action::DetachMount { mount_id, .. } => {
            let before = devices[i].holders.len();
            devices[i].holders.retain(|h| h.kind != HolderKind::Mount || h.mount_id != Some(*mount_id));
            if devices[i].holders.len() == before {
                return StepOutcome::AlreadyAbsent;
            }
        }
        Action::DmMessage { .. } => {
            devices[i].holders.retain(|h| h.process_state != Some('D'));
        }
        Action::ScsiOffline { .. } => {}
        _ => {
            let gone = devices.remove(i).device.name;
            for e in devices.iter_mut() {
                e.holders.retain(|h| h.kind != HolderKind::StackedDevice || h.device.as_ref() != Some(&gone));
            }
        }
    }
    StepOutcome::Done
}
