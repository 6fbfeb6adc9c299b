//! `clean`, `plan` and `apply` of an orphaned pod volume directory, named
//! `pod-volume:<pod uid>/volumes/<plugin>/<name>` (`.../volumeDevices/...`,
//! `.../volume-subpaths/...`, as `scan` lists them) or by its path below the kubelet directory:
//! through the engine's directory workflow ([`OneShot::run_dir_request`]), printed as the agent's
//! text, or as the `plans`/`results` documents agentctl prints for devices.

use anyhow::Result;
use blockjanitor_proto::v1 as pb;

use super::render::say_recovery_of;
use crate::engine::dir_workflow::DirOutcome;
use crate::engine::requests::OneShot;
use crate::engine::wire::pod_volumes::{dir_plan, dir_results};

/// One request about the directory `arg`; its outcome (what the journal's recovery did said on
/// stderr).
pub fn run_dir_request(run: &mut OneShot, arg: &str, apply: bool) -> Result<DirOutcome> {
    let out = run.run_dir_request(arg, apply)?;
    say_recovery_of(&out.recovery, |line| eprintln!("warning: {line}"));
    Ok(out)
}

/// The outcome as the agent's text: the verdict with its proofs, the steps planned or run,
/// what to check.
pub fn dir_text(out: &DirOutcome, arg: &str) -> String {
    let mut text = String::new();
    if let Some(gone) = &out.gone {
        text.push_str(&format!("{gone}\n"));
    }
    let Some(plan) = &out.plan else {
        if let Some((_, why)) = &out.refusal {
            text.push_str(&format!("{why}\n"));
        }
        return text;
    };
    let path = out.evidence.as_ref().map(|e| e.entry.path.display().to_string()).unwrap_or_default();
    text.push_str(&format!("{arg} ({path}): {}\n", plan.verdict.as_str()));
    for r in &plan.reasons {
        text.push_str(&format!("  - {r}\n"));
    }
    if let Some(ev) = &out.evidence {
        for p in ev.pins.iter().chain(&ev.pod_rooted) {
            text.push_str(&format!("  mounted: {}\n", p.describe()));
        }
    }
    if !out.applied {
        for s in &plan.steps {
            text.push_str(&format!("  would {}\n", s.describe()));
        }
    }
    for r in &out.reports {
        let (word, detail) = r.word();
        let detail = if detail.is_empty() { String::new() } else { format!(": {detail}") };
        text.push_str(&format!("  {word}: {}{detail}\n", r.step.describe()));
    }
    if let Some(why) = &plan.refusal {
        text.push_str(&format!("left alone: {why}\n"));
    }
    if let Some(advice) = &plan.advice {
        text.push_str(&format!("check: {advice}\n"));
    }
    if let Some((_, why)) = &out.refusal {
        text.push_str(&format!("refused: {why}\n"));
    }
    text
}

/// Adds a directory's outcome to the `plans` (dry run) or `results` (applied) document's message.
pub fn add_to(
    plans: &mut pb::PlanResponse,
    results: &mut pb::ApplyResponse,
    out: &DirOutcome,
    arg: &str,
    applied: bool,
) {
    let plan = dir_plan(out, arg);
    if applied {
        results.results.extend(dir_results(out, arg));
        results.plans.push(plan);
    } else {
        plans.plans.push(plan);
    }
}
