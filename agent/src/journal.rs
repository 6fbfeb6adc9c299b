//! Append-only intent log of destructive steps (JSON lines, fsync'd).
//!
//! Every step writes an `intent` record before it touches the kernel and a `result` record after.
//! An intent without a result means the agent died mid-step: [`pending`] lists those. The next
//! daemon (or `--apply` run) re-checks each against the device as it is now and closes it with a
//! `recovered` record carrying the same `id`, a resolution word and what it found in plain words
//! ([`crate::engine::recover`]); the device is then re-planned from a fresh scan.
//!
//! Records, one JSON object a line: `{"ts", "id", "phase": "intent", "step": {...}}`,
//! `{"ts", "id", "phase": "result", "result": "done" | "already_absent" | "deferred" | "skipped" |
//! "failed", "detail"?}`, `{"ts", "id", "phase": "recovered", "result": "gone" | "in_place" |
//! "identity_changed" | "replan", "detail"}`, and `{"phase": "rotated"}` after a rotation. An
//! intent's `id` is `<ns since the epoch>-<pid of the writer>-<counter>`.
//!
//! Fault injection (crash tests only, off unless set): with
//! `BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD=N` in its environment, the process sends itself
//! SIGKILL (exactly `kill -9`) right after the Nth intent or result record it writes is on disk
//! ([`FAULT_ENV`]); with `BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD=N`, right before it writes
//! the Nth ([`FAULT_BEFORE_ENV`]: before a result, that is after the step's kernel call). So a
//! test can stop the agent at every phase of every step of a plan, from the one write point.
//!
//! The file is opened without following symlinks and stays bounded: past [`ROTATE_BYTES`] an
//! open moves it to `<name>.1` and starts a new one that carries the unfinished intents over, so
//! rotation never loses a step a crash left open (see [`crate::durable`]).

use std::fs::File;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::durable;
use crate::plan::Step;

/// Default location on a node.
pub const DEFAULT_PATH: &str = "/var/lib/blockjanitor/journal.jsonl";

/// Size past which [`Journal::open`] rotates the journal (a step writes about 1 KiB).
pub const ROTATE_BYTES: u64 = 8 << 20;

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// Fault injection for crash tests: `N` (1-based) makes the process SIGKILL itself right after
/// the Nth step record (intent or result) it writes is fsync'd. Unset, empty or `0`: off.
pub const FAULT_ENV: &str = "BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD";

/// Fault injection for crash tests: `N` makes the process SIGKILL itself right before it writes
/// its Nth step record. For a result record that is after the step's kernel call, before the
/// journal knows how it ended. Unset, empty or `0`: off.
pub const FAULT_BEFORE_ENV: &str = "BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD";

/// Step records (intents and results) this process has written, for the fault points.
static STEP_RECORDS: AtomicU64 = AtomicU64::new(0);
/// The values of [`FAULT_ENV`] and [`FAULT_BEFORE_ENV`], read once.
static AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
static BEFORE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();

/// The record number the variable `name` names, read once per variable.
fn fault_point(name: &'static str, cell: &'static std::sync::OnceLock<Option<u64>>) -> Option<u64> {
    *cell.get_or_init(|| {
        let v = std::env::var(name).ok()?;
        match v.trim().parse::<u64>() {
            Ok(0) => None,
            Ok(n) => {
                tracing::warn!("fault injection armed: {name}={n}");
                Some(n)
            }
            Err(_) => {
                tracing::error!("{name}={v:?} is not a record number: fault injection stays off");
                None
            }
        }
    })
}

/// Kills this process with SIGKILL when `n` is the record `name` asks for: no destructor, no
/// further write, exactly as `kill -9` would.
fn fault(name: &'static str, cell: &'static std::sync::OnceLock<Option<u64>>, n: u64, when: &str) {
    if fault_point(name, cell) == Some(n) {
        eprintln!("fault injection: SIGKILL {when} journal step record {n} ({name})");
        let _ = nix::sys::signal::kill(nix::unistd::Pid::this(), nix::sys::signal::Signal::SIGKILL);
        // SIGKILL cannot be caught; should the kill itself fail, stop anyway.
        std::process::abort();
    }
}

/// An open journal file.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
}

#[derive(Serialize)]
struct Record<'a> {
    ts: f64,
    id: &'a str,
    phase: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<&'a Step>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
}

fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

impl Journal {
    /// Opens (creating it and its directory) the journal at `path` for appending.
    /// Rotates it first when it has grown past [`ROTATE_BYTES`]. A symlink at `path` is refused.
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_bounded(path, ROTATE_BYTES)
    }

    /// [`Journal::open`] with another rotation size.
    pub fn open_bounded(path: &Path, rotate_bytes: u64) -> io::Result<Self> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if meta.is_file() && meta.len() > rotate_bytes {
                rotate(path)?;
            }
        }
        let file = durable::open_append(path)?;
        Ok(Self { file, path: path.to_owned() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append(&mut self, rec: &Record<'_>) -> io::Result<()> {
        let mut line = serde_json::to_vec(rec).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()
    }

    /// Appends an intent or a result, at the fault points of [`FAULT_BEFORE_ENV`] and
    /// [`FAULT_ENV`] (off unless set).
    fn append_step(&mut self, rec: &Record<'_>) -> io::Result<()> {
        let n = STEP_RECORDS.load(Ordering::SeqCst) + 1;
        fault(FAULT_BEFORE_ENV, &BEFORE, n, "before");
        self.append(rec)?;
        STEP_RECORDS.store(n, Ordering::SeqCst);
        fault(FAULT_ENV, &AFTER, n, "after");
        Ok(())
    }

    /// Records the intent to run `step`; returns the record ID for [`Journal::finish`].
    pub fn begin(&mut self, step: &Step) -> io::Result<String> {
        let id = format!(
            "{}-{}-{}",
            SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        self.append_step(&Record {
            ts: now(),
            id: &id,
            phase: "intent",
            step: Some(step),
            result: None,
            detail: None,
        })?;
        Ok(id)
    }

    /// Records how the step `id` ended.
    pub fn finish(&mut self, id: &str, result: &str, detail: &str) -> io::Result<()> {
        let detail = (!detail.is_empty()).then_some(detail);
        self.append_step(&Record { ts: now(), id, phase: "result", step: None, result: Some(result), detail })
    }

    /// Closes the intent `id` a run that died left open: `resolution` is a word
    /// (`gone`, `in_place`, `identity_changed`, `replan`), `detail` what was found, in words.
    pub fn recovered(&mut self, id: &str, resolution: &str, detail: &str) -> io::Result<()> {
        self.append(&Record {
            ts: now(),
            id,
            phase: "recovered",
            step: None,
            result: Some(resolution),
            detail: Some(detail),
        })
    }
}

/// The previous generation of the journal at `path` (`<name>.1`).
pub fn previous_generation(path: &Path) -> std::path::PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".1");
    path.with_file_name(name)
}

/// Keeps the journal bounded: the old file becomes `<name>.1` (replacing an older one), and the
/// new one starts with the unfinished intents and a `rotated` record. The old file is linked
/// to `.1` before the new one replaces it, so a crash at any point leaves every open intent in
/// the journal.
fn rotate(path: &Path) -> io::Result<()> {
    let open = pending(path)?;
    let mut text = Vec::new();
    for v in &open {
        serde_json::to_writer(&mut text, v).map_err(io::Error::other)?;
        text.push(b'\n');
    }
    let previous = previous_generation(path);
    let note = format!("rotated; the earlier records are in {}", previous.display());
    let id = format!("rotate-{}", std::process::id());
    let rec = Record { ts: now(), id: &id, phase: "rotated", step: None, result: None, detail: Some(&note) };
    serde_json::to_writer(&mut text, &rec).map_err(io::Error::other)?;
    text.push(b'\n');
    match std::fs::remove_file(&previous) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::hard_link(path, &previous)?;
    durable::write_atomically(path, &text)?;
    tracing::info!(target: "audit", journal = %path.display(), carried_over = open.len(), "journal rotated");
    Ok(())
}

/// Intents with no result and no `recovered` record: steps a run started and never finished,
/// not yet resolved. A missing journal has none. Lines that do not parse (a torn last write) are
/// skipped.
pub fn pending(path: &Path) -> io::Result<Vec<serde_json::Value>> {
    let file = match durable::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut open: Vec<(String, serde_json::Value)> = Vec::new();
    for line in io::BufReader::new(file).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line?) else { continue };
        let id = v.get("id").and_then(|i| i.as_str()).unwrap_or_default().to_owned();
        match v.get("phase").and_then(|p| p.as_str()) {
            Some("intent") => open.push((id, v)),
            Some("result" | "recovered") => open.retain(|(i, _)| *i != id),
            _ => {}
        }
    }
    Ok(open.into_iter().map(|(_, v)| v).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{Backing, Identity};
    use crate::model::{DevNum, DeviceName};
    use crate::plan::Action;

    fn step() -> Step {
        let device = DeviceName::new("loop9").expect("name");
        let devnum = DevNum::new(7, 9);
        let backing = Backing::Loop { dev: None, inode: None, rdev: None, offset: 0 };
        Step {
            identity: Identity { name: device.clone(), devnum, diskseq: Some(4), backing },
            device,
            devnum,
            action: Action::DetachLoop {
                backing_file: "/x.img".into(),
                backing_dev: None,
                backing_inode: None,
            },
        }
    }

    #[test]
    fn unfinished_intents_are_pending() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/journal.jsonl");
        let mut j = Journal::open(&path).expect("open");
        let a = j.begin(&step()).expect("begin a");
        j.finish(&a, "done", "").expect("finish a");
        let _b = j.begin(&step()).expect("begin b");
        drop(j);
        // A torn last line (crash mid-write) is ignored.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("reopen")
            .write_all(b"{\"ts\":1,")
            .expect("torn");
        let p = pending(&path).expect("read");
        assert_eq!(p.len(), 1);
        assert_eq!(p[0]["step"]["action"], "detach_loop");
        assert_eq!(p[0]["step"]["device"], "loop9");
        assert_eq!(p[0]["step"]["identity"], "loop9@7:9#4;loop=?/?+0", "the identity it was planned for");
        assert!(pending(&dir.path().join("none")).expect("missing").is_empty());
    }

    #[test]
    fn rotation_bounds_the_journal_and_carries_open_intents_over() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        let mut j = Journal::open_bounded(&path, 4096).expect("open");
        for _ in 0..20 {
            let id = j.begin(&step()).expect("begin");
            j.finish(&id, "done", "").expect("finish");
        }
        let open = j.begin(&step()).expect("begin the one a crash leaves open");
        drop(j);
        let before = std::fs::read(&path).expect("read");
        assert!(before.len() > 4096, "{} bytes: past the bound", before.len());

        let mut j = Journal::open_bounded(&path, 4096).expect("reopen rotates");
        let after = std::fs::read_to_string(&path).expect("read");
        assert!(after.len() < 2048, "bounded: {after}");
        assert_eq!(
            std::fs::read(previous_generation(&path)).expect(".1"),
            before,
            "the old records are kept whole"
        );
        let p = pending(&path).expect("pending");
        assert_eq!(p.len(), 1, "the open intent is carried over: {after}");
        assert_eq!(p[0]["id"], open.as_str());
        assert!(after.contains("\"phase\":\"rotated\""), "{after}");
        // Its result, written after the rotation, still closes it.
        j.finish(&open, "done", "").expect("finish");
        assert!(pending(&path).expect("pending").is_empty());
    }

    #[test]
    fn a_recovered_record_closes_the_intent_it_names_and_only_that_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        let mut j = Journal::open(&path).expect("open");
        let a = j.begin(&step()).expect("begin a");
        let b = j.begin(&step()).expect("begin b");
        assert_eq!(pending(&path).expect("pending").len(), 2);
        j.recovered(&a, "gone", "loop9 is gone").expect("recovered");
        let p = pending(&path).expect("pending");
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0]["id"], b.as_str());
        let text = std::fs::read_to_string(&path).expect("read");
        let last: serde_json::Value =
            serde_json::from_str(text.lines().last().expect("a line")).expect("json");
        assert_eq!(last["phase"], "recovered");
        assert_eq!(last["id"], a.as_str());
        assert_eq!(last["result"], "gone");
        assert_eq!(last["detail"], "loop9 is gone");
        assert!(a.split('-').nth(1) == Some(&std::process::id().to_string()), "the writer's pid is in {a}");
    }

    #[test]
    fn a_symlink_in_place_of_the_journal_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").expect("target");
        let path = dir.path().join("journal.jsonl");
        std::os::unix::fs::symlink(&target, &path).expect("symlink");
        let e = Journal::open(&path).expect_err("refused");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(pending(&path).is_err(), "reading through it is refused too");
    }
}
