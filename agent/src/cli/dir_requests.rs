//! `clean`, `plan` and `apply` of an orphaned pod volume directory, named
//! `pod-volume:<pod uid>/volumes/<plugin>/<name>` (`.../volumeDevices/...`,
//! `.../volume-subpaths/...`, as `scan` lists them) or by its path below the kubelet directory:
//! through the engine's directory workflow ([`Engine::carry_out_dir`]), printed as the agent's
//! text, or as the `plans`/`results` documents agentctl prints for devices.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use blockjanitor_proto::v1 as pb;

use super::args::Cli;
use super::render::say_recovery_of;
use super::settings::{journal_path, StateFile};
use crate::engine::dir_workflow::{DirOutcome, DirRequest};
use crate::engine::world::LinuxWorld;
use crate::engine::Engine;
use crate::judge::grace::Clocks;
use crate::judge::orphans::DirVerdict;
use crate::plan::pod_volume;
use crate::server::convert_pod_volumes::{dir_plan, dir_results};

/// Whether `arg` names a pod volume directory rather than a device.
pub fn is_dir_argument(arg: &str, kubelet_dir: &Path) -> bool {
    arg.starts_with(pod_volume::PREFIX) || pod_volume::parse_argument(arg, kubelet_dir).is_some()
}

/// One request about the directory `arg`; its outcome (the state file saved).
pub fn carry_dir(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    arg: &str,
    apply: bool,
) -> Result<DirOutcome> {
    let journal_file = journal_path(cli);
    let clocks = std::sync::Mutex::new(std::mem::replace(&mut state.clocks, Clocks::new(None)));
    let req = DirRequest {
        argument: arg.to_owned(),
        apply,
        by: format!("cli (uid {})", nix::unistd::geteuid()),
        journal: &journal_file,
        lock_wait: Duration::from_secs(cli.lock_wait),
        clocks: &clocks,
        admit: None,
    };
    let result = e.carry_out_dir(&req);
    state.clocks = clocks.into_inner().unwrap_or_else(|p| p.into_inner());
    state.save();
    let out = result?;
    say_recovery_of(&out.recovery, |line| eprintln!("warning: {line}"));
    Ok(out)
}

/// The removable directories, as `plan` and `apply` with no argument take them (with every
/// stale device).
pub fn removable(e: &Engine<LinuxWorld>, state: &mut StateFile<'_>) -> Vec<String> {
    let report = e.pod_volumes(&mut state.clocks);
    state.save();
    report
        .dirs
        .iter()
        .filter(|d| d.judgement.verdict == DirVerdict::Removable)
        .map(|d| d.argument.clone())
        .collect()
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
