//! The one-shot commands: scan, holders, release, clean and the others, each through the engine
//! (`release` and `clean` through its one request workflow), printed as text or JSON.

use super::args::*;
use super::render::say_recovery;
use super::serve::serve;
use super::settings::*;
use crate::act::journal;
use crate::discover::blockdev;
use crate::engine::outcome::{self, Class, Request, Subject};
use crate::engine::view::View;
use crate::engine::world::LinuxWorld;
use crate::engine::{Engine, Operation};
use crate::graph::scan::Target;
use crate::host::HostRoot;
use crate::judge::grace::Clocks;
use crate::model::DevNum;
use crate::plan;
use crate::server::{convert, convert_outcome};
use crate::{cli::render, graph::resolve};
use anyhow::{Context, Result};
use blockjanitor_rpc::view;
use std::time::Duration;

/// `--quiet`: nothing goes to stdout (set once, from the flags).
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `text` to stdout, unless `--quiet`. A closed pipe (`| head`) is not an error.
fn say(text: &str) -> Result<()> {
    use std::io::Write;
    if QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(());
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("cannot write to stdout"),
        _ => Ok(()),
    }
}

/// A document as JSON (pretty) or YAML, as `--output` asks.
pub fn print_value(output: Output, v: &serde_json::Value) -> Result<()> {
    match output {
        Output::Yaml => say(&view::format::yaml(v)?),
        _ => say(&view::format::json(v)?),
    }
}

/// A judged scan as the view the daemon publishes (generation 0: a one-shot scan has none), so
/// that its devices convert as the daemon's do.
fn one_shot_view(judged: &crate::engine::Judged) -> View {
    View::of(judged.clone(), 0)
}

/// The device an operator named.
pub fn device_arg(host: &HostRoot, arg: &str) -> Result<DevNum> {
    let devices = blockdev::scan(host)?;
    Ok(resolve::device(host, &devices, arg)?.devnum)
}

pub fn run(cli: &Cli) -> Result<u8> {
    QUIET.store(cli.quiet, std::sync::atomic::Ordering::Relaxed);
    let host = host(cli);
    let mut state = StateFile::load(cli, &host);
    match &cli.command {
        Command::Scan { output } => {
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            let judged = e.judge(e.scan(Target::All)?, &mut state.clocks);
            state.save();
            let incomplete = outcome::incomplete_view(&judged.scan, None);
            match output {
                Output::Json | Output::Yaml => {
                    let v = one_shot_view(&judged);
                    let r = convert::devices_response(&v, v.devices.iter().map(convert::device).collect());
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
            let e = engine(cli, host, plan::clean::CleanOptions::default());
            // The scan a cleanup of it would rest on: what its removal takes with it (an NVMe
            // controller's other namespaces, a session's other disks) is looked at too.
            let judged = e.judge(e.plan_scan(devnum, Operation::Clean)?, &mut state.clocks);
            state.save();
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
            one_request(cli, &e, &mut state, Operation::Release, device, *apply, *output)
        }
        Command::Clean { device, apply, deferred_remove, force, output } => {
            let clean = plan::clean::CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            let e = engine(cli, host, clean);
            one_request(cli, &e, &mut state, Operation::Clean, device, *apply, *output)
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

/// `release` or `clean` of the device the operator named, through the one request workflow
/// ([`Engine::carry_out`]): with --apply, recovery and the unfinished plan this argument owes
/// come first, before the argument is resolved. Prints the report; returns the exit code.
pub fn one_request(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    device: &str,
    apply: bool,
    output: Output,
) -> Result<u8> {
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
    let class = out.class();
    if matches!(output, Output::Json | Output::Yaml) {
        let document = if out.applied {
            view::doc::results_doc(&[], &convert_outcome::outcome_results(&out, op, device))
        } else {
            view::doc::plans_doc(&convert_outcome::outcome_plans(&out, op, device))
        };
        print_value(output, &document)?;
        return Ok(class.exit_code());
    }
    // The one line a refusal before any step is (sight, may-act, the journal's lock).
    if let Some((_, why)) = &out.refusal {
        if out.plan.is_none() {
            say(&format!("{why}\n"))?;
            return Ok(class.exit_code());
        }
    }
    say(&render::outcome_text(&out, device))?;
    if class == Class::Error {
        if let Some(p) = out.plan.as_ref().filter(|p| p.unsupported) {
            anyhow::bail!("{}", p.refusal.as_deref().unwrap_or_default());
        }
    }
    Ok(class.exit_code())
}
