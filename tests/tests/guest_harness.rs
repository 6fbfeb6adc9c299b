//! The guest harness itself (`tests/guest/run.sh`): when qemu dies of a signal before the guest
//! starts the scenario (qemu 10's TCG aborting in boot was seen in CI), it boots again; once the
//! scenario has started, a crash is a failure and is never retried. A boot that stalls before the
//! scenario starts (RCU stalls on a loaded host were seen in CI) is stopped and booted again.
//!
//! qemu is the real one, started through a wrapper on PATH that makes it die on purpose: before it
//! starts (the first N calls), or once the guest console says the scenario runs; or that starts it
//! paused (`-S`, its CPUs never run: a boot that never reaches init) for the first N calls.

use std::path::Path;
use std::process::{Command, Stdio};

use blockjanitor_tests::guest::{guest_dir, require_guest, Run};

/// The wrapper: aborts for the first `$CRASHES` calls (counted in `$COUNT`); with
/// `$CRASH_WHEN_RUNNING=1`, runs the real qemu and, once its console file shows
/// `init: running`, kills it and aborts itself; for the first `$STALLS` calls, starts the real
/// qemu paused.
const WRAPPER: &str = r#"#!/bin/bash
n=$(cat "$COUNT" 2>/dev/null || echo 0); echo $((n + 1)) >"$COUNT"
if (( n < ${CRASHES:-0} )); then echo "qemu-system-x86_64: wrapper: aborting on purpose" >&2; kill -ABRT $$; fi
if (( n < ${STALLS:-0} )); then exec "$REAL_QEMU" "$@" -S; fi
if [[ ${CRASH_WHEN_RUNNING:-} == 1 ]]; then
    console=
    prev=
    for a in "$@"; do [[ $prev == -serial && -z $console ]] && console=${a#file:}; prev=$a; done
    "$REAL_QEMU" "$@" & q=$!
    for _ in $(seq 600); do grep -aq '^init: running' "$console" 2>/dev/null && break; sleep 0.1; done
    kill -9 "$q"; wait "$q"
    echo "qemu-system-x86_64: wrapper: aborting while the scenario runs" >&2
    kill -ABRT $$
fi
exec "$REAL_QEMU" "$@"
"#;

/// Runs `run.sh` on a scenario that prints a line and sleeps `sleep` seconds, with the wrapper
/// first on PATH; returns the run and how many times qemu was started.
fn run_with_wrapper(env: &[(&str, &str)], sleep: u32) -> (Run, u32) {
    let prepared = Command::new(guest_dir().join("prepare.sh")).stdout(Stdio::null()).status();
    assert!(prepared.is_ok_and(|s| s.success()), "tests/guest/prepare.sh failed");
    let real = Command::new("sh").args(["-c", "command -v qemu-system-x86_64"]).output().expect("sh");
    let real = String::from_utf8_lossy(&real.stdout).trim().to_owned();
    assert!(!real.is_empty(), "no qemu-system-x86_64 on PATH after prepare.sh");

    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("mkdir");
    write_exec(&bin.join("qemu-system-x86_64"), WRAPPER);
    let scenario = dir.path().join("hello.sh");
    std::fs::write(&scenario, format!("echo hello from the guest\nsleep {sleep}\n")).expect("scenario");
    let count = dir.path().join("count");

    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(guest_dir().join("run.sh"))
        .arg(&scenario)
        .env("PATH", path)
        .env("REAL_QEMU", &real)
        .env("COUNT", &count)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run.sh");
    let starts = std::fs::read_to_string(&count).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(0);
    (Run::from_output(&out), starts)
}

fn write_exec(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

#[test]
fn root_guest_harness_boots_again_when_qemu_dies_before_the_scenario_starts() {
    if !require_guest() {
        return;
    }
    let (run, starts) = run_with_wrapper(&[("CRASHES", "2")], 0);
    run.assert_ok();
    assert_eq!(starts, 3, "two aborted boots, then the one that ran:\n{}", run.harness);
    assert!(run.output.contains("hello from the guest"), "{}", run.output);
    assert_eq!(run.harness.matches("booting again").count(), 2, "{}", run.harness);
    assert!(run.harness.contains("wrapper: aborting on purpose"), "qemu's words are shown: {}", run.harness);
}

#[test]
fn root_guest_harness_gives_up_after_its_boots() {
    if !require_guest() {
        return;
    }
    let (run, starts) = run_with_wrapper(&[("CRASHES", "9"), ("BLOCKJANITOR_GUEST_BOOTS", "2")], 0);
    assert_eq!(run.code, Some(125), "{}", run.harness);
    assert_eq!(starts, 2, "{}", run.harness);
    assert!(run.harness.contains("no GUEST-EXIT line (qemu exit 134)"), "{}", run.harness);
}

#[test]
fn root_guest_harness_never_boots_again_once_the_scenario_started() {
    if !require_guest() {
        return;
    }
    let (run, starts) = run_with_wrapper(&[("CRASH_WHEN_RUNNING", "1")], 60);
    assert_eq!(run.code, Some(125), "{}", run.harness);
    assert_eq!(starts, 1, "a crash while the scenario runs is not retried:\n{}", run.harness);
    assert!(!run.harness.contains("booting again"), "{}", run.harness);
    assert!(run.harness.contains("aborting while the scenario runs"), "{}", run.harness);
}

#[test]
fn root_guest_harness_boots_again_when_the_boot_stalls_before_the_scenario_starts() {
    if !require_guest() {
        return;
    }
    // Two boots: the deadline holds for the paused one only (the last boot has the whole timeout,
    // so a slow real boot on a loaded host does not count as a stall here).
    let env = [("STALLS", "1"), ("BLOCKJANITOR_GUEST_BOOTS", "2"), ("BLOCKJANITOR_GUEST_BOOT_DEADLINE", "5")];
    let (run, starts) = run_with_wrapper(&env, 0);
    run.assert_ok();
    assert_eq!(starts, 2, "one paused boot stopped at its deadline, then the one that ran:\n{}", run.harness);
    assert!(run.output.contains("hello from the guest"), "{}", run.output);
    assert!(run.harness.contains("did not reach init within 5s"), "{}", run.harness);
    assert_eq!(run.harness.matches("booting again").count(), 1, "{}", run.harness);
}

#[test]
fn root_guest_harness_gives_the_last_boot_its_whole_timeout() {
    if !require_guest() {
        return;
    }
    let env = [
        ("STALLS", "9"),
        ("BLOCKJANITOR_GUEST_BOOTS", "2"),
        ("BLOCKJANITOR_GUEST_BOOT_DEADLINE", "3"),
        ("BLOCKJANITOR_GUEST_TIMEOUT", "12"),
    ];
    let started = std::time::Instant::now();
    let (run, starts) = run_with_wrapper(&env, 0);
    assert_eq!(run.code, Some(124), "the last boot ends at the host timeout:\n{}", run.harness);
    assert_eq!(starts, 2, "{}", run.harness);
    assert!(started.elapsed().as_secs() >= 12, "the last boot was not cut at the boot deadline");
}
