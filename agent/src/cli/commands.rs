//! The one-shot commands: scan, holders, journal and the others, each through the engine
//! (`release`, `clean`, `plan` and `apply` through its one request workflow, [`super::requests`]),
//! printed as text, or as the JSON/YAML documents agentctl prints.

use super::args::*;
use super::holders::one_shot_view;
use super::output::{print_value, say};
use super::serve::serve;
use super::settings::*;
use super::{output, requests};
use crate::act::journal;
use crate::discover::mount_memo_file;
use crate::engine::outcome;
use crate::engine::Operation;
use crate::graph::scan::Target;
use crate::host::HostRoot;
use crate::plan;
use crate::server::convert;
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

/// What `statmount` said of each mount, as an earlier report-only run of this boot kept it
/// (`--statmount-memo`): loaded here, by `holders` and `scan` alone, which only show. A command
/// that acts never calls this: its scans, and the re-check before each step, ask the kernel.
/// Not with `--mount-reader mountinfo` (which asks `statmount` nothing: the run would forget
/// every mount and write that).
fn report_only_memo(cli: &Cli, host: &HostRoot) -> Option<mount_memo_file::Kept> {
    mount_memo_file::Kept::load(host, statmount_memo_path(cli)?)
}

/// `scan`: every device judged (those `filter` lets through), then the pin risks and the
/// orphaned pod volume directories; as text, through the renderer agentctl's `scan` uses, from
/// the same messages.
fn scan(
    cli: &Cli,
    host: HostRoot,
    state: &mut StateFile<'_>,
    filter: &view::choices::DeviceFilter,
    layout: &view::columns::ScanLayout,
) -> Result<u8> {
    let output = cli.output;
    let memo = report_only_memo(cli, &host);
    let e = engine(cli, host, plan::clean::CleanOptions::default());
    let judged = e.judge(e.scan(Target::All)?, &mut state.clocks);
    let pod_volumes = std::sync::Arc::new(e.pod_volumes(&mut state.clocks));
    let pins = std::sync::Arc::new(e.world.pin_risks(None).unwrap_or_default());
    state.save();
    if let Some(mut m) = memo {
        m.save();
    }
    let incomplete = outcome::incomplete_view(&judged.scan, None);
    let mut v = one_shot_view(&judged);
    v.pod_volumes = pod_volumes;
    v.pin_risks = pins;
    let all: Vec<_> = v.devices.iter().map(|d| convert::device(d)).collect();
    match output {
        Output::Json | Output::Yaml => {
            // The same filter as the daemon's ListDevices, on the same messages.
            let shown = all.into_iter().filter(|d| filter.matches(d)).collect();
            print_value(output, &view::doc::devices_doc(&convert::devices_response(&v, shown)))?
        }
        Output::Table | Output::Wide => {
            let r = convert::devices_response(&v, all);
            output::warn_lines(&view::scan::warnings(&r));
            view::table::set_wide(output == Output::Wide);
            let term = view::term::Term::stdout();
            let style = view::scan::ScanStyle { filter, layout, wide: output == Output::Wide, term };
            say(&view::scan::report(&r, &style))?
        }
    }
    Ok(if incomplete.is_some() { EXIT_UNKNOWN } else { 0 })
}

pub fn run(cli: &Cli) -> Result<u8> {
    output::set_quiet(cli.quiet);
    let host = host(cli);
    let mut state = StateFile::load(cli, &host);
    match &cli.command {
        Command::Scan { filter, layout } => scan(cli, host, &mut state, filter, layout),
        Command::Holders { devices, verbose } => {
            let memo = report_only_memo(cli, &host);
            super::holders::holders(cli, host, &mut state, memo, devices, *verbose)
        }
        Command::Release { device, apply, force_busy } => {
            let mut e = engine(cli, host, plan::clean::CleanOptions::default());
            e.settings.release = plan::release::ReleaseOptions { force_busy: force_busy.clone() };
            requests::one_request(cli, &e, &mut state, Operation::Release, device, *apply)
        }
        Command::Clean { device, apply, deferred_remove, force } => {
            let clean = plan::clean::CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            let e = engine(cli, host, clean);
            requests::one_request(cli, &e, &mut state, Operation::Clean, device, *apply)
        }
        Command::Plan { devices, release } => {
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            requests::many(cli, &e, &mut state, operation(*release), devices, false, false)
        }
        Command::Apply { devices, release, yes } => {
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            requests::many(cli, &e, &mut state, operation(*release), devices, true, *yes)
        }
        Command::Serve(args) => serve(cli, args, host),
        Command::Journal => {
            let path = journal_path(cli);
            let pending =
                journal::pending(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let plans =
                journal::open_plans(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let plans: Vec<JournalPlan> = plans.iter().map(JournalPlan::of).collect();
            if matches!(cli.output, Output::Json | Output::Yaml) {
                let body = serde_json::json!({
                    "journal": path.display().to_string(),
                    "pending": pending,
                    "plans": plans.iter().map(|p| serde_json::json!({
                        "plan_id": p.id, "operation": p.op, "argument": p.arg,
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
            if pending.is_empty() && plans.is_empty() {
                say(&format!("no unfinished steps in {}\n", path.display()))?;
            }
            for p in pending {
                say(&format!("unfinished: {}\n", serde_json::to_string(&p)?))?;
            }
            for p in plans {
                say(&format!(
                    "unfinished plan {}: {} '{}', {} of {} step(s) finished: run `{} {} --apply` again to finish it\n",
                    p.id, p.op, p.arg, p.finished, p.total, p.op, p.arg
                ))?;
            }
            Ok(0)
        }
    }
}

/// An unfinished plan of the journal, as `journal` shows it.
struct JournalPlan {
    id: String,
    op: String,
    arg: String,
    finished: usize,
    total: usize,
}

impl JournalPlan {
    fn of(p: &journal::OpenPlan) -> Self {
        let word = |w: &str| if w.is_empty() { "?".to_owned() } else { w.to_owned() };
        let body = &p.record.body;
        Self {
            id: p.id.clone(),
            op: word(&body.request.operation),
            arg: word(&body.request.argument),
            finished: p.finished.len(),
            total: body.steps.len(),
        }
    }
}
