//! Crash recovery, the journal's one writer and sight, on this machine's kernel (issues 13 and
//! 17), through the one-shot `clean --apply` (the one request workflow).
//!
//! The agent is killed by SIGKILL at its journal write points (its fault injection,
//! `BLOCKJANITOR_FAULT_SIGKILL_{AFTER,BEFORE}_{PLAN,STEP}_RECORD`: before and after the plan, each
//! intent and result, and the plan's end) while it releases a loop device's ext4 mount
//! held only in a private mount namespace and then unbinds the device; the SAME command run again
//! recovers the journal and finishes the plan before it resolves its argument. A torn journal
//! tail, two concurrent `--apply` runs, a run that finds the journal locked and runs without the
//! privileges to see are shown too. The dead multipath map's teardown, killed at every journal
//! line, is in the guest (`tests/guest/scenarios/crash-recovery.sh`).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use blockjanitor_tests::*;
use serde_json::Value;

const AFTER: &str = "BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD";
const BEFORE: &str = "BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD";
const PLAN_AFTER: &str = "BLOCKJANITOR_FAULT_SIGKILL_AFTER_PLAN_RECORD";
const PLAN_BEFORE: &str = "BLOCKJANITOR_FAULT_SIGKILL_BEFORE_PLAN_RECORD";

/// Every kill point of a run whose plan has `steps` steps, in the order of its records: before
/// and after the plan, each intent and result, and the plan's end.
fn kill_points(steps: usize) -> Vec<(&'static str, usize)> {
    let mut v = vec![(PLAN_BEFORE, 1), (PLAN_AFTER, 1)];
    for r in 1..=2 * steps {
        v.extend([(BEFORE, r), (AFTER, r)]);
    }
    v.extend([(PLAN_BEFORE, 2), (PLAN_AFTER, 2)]);
    v
}

/// `OP DEV --apply` with no grace period, its journal and state in `s`, `fault` set, and
/// `extra` arguments before the command.
fn apply(s: &Scratch, op: &str, dev: &str, fault: Option<(&str, String)>, extra: &[&str]) -> Output {
    let (journal, state) = (s.path("journal.jsonl"), s.path("state.json"));
    let mut cmd = Command::new(agent_bin());
    trust_init(&mut cmd);
    if let Some((var, n)) = fault {
        cmd.env(var, n);
    }
    cmd.args(["--journal", journal.to_str().expect("utf8"), "--state", state.to_str().expect("utf8")])
        .args(extra)
        .args(["--grace-period", "0", op, dev, "--apply"])
        .stdin(Stdio::null())
        .output()
        .expect("run blockjanitor-agent")
}

fn clean(s: &Scratch, dev: &str, fault: Option<(&str, String)>) -> Output {
    apply(s, "clean", dev, fault, &[])
}

fn release(s: &Scratch, dev: &str, fault: Option<(&str, String)>) -> Output {
    apply(s, "release", dev, fault, &[])
}

fn said(out: &Output) -> String {
    format!("exit {:?}\nstdout:\n{}\nstderr:\n{}", out.status, text(&out.stdout), text(&out.stderr))
}

fn records(s: &Scratch) -> Vec<Value> {
    journal::read(&s.path("journal.jsonl"))
}

/// The journal has no open intent (every intent has a result or a `recovered` record) and no
/// open plan (every plan has its end).
fn assert_nothing_open(journal: &[Value]) {
    for r in journal.iter().filter(|r| r["phase"] == "intent") {
        assert!(
            journal
                .iter()
                .any(|x| x["id"] == r["id"] && (x["phase"] == "result" || x["phase"] == "recovered")),
            "intent {} has no result: {journal:#?}",
            r["id"]
        );
    }
    for r in journal.iter().filter(|r| r["phase"] == "plan") {
        assert!(
            journal.iter().any(|x| x["id"] == r["id"] && x["phase"] == "plan_end"),
            "plan {} is not closed: {journal:#?}",
            r["id"]
        );
    }
}

/// An 8 MiB ext4 image bound to a loop device, mounted twice only inside a process's private
/// mount namespace (the host never sees the mounts).
struct Privately {
    lo: LoopDev,
    ns: NsProcess,
    dirs: [std::path::PathBuf; 2],
}

fn privately_mounted(s: &Scratch, img: &Path) -> Privately {
    let lo = LoopDev::attach(img);
    let (a, b) = (s.mkdir("mnt-a"), s.mkdir("mnt-b"));
    let ns = NsProcess::spawn(&format!(
        "mount {dev} {} && mount {dev} {} && exec sleep 600",
        a.display(),
        b.display(),
        dev = lo.dev
    ));
    assert!(
        wait_until(REACT, || ns.has_mount(&a) && ns.has_mount(&b)),
        "the namespace never mounted {}",
        lo.dev
    );
    Privately { lo, ns, dirs: [a, b] }
}

/// Whether the namespace of `p` still has a mount of its device.
fn still_mounted(p: &Privately) -> bool {
    p.dirs.iter().any(|d| p.ns.has_mount(d))
}

/// Kills `OP DEV --apply` at `var=n`, then runs the same command again: it must converge
/// (`converged`), close everything in the journal, and say what it resumed. Returns the
/// journal.
fn killed_then_again(
    s: &Scratch,
    op: &str,
    dev: &str,
    name: &str,
    (var, n): (&str, usize),
    steps: &[&str],
) -> (Vec<Value>, Output) {
    let out = apply(s, op, dev, Some((var, n.to_string())), &[]);
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{op} {var}={n}: killed; {}", said(&out));
    let before = records(s);
    let plan_open =
        before.iter().any(|r| r["phase"] == "plan") && !before.iter().any(|r| r["phase"] == "plan_end");
    if !before.is_empty() {
        assert_eq!(before[0]["phase"], "plan", "{var}={n}: the plan comes first: {before:#?}");
        assert_eq!(before[0]["request"]["argument"], dev);
        let journaled = before[0]["steps"].as_array().expect("steps");
        let actions: Vec<&str> = journaled.iter().filter_map(|s| s["step"]["action"].as_str()).collect();
        assert_eq!(actions, steps, "{:#}", before[0]);
        assert!(journaled.iter().all(|s| s["step"]["identity"].as_str().is_some_and(|i| !i.is_empty())));
    }
    // The same command again.
    let again = apply(s, op, dev, None, &[]);
    assert_eq!(again.status.code(), Some(0), "{op} {var}={n}: converges; {}", said(&again));
    let journal = records(s);
    assert_nothing_open(&journal);
    if plan_open {
        assert!(
            text(&again.stdout).contains(&format!("resumed the unfinished {op} of {name}")),
            "{op} {var}={n}: the second run says what it resumed: {}",
            said(&again)
        );
        let end = journal.iter().find(|r| r["phase"] == "plan_end").expect("closed");
        assert_eq!(end["id"], before[0]["id"], "{journal:#?}");
        assert_eq!(end["result"], "resumed", "{journal:#?}");
    }
    // Nothing that finished ran twice.
    for (i, _) in steps.iter().enumerate() {
        let done = journal
            .iter()
            .filter(|r| {
                r["phase"] == "intent"
                    && r["index"] == i
                    && r["plan"] == before.first().map_or(Value::Null, |p| p["id"].clone())
            })
            .filter(|r| {
                journal.iter().any(|x| x["id"] == r["id"] && x["phase"] == "result" && x["result"] == "done")
            })
            .count();
        assert!(done <= 1, "{op} {var}={n}: step {i} done twice: {journal:#?}");
    }
    (journal, again)
}

#[test]
fn root_release_and_clean_killed_after_every_journal_record_converge_when_run_again() {
    if !require_real_kernel(&["losetup", "mkfs.ext4", "unshare"]) {
        return;
    }
    let _serial = serial();
    // Release of two mounts only a private namespace has: plan, two intents and results, end.
    let unbind_points = kill_points(1);
    for (k, fault) in kill_points(2).into_iter().enumerate() {
        let s = Scratch::new();
        let img = s.ext4_image("a.img", 8);
        let p = privately_mounted(&s, &img);
        let dev = p.lo.dev.clone();
        killed_then_again(&s, "release", &dev, p.lo.name(), fault, &["detach_mount", "detach_mount"]);
        assert!(!still_mounted(&p), "{fault:?}: both mounts released");
        assert!(p.lo.is_bound(), "a release unbinds nothing");
        // Then the unbind of a device nothing holds: plan, intent, result, end.
        if let Some(&unbind) = unbind_points.get(k) {
            let s = Scratch::new();
            let lo = s.loop_file("b.img");
            killed_then_again(&s, "clean", &lo.dev, lo.name(), unbind, &["detach_loop"]);
            assert!(!lo.is_bound(), "{unbind:?}: unbound");
        }
    }
}

#[test]
fn root_an_impostor_under_the_name_of_an_interrupted_plan_is_refused() {
    let Some((_serial, s)) = real_kernel_test(&["losetup"]) else { return };
    let lo = s.loop_file("a.img");
    let dev = lo.dev.clone();
    // Killed right after the plan record: the unbind is owed.
    let out = clean(&s, &dev, Some((PLAN_AFTER, "1".into())));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", said(&out));
    assert!(lo.is_bound());
    // Someone else unbinds it and binds another file under the same name.
    sh("losetup", &["-d", &dev]);
    let other = s.sparse_file("other.img", 8);
    sh("losetup", &[&dev, other.to_str().expect("utf8")]);
    let impostor = LoopDev::adopt(lo.name(), &other);
    let again = clean(&s, &dev, None);
    assert_eq!(again.status.code(), Some(4), "refused; {}", said(&again));
    assert!(impostor.is_bound(), "the impostor was not unbound: {}", said(&again));
    let stdout = text(&again.stdout);
    assert!(
        stdout.contains("changed identity") && stdout.contains("not planned in this run"),
        "{}",
        said(&again)
    );
    let journal = records(&s);
    assert_nothing_open(&journal);
    let end = journal.iter().find(|r| r["phase"] == "plan_end").expect("the plan is closed");
    assert_eq!(end["result"], "incomplete", "{end:#}");
    drop(impostor);
}

#[test]
fn root_a_torn_journal_tail_is_ended_and_the_plan_still_resumes() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare"]) else { return };
    let img = s.ext4_image("a.img", 8);
    let p = privately_mounted(&s, &img);
    let dev = p.lo.dev.clone();
    let out = release(&s, &dev, Some((AFTER, "1".into())));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", said(&out));
    // A crash in the middle of a record: half a line, no newline.
    let mut f = std::fs::OpenOptions::new().append(true).open(s.path("journal.jsonl")).expect("journal");
    std::io::Write::write_all(&mut f, b"{\"ts\":1.5,\"id\":\"17-1-0\",\"phase\":\"res").expect("torn");
    drop(f);
    let again = release(&s, &dev, None);
    assert_eq!(again.status.code(), Some(0), "{}", said(&again));
    assert!(!still_mounted(&p), "{}", said(&again));
    let t = std::fs::read_to_string(s.path("journal.jsonl")).expect("journal");
    let lines: Vec<&str> = t.lines().collect();
    let torn =
        lines.iter().position(|l| l.ends_with("\"phase\":\"res")).expect("the torn fragment stays, alone");
    let whole: Vec<Value> = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != torn)
        .map(|(_, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("a whole record per line: {l:?}: {e}"))
        })
        .collect();
    assert!(whole.len() > torn, "records follow the fragment on lines of their own: {t}");
    assert_nothing_open(&whole);
}

#[test]
fn root_two_concurrent_applies_lose_nothing_and_a_locked_journal_names_its_holder() {
    let Some((_serial, s)) = real_kernel_test(&["losetup"]) else { return };
    let make = |name: &str| s.loop_file(name);
    let (a, b) = (make("a.img"), make("b.img"));
    let spawn = |dev: &str| {
        let mut cmd = Command::new(agent_bin());
        trust_init(&mut cmd);
        cmd.args(["--journal", s.path("journal.jsonl").to_str().expect("utf8")])
            .args(["--state", s.path("state.json").to_str().expect("utf8")])
            .args(["--grace-period", "0", "clean", dev, "--apply"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let (ca, cb) = (spawn(&a.dev), spawn(&b.dev));
    let (oa, ob) = (ca.wait_with_output().expect("a"), cb.wait_with_output().expect("b"));
    assert_eq!(oa.status.code(), Some(0), "{}", said(&oa));
    assert_eq!(ob.status.code(), Some(0), "{}", said(&ob));
    assert!(!a.is_bound() && !b.is_bound());
    let journal = records(&s);
    assert_nothing_open(&journal);
    assert_eq!(journal.iter().filter(|r| r["phase"] == "plan").count(), 2, "{journal:#?}");
    // The runs did not interleave: each plan's records are contiguous.
    let plans: Vec<usize> =
        journal.iter().enumerate().filter(|(_, r)| r["phase"] == "plan").map(|(i, _)| i).collect();
    assert_eq!(journal[plans[0] + 3]["phase"], "plan_end", "one writer at a time: {journal:#?}");

    // This process holds the lock (as a run would, naming itself): a run with a short wait is
    // refused, naming it, and writes nothing.
    let c = make("c.img");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(s.path("journal.jsonl.lock"))
        .expect("lock file");
    // SAFETY: flock on a file this test owns.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    lock.set_len(0).expect("truncate");
    std::io::Write::write_all(&mut &lock, format!("agent process {}\n", std::process::id()).as_bytes())
        .expect("name");
    let before = records(&s).len();
    let out = apply(&s, "clean", &c.dev, None, &["--lock-wait", "1"]);
    assert_eq!(out.status.code(), Some(4), "refused; {}", said(&out));
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "one line: {}", said(&out));
    assert!(
        stdout.contains(&format!("agent process {}", std::process::id())),
        "names the holder: {}",
        said(&out)
    );
    assert!(c.is_bound());
    assert_eq!(records(&s).len(), before, "nothing written without the lock");
    drop(lock);
    let out = clean(&s, &c.dev, None);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(!c.is_bound());
}

/// Runs the agent as nobody (uid and gid 65534, no groups, no capabilities).
fn as_nobody(args: &[&str]) -> Output {
    let mut cmd = Command::new("setpriv");
    trust_init(&mut cmd);
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run setpriv")
}

#[test]
fn root_a_run_without_sight_refuses_apply_and_says_its_view_is_incomplete() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "setpriv"]) else {
        return;
    };
    let img = s.ext4_image("a.img", 8);
    let p = privately_mounted(&s, &img);
    for op in ["release", "clean"] {
        let out = as_nobody(&["--grace-period", "0", op, &p.lo.dev, "--apply"]);
        assert_eq!(out.status.code(), Some(4), "{op}: refused; {}", said(&out));
        let stdout = text(&out.stdout);
        assert_eq!(stdout.lines().count(), 1, "{op}: one clear line; {}", said(&out));
        assert!(
            stdout.contains("--apply refused")
                && stdout.contains("not root")
                && stdout.contains("run it as root"),
            "{op}: names what it cannot see and what to do: {}",
            said(&out)
        );
    }
    assert!(p.lo.is_bound());
    assert!(still_mounted(&p), "the private mounts are untouched");
    // Without --apply: an answer, but the first line says it is incomplete, and the exit code
    // says unknown.
    let out = as_nobody(&["--grace-period", "0", "release", &p.lo.dev]);
    assert_eq!(out.status.code(), Some(3), "dry run: unknown; {}", said(&out));
    assert!(text(&out.stdout).starts_with("INCOMPLETE VIEW"), "{}", said(&out));
    let out = as_nobody(&["scan"]);
    assert_eq!(out.status.code(), Some(3), "scan: unknown, not 0; {}", said(&out));
    let first = text(&out.stdout).lines().next().unwrap_or_default().to_owned();
    assert!(first.starts_with("INCOMPLETE VIEW") && first.contains("run it as root"), "{first}");
    // As root the same scan sees everything and says nothing of the kind.
    let out = agent(&["scan"]);
    assert!(!text(&out.stdout).starts_with("INCOMPLETE VIEW"), "{}", said(&out));
}

/// A kubeconfig in `s` whose server is a loopback port nothing listens on.
fn kubeconfig_nowhere(s: &Scratch) -> std::path::PathBuf {
    let path = s.path("nowhere.kubeconfig");
    std::fs::write(
        &path,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user:\n    token: not-a-token\n",
    )
    .expect("kubeconfig");
    path
}

/// Issue 34, item 2: a daemon that starts with an unfinished plan in its journal resumes it
/// through the one workflow once the Kubernetes API's view is up, never before. `release DEV
/// --apply` is killed right after its plan record (two releases owed); a daemon
/// in release mode (which resumes by itself, and cleans only kubelet's volumes: none here)
/// whose API does not answer leaves the plan open and its mounts and device as they are, and
/// says it waits for the API; a daemon started with `--no-kubernetes` (the operator's word)
/// then finishes it, audited as the daemon's resume.
#[test]
fn root_the_daemon_resumes_an_unfinished_plan_only_once_the_api_answers() {
    use blockjanitor_tests::daemon::Daemon;
    if !require_real_kernel(&["losetup", "mkfs.ext4", "unshare"]) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let img = s.ext4_image("a.img", 8);
    let p = privately_mounted(&s, &img);
    let dev = p.lo.dev.clone();
    let out = release(&s, &dev, Some((PLAN_AFTER, "1".into())));
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}", said(&out));
    let open = |s: &Scratch| {
        let j = records(s);
        j.iter().any(|r| r["phase"] == "plan") && !j.iter().any(|r| r["phase"] == "plan_end")
    };
    assert!(open(&s), "the plan is left open: {:#?}", records(&s));

    let kubelet = s.mkdir("kubelet");
    let kdir = kubelet.to_str().expect("utf8");
    let nowhere = kubeconfig_nowhere(&s);
    let common =
        ["--mode", "release", "--grace-period", "0", "--rescan-interval", "1", "--kubelet-dir", kdir];
    let mut args = common.to_vec();
    args.extend(["--kubeconfig", nowhere.to_str().expect("utf8")]);
    let mut d = Daemon::start(s.dir.path(), &args);
    std::thread::sleep(Duration::from_secs(4));
    assert!(still_mounted(&p), "resumed with no word from the API:\n{}", d.log_text());
    assert!(open(&s), "the plan stays open for when the API answers: {:#?}", records(&s));
    assert!(d.log_text().contains("journal recovery waits for the Kubernetes API"), "{}", d.log_text());
    d.stop();
    drop(d);

    let mut args = common.to_vec();
    args.push("--no-kubernetes");
    let d = Daemon::start(s.dir.path(), &args);
    // Both mounts gone, and the plan's end journaled (the last step's result is written right
    // after its mount goes).
    assert!(
        wait_until(Duration::from_secs(20), || !still_mounted(&p) && !open(&s)),
        "--no-kubernetes: the daemon finishes the plan at start:\n{}",
        d.log_text()
    );
    // The last detach's result (and the plan's end) is written after the unmount is seen gone.
    assert!(
        wait_until(Duration::from_secs(10), || records(&s).iter().any(|r| r["phase"] == "plan_end")),
        "the resumed plan is closed: {:#?}",
        records(&s)
    );
    let journal = records(&s);
    assert_nothing_open(&journal);
    let end = journal.iter().find(|r| r["phase"] == "plan_end").expect("closed");
    assert_eq!(end["result"], "resumed", "{journal:#?}");
    let log = d.log_text();
    assert!(
        log.lines().any(|l| l.contains("\"phase\":\"resume\"") && l.contains("daemon mode release at start")),
        "the resume is audited with who resumed it:\n{log}"
    );
}
