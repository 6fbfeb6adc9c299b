//! `holders DEV|PATH...`: each device judged from the scan a cleanup of it would rest on (the
//! engine's `holders` request, [`crate::engine::requests::show`]), answered as the `ListHolders`
//! answer the daemon gives agentctl, and printed by the one renderer both CLIs share
//! (`blockjanitor_rpc::view::holders`; JSON/YAML: the `device` document, one per device). A
//! path that is not a device node names the device its filesystem lives on (under `--root` as
//! /dev paths are). The exit code, as `fuser -s` tells a script: held, unknown or free.

use anyhow::Result;
use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view;

use super::args::{Cli, Output, EXIT_HELD, EXIT_UNKNOWN};
use super::output::{say, write_documents};
use super::settings::{host_spec, one_shot, settings};
use crate::engine::requests::show;

/// `holders`: every argument resolved first (one that names nothing is the error, nothing
/// printed), then each device judged and printed; the exit code of them all
/// ([`view::exit::holders_many`]).
pub fn holders(cli: &Cli, args: &[String], verbose: bool) -> Result<u8> {
    let output = cli.output;
    let spec = host_spec(cli);
    let devnums = args.iter().map(|a| show::device_argument(&spec, a)).collect::<Result<Vec<_>>>()?;
    let mut run = one_shot(cli, settings(cli));
    let found = run.holders(&devnums)?;
    // Held or free (kernel threads are symptoms, not holders); unknown when nothing was seen
    // holding it but a blind spot could hide a holder.
    let codes: Vec<u8> = found
        .iter()
        .map(|h| match (h.held, h.incomplete) {
            (true, _) => EXIT_HELD,
            (false, true) => EXIT_UNKNOWN,
            (false, false) => 0,
        })
        .collect();
    let answers: Vec<pb::ListHoldersResponse> = found.into_iter().map(|h| h.response).collect();
    match output {
        Output::Json | Output::Yaml => {
            let docs: Vec<serde_json::Value> = answers.iter().map(device_document).collect();
            write_documents(output, &docs)?
        }
        Output::Table | Output::Wide => {
            let api = super::requests::api_header(&run);
            say(&view::holders::holders_texts(&answers, verbose, &api))?
        }
    }
    Ok(view::exit::holders_many(codes))
}

/// The `device` document of one answer.
fn device_document(r: &pb::ListHoldersResponse) -> serde_json::Value {
    view::doc::device_doc(&r.device.clone().unwrap_or_default(), r)
}
