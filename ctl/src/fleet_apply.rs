//! `agentctl fleet apply` and `fleet plan`: `NODE/DEVICE` arguments grouped by node, the
//! console's Apply request, and its dry run and results as text and values.

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::apply::{apply_summary, apply_table};
use crate::doc::envelope;
use crate::exit;
use crate::table::clean;
use crate::values::{plan_value, step_result_value};

/// `agentctl fleet apply`'s arguments (`NODE/DEVICE`) grouped by node, in the order nodes are
/// first named.
pub fn fleet_targets(args: &[String]) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for a in args {
        let Some((node, device)) = a.split_once('/').filter(|(n, d)| !n.is_empty() && !d.is_empty()) else {
            return Err(format!("'{a}' is not NODE/DEVICE (e.g. node-a/rbd4)"));
        };
        match out.iter_mut().find(|(n, _)| n == node) {
            Some((_, devices)) => devices.push(device.to_owned()),
            None => out.push((node.to_owned(), vec![device.to_owned()])),
        }
    }
    if out.is_empty() {
        return Err("name at least one NODE/DEVICE".to_owned());
    }
    Ok(out)
}

/// The console's Apply for these nodes' devices with their identities (one list per node).
pub fn fleet_apply_request(
    targets: &[(String, Vec<String>)],
    identities: &[Vec<String>],
    execute: bool,
) -> pb::FleetApplyRequest {
    let mut all = targets.iter().zip(identities).map(|((node, devices), ids)| pb::FleetApplyTarget {
        node: node.clone(),
        devices: devices.clone(),
        identities: ids.clone(),
    });
    let first = all.next().unwrap_or_default();
    pb::FleetApplyRequest {
        node: first.node,
        devices: first.devices,
        identities: first.identities,
        targets: all.collect(),
        execute,
    }
}

/// The dry run's exit code, in the table both CLIs use (`rpc::view::exit`): each node's plans
/// as `agentctl plan` ranks them, a node whose plan could not be had `unknown` (the answer is
/// incomplete), a device its agent did not plan an error (no such device there); the worst of all.
pub fn fleet_dry_run_exit(r: &pb::FleetApplyResponse) -> u8 {
    r.summary.iter().map(node_plan_exit).fold(exit::DONE, exit::worst)
}

fn node_plan_exit(n: &pb::NodePlanSummary) -> u8 {
    let Some(plan) = &n.plan else {
        return exit::UNKNOWN;
    };
    let uncovered = n.refusal.contains(crate::fleet_plan::UNCOVERED);
    exit::worst(exit::plans(&plan.plans), if uncovered { exit::ERROR } else { exit::DONE })
}

/// Whether the dry run refuses anywhere.
pub fn fleet_dry_run_refuses(r: &pb::FleetApplyResponse) -> bool {
    r.summary.iter().any(|s| !s.refusal.is_empty())
}

/// The dry run as text: per node its steps, or why it may not run, then the budget.
pub fn fleet_summary_table(r: &pb::FleetApplyResponse) -> String {
    let mut out = String::new();
    for n in &r.summary {
        if n.refusal.is_empty() {
            let _ = writeln!(out, "{}: {} step(s)", clean(&n.node), n.steps);
        } else {
            let _ = writeln!(out, "{}: REFUSED: {}", clean(&n.node), clean(&n.refusal));
        }
        for p in n.plan.iter().flat_map(|p| &p.plans) {
            for st in &p.steps {
                let _ = writeln!(
                    out,
                    "  {} {}: {}",
                    clean(&st.action),
                    clean(&st.device),
                    clean(&st.description)
                );
            }
        }
    }
    if r.budget_steps_per_minute > 0 {
        let _ = writeln!(
            out,
            "fleet budget: {} of {} steps left this minute",
            r.budget_steps_left, r.budget_steps_per_minute
        );
    }
    if let Some(why) = crate::fleet_plan::over_budget(r) {
        let _ = writeln!(out, "{why}");
    }
    out
}

/// The dry run and, when it ran, every node's results, as a value.
pub fn fleet_apply_value(r: &pb::FleetApplyResponse) -> Value {
    envelope(
        "fleet_apply",
        json!({
            "executed": r.executed,
            "on_behalf_of": r.on_behalf_of,
            "summary": r.summary.iter().map(|n| json!({
                "node": n.node,
                "steps": n.steps,
                "refusal": n.refusal,
                "plans": n.plan.as_ref().map(|p| json!({ "plans": p.plans.iter().map(plan_value).collect::<Vec<_>>() })).unwrap_or(Value::Null),
            })).collect::<Vec<_>>(),
            "results": r.results.iter().map(|n| json!({
                "node": n.node,
                "error": n.error,
                "results": n.result.as_ref().map(|a| a.results.iter().map(step_result_value).collect::<Vec<_>>())
                    .unwrap_or_default(),
            })).collect::<Vec<_>>(),
            "budget_steps_left": r.budget_steps_left,
            "budget_steps_per_minute": r.budget_steps_per_minute,
        }),
    )
}

/// Every node's Apply results as text.
pub fn fleet_results_table(r: &pb::FleetApplyResponse) -> String {
    let mut out = String::new();
    for n in &r.results {
        let _ = writeln!(out, "{}:", clean(&n.node));
        if let Some(a) = &n.result {
            for line in apply_table(a).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        if !n.error.is_empty() {
            let _ = writeln!(out, "  error: {}", clean(&n.error));
        }
    }
    out
}

/// Whether every node's every step finished.
pub fn fleet_all_done(r: &pb::FleetApplyResponse) -> bool {
    r.executed
        && r.results.iter().all(|n| {
            n.error.is_empty() && n.result.as_ref().is_some_and(|a| apply_summary(a).exit_code() == 0)
        })
}
