//! The verdict of a SCSI disk: a path of a multipath map is judged with its map; a standalone
//! disk is a candidate once it is offline, or once its iSCSI target reports its LUN gone, with
//! no holder.

use super::{fin, Assessment, Verdict};
use crate::graph::multipath::ScsiView;
use crate::graph::{DeviceEntry, Holder};

/// A SCSI disk's assessment.
pub(super) fn assess(e: &DeviceEntry, sc: &ScsiView) -> Assessment {
    let d = &e.device;
    if let Some(map) = &sc.path_of {
        return Assessment::PathOf(map.clone());
    }
    let state = serde_json::to_value(sc.disk.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default();
    if !e.holders.is_empty() {
        return fin(Verdict::InUse, e.holders.iter().map(Holder::describe).collect());
    }
    if sc.is_offline() {
        return Assessment::Candidate(format!(
            "{} ({}) has been {state} for {{age}} with no holder",
            d.name, sc.disk.address
        ));
    }
    if let Some(line) = sc.lun_gone.as_ref().filter(|_| sc.is_dead()) {
        return Assessment::Candidate(format!(
            "{} ({}): its iSCSI target reports the LUN gone (kernel log: \"{line}\"), with no holder for {{age}}",
            d.name, sc.disk.address
        ));
    }
    fin(Verdict::Unused, vec![format!("nothing holds {} ({}, {state}); a disk is not something the agent cleans while its device is not offline", d.name, sc.disk.address)])
}
