//! The fleet console's answers for `agentctl fleet` (and `kubectl blockjanitor`): values for
//! JSON and YAML (the proto's field names, enums as lower-case names, every field present) and
//! tables for people. Every table ends with the nodes the answer could not speak for.

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::doc::envelope;
use crate::names::{kind_name, verdict_name};
use crate::table::{clean, columns, cut};
use crate::time::ago;
use crate::values::{device_value, node_value, step_value};

/// `stale_mapping`, `safe_to_delete_va`... for a raw `Diagnosis`.
pub fn diagnosis_name(raw: i32) -> String {
    match pb::Diagnosis::try_from(raw) {
        Ok(d) => d.as_str_name().trim_start_matches("DIAGNOSIS_").to_ascii_lowercase(),
        Err(_) => format!("unknown({raw})"),
    }
}

fn missing_value(m: &[pb::MissingNode]) -> Value {
    Value::Array(
        m.iter()
            .map(|m| {
                json!({
                    "node": m.node,
                    "reason": m.reason,
                    "not_refreshed": m.not_refreshed,
                    "answer_age_seconds": m.answer_age_seconds,
                })
            })
            .collect(),
    )
}

fn fleet_device_value(d: &pb::FleetDevice) -> Value {
    json!({"node": d.node, "device": d.device.as_ref().map(device_value)})
}

pub fn nodes_value(r: &pb::ListNodesResponse) -> Value {
    envelope(
        "fleet_nodes",
        json!({
            "nodes": r.nodes.iter().map(|n| json!({
                "name": n.name,
                "address": n.address,
                "source": n.source,
                "reachable": n.reachable,
                "last_seen_unix_seconds": n.last_seen_unix_seconds,
                "last_sync_unix_seconds": n.last_sync_unix_seconds,
                "error": n.error,
                "devices": n.devices,
                "failures": n.failures,
                "scan_unix_seconds": n.scan_unix_seconds,
                "blind_spots": n.blind_spots,
                "incomplete_view": n.incomplete_view,
                "stale": n.stale,
                "not_refreshed": n.not_refreshed,
                "agent": n.agent.as_ref().map(node_value),
            })).collect::<Vec<_>>(),
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

pub fn devices_value(r: &pb::FleetListDevicesResponse) -> Value {
    envelope(
        "fleet_devices",
        json!({
            "devices": r.devices.iter().map(fleet_device_value).collect::<Vec<_>>(),
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

pub fn where_value(r: &pb::WhereResponse) -> Value {
    envelope(
        "fleet_where",
        json!({
            "resolved": r.resolved,
            "matches": r.matches.iter().map(fleet_device_value).collect::<Vec<_>>(),
            "evidence_nodes": r.evidence_nodes,
            "complete": r.complete,
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

pub fn who_watches_value(r: &pb::WhoWatchesResponse) -> Value {
    envelope(
        "fleet_who_watches",
        json!({
            "watchers": r.watchers.iter().map(|w| json!({
                "client_addr": w.client_addr,
                "client_id": w.client_id,
                "cookie": w.cookie,
                "mappings": w.mappings.iter().map(fleet_device_value).collect::<Vec<_>>(),
                "unfence_safe": w.unfence_safe,
                "detail": w.detail,
                "node_by_address": w.node_by_address,
                "nodes": w.nodes,
                "answer": w.answer,
            })).collect::<Vec<_>>(),
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

pub fn multiattach_value(r: &pb::MultiAttachResponse) -> Value {
    if let Some(s) = &r.sweep {
        return sweep_value(s);
    }
    envelope(
        "fleet_multiattach",
        json!({
            "pv": r.pv,
            "nodes": r.nodes.iter().map(|d| json!({
                "node": d.node,
                "diagnosis": diagnosis_name(d.diagnosis),
                "detail": d.detail,
                "volume_attachments": d.volume_attachments,
                "in_volumes_attached": d.in_volumes_attached,
                "in_volumes_in_use": d.in_volumes_in_use,
                "devices": d.devices.iter().map(fleet_device_value).collect::<Vec<_>>(),
                "clear_steps": d.clear_steps.iter().map(step_value).collect::<Vec<_>>(),
                "identities": d.identities,
            })).collect::<Vec<_>>(),
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

fn missing_lines(m: &[pb::MissingNode]) -> String {
    if m.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "\nnot answered for ({} node{}): the answer may be incomplete\n",
        m.len(),
        if m.len() == 1 { "" } else { "s" }
    );
    for n in m {
        out.push_str(&format!("  {}: {}\n", clean(&n.node), clean(&n.reason)));
    }
    out
}

fn what_it_is(d: &pb::Device) -> String {
    if let Some(r) = &d.rbd {
        let ns = if r.pool_namespace.is_empty() { String::new() } else { format!("{}/", r.pool_namespace) };
        return format!("rbd {}/{ns}{} {} {}", r.pool, r.image, r.client_id, r.client_addr);
    }
    if !d.wwid.is_empty() {
        return format!("wwid {}", d.wwid);
    }
    if !d.nbd_backend.is_empty() {
        return format!("nbd {}", d.nbd_backend);
    }
    String::new()
}

fn device_rows(list: &[pb::FleetDevice]) -> Vec<Vec<String>> {
    list.iter()
        .filter_map(|f| {
            let d = f.device.as_ref()?;
            Some(vec![
                clean(&f.node),
                clean(&d.name),
                kind_name(d.kind),
                verdict_name(d.verdict),
                d.holders.first().map_or_else(|| "-".to_owned(), |h| cut(&clean(&h.description), 60)),
                clean(&what_it_is(d)),
            ])
        })
        .collect()
}

const DEVICE_HEADER: [&str; 6] = ["NODE", "DEVICE", "KIND", "VERDICT", "HELD BY", "WHAT"];

pub fn nodes_table(r: &pb::ListNodesResponse, now: f64) -> String {
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| {
            vec![
                clean(&n.name),
                if n.address.is_empty() { "-".into() } else { clean(&n.address) },
                match (n.reachable, n.not_refreshed.is_empty()) {
                    (true, true) => "yes".into(),
                    (true, false) => "yes, not refreshed".into(),
                    (false, _) => "no".into(),
                },
                n.devices.to_string(),
                if n.last_sync_unix_seconds > 0.0 {
                    ago(n.last_sync_unix_seconds, now)
                } else {
                    "never".into()
                },
                cut(&clean(if n.error.is_empty() { &n.not_refreshed } else { &n.error }), 80),
            ]
        })
        .collect();
    columns(&["NODE", "ADDRESS", "REACHABLE", "DEVICES", "SYNCED", "ERROR"], &rows)
        + &missing_lines(&r.missing_nodes)
}

pub fn devices_table(r: &pb::FleetListDevicesResponse) -> String {
    columns(&DEVICE_HEADER, &device_rows(&r.devices)) + &missing_lines(&r.missing_nodes)
}

pub fn where_table(r: &pb::WhereResponse) -> String {
    let mut out = format!("{}\n", clean(&r.resolved));
    if r.matches.is_empty() {
        out.push_str("not mapped on any node that answered\n");
    } else {
        out.push_str(&columns(&DEVICE_HEADER, &device_rows(&r.matches)));
    }
    if !r.evidence_nodes.is_empty() {
        let all = if r.complete { "every one answered" } else { "not every one answered" };
        out.push_str(&format!("evidence points at: {} ({all})\n", clean(&r.evidence_nodes.join(", "))));
    }
    out + &missing_lines(&r.missing_nodes)
}

pub fn who_watches_table(r: &pb::WhoWatchesResponse) -> String {
    let mut out = String::new();
    for w in &r.watchers {
        out.push_str(&format!(
            "watcher {} {}: unfence safe: {} ({})\n",
            clean(&w.client_addr),
            clean(&w.client_id),
            match (w.unfence_safe, w.answer.as_str()) {
                (true, _) => "yes",
                (false, "unknown") => "unknown",
                (false, _) => "no",
            },
            clean(&w.detail)
        ));
        if !w.nodes.is_empty() {
            out.push_str(&format!("  on node(s): {}\n", clean(&w.nodes.join(", "))));
        }
        if !w.mappings.is_empty() {
            out.push_str(&columns(&DEVICE_HEADER, &device_rows(&w.mappings)));
        }
    }
    out + &missing_lines(&r.missing_nodes)
}

pub fn multiattach_table(r: &pb::MultiAttachResponse) -> String {
    if let Some(s) = &r.sweep {
        return sweep_table(s);
    }
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|d| {
            vec![
                clean(&d.node),
                diagnosis_name(d.diagnosis),
                if d.volume_attachments.is_empty() {
                    "-".into()
                } else {
                    clean(&d.volume_attachments.join(", "))
                },
                format!(
                    "{}/{}",
                    if d.in_volumes_attached { "attached" } else { "-" },
                    if d.in_volumes_in_use { "in-use" } else { "-" }
                ),
                clean(
                    &d.devices
                        .iter()
                        .filter_map(|f| f.device.as_ref().map(|x| x.name.clone()))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
                clean(&d.detail),
            ]
        })
        .collect();
    let mut out = format!("PV {}\n", clean(&r.pv));
    out.push_str(&columns(
        &["NODE", "DIAGNOSIS", "VOLUMEATTACHMENTS", "NODE STATUS", "DEVICES", "DETAIL"],
        &rows,
    ));
    for d in r.nodes.iter().filter(|d| !d.clear_steps.is_empty()) {
        out.push_str(&format!("\nto clear the stale mapping on {}:\n", clean(&d.node)));
        for s in &d.clear_steps {
            out.push_str(&format!("  {}: {}\n", clean(&s.action), clean(&s.description)));
        }
    }
    out + &missing_lines(&r.missing_nodes)
}

/// `multi_node`, `attached_not_in_use`, `dead_node_watcher` for a raw `FindingKind`.
pub fn finding_kind_name(raw: i32) -> String {
    match pb::FindingKind::try_from(raw) {
        Ok(k) => k.as_str_name().trim_start_matches("FINDING_KIND_").to_ascii_lowercase(),
        Err(_) => format!("unknown({raw})"),
    }
}

/// The kind named on the command line (`multi_node`...), or what the names are.
pub fn parse_finding_kind(s: &str) -> Result<pb::FindingKind, String> {
    let want = format!("FINDING_KIND_{}", s.trim().to_ascii_uppercase().replace('-', "_"));
    pb::FindingKind::from_str_name(&want).filter(|k| *k != pb::FindingKind::Unspecified).ok_or_else(|| {
        format!("'{s}' is not a finding kind: expected multi_node, attached_not_in_use or dead_node_watcher")
    })
}

pub fn sweep_value(r: &pb::SweepResponse) -> Value {
    envelope(
        "fleet_sweep",
        json!({
            "complete": r.complete,
            "summary": r.summary,
            "volumes": r.volumes,
            "nodes": r.nodes,
            "covered_nodes": r.covered_nodes,
            "partial_nodes": missing_value(&r.partial_nodes),
            "uncovered_with_volumes": r.uncovered_with_volumes,
            "counts": r.counts,
            "findings": r.findings.iter().map(|f| json!({
                "kind": finding_kind_name(f.kind),
                "volume": f.volume,
                "pv": f.pv,
                "nodes": f.nodes,
                "devices": f.devices.iter().map(fleet_device_value).collect::<Vec<_>>(),
                "volume_attachments": f.volume_attachments,
                "clients": f.clients,
                "detail": f.detail,
            })).collect::<Vec<_>>(),
            "missing_nodes": missing_value(&r.missing_nodes),
        }),
    )
}

/// The sweep: its verdict line first (`clean` only when complete), a row per finding, the counts.
pub fn sweep_table(r: &pb::SweepResponse) -> String {
    let mut out = format!("sweep of {} volume(s): {}\n", r.volumes, clean(&r.summary));
    if !r.findings.is_empty() {
        let rows: Vec<Vec<String>> = r
            .findings
            .iter()
            .map(|f| {
                vec![
                    finding_kind_name(f.kind),
                    clean(&f.volume),
                    if f.pv.is_empty() { "-".into() } else { clean(&f.pv) },
                    clean(&f.nodes.join(",")),
                    clean(&f.detail),
                ]
            })
            .collect();
        out.push_str(&columns(&["KIND", "VOLUME", "PV", "NODES", "DETAIL"], &rows));
    }
    let counts: Vec<String> = r.counts.iter().map(|(k, n)| format!("{}={n}", clean(k))).collect();
    out.push_str(&format!("counts: {}\n", counts.join(" ")));
    if r.nodes > 0 {
        out.push_str(&format!("covered: {} of {} node(s)\n", r.covered_nodes, r.nodes));
    }
    if !r.uncovered_with_volumes.is_empty() {
        let names = clean(&r.uncovered_with_volumes.join(", "));
        out.push_str(&format!("not covered, with volumes at stake: {names}\n"));
    }
    if !r.partial_nodes.is_empty() {
        out.push_str("covered with blind spots (their devices within reach are unknown):\n");
        for n in &r.partial_nodes {
            out.push_str(&format!("  {}: {}\n", clean(&n.node), clean(&n.reason)));
        }
    }
    out + &missing_lines(&r.missing_nodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diagnosis_names() {
        assert_eq!(diagnosis_name(pb::Diagnosis::SafeToDeleteVa as i32), "safe_to_delete_va");
        assert_eq!(diagnosis_name(pb::Diagnosis::InUseCorrect as i32), "in_use_correct");
        assert_eq!(diagnosis_name(99), "unknown(99)");
    }

    #[test]
    fn missing_nodes_are_always_said() {
        let r = pb::WhereResponse {
            resolved: "rbd image k8s/x".into(),
            matches: vec![],
            missing_nodes: vec![pb::MissingNode {
                node: "n1".into(),
                reason: "unreachable: refused".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let t = where_table(&r);
        assert!(t.contains("not mapped on any node that answered"), "{t}");
        assert!(t.contains("n1: unreachable: refused"), "{t}");
        assert_eq!(where_value(&r)["missing_nodes"][0]["node"], "n1");
    }

    #[test]
    fn an_incomplete_sweep_says_so_before_anything_else() {
        let r = pb::SweepResponse {
            complete: false,
            summary: "incomplete: 1 node(s) did not answer (n1); no finding among what answered".into(),
            volumes: 3,
            counts: [("multi_node".to_owned(), 0)].into_iter().collect(),
            missing_nodes: vec![pb::MissingNode {
                node: "n1".into(),
                reason: "unreachable: refused".into(),
                ..Default::default()
            }],
            findings: vec![],
            nodes: 4,
            covered_nodes: 3,
            uncovered_with_volumes: vec!["n1".into()],
            ..Default::default()
        };
        let t = sweep_table(&r);
        assert!(t.contains("covered: 3 of 4 node(s)"), "{t}");
        assert!(t.contains("not covered, with volumes at stake: n1"), "{t}");
        assert!(t.starts_with("sweep of 3 volume(s): incomplete: 1 node(s) did not answer (n1)"), "{t}");
        assert!(!t.contains("clean"), "{t}");
        assert!(t.contains("n1: unreachable: refused"), "{t}");
        assert_eq!(sweep_value(&r)["complete"], false);
        assert_eq!(parse_finding_kind("dead-node-watcher"), Ok(pb::FindingKind::DeadNodeWatcher));
        assert!(parse_finding_kind("unspecified").is_err());
        assert_eq!(finding_kind_name(pb::FindingKind::MultiNode as i32), "multi_node");
    }
}
