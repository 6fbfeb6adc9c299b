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
//! Records, one JSON object a line: `{"ts", "id", "phase": "plan", "request", "device", "steps",
//! ...}`, `{"ts", "id", "phase": "plan_end", "result", "detail"}`,
//! `{"ts", "id", "phase": "intent", "step": {...}, "plan"?, "index"?}`,
//! `{"ts", "id", "phase": "result", "result": "done" | "already_absent" | "deferred" | "skipped" |
//! "failed", "detail"?}`, `{"ts", "id", "phase": "recovered", "result": "gone" | "in_place" |
//! "identity_changed" | "replan", "detail"}`, and `{"phase": "rotated"}` after a rotation. An
//! intent's `id` is `<ns since the epoch>-<pid of the writer>-<counter>`; intents and plans also
//! name their `writer` (`{"pid", "start", "boot"}`: a PID is reused, a PID, start time and boot
//! are one process, [`Writer`]).
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

#[derive(Serialize)]
struct Record<'a> {
    ts: f64,
    id: &'a str,
    phase: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<serde_json::Value>,
    /// The plan an intent belongs to, and the step's place in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    plan: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    result: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    detail: Option<&'a str>,
    /// The process writing an intent ([`Writer`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    writer: Option<&'a Writer>,
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
        self.begin_at(step, None)
    }

    /// Records the intent to run `step` (a device's [`Step`], or a pod volume directory's
    /// `rmdir`), step `index` of the plan being journaled (see [`Journal::plan`]); returns the
    /// record ID for [`Journal::finish`].
    pub fn begin_at<S: Serialize + ?Sized>(&mut self, step: &S, index: Option<usize>) -> io::Result<String> {
        let id = new_id("");
        let plan = self.current_plan.clone();
        self.append_step(&Record {
            ts: now(),
            id: &id,
            phase: "intent",
            step: Some(serde_json::to_value(step).map_err(io::Error::other)?),
            plan: plan.as_deref(),
            index: index.filter(|_| plan.is_some()),
            result: None,
            detail: None,
            writer: Some(Writer::this()),
        })?;
        Ok(id)
    }

    /// Records a whole plan before its first intent: `body` is what a re-run needs to finish it
    /// (the operator's argument, the operation, the devices with their identities, every step).
    /// The intents written until [`Journal::plan_end`] name it. Returns the plan's record ID.
    pub fn plan(&mut self, body: &serde_json::Value) -> io::Result<String> {
        let id = new_id("plan-");
        let mut rec = serde_json::json!({ "ts": now(), "id": id, "phase": "plan", "writer": Writer::this() });
        if let (Some(r), Some(b)) = (rec.as_object_mut(), body.as_object()) {
            r.extend(b.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        self.append_value_step(&rec)?;
        self.current_plan = Some(id.clone());
        Ok(id)
    }

    /// Continues an unfinished plan of an earlier run: the intents written until
    /// [`Journal::plan_end`] name it.
    pub fn resume_plan(&mut self, id: &str) {
        self.current_plan = Some(id.to_owned());
    }

    /// Closes the plan `id`: every step of it has a result (or will never run), with `result`
    /// (`finished`, `incomplete`, `resumed`, `gone`) and what happened in words.
    pub fn plan_end(&mut self, id: &str, result: &str, detail: &str) -> io::Result<()> {
        if self.current_plan.as_deref() == Some(id) {
            self.current_plan = None;
        }
        let rec = serde_json::json!({ "ts": now(), "id": id, "phase": "plan_end", "result": result, "detail": detail });
        self.append_value_step(&rec)
    }

    /// Appends a plan record, at the fault points of [`FAULT_PLAN_BEFORE_ENV`] and
    /// [`FAULT_PLAN_ENV`] (off unless set).
    fn append_value_step(&mut self, rec: &serde_json::Value) -> io::Result<()> {
        let n = PLAN_RECORDS.load(Ordering::SeqCst) + 1;
        fault(FAULT_PLAN_BEFORE_ENV, &PLAN_BEFORE, n, "before plan");
        let mut line = serde_json::to_vec(rec).map_err(io::Error::other)?;
        line.push(b'\n');
        self.file.write_all(&line)?;
        self.file.sync_data()?;
        PLAN_RECORDS.store(n, Ordering::SeqCst);
        fault(FAULT_PLAN_ENV, &PLAN_AFTER, n, "after plan");
        Ok(())
    }

    /// Records how the step `id` ended.
    pub fn finish(&mut self, id: &str, result: &str, detail: &str) -> io::Result<()> {
        let detail = (!detail.is_empty()).then_some(detail);
        self.append_step(&Record {
            ts: now(),
            id,
            phase: "result",
            step: None,
            plan: None,
            index: None,
            result: Some(result),
            detail,
            writer: None,
        })
    }

    /// Closes the intent `id` a run that died left open: `resolution` is a word
    /// (`gone`, `in_place`, `identity_changed`, `replan`), `detail` what was found, in words.
    pub fn recovered(&mut self, id: &str, resolution: &str, detail: &str) -> io::Result<()> {
        self.append(&Record {
            ts: now(),
            id,
            phase: "recovered",
            step: None,
            plan: None,
            index: None,
            result: Some(resolution),
            detail: Some(detail),
            writer: None,
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
    let open = unfinished_records(path)?;
    let mut text = Vec::new();
    for v in &open {
        serde_json::to_writer(&mut text, v).map_err(io::Error::other)?;
        text.push(b'\n');
    }
    let previous = previous_generation(path);
    let note = format!("rotated; the earlier records are in {}", previous.display());
    let id = format!("rotate-{}", std::process::id());
    let rec = Record {
        ts: now(),
        id: &id,
        phase: "rotated",
        step: None,
        plan: None,
        index: None,
        result: None,
        detail: Some(&note),
        writer: None,
    };
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
    Ok(pending_in(&records(path)?))
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

/// Every record of the journal that parses, in order (a torn line is skipped).
fn records(path: &Path) -> io::Result<Vec<serde_json::Value>> {
    let file = match durable::open_read(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for line in io::BufReader::new(file).split(b'\n') {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line?) {
            out.push(v);
        }
    }
    Ok(out)
}

fn text_of<'a>(v: &'a serde_json::Value, k: &str) -> &'a str {
    v.get(k).and_then(serde_json::Value::as_str).unwrap_or_default()
}

/// What a rotation must carry over: the open intents, and every record of an unfinished plan
/// (the plan, its intents and their results), in their order.
fn unfinished_records(path: &Path) -> io::Result<Vec<serde_json::Value>> {
    let all = records(path)?;
    let open_plans: std::collections::HashSet<String> =
        open_plans_in(&all).into_iter().map(|p| p.id).collect();
    let open_intents: std::collections::HashSet<String> =
        pending_in(&all).iter().map(|v| text_of(v, "id").to_owned()).collect();
    let mut of_open_plans: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut out = Vec::new();
    for v in all {
        let id = text_of(&v, "id").to_owned();
        let keep = match text_of(&v, "phase") {
            "plan" => open_plans.contains(&id),
            "intent" => {
                let in_plan = open_plans.contains(text_of(&v, "plan"));
                if in_plan {
                    of_open_plans.insert(id.clone());
                }
                in_plan || open_intents.contains(&id)
            }
            "result" | "recovered" => of_open_plans.contains(&id),
            _ => false,
        };
        if keep {
            out.push(v);
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
    pub record: serde_json::Value,
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

fn open_plans_in(all: &[serde_json::Value]) -> Vec<OpenPlan> {
    let mut plans: Vec<OpenPlan> = Vec::new();
    let mut intents: std::collections::HashMap<String, (String, usize)> = std::collections::HashMap::new();
    for v in all {
        let id = text_of(v, "id");
        match text_of(v, "phase") {
            "plan" => plans.push(OpenPlan {
                id: id.to_owned(),
                writer_pid: writer_pid(id),
                record: v.clone(),
                finished: Default::default(),
                in_flight: Default::default(),
                changed: Default::default(),
            }),
            "plan_end" => plans.retain(|p| p.id != id),
            "intent" => {
                let plan = text_of(v, "plan");
                let Some(index) = v.get("index").and_then(serde_json::Value::as_u64) else { continue };
                let index = index as usize;
                if let Some(p) = plans.iter_mut().find(|p| p.id == plan) {
                    p.in_flight.insert(index);
                    intents.insert(id.to_owned(), (plan.to_owned(), index));
                }
            }
            phase @ ("result" | "recovered") => {
                let Some((plan, index)) = intents.get(id) else { continue };
                let Some(p) = plans.iter_mut().find(|p| &p.id == plan) else { continue };
                p.in_flight.remove(index);
                let finished = match (phase, text_of(v, "result")) {
                    ("result", r) => matches!(r, "done" | "already_absent"),
                    (_, r) => matches!(r, "gone" | "in_place"),
                };
                if finished {
                    p.finished.insert(*index);
                }
                if phase == "recovered" && text_of(v, "result") == "identity_changed" {
                    p.changed.insert(*index);
                }
            }
            _ => {}
        }
    }
    plans
}

/// The last plan of the journal at `path` that `wanted` accepts and that was closed, with its
/// end record: what became of a device whose plan finished.
pub fn last_closed_plan(
    path: &Path,
    wanted: impl Fn(&serde_json::Value) -> bool,
) -> io::Result<Option<(serde_json::Value, serde_json::Value)>> {
    let all = records(path)?;
    Ok(all.iter().rev().filter(|v| text_of(v, "phase") == "plan_end").find_map(|end| {
        let id = text_of(end, "id");
        all.iter()
            .find(|v| text_of(v, "phase") == "plan" && text_of(v, "id") == id)
            .filter(|p| wanted(p))
            .map(|p| (p.clone(), end.clone()))
    }))
}

/// The plans the journal at `path` has open (see [`OpenPlan`]). A missing journal has none.
pub fn open_plans(path: &Path) -> io::Result<Vec<OpenPlan>> {
    Ok(open_plans_in(&records(path)?))
}

fn pending_in(all: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut open: Vec<(String, serde_json::Value)> = Vec::new();
    for v in all {
        let id = text_of(v, "id").to_owned();
        match text_of(v, "phase") {
            "intent" => open.push((id, v.clone())),
            "result" | "recovered" => open.retain(|(i, _)| *i != id),
            _ => {}
        }
    }
    open.into_iter().map(|(_, v)| v).collect()
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
