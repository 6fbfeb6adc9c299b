//! Device-mapper stacks on a multipath map: LVM logical volumes, dm-crypt (LUKS, plain)
//! mappings and kpartx partition maps, told apart by the dm uuid their tools give them (the
//! kernel's, from `DM_DEV_STATUS` or `dm/uuid`), and what holds the top of each stack.
//!
//! ```text
//! LVM-<vg uuid, 32><lv uuid, 32>[-<layer>]       name <vg>-<lv>[-<layer>], '-' in a name doubled
//! CRYPT-LUKS2-<uuid without dashes>-<name>       (also LUKS1; PLAIN, VERITY... carry no uuid)
//! part<N>-<parent uuid>                          kpartx: part1-mpath-3600...
//! ```
//!
//! A dead map with such layers on it is torn down top-down (`DM_DEV_REMOVE` of each layer by
//! its uuid: no key and no LVM command, the LVM metadata on the disks untouched) when nothing
//! holds the top of any stack but what the teardown releases (mounts in other namespaces,
//! readers stuck in D state that `fail_if_no_path` frees). [`above`] walks the stacks and says
//! which layers there are, in which order they go, and what keeps them, with the way from the
//! map up to each holder. Pure: it reads only the graph.

use std::collections::BTreeSet;

use serde::Serialize;

use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{BlockDevice, DeviceName, HolderKind};

/// What a stacked device-mapper layer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// An LVM logical volume (or one of its internal layers: `-real`, `-cow`, `-tpool`...).
    LvmLv,
    /// A dm-crypt mapping made by cryptsetup (LUKS1, LUKS2, plain...).
    Crypt,
    /// A kpartx partition map (`part<N>-<parent uuid>`).
    PartitionMap,
}

impl LayerKind {
    /// Every kind, in a fixed order (metrics export each, even at zero).
    pub const ALL: [LayerKind; 3] = [Self::LvmLv, Self::Crypt, Self::PartitionMap];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::LvmLv => "lvm_lv",
            Self::Crypt => "crypt",
            Self::PartitionMap => "partition_map",
        }
    }
}

/// A device-mapper device recognised as a stack layer, with what its uuid and name say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StackLayer {
    LvmLv {
        /// Volume group and logical volume, from the dm name (`--` unescaped).
        vg: String,
        lv: String,
        /// An LV's internal layer (`real`, `cow`, `tpool`, `tdata`, `tmeta`, `pool`...).
        #[serde(skip_serializing_if = "Option::is_none")]
        sublayer: Option<String>,
        vg_uuid: String,
        lv_uuid: String,
    },
    Crypt {
        /// `LUKS1`, `LUKS2`, `PLAIN`, `VERITY`, `INTEGRITY`, `TCRYPT`, `BITLK`, `SUBDEV`...
        format: String,
        /// The LUKS header's uuid (without dashes, as the dm uuid has it); none for plain.
        #[serde(skip_serializing_if = "Option::is_none")]
        header_uuid: Option<String>,
        /// The mapping's name as cryptsetup was given it.
        name: String,
    },
    PartitionMap {
        number: u32,
        parent_uuid: String,
    },
}

impl StackLayer {
    pub fn kind(&self) -> LayerKind {
        match self {
            Self::LvmLv { .. } => LayerKind::LvmLv,
            Self::Crypt { .. } => LayerKind::Crypt,
            Self::PartitionMap { .. } => LayerKind::PartitionMap,
        }
    }

    /// `LV vg0/lv0`, `crypt mapping secret (LUKS2)`, `partition map 1`.
    pub fn describe(&self) -> String {
        match self {
            Self::LvmLv { vg, lv, sublayer: None, .. } => format!("LV {vg}/{lv}"),
            Self::LvmLv { vg, lv, sublayer: Some(s), .. } => format!("LV {vg}/{lv} ({s} layer)"),
            Self::Crypt { format, name, .. } => format!("crypt mapping {name} ({format})"),
            Self::PartitionMap { number, .. } => format!("partition map {number}"),
        }
    }
}

/// Classifies a dm device by its uuid (authoritative) and name (for LVM's vg/lv). `None`: not
/// a layer the agent knows how to take down (a multipath map, an unnamed or foreign dm device).
pub fn classify(uuid: &str, dm_name: &str) -> Option<StackLayer> {
    if let Some(rest) = uuid.strip_prefix("LVM-") {
        return lvm(rest, dm_name);
    }
    if let Some(rest) = uuid.strip_prefix("CRYPT-") {
        return crypt(rest);
    }
    partition(uuid)
        .map(|(number, parent)| StackLayer::PartitionMap { number, parent_uuid: parent.to_owned() })
}

/// A kpartx partition map's uuid: `part<N>-<parent uuid>`.
pub fn partition(uuid: &str) -> Option<(u32, &str)> {
    let rest = uuid.strip_prefix("part")?;
    let (n, parent) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) || parent.is_empty() {
        return None;
    }
    Some((n.parse().ok()?, parent))
}

fn lvm(rest: &str, dm_name: &str) -> Option<StackLayer> {
    // 32 + 32 characters of LVM's uuid alphabet, then an optional `-<layer>` suffix.
    let ids = rest.get(..64)?;
    if !ids.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    let suffix = match &rest[64..] {
        "" => None,
        s => Some(s.strip_prefix('-').filter(|s| !s.is_empty())?.to_owned()),
    };
    let (vg, lv, name_layer) =
        split_lvm_name(dm_name).unwrap_or_else(|| (String::new(), dm_name.to_owned(), None));
    Some(StackLayer::LvmLv {
        vg,
        lv,
        sublayer: suffix.or(name_layer),
        vg_uuid: ids[..32].to_owned(),
        lv_uuid: ids[32..].to_owned(),
    })
}

/// `vg-lv[-layer]` with every `-` inside a name doubled: (vg, lv, layer).
fn split_lvm_name(name: &str) -> Option<(String, String, Option<String>)> {
    let mut parts = vec![String::new()];
    let mut chars = name.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '-' {
            if chars.peek() == Some(&'-') {
                chars.next();
                parts.last_mut()?.push('-');
            } else {
                parts.push(String::new());
            }
        } else {
            parts.last_mut()?.push(c);
        }
    }
    if parts.iter().any(String::is_empty) {
        return None;
    }
    let mut it = parts.into_iter();
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(vg), Some(lv), layer, None) => Some((vg, lv, layer)),
        _ => None,
    }
}

fn crypt(rest: &str) -> Option<StackLayer> {
    let (format, rest) = rest.split_once('-')?;
    if format.is_empty() || !format.bytes().all(|b| b.is_ascii_alphanumeric()) || rest.is_empty() {
        return None;
    }
    // LUKS: the header's uuid without dashes (32 hex digits), then the name.
    let with_uuid = rest
        .split_once('-')
        .filter(|(u, n)| u.len() == 32 && u.bytes().all(|b| b.is_ascii_hexdigit()) && !n.is_empty());
    let (header_uuid, name) = match with_uuid {
        Some((u, n)) if format.starts_with("LUKS") => (Some(u.to_owned()), n.to_owned()),
        _ => (None, rest.to_owned()),
    };
    Some(StackLayer::Crypt { format: format.to_owned(), header_uuid, name })
}

/// The layer a block device is, from its dm uuid and name.
pub fn layer_of(d: &BlockDevice) -> Option<StackLayer> {
    d.dm.as_ref().and_then(|dm| classify(&dm.uuid, &dm.name))
}

/// The kind label of a device for output and metrics: its layer kind when it is one, else its
/// block device kind (`dm` for multipath maps and dm devices of no known layer).
pub fn kind_label(d: &BlockDevice) -> &'static str {
    layer_of(d).map_or_else(|| d.kind.as_str(), |l| l.kind().as_str())
}

/// One layer of a stack, with the way down to the map (`LV vg/lv (dm-3)`, then what it is on).
#[derive(Debug, Clone)]
pub struct Layer<'g> {
    pub entry: &'g DeviceEntry,
    pub layer: StackLayer,
    /// `crypt mapping c (LUKS2) (dm-4) on LV vg/lv (dm-3)`: this layer and those below it.
    pub path: String,
}

/// The stacks on a device (a multipath map), as [`above`] found them.
#[derive(Debug, Clone, Default)]
pub struct Above<'g> {
    /// Every layer, in removal order: each after every layer stacked on it, partition maps last.
    pub layers: Vec<Layer<'g>>,
    /// Holders of the layers the teardown can get rid of, with their layer: mounts in other
    /// namespaces (released), readers stuck in D state (freed by `fail_if_no_path`).
    pub releasable: Vec<(&'g DeviceEntry, &'g Holder)>,
    /// What keeps a stack in use, one sentence each naming the holder and the way to it.
    pub blocking: Vec<String>,
}

impl Above<'_> {
    /// Whether `name` is one of the layers.
    pub fn has(&self, name: &DeviceName) -> bool {
        self.layers.iter().any(|l| &l.entry.device.name == name)
    }

    /// Whether the map's own holder `h` is a layer of these stacks.
    pub fn covers(&self, h: &Holder) -> bool {
        h.kind == HolderKind::StackedDevice && h.device.as_ref().is_some_and(|d| self.has(d))
    }

    /// The layers in words, top-down: `LV vg/lv (dm-3), partition map 1 (dm-1)`.
    pub fn describe(&self) -> String {
        let names: Vec<String> =
            self.layers.iter().map(|l| format!("{} ({})", l.layer.describe(), l.entry.device.name)).collect();
        names.join(", ")
    }
}

/// A holder the teardown of a dead map gets rid of when it holds a layer: a mount in another
/// namespace (released), a reader stuck in D state (`fail_if_no_path` fails its I/O).
fn releasable(h: &Holder) -> bool {
    h.is_foreign_mount() || (h.kind == HolderKind::OpenDevice && h.process_state == Some('D'))
}

/// Walks the dm layers (LVs, crypt mappings, partition maps) stacked on `base`, transitively,
/// and what holds them. A layer that also sits on a device outside these stacks, a stacked
/// device of another kind, a pod using a layer per kubelet, and every holder release cannot
/// detach keep the stacks in use (in [`Above::blocking`]).
pub fn above<'g>(base: &DeviceEntry, graph: &'g DeviceGraph) -> Above<'g> {
    let find = |n: &DeviceName| graph.devices.iter().find(|e| &e.device.name == n);
    let mut out = Above::default();
    // Breadth first from the map: (entry, layer, path, depth).
    let mut queue: Vec<(&'g DeviceEntry, StackLayer, String, usize)> = Vec::new();
    let mut seen: BTreeSet<DeviceName> = BTreeSet::new();
    for h in base.holders.iter().filter(|h| h.kind == HolderKind::StackedDevice) {
        let Some(e) = h.device.as_ref().and_then(&find) else { continue };
        let Some(layer) = layer_of(&e.device) else { continue };
        if seen.insert(e.device.name.clone()) {
            let path = format!("{} ({})", layer.describe(), e.device.name);
            queue.push((e, layer, path, 1));
        }
    }
    let mut i = 0;
    while i < queue.len() {
        let (e, _, path, depth) = queue[i].clone();
        i += 1;
        let on = format!("on {path}, stacked on {}", base.device.name);
        if let Some(k) = e.kubernetes.as_ref().filter(|k| !k.pod_uids.is_empty()) {
            out.blocking
                .push(format!("pod(s) {} on this node use it per kubelet ({on})", k.pod_uids.join(", ")));
        }
        for h in &e.holders {
            if h.kind == HolderKind::StackedDevice {
                let upper = h.device.as_ref().and_then(&find);
                match upper.and_then(|u| Some((u, layer_of(&u.device)?))) {
                    Some((u, layer)) => {
                        if seen.insert(u.device.name.clone()) {
                            let p = format!("{} ({}) on {path}", layer.describe(), u.device.name);
                            queue.push((u, layer, p, depth + 1));
                        }
                    }
                    None => out
                        .blocking
                        .push(format!("{} ({on}): not a layer the agent takes down", h.describe())),
                }
            } else if releasable(h) {
                out.releasable.push((e, h));
            } else {
                out.blocking.push(format!("{} ({on})", h.describe()));
            }
        }
    }
    // A layer that also sits on a device outside these stacks (an LV spanning a live disk) is
    // not this map's to take down.
    for (e, layer, _, _) in &queue {
        for s in &e.device.slaves {
            if s != &base.device.name && !seen.contains(s) {
                out.blocking.push(format!(
                    "{} ({}) also sits on {s}, outside the stacks on {}: it is not torn down with them",
                    layer.describe(),
                    e.device.name,
                    base.device.name
                ));
            }
        }
    }
    out.layers = removal_order(queue);
    out
}

/// Each layer after every layer stacked on it (Kahn's order on the stacking), deepest first,
/// partition maps after other layers of the same depth.
fn removal_order<'g>(mut queue: Vec<(&'g DeviceEntry, StackLayer, String, usize)>) -> Vec<Layer<'g>> {
    queue.sort_by_key(|(e, l, _, depth)| {
        (std::cmp::Reverse(*depth), l.kind() == LayerKind::PartitionMap, e.device.name.clone())
    });
    let names: BTreeSet<DeviceName> = queue.iter().map(|(e, ..)| e.device.name.clone()).collect();
    let mut done: BTreeSet<DeviceName> = BTreeSet::new();
    let mut out = Vec::with_capacity(queue.len());
    while !queue.is_empty() {
        let ready = queue.iter().position(|(e, ..)| {
            e.device.holders.iter().filter(|h| names.contains(*h)).all(|h| done.contains(h))
        });
        // A cycle cannot happen in the kernel's stacking; take the next one rather than loop.
        let (e, layer, path, _) = queue.remove(ready.unwrap_or(0));
        done.insert(e.device.name.clone());
        out.push(Layer { entry: e, layer, path });
    }
    out
}

/// The multipath maps at the bottom of the stacks a layer is part of (walking its slaves down
/// through other layers).
pub fn base_maps(e: &DeviceEntry, graph: &DeviceGraph) -> Vec<DeviceName> {
    let mut out = Vec::new();
    let mut frontier = vec![e];
    let mut seen: BTreeSet<DeviceName> = BTreeSet::new();
    while let Some(cur) = frontier.pop() {
        for s in &cur.device.slaves {
            if !seen.insert(s.clone()) {
                continue;
            }
            let Some(below) = graph.devices.iter().find(|x| &x.device.name == s) else { continue };
            if below.multipath.is_some() {
                if !out.contains(s) {
                    out.push(s.clone());
                }
            } else if layer_of(&below.device).is_some() {
                frontier.push(below);
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "stack_tests.rs"]
mod tests;
