//! The objects of the JSON (and YAML) documents ([`crate::view::doc`] wraps them): messages as
//! values that keep the proto's field names; enum values become their lower-case names
//! ([`crate::view::names`]). Every field is always present (pb's rule: `""` for an absent
//! string, `0` for an absent number, `[]` for an empty list; an absent object is `null`), so
//! scripts see one shape, the one docs/schema/blockjanitor-v1.schema.json describes.

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Map, Value};

use crate::view::names::{event_type_name, holder_kind_name, kind_name, verdict_name};

/// `value` of an optional message, `null` when absent.
fn opt<T>(m: Option<&T>, value: impl Fn(&T) -> Value) -> Value {
    m.map_or(Value::Null, value)
}

/// The fields of a JSON object literal (always an object: `json!` of `{...}`).
fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The node's fields; `complete` is false while the latest scan has blind spots.
pub fn node_value(n: &pb::Node) -> Value {
    json!({
        "name": n.name,
        "kernel": n.kernel,
        "agent_version": n.agent_version,
        "last_scan_unix_seconds": n.last_scan_unix_seconds,
        "last_scan_duration_ms": n.last_scan_duration_ms,
        "last_full_scan": n.last_full_scan,
        "last_full_scan_unix_seconds": n.last_full_scan_unix_seconds,
        "scans": n.scans,
        "devices": n.devices,
        "warnings": n.warnings,
        "mode": n.mode,
        "kubernetes": n.kubernetes,
        "blind_spots": n.blind_spots,
        "complete": n.blind_spots.is_empty(),
        "ready": n.not_ready_because.is_empty(),
        "not_ready_because": n.not_ready_because,
    })
}

/// How a mount namespace can be entered.
pub fn namespace_entry_value(e: &pb::NamespaceEntry) -> Value {
    json!({
        "via": e.via,
        "pid": e.pid,
        "tid": e.tid,
        "fd": e.fd,
        "path": e.path,
        "description": e.description,
    })
}

pub fn holder_value(h: &pb::Holder) -> Value {
    json!({
        "kind": holder_kind_name(h.kind),
        "pids": h.pids,
        "pid_count": h.pid_count,
        "comm": h.comm,
        "cmdline": h.cmdline,
        "process_state": h.process_state,
        "mount_namespace": h.mount_namespace,
        "in_host_namespace": h.in_host_namespace,
        "mount_point": h.mount_point,
        "mount_id": h.mount_id,
        "source": h.source,
        "shared_group": h.shared_group,
        "master_group": h.master_group,
        "upstream_groups": h.upstream_groups,
        "mount_dev": h.mount_dev,
        "namespace_entry": opt(h.namespace_entry.as_ref(), namespace_entry_value),
        "tid": h.tid,
        "other_mount_namespaces": h.other_mount_namespaces,
        "container_id": h.container_id,
        "pod_uid": h.pod_uid,
        "path": h.path,
        "device": h.device,
        "fstype": h.fstype,
        "fds": h.fds,
        "access": h.access,
        "description": h.description,
    })
}

/// A device's own fields (a `device` document has them at its top level).
pub fn device_fields(d: &pb::Device) -> Map<String, Value> {
    let mut m = fields(json!({
        "name": d.name,
        "major": d.major,
        "minor": d.minor,
        "kind": kind_name(d.kind),
        "size_bytes": d.size_bytes,
        "read_only": d.read_only,
        "diskseq": d.diskseq,
        "parent": d.parent,
        "stacked_on_top": d.stacked_on_top,
        "stacked_below": d.stacked_below,
        "loop_backing_file": d.loop_backing_file,
        "dm_name": d.dm_name,
        "dm_uuid": d.dm_uuid,
        "verdict": verdict_name(d.verdict),
        "reasons": d.reasons,
        "in_use": d.in_use,
        "holders": d.holders.iter().map(holder_value).collect::<Vec<_>>(),
        "kernel_threads": d.kernel_threads,
        "pv_names": d.pv_names,
        "pod_uids": d.pod_uids,
        "kubelet_paths": d.kubelet_paths,
        "volume_handles": d.volume_handles,
        "csi_drivers": d.csi_drivers,
        "identity": d.identity,
        "wwid": d.wwid,
        "nbd_backend": d.nbd_backend,
        "unresponsive": d.unresponsive,
        "unresponsive_seconds": d.unresponsive_seconds,
        "last_seen_unix_seconds": d.last_seen_unix_seconds,
        "last_seen_scan": d.last_seen_scan,
        "outage": d.outage,
    }));
    let objects = [
        ("loop", opt(d.r#loop.as_ref(), loop_value)),
        ("dm", opt(d.dm.as_ref(), |m| json!({ "name": m.name, "uuid": m.uuid, "suspended": m.suspended }))),
        ("stack", opt(d.stack.as_ref(), stack_value)),
        ("multipath", opt(d.multipath.as_ref(), multipath_value)),
        ("scsi", opt(d.scsi.as_ref(), scsi_value)),
        ("iscsi_session", opt(d.iscsi_session.as_ref(), iscsi_value)),
        ("rbd", opt(d.rbd.as_ref(), rbd_value)),
        ("nbd", opt(d.nbd.as_ref(), nbd_value)),
        ("nvme", opt(d.nvme.as_ref(), nvme_value)),
    ];
    for (k, v) in objects {
        m.insert(k.to_owned(), v);
    }
    m
}

pub fn device_value(d: &pb::Device) -> Value {
    Value::Object(device_fields(d))
}

pub fn loop_value(l: &pb::LoopStatus) -> Value {
    json!({
        "backing_file": l.backing_file,
        "backing_deleted": l.backing_deleted,
        "offset": l.offset,
        "sizelimit": l.sizelimit,
        "autoclear": l.autoclear,
        "read_only": l.read_only,
        "backing_dev": l.backing_dev,
        "backing_inode": l.backing_inode,
        "backing_rdev": l.backing_rdev,
        "status_blocked": l.status_blocked,
    })
}

pub fn stack_value(s: &pb::StackLayer) -> Value {
    json!({
        "kind": kind_name(s.kind),
        "description": s.description,
        "vg": s.vg,
        "lv": s.lv,
        "lv_sublayer": s.lv_sublayer,
        "vg_uuid": s.vg_uuid,
        "lv_uuid": s.lv_uuid,
        "crypt_format": s.crypt_format,
        "crypt_header_uuid": s.crypt_header_uuid,
        "crypt_name": s.crypt_name,
        "partition_number": s.partition_number,
        "parent_uuid": s.parent_uuid,
    })
}

pub fn multipath_value(m: &pb::Multipath) -> Value {
    json!({
        "name": m.name,
        "uuid": m.uuid,
        "wwid": m.wwid,
        "open_count": m.open_count,
        "suspended": m.suspended,
        "queue_if_no_path": m.queue_if_no_path,
        "paths": m.paths.iter().map(|p| json!({
            "device": p.device,
            "devnum": p.devnum,
            "state": p.state,
            "fail_count": p.fail_count,
            "scsi_state": p.scsi_state,
        })).collect::<Vec<_>>(),
        "active_paths": m.active_paths,
        "io_would_hang": m.io_would_hang,
        "partitions": m.partitions,
    })
}

pub fn scsi_value(s: &pb::ScsiDisk) -> Value {
    json!({
        "address": s.address,
        "state": s.state,
        "vendor": s.vendor,
        "model": s.model,
        "wwid": s.wwid,
        "ioerr_cnt": s.ioerr_cnt,
        "iorequest_cnt": s.iorequest_cnt,
        "transport": s.transport,
        "transport_name": s.transport_name,
        "transport_state": s.transport_state,
        "path_of": s.path_of,
        "lun_gone": s.lun_gone,
        "outage_scope": s.outage_scope,
        "outage_key": s.outage_key,
        "outage_members": s.outage_members,
    })
}

pub fn iscsi_value(s: &pb::IscsiSessionInfo) -> Value {
    json!({
        "sid": s.sid,
        "target": s.target,
        "portal": s.portal,
        "state": s.state,
        "iface": s.iface,
        "tpgt": s.tpgt,
        "recovery_tmo": s.recovery_tmo,
        "initiator": s.initiator,
    })
}

pub fn nbd_value(n: &pb::NbdConnection) -> Value {
    json!({
        "pid": n.pid,
        "server_alive": n.server_alive,
        "server_comm": n.server_comm,
        "server_cmdline": n.server_cmdline,
        "backend": n.backend,
    })
}
/// An NVMe namespace's role, subsystem and controllers.
pub fn nvme_value(n: &pb::NvmeNamespace) -> Value {
    json!({
        "role": n.role,
        "subsystem": n.subsystem,
        "subsysnqn": n.subsysnqn,
        "head": n.head,
        "live_controllers": n.live_controllers,
        "outage_target": n.outage_target,
        "siblings": n.siblings,
        "siblings_held": n.siblings_held,
        "controllers": n.controllers.iter().map(|c| json!({
            "name": c.name,
            "transport": c.transport,
            "subsysnqn": c.subsysnqn,
            "address": c.address,
            "state": c.state,
            "ctrl_loss_tmo": c.ctrl_loss_tmo,
            "reconnect_delay": c.reconnect_delay,
            "cntlid": c.cntlid,
            "hostnqn": c.hostnqn,
            "fabrics": c.fabrics,
            "address_raw": c.address_raw,
            "src_addr": c.src_addr,
            "host_traddr": c.host_traddr,
            "host_iface": c.host_iface,
            "namespaces": c.namespaces,
        })).collect::<Vec<_>>(),
    })
}

pub fn rbd_value(r: &pb::RbdMapping) -> Value {
    json!({
        "id": r.id,
        "pool": r.pool,
        "pool_namespace": r.pool_namespace,
        "image": r.image,
        "image_id": r.image_id,
        "snap": r.snap,
        "client_id": r.client_id,
        "client_addr": r.client_addr,
        "cluster_fsid": r.cluster_fsid,
        "dev_paths": r.dev_paths,
        "fenced": r.fenced,
    })
}

/// What a scan read; zeros when the answer carries none (an older agent).
pub fn stats_value(s: Option<&pb::ScanStats>) -> Value {
    let d = pb::ScanStats::default();
    let s = s.unwrap_or(&d);
    json!({
        "processes": s.processes,
        "tasks": s.tasks,
        "kernel_threads": s.kernel_threads,
        "mount_namespaces": s.mount_namespaces,
        "mounts": s.mounts,
        "namespaces_via_statmount": s.namespaces_via_statmount,
        "mountinfo_bytes": s.mountinfo_bytes,
        "duration_ms": s.duration_ms,
    })
}

pub fn step_value(s: &pb::Step) -> Value {
    json!({ "action": s.action, "device": s.device, "description": s.description })
}

pub fn plan_value(p: &pb::DevicePlan) -> Value {
    json!({
        "device": p.device,
        "operation": p.operation,
        "steps": p.steps.iter().map(step_value).collect::<Vec<_>>(),
        "left_alone": p.left_alone,
        "notes": p.notes,
        "refusal": p.refusal,
        "identity": p.identity,
        "outcome": p.outcome,
        "incomplete_view": p.incomplete_view,
    })
}

/// An absent step is an empty one (every result has a step).
pub fn step_result_value(r: &pb::StepResult) -> Value {
    let none = pb::Step::default();
    json!({ "step": step_value(r.step.as_ref().unwrap_or(&none)), "result": r.result, "detail": r.detail })
}

pub fn resumed_value(r: &pb::ResumedPlan) -> Value {
    json!({
        "plan_id": r.plan_id,
        "operation": r.operation,
        "argument": r.argument,
        "device": r.device,
        "already_done": r.already_done,
        "results": r.results.iter().map(step_result_value).collect::<Vec<_>>(),
        "refusal": r.refusal,
        "summary": r.summary,
    })
}

/// One event's fields (an `event` document has them at its top level).
pub fn event_value(e: &pb::Event) -> Value {
    json!({
        "type": event_type_name(e.r#type),
        "device": e.device,
        "unix_seconds": e.unix_seconds,
        "message": e.message,
        "current": opt(e.current.as_ref(), device_value),
        "scan": e.scan,
        "coalesced": e.coalesced,
        "pin_risks": e.pin_risks.iter().map(pin_risk_value).collect::<Vec<_>>(),
        "pin_risks_complete": e.pin_risks_complete,
    })
}

/// A mount namespace holding private copies of live host mounts (or one that could not be
/// judged: `unknown` set).
pub fn pin_risk_value(r: &pb::PinRisk) -> Value {
    let copies: Vec<Value> = r
        .copies
        .iter()
        .map(|c| {
            json!({
                "mount_point": c.mount_point,
                "host_mount_point": c.host_mount_point,
                "dev": c.dev,
                "device": c.device,
                "fstype": c.fstype,
                "pv_name": c.pv_name,
            })
        })
        .collect();
    json!({
        "mount_namespace": r.mount_namespace,
        "pids": r.pids,
        "pid_count": r.pid_count,
        "comm": r.comm,
        "pod_uid": r.pod_uid,
        "container_id": r.container_id,
        "pod_namespace": r.pod_namespace,
        "pod_name": r.pod_name,
        "container_name": r.container_name,
        "host_root_copy": r.host_root_copy,
        "copies": copies,
        "fix": r.fix,
        "unknown": r.unknown,
    })
}
