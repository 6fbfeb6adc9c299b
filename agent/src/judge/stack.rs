//! The verdict of a dm layer (an LV, a crypt mapping, a kpartx partition map) stacked on a
//! multipath map: judged after the map and taken down with it, top-down, while the map is a
//! candidate; on its own otherwise. A blind spot reaching any layer on a device makes that
//! device's verdict unknown ([`layers_blind`]).

use std::collections::HashMap;

use super::weigh_stall_and_api::{weigh_api, weigh_stall};
use super::{JudgeInput, Judgement, Verdict};
use crate::graph::scan::Scan;
use crate::graph::stack::{above, base_maps, layer_of};
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::blindspot::BlindSpot;
use crate::model::{DevNum, DeviceName};

/// The one multipath map a dm layer is stacked on, when it is one (a layer on several maps, or
/// on none, is judged on its own).
pub(super) fn on_one_map(e: &DeviceEntry, graph: &DeviceGraph) -> Option<DeviceName> {
    layer_of(&e.device)?;
    match base_maps(e, graph).as_slice() {
        [map] => Some(map.clone()),
        _ => None,
    }
}

/// A layer on a map follows it while the map is a candidate: removed with it, top-down.
/// `layers` are the devices judged [`super::Assessment::LayerOf`] a map, with their own verdict.
pub(super) fn follow_maps(
    layers: Vec<(&DeviceEntry, DeviceName, Judgement)>,
    scan: &Scan,
    out: &mut HashMap<DevNum, Judgement>,
    input: &JudgeInput<'_>,
) {
    for (e, map, own) in layers {
        let d = &e.device;
        let what =
            layer_of(d).map_or_else(|| d.name.to_string(), |l| format!("{} ({})", l.describe(), d.name));
        let map_j =
            scan.graph.devices.iter().find(|m| m.device.name == map).and_then(|m| out.get(&m.device.devnum));
        let j = match map_j {
            Some(mj) if matches!(mj.verdict, Verdict::Stale | Verdict::Suspect | Verdict::Unknown) => {
                let mut reasons = vec![format!(
                    "{what} is stacked on map {map}, which is {}: removed with it, top-down",
                    mj.verdict.as_str()
                )];
                reasons.extend(own.reasons);
                Judgement::new(mj.verdict, reasons)
            }
            Some(mj) if mj.verdict == Verdict::Protected => Judgement::new(
                Verdict::Protected,
                vec![format!("{what} is stacked on map {map}, which is protected")],
            ),
            _ => {
                let mut j = own;
                j.reasons.push(format!("{what} is stacked on map {map}"));
                if j.summary.is_empty() {
                    j.summary = j.reasons[0].clone();
                }
                j
            }
        };
        let j = weigh_stall(j, e, input.stalled.get(&d.devnum));
        out.insert(d.devnum, weigh_api(j, e, input));
    }
}

/// A blind spot of the scan reaching any layer stacked on `base`: its stacks' holders may be
/// unseen, so nothing destructive rests on them.
pub fn layers_blind(base: &DeviceEntry, graph: &DeviceGraph, blind_spots: &[BlindSpot]) -> Option<String> {
    above(base, graph).layers.iter().find_map(|l| crate::judge::gates::completeness(l.entry, blind_spots))
}
