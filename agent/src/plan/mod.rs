//! Pure planning: from a device's holders to ordered, idempotent steps, plus what is left alone
//! and why. Nothing here reads or writes the host, and nothing here decides whether a plan may
//! run: the gates ([`crate::gates`]) and the engine do that.
//!
//! `release` detaches every mount of the device that lives in a namespace other than the host's,
//! except a copy (shared peer or slave) of a mount that is live in the host's namespace; it never
//! kills a process. `clean` tears a device down by its kind. Every step carries the kernel
//! identity of the device it acts on, re-checked right before it runs.

pub mod step;

pub use step::{Action, LeftAlone, Plan, Step};

use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{DeviceKind, DeviceName, HolderKind};

impl Plan {
    fn unsupported(&mut self, reason: String) {
        self.steps.clear();
        self.refusal = Some(reason);
        self.unsupported = true;
    }

    fn held(&mut self, holders: &[&Holder], what: &str) {
        self.left_alone =
            holders.iter().map(|h| LeftAlone { holder: (*h).clone(), reason: h.describe() }).collect();
        let what = if what.is_empty() { String::new() } else { format!(" {what}") };
        self.refuse(format!("{} is still held by {} holder(s){what}", self.device, holders.len()));
    }
}

/// Peer groups of the device's mounts in the host's namespace: a foreign mount that is a shared
/// peer (`shared:N`) or a slave (`master:N`) of one is a copy of a mount live on the host.
fn host_peer_groups(entry: &DeviceEntry) -> Vec<u32> {
    entry
        .holders
        .iter()
        .filter(|h| h.kind == HolderKind::Mount && h.in_host_namespace == Some(true))
        .filter_map(|h| h.shared_group)
        .collect()
}

/// Why a foreign mount must not be detached: it is a copy of a mount live on the host.
fn host_copy(h: &Holder, host_groups: &[u32]) -> Option<String> {
    if let Some(g) = h.shared_group.filter(|g| host_groups.contains(g)) {
        return Some(format!(
            "{}: it is a shared peer (shared:{g}) of a mount in the host's namespace, so detaching it would unmount the host's copy too: left alone",
            h.describe()
        ));
    }
    if let Some(g) = h.master_group.filter(|g| host_groups.contains(g)) {
        return Some(format!(
            "{}: it is a slave copy (master:{g}) of a mount live in the host's namespace (as every systemd unit with PrivateTmp has): detaching it would break that process's view while the host's mount lives on: left alone",
            h.describe()
        ));
    }
    None
}

/// Plans the release of every foreign-namespace mount of `entry`'s device that is not a copy of
/// a mount live in the host's namespace.
pub fn release(entry: &DeviceEntry) -> Plan {
    let mut p = Plan::new("release", entry);
    let host_groups = host_peer_groups(entry);
    for h in &entry.holders {
        if h.is_foreign_mount() {
            if let Some(reason) = host_copy(h, &host_groups) {
                p.left_alone.push(LeftAlone { holder: h.clone(), reason });
                continue;
            }
        }
        match (h.is_foreign_mount(), &h.namespace_entry, h.mount_namespace, h.mount_id, h.mount_dev) {
            (true, Some(via), Some(ns), Some(id), Some(dev)) => p.steps.push(Step::on(
                entry,
                Action::DetachMount {
                    namespace: ns,
                    via: via.clone(),
                    mount_id: id,
                    mount_dev: dev,
                    mount_point: h.mount_point.clone().unwrap_or_default(),
                    fstype: h.fstype.clone().unwrap_or_default(),
                },
            )),
            _ => {
                let mut reason = h.describe();
                if h.kind != HolderKind::Mount {
                    reason.push_str(": release does not touch processes or other devices");
                }
                p.left_alone.push(LeftAlone { holder: h.clone(), reason });
            }
        }
    }
    p
}

/// Releases a device's foreign mounts, then runs `last` on it; anything else that holds it (or
/// a mount release leaves alone) refuses the plan.
fn release_then(entry: &DeviceEntry, operation: &'static str, last: Action) -> Plan {
    let mut p = release(entry);
    p.operation = operation;
    if !p.left_alone.is_empty() {
        let n = p.left_alone.len();
        p.refuse(format!("{} is still held by {n} holder(s) release cannot detach", p.device));
        return p;
    }
    p.steps.push(Step::on(entry, last));
    p
}

/// Plans unbinding a loop device, releasing its foreign mounts first; refused while anything
/// else holds it.
pub fn clean_loop(entry: &DeviceEntry) -> Plan {
    let d = &entry.device;
    let Some(info) = &d.loop_info else {
        return Plan::new("clean", entry); // unbound already: nothing to do
    };
    release_then(
        entry,
        "clean",
        Action::DetachLoop {
            backing_file: info.backing_file.clone(),
            backing_dev: info.backing_dev,
            backing_inode: info.backing_inode,
        },
    )
}

/// The teardown of a multipath map with no active path (incident 3), in the only safe order:
/// stop queueing (so nothing can hang on it, and stuck readers get EIO and let go), release the
/// mounts in other namespaces of it and of the layers stacked on it, remove those layers
/// top-down (crypt mappings and LVs before what they sit on, kpartx partition maps last; see
/// [`crate::stack`]), remove the map, then set each path offline and delete it. Refused while
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
    let stacks = crate::stack::above(entry, graph);
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
    let (steps, notes) = crate::plan_iscsi::logouts(graph, &deleted, &deleted);
    p.steps.extend(steps);
    p.notes = notes;
    p
}

/// Offline, then delete. A disk whose wwid is unknown is never touched: nothing could tell it
/// from another disk that takes its name.
fn scsi_steps(disk: &DeviceEntry, require_offline: bool) -> Result<Vec<Step>, String> {
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
                let (logouts, notes) = crate::plan_iscsi::logouts(
                    graph,
                    std::slice::from_ref(&d.name),
                    &crate::plan_iscsi::going_with(entry, graph),
                );
                p.steps.extend(logouts);
                p.notes = notes;
            }
            Err(why) => p.refuse(why),
        },
    }
    p
}

/// Unmapping an rbd image or disconnecting an nbd device: its mounts in other namespaces are
/// released first; anything else that holds it refuses the plan.
pub fn unmap(entry: &DeviceEntry, force: bool) -> Plan {
    let d = &entry.device;
    if let Some(r) = &entry.rbd {
        let last = Action::RbdUnmap {
            id: r.id,
            pool: r.pool.clone(),
            image: r.image.clone(),
            image_id: r.image_id.clone(),
            force,
        };
        return release_then(entry, "unmap", last);
    }
    if let Some(n) = &entry.nbd {
        return release_then(
            entry,
            "unmap",
            Action::NbdDisconnect { server_pid: n.pid, backend: n.backend.clone() },
        );
    }
    let mut p = Plan::new("unmap", entry);
    p.unsupported(format!("{} is neither an rbd nor a connected nbd device", d.name));
    p
}

/// Opt-ins for `clean`, off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanOptions {
    /// Remove a multipath map on its last close if it is still open (`DM_DEFERRED_REMOVE`).
    pub deferred_remove: bool,
    /// Unmap rbd with `force`: in-flight I/O fails, and a mount left behind cannot be unmounted.
    pub force_unmap: bool,
}

/// What `clean` does to a device, by kind: tear down a multipath map, delete a standalone SCSI
/// disk, unmap an rbd image, disconnect an nbd device, unbind a loop device.
pub fn for_clean(entry: &DeviceEntry, graph: &DeviceGraph, opts: CleanOptions) -> Plan {
    if entry.multipath.is_some() {
        teardown_map(entry, graph, opts.deferred_remove)
    } else if entry.nvme.is_some() {
        crate::nvme::plan_clean(entry, graph)
    } else if entry.scsi.is_some() {
        delete_disk(entry, graph)
    } else if entry.rbd.is_some() || entry.nbd.is_some() {
        unmap(entry, opts.force_unmap)
    } else if entry.device.kind == DeviceKind::Loop {
        clean_loop(entry)
    } else if let Some(layer) = crate::stack::layer_of(&entry.device) {
        let mut p = Plan::new("clean", entry);
        let maps = crate::stack::base_maps(entry, graph);
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
