//! `release`, `clean`, `plan` and `apply`: each device through the one request workflow
//! ([`Engine::carry_out`]; with `--apply`/`--yes`, recovery and the unfinished plan an argument
//! owes come first, before it is resolved), printed as the agent's text or as the documents
//! agentctl prints for the same question (`plans` for a dry run, `results` once carried out).

use std::time::Duration;

use anyhow::Result;
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view;

use super::args::*;
use super::output::{print_value, say};
use super::render::{self, say_recovery};
use super::settings::*;
use crate::engine::outcome::{Class, Outcome, Request, Subject};
use crate::engine::world::LinuxWorld;
use crate::engine::{Engine, Operation};
use crate::graph::scan::Target;
use crate::judge::grace::Clocks;
use crate::judge::Verdict;
use crate::server::convert_outcome::{outcome_plans, outcome_results};

/// One request for the device the operator named: its outcome (the state file saved).
pub fn carry(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    device: &str,
    apply: bool,
) -> Result<Outcome> {
    let journal_file = journal_path(cli);
    let clocks = std::sync::Mutex::new(std::mem::replace(&mut state.clocks, Clocks::new(None)));
    let request = Request {
        op,
        subject: Subject::Argument(device.to_owned()),
        argument: device.to_owned(),
        expected_identity: None,
        apply,
        by: format!("cli (uid {})", nix::unistd::geteuid()),
        journal: &journal_file,
        lock_wait: Duration::from_secs(cli.lock_wait),
        clocks: &clocks,
        admit: None,
    };
    let result = e.carry_out(&request);
    state.clocks = clocks.into_inner().unwrap_or_else(|p| p.into_inner());
    state.save();
    let out = result?;
    say_recovery(&out, |line| eprintln!("warning: {line}"));
    Ok(out)
}

/// One outcome as the agent's text: the one line a refusal before any step is (sight,
/// may-act, the journal's lock), else the report.
fn outcome_text(out: &Outcome, device: &str) -> String {
    match (&out.refusal, &out.plan) {
        (Some((_, why)), None) => format!("{why}\n"),
        _ => render::outcome_text(out, device),
    }
}

/// A plan the engine could not carry out for its kind is an error with its reason.
fn unsupported(out: &Outcome) -> Result<()> {
    if out.class() == Class::Error {
        if let Some(p) = out.plan.as_ref().filter(|p| p.unsupported) {
            anyhow::bail!("{}", p.refusal.as_deref().unwrap_or_default());
        }
    }
    Ok(())
}

/// `release` or `clean` of one device. Prints the report; returns the exit code.
pub fn one_request(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    device: &str,
    apply: bool,
    output: Output,
) -> Result<u8> {
    let out = carry(cli, e, state, op, device, apply)?;
    let code = out.class().exit_code();
    if matches!(output, Output::Json | Output::Yaml) {
        print_value(output, &document(&[(device.to_owned(), out)], op, apply))?;
        return Ok(code);
    }
    say(&outcome_text(&out, device))?;
    unsupported(&out)?;
    Ok(code)
}

/// The document of some outcomes: `results` once carried out, else `plans`.
fn document(outcomes: &[(String, Outcome)], op: Operation, applied: bool) -> serde_json::Value {
    let mut plans = pb::PlanResponse::default();
    let mut results = pb::ApplyResponse::default();
    let merge = |into: &mut Vec<String>, from: Vec<String>| {
        for s in from {
            if !into.contains(&s) {
                into.push(s);
            }
        }
    };
    for (device, out) in outcomes {
        if applied {
            let r = outcome_results(out, op, device);
            results.plans.extend(r.plans);
            results.results.extend(r.results);
            results.resumed.extend(r.resumed);
            results.after.extend(r.after);
            merge(&mut results.warnings, r.warnings);
            merge(&mut results.blind_spots, r.blind_spots);
        } else {
            let r = outcome_plans(out, op, device);
            plans.plans.extend(r.plans);
            merge(&mut plans.warnings, r.warnings);
            merge(&mut plans.blind_spots, r.blind_spots);
        }
    }
    if applied {
        view::doc::results_doc(&[], &results)
    } else {
        view::doc::plans_doc(&plans)
    }
}

/// The devices a `plan` or `apply` is for: those named, else every stale device (from a scan
/// of its own; a release needs the devices named).
fn targets(
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    named: &[String],
) -> Result<Vec<String>> {
    if !named.is_empty() {
        return Ok(named.to_vec());
    }
    if op == Operation::Release {
        anyhow::bail!("a release plan needs the devices named");
    }
    let judged = e.judge(e.scan(Target::All)?, &mut state.clocks);
    state.save();
    Ok(judged
        .scan
        .graph
        .devices
        .iter()
        .filter(|d| judged.verdict(d.device.devnum).is_some_and(|j| j.verdict == Verdict::Stale))
        .map(|d| d.device.name.to_string())
        .collect())
}

/// `plan` (`yes` false, `apply` false) and `apply` (`apply` true): every device through the one
/// request workflow, as a dry run unless `apply && yes`. `apply` without `--yes` shows the plans
/// and refuses, as agentctl's does. Returns the worst exit code.
#[allow(clippy::too_many_arguments)]
pub fn many(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    named: &[String],
    apply: bool,
    yes: bool,
    output: Output,
) -> Result<u8> {
    let carried = apply && yes;
    let mut outcomes = Vec::new();
    for device in targets(e, state, op, named)? {
        let out = carry(cli, e, state, op, &device, carried)?;
        outcomes.push((device, out));
    }
    let mut code =
        outcomes.iter().fold(view::exit::DONE, |c, (_, o)| view::exit::worst(c, o.class().exit_code()));
    if matches!(output, Output::Json | Output::Yaml) {
        print_value(output, &document(&outcomes, op, carried))?;
    } else if outcomes.is_empty() {
        say(if named.is_empty() { "no stale devices: nothing to do\n" } else { "nothing to do\n" })?;
    } else {
        for (device, out) in &outcomes {
            say(&outcome_text(out, device))?;
        }
    }
    for (_, out) in &outcomes {
        unsupported(out)?;
    }
    if apply && !yes {
        eprintln!("not applied: add --yes to carry it out");
        code = view::exit::worst(view::exit::NOT_DONE, code);
    }
    Ok(code)
}
