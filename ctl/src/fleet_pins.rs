//! `agentctl fleet pin-risks`: the fleet's pin risks (`ListPinRisks`, every page) as the
//! `fleet_pin_risks` document and as a table, with the nodes the answer cannot speak for and
//! those that report no check. Exit code: 2 when a pin risk is listed, 3 when none is but a
//! node could not be asked or judged (never read as "none"), else 0.

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::doc::envelope;
use crate::pins::{copies, holder};
use crate::table::{clean, columns, cut, is_wide};
use crate::values::pin_risk_value;

fn missing_value(m: &[pb::MissingNode]) -> Value {
    Value::Array(m.iter().map(|m| json!({"node": m.node, "reason": m.reason})).collect())
}

/// The pages of one listing put together.
pub fn merged(pages: Vec<pb::ListPinRisksResponse>) -> pb::ListPinRisksResponse {
    let mut out = pb::ListPinRisksResponse::default();
    for p in pages {
        out.pin_risks.extend(p.pin_risks);
        out.total = p.total;
        out.missing_nodes = p.missing_nodes;
        out.unchecked_nodes = p.unchecked_nodes;
        out.next_page_token = p.next_page_token;
    }
    out
}

pub fn pin_risks_value(r: &pb::ListPinRisksResponse) -> Value {
    envelope(
        "fleet_pin_risks",
        json!({
            "pin_risks": r.pin_risks.iter().map(|f| json!({
                "node": f.node,
                "risk": pin_risk_value(f.risk.as_ref().unwrap_or(&pb::PinRisk::default())),
            })).collect::<Vec<_>>(),
            "total": r.total,
            "next_page_token": r.next_page_token,
            "missing_nodes": missing_value(&r.missing_nodes),
            "unchecked_nodes": missing_value(&r.unchecked_nodes),
        }),
    )
}

pub fn pin_risks_table(r: &pb::ListPinRisksResponse) -> String {
    let listed = |f: &&pb::FleetPinRisk| f.risk.as_ref().is_some_and(|r| r.unknown.is_empty());
    let rows: Vec<Vec<String>> = r
        .pin_risks
        .iter()
        .filter(listed)
        .filter_map(|f| {
            let p = f.risk.as_ref()?;
            Some(vec![
                clean(&f.node),
                p.mount_namespace.to_string(),
                cut(&clean(&holder(p)), 50),
                cut(&clean(&copies(p)), 60),
                if is_wide() { clean(&p.fix) } else { cut(&clean(&p.fix), 60) },
            ])
        })
        .collect();
    let mut out = if rows.is_empty() {
        "no pin risk listed\n".to_owned()
    } else {
        columns(&["NODE", "MOUNT NS", "HELD BY", "COPIES", "FIX"], &rows)
    };
    for f in r.pin_risks.iter().filter(|f| !listed(f)) {
        let p = f.risk.clone().unwrap_or_default();
        out.push_str(&format!(
            "{}: pin risk unknown for mount namespace {}: {}\n",
            clean(&f.node),
            p.mount_namespace,
            clean(&p.unknown)
        ));
    }
    if !r.next_page_token.is_empty() {
        out.push_str(&format!("more: --page-token {}\n", r.next_page_token));
    }
    for (title, list) in
        [("not answered for", &r.missing_nodes), ("no pin-risk check on", &r.unchecked_nodes)]
    {
        if !list.is_empty() {
            out.push_str(&format!("\n{title} ({} node(s)): the answer may be incomplete\n", list.len()));
            for n in list {
                out.push_str(&format!("  {}: {}\n", clean(&n.node), clean(&n.reason)));
            }
        }
    }
    out
}

/// 2 when a pin risk is listed, 3 when none is but a node or namespace could not be told, 0.
pub fn exit_code(r: &pb::ListPinRisksResponse) -> u8 {
    let known = r.pin_risks.iter().any(|f| f.risk.as_ref().is_some_and(|p| p.unknown.is_empty()));
    let unsure = !r.missing_nodes.is_empty()
        || !r.unchecked_nodes.is_empty()
        || r.pin_risks.iter().any(|f| f.risk.as_ref().is_some_and(|p| !p.unknown.is_empty()));
    match (known, unsure) {
        (true, _) => 2,
        (false, true) => 3,
        (false, false) => 0,
    }
}
