//! The one-shot commands: scan, holders, journal and the others, each a request to the engine
//! ([`crate::engine::requests`]; `release`, `clean`, `plan` and `apply` through its one request
//! workflow, [`super::requests`]), printed as text, or as the JSON/YAML documents agentctl
//! prints; what each answer means as an exit code is said here and in the modules it calls.

use super::args::*;
use super::output::{print_value, say};
use super::serve::serve;
use super::settings::*;
use super::{output, requests};
use crate::engine::requests::journal;
use crate::engine::{wire, Operation};
use crate::model::opt_ins::{CleanOptions, ReleaseOptions};
use anyhow::{Context, Result};
use blockjanitor_rpc::view;

/// The operation `--release` asks for (else a cleanup).
fn operation(release: bool) -> Operation {
    if release {
        Operation::Release
    } else {
        Operation::Clean
    }
}

/// `scan`: every device judged (those `filter` lets through), then the pin risks and the
/// orphaned pod volume directories; as text, through the renderer agentctl's `scan` uses, from
/// the same messages.
fn scan(cli: &Cli, filter: &view::choices::DeviceFilter, layout: &view::columns::ScanLayout) -> Result<u8> {
    let output = cli.output;
    let answer = one_shot(cli, settings(cli)).scan()?;
    let v = &answer.view;
    match output {
        Output::Json | Output::Yaml => {
            // The same filter as the daemon's ListDevices, on the same messages.
            let shown = answer.devices.into_iter().filter(|d| filter.matches(d)).collect();
            print_value(output, &view::doc::devices_doc(&wire::devices_response(v, shown)))?
        }
        Output::Table | Output::Wide => {
            let r = wire::devices_response(v, answer.devices);
            output::warn_lines(&view::scan::warnings(&r));
            view::table::set_wide(output == Output::Wide);
            let term = view::term::Term::stdout();
            let style = view::scan::ScanStyle { filter, layout, wide: output == Output::Wide, term };
            say(&view::scan::report(&r, &style))?
        }
    }
    Ok(if answer.incomplete { EXIT_UNKNOWN } else { 0 })
}

pub fn run(cli: &Cli) -> Result<u8> {
    output::set_quiet(cli.quiet);
    match &cli.command {
        Command::Scan { filter, layout } => scan(cli, filter, layout),
        Command::Holders { devices, verbose } => super::holders::holders(cli, devices, *verbose),
        Command::Release { device, apply, force_busy } => {
            let mut s = settings(cli);
            s.release = ReleaseOptions { force_busy: force_busy.clone() };
            requests::one_request(cli, &mut one_shot(cli, s), Operation::Release, device, *apply)
        }
        Command::Clean { device, apply, deferred_remove, force } => {
            let mut s = settings(cli);
            s.clean = CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            requests::one_request(cli, &mut one_shot(cli, s), Operation::Clean, device, *apply)
        }
        Command::Plan { devices, release } => {
            let mut run = one_shot(cli, settings(cli));
            requests::plan_or_apply(cli, &mut run, operation(*release), devices, false, false)
        }
        Command::Apply { devices, release, yes } => {
            let mut run = one_shot(cli, settings(cli));
            requests::plan_or_apply(cli, &mut run, operation(*release), devices, true, *yes)
        }
        Command::Serve(args) => serve(cli, args),
        Command::Journal => show_journal(cli),
    }
}

/// `journal`: the unfinished steps and plans of the journal.
fn show_journal(cli: &Cli) -> Result<u8> {
    let path = journal_path(cli);
    let answer = journal::unfinished(&path).with_context(|| format!("cannot read {}", path.display()))?;
    if matches!(cli.output, Output::Json | Output::Yaml) {
        let body = serde_json::json!({
            "journal": path.display().to_string(),
            "pending": answer.pending,
            "plans": answer.plans.iter().map(|p| serde_json::json!({
                "plan_id": p.id, "operation": p.operation, "argument": p.argument,
                "finished": p.finished, "total": p.total,
            })).collect::<Vec<_>>(),
        });
        print_value(cli.output, &view::doc::envelope(view::doc::JOURNAL, body))?;
        return Ok(0);
    }
    if !path.exists() {
        // Named plainly: a wrong --journal (the daemon's is its config's `journal`) would
        // otherwise read as "nothing unfinished".
        tracing::warn!(
            "there is no journal at {}: nothing was ever journaled there (the daemon's journal is its config's `journal`; --journal names another)",
            path.display()
        );
    }
    if answer.pending.is_empty() && answer.plans.is_empty() {
        say(&format!("no unfinished steps in {}\n", path.display()))?;
    }
    for p in answer.pending {
        say(&format!("unfinished: {}\n", serde_json::to_string(&p)?))?;
    }
    for p in answer.plans {
        say(&format!(
            "unfinished plan {}: {} '{}', {} of {} step(s) finished: run `{} {} --apply` again to finish it\n",
            p.id, p.operation, p.argument, p.finished, p.total, p.operation, p.argument
        ))?;
    }
    Ok(0)
}
