//! The iSCSI side of the verdicts: the outage guard. A device behind an iSCSI session whose
//! target (or portal) has every session down at once sits behind an outage, not staleness.

use crate::graph::outage::Outage;
use crate::graph::{DeviceEntry, DeviceGraph};

/// The outage a device sits behind: its iSCSI session's, or, for a multipath map with no
/// active path, that of one of its paths.
pub(super) fn outage_of<'a>(e: &'a DeviceEntry, graph: &'a DeviceGraph) -> Option<&'a Outage> {
    if let Some(o) = e.scsi.as_ref().and_then(|s| s.outage.as_ref()) {
        return Some(o);
    }
    let m = e.multipath.as_ref().filter(|m| m.active_paths == 0)?;
    m.paths
        .iter()
        .filter_map(|p| p.device.as_ref())
        .find_map(|n| graph.devices.iter().find(|x| &x.device.name == n)?.scsi.as_ref()?.outage.as_ref())
}
