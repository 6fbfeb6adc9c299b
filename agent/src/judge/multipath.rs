//! The verdict of a multipath map: a map with an active path is never stale; one whose every
//! path failed is a candidate (with the layers stacked on it) while nothing but what its
//! teardown releases holds it. Its paths follow it ([`follow_maps`]).

use std::collections::HashMap;

use super::{fin, Assessment, Judgement, Verdict};
use crate::graph::multipath::MultipathView;
use crate::graph::scan::Scan;
use crate::graph::stack;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{DevNum, DeviceName, HolderKind};

/// A multipath map's own assessment.
pub(super) fn assess(e: &DeviceEntry, m: &MultipathView, graph: &DeviceGraph) -> Assessment {
    let d = &e.device;
    let name = format!("map {} ({})", m.name, d.name);
    let total = m.paths.len();
    if m.queue_if_no_path.is_none() {
        return fin(Verdict::Unused, vec![format!("{name}: its table and status could not be read (no device-mapper control node), so its paths cannot be judged")]);
    }
    if m.active_paths > 0 {
        let mut reasons: Vec<String> = e.holders.iter().map(Holder::describe).collect();
        reasons.push(format!(
            "{name}: {} of {total} path(s) active: a map with an active path is never stale",
            m.active_paths
        ));
        return fin(if e.holders.is_empty() { Verdict::Unused } else { Verdict::InUse }, reasons);
    }
    // Layers stacked on it (LVs, crypt mappings, partition maps) go with it when nothing
    // holds the top of a stack but what the teardown releases.
    let stacks = stack::above(e, graph);
    let blocking: Vec<String> = e
        .holders
        .iter()
        .filter(|h| !stacks.covers(h) && !h.releasable_from_dead_map(&m.partitions))
        .map(Holder::describe)
        .chain(stacks.blocking.iter().cloned())
        .collect();
    if !blocking.is_empty() {
        let mut reasons = blocking;
        reasons.push(format!("{name}: every path failed, but it is still in use"));
        return fin(Verdict::InUse, reasons);
    }
    let paths = match total {
        0 => "no path left".to_owned(),
        1 => "its only path failed".to_owned(),
        2 => "both paths failed".to_owned(),
        n => format!("all {n} paths failed"),
    };
    let mut notes = vec![format!("open count {}", m.open_count.map_or("unknown".into(), |c| c.to_string()))];
    let layer_holders = stacks.releasable.iter().map(|(_, h)| *h);
    let mounts =
        e.holders.iter().chain(layer_holders.clone()).filter(|h| h.kind == HolderKind::Mount).count();
    notes.push(if mounts == 0 {
        "no mount in any namespace".into()
    } else {
        format!("{mounts} mount(s) in other namespaces to release first")
    });
    if !stacks.layers.is_empty() {
        notes.push(format!(
            "{} layer(s) stacked on it removed first: {}",
            stacks.layers.len(),
            stacks.describe()
        ));
    }
    let stuck = e.holders.iter().chain(layer_holders).filter(|h| h.kind == HolderKind::OpenDevice).count();
    if stuck > 0 {
        notes.push(format!("{stuck} process(es) stuck in D state on it (stopping queueing frees them)"));
    }
    if m.io_would_hang {
        notes.push("queue_if_no_path: any I/O to it hangs".into());
    }
    Assessment::Candidate(format!("{name}: {paths} for {{age}}, {}", notes.join(", ")))
}

/// A path follows its map: removable only with it. `paths` are the devices judged
/// [`Assessment::PathOf`] a map, each with its map's name; `out` holds the maps' verdicts.
pub(super) fn follow_maps(
    paths: Vec<(DevNum, DeviceName, DeviceName)>,
    scan: &Scan,
    out: &mut HashMap<DevNum, Judgement>,
) {
    for (devnum, name, map) in paths {
        let map_j =
            scan.graph.devices.iter().find(|e| e.device.name == map).and_then(|e| out.get(&e.device.devnum));
        let j = match map_j {
            Some(mj) if matches!(mj.verdict, Verdict::Stale | Verdict::Suspect | Verdict::Unknown) => {
                Judgement::new(
                    mj.verdict,
                    vec![format!(
                        "{name} is a path of {map}, which is {}: removed with it",
                        mj.verdict.as_str()
                    )],
                )
            }
            Some(mj) if mj.verdict == Verdict::Protected => Judgement::new(
                Verdict::Protected,
                vec![format!("{name} is a path of {map}, which is protected")],
            ),
            _ => Judgement::new(Verdict::InUse, vec![format!("{name} is a path of multipath map {map}")]),
        };
        out.insert(devnum, j);
    }
}

/// A dead multipath map that queues I/O: its plan starts with `fail_if_no_path`, which fails
/// the I/O that hangs on it.
pub(super) fn unblocked_by_its_plan(e: &DeviceEntry) -> bool {
    e.multipath.as_ref().is_some_and(|m| m.active_paths == 0 && m.queue_if_no_path == Some(true))
}
