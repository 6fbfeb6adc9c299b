//! The verdict of a loop device (and of any other mapping the agent may clean, rbd and nbd
//! once they got here): a candidate once nothing holds it.

use super::{fin, Assessment, Verdict};
use crate::graph::DeviceEntry;
use crate::model::DeviceKind;

/// An unheld device's assessment when no transport claimed it.
pub(super) fn assess(e: &DeviceEntry) -> Assessment {
    let d = &e.device;
    if !is_mapping(e) {
        return fin(
            Verdict::Unused,
            vec![format!(
                "nothing holds {}; a {} is not something the agent cleans",
                d.name,
                d.kind.as_str()
            )],
        );
    }
    Assessment::Candidate(format!(
        "nothing holds {} (no mount in any namespace, no open fd, no swap, nothing stacked on it) for {{age}}",
        d.name
    ))
}

/// Kinds the agent may clean once stale.
pub(super) fn is_mapping(e: &DeviceEntry) -> bool {
    match e.device.kind {
        DeviceKind::Loop => e.device.loop_info.is_some(),
        DeviceKind::Rbd | DeviceKind::Nbd => e.device.size_bytes > 0,
        _ => false,
    }
}
