//! Tearing down a multipath map with no active path, in the only safe order.

use super::release::release;
use super::scsi::scsi_steps;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::HolderKind;
use crate::plan::step::{Action, Plan, Step};

/// The teardown of a multipath map with no active path (incident 3), in the only safe order:
/// stop queueing (so nothing can hang on it, and stuck readers get EIO and let go), release the
/// mounts in other namespaces of it and of the layers stacked on it, remove those layers
/// top-down (crypt mappings and LVs before what they sit on, kpartx partition maps last; see
/// [`crate::graph::stack`]), remove the map, then set each path offline and delete it. Refused while
/// any path is active or anything else holds the map or the top of a stack on it.
pub fn teardown_map(entry: &DeviceEntry, graph: &DeviceGraph, deferred_remove: bool) -> Plan {
    let d = &entry.device;
    let mut p = Plan::new("teardown", entry);
    let Some(m) = &entry.multipath else {
        p.unsupported(format!("{} is not a multipath map", d.name));
        return p;
    };
    if m.active_paths > 0 {
        p.refuse(format!(
            "map {} ({}): {} path(s) active: a map with an active path is never torn down",
            m.name, d.name, m.active_paths
        ));
        return p;
    }
    if m.queue_if_no_path.is_none() {
        p.refuse(format!("map {} ({}): its table and status could not be read", m.name, d.name));
        return p;
    }
    // LVs, crypt mappings and partition maps stacked on it: removed top-down first, when
    // nothing holds the top of a stack but what the teardown releases.
    let stacks = crate::graph::stack::above(entry, graph);
    let blocking: Vec<&Holder> = entry
        .holders
        .iter()
        .filter(|h| !stacks.covers(h) && !h.releasable_from_dead_map(&m.partitions))
        .collect();
    if !blocking.is_empty() {
        p.held(&blocking, "the teardown cannot release");
        return p;
    }
    if !stacks.blocking.is_empty() {
        p.refuse(format!("{} carries a stack that is still held: {}", d.name, stacks.blocking.join("; ")));
        return p;
    }
    // The map's own foreign mounts, then each layer's, top-down.
    let mut releases = Vec::new();
    for e in std::iter::once(entry).chain(stacks.layers.iter().map(|l| l.entry)) {
        let release = release(e);
        if let Some(l) = release.left_alone.iter().find(|l| l.holder.kind == HolderKind::Mount) {
            let reason = l.reason.clone();
            p.left_alone = release.left_alone;
            p.refuse(format!("{}: a mount of {} cannot be released ({reason})", d.name, e.device.name));
            return p;
        }
        releases.extend(release.steps);
    }
    p.expected_openers = std::iter::once(entry)
        .chain(stacks.layers.iter().map(|l| l.entry))
        .flat_map(|e| e.holders.iter())
        .filter(|h| h.kind == HolderKind::OpenDevice && h.process_state == Some('D'))
        .flat_map(|h| h.pids.iter().copied())
        .collect();
    if m.queue_if_no_path == Some(true) {
        p.steps.push(Step::on(
            entry,
            Action::DmMessage { uuid: m.uuid.clone(), message: "fail_if_no_path".into() },
        ));
    }
    p.steps.extend(releases);
    // Each layer after every layer on top of it; partition maps last. By uuid, like the map.
    for l in &stacks.layers {
        let uuid = l.entry.device.dm.as_ref().map(|x| x.uuid.clone()).unwrap_or_default();
        p.steps.push(Step::on(l.entry, Action::DmRemove { uuid, deferred: false }));
    }
    // A partition map of it that is not stacked on it (sysfs does not list it among its
    // holders): never seen in practice, and not removed blindly.
    if let Some(part) = m.partitions.iter().find(|n| !stacks.has(n)) {
        p.refuse(format!(
            "partition map {part} of {} is not among the devices stacked on it: its stacking cannot be followed",
            d.name
        ));
        return p;
    }
    p.steps.push(Step::on(entry, Action::DmRemove { uuid: m.uuid.clone(), deferred: deferred_remove }));
    let mut deleted = Vec::new();
    for path in &m.paths {
        let Some(disk) =
            path.device.as_ref().and_then(|n| graph.devices.iter().find(|e| &e.device.name == n))
        else {
            continue;
        };
        match scsi_steps(disk, false) {
            Ok(steps) => p.steps.extend(steps),
            Err(why) => {
                p.refuse(why);
                return p;
            }
        }
        deleted.push(disk.device.name.clone());
    }
    let (steps, notes) = crate::plan::iscsi::logouts(graph, &deleted, &deleted);
    p.steps.extend(steps);
    p.notes = notes;
    p
}
