//! `holders DEV|PATH...`: each device judged from the scan a cleanup of it would rest on,
//! converted to the `ListHolders` answer the daemon gives agentctl, and printed by the one
//! renderer both CLIs share (`blockjanitor_rpc::view::holders`; JSON/YAML: the `device` document,
//! one per device). A path that is not a device node names the device its filesystem lives on
//! (`blockjanitor_rpc::path_device`, under `--root` as /dev paths are).

use std::path::Path;

use anyhow::{Context, Result};
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::path_device::{device_of_path, PathDeviceError};
use blockjanitor_rpc::view;

use super::args::{Cli, Output, EXIT_HELD, EXIT_UNKNOWN};
use super::output::{say, write_documents};
use super::settings::{engine, StateFile};
use crate::discover::{blockdev, mount_memo_file};
use crate::engine::view::View;
use crate::engine::{outcome, Operation};
use crate::graph::resolve;
use crate::host::HostRoot;
use crate::model::DevNum;
use crate::plan;
use crate::server::convert;

/// A judged scan as the view the daemon publishes (generation 0: a one-shot scan has none), so
/// that its devices convert as the daemon's do.
pub(super) fn one_shot_view(judged: &crate::engine::Judged) -> View {
    View::of(judged.clone(), 0)
}

/// The device an operator named.
pub fn device_arg(host: &HostRoot, arg: &str) -> Result<DevNum> {
    let devices = blockdev::scan(host)?;
    Ok(resolve::device(host, &devices, arg)?.devnum)
}

/// Whether `arg` is a path (`/...`, `./...`, `.`) rather than a device's name.
pub fn is_path(arg: &str) -> bool {
    arg.starts_with('/') || arg.starts_with("./") || arg.starts_with("../") || arg == "." || arg == ".."
}

/// The device `arg` names: a device (as before), or a path's filesystem's device as `MAJ:MIN`.
/// A path that does not exist is left to the device resolver (a /dev/rbd link udev did not make,
/// a fixture tree), which names what it could not find.
pub fn device_or_path(host: &HostRoot, arg: &str) -> Result<DevNum> {
    if is_path(arg) {
        let at = if arg.starts_with('/') { host.host_path(Path::new(arg)) } else { arg.into() };
        match device_of_path(&at) {
            Ok(Some(majmin)) => {
                return device_arg(host, &majmin).with_context(|| format!("{arg} is on device {majmin}"))
            }
            Ok(None) | Err(PathDeviceError::Stat { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    device_arg(host, arg)
}

/// `holders`: every argument resolved first (one that names nothing is the error, nothing
/// printed), then each device judged and printed (`memo`: the statmount memo, loaded by
/// `commands`, the one place that loads it, and saved here after the scans); the exit code of them all
/// ([`view::exit::holders_many`]).
pub fn holders(
    cli: &Cli,
    host: HostRoot,
    state: &mut StateFile<'_>,
    memo: Option<mount_memo_file::Kept>,
    args: &[String],
    verbose: bool,
) -> Result<u8> {
    let output = cli.output;
    let devnums = args.iter().map(|a| device_or_path(&host, a)).collect::<Result<Vec<_>>>()?;
    let e = engine(cli, host, plan::clean::CleanOptions::default());
    let mut answers = Vec::new();
    let mut codes = Vec::new();
    for devnum in devnums {
        // The scan a cleanup of it would rest on: what its removal takes with it (an NVMe
        // controller's other namespaces, a session's other disks) is looked at too.
        let judged = e.judge(e.plan_scan(devnum, Operation::Clean)?, &mut state.clocks);
        let entry = judged.scan.entry(devnum).ok_or(super::render::RenderError::Gone(devnum))?;
        let incomplete = outcome::incomplete_view(&judged.scan, Some(entry));
        // As `fuser -s`: held or free (kernel threads are symptoms, not holders); unknown when
        // nothing was seen holding it but a blind spot could hide a holder.
        codes.push(if !entry.holders.is_empty() {
            EXIT_HELD
        } else if incomplete.is_some() {
            EXIT_UNKNOWN
        } else {
            0
        });
        let v = one_shot_view(&judged);
        let d = v.devices.iter().find(|d| d.entry.device.devnum == devnum);
        let d = d.ok_or(super::render::RenderError::Gone(devnum))?;
        answers.push(convert::holders_response(&v, d, convert::device(d)));
    }
    state.save();
    if let Some(mut m) = memo {
        m.save();
    }
    match output {
        Output::Json | Output::Yaml => {
            let docs: Vec<serde_json::Value> = answers.iter().map(device_document).collect();
            write_documents(output, &docs)?
        }
        Output::Table | Output::Wide => {
            let api = super::kubernetes::header(&None, &e.world);
            say(&view::holders::holders_texts(&answers, verbose, &api))?
        }
    }
    Ok(view::exit::holders_many(codes))
}

/// The `device` document of one answer.
fn device_document(r: &pb::ListHoldersResponse) -> serde_json::Value {
    view::doc::device_doc(&r.device.clone().unwrap_or_default(), r)
}
