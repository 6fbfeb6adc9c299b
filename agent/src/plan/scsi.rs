//! Deleting a SCSI disk: offline, then delete; its iSCSI session logged out when it was the
//! session's last disk.

use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::plan::step::{Action, Plan, Step};

/// Offline, then delete. A disk whose wwid is unknown is never touched: nothing could tell it
/// from another disk that takes its name.
pub(super) fn scsi_steps(disk: &DeviceEntry, require_offline: bool) -> Result<Vec<Step>, String> {
    let d = &disk.device;
    let s = disk.scsi.as_ref().ok_or_else(|| format!("{} is not a SCSI disk", d.name))?;
    let wwid = s.disk.wwid.clone().ok_or_else(|| {
        format!("{} has no wwid: it could not be told apart from another disk that takes its name, so it is never deleted", d.name)
    })?;
    let address = s.disk.address.to_string();
    Ok(vec![
        Step::on(disk, Action::ScsiOffline { wwid: wwid.clone(), address: address.clone(), require_offline }),
        Step::on(disk, Action::ScsiDelete { wwid, address }),
    ])
}

/// Deleting a standalone SCSI disk (offline, nothing holds it): offline, then delete. A path of
/// a multipath map goes with its map, never alone.
pub fn delete_disk(entry: &DeviceEntry, graph: &DeviceGraph) -> Plan {
    let d = &entry.device;
    let mut p = Plan::new("delete", entry);
    match &entry.scsi {
        None => p.unsupported(format!("{} is not a SCSI disk", d.name)),
        Some(s) if s.path_of.is_some() => p.refuse(format!(
            "{} is a path of multipath map {}: clean the map, which removes its paths",
            d.name,
            s.path_of.as_ref().map_or("?", |m| m.as_str())
        )),
        Some(_) if !entry.holders.is_empty() => {
            let held: Vec<&Holder> = entry.holders.iter().collect();
            p.held(&held, "");
        }
        // A disk planned because it is offline must still be offline when its step runs; one
        // whose LUN its target reports gone is running, and its plan takes it offline.
        Some(s) => match scsi_steps(entry, s.is_offline()) {
            Ok(steps) => {
                p.steps = steps;
                let (logouts, notes) = crate::plan::iscsi::logouts(
                    graph,
                    std::slice::from_ref(&d.name),
                    &crate::plan::iscsi::going_with(entry, graph),
                );
                p.steps.extend(logouts);
                p.notes = notes;
            }
            Err(why) => p.refuse(why),
        },
    }
    p
}
