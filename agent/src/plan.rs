//! Pure planning: from a device's holders to ordered, idempotent steps, plus what is left alone
//! and why. Nothing here reads or writes the host.
//!
//! `release` detaches every mount of the device that lives in a namespace other than the host's;
//! it never kills a process, and mounts in the host's own namespace are left for the host (or
//! kubelet) to unmount. `clean` unbinds a loop device, and only when nothing holds it.

use serde::Serialize;

use crate::discover::namespaces::NsEntry;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{DevNum, DeviceKind, DeviceName, HolderKind, KernelText, MountNsId};

/// One destructive step. Each is idempotent: a target already gone is a success.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Step {
    /// `umount2(MNT_DETACH)` of one mount, inside its own namespace.
    DetachMount {
        device: DeviceName,
        devnum: DevNum,
        namespace: MountNsId,
        via: NsEntry,
        mount_id: u32,
        /// Bytes from the kernel; JSON and [`Step::describe`] show them escaped.
        mount_point: KernelText,
        fstype: KernelText,
    },
    /// `LOOP_CLR_FD` on a loop device whose binding still matches.
    DetachLoop {
        device: DeviceName,
        devnum: DevNum,
        backing_file: KernelText,
        backing_dev: Option<DevNum>,
        backing_inode: Option<u64>,
    },
    /// A device-mapper target message (`fail_if_no_path`: stop queueing, so I/O that would hang
    /// forever fails instead), to the map with this uuid.
    DmMessage { device: DeviceName, devnum: DevNum, uuid: String, message: String },
    /// Removes the dm device with this uuid (refused by the kernel while it is open, unless
    /// deferred, which only ever happens on request).
    DmRemove { device: DeviceName, devnum: DevNum, uuid: String, deferred: bool },
    /// `echo offline > /sys/block/<disk>/device/state`: no more commands (not even the
    /// SYNCHRONIZE CACHE a delete would send to a dead LUN).
    ScsiOffline { device: DeviceName, devnum: DevNum, wwid: Option<String>, address: String },
    /// `echo 1 > /sys/block/<disk>/device/delete`: removes the SCSI device.
    ScsiDelete { device: DeviceName, devnum: DevNum, wwid: Option<String>, address: String },
    /// `echo <id> > /sys/bus/rbd/remove_single_major` (`<id> force` only on request).
    RbdUnmap {
        device: DeviceName,
        devnum: DevNum,
        id: u32,
        pool: String,
        image: String,
        image_id: String,
        force: bool,
    },
    /// `NBD_DISCONNECT` and `NBD_CLEAR_SOCK` on `/dev/nbdN`.
    NbdDisconnect { device: DeviceName, devnum: DevNum },
}

impl Step {
    pub fn device(&self) -> &DeviceName {
        match self {
            Self::DetachMount { device, .. }
            | Self::DetachLoop { device, .. }
            | Self::DmMessage { device, .. }
            | Self::DmRemove { device, .. }
            | Self::ScsiOffline { device, .. }
            | Self::ScsiDelete { device, .. }
            | Self::RbdUnmap { device, .. }
            | Self::NbdDisconnect { device, .. } => device,
        }
    }

    pub fn action(&self) -> &'static str {
        match self {
            Self::DetachMount { .. } => "detach_mount",
            Self::DetachLoop { .. } => "detach_loop",
            Self::DmMessage { .. } => "dm_message",
            Self::DmRemove { .. } => "dm_remove",
            Self::ScsiOffline { .. } => "scsi_offline",
            Self::ScsiDelete { .. } => "scsi_delete",
            Self::RbdUnmap { .. } => "rbd_unmap",
            Self::NbdDisconnect { .. } => "nbd_disconnect",
        }
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        match self {
            Self::DetachMount { device, namespace, via, mount_point, mount_id, .. } => format!(
                "detach mount {mount_point} (id {mount_id}) of {device} in mount namespace {} via {} (umount2 MNT_DETACH)",
                namespace.0,
                via.describe()
            ),
                        Self::DetachLoop { device, backing_file, .. } => {
                format!("detach loop device {device} from {backing_file} (LOOP_CLR_FD)")
            }
            Self::DmMessage { device, uuid, message, .. } => {
                format!("send '{message}' to map {device} ({uuid}): queued and future I/O fails instead of hanging")
            }
            Self::DmRemove { device, uuid, deferred, .. } => {
                format!("remove dm device {device} ({uuid}){}", if *deferred { " on last close (deferred)" } else { "" })
            }
            Self::ScsiOffline { device, address, .. } => format!("set SCSI disk {device} ({address}) offline"),
                        Self::ScsiDelete { device, address, .. } => format!("delete SCSI disk {device} ({address})"),
            Self::RbdUnmap { device, id, pool, image, force, .. } => format!(
                "unmap rbd {pool}/{image} ({device}, id {id}){}",
                if *force { " with force (in-flight I/O fails)" } else { "" }
            ),
            Self::NbdDisconnect { device, .. } => format!("disconnect nbd device {device} (NBD_DISCONNECT)"),
        }
    }
}

/// A holder the plan does not touch, and why.
#[derive(Debug, Clone, Serialize)]
pub struct LeftAlone {
    pub holder: Holder,
    pub reason: String,
}

/// What to do to one device.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub operation: &'static str,
    pub device: DeviceName,
    pub devnum: DevNum,
    pub steps: Vec<Step>,
    pub left_alone: Vec<LeftAlone>,
    /// Why nothing may be done at all (device still held, a path active, not stale yet).
    pub refusal: Option<String>,
    /// The refusal is because the operation does not apply to this kind of device (an error,
    /// not a judgement about its state).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unsupported: bool,
    /// What the plan leaves for someone else to do, e.g. an iSCSI session left with no LUN.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Plan {
    /// An empty plan for `operation` on `entry`'s device.
    pub fn new(operation: &'static str, entry: &DeviceEntry) -> Self {
        Self {
            operation,
            device: entry.device.name.clone(),
            devnum: entry.device.devnum,
            steps: Vec::new(),
            left_alone: Vec::new(),
            refusal: None,
            unsupported: false,
            notes: Vec::new(),
        }
    }
}

/// The gate every plan passes, whatever the device: nothing is done to a protected device, or to
/// one a pod on this node uses per kubelet (its mounts in the pod's own namespaces are foreign
/// to the host, so without this `release` would pull the volume from under a running pod).
pub fn safety_gate(p: &mut Plan, entry: &DeviceEntry, judgement: Option<&crate::policy::Judgement>) {
    let reason = if judgement.is_some_and(|j| j.verdict == crate::policy::Verdict::Protected) {
        Some(format!(
            "{} is protected: {}",
            p.device,
            judgement.map(|j| j.reasons.join("; ")).unwrap_or_default()
        ))
    } else if let Some(j) = judgement.filter(|j| crate::policy::api_forbids(j)) {
        Some(format!(
            "{} is {} per the Kubernetes API: {}",
            p.device,
            j.verdict.as_str(),
            j.reasons.join("; ")
        ))
    } else {
        entry.kubernetes.as_ref().filter(|k| !k.pod_uids.is_empty()).map(|k| {
            format!("pod(s) {} on this node use {} per kubelet: left alone", k.pod_uids.join(", "), p.device)
        })
    };
    if let Some(r) = reason {
        p.steps.clear();
        p.refusal = Some(r);
        p.unsupported = false;
    }
}

/// The re-check right before a step runs: unbinding a loop device needs a fresh scan (`fresh`)
/// to find no holder at all. The other steps are re-checked by the actuator itself (mount IDs,
/// dm uuid, open count and paths, sysfs holders), their expected holders being part of the plan.
pub fn recheck<E: std::fmt::Display>(
    step: &Step,
    fresh: impl FnOnce() -> Result<Option<DeviceEntry>, E>,
) -> Result<(), String> {
    if !matches!(step, Step::DetachLoop { .. }) {
        return Ok(());
    }
    match fresh() {
        Ok(Some(e)) if !e.holders.is_empty() => Err(format!(
            "a fresh scan found {} holder(s): {}",
            e.holders.len(),
            e.holders.iter().map(holder_reason).collect::<Vec<_>>().join("; ")
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(format!("cannot re-check holders: {e}")),
    }
}

/// Both gates a cleanup plan passes: stale only, for the kinds that need it (see
/// [`needs_stale_verdict`]), then [`safety_gate`] for every kind.
pub fn gate(p: &mut Plan, entry: &DeviceEntry, judgement: Option<&crate::policy::Judgement>) {
    if needs_stale_verdict(entry) {
        gate_on_verdict(p, judgement);
    }
    safety_gate(p, entry, judgement);
}

/// Keeps a plan only when the device's verdict is stale: clears its steps and says why
/// otherwise (`None`: not judged yet). Plans already refused keep their own reason.
pub fn gate_on_verdict(p: &mut Plan, judgement: Option<&crate::policy::Judgement>) {
    use crate::policy::Verdict;
    if p.refusal.is_some() {
        return;
    }
    let reason = match judgement {
        Some(j) if j.verdict == Verdict::Stale => return,
        Some(j) => format!("{} is {}, not stale: {}", p.device, j.verdict.as_str(), j.reasons.join("; ")),
        None => format!("{} has not been judged yet; wait for the next scan", p.device),
    };
    p.steps.clear();
    p.refusal = Some(reason);
}

/// Why a holder keeps a device busy, in words.
pub fn holder_reason(h: &Holder) -> String {
    let who = match (&h.pids.first(), &h.comm) {
        (Some(p), Some(c)) => format!("pid {p} ({c})"),
        (Some(p), None) => format!("pid {p}"),
        _ => String::new(),
    };
    let path = h.path.as_ref().map_or("?".into(), KernelText::escaped);
    match h.kind {
        HolderKind::Mount if h.in_host_namespace == Some(true) => format!(
            "mounted at {} in the host's mount namespace: left alone (unmount it on the host)",
            h.mount_point.as_ref().map_or("?".into(), KernelText::escaped)
        ),
        HolderKind::Mount => format!(
            "mounted at {} in mount namespace {}",
            h.mount_point.as_ref().map_or("?".into(), KernelText::escaped),
            h.mount_namespace.map_or("?".into(), |n| n.0.to_string())
        ),
        HolderKind::OpenDevice => format!("{who} has the device node open ({path}, fd {:?})", h.fds),
        HolderKind::OpenFile => format!("{who} has a file on it open ({path}, fd {:?})", h.fds),
        HolderKind::Cwd => format!("{who} has its working directory on it ({path})"),
        HolderKind::Root => format!("{who} has its root directory on it ({path})"),
        HolderKind::Mmap => format!("{who} maps a file on it ({path})"),
        HolderKind::Swap => format!("it is active swap ({path})"),
        HolderKind::StackedDevice => {
            format!("device {} is stacked on it", h.device.as_ref().map_or("?", |d| d.as_str()))
        }
        HolderKind::LoopBacking => format!(
            "loop device {} is backed by a file on it ({path})",
            h.device.as_ref().map_or("?", |d| d.as_str())
        ),
    }
}

/// Plans the release of every foreign-namespace mount of `entry`'s device.
pub fn release(entry: &DeviceEntry) -> Plan {
    let d = &entry.device;
    let mut steps = Vec::new();
    let mut left_alone = Vec::new();
    // Unmounting a shared mount propagates to its peers: never touch one that is a peer of a
    // mount in the host's namespace.
    let host_groups: Vec<u32> = entry
        .holders
        .iter()
        .filter(|h| h.kind == HolderKind::Mount && h.in_host_namespace == Some(true))
        .filter_map(|h| h.shared_group)
        .collect();
    for h in &entry.holders {
        if let Some(g) = h.shared_group.filter(|g| h.is_foreign_mount() && host_groups.contains(g)) {
            let reason = format!(
                "{}: it is a shared peer (shared:{g}) of a mount in the host's namespace, so detaching it would \
                 unmount the host's copy too: left alone",
                holder_reason(h)
            );
            left_alone.push(LeftAlone { holder: h.clone(), reason });
            continue;
        }
        match (h.is_foreign_mount(), &h.namespace_entry, h.mount_namespace, h.mount_id) {
            (true, Some(via), Some(ns), Some(id)) => steps.push(Step::DetachMount {
                device: d.name.clone(),
                devnum: d.devnum,
                namespace: ns,
                via: via.clone(),
                mount_id: id,
                mount_point: h.mount_point.clone().unwrap_or_default(),
                fstype: h.fstype.clone().unwrap_or_default(),
            }),
            _ => {
                let mut reason = holder_reason(h);
                if h.kind != HolderKind::Mount {
                    reason.push_str(": release does not touch processes or other devices");
                }
                left_alone.push(LeftAlone { holder: h.clone(), reason });
            }
        }
    }
    Plan {
        operation: "release",
        device: d.name.clone(),
        devnum: d.devnum,
        steps,
        left_alone,
        refusal: None,
        unsupported: false,
        notes: Vec::new(),
    }
}

/// Plans unbinding a loop device; refused while anything holds it.
pub fn clean(entry: &DeviceEntry) -> Plan {
    let d = &entry.device;
    let mut plan = Plan::new("clean", entry);
    if d.kind != DeviceKind::Loop {
        plan.refusal = Some(format!(
            "{} is a {} device; clean handles loop devices, multipath maps, SCSI disks, rbd and nbd devices",
            d.name,
            d.kind.as_str()
        ));
        plan.unsupported = true;
        return plan;
    }
    let Some(info) = &d.loop_info else {
        return plan; // unbound already: nothing to do
    };
    if !entry.holders.is_empty() {
        plan.left_alone =
            entry.holders.iter().map(|h| LeftAlone { holder: h.clone(), reason: holder_reason(h) }).collect();
        plan.refusal = Some(format!("{} is still held by {} holder(s)", d.name, entry.holders.len()));
        return plan;
    }
    plan.steps.push(Step::DetachLoop {
        device: d.name.clone(),
        devnum: d.devnum,
        backing_file: info.backing_file.clone(),
        backing_dev: info.backing_dev,
        backing_inode: info.backing_inode,
    });
    plan
}

/// The full cleanup of a device, for the daemon's Plan and Apply: release its foreign-namespace
/// mounts, then, for a loop device whose only holders are those mounts, unbind it (re-checked by
/// a fresh scan right before that step). A device held otherwise keeps its holders listed.
pub fn cleanup(entry: &DeviceEntry) -> Plan {
    let mut p = release(entry);
    p.operation = "cleanup";
    let d = &entry.device;
    let only_released = p.left_alone.is_empty();
    match &d.loop_info {
        Some(info) if d.kind == DeviceKind::Loop && only_released => p.steps.push(Step::DetachLoop {
            device: d.name.clone(),
            devnum: d.devnum,
            backing_file: info.backing_file.clone(),
            backing_dev: info.backing_dev,
            backing_inode: info.backing_inode,
        }),
        _ if p.steps.is_empty() && !p.left_alone.is_empty() => {
            p.refusal = Some(format!(
                "{} is still held by {} holder(s) release cannot detach",
                d.name,
                p.left_alone.len()
            ));
        }
        _ => {}
    }
    p
}

/// The teardown of a multipath map with no active path (incident 3), in the only safe order:
/// stop queueing (so nothing can hang on it, and stuck readers get EIO and let go), release its
/// mounts in other namespaces, remove its kpartx partition maps, remove the map, then set each
/// path offline and delete it. Refused while any path is active or anything else holds it.
pub fn teardown_map(entry: &DeviceEntry, graph: &DeviceGraph, deferred_remove: bool) -> Plan {
    let d = &entry.device;
    let mut p = Plan::new("teardown", entry);
    let Some(m) = &entry.multipath else {
        p.refusal = Some(format!("{} is not a multipath map", d.name));
        p.unsupported = true;
        return p;
    };
    if m.active_paths > 0 {
        p.refusal = Some(format!(
            "map {} ({}): {} path(s) active: a map with an active path is never torn down",
            m.name, d.name, m.active_paths
        ));
        return p;
    }
    if m.queue_if_no_path.is_none() {
        p.refusal = Some(format!("map {} ({}): its table and status could not be read", m.name, d.name));
        return p;
    }
    let blocking: Vec<&Holder> =
        entry.holders.iter().filter(|h| !crate::policy::releasable(h, &m.partitions)).collect();
    if !blocking.is_empty() {
        p.left_alone =
            blocking.iter().map(|h| LeftAlone { holder: (*h).clone(), reason: holder_reason(h) }).collect();
        p.refusal = Some(format!(
            "{} is still held by {} holder(s) the teardown cannot release",
            d.name,
            blocking.len()
        ));
        return p;
    }
    let release = release(entry);
    if !release.left_alone.iter().all(|l| l.holder.kind != HolderKind::Mount) {
        p.left_alone = release.left_alone;
        p.refusal = Some(format!("{}: a mount of it cannot be released (see above)", d.name));
        return p;
    }
    if m.queue_if_no_path == Some(true) {
        p.steps.push(Step::DmMessage {
            device: d.name.clone(),
            devnum: d.devnum,
            uuid: m.uuid.clone(),
            message: "fail_if_no_path".into(),
        });
    }
    p.steps.extend(release.steps);
    for part in &m.partitions {
        let Some(pe) = graph.devices.iter().find(|e| &e.device.name == part) else { continue };
        if !pe.holders.is_empty() {
            p.left_alone = pe
                .holders
                .iter()
                .map(|h| LeftAlone {
                    holder: h.clone(),
                    reason: format!("partition map {part}: {}", holder_reason(h)),
                })
                .collect();
            p.refusal = Some(format!("partition map {part} of {} is still held", d.name));
            p.steps.clear();
            return p;
        }
        let uuid = pe.device.dm.as_ref().map(|x| x.uuid.clone()).unwrap_or_default();
        p.steps.push(Step::DmRemove {
            device: part.clone(),
            devnum: pe.device.devnum,
            uuid,
            deferred: false,
        });
    }
    p.steps.push(Step::DmRemove {
        device: d.name.clone(),
        devnum: d.devnum,
        uuid: m.uuid.clone(),
        deferred: deferred_remove,
    });
    let mut deleted = Vec::new();
    for path in &m.paths {
        let Some(disk) =
            path.device.as_ref().and_then(|n| graph.devices.iter().find(|e| &e.device.name == n))
        else {
            continue;
        };
        p.steps.extend(scsi_steps(disk));
        deleted.push(disk.device.name.clone());
    }
    p.notes = emptied_sessions(graph, &deleted);
    p
}

/// iSCSI sessions that have no disk left once `deleted` are gone: logging out needs iscsid,
/// which the agent does not drive, so the plan says so.
fn emptied_sessions(graph: &DeviceGraph, deleted: &[DeviceName]) -> Vec<String> {
    use crate::discover::scsi::Transport;
    let session_of = |e: &DeviceEntry| match e.scsi.as_ref().map(|s| &s.disk.transport) {
        Some(Transport::Iscsi { session }) => Some(session.clone()),
        _ => None,
    };
    let mut sessions: Vec<String> =
        graph.devices.iter().filter(|e| deleted.contains(&e.device.name)).filter_map(session_of).collect();
    sessions.sort();
    sessions.dedup();
    sessions
        .into_iter()
        .filter(|s| {
            graph.devices.iter().filter(|e| session_of(e).as_ref() == Some(s)).all(|e| deleted.contains(&e.device.name))
        })
        .map(|s| {
            let n = s.trim_start_matches("session");
            format!("iSCSI {s} has no LUN left after this: log it out (iscsiadm -m session -r {n} -u); the agent does not run iscsiadm")
        })
        .collect()
}

fn scsi_steps(disk: &DeviceEntry) -> Vec<Step> {
    let d = &disk.device;
    let (wwid, address) = disk
        .scsi
        .as_ref()
        .map(|s| (s.disk.wwid.clone(), s.disk.address.to_string()))
        .unwrap_or((None, String::new()));
    vec![
        Step::ScsiOffline {
            device: d.name.clone(),
            devnum: d.devnum,
            wwid: wwid.clone(),
            address: address.clone(),
        },
        Step::ScsiDelete { device: d.name.clone(), devnum: d.devnum, wwid, address },
    ]
}

/// Deleting a standalone SCSI disk (offline, nothing holds it): offline, then delete. A path of
/// a multipath map goes with its map, never alone.
pub fn delete_disk(entry: &DeviceEntry, graph: &DeviceGraph) -> Plan {
    let d = &entry.device;
    let mut p = Plan::new("delete", entry);
    match &entry.scsi {
        None => {
            p.refusal = Some(format!("{} is not a SCSI disk", d.name));
            p.unsupported = true;
        }
        Some(s) if s.path_of.is_some() => {
            p.refusal = Some(format!(
                "{} is a path of multipath map {}: clean the map, which removes its paths",
                d.name,
                s.path_of.as_ref().map_or("?", |m| m.as_str())
            ));
        }
        Some(_) if !entry.holders.is_empty() => {
            p.left_alone = entry
                .holders
                .iter()
                .map(|h| LeftAlone { holder: h.clone(), reason: holder_reason(h) })
                .collect();
            p.refusal = Some(format!("{} is still held by {} holder(s)", d.name, entry.holders.len()));
        }
        Some(_) => {
            p.steps = scsi_steps(entry);
            p.notes = emptied_sessions(graph, std::slice::from_ref(&d.name));
        }
    }
    p
}

/// Unmapping an rbd image or disconnecting an nbd device: its mounts in other namespaces are
/// released first; anything else that holds it refuses the plan.
pub fn unmap(entry: &DeviceEntry, force: bool) -> Plan {
    let d = &entry.device;
    let mut p = release(entry);
    p.operation = "unmap";
    if !p.left_alone.is_empty() {
        p.refusal = Some(format!(
            "{} is still held by {} holder(s) release cannot detach",
            d.name,
            p.left_alone.len()
        ));
        p.steps.clear();
        return p;
    }
    if let Some(r) = &entry.rbd {
        p.steps.push(Step::RbdUnmap {
            device: d.name.clone(),
            devnum: d.devnum,
            id: r.id,
            pool: r.pool.clone(),
            image: r.image.clone(),
            image_id: r.image_id.clone(),
            force,
        });
    } else if entry.nbd.is_some() {
        p.steps.push(Step::NbdDisconnect { device: d.name.clone(), devnum: d.devnum });
    } else {
        p.refusal = Some(format!("{} is neither an rbd nor a connected nbd device", d.name));
        p.unsupported = true;
    }
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

/// What `clean` does to a device, by kind: unbind a loop device, tear down a multipath map,
/// delete a standalone SCSI disk, unmap an rbd image, disconnect an nbd device.
pub fn for_clean(entry: &DeviceEntry, graph: &DeviceGraph, opts: CleanOptions) -> Plan {
    if entry.multipath.is_some() {
        teardown_map(entry, graph, opts.deferred_remove)
    } else if entry.scsi.is_some() {
        delete_disk(entry, graph)
    } else if entry.rbd.is_some() || entry.nbd.is_some() {
        unmap(entry, opts.force_unmap)
    } else {
        clean(entry)
    }
}

/// Devices `clean` acts on only once they are stale (the rest: loop devices, which are unbound
/// when free).
pub fn needs_stale_verdict(entry: &DeviceEntry) -> bool {
    entry.multipath.is_some() || entry.scsi.is_some() || entry.rbd.is_some() || entry.nbd.is_some()
}
