//! Real-kernel acceptance tests for issue 34, items 6 and 7: openers the fd scan cannot see, and
//! identity in every comparison.
//!
//! 1. A loop device held open by a process (no mount): `clean --apply` refuses (exit 2), nothing
//!    is journaled. Held only by an fd in flight over a unix socket (its sender closed its own),
//!    the scan sees no holder: the kernel defers `LOOP_CLR_FD` (autoclear); that is reported as
//!    `deferred`, exit 2, the journal's result `deferred` and its plan `incomplete`, never
//!    done; the next run sees the kernel keeping the device bound with autoclear set and
//!    refuses up front (held), journaling nothing more; the opener gone, the kernel detaches it.
//!
//! 2. The journal's writer is a process, not a name: its intent records carry its PID, start
//!    time and boot, and recovery takes a writer for alive only while that very process runs (a
//!    PID reused by another process, or a record of another boot, is dead). A record without a
//!    start time falls back to the executable, never to a name: a process that calls itself
//!    `blockjanitor-agent` is not the agent.
//! 3. Kernel records a user can shape: a process named `rbd: rbd0: x` running a file named
//!    `blocklisted` segfaults, and the kernel logs its line at facility 0; a record written to
//!    /dev/kmsg from user space reads like krbd's. Neither is rbd evidence for the agent.
//!
//! Every object is owned by a guard that cleans up on drop, even when an assertion fails.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};

use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "gcc"];

/// Builds tests/helpers/named-process.c into the scratch directory as `name`.
fn named_process(s: &Scratch, name: &str) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("helpers/named-process.c");
    let bin = s.path(name);
    let out = Command::new("gcc")
        .args(["-O0", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(out.status.success(), "gcc named-process.c: {}", text(&out.stderr));
    bin
}

/// Starts `bin args...` and waits for its "ready PID" line.
fn start_named(bin: &Path, args: &[&str]) -> Killed {
    let mut child =
        Command::new(bin).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).spawn().expect("spawn");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("its line");
    assert!(line.starts_with("ready "), "{} said {line:?}", bin.display());
    Killed(child)
}

/// The scratch directory's state file and journal, as global flags.
fn files(s: &Scratch) -> Vec<String> {
    vec![
        "--state".into(),
        s.path("state.json").to_string_lossy().into_owned(),
        "--journal".into(),
        s.path("journal.jsonl").to_string_lossy().into_owned(),
    ]
}

/// Runs the agent with the scratch files and `rest`; (exit code, stdout and stderr).
fn run(s: &Scratch, rest: &[&str]) -> (Option<i32>, String) {
    let f = files(s);
    let args: Vec<&str> = f.iter().map(String::as_str).chain(rest.iter().copied()).collect();
    let out = agent(&args);
    (out.status.code(), format!("stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr)))
}

fn journal_records(s: &Scratch) -> Vec<Value> {
    journal::read(&s.path("journal.jsonl"))
}

/// The results (`result` field) of the intents of `action` in the scratch journal.
fn results(s: &Scratch, action: &str) -> Vec<String> {
    let records = journal_records(s);
    journal::intents(&records, action)
        .iter()
        .filter_map(|i| records.iter().find(|r| r["phase"] == "result" && r["id"] == i["id"]))
        .map(|r| r["result"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The `result` of every plan end in the scratch journal.
fn plan_ends(s: &Scratch) -> Vec<String> {
    journal_records(s)
        .iter()
        .filter(|r| r["phase"] == "plan_end")
        .map(|r| r["result"].as_str().unwrap_or("?").to_owned())
        .collect()
}

fn autoclear(lo: &LoopDev) -> String {
    std::fs::read_to_string(format!("/sys/class/block/{}/loop/autoclear", lo.name()))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// Builds tests/guest/scenario-lib/fd-in-flight.c for this host into the scratch directory.
fn fd_in_flight(s: &Scratch) -> std::path::PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/scenario-lib/fd-in-flight.c");
    let bin = s.path("fd-in-flight");
    let out = Command::new("gcc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc");
    assert!(out.status.success(), "gcc fd-in-flight.c: {}", text(&out.stderr));
    bin
}

/// Starts `fd-in-flight DEVICE 1000` and waits for its "in flight PID" line: the device's open
/// file then lives only in its socket's queue.
fn open_in_flight(helper: &Path, device: &str) -> Killed {
    let mut child = Command::new(helper)
        .args([device, "1000"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn fd-in-flight");
    let stdout = child.stdout.take().expect("stdout");
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line).expect("read its line");
    assert!(line.starts_with("in flight"), "fd-in-flight said {line:?}");
    Killed(child)
}

/// Item 6, loop: what the scan sees open is refused up front; what only the kernel knows is
/// open (an fd in flight) makes `LOOP_CLR_FD` a deferred detach, reported and journaled as
/// such (exit 2), never done; afterwards the kernel's autoclear flag keeps it held.
#[test]
fn root_a_loop_device_open_only_in_flight_is_deferred_never_done() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let helper = fd_in_flight(&s);
    let lo = s.loop_file("inflight.img");

    // Open by a process the scan sees (no mount): refused, nothing journaled.
    let visible = Killed(
        Command::new("sh")
            .args(["-c", &format!("exec sleep 1000 <{}", lo.dev)])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn the opener"),
    );
    assert!(
        wait_until(std::time::Duration::from_secs(5), || {
            std::fs::read_link(format!("/proc/{}/fd/0", visible.0.id()))
                .is_ok_and(|p| p == Path::new(&lo.dev))
        }),
        "the opener never had {} open",
        lo.dev
    );
    let (code, said) = run(&s, &["--grace-period", "0", "clean", &lo.dev, "--apply"]);
    assert_eq!(code, Some(2), "held by an open fd: {said}");
    assert!(said.contains("has the device node open"), "{said}");
    assert!(
        results(&s, "detach_loop").is_empty(),
        "nothing journaled: {}",
        journal::text(&s.path("journal.jsonl"))
    );
    assert!(lo.is_bound());
    drop(visible);

    // Open only in flight: the scan sees nothing; the kernel defers the detach.
    let opener = open_in_flight(&helper, &lo.dev);
    let (code, said) = run(&s, &["--grace-period", "0", "clean", &lo.dev, "--apply"]);
    let journal = journal::text(&s.path("journal.jsonl"));
    assert_eq!(code, Some(2), "a deferred detach is not done (exit 2, held): {said}");
    assert!(said.contains("deferred") && said.contains("autoclear"), "says it was deferred and why: {said}");
    assert!(!said.contains(" -> done"), "{said}");
    assert_eq!(results(&s, "detach_loop"), ["deferred"], "{journal}");
    assert_eq!(
        plan_ends(&s),
        ["incomplete"],
        "a plan whose step the kernel deferred did not finish: {journal}"
    );
    assert!(lo.is_bound(), "still bound while the opener has it: {said}");
    assert_eq!(autoclear(&lo), "1", "the kernel set autoclear");

    // The kernel's word now: bound with autoclear set means open somewhere. Refused up front.
    let v = agent_holders(&files(&s).iter().map(String::as_str).collect::<Vec<_>>(), &lo.dev);
    assert_eq!(v["verdict"], "in_use", "{v:#}");
    let reasons = v["reasons"].to_string();
    assert!(reasons.contains("bound with autoclear set, so something has it open"), "{reasons}");
    let (code, said) = run(&s, &["--grace-period", "0", "clean", &lo.dev, "--apply"]);
    assert_eq!(code, Some(2), "{said}");
    assert!(said.contains("autoclear set"), "{said}");
    assert_eq!(
        results(&s, "detach_loop"),
        ["deferred"],
        "no second detach: {}",
        journal::text(&s.path("journal.jsonl"))
    );

    // The opener gone, the in-flight file is closed: the kernel detaches at that last close.
    drop(opener);
    assert!(
        wait_until(std::time::Duration::from_secs(10), || !lo.is_bound()),
        "{} still bound to its image after the last opener went",
        lo.dev
    );
}

/// Not a test of its own: the process `root_a_journal_writer_is_a_process_not_a_name` starts to
/// have a second process running this very executable (it sleeps while the variable is set).
#[test]
#[ignore]
fn sleeps_as_a_second_copy_of_this_executable() {
    if std::env::var_os("BLOCKJANITOR_TEST_SLEEP").is_some() {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}

/// Item 7: recovery's "is the writer of this intent still at work" is a question about one
/// process (PID, start time, boot), never about a name.
#[test]
fn root_a_journal_writer_is_a_process_not_a_name() {
    use blockjanitor::act::journal::Writer;
    use blockjanitor::engine::world::{LinuxWorld, World};
    let Some((_serial, s)) = real_kernel_test(&["gcc"]) else { return };
    let world = LinuxWorld::new(
        blockjanitor::host::HostRoot::default(),
        blockjanitor::snapshot::ScanOptions::default(),
        std::time::Duration::from_secs(10),
    );
    let me = Writer::this().clone();
    assert!(me.start.is_some() && me.boot.is_some(), "{me:?}");
    assert!(world.writer_alive(&me), "this process is itself");

    // A process that names itself like the agent (comm "blockjanitor-ag", as the agent's is).
    let bin = named_process(&s, "impostor");
    let impostor = start_named(&bin, &["blockjanitor-agent"]);
    let pid = impostor.0.id();
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).expect("comm");
    assert_eq!(comm.trim_end(), "blockjanitor-ag");
    let old = Writer { pid, start: None, boot: None };
    assert!(!world.writer_alive(&old), "a record without a start time: the executable decides, not the name");
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let start = blockjanitor::host::pidfd::start_time(&stat).expect("start time");
    let exact = Writer { pid, start: Some(start), boot: me.boot.clone() };
    assert!(world.writer_alive(&exact), "the very process, still running");
    assert!(
        !world.writer_alive(&Writer { start: Some(start + 1), ..exact.clone() }),
        "a PID reused by another process"
    );
    let other_boot = Writer { boot: Some("00000000-0000-4000-8000-000000000000".into()), ..exact.clone() };
    assert!(!world.writer_alive(&other_boot), "a record of another boot");
    drop(impostor);
    assert!(!world.writer_alive(&exact), "gone");

    // A second process running this very executable, as root: an old record's writer may be it.
    let copy = Killed(
        Command::new(std::env::current_exe().expect("exe"))
            .args(["--ignored", "--exact", "sleeps_as_a_second_copy_of_this_executable", "--nocapture"])
            .env("BLOCKJANITOR_TEST_SLEEP", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn a copy"),
    );
    let copy_pid = copy.0.id();
    assert!(
        world.writer_alive(&Writer { pid: copy_pid, start: None, boot: None }),
        "the same executable, as root"
    );
}

/// Item 7: a facility-0 record whose first words a user chose. `rbd: rbd0: x` is a task name
/// (15 bytes at most); the program's file is named `blocklisted`; it segfaults and the kernel
/// logs `rbd: rbd0: x[PID]: segfault at 0 ... in blocklisted[...]` at facility 0. Before issue
/// 34 the agent read that as krbd saying rbd0's client was blocklisted (a fence). A record
/// written to /dev/kmsg from user space (facility 1) never counted and still does not.
#[test]
fn root_a_task_named_like_krbd_that_segfaults_is_no_rbd_evidence() {
    use blockjanitor::discover::kmsg::{for_each_record, KernelRecord, RbdLog};
    let Some((_serial, s)) = real_kernel_test(&["gcc", "sh"]) else { return };
    let host = blockjanitor::host::HostRoot::default();
    let bin = named_process(&s, "blocklisted");
    let marker = format!("rbd: rbd0: {}", std::process::id() % 10);
    let out = Command::new("sh")
        .args(["-c", "ulimit -c 0; exec \"$0\" \"$1\" --segv", bin.to_str().expect("utf8"), &marker])
        .stdin(Stdio::null())
        .output()
        .expect("run the crashing process");
    assert!(!out.status.success(), "it segfaulted: {out:?}");
    std::fs::write("/dev/kmsg", format!("<12>rbd: rbd0: failed to reregister watch: -108 ({marker})\n"))
        .expect("write /dev/kmsg");
    let mut segv = None;
    let mut forged = None;
    for_each_record(&host, |r| {
        if r.contains(&format!(";{marker}[")) && r.contains("segfault at") {
            segv = Some(r.to_owned());
        }
        if r.contains(&format!("-108 ({marker})")) {
            forged = Some(r.to_owned());
        }
    });
    let segv = segv.expect("the kernel logged the segfault (debug.exception-trace = 1)");
    let forged = forged.expect("the user record is in the log");
    let k = KernelRecord::parse(&segv).expect("the segfault line is the kernel's own: facility 0");
    assert!(k.message.starts_with(&format!("{marker}[")) && k.message.contains(" in blocklisted["), "{segv}");
    assert_eq!(KernelRecord::parse(&forged), None, "a user record is not the kernel's: {forged}");
    // rbd0's mapping announced by the kernel (as the guest's 6.1 logs it), then the two records.
    let attach = "6,1,1000,-;rbd: rbd0: capacity 1073741824 features 0x3d";
    let log = RbdLog::from_records([attach, segv.as_str(), forged.as_str()]);
    assert_eq!(log.attached.get("rbd0"), Some(&1));
    assert!(log.fenced.is_empty(), "neither is krbd's word that rbd0 was fenced: {log:?}\n{segv}");
}
