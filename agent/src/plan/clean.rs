//! What `clean` does to a device, by its kind: one transport's plan each.

use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::opt_ins::CleanOptions;
use crate::model::DeviceKind;
use crate::plan::step::Plan;

/// What `clean` does to a device, by kind: tear down a multipath map, delete a standalone SCSI
/// disk, unmap an rbd image, disconnect an nbd device, unbind a loop device.
pub fn for_clean(entry: &DeviceEntry, graph: &DeviceGraph, opts: CleanOptions) -> Plan {
    if entry.multipath.is_some() {
        super::multipath::teardown_map(entry, graph, opts.deferred_remove)
    } else if entry.nvme.is_some() {
        super::nvme::plan_clean(entry, graph)
    } else if entry.scsi.is_some() {
        super::scsi::delete_disk(entry, graph)
    } else if entry.rbd.is_some() || entry.nbd.is_some() {
        super::rbd::unmap(entry, opts.force_unmap)
    } else if entry.device.kind == DeviceKind::Loop {
        super::r#loop::clean(entry)
    } else if let Some(layer) = crate::graph::stack::layer_of(&entry.device) {
        super::stack::clean_layer(entry, graph, &layer)
    } else {
        let mut p = Plan::new("clean", entry);
        p.unsupported(format!(
            "{} is a {} device; clean handles loop devices, multipath maps, SCSI disks, rbd and nbd devices",
            entry.device.name,
            entry.device.kind.as_str()
        ));
        p
    }
}
