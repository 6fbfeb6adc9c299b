//! Append-only intent log of destructive steps (JSON lines, fsync'd).
//!
//! Every step writes an `intent` record before it touches the kernel and a `result` record after.
//! An intent without a result means the agent died mid-step: [`pending`] lists those. The next
//! daemon (or `--apply` run) re-checks each against the device as it is now and closes it with a
//! `recovered` record carrying the same `id`, a resolution word and what it found in plain words
//! ([`crate::engine::recover`]); the device is then re-planned from a fresh scan.
//!
//! A plan is journaled whole before its first intent ([`Journal::plan`]: the operator's
//! argument, the operation, the devices with their names, uuids, wwids and identities, every step
//! with its identity) and closed after its last result ([`Journal::plan_end`]); its intents name
//! it (`plan`, `index`). A plan with no end is unfinished ([`open_plans`]): re-running the same
//! command finishes it ([`crate::engine::workflow`]).
//!
//! Records, one JSON object a line, typed in [`super::journal_record`] (which also says the
//! exact layout, kept byte for byte): `{"ts", "id", "phase": "plan", "request", "device",
//! "steps", ...}`, `{"ts", "id", "phase": "plan_end", "result", "detail"}`,
//! `{"ts", "id", "phase": "intent", "step": {...}, "plan"?, "index"?}`,
//! `{"ts", "id", "phase": "result", "result": "done" | "already_absent" | "deferred" | "skipped" |
//! "failed", "detail"?}`, `{"ts", "id", "phase": "recovered", "result": "gone" | "in_place" |
//! "identity_changed" | "replan", "detail"}`, and `{"ts", "id", "phase": "rotated", "detail"}`
//! after a rotation. An intent's `id` is `<ns since the epoch>-<pid of the writer>-<counter>`;
//! intents and plans also name their `writer` (`{"pid", "start", "boot"}`: a PID is reused, a
//! PID, start time and boot are one process, [`Writer`]).
//!
//! Fault injection (crash tests only, off unless set): with
//! `BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD=N` in its environment, the process sends itself
//! SIGKILL (exactly `kill -9`) right after the Nth intent or result record it writes is on disk
//! ([`FAULT_ENV`]); with `BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD=N`, right before it writes
//! the Nth ([`FAULT_BEFORE_ENV`]: before a result, that is after the step's kernel call); the same
//! with `..._PLAN_RECORD=N` for the Nth plan or plan-end record ([`FAULT_PLAN_ENV`],
//! [`FAULT_PLAN_BEFORE_ENV`]). So a test can stop the agent after every record of a plan.
//!
//! The file is opened without following symlinks and stays bounded: past [`ROTATE_BYTES`] an
//! open moves it to `<name>.1` and starts a new one that carries the unfinished intents over, so
//! rotation never loses a step a crash left open, nor an unfinished plan (its records are carried
//! over whole; see [`crate::host::durable`]). A torn last line (a write a crash cut short) is ended with
//! a newline on open, so the next record is never glued to it. One writer at a time: [`lock`]
//! takes `<journal>.lock` (`flock`), which names its holder's pid.

use std::fs::File;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

pub use super::journal_record::{
    Intent, JournaledStep, PlanBody, PlanDevice, PlanEnd, PlanEndResult, PlanRecord, PlanRequest, PlanStep,
    Record, Recovered, Resolution, Rotated, StepEnd, StepResult,
};
pub use super::journal_writer::{writer_pid, Writer};
use crate::host::durable;
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

/// Fault injection for crash tests: `N` makes the process SIGKILL itself right after its Nth
/// plan record (a plan or a plan's end) is fsync'd. Unset, empty or `0`: off.
pub const FAULT_PLAN_ENV: &str = "BLOCKJANITOR_FAULT_SIGKILL_AFTER_PLAN_RECORD";

/// Fault injection for crash tests: `N` makes the process SIGKILL itself right before it writes
/// its Nth plan record. Unset, empty or `0`: off.
pub const FAULT_PLAN_BEFORE_ENV: &str = "BLOCKJANITOR_FAULT_SIGKILL_BEFORE_PLAN_RECORD";

/// Step records (intents and results) this process has written, for the fault points.
static STEP_RECORDS: AtomicU64 = AtomicU64::new(0);
/// Plan records (plans and their ends) this process has written, for the fault points.
static PLAN_RECORDS: AtomicU64 = AtomicU64::new(0);
static PLAN_AFTER: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
static PLAN_BEFORE: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
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
    /// The plan whose steps are being journaled ([`Journal::plan`]): intents name it.
    current_plan: Option<String>,
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
        let mut file = durable::open_append(path)?;
        terminate_torn_tail(path, &mut file)?;
        Ok(Self { file, path: path.to_owned(), current_plan: None })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn append(&mut self, rec: &Record) -> io::Result<()> {
        self.file.write_all(&rec.to_line().map_err(io::Error::other)?)?;
        self.file.sync_data()
    }

    /// Appends an intent or a result, at the fault points of [`FAULT_BEFORE_ENV`] and
    /// [`FAULT_ENV`] (off unless set).
    fn append_step(&mut self, rec: &Record) -> io::Result<()> {
        let n = STEP_RECORDS.load(Ordering::SeqCst) + 1;
        fault(FAULT_BEFORE_ENV, &BEFORE, n, "before");
        self.append(rec)?;
        STEP_RECORDS.store(n, Ordering::SeqCst);
        fault(FAULT_ENV, &AFTER, n, "after");
        Ok(())
    }

    /// Records the intent to run `step`; returns the record ID for [`Journal::finish`].
    pub fn begin(&mut self, step: &Step) -> io::Result<String> {
        self.begin_at(step, None)
    }

    /// Records the intent to run `step` (a device's [`Step`], or a pod volume directory's
    /// `rmdir`), step `index` of the plan being journaled (see [`Journal::plan`]); returns the
    /// record ID for [`Journal::finish`].
    pub fn begin_at<S: Serialize + ?Sized>(&mut self, step: &S, index: Option<usize>) -> io::Result<String> {
        let id = new_id("");
        let plan = self.current_plan.clone();
        self.append_step(&Record::Intent(Intent {
            ts: now(),
            id: id.clone(),
            step: serde_json::to_value(step).map_err(io::Error::other)?,
            index: index.filter(|_| plan.is_some()),
            plan,
            writer: Some(Writer::this().clone()),
        }))?;
        Ok(id)
    }

    /// Records a whole plan before its first intent: `body` is what a re-run needs to finish it
    /// (the operator's argument, the operation, the devices with their identities, every step).
    /// The intents written until [`Journal::plan_end`] name it. Returns the plan's record ID.
    pub fn plan(&mut self, body: &PlanBody) -> io::Result<String> {
        let id = new_id("plan-");
        let rec = Record::Plan(Box::new(PlanRecord {
            ts: now(),
            id: id.clone(),
            writer: Some(Writer::this().clone()),
            body: body.clone(),
        }));
        self.append_plan_record(&rec)?;
        self.current_plan = Some(id.clone());
        Ok(id)
    }

    /// Continues an unfinished plan of an earlier run: the intents written until
    /// [`Journal::plan_end`] name it.
    pub fn resume_plan(&mut self, id: &str) {
        self.current_plan = Some(id.to_owned());
    }

    /// Closes the plan `id`: every step of it has a result (or will never run), with `result`
    /// and what happened in words.
    pub fn plan_end(&mut self, id: &str, result: PlanEndResult, detail: &str) -> io::Result<()> {
        if self.current_plan.as_deref() == Some(id) {
            self.current_plan = None;
        }
        let rec =
            Record::PlanEnd(PlanEnd { ts: now(), id: id.to_owned(), result, detail: detail.to_owned() });
        self.append_plan_record(&rec)
    }

    /// Appends a plan record, at the fault points of [`FAULT_PLAN_BEFORE_ENV`] and
    /// [`FAULT_PLAN_ENV`] (off unless set).
    fn append_plan_record(&mut self, rec: &Record) -> io::Result<()> {
        let n = PLAN_RECORDS.load(Ordering::SeqCst) + 1;
        fault(FAULT_PLAN_BEFORE_ENV, &PLAN_BEFORE, n, "before plan");
        self.append(rec)?;
        PLAN_RECORDS.store(n, Ordering::SeqCst);
        fault(FAULT_PLAN_ENV, &PLAN_AFTER, n, "after plan");
        Ok(())
    }

    /// Records how the step `id` ended.
    pub fn finish(&mut self, id: &str, result: StepResult, detail: &str) -> io::Result<()> {
        let detail = (!detail.is_empty()).then(|| detail.to_owned());
        self.append_step(&Record::Result(StepEnd { ts: now(), id: id.to_owned(), result, detail }))
    }

    /// Closes the intent `id` a run that died left open: how (`resolution`), and what was
    /// found, in words.
    pub fn recovered(&mut self, id: &str, resolution: Resolution, detail: &str) -> io::Result<()> {
        self.append(&Record::Recovered(Recovered {
            ts: now(),
            id: id.to_owned(),
            result: resolution,
            detail: detail.to_owned(),
        }))
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
    let open = unfinished_records(path)?;
    let mut text = Vec::new();
    for line in &open {
        // Carried over as written, byte for byte (with any field this version does not know).
        text.extend_from_slice(&line.raw);
        text.push(b'\n');
    }
    let previous = previous_generation(path);
    let note = format!("rotated; the earlier records are in {}", previous.display());
    let id = format!("rotate-{}", std::process::id());
    let rec = Record::Rotated(Rotated { ts: now(), id, detail: Some(note) });
    text.extend_from_slice(&rec.to_line().map_err(io::Error::other)?);
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
pub fn pending(path: &Path) -> io::Result<Vec<Intent>> {
    Ok(pending_in(records(path)?.iter().map(|l| &l.record)))
}

/// A fresh record ID: `<prefix><ns since the epoch>-<pid of the writer>-<counter>`.
fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{}-{}-{}",
        SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Ends a torn last line (a write cut short by a crash) with a newline, so the next record starts
/// a line of its own instead of being glued to the fragment (which [`pending`] skips).
fn terminate_torn_tail(path: &Path, file: &mut File) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = file.metadata()?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    durable::open_read(path)?.read_exact_at(&mut last, len - 1)?;
    if last[0] != b'\n' {
        tracing::warn!(journal = %path.display(), "the journal's last line is torn (a write cut short by a crash): ended so the next record starts a line of its own");
        file.write_all(b"\n")?;
        file.sync_data()?;
    }
    Ok(())
}

/// A line of the journal that is a record: as read, and as its type.
struct Line {
    raw: Vec<u8>,
    record: Record,
}

/// Every record of the journal, in order; a line that is not one (a torn write) is skipped
/// ([`Record::parse`]).
fn records(path: &Path) -> io::Result<Vec<Line>> {
    let file = match durable::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for raw in io::BufReader::new(file).split(b'\n') {
        let raw = raw?;
        if let Some(record) = Record::parse(&raw) {
            out.push(Line { raw, record });
        }
    }
    Ok(out)
}

/// What a rotation must carry over: the open intents, and every record of an unfinished plan
/// (the plan, its intents and their results), in their order.
fn unfinished_records(path: &Path) -> io::Result<Vec<Line>> {
    use std::collections::HashSet;
    let all = records(path)?;
    let open_plans: HashSet<String> =
        open_plans_in(all.iter().map(|l| &l.record)).into_iter().map(|p| p.id).collect();
    let open_intents: HashSet<String> =
        pending_in(all.iter().map(|l| &l.record)).into_iter().map(|i| i.id).collect();
    let mut of_open_plans: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    for line in all {
        let keep = match &line.record {
            Record::Plan(p) => open_plans.contains(&p.id),
            Record::Intent(i) => {
                let in_plan = i.plan.as_ref().is_some_and(|p| open_plans.contains(p));
                if in_plan {
                    of_open_plans.insert(i.id.clone());
                }
                in_plan || open_intents.contains(&i.id)
            }
            Record::Result(StepEnd { id, .. }) | Record::Recovered(Recovered { id, .. }) => {
                of_open_plans.contains(id)
            }
            Record::PlanEnd(_) | Record::Rotated(_) => false,
        };
        if keep {
            out.push(line);
        }
    }
    Ok(out)
}

/// A plan a run journaled ([`Journal::plan`]) and never closed ([`Journal::plan_end`]).
#[derive(Debug, Clone)]
pub struct OpenPlan {
    pub id: String,
    /// The process that wrote it.
    pub writer_pid: Option<u32>,
    /// The plan record as journaled.
    pub record: PlanRecord,
    /// The indexes of its steps that finished (a result `done` or `already_absent`, or closed
    /// by recovery as `gone` or `in_place`; a `deferred` step did not: the kernel finishes it
    /// only at its device's last close, and a resumed plan runs it again, re-checked).
    pub finished: std::collections::BTreeSet<usize>,
    /// The indexes of its steps that have an intent still open.
    pub in_flight: std::collections::BTreeSet<usize>,
    /// The indexes of its steps recovery found run against a device that is another one now
    /// (`identity_changed`): never to be repeated.
    pub changed: std::collections::BTreeSet<usize>,
}

fn open_plans_in<'a>(all: impl IntoIterator<Item = &'a Record>) -> Vec<OpenPlan> {
    let mut plans: Vec<OpenPlan> = Vec::new();
    let mut intents: std::collections::HashMap<&str, (&str, usize)> = std::collections::HashMap::new();
    for r in all {
        // Closing a step of a plan: whether it finished, whether its device changed.
        let (id, finished, changed) = match r {
            Record::Plan(p) => {
                plans.push(OpenPlan {
                    id: p.id.clone(),
                    writer_pid: writer_pid(&p.id),
                    record: PlanRecord::clone(p),
                    finished: Default::default(),
                    in_flight: Default::default(),
                    changed: Default::default(),
                });
                continue;
            }
            Record::PlanEnd(e) => {
                plans.retain(|p| p.id != e.id);
                continue;
            }
            Record::Intent(i) => {
                let (Some(plan), Some(index)) = (i.plan.as_deref(), i.index) else { continue };
                if let Some(p) = plans.iter_mut().find(|p| p.id == plan) {
                    p.in_flight.insert(index);
                    intents.insert(&i.id, (plan, index));
                }
                continue;
            }
            Record::Result(e) => (&e.id, e.result.is_finished(), false),
            Record::Recovered(e) => (&e.id, e.result.is_finished(), e.result == Resolution::IdentityChanged),
            Record::Rotated(_) => continue,
        };
        let Some(&(plan, index)) = intents.get(id.as_str()) else { continue };
        let Some(p) = plans.iter_mut().find(|p| p.id == plan) else { continue };
        p.in_flight.remove(&index);
        if finished {
            p.finished.insert(index);
        }
        if changed {
            p.changed.insert(index);
        }
    }
    plans
}

/// The last plan of the journal at `path` that `wanted` accepts and that was closed, with its
/// end record: what became of a device whose plan finished.
pub fn last_closed_plan(
    path: &Path,
    wanted: impl Fn(&PlanRecord) -> bool,
) -> io::Result<Option<(PlanRecord, PlanEnd)>> {
    let all = records(path)?;
    Ok(all.iter().rev().find_map(|l| {
        let Record::PlanEnd(end) = &l.record else { return None };
        all.iter()
            .find_map(|l| match &l.record {
                Record::Plan(p) if p.id == end.id => Some(p),
                _ => None,
            })
            .filter(|p| wanted(p))
            .map(|p| (PlanRecord::clone(p), end.clone()))
    }))
}

/// The plans the journal at `path` has open (see [`OpenPlan`]). A missing journal has none.
pub fn open_plans(path: &Path) -> io::Result<Vec<OpenPlan>> {
    Ok(open_plans_in(records(path)?.iter().map(|l| &l.record)))
}

fn pending_in<'a>(all: impl IntoIterator<Item = &'a Record>) -> Vec<Intent> {
    let mut open: Vec<&Intent> = Vec::new();
    for r in all {
        match r {
            Record::Intent(i) => open.push(i),
            Record::Result(StepEnd { id, .. }) | Record::Recovered(Recovered { id, .. }) => {
                open.retain(|i| i.id != *id)
            }
            _ => {}
        }
    }
    open.into_iter().cloned().collect()
}

/// The file beside the journal that one writer at a time holds locked ([`lock`]).
pub fn lock_path(journal: &Path) -> PathBuf {
    let mut name = journal.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    journal.with_file_name(name)
}

/// The journal's writer lock, held until dropped: `flock(LOCK_EX)` on [`lock_path`], which
/// names the holder's pid. One writer at a time: a one-shot `--apply` run holds it for the whole
/// run, the daemon for each action.
#[derive(Debug)]
pub struct JournalLock {
    _file: File,
}

/// Why [`lock`] gave up: another process held the lock for the whole wait.
pub fn is_busy(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

/// Takes the journal's writer lock, waiting at most `wait` for another holder to let go; past
/// that, an error (`WouldBlock`, see [`is_busy`]) naming the holder's pid.
pub fn lock(journal: &Path, wait: std::time::Duration) -> io::Result<JournalLock> {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    let path = lock_path(journal);
    let mut file = durable::open_lock(&path)?;
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on a file descriptor this function owns (`file` outlives the call);
        // LOCK_NB makes it return at once.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
        if start.elapsed() >= wait {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            let who = if holder.is_empty() { "another process".to_owned() } else { holder.to_owned() };
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "another run is writing the journal {} ({who}, holding {}); waited {}s: let it finish (or check that process), then run again",
                    journal.display(),
                    path.display(),
                    wait.as_secs()
                ),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    file.set_len(0)?;
    file.rewind()?;
    file.write_all(format!("agent process {}\n", std::process::id()).as_bytes())?;
    Ok(JournalLock { _file: file })
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
