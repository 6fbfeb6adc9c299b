//! The commands that ask one node's agent (`node`, `devices`, `device`, `holders`, `plan`,
//! `apply`, `watch`): one call each (`apply --yes`: a Plan, shown, then the Apply bound to the
//! identities it answered; `watch`: a stream), printed in the chosen format.

use std::time::Duration;

use anyhow::{bail, Result};
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_rpc::client::{self, Target};
use tonic::transport::Channel;

use super::args::{Cli, Command, Output};
use super::output::{apply_status, render, status, write_out};
use crate::{apply, doc, exit, format, holders, plan, scan, term, text, time};
use blockjanitor_rpc::path_device::{self, PathDeviceError};

/// One command against the agent at `target`; its exit code.
pub(crate) async fn run_async(cli: &Cli, target: &Target) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let mut c: AgentClient<Channel> = client::connect(target, timeout).await?;
    let out = cli.output;
    match &cli.command {
        Command::Completions { .. } | Command::Fleet { .. } => Ok(0),
        Command::Node => {
            let n = client::call(timeout, c.get_node(client::request(pb::GetNodeRequest {}, timeout)))
                .await
                .map_err(status)?;
            write_out(&render(out, || doc::node_doc(&n), || text::node_table(&n, time::now_secs()))?)?;
            Ok(0)
        }
        Command::Scan { filter, layout } => {
            // Every device: the filter is applied here, as the agent's own `scan` applies it, so
            // the table can say how many it left out.
            let r = pb::ListDevicesRequest::default();
            let mut r =
                client::call(timeout, c.list_devices(client::request(r, timeout))).await.map_err(status)?;
            if matches!(out, Output::Table | Output::Wide) {
                for w in scan::warnings(&r) {
                    eprintln!("{w}");
                }
                let style =
                    scan::ScanStyle { filter, layout, wide: out == Output::Wide, term: term::Term::stdout() };
                write_out(&scan::report(&r, &style))?;
            } else {
                r.devices.retain(|d| filter.matches(d));
                write_out(&render(out, || doc::devices_doc(&r), String::new)?)?;
            }
            Ok(if r.incomplete_view.is_empty() { exit::DONE } else { exit::UNKNOWN })
        }
        Command::Device { device } => {
            // ListHolders, not GetDevice: its answer carries the scan's context (warnings, blind
            // spots, the INCOMPLETE VIEW line) the `device` document has.
            show_device(&mut c, timeout, out, device, true).await?;
            Ok(0)
        }
        Command::Holders { devices, verbose } => show_holders(&mut c, timeout, out, devices, *verbose).await,
        Command::Plan { devices, release } => {
            let r = pb::PlanRequest { devices: devices.clone(), operation: operation(*release) as i32 };
            let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(out, || doc::plans_doc(&r), || plan::plans_table(&r, devices.is_empty()))?)?;
            Ok(exit::plans(&r.plans))
        }
        Command::Apply { devices, yes: false, release, .. } => {
            let r = pb::PlanRequest { devices: devices.clone(), operation: operation(*release) as i32 };
            let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(out, || doc::plans_doc(&r), || plan::plans_table(&r, devices.is_empty()))?)?;
            eprintln!("{}", exit::NOT_CONFIRMED);
            Ok(exit::worst(exit::NOT_DONE, exit::plans(&r.plans)))
        }
        Command::Release { device, apply } => {
            one_device(&mut c, timeout, out, pb::Operation::Release, device, *apply).await
        }
        Command::Clean { device, apply } => {
            one_device(&mut c, timeout, out, pb::Operation::Clean, device, *apply).await
        }
        Command::Apply { devices, yes: true, identities, release } => {
            let op = operation(*release);
            // Bound to identities: from --identity (planned earlier), else from a plan shown now.
            let (planned, request) = if identities.is_empty() {
                let r = pb::PlanRequest { devices: devices.clone(), operation: op as i32 };
                let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
                if matches!(out, Output::Table | Output::Wide) {
                    write_out(&format!("{}\n", plan::plans_table(&r, false)))?;
                }
                if r.plans.is_empty() && devices.is_empty() {
                    // Every stale device was asked for, and there is none: nothing to do.
                    if !matches!(out, Output::Table | Output::Wide) {
                        write_out(&render(out, || doc::plans_doc(&r), String::new)?)?;
                    }
                    return Ok(exit::DONE);
                }
                if r.plans.is_empty() {
                    eprintln!("not applied: nothing was planned");
                    return Ok(exit::NOT_DONE);
                }
                let request = plan::apply_bound_to(&r, op);
                (r.plans, request)
            } else {
                let request =
                    plan::apply_with_identities(devices, identities, op).map_err(anyhow::Error::msg)?;
                (Vec::new(), request)
            };
            let r = client::call(timeout, c.apply(client::request(request, timeout)))
                .await
                .map_err(apply_status)?;
            write_out(&render(out, || doc::results_doc(&planned, &r), || apply::apply_table(&r))?)?;
            Ok(exit::worst(apply::apply_summary(&r).exit_code(), exit::plans(&r.plans)))
        }
        Command::Watch => watch(&mut c, timeout, out).await,
    }
}

/// `device` (`wide`: every detail) and `holders`: the agent's ListHolders for one device (its
/// answer carries the scan's context the `device` document has), printed; the answer, which has
/// the device.
async fn show_device(
    c: &mut AgentClient<Channel>,
    timeout: Duration,
    out: Output,
    device: &str,
    wide: bool,
) -> Result<pb::ListHoldersResponse> {
    let r = pb::ListHoldersRequest { device: device.to_owned() };
    let r = client::call(timeout, c.list_holders(client::request(r, timeout))).await.map_err(status)?;
    let Some(d) = &r.device else { bail!("the agent answered without the device") };
    write_out(&render(
        out,
        || doc::device_doc(d, &r),
        || text::incomplete_first(&r.incomplete_view, text::device_table(d, wide)),
    )?)?;
    Ok(r)
}

/// `holders DEV|PATH...`: a path that is not a device node resolved here, in agentctl's own
/// mount namespace (where the caller means it; the agent runs in the host's), to its
/// filesystem's device (`MAJ:MIN`); then the agent's ListHolders for each device, printed by the
/// renderer the one-shot agent's `holders` uses; the exit code of them all.
async fn show_holders(
    c: &mut AgentClient<Channel>,
    timeout: Duration,
    out: Output,
    args: &[String],
    verbose: bool,
) -> Result<u8> {
    let mut devices = Vec::new();
    for arg in args {
        let resolved = if is_path(arg) {
            match path_device::device_of_path(std::path::Path::new(arg)) {
                Ok(found) => found,
                // Not here (a /dev/rbd link only the host has): the agent names what it cannot find.
                Err(PathDeviceError::Stat { .. }) => None,
                Err(e) => bail!(e),
            }
        } else {
            None
        };
        // A name or a device node goes as it is; a path as its filesystem's device.
        devices.push(resolved.unwrap_or_else(|| arg.clone()));
    }
    let mut answers = Vec::new();
    for device in devices {
        let r = pb::ListHoldersRequest { device };
        let r = client::call(timeout, c.list_holders(client::request(r, timeout))).await.map_err(status)?;
        if r.device.is_none() {
            bail!("the agent answered without the device");
        }
        answers.push(r);
    }
    let codes = answers
        .iter()
        .map(|r| r.device.as_ref().map_or(exit::ERROR, |d| exit::holders(d, &r.incomplete_view)));
    let code = exit::holders_many(codes);
    let text = match out {
        Output::Table | Output::Wide => holders::holders_texts(&answers, verbose, ""),
        Output::Json | Output::Yaml => {
            let docs: Vec<_> =
                answers.iter().map(|r| doc::device_doc(&r.device.clone().unwrap_or_default(), r)).collect();
            format::documents(matches!(out, Output::Yaml), &docs)?
        }
    };
    write_out(&text)?;
    Ok(code)
}

/// Whether `arg` is a path (`/...`, `./...`, `.`) rather than a device's name.
fn is_path(arg: &str) -> bool {
    arg.starts_with('/') || arg.starts_with("./") || arg.starts_with("../") || arg == "." || arg == ".."
}

/// `release`/`clean DEVICE`: the agent's Plan for one device (a dry run), or with `apply` its
/// Apply (the agent re-plans it from a fresh scan and re-checks every step), as the one-shot
/// agent's command of the same name does.
async fn one_device(
    c: &mut AgentClient<Channel>,
    timeout: Duration,
    out: Output,
    op: pb::Operation,
    device: &str,
    apply: bool,
) -> Result<u8> {
    let devices = vec![device.to_owned()];
    if !apply {
        let r = pb::PlanRequest { devices, operation: op as i32 };
        let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
        write_out(&render(out, || doc::plans_doc(&r), || plan::dry_run_table(&r))?)?;
        return Ok(exit::plans(&r.plans));
    }
    let r = pb::ApplyRequest { devices, identities: Vec::new(), operation: op as i32 };
    let r = client::call(timeout, c.apply(client::request(r, timeout))).await.map_err(apply_status)?;
    write_out(&render(out, || doc::results_doc(&[], &r), || apply::apply_table(&r))?)?;
    Ok(exit::worst(apply::apply_summary(&r).exit_code(), exit::plans(&r.plans)))
}

/// The operation `--release` asks for (else a cleanup).
pub(crate) fn operation(release: bool) -> pb::Operation {
    if release {
        pb::Operation::Release
    } else {
        pb::Operation::Clean
    }
}

/// Streams events until Ctrl-C, the agent ends the stream, or stdout is closed.
pub(crate) async fn watch(c: &mut AgentClient<Channel>, timeout: Duration, out: Output) -> Result<u8> {
    let mut stream =
        client::call(timeout, c.watch_events(pb::WatchEventsRequest {})).await.map_err(status)?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            _ = &mut ctrl_c => return Ok(0),
            m = stream.message() => m.map_err(status)?,
        };
        let Some(e) = event else {
            eprintln!("the agent ended the stream");
            return Ok(0);
        };
        let text = match out {
            Output::Table | Output::Wide => text::event_line(&e) + "\n",
            Output::Json => format::json_line(&doc::event_doc(&e))?,
            Output::Yaml => format::yaml_doc(&doc::event_doc(&e))?,
        };
        if !write_out(&text)? {
            return Ok(0);
        }
    }
}
