//! `agentctl fleet` (and `kubectl blockjanitor`): one question to the fleet console, printed;
//! `fleet plan` asks each node's plan through it, `fleet apply` shows the dry run, asks, then
//! carries it out.

use std::time::Duration;

use crate::kubectl::ConsoleChannel;
use anyhow::{bail, Context, Result};
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::client;

use super::args::Cli;
use super::fleet_args::FleetCommand;
use super::output::{render, status, write_out};
use crate::{fleet_apply, time};

/// One question to the fleet console.
pub(crate) async fn fleet(
    cli: &Cli,
    command: &FleetCommand,
    channel: ConsoleChannel,
    object_namespace: &str,
) -> Result<u8> {
    use crate::fleet_render as fr;
    use blockjanitor_proto::v1::fleet_client::FleetClient;
    let timeout = Duration::from_secs(cli.timeout);
    let mut c = FleetClient::new(channel).max_decoding_message_size(64 << 20);
    let out = cli.output;
    let text = match command {
        FleetCommand::Nodes => {
            let r = client::call(timeout, c.list_nodes(client::request(pb::ListNodesRequest {}, timeout)))
                .await
                .map_err(status)?;
            render(out, || fr::nodes_value(&r), || fr::nodes_table(&r, time::now_secs()))?
        }
        FleetCommand::Devices { filter, node, fresh } => {
            let (kind, verdict) = filter.wire();
            let req = pb::FleetListDevicesRequest {
                kind,
                verdict,
                node: node.clone().unwrap_or_default(),
                fresh: *fresh,
                paged: true,
                ..Default::default()
            };
            let all = all_devices(&mut c, req, timeout).await?;
            render(out, || fr::devices_value(&all), || fr::devices_table(&all))?
        }
        FleetCommand::Where { what, fresh } => {
            let req = pb::WhereRequest { query: what.clone(), fresh: *fresh, ..Default::default() };
            let r = client::call(timeout, c.r#where(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::where_value(&r), || fr::where_table(&r))?
        }
        FleetCommand::WhoWatches { watcher, fresh } => {
            let req =
                pb::WhoWatchesRequest { fresh: *fresh, text: watcher_text(watcher)?, ..Default::default() };
            let r = who_watches(&mut c, req, timeout).await?;
            render(out, || fr::who_watches_value(&r), || fr::who_watches_table(&r))?
        }
        FleetCommand::Multiattach { volume: None } => {
            let req = pb::MultiAttachRequest::default();
            let r =
                client::call(timeout, c.multi_attach(client::request(req, timeout))).await.map_err(status)?;
            write_out(&render(out, || fr::multiattach_value(&r), || fr::multiattach_table(&r))?)?;
            return Ok(r.sweep.as_ref().map_or(1, sweep_exit_code));
        }
        FleetCommand::Multiattach { volume: Some(volume) } => {
            let req = multiattach_request(volume);
            let r =
                client::call(timeout, c.multi_attach(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::multiattach_value(&r), || fr::multiattach_table(&r))?
        }
        FleetCommand::Apply { devices, identity, yes } => {
            return fleet_apply(&mut c, cli, devices, identity, *yes).await;
        }
        FleetCommand::Sweep { kind, fresh } => {
            let req = pb::SweepRequest { fresh: *fresh, kinds: kind.iter().map(|k| *k as i32).collect() };
            let r = client::call(timeout, c.sweep(client::request(req, timeout))).await.map_err(status)?;
            write_out(&render(out, || fr::sweep_value(&r), || fr::sweep_table(&r))?)?;
            return Ok(sweep_exit_code(&r));
        }
        FleetCommand::Plan { targets } => return fleet_plan(&mut c, cli, targets).await,
        FleetCommand::PinRisks { node, page_token, page_size } => {
            return fleet_pin_risks(&mut c, cli, node.as_deref(), page_token.as_deref(), *page_size).await;
        }
        FleetCommand::Explain { object } => {
            return fleet_explain(&mut c, cli, object, object_namespace).await
        }
    };
    write_out(&text)?;
    Ok(0)
}

/// Every device the fleet lists for `req`, page by page (a fleet's devices do not fit in one
/// message): the first page asks `fresh`, the last one's missing nodes are said.
async fn all_devices(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    mut req: pb::FleetListDevicesRequest,
    timeout: Duration,
) -> Result<pb::FleetListDevicesResponse> {
    let mut all = pb::FleetListDevicesResponse::default();
    loop {
        let r = client::call(timeout, c.list_devices(client::request(req.clone(), timeout)))
            .await
            .map_err(status)?;
        all.devices.extend(r.devices);
        all.missing_nodes = r.missing_nodes;
        if r.next_page_token.is_empty() {
            break;
        }
        req.page_token = r.next_page_token;
        req.fresh = false;
    }
    Ok(all)
}

/// The watcher text `fleet who-watches` asks about: stdin's for `-`, else the argument.
fn watcher_text(watcher: &str) -> Result<String> {
    if watcher == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
            .context("cannot read the watcher text from stdin")?;
        Ok(text)
    } else {
        // Whatever was pasted (an address with or without its v1:/v2: prefix, a vector, a
        // client id, a `rbd status` or `ceph osd blocklist ls` line): the console parses
        // it and refuses what it does not understand (INVALID_ARGUMENT, exit non-zero).
        Ok(watcher.to_owned())
    }
}

/// The multi-attach question about one volume: `pv/NAME`, `pvc/NAME`, a `NAMESPACE/CLAIM`, or a
/// bare PV name.
fn multiattach_request(volume: &str) -> pb::MultiAttachRequest {
    let mut req = pb::MultiAttachRequest::default();
    if let Some(pv) = volume.strip_prefix("pv/") {
        req.pv = pv.to_owned();
    } else if let Some(pvc) = volume.strip_prefix("pvc/") {
        req.pvc = pvc.to_owned();
    } else if volume.contains('/') {
        req.pvc = volume.to_owned();
    } else {
        req.pv = volume.to_owned();
    }
    req
}

/// `fleet pin-risks`: the pin risks the console lists (one page when a page token is given,
/// else all of them, merged), printed, with [`crate::fleet_pins::exit_code`].
async fn fleet_pin_risks(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    cli: &Cli,
    node: Option<&str>,
    page_token: Option<&str>,
    page_size: u32,
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let req = pb::ListPinRisksRequest {
        node: node.unwrap_or_default().to_owned(),
        page_size,
        page_token: page_token.unwrap_or_default().to_owned(),
    };
    let pages = pin_risk_pages(c, req, page_token.is_some(), timeout).await?;
    let r = crate::fleet_pins::merged(pages);
    let shown = crate::fleet_pins::pin_risks_value(&r);
    write_out(&render(cli.output, || shown, || crate::fleet_pins::pin_risks_table(&r))?)?;
    Ok(crate::fleet_pins::exit_code(&r))
}

/// The pages of pin risks from `req`'s page on: that one alone with `one_page` (a page token
/// was given), else every page to the last.
async fn pin_risk_pages(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    mut req: pb::ListPinRisksRequest,
    one_page: bool,
    timeout: Duration,
) -> Result<Vec<pb::ListPinRisksResponse>> {
    let mut pages = Vec::new();
    loop {
        let r = client::call(timeout, c.list_pin_risks(client::request(req.clone(), timeout)))
            .await
            .map_err(status)?;
        let next = r.next_page_token.clone();
        pages.push(r);
        if next.is_empty() || one_page {
            break;
        }
        req.page_token = next;
    }
    Ok(pages)
}

/// WhoWatches through the stream (a paste of thousands of lines is answered in parts), or in
/// one answer from a console older than the stream.
async fn who_watches(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    req: pb::WhoWatchesRequest,
    timeout: Duration,
) -> Result<pb::WhoWatchesResponse> {
    let stream = client::call(timeout, c.who_watches_stream(client::request(req.clone(), timeout))).await;
    let mut stream = match stream {
        Ok(s) => s,
        Err(s) if s.code() == tonic::Code::Unimplemented => {
            return client::call(timeout, c.who_watches(client::request(req, timeout))).await.map_err(status);
        }
        Err(s) => return Err(status(s)),
    };
    let mut all = pb::WhoWatchesResponse::default();
    while let Some(part) = tokio::time::timeout(timeout, stream.message())
        .await
        .map_err(|_| anyhow::anyhow!("the console's answer did not end within {timeout:?}"))?
        .map_err(status)?
    {
        all.watchers.extend(part.watchers);
        if !part.missing_nodes.is_empty() {
            all.missing_nodes = part.missing_nodes;
        }
    }
    Ok(all)
}

/// `fleet apply`: identities (given, or from each node's plan now), the console's dry run shown,
/// then, with `yes`, the same request carried out (without it, nothing: as both CLIs' `apply`).
pub(crate) async fn fleet_apply(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    cli: &Cli,
    devices: &[String],
    identity: &[String],
    yes: bool,
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let out = cli.output;
    let targets = fleet_apply::fleet_targets(devices).map_err(anyhow::Error::msg)?;
    let identities: Vec<Vec<String>> = if identity.is_empty() {
        let mut all = Vec::new();
        for (node, devs) in &targets {
            let req = pb::FleetPlanRequest { node: node.clone(), devices: devs.clone() };
            let p = client::call(timeout, c.plan(client::request(req, timeout))).await.map_err(status)?;
            let plans = p.plan.unwrap_or_default().plans;
            all.push(
                devs.iter()
                    .map(|d| {
                        plans.iter().find(|p| &p.device == d).map(|p| p.identity.clone()).unwrap_or_default()
                    })
                    .collect(),
            );
        }
        all
    } else {
        // Given in argument order: hand them out to the devices as they were named.
        if identity.len() != devices.len() {
            bail!(
                "{} --identity for {} devices: give one per NODE/DEVICE, in the same order",
                identity.len(),
                devices.len()
            );
        }
        let mut given = devices.iter().zip(identity).collect::<Vec<_>>();
        targets
            .iter()
            .map(|(node, devs)| {
                devs.iter()
                    .map(|d| {
                        let at = given.iter().position(|(a, _)| **a == format!("{node}/{d}")).unwrap_or(0);
                        given.remove(at).1.clone()
                    })
                    .collect()
            })
            .collect()
    };
    let request = fleet_apply::fleet_apply_request(&targets, &identities, false);
    let dry =
        client::call(timeout, c.apply(client::request(request.clone(), timeout))).await.map_err(status)?;
    if !write_out(&render(
        out,
        || fleet_apply::fleet_apply_value(&dry),
        || fleet_apply::fleet_summary_table(&dry),
    )?)? {
        return Ok(2);
    }
    if fleet_apply::fleet_dry_run_refuses(&dry) {
        eprintln!("nothing ran: the dry run refuses (see above)");
        // The dry run's own code (held, unknown, refused, error); "nothing to do" on a node
        // still means nothing ran here.
        return Ok(crate::exit::worst(crate::exit::NOT_DONE, fleet_apply::fleet_dry_run_exit(&dry)));
    }
    if let Some(why) = crate::fleet_plan::over_budget(&dry) {
        eprintln!("nothing ran: {why}");
        return Ok(crate::exit::REFUSED);
    }
    if !yes {
        // As `agentctl apply` and `blockjanitor-agent apply`: the dry run, and no question.
        eprintln!("{}", crate::exit::NOT_CONFIRMED);
        return Ok(crate::exit::NOT_DONE);
    }
    let request = pb::FleetApplyRequest { execute: true, ..request };
    // Carrying out may take a while: the agents' own bound.
    let long = timeout.max(Duration::from_secs(300));
    let done = client::call(long, c.apply(client::request(request, long))).await.map_err(status)?;
    write_out(&render(
        out,
        || fleet_apply::fleet_apply_value(&done),
        || fleet_apply::fleet_results_table(&done),
    )?)?;
    Ok(if fleet_apply::fleet_all_done(&done) { 0 } else { 2 })
}

/// `fleet explain`: the console's explanation of `object` in `namespace`, printed; its exit
/// code is the outcome's (2 blocked, 0 not blocked, 3 unknown).
pub(crate) async fn fleet_explain(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    cli: &Cli,
    object: &str,
    namespace: &str,
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let (kind, name) = explain_object(object)?;
    let req = pb::ExplainRequest { kind, name, namespace: namespace.to_owned() };
    let r = client::call(timeout, c.explain(client::request(req, timeout))).await.map_err(status)?;
    let now = time::now_secs();
    write_out(&render(
        cli.output,
        || crate::explain::explanation_doc(&r),
        || crate::explain::explanation_table(&r, now),
    )?)?;
    Ok(crate::exit::explain(r.outcome))
}

/// `pod/NAME`, `pvc/NAME`, `pv/NAME` (kubectl's forms and resource names; a bare NAME is a pod)
/// as the request's kind and name.
pub(crate) fn explain_object(object: &str) -> Result<(String, String)> {
    let (kind, name) = object.split_once('/').unwrap_or(("pod", object));
    let kind = match kind.to_ascii_lowercase().as_str() {
        "pod" | "pods" | "po" => "pod",
        "pvc" | "persistentvolumeclaim" | "persistentvolumeclaims" => "pvc",
        "pv" | "persistentvolume" | "persistentvolumes" => "pv",
        other => bail!("explain takes pod/NAME, pvc/NAME or pv/NAME, not '{other}/...'"),
    };
    if name.is_empty() || name.contains('/') {
        bail!("'{object}' is not pod/NAME, pvc/NAME or pv/NAME");
    }
    Ok((kind.to_owned(), name.to_owned()))
}

/// A sweep's exit code: 0 clean (complete, nothing found), 2 findings, 3 incomplete.
pub(crate) fn sweep_exit_code(r: &pb::SweepResponse) -> u8 {
    match (r.complete, r.findings.is_empty()) {
        (false, _) => 3,
        (true, false) => 2,
        (true, true) => 0,
    }
}

/// `fleet plan`: each node's plan through the console (as the caller: the console's per-caller
/// limit counts it), summarised per node as `fleet apply` shows its dry run. Every node is asked
/// even when one fails; its failure is its refusal.
pub(crate) async fn fleet_plan(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<ConsoleChannel>,
    cli: &Cli,
    targets: &[String],
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let targets = crate::fleet_plan::plan_targets(targets).map_err(anyhow::Error::msg)?;
    let mut summary = Vec::new();
    for (node, devices) in &targets {
        let req = pb::FleetPlanRequest { node: node.clone(), devices: devices.clone() };
        let plan = client::call(timeout, c.plan(client::request(req, timeout)))
            .await
            .map(|p| p.plan.unwrap_or_default())
            .map_err(|s| client::status_line(&s));
        summary.push(crate::fleet_plan::summarise(node, devices, plan));
    }
    let r = pb::FleetApplyResponse { summary, ..Default::default() };
    write_out(&render(
        cli.output,
        || fleet_apply::fleet_apply_value(&r),
        || fleet_apply::fleet_summary_table(&r),
    )?)?;
    Ok(fleet_apply::fleet_dry_run_exit(&r))
}
