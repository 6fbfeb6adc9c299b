//! The JSON/YAML documents both CLIs print: each one a JSON object with `"schema_version": 1`
//! and `"document": "<type>"` at its top level, then its fields (docs/schema/README.md lists
//! them; docs/schema/blockjanitor-v1.schema.json is their schema). Fields may be added within
//! version 1; a rename or a removal is version 2.
//!
//! Scan-wide context travels with every answer that rests on a scan: `warnings`, `blind_spots`,
//! `complete` (false when a blind spot could hide a holder: the INCOMPLETE VIEW case, whose line
//! is `incomplete_view`).

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Map, Value};

use crate::view::orphans::orphaned_dir_value;
use crate::view::values::{
    device_fields, device_value, event_value, node_value, pin_risk_value, plan_value, resumed_value,
    stats_value, step_result_value,
};

/// The schema version every document carries.
pub const SCHEMA_VERSION: u64 = 1;

/// Document types (`document`).
pub const DEVICES: &str = "devices";
pub const DEVICE: &str = "device";
pub const PLANS: &str = "plans";
pub const RESULTS: &str = "results";
pub const NODE: &str = "node";
pub const EVENT: &str = "event";
pub const JOURNAL: &str = "journal";
/// The fleet console's `explain` (Fleet.Explain): why a pod, PVC or PV is stuck.
pub const EXPLANATION: &str = "explanation";

/// `body` (an object) as the document `document`: its fields after `schema_version` and
/// `document`. A body that is not an object becomes the document's `value`.
pub fn envelope(document: &str, body: Value) -> Value {
    let mut m = Map::new();
    m.insert("schema_version".into(), json!(SCHEMA_VERSION));
    m.insert("document".into(), json!(document));
    match body {
        Value::Object(fields) => m.extend(fields),
        other => {
            m.insert("value".into(), other);
        }
    }
    Value::Object(m)
}

/// `scan` (both), `agentctl devices`: every device of one scan, with the scan's context.
pub fn devices_doc(r: &pb::ListDevicesResponse) -> Value {
    envelope(
        DEVICES,
        json!({
            "scan": r.scan,
            "scan_unix_seconds": r.scan_unix_seconds,
            "devices": r.devices.iter().map(device_value).collect::<Vec<_>>(),
            "kubernetes": r.kubernetes,
            "host_mount_namespace": r.host_mount_namespace,
            "stats": stats_value(r.stats.as_ref()),
            "warnings": r.warnings,
            "blind_spots": r.blind_spots,
            "complete": r.incomplete_view.is_empty(),
            "incomplete_view": r.incomplete_view,
            "orphaned_volume_dirs": r.orphaned_volume_dirs.iter().map(orphaned_dir_value).collect::<Vec<_>>(),
            "orphaned_volume_dirs_unknown": r.orphaned_volume_dirs_unknown,
            "pin_risks": r.pin_risks.iter().map(pin_risk_value).collect::<Vec<_>>(),
            "pin_risks_checked": r.pin_risks_checked,
            "pin_risks_unknown": r.pin_risks_unknown,
        }),
    )
}

/// `holders DEVICE` (both), `agentctl device DEVICE`: the device's fields at the top level
/// (`doc["verdict"]`, `doc["holders"]`), then the scan's context for this device.
pub fn device_doc(d: &pb::Device, r: &pb::ListHoldersResponse) -> Value {
    let mut m = device_fields(d);
    let context = json!({
        "stats": stats_value(r.stats.as_ref()),
        "warnings": r.warnings,
        "blind_spots": r.blind_spots,
        "complete": r.incomplete_view.is_empty(),
        "incomplete_view": r.incomplete_view,
    });
    if let Value::Object(c) = context {
        m.extend(c);
    }
    envelope(DEVICE, Value::Object(m))
}

/// Whether every plan rests on a complete view.
fn plans_complete(plans: &[pb::DevicePlan]) -> bool {
    plans.iter().all(|p| p.incomplete_view.is_empty())
}

/// `plan` (both), `release`/`clean` without `--apply`, `apply` without `--yes`: one plan per
/// device.
pub fn plans_doc(r: &pb::PlanResponse) -> Value {
    envelope(
        PLANS,
        json!({
            "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>(),
            "warnings": r.warnings,
            "blind_spots": r.blind_spots,
            "complete": plans_complete(&r.plans),
        }),
    )
}

/// `release`/`clean --apply`, `apply --yes`: what was carried out. `planned` holds the plans
/// shown before applying (`apply --yes` of either CLI; none when the apply was bound to
/// identities from an earlier plan, or for `release`/`clean --apply`).
pub fn results_doc(planned: &[pb::DevicePlan], r: &pb::ApplyResponse) -> Value {
    envelope(
        RESULTS,
        json!({
            "planned": planned.iter().map(plan_value).collect::<Vec<_>>(),
            "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>(),
            "results": r.results.iter().map(step_result_value).collect::<Vec<_>>(),
            "resumed": r.resumed.iter().map(resumed_value).collect::<Vec<_>>(),
            "after": r.after.iter().map(device_value).collect::<Vec<_>>(),
            "warnings": r.warnings,
            "blind_spots": r.blind_spots,
            "complete": plans_complete(&r.plans),
        }),
    )
}

/// `agentctl node`.
pub fn node_doc(n: &pb::Node) -> Value {
    envelope(NODE, node_value(n))
}

/// One line of `agentctl watch -o json` (one document per event).
pub fn event_doc(e: &pb::Event) -> Value {
    envelope(EVENT, event_value(e))
}
