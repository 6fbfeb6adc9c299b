//! `explain`'s answer (Fleet.Explain) for people and scripts: the `explanation` document (every
//! field present, enums as lower-case names) and the table, which starts with what to do: the
//! diagnosis, its evidence and its next steps (each a command to paste with what it changes),
//! then each volume node by node, then the events (or why there are none) and the nodes that
//! could not be asked. Nothing printed here was carried out.

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::view::doc::{envelope, EXPLANATION};
use crate::view::names::{kind_name, verdict_name};
use crate::view::table::{clean, columns, cut};
use crate::view::time::ago;
use crate::view::values::device_value;

/// `held_elsewhere`, `dead_node`... for a raw `Cause`.
pub fn cause_name(raw: i32) -> String {
    match pb::Cause::try_from(raw) {
        Ok(c) => c.as_str_name().trim_start_matches("CAUSE_").to_ascii_lowercase(),
        Err(_) => format!("unknown({raw})"),
    }
}

/// `blocked`, `not_blocked`, `unknown` for a raw `ExplainOutcome`.
pub fn outcome_name(raw: i32) -> String {
    match pb::ExplainOutcome::try_from(raw) {
        Ok(o) => o.as_str_name().trim_start_matches("EXPLAIN_OUTCOME_").to_ascii_lowercase(),
        Err(_) => format!("unknown({raw})"),
    }
}

fn holder_value(h: &pb::ExplainHolder) -> Value {
    json!({
        "node": h.node, "device": h.device, "kind": h.kind, "pid": h.pid, "command": h.command, "pod": h.pod,
        "pod_uid": h.pod_uid, "container": h.container, "container_id": h.container_id,
        "mount_namespace": h.mount_namespace, "in_host_namespace": h.in_host_namespace,
        "mount_point": h.mount_point, "description": h.description,
    })
}

fn liveness_value(l: &pb::NodeLiveness) -> Value {
    json!({
        "node": l.node, "agent_answers": l.agent_answers,
        "agent_last_contact_unix_seconds": l.agent_last_contact_unix_seconds,
        "agent_down_since_unix_seconds": l.agent_down_since_unix_seconds, "agent_error": l.agent_error,
        "view_age_seconds": l.view_age_seconds, "node_ready": l.node_ready, "node_ready_reason": l.node_ready_reason,
        "node_ready_since_unix_seconds": l.node_ready_since_unix_seconds,
        "kubelet_heartbeat_unix_seconds": l.kubelet_heartbeat_unix_seconds,
        "node_deleted_unix_seconds": l.node_deleted_unix_seconds, "addresses": l.addresses,
        "believed_dead": l.believed_dead, "why": l.why,
    })
}

fn diagnosis_value(d: &pb::ExplainDiagnosis) -> Value {
    json!({
        "cause": cause_name(d.cause), "outcome": outcome_name(d.outcome), "node": d.node, "device": d.device,
        "summary": d.summary, "evidence": d.evidence,
        "holders": d.holders.iter().map(holder_value).collect::<Vec<_>>(),
        "next": d.next.iter().map(|a| json!({"command": a.command, "note": a.note, "manifest": a.manifest})).collect::<Vec<_>>(),
    })
}

fn node_value(n: &pb::VolumeOnNode) -> Value {
    json!({
        "node": n.node, "pod_node": n.pod_node,
        "devices": n.devices.iter().map(|f| json!({"node": f.node, "device": f.device.as_ref().map(device_value)})).collect::<Vec<_>>(),
        "volume_attachments": n.volume_attachments, "in_volumes_attached": n.in_volumes_attached,
        "in_volumes_in_use": n.in_volumes_in_use,
        "holders": n.holders.iter().map(holder_value).collect::<Vec<_>>(),
        "liveness": n.liveness.as_ref().map(liveness_value),
    })
}

/// The `explanation` document.
pub fn explanation_doc(r: &pb::ExplainResponse) -> Value {
    envelope(
        EXPLANATION,
        json!({
            "target": r.target,
            "pod": r.pod.as_ref().map(|p| json!({"name": p.name, "namespace": p.namespace, "uid": p.uid, "node": p.node,
                                                  "phase": p.phase, "waiting": p.waiting})),
            "events": r.events.iter().map(|e| json!({"api": e.api, "type": e.r#type, "reason": e.reason,
                "message": e.message, "count": e.count, "last_unix_seconds": e.last_unix_seconds,
                "reporter": e.reporter})).collect::<Vec<_>>(),
            "events_note": r.events_note,
            "volumes": r.volumes.iter().map(|v| json!({
                "name": v.name, "pvc": v.pvc, "pvc_phase": v.pvc_phase, "pv": v.pv, "driver": v.driver,
                "volume_handle": v.volume_handle, "identity": v.identity,
                "nodes": v.nodes.iter().map(node_value).collect::<Vec<_>>(),
                "diagnosis": v.diagnosis.as_ref().map(diagnosis_value),
            })).collect::<Vec<_>>(),
            "diagnosis": r.diagnosis.as_ref().map(diagnosis_value),
            "outcome": outcome_name(r.outcome),
            "missing_nodes": r.missing_nodes.iter().map(|m| json!({"node": m.node, "reason": m.reason})).collect::<Vec<_>>(),
            "unix_seconds": r.unix_seconds,
        }),
    )
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{}\n", clean(l))).collect()
}

/// The diagnosis block: cause and summary, evidence, next steps.
fn diagnosis_text(d: &pb::ExplainDiagnosis) -> String {
    let mut out = format!("{}: {}\n", outcome_name(d.outcome).to_ascii_uppercase(), clean(&d.summary));
    if !d.evidence.is_empty() {
        out.push_str("\nEVIDENCE\n");
        for e in &d.evidence {
            out.push_str(&format!("  {}\n", clean(e)));
        }
    }
    if !d.next.is_empty() {
        out.push_str("\nNEXT (printed, never run by explain)\n");
        for (i, a) in d.next.iter().enumerate() {
            match a.command.is_empty() {
                false => out.push_str(&format!("  {}. {}\n", i + 1, clean(&a.command))),
                true => out.push_str(&format!("  {}. (a manifest change)\n", i + 1)),
            }
            out.push_str(&indent(&a.note, "     # "));
            if !a.manifest.is_empty() {
                out.push_str(&indent(&a.manifest, "       "));
            }
        }
    }
    out
}

fn agent_cell(l: Option<&pb::NodeLiveness>, now: f64) -> String {
    let Some(l) = l else { return "-".into() };
    if l.agent_answers {
        return "answers".into();
    }
    if l.agent_down_since_unix_seconds > 0.0 {
        return format!("down {}", ago(l.agent_down_since_unix_seconds, now));
    }
    "none".into()
}

fn node_rows(v: &pb::ExplainedVolume, now: f64) -> Vec<Vec<String>> {
    v.nodes
        .iter()
        .map(|n| {
            let l = n.liveness.as_ref();
            let devices: Vec<String> = n
                .devices
                .iter()
                .filter_map(|f| f.device.as_ref())
                .map(|d| format!("{} ({}, {})", d.name, kind_name(d.kind), verdict_name(d.verdict)))
                .collect();
            // `csi-7d1b0c3e2f4a59687b8c9d... (attached=true)`: the name cut, the state whole.
            let vas: Vec<String> = n
                .volume_attachments
                .iter()
                .map(|va| match va.split_once(" (") {
                    Some((name, rest)) => format!("{} ({rest}", cut(name, 16)),
                    None => cut(va, 16),
                })
                .collect();
            let attached = match (vas.is_empty(), n.in_volumes_attached) {
                (true, false) => "-".to_owned(),
                (true, true) => "node status".to_owned(),
                (false, s) => format!("{}{}", vas.join(", "), if s { " + node status" } else { "" }),
            };
            vec![
                format!("{}{}", clean(&n.node), if n.pod_node { " (pod)" } else { "" }),
                agent_cell(l, now),
                l.map(|l| if l.node_ready == "True" { "Ready".into() } else { l.node_ready.clone() })
                    .unwrap_or_default(),
                clean(&attached),
                if n.in_volumes_in_use { "yes".into() } else { "-".into() },
                if devices.is_empty() { "-".into() } else { clean(&devices.join(", ")) },
                n.holders.first().map_or_else(|| "-".to_owned(), |h| cut(&clean(&h.description), 50)),
            ]
        })
        .collect()
}

fn volume_text(v: &pb::ExplainedVolume, now: f64) -> String {
    let mut chain = Vec::new();
    if !v.pvc.is_empty() {
        chain.push(format!(
            "PVC {}{}",
            v.pvc,
            if v.pvc_phase.is_empty() { String::new() } else { format!(" ({})", v.pvc_phase) }
        ));
    }
    if !v.pv.is_empty() {
        chain.push(format!(
            "PV {}{}",
            v.pv,
            if v.driver.is_empty() { String::new() } else { format!(" ({})", v.driver) }
        ));
    }
    chain.extend(v.identity.iter().cloned());
    let name = if v.name.is_empty() { "volume" } else { &v.name };
    let mut out = format!("\nVOLUME {}: {}\n", clean(name), clean(&chain.join(" -> ")));
    if !v.nodes.is_empty() {
        let header = ["NODE", "AGENT", "NODE READY", "ATTACHED", "IN USE", "DEVICES", "HELD BY"];
        out.push_str(&columns(&header, &node_rows(v, now)));
    }
    if let Some(d) = &v.diagnosis {
        out.push_str(&format!("  -> {}: {}\n", cause_name(d.cause), clean(&d.summary)));
    }
    out
}

/// The table.
pub fn explanation_table(r: &pb::ExplainResponse, now: f64) -> String {
    let mut out = clean(&r.target);
    if let Some(p) = &r.pod {
        let node = if p.node.is_empty() { "not scheduled".into() } else { format!("on {}", p.node) };
        let waiting = if p.waiting.is_empty() { String::new() } else { format!(" ({})", p.waiting) };
        out.push_str(&format!(" {}: {}{}", clean(&node), clean(&p.phase), clean(&waiting)));
    }
    out.push_str("\n\n");
    if let Some(d) = &r.diagnosis {
        out.push_str(&diagnosis_text(d));
    }
    for v in &r.volumes {
        out.push_str(&volume_text(v, now));
    }
    out.push_str("\nEVENTS\n");
    for e in r.events.iter().take(10) {
        let when = if e.last_unix_seconds > 0.0 { ago(e.last_unix_seconds, now) } else { "?".into() };
        let count = if e.count > 1 { format!(" (x{})", e.count) } else { String::new() };
        out.push_str(&format!(
            "  {when}  {}  {}{count}  {}: {}\n",
            clean(&e.r#type),
            clean(&e.reason),
            clean(&e.reporter),
            cut(&clean(&e.message), 160)
        ));
    }
    if !r.events_note.is_empty() {
        out.push_str(&format!("  {}\n", clean(&r.events_note)));
    }
    if !r.missing_nodes.is_empty() {
        out.push_str("\nnot answering now (explained from their last view):\n");
        for m in &r.missing_nodes {
            out.push_str(&format!("  {}: {}\n", clean(&m.node), clean(&m.reason)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causes_and_outcomes_have_their_names() {
        assert_eq!(cause_name(pb::Cause::PrivateMountCopy as i32), "private_mount_copy");
        assert_eq!(cause_name(pb::Cause::DeadNode as i32), "dead_node");
        assert_eq!(outcome_name(pb::ExplainOutcome::NotBlocked as i32), "not_blocked");
        assert_eq!(outcome_name(77), "unknown(77)");
    }

    #[test]
    fn the_table_starts_with_what_to_do() {
        let r = pb::ExplainResponse {
            target: "pod shop/db-0".into(),
            pod: Some(pb::ExplainPod {
                node: "node-new".into(),
                phase: "Pending".into(),
                waiting: "ContainerCreating".into(),
                ..Default::default()
            }),
            diagnosis: Some(pb::ExplainDiagnosis {
                outcome: pb::ExplainOutcome::Blocked as i32,
                summary: "Multi-Attach".into(),
                next: vec![pb::Advice {
                    command: "kubectl blockjanitor plan node-old/rbd4".into(),
                    note: "a dry run".into(),
                    manifest: String::new(),
                }],
                ..Default::default()
            }),
            events_note: "no events left about it (they expire after an hour): explained from state".into(),
            outcome: pb::ExplainOutcome::Blocked as i32,
            ..Default::default()
        };
        let t = explanation_table(&r, 0.0);
        assert!(
            t.starts_with(
                "pod shop/db-0 on node-new: Pending (ContainerCreating)\n\nBLOCKED: Multi-Attach\n"
            ),
            "{t}"
        );
        assert!(t.contains("  1. kubectl blockjanitor plan node-old/rbd4\n     # a dry run\n"), "{t}");
        assert!(t.contains("explained from state"), "{t}");
        let doc = explanation_doc(&r);
        assert_eq!(
            (doc["document"].as_str(), doc["outcome"].as_str()),
            (Some("explanation"), Some("blocked"))
        );
    }
}
