//! The one-shot commands: scan, holders, journal and the others, each through the engine
//! (`release`, `clean`, `plan` and `apply` through its one request workflow, [`super::requests`]),
//! printed as text, or as the JSON/YAML documents agentctl prints.

use super::args::*;
use super::output::{print_value, say};
use super::serve::serve;
use super::settings::*;
use super::{output, requests};
use crate::act::journal;
use crate::discover::{blockdev, mount_memo_file};
use crate::engine::outcome;
use crate::engine::view::View;
use crate::engine::Operation;
use crate::graph::scan::Target;
use crate::host::HostRoot;
use crate::model::DevNum;
use crate::plan;
use crate::server::convert;
use crate::{cli::render, graph::resolve};
use anyhow::{Context, Result};
use blockjanitor_rpc::view;

/// A judged scan as the view the daemon publishes (generation 0: a one-shot scan has none), so
/// that its devices convert as the daemon's do.
fn one_shot_view(judged: &crate::engine::Judged) -> View {
    View::of(judged.clone(), 0)
}

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

/// The device an operator named.
pub fn device_arg(host: &HostRoot, arg: &str) -> Result<DevNum> {
    let devices = blockdev::scan(host)?;
    Ok(resolve::device(host, &devices, arg)?.devnum)
}

pub fn run(cli: &Cli) -> Result<u8> {
    output::set_quiet(cli.quiet);
    let host = host(cli);
    let mut state = StateFile::load(cli, &host);
    match &cli.command {
        Command::Scan { output } => {
            let memo = report_only_memo(cli, &host);
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            let judged = e.judge(e.scan(Target::All)?, &mut state.clocks);
            state.save();
            if let Some(mut m) = memo {
                m.save();
            }
            let incomplete = outcome::incomplete_view(&judged.scan, None);
            match output {
                Output::Json | Output::Yaml => {
                    let v = one_shot_view(&judged);
                    let r =
                        convert::devices_response(&v, v.devices.iter().map(|d| convert::device(d)).collect());
                    print_value(*output, &view::doc::devices_doc(&r))?
                }
                Output::Table | Output::Wide => {
                    if let Some(line) = &incomplete {
                        say(&format!("{line}\n"))?;
                    }
                    say(&render::scan_table(&judged))?
                }
            }
            Ok(if incomplete.is_some() { EXIT_UNKNOWN } else { 0 })
        }
        Command::Holders { device, output } => {
            let devnum = device_arg(&host, device)?;
            let memo = report_only_memo(cli, &host);
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            // The scan a cleanup of it would rest on: what its removal takes with it (an NVMe
            // controller's other namespaces, a session's other disks) is looked at too.
            let judged = e.judge(e.plan_scan(devnum, Operation::Clean)?, &mut state.clocks);
            state.save();
            if let Some(mut m) = memo {
                m.save();
            }
            let incomplete =
                judged.scan.entry(devnum).and_then(|e| outcome::incomplete_view(&judged.scan, Some(e)));
            match output {
                Output::Json | Output::Yaml => {
                    let v = one_shot_view(&judged);
                    let d = v.devices.iter().find(|d| d.entry.device.devnum == devnum);
                    let d = d.ok_or(render::RenderError::Gone(devnum))?;
                    let r = convert::holders_response(&v, d, convert::device(d));
                    let device = r.device.clone().unwrap_or_default();
                    print_value(*output, &view::doc::device_doc(&device, &r))?
                }
                Output::Table | Output::Wide => {
                    if let Some(line) = &incomplete {
                        say(&format!("{line}\n"))?;
                    }
                    say(&render::holders_table(&judged, devnum)?)?
                }
            }
            // As `fuser -s`: held or free (kernel threads are symptoms, not holders); unknown
            // when nothing was seen holding it but a blind spot could hide a holder.
            let held = judged.scan.entry(devnum).is_some_and(|e| !e.holders.is_empty());
            Ok(if held {
                EXIT_HELD
            } else if incomplete.is_some() {
                EXIT_UNKNOWN
            } else {
                0
            })
        }
        Command::Release { device, apply, force_busy, output } => {
            let mut e = engine(cli, host, plan::clean::CleanOptions::default());
            e.settings.release = plan::release::ReleaseOptions { force_busy: force_busy.clone() };
            requests::one_request(cli, &e, &mut state, Operation::Release, device, *apply, *output)
        }
        Command::Clean { device, apply, deferred_remove, force, output } => {
            let clean = plan::clean::CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            let e = engine(cli, host, clean);
            requests::one_request(cli, &e, &mut state, Operation::Clean, device, *apply, *output)
        }
        Command::Plan { devices, release, output } => {
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            requests::many(cli, &e, &mut state, operation(*release), devices, false, false, *output)
        }
        Command::Apply { devices, release, yes, output } => {
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            requests::many(cli, &e, &mut state, operation(*release), devices, true, *yes, *output)
        }
        Command::Serve(args) => serve(cli, args, host),
        Command::Journal { output } => {
            let path = journal_path(cli);
            let pending =
                journal::pending(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let plans =
                journal::open_plans(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let plans: Vec<JournalPlan> = plans.iter().map(JournalPlan::of).collect();
            if matches!(output, Output::Json | Output::Yaml) {
                let body = serde_json::json!({
                    "journal": path.display().to_string(),
                    "pending": pending,
                    "plans": plans.iter().map(|p| serde_json::json!({
                        "plan_id": p.id, "operation": p.op, "argument": p.arg,
                        "finished": p.finished, "total": p.total,
                    })).collect::<Vec<_>>(),
                });
                print_value(*output, &view::doc::envelope(view::doc::JOURNAL, body))?;
                return Ok(0);
            }
            if pending.is_empty() && plans.is_empty() {
                say(&format!("no unfinished steps in {}\n", path.display()))?;
            }
            for p in pending {
                say(&format!("unfinished: {p}\n"))?;
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
        let word = |ptr: &str| p.record.pointer(ptr).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
        Self {
            id: p.id.clone(),
            op: word("/request/operation"),
            arg: word("/request/argument"),
            finished: p.finished.len(),
            total: p.record.get("steps").and_then(|v| v.as_array()).map_or(0, Vec::len),
        }
    }
}
