//! Responses as JSON (and YAML) values. Values keep the proto's field names; enum values become
//! their lower-case names ([`crate::names`]). Every field is always present, so scripts see one
//! shape.

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::names::{event_type_name, holder_kind_name, kind_name, verdict_name};

pub fn node_value(n: &pb::Node) -> Value {
    json!({
        "name": n.name,
        "kernel": n.kernel,
        "agent_version": n.agent_version,
        "last_scan_unix_seconds": n.last_scan_unix_seconds,
        "last_scan_duration_ms": n.last_scan_duration_ms,
        "scans": n.scans,
        "devices": n.devices,
        "warnings": n.warnings,
        "mode": n.mode,
        "kubernetes": n.kubernetes,
        "blind_spots": n.blind_spots,
        "ready": n.not_ready_because.is_empty(),
        "not_ready_because": n.not_ready_because,
    })
}

pub fn holder_value(h: &pb::Holder) -> Value {
    json!({
        "kind": holder_kind_name(h.kind),
        "pids": h.pids,
        "pid_count": h.pid_count,
        "comm": h.comm,
        "cmdline": h.cmdline,
        "mount_namespace": h.mount_namespace,
        "in_host_namespace": h.in_host_namespace,
        "mount_point": h.mount_point,
        "container_id": h.container_id,
        "pod_uid": h.pod_uid,
        "path": h.path,
        "device": h.device,
        "fstype": h.fstype,
        "fds": h.fds,
        "description": h.description,
    })
}

pub fn device_value(d: &pb::Device) -> Value {
    json!({
        "name": d.name,
        "major": d.major,
        "minor": d.minor,
        "kind": kind_name(d.kind),
        "size_bytes": d.size_bytes,
        "read_only": d.read_only,
        "parent": d.parent,
        "stacked_on_top": d.stacked_on_top,
        "stacked_below": d.stacked_below,
        "loop_backing_file": d.loop_backing_file,
        "dm_name": d.dm_name,
        "dm_uuid": d.dm_uuid,
        "verdict": verdict_name(d.verdict),
        "reasons": d.reasons,
        "holders": d.holders.iter().map(holder_value).collect::<Vec<_>>(),
        "kernel_threads": d.kernel_threads,
        "pv_names": d.pv_names,
        "pod_uids": d.pod_uids,
        "kubelet_paths": d.kubelet_paths,
        "identity": d.identity,
        "rbd": d.rbd.as_ref().map(rbd_value),
        "wwid": d.wwid,
        "nbd_backend": d.nbd_backend,
        "nvme": d.nvme.as_ref().map(nvme_value),
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
    })
}

pub fn devices_value(r: &pb::ListDevicesResponse) -> Value {
    json!({
        "devices": r.devices.iter().map(device_value).collect::<Vec<_>>(),
        "scan_unix_seconds": r.scan_unix_seconds,
    })
}

pub fn holders_value(r: &pb::ListHoldersResponse) -> Value {
    json!({ "device": r.device.as_ref().map(device_value) })
}

pub fn step_value(s: &pb::Step) -> Value {
    json!({ "action": s.action, "device": s.device, "description": s.description })
}

pub fn plan_value(p: &pb::DevicePlan) -> Value {
    json!({
        "device": p.device,
        "steps": p.steps.iter().map(step_value).collect::<Vec<_>>(),
        "left_alone": p.left_alone,
        "refusal": p.refusal,
        "identity": p.identity,
        "outcome": p.outcome,
    })
}

pub fn plans_value(r: &pb::PlanResponse) -> Value {
    json!({ "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>() })
}

pub fn step_result_value(r: &pb::StepResult) -> Value {
    json!({ "step": r.step.as_ref().map(step_value), "result": r.result, "detail": r.detail })
}

/// What `apply` did; `planned` holds the plans shown before applying (none when the apply was
/// bound to identities from an earlier plan).
pub fn apply_value(planned: &[pb::DevicePlan], r: &pb::ApplyResponse) -> Value {
    json!({
        "planned": planned.iter().map(plan_value).collect::<Vec<_>>(),
        "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>(),
        "results": r.results.iter().map(step_result_value).collect::<Vec<_>>(),
    })
}

pub fn event_value(e: &pb::Event) -> Value {
    json!({
        "type": event_type_name(e.r#type),
        "device": e.device,
        "unix_seconds": e.unix_seconds,
        "message": e.message,
        "current": e.current.as_ref().map(device_value),
        "coalesced": e.coalesced,
    })
}
