//! What agentctl's commands print and exit with: a response in the chosen format (table, JSON,
//! YAML), stdout that tolerates a closed pipe, a gRPC status as one line (a refusal exits 4).

use std::io::Write;

use anyhow::{Context, Result};
use blockjanitor_rpc::client;
use serde_json::Value;

use super::args::Output;

/// `--quiet`: nothing goes to stdout (set once, at start-up).
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Applies the output flags for the whole process: `-o wide` and `--quiet`.
pub(super) fn configure(output: Output, quiet: bool) {
    crate::table::set_wide(output == Output::Wide);
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}

/// Writes to stdout (nothing with `--quiet`); a closed pipe (`| head`) is not an error.
/// `Ok(false)` when it was closed.
pub(super) fn write_out(s: &str) -> Result<bool> {
    if QUIET.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(true);
    }
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

/// The response in the chosen format.
pub(super) fn render(
    output: Output,
    value: impl FnOnce() -> Value,
    table: impl FnOnce() -> String,
) -> Result<String> {
    Ok(match output {
        Output::Table | Output::Wide => table(),
        Output::Json => crate::format::json(&value())?,
        Output::Yaml => crate::format::yaml(&value())?,
    })
}

/// A call the agent refused by a safety rule (FailedPrecondition: protected, the device changed
/// since it was planned, the agent may not act; for Apply, PermissionDenied: not an operator):
/// agentctl exits 4 (refused), as the one-shot agent does for `--apply` without the privileges.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(super) struct Refused(String);

/// A gRPC status as one line; FailedPrecondition stays a [`Refused`].
pub(super) fn status(s: tonic::Status) -> anyhow::Error {
    let line = client::status_line(&s);
    match s.code() {
        tonic::Code::FailedPrecondition => Refused(line).into(),
        _ => anyhow::anyhow!(line),
    }
}

/// [`status`] of an Apply: PermissionDenied (not an operator) is a refusal too. A read refused
/// to someone with no role at all stays an error.
pub(super) fn apply_status(s: tonic::Status) -> anyhow::Error {
    if s.code() == tonic::Code::PermissionDenied {
        return Refused(client::status_line(&s)).into();
    }
    status(s)
}

/// The exit code of an error: 4 for a refusal, else 1.
pub(super) fn error_code(e: &anyhow::Error) -> u8 {
    if e.downcast_ref::<Refused>().is_some() {
        crate::exit::REFUSED
    } else {
        crate::exit::ERROR
    }
}
