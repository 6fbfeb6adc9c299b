//! One request's outcome ([`Outcome`]: the one-shot `release`/`clean`, the agent's `plan` and
//! `apply`) as the messages the gRPC server answers Plan and Apply with, through the same
//! conversions ([`super::plan`], [`super::report`], [`super::device`]):
//! the one-shot commands print them with the renderer agentctl uses.

use blockjanitor_proto::v1 as pb;

use crate::engine::outcome::{Outcome, Resumed};
use crate::engine::view::DeviceView;
use crate::graph::identity::Identity;
use crate::judge::{Judgement, Verdict};

/// The plan an outcome came to, with its class, operation and INCOMPLETE VIEW line; a refusal
/// before any plan (sight, may-act, the journal's lock) is a plan of no steps that says why,
/// for the device as the operator named it (`argument`). `None` when nothing was planned (the
/// device is gone).
pub fn outcome_plan(out: &Outcome, op: crate::engine::Operation, argument: &str) -> Option<pb::DevicePlan> {
    let class = out.class();
    let mut p = match &out.plan {
        Some(plan) => super::plan(&(plan.clone(), class)),
        None => {
            let (_, why) = out.refusal.as_ref()?;
            pb::DevicePlan {
                device: argument.to_owned(),
                refusal: why.clone(),
                outcome: class.as_str().to_owned(),
                operation: operation_name(op).to_owned(),
                ..Default::default()
            }
        }
    };
    if p.refusal.is_empty() {
        if let Some((_, why)) = &out.refusal {
            p.refusal = why.clone();
        }
    }
    p.incomplete_view = out.incomplete().unwrap_or_default();
    Some(p)
}

/// `clean` or `release`, as plans name their operation.
pub fn operation_name(op: crate::engine::Operation) -> &'static str {
    match op {
        crate::engine::Operation::Clean => "clean",
        crate::engine::Operation::Release => "release",
    }
}

/// The scan context (warnings, blind spots) of the scan an outcome rests on.
fn context(out: &Outcome) -> (Vec<String>, Vec<String>) {
    out.judged.as_ref().map_or_else(Default::default, |j| {
        (j.scan.warnings.clone(), j.scan.blind_spots.iter().map(|b| b.to_string()).collect())
    })
}

/// An outcome as Plan answers it (a dry run).
pub fn outcome_plans(out: &Outcome, op: crate::engine::Operation, argument: &str) -> pb::PlanResponse {
    let (warnings, blind_spots) = context(out);
    pb::PlanResponse { plans: outcome_plan(out, op, argument).into_iter().collect(), warnings, blind_spots }
}

/// An outcome as Apply answers it, with the unfinished plans it resumed first and the device as
/// it is afterwards (not judged again: its verdict is UNSPECIFIED).
pub fn outcome_results(out: &Outcome, op: crate::engine::Operation, argument: &str) -> pb::ApplyResponse {
    let (warnings, blind_spots) = context(out);
    pb::ApplyResponse {
        plans: outcome_plan(out, op, argument).into_iter().collect(),
        results: out.reports.iter().map(super::report).collect(),
        resumed: out.resumed.iter().map(resumed).collect(),
        after: after(out).into_iter().collect(),
        warnings,
        blind_spots,
    }
}

/// Adds several devices' outcomes (each with the argument that named it) to a Plan answer:
/// every plan in order, each warning and blind spot once. The one-shot `plan` (and `apply`
/// without `--yes`) print this; gRPC Plan answers it.
pub fn add_plans(into: &mut pb::PlanResponse, outcomes: &[(String, Outcome)], op: crate::engine::Operation) {
    for (argument, out) in outcomes {
        let r = outcome_plans(out, op, argument);
        into.plans.extend(r.plans);
        merge_lines(&mut into.warnings, r.warnings);
        merge_lines(&mut into.blind_spots, r.blind_spots);
    }
}

/// Adds several devices' outcomes to an Apply answer: plans, step results, the unfinished plans
/// resumed first and each device afterwards, in order; each warning and blind spot once. The
/// one-shot `apply --yes` and gRPC Apply both answer this, so both print the same document.
pub fn add_results(
    into: &mut pb::ApplyResponse,
    outcomes: &[(String, Outcome)],
    op: crate::engine::Operation,
) {
    for (argument, out) in outcomes {
        let r = outcome_results(out, op, argument);
        into.plans.extend(r.plans);
        into.results.extend(r.results);
        into.resumed.extend(r.resumed);
        into.after.extend(r.after);
        merge_lines(&mut into.warnings, r.warnings);
        merge_lines(&mut into.blind_spots, r.blind_spots);
    }
}

/// Adds the lines of `from` that `into` does not have yet.
pub fn merge_lines(into: &mut Vec<String>, from: Vec<String>) {
    for s in from {
        if !into.contains(&s) {
            into.push(s);
        }
    }
}

pub fn resumed(r: &Resumed) -> pb::ResumedPlan {
    pb::ResumedPlan {
        plan_id: r.plan_id.clone(),
        operation: r.operation.clone(),
        argument: r.argument.clone(),
        device: r.device.clone(),
        already_done: r.already_done as u32,
        results: r.reports.iter().map(super::report).collect(),
        refusal: r.refused.as_ref().map(ToString::to_string).unwrap_or_default(),
        summary: r.describe(),
    }
}

/// The planned device as the scan after the steps saw it (`None`: gone, or not applied).
fn after(out: &Outcome) -> Option<pb::Device> {
    let plan = out.plan.as_ref()?;
    let entry = out.after.as_ref()?.entry(plan.devnum)?;
    let view = DeviceView {
        identity: Identity::of(entry),
        entry: entry.clone(),
        judgement: Judgement { verdict: Verdict::Unused, reasons: Vec::new(), summary: String::new() },
        unresponsive: None,
        last_seen_scan: 0,
        last_seen: None,
        api_word: 0,
    };
    let mut d = super::device(&view);
    d.verdict = pb::Verdict::Unspecified as i32;
    Some(d)
}
