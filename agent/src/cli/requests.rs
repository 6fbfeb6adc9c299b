//! `release`, `clean`, `plan` and `apply`: each device through the engine's one request workflow
//! ([`OneShot::run_device_request`]; with `--apply`/`--yes`, recovery and the unfinished plan an argument
//! owes come first, before it is resolved), converted to the messages agentctl gets for the
//! same question (a Plan answer for a dry run, an Apply answer once carried out) and printed as
//! agentctl prints them (text, or the `plans` / `results` documents); the exit code of what
//! each came to.

use anyhow::Result;
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view;

use super::args::*;
use super::output::{print_value, say};
use super::render::say_recovery;
use crate::engine::dir_workflow::DirOutcome;
use crate::engine::outcome::{Outcome, OutcomeClass};
use crate::engine::requests::OneShot;
use crate::engine::wire::outcome::{add_plans, add_results};
use crate::engine::Operation;

/// One request for the device the operator named: its outcome (what the journal's recovery did
/// said on stderr).
pub fn run_device_request(run: &mut OneShot, op: Operation, device: &str, apply: bool) -> Result<Outcome> {
    let out = run.run_device_request(op, device, apply)?;
    say_recovery(&out, |line| eprintln!("warning: {line}"));
    Ok(out)
}

/// The line a report opens with when the Kubernetes API's word is missing, or nothing.
pub fn api_header(run: &OneShot) -> String {
    run.api_line().map(|l| format!("{l}\n")).unwrap_or_default()
}

/// Some outcomes as text: the Plan answer they come to as agentctl's `plan` prints it, or
/// (carried out) the Apply answer as agentctl's `apply` prints it.
///
/// A device gone because a finished plan of the journal removed it is not on the wire: its
/// line ([`Outcome::gone`]) comes first, and alone when there is nothing else to say.
/// `hint`: a dry run of `release` or `clean` says how to carry it out ([`view::plan::dry_run_table`]).
fn outcomes_text(outcomes: &[(String, Outcome)], op: Operation, applied: bool, hint: bool) -> String {
    let (plans, results) = answers(outcomes, &[], op, applied);
    let gone: String =
        outcomes.iter().filter_map(|(_, o)| o.gone.as_ref()).map(|g| format!("{g}\n")).collect();
    let empty = plans.plans.is_empty() && results.plans.is_empty() && results.resumed.is_empty();
    if !gone.is_empty() && empty {
        return gone;
    }
    let table = match applied {
        true => view::apply::apply_table(&results),
        false if hint => view::plan::dry_run_table(&plans),
        false => view::plan::plans_table(&plans, false),
    };
    gone + &table
}

/// `text` with the Kubernetes API's line ([`OneShot::api_line`]) at its top, after an
/// INCOMPLETE VIEW line if it opens with one.
fn with_api_line(text: &str, run: &OneShot) -> String {
    let Some(api) = run.api_line() else { return text.to_owned() };
    match text.split_once('\n').filter(|(first, _)| first.starts_with("INCOMPLETE VIEW")) {
        Some((first, rest)) => format!("{first}\n{api}\n{rest}"),
        None => format!("{api}\n{text}"),
    }
}

/// A plan the engine could not carry out for its kind is an error with its reason.
fn unsupported(out: &Outcome) -> Result<()> {
    if out.class() == OutcomeClass::Error {
        if let Some(p) = out.plan.as_ref().filter(|p| p.unsupported) {
            anyhow::bail!("{}", p.refusal.as_deref().unwrap_or_default());
        }
    }
    Ok(())
}

/// `release` or `clean` of one device. Prints the report; returns the exit code.
pub fn one_request(cli: &Cli, run: &mut OneShot, op: Operation, device: &str, apply: bool) -> Result<u8> {
    let output = cli.output;
    if run.is_dir_argument(device) {
        if op == Operation::Release {
            anyhow::bail!("{device} is a pod volume directory: release applies to devices (clean removes an orphaned, empty one)");
        }
        return one_dir(cli, run, device, apply);
    }
    let out = run_device_request(run, op, device, apply)?;
    let code = view::exit::outcome(out.class().as_str());
    if matches!(output, Output::Json | Output::Yaml) {
        print_value(output, &document(&[(device.to_owned(), out)], &[], op, apply, false))?;
        return Ok(code);
    }
    let judged = out.judged.is_some();
    let outcomes = [(device.to_owned(), out)];
    let text = outcomes_text(&outcomes, op, apply, !apply);
    say(&if judged { with_api_line(&text, run) } else { text })?;
    unsupported(&outcomes[0].1)?;
    Ok(code)
}

/// `clean` of one pod volume directory. Prints the report; returns the exit code.
fn one_dir(cli: &Cli, run: &mut OneShot, arg: &str, apply: bool) -> Result<u8> {
    let output = cli.output;
    let out = super::dir_requests::run_dir_request(run, arg, apply)?;
    let code = view::exit::outcome(out.class().as_str());
    if matches!(output, Output::Json | Output::Yaml) {
        print_value(output, &document(&[], &[(arg.to_owned(), out)], Operation::Clean, apply, false))?;
        return Ok(code);
    }
    say(&with_api_line(&super::dir_requests::dir_text(&out, arg), run))?;
    Ok(code)
}

/// The document of some outcomes (devices', then pod volume directories'): `results` once
/// carried out, else `plans`. `shown`: the plans were shown before they were carried out (the
/// `apply` command, as agentctl's `apply --yes` shows the agent's Plan answer first): the
/// results' `planned` lists them, as agentctl's does.
fn document(
    outcomes: &[(String, Outcome)],
    dirs: &[(String, DirOutcome)],
    op: Operation,
    applied: bool,
    shown: bool,
) -> serde_json::Value {
    let (plans, results) = answers(outcomes, dirs, op, applied);
    if applied {
        let planned = if shown { results.plans.clone() } else { Vec::new() };
        view::doc::results_doc(&planned, &results)
    } else {
        view::doc::plans_doc(&plans)
    }
}

/// Some outcomes (devices', then pod volume directories') as the Plan answer (a dry run) or the
/// Apply answer (carried out) the gRPC service would give; the other one is empty.
fn answers(
    outcomes: &[(String, Outcome)],
    dirs: &[(String, DirOutcome)],
    op: Operation,
    applied: bool,
) -> (pb::PlanResponse, pb::ApplyResponse) {
    let mut plans = pb::PlanResponse::default();
    let mut results = pb::ApplyResponse::default();
    for (arg, out) in dirs {
        super::dir_requests::add_to(&mut plans, &mut results, out, arg, applied);
    }
    if applied {
        add_results(&mut results, outcomes, op);
    } else {
        add_plans(&mut plans, outcomes, op);
    }
    (plans, results)
}

/// The devices a `plan` or `apply` is for: those named, else every stale device (from a scan
/// of its own; a release needs the devices named).
fn targets(run: &mut OneShot, op: Operation, named: &[String]) -> Result<Vec<String>> {
    if !named.is_empty() {
        return Ok(named.to_vec());
    }
    if op == Operation::Release {
        anyhow::bail!("a release plan needs the devices named");
    }
    run.stale_devices()
}

/// `plan` (`yes` false, `apply` false) and `apply` (`apply` true): every device through the one
/// request workflow, as a dry run unless `apply && yes`. `apply` without `--yes` shows the plans
/// and refuses, as agentctl's does. Returns the worst exit code.
pub fn plan_or_apply(
    cli: &Cli,
    run: &mut OneShot,
    op: Operation,
    named: &[String],
    apply: bool,
    yes: bool,
) -> Result<u8> {
    let output = cli.output;
    let carried = apply && yes;
    let (dir_args, device_args): (Vec<String>, Vec<String>) =
        named.iter().cloned().partition(|a| run.is_dir_argument(a));
    if op == Operation::Release && !dir_args.is_empty() {
        anyhow::bail!("{} is a pod volume directory: release applies to devices", dir_args[0]);
    }
    let mut outcomes = Vec::new();
    if named.is_empty() || !device_args.is_empty() {
        for device in targets(run, op, &device_args)? {
            let out = run_device_request(run, op, &device, carried)?;
            outcomes.push((device, out));
        }
    }
    let dir_args = if named.is_empty() && op == Operation::Clean { run.removable_dirs() } else { dir_args };
    let mut dirs = Vec::new();
    for arg in dir_args {
        let out = super::dir_requests::run_dir_request(run, &arg, carried)?;
        dirs.push((arg, out));
    }
    let worst = |c, class: OutcomeClass| view::exit::worst(c, view::exit::outcome(class.as_str()));
    let code = outcomes.iter().fold(view::exit::DONE, |c, (_, o)| worst(c, o.class()));
    let mut code = dirs.iter().fold(code, |c, (_, o)| worst(c, o.class()));
    if matches!(output, Output::Json | Output::Yaml) {
        print_value(output, &document(&outcomes, &dirs, op, carried, true))?;
    } else if outcomes.is_empty() && dirs.is_empty() {
        say(&api_header(run))?;
        say(if named.is_empty() { "no stale devices: nothing to do\n" } else { "nothing to do\n" })?;
    } else {
        let mut text =
            if outcomes.is_empty() { String::new() } else { outcomes_text(&outcomes, op, carried, false) };
        text.extend(dirs.iter().map(|(arg, out)| super::dir_requests::dir_text(out, arg)));
        if outcomes.iter().any(|(_, o)| o.judged.is_some()) || !dirs.is_empty() {
            text = with_api_line(&text, run);
        }
        say(&text)?;
    }
    for (_, out) in &outcomes {
        unsupported(out)?;
    }
    if apply && !yes {
        eprintln!("{}", view::exit::NOT_CONFIRMED);
        code = view::exit::worst(view::exit::NOT_DONE, code);
    }
    Ok(code)
}
