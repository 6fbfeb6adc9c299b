//! Plans as text, and the Apply requests bound to what a Plan answered (or to identities from an
//! earlier plan).

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::view::table::clean;

pub fn step_text(s: &pb::Step) -> String {
    format!("{}: {}", clean(&s.action), clean(&s.description))
}

pub fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// The first line of one device's plan.
pub fn plan_head(p: &pb::DevicePlan) -> String {
    let name = clean(&p.device);
    if !p.refusal.is_empty() {
        format!("{name}: refused: {}", clean(&p.refusal))
    } else if p.steps.is_empty() {
        format!("{name}: nothing to do")
    } else {
        format!("{name}: {}", plural(p.steps.len(), "step"))
    }
}

/// The identity a plan was made for: what `apply --identity` takes back.
pub fn identity_line(out: &mut String, p: &pb::DevicePlan) {
    if !p.identity.is_empty() {
        let _ = writeln!(out, "  identity: {}", clean(&p.identity));
    }
}

/// The plan's INCOMPLETE VIEW line (what its scan could not see), before its first line.
pub fn incomplete_line(out: &mut String, p: &pb::DevicePlan) {
    if !p.incomplete_view.is_empty() {
        let _ = writeln!(out, "{}", clean(&p.incomplete_view));
    }
}

/// The plan's notes (what a step will do that is worth knowing first), each sentence once with
/// a count and the numbers that differ.
pub fn note_lines(out: &mut String, p: &pb::DevicePlan) {
    for n in crate::view::fold::fold_alike(&p.notes) {
        let _ = writeln!(out, "  note: {}", clean(&n));
    }
}

/// What the plan leaves alone, one line per cause: the same sentence (a release saying it of the
/// mount in each of 37 namespaces) once, with a count and the numbers that differ.
pub fn left_alone_lines(out: &mut String, p: &pb::DevicePlan) {
    for l in crate::view::fold::fold_alike(&p.left_alone) {
        let _ = writeln!(out, "  left alone: {}", clean(&l));
    }
}

/// `plan` as text: per device (after its INCOMPLETE VIEW line, if any) the numbered steps, the
/// notes, what is left alone, the refusal. Both CLIs print a dry run with it.
pub fn plans_table(r: &pb::PlanResponse, all_stale: bool) -> String {
    if r.plans.is_empty() {
        return if all_stale { "no stale devices: nothing to do\n".into() } else { "nothing to do\n".into() };
    }
    let mut out = String::new();
    for p in &r.plans {
        incomplete_line(&mut out, p);
        let _ = writeln!(out, "{}", plan_head(p));
        identity_line(&mut out, p);
        if p.refusal.is_empty() {
            for (i, s) in p.steps.iter().enumerate() {
                let _ = writeln!(out, "  {}. {}", i + 1, step_text(s));
            }
        }
        note_lines(&mut out, p);
        left_alone_lines(&mut out, p);
    }
    out
}

/// What `release` and `clean` without `--apply` say after the plan, in both CLIs, when there is
/// something they would carry out.
pub const DRY_RUN: &str = "dry run: add --apply to carry them out";

/// `release` or `clean` without `--apply` as text: the plan ([`plans_table`]), then
/// [`DRY_RUN`] when a plan has steps and is not refused.
pub fn dry_run_table(r: &pb::PlanResponse) -> String {
    let mut out = plans_table(r, false);
    if r.plans.iter().any(|p| p.refusal.is_empty() && !p.steps.is_empty()) {
        let _ = writeln!(out, "{DRY_RUN}");
    }
    out
}

/// The Apply request bound to what a Plan answered: its devices by kernel name, each with the
/// identity it was planned for, so that the agent refuses (FailedPrecondition, naming both
/// identities) a device whose number now stands for another kernel object.
pub fn apply_bound_to(plans: &pb::PlanResponse, operation: pb::Operation) -> pb::ApplyRequest {
    pb::ApplyRequest {
        devices: plans.plans.iter().map(|p| p.device.clone()).collect(),
        identities: plans.plans.iter().map(|p| p.identity.clone()).collect(),
        operation: operation as i32,
    }
}

/// The Apply request for devices planned earlier: one identity (`--identity`, as `plan -o json`
/// printed it; "" for none) per device, in the same order.
pub fn apply_with_identities(
    devices: &[String],
    identities: &[String],
    operation: pb::Operation,
) -> Result<pb::ApplyRequest, String> {
    if identities.len() != devices.len() {
        let n = identities.len();
        return Err(format!(
            "{n} {} for {}: give one --identity per device, in the same order (\"\" for none)",
            if n == 1 { "identity" } else { "identities" },
            plural(devices.len(), "device")
        ));
    }
    Ok(pb::ApplyRequest {
        devices: devices.to_vec(),
        identities: identities.to_vec(),
        operation: operation as i32,
    })
}
