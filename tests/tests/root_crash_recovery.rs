//! Crash recovery on this machine's kernel (issue 13), through the one-shot `clean --apply`: the
//! agent is killed by SIGKILL at its journal write point (its fault injection,
//! `BLOCKJANITOR_FAULT_SIGKILL_{AFTER,BEFORE}_STEP_RECORD`) in the middle of unbinding a loop
//! device, and the next `--apply` closes the interrupted step in the journal, saying what it
//! found, before anything else. The dead multipath map's teardown, killed at every phase of every
//! step under the daemon, is `root_guest_kill9_at_each_journal_phase_converges` (in the guest).

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Output, Stdio};

use blockjanitor_tests::*;
use serde_json::Value;

/// `clean LOOP --apply` with no grace period, its journal and state in `s`, and `fault` set.
fn clean(s: &Scratch, lo: &LoopDev, fault: Option<(&str, &str)>) -> Output {
    let (journal, state) = (s.path("journal.jsonl"), s.path("state.json"));
    let mut cmd = Command::new(agent_bin());
    trust_init(&mut cmd);
    if let Some((var, n)) = fault {
        cmd.env(var, n);
    }
    cmd.args(["--journal", journal.to_str().expect("utf8"), "--state", state.to_str().expect("utf8")])
        .args(["--grace-period", "0", "clean", lo.name(), "--apply"])
        .stdin(Stdio::null())
        .output()
        .expect("run blockjanitor-agent")
}

fn records(s: &Scratch) -> Vec<Value> {
    std::fs::read_to_string(s.path("journal.jsonl"))
        .expect("journal")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("journal line {l:?}: {e}")))
        .collect()
}

/// Runs `clean --apply` killed at `fault`, checks it died by SIGKILL leaving `detach_loop` open,
/// then once more without the fault; returns both runs' records and the second run's output.
fn killed_then_rerun(s: &Scratch, lo: &LoopDev, fault: (&str, &str)) -> (Vec<Value>, Output) {
    let out = clean(s, lo, Some(fault));
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{fault:?}: killed by its fault point; stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let open = records(s);
    assert_eq!(open.len(), 1, "the killed run left one intent: {open:#?}");
    assert_eq!(open[0]["phase"], "intent");
    assert_eq!(open[0]["step"]["action"], "detach_loop");
    let out = clean(s, lo, None);
    (records(s), out)
}

/// A loop device bound to an 8 MiB file of the scratch directory, held by nothing.
fn unheld_loop(s: &Scratch) -> LoopDev {
    let img = s.path("a.img");
    std::fs::File::create(&img).expect("image").set_len(8 << 20).expect("size");
    LoopDev::attach(&img)
}

#[test]
fn root_apply_killed_before_its_kernel_call_is_replanned_by_the_next_apply() {
    if !require_real_kernel(&["losetup"]) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let lo = unheld_loop(&s);
    let (journal, out) = killed_then_rerun(&s, &lo, ("BLOCKJANITOR_FAULT_SIGKILL_AFTER_STEP_RECORD", "1"));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    assert!(!lo.is_bound(), "the re-planned unbind ran");
    let phases: Vec<&str> = journal.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert_eq!(phases, ["intent", "recovered", "intent", "result"], "{journal:#?}");
    assert_eq!(journal[1]["id"], journal[0]["id"], "the recovered record closes the interrupted intent");
    assert_eq!(journal[1]["result"], "replan", "{:#}", journal[1]);
    assert_eq!(journal[2]["step"], journal[0]["step"], "the same step, against the same identity");
    assert_eq!(journal[3]["result"], "done");
    assert!(text(&out.stderr).contains("recovered interrupted step"), "{}", text(&out.stderr));
}

#[test]
fn root_apply_killed_after_its_kernel_call_is_found_done_by_the_next_apply() {
    if !require_real_kernel(&["losetup"]) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let lo = unheld_loop(&s);
    // Killed right before the result record: LOOP_CLR_FD was made, the journal does not know.
    let (journal, out) = killed_then_rerun(&s, &lo, ("BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD", "2"));
    assert_eq!(out.status.code(), Some(0), "stdout:\n{}\nstderr:\n{}", text(&out.stdout), text(&out.stderr));
    assert!(!lo.is_bound());
    let phases: Vec<&str> = journal.iter().filter_map(|r| r["phase"].as_str()).collect();
    assert_eq!(phases, ["intent", "recovered"], "nothing runs twice: {journal:#?}");
    assert_eq!(journal[1]["id"], journal[0]["id"]);
    assert_eq!(journal[1]["result"], "in_place", "{:#}", journal[1]);
    let detail = journal[1]["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains(&format!("detach_loop of {}", lo.name()))
            && detail.contains("unbound loop device now"),
        "{detail}"
    );
}
