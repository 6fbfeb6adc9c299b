//! Pure planning: from a device's holders to ordered, idempotent steps, plus what is left alone
//! and why. Nothing here reads or writes the host, and nothing here decides whether a plan may
//! run: the gates ([`crate::judge::gates`]) and the engine do that.
//!
//! `release` detaches every mount of the device that lives in a namespace other than the host's,
//! except a copy (shared peer or slave, through any chain of peer groups) of a mount that is live
//! in the host's namespace; it never kills a process, and it is refused while a process in a
//! namespace it would detach a mount in uses the filesystem ([`release_with`]). `clean` tears a device down by its kind. Every step carries the kernel
//! identity of the device it acts on, re-checked right before it runs.

pub mod iscsi;
pub mod nvme;
pub mod scope;
pub mod step;

pub use step::{Action, LeftAlone, Plan, Step};

use crate::graph::{DeviceEntry, DeviceGraph, Holder, HostChain};
use crate::judge::gates;
use crate::model::{DeviceKind, DeviceName, HolderKind, MountNsId};

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

/// Why a foreign mount must not be detached: it is tied to a mount live in the host's namespace
/// by propagation, directly or through any chain of peer groups ([`HostChain`]).
pub fn host_copy(h: &Holder, chain: &HostChain) -> Option<String> {
    chain.ties(h).map(|why| format!("{}: {why}: left alone", h.describe()))
}

/// Opt-ins for `release`, off by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOptions {
    /// Detach mounts although processes in their namespaces use the filesystem (`--force-busy
    /// REASON`): the operator's reason, which goes into the plan and the audit log. Never
    /// overrides a blind spot or a copy of a host mount.
    pub force_busy: Option<String>,
}

/// Plans the release of every foreign-namespace mount of `entry`'s device that is not tied to
/// a mount live in the host's namespace (a shared peer, a slave through any chain of peer
/// groups, a master of the host's mount). Nothing else: who uses the mounts is the caller's
/// question ([`release_with`], the teardowns' own holder checks).
pub fn release(entry: &DeviceEntry) -> Plan {
    let mut p = Plan::new("release", entry);
    let chain = HostChain::of(&entry.holders);
    for h in &entry.holders {
        if h.is_foreign_mount() {
            if let Some(reason) = host_copy(h, &chain) {
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

/// The mount namespaces a plan detaches mounts in.
pub fn detached_namespaces(p: &Plan) -> Vec<MountNsId> {
    let mut out: Vec<MountNsId> = p
        .steps
        .iter()
        .filter_map(|s| match &s.action {
            Action::DetachMount { namespace, .. } => Some(*namespace),
            _ => None,
        })
        .collect();
    out.sort_unstable_by_key(|n| n.0);
    out.dedup();
    out
}

/// The operation `release`: [`release`], held to the clean path's standard. Refused while a
/// process in a namespace it would detach a mount in uses the filesystem (cwd, root, an open
/// file or the device node, a mapping), or anything the kernel holds without a namespace (swap,
/// a loop device's backing file, a stacked device) reaches the device ([`gates::mount_users`]):
/// a detached mount stays alive for its users, who lose only path lookups, so detaching it
/// breaks them and frees nothing (gotcha 24). `--force-busy REASON` lets it go ahead anyway,
/// with the reason in the plan. A process in a namespace the plan does not touch (the host's,
/// or one whose only mount is a copy left alone) does not refuse it: its own mount stays, and
/// the detached copies were not its way to the files (a release there is harmless, and frees
/// the leaked copies for when it lets go).
pub fn release_with(entry: &DeviceEntry, opts: &ReleaseOptions) -> Plan {
    let mut p = release(entry);
    if p.steps.is_empty() {
        return p;
    }
    let Some(users) = gates::mount_users(entry, &detached_namespaces(&p), &[], &[]) else { return p };
    match &opts.force_busy {
        Some(reason) => {
            p.notes.push(format!("--force-busy ({reason}): detaching anyway although {users}"));
            p.force_busy = Some(reason.clone());
        }
        None => p.refuse(users),
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
        crate::plan::nvme::plan_clean(entry, graph)
    } else if entry.scsi.is_some() {
        delete_disk(entry, graph)
    } else if entry.rbd.is_some() || entry.nbd.is_some() {
        unmap(entry, opts.force_unmap)
    } else if entry.device.kind == DeviceKind::Loop {
        clean_loop(entry)
    } else if let Some(layer) = crate::graph::stack::layer_of(&entry.device) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::namespaces::NsEntry;
    use crate::model::{BlockDevice, DevNum};

    const DEV: DevNum = DevNum { major: 7, minor: 3 };

    fn mount(ns: u64, shared: Option<u32>, master: Option<u32>) -> Holder {
        let mut h = Holder::bare(HolderKind::Mount);
        h.pids = vec![100 + ns as u32];
        h.mount_namespace = Some(MountNsId(ns));
        h.in_host_namespace = Some(ns == 1);
        h.mount_id = Some(40 + ns as u32);
        h.mount_dev = Some(DEV);
        h.mount_point = Some("/mnt/x".into());
        h.shared_group = shared;
        h.master_group = master;
        h.namespace_entry = Some(NsEntry::Task { pid: 100 + ns as u32, tid: 100 + ns as u32 });
        h
    }

    fn user(kind: HolderKind, ns: Option<u64>, pid: u32) -> Holder {
        let mut h = Holder::bare(kind);
        h.pids = vec![pid];
        h.pid_count = 1;
        h.comm = Some("db".into());
        h.mount_namespace = ns.map(MountNsId);
        h.in_host_namespace = ns.map(|n| n == 1);
        h.path = Some("/mnt/x/db".into());
        h
    }

    fn entry(holders: Vec<Holder>) -> DeviceEntry {
        DeviceEntry::new(
            BlockDevice {
                diskseq: Some(1),
                ..BlockDevice::new(DeviceName::new("loop3").expect("name"), DEV, DeviceKind::Loop, 1 << 20)
            },
            holders,
        )
    }

    fn forced() -> ReleaseOptions {
        ReleaseOptions { force_busy: Some("ticket 42: the pod is gone".into()) }
    }

    #[test]
    fn a_release_is_refused_while_a_process_in_the_namespace_uses_the_mount() {
        for kind in [
            HolderKind::Cwd,
            HolderKind::OpenFile,
            HolderKind::Mmap,
            HolderKind::Root,
            HolderKind::OpenDevice,
        ] {
            let e = entry(vec![mount(2, None, None), user(kind, Some(2), 777)]);
            let p = release_with(&e, &ReleaseOptions::default());
            assert!(p.steps.is_empty(), "{kind:?}: {p:?}");
            let why = p.refusal.as_deref().unwrap_or_default();
            assert!(why.contains("pid 777 (db)") && why.contains("mount namespace 2"), "{kind:?}: {why}");
            assert!(why.contains("--force-busy") && why.contains("stop those processes"), "{why}");
            // Forced: the step is planned, and the plan says why and what it breaks.
            let p = release_with(&e, &forced());
            assert_eq!(p.steps.len(), 1, "{kind:?}: {p:?}");
            assert_eq!(p.force_busy.as_deref(), Some("ticket 42: the pod is gone"));
            assert!(
                p.notes.iter().any(|n| n.contains("ticket 42") && n.contains("pid 777")),
                "{:?}",
                p.notes
            );
        }
    }

    #[test]
    fn users_with_no_namespace_or_an_unknown_one_refuse_too() {
        let mut swap = Holder::bare(HolderKind::Swap);
        swap.path = Some("/mnt/x/swapfile".into());
        let mut lb = Holder::bare(HolderKind::LoopBacking);
        lb.device = Some(DeviceName::new("loop9").expect("name"));
        let mut st = Holder::bare(HolderKind::StackedDevice);
        st.device = Some(DeviceName::new("dm-4").expect("name"));
        for h in [swap, lb, st, user(HolderKind::OpenFile, None, 5)] {
            let p = release_with(&entry(vec![mount(2, None, None), h.clone()]), &ReleaseOptions::default());
            assert!(p.refusal.is_some() && p.steps.is_empty(), "{h:?}: {p:?}");
        }
    }

    #[test]
    fn a_user_in_a_namespace_the_release_does_not_touch_does_not_refuse_it() {
        // The host's own mount and a process using it there; a leaked copy in namespace 2.
        let e = entry(vec![mount(1, None, None), user(HolderKind::Cwd, Some(1), 5), mount(2, None, None)]);
        let p = release_with(&e, &ReleaseOptions::default());
        assert_eq!(p.refusal, None, "{p:?}");
        assert_eq!(p.steps.len(), 1);
        assert!(p.force_busy.is_none() && p.notes.is_empty());
        // A process in namespace 3, whose only mount is a slave copy of the host's (left alone).
        let e = entry(vec![
            mount(1, Some(5), None),
            mount(2, None, None),
            mount(3, None, Some(5)),
            user(HolderKind::Mmap, Some(3), 6),
        ]);
        let p = release_with(&e, &ReleaseOptions::default());
        assert_eq!(p.refusal, None, "{p:?}");
        assert_eq!(detached_namespaces(&p), [MountNsId(2)]);
    }

    #[test]
    fn nothing_to_detach_is_not_refused_for_users() {
        let e = entry(vec![mount(1, None, None), user(HolderKind::Cwd, Some(1), 5)]);
        let p = release_with(&e, &ReleaseOptions::default());
        assert!(p.refusal.is_none() && p.steps.is_empty(), "{p:?}");
    }

    #[test]
    fn a_slave_of_a_slave_of_the_host_is_left_alone() {
        // Host shared:5 -> A shared:7 master:5 -> B master:7; C a private leak.
        let e = entry(vec![
            mount(1, Some(5), None),
            mount(2, Some(7), Some(5)),
            mount(3, None, Some(7)),
            mount(4, None, None),
        ]);
        let p = release(&e);
        assert_eq!(detached_namespaces(&p), [MountNsId(4)], "{p:?}");
        let b = p.left_alone.iter().find(|l| l.holder.mount_namespace == Some(MountNsId(3))).expect("B");
        assert!(b.reason.contains("slave copy (master:7)"), "{}", b.reason);
    }

    #[test]
    fn a_dead_maps_teardown_keeps_its_own_holder_rules() {
        // plan::release itself (what the teardowns build on) plans the detach: the teardown's
        // own checks decide about the users.
        let e = entry(vec![mount(2, None, None), user(HolderKind::Cwd, Some(2), 777)]);
        assert_eq!(release(&e).steps.len(), 1);
    }
}
