//! What the one-shot commands write to stdout: text, or a document as JSON or YAML (through
//! blockjanitor-rpc's `view::format`, as agentctl writes them); nothing with `--quiet`; a closed
//! pipe (`| head`) is no error. Warnings go to stderr, one line each.

use anyhow::{Context, Result};
use blockjanitor_rpc::view;

use super::args::Output;

/// `--quiet`: nothing goes to stdout (set once, from the flags).
static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes `text` to stdout, unless `--quiet`. A closed pipe (`| head`) is not an error.
pub fn say(text: &str) -> Result<()> {
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

/// Warnings on stderr, one line each (`--quiet` keeps them: it silences stdout only).
pub fn warn_lines(lines: &[String]) {
    for l in lines {
        eprintln!("{l}");
    }
}

/// Documents as [`view::format::documents`] prints them (one: as [`print_value`]).
pub fn write_documents(output: Output, docs: &[serde_json::Value]) -> Result<()> {
    say(&view::format::documents(matches!(output, Output::Yaml), docs)?)
}

/// `--quiet` for the whole process (set once, from the flags).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, std::sync::atomic::Ordering::Relaxed);
}
