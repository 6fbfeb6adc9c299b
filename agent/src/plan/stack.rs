//! A dm layer (LV, crypt mapping, partition map) is never cleaned on its own: it is taken down
//! with the dead multipath map below it ([`super::multipath::teardown_map`]).

use crate::graph::stack::StackLayer;
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::DeviceName;
use crate::plan::step::Plan;

/// The refused plan of `clean` on a layer: clean the map below it instead.
pub fn clean_layer(entry: &DeviceEntry, graph: &DeviceGraph, layer: &StackLayer) -> Plan {
    let mut p = Plan::new("clean", entry);
    let maps = crate::graph::stack::base_maps(entry, graph);
    let on = if maps.is_empty() {
        "no multipath map".to_owned()
    } else {
        maps.iter().map(DeviceName::as_str).collect::<Vec<_>>().join(", ")
    };
    p.refuse(format!(
        "{} is {} stacked on {on}: a stack is taken down with the dead map below it (clean the map), never on its own",
        entry.device.name,
        layer.describe()
    ));
    p
}
