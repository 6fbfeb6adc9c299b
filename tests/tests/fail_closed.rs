//! Real-kernel acceptance tests for issue 9, "One engine that fails closed": no destructive step
//! on blind, stale or reused evidence. Each scene is one hole the issue names, reproduced on this
//! machine's kernel (loop, ext4, btrfs, mount and PID namespaces, capabilities), with the
//! behaviour the fixed agent promises:
//!
//! 1. btrfs (an anonymous `0:NN` superblock) on a loop device, mounted on the host: `in_use`, and
//!    `clean --apply` refuses (no `LOOP_CLR_FD`, not even a deferred one).
//! 2. The same btrfs mounted only in a foreign namespace: found, with the namespace's process.
//! 3. A loop device backed by another loop device's node (`lo_rdevice`): a `loop_backing` holder.
//! 4. A loop number re-bound to another file between `Plan` and `Apply`: Apply refuses with
//!    `FAILED_PRECONDITION`, naming both identities.
//! 5. A state file from another boot (its `boot_id`) restarts the grace clock.
//! 6. A slave (`master:N`) copy of a live host mount is never released; a private copy of a mount
//!    the host let go of still is (incident 5).
//! 7. A plan of more steps than `--max-actions-per-minute` still runs (it is not starved).
//! 8. Acting outside the host's PID namespace refuses, naming `hostPID: true`; reading works.
//! 9. A process the agent cannot inspect (no CAP_SYS_PTRACE) is a blind spot: candidates are
//!    `unknown`, never `stale`, and `clean --apply` refuses.
//! 10. Where PID 1 itself cannot be inspected (this sandbox), it is a blind spot unless trusted
//!     with `BLOCKJANITOR_TRUST_UNREADABLE_INIT` (which the helpers set: see `trust_init`).
//! 11. (issue 17) `release --apply` is held to the clean path's standard: a mount that exists only
//!     in a private namespace whose process has its cwd, an open file or a mapping on it is not
//!     detached (exit 2, the holder named), unless `--force-busy REASON` (the reason audited); a
//!     blind spot refuses it; a slave of a slave of a live host mount is never released; a copy
//!     nobody uses is released and the device freed.
//!
//! Every object is owned by a guard (`LoopDev`, `HostMount`, `NsProcess`, `Daemon`) that cleans
//! up on drop, even when an assertion fails; guards are declared so that they drop in the safe
//! order (processes, then mounts, then loop devices).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;
use serde_json::Value;
use tonic::Code;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];
const BTRFS: &[&str] = &["losetup", "mkfs.btrfs", "unshare", "mount", "umount"];

/// The scratch directory's state file and journal, as global flags: no test touches
/// /var/lib/blockjanitor.
fn files(s: &Scratch) -> [String; 4] {
    [
        "--state".into(),
        s.path("state.json").to_string_lossy().into_owned(),
        "--journal".into(),
        s.path("journal.jsonl").to_string_lossy().into_owned(),
    ]
}

/// `files(s)` followed by `rest`.
fn with_files<'a>(f: &'a [String; 4], rest: &[&'a str]) -> Vec<&'a str> {
    f.iter().map(String::as_str).chain(rest.iter().copied()).collect()
}

/// `holders DEV --output json` (exit 2 when it names a holder, else 0), with the scratch state
/// file and journal.
fn holders(s: &Scratch, dev: &str, global: &[&str]) -> Value {
    let f = files(s);
    agent_holders(&with_files(&f, global), dev)
}

fn holders_of_kind<'a>(v: &'a Value, kind: &str) -> Vec<&'a Value> {
    v["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("no holders array: {v:#}"))
        .iter()
        .filter(|h| h["kind"] == kind)
        .collect()
}

/// The scratch journal's records (none when it does not exist).
fn journal_records(s: &Scratch) -> Vec<Value> {
    journal::read(&s.path("journal.jsonl"))
}

/// Intents of `action` in the scratch journal.
fn intents(s: &Scratch, action: &str) -> Vec<Value> {
    journal::intents(&journal_records(s), action).into_iter().cloned().collect()
}

/// How many intents of `action` in the scratch journal have a result `done`.
fn done(s: &Scratch, action: &str) -> usize {
    journal::done(&journal_records(s), action)
}

fn journal_text(s: &Scratch) -> String {
    journal::text(&s.path("journal.jsonl"))
}

/// The loop device's autoclear flag as sysfs shows it ("1" once `LOOP_CLR_FD` was deferred).
fn autoclear(lo: &LoopDev) -> String {
    std::fs::read_to_string(format!("/sys/class/block/{}/loop/autoclear", lo.name()))
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// The line for mount point `path` in `/proc/<who>/mountinfo` (`who`: a pid or "self").
fn mountinfo_line(who: &str, path: &Path) -> Option<String> {
    let t = path.to_string_lossy().into_owned();
    std::fs::read_to_string(format!("/proc/{who}/mountinfo"))
        .ok()?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(t.as_str()))
        .map(str::to_owned)
}

/// True when `text` mentions `pid <pid>` (and not a longer number that starts the same).
fn names_pid(text: &str, pid: u32) -> bool {
    let needle = format!("pid {pid}");
    text.match_indices(&needle)
        .any(|(i, _)| !text[i + needle.len()..].starts_with(|c: char| c.is_ascii_digit()))
}

/// True when `text` mentions `pid N` for some number N.
fn names_some_pid(text: &str) -> bool {
    text.match_indices("pid ").any(|(i, _)| text[i + 4..].starts_with(|c: char| c.is_ascii_digit()))
}

/// The scan's blind spots, asserting the field's shape.
fn blind_spots(v: &Value) -> Vec<(String, String)> {
    v["blind_spots"]
        .as_array()
        .unwrap_or_else(|| panic!("no top-level blind_spots array in the output: {v:#}"))
        .iter()
        .map(|b| {
            let spot = b.as_str().unwrap_or_else(|| panic!("a blind spot is one line: {b}"));
            let (what, hide) = blind_spot_parts(spot);
            assert!(!hide.is_empty(), "a blind spot says what it could hide a holder of: {spot}");
            (what, hide)
        })
        .collect()
}

fn reasons_mention(v: &Value, words: &str) -> bool {
    v["reasons"].as_array().is_some_and(|r| r.iter().any(|r| r.as_str().is_some_and(|r| r.contains(words))))
}

// ---------------------------------------------------------------------------------------------
// 1, 2: btrfs, whose mounts show an anonymous 0:NN device, never the block device's number.

#[test]
fn root_btrfs_on_a_loop_device_mounted_on_the_host_is_in_use_and_clean_refuses() {
    let Some((_serial, s)) = real_kernel_test(BTRFS) else { return };
    let lo = LoopDev::attach(&s.btrfs_image("btrfs.img"));
    let mnt = s.mkdir("mnt");
    let m = HostMount::new(&lo.dev, &mnt, &[]);
    let line = mountinfo_line("self", &mnt).expect("mounted");
    assert!(
        line.contains(" - btrfs ") && line.split(' ').nth(2).is_some_and(|d| d.starts_with("0:")),
        "{line}"
    );

    let v = holders(&s, &lo.dev, &[]);
    let mounts = holders_of_kind(&v, "mount");
    assert!(
        mounts.iter().any(|h| h["fstype"] == "btrfs"
            && h["in_host_namespace"] == true
            && h["mount_point"] == utf8(&mnt)),
        "btrfs on {} is mounted on the host at {} (mountinfo: {line}), yet no btrfs mount holder: {v:#}",
        lo.dev,
        mnt.display()
    );
    assert_eq!(v["verdict"], "in_use", "{v:#}");

    let f = files(&s);
    let out = agent(&with_files(&f, &["--grace-period", "0", "clean", &lo.dev, "--apply"]));
    let said = format!("stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert!(lo.is_bound(), "clean detached a loop device under a mounted btrfs: {said}");
    assert_eq!(
        autoclear(&lo),
        "0",
        "clean set autoclear (a deferred LOOP_CLR_FD) under a mounted btrfs: {said}"
    );
    assert_eq!(out.status.code(), Some(2), "refused, still held: {said}");
    assert!(intents(&s, "detach_loop").is_empty(), "no detach_loop intent: {}", journal_text(&s));
    assert!(m.is_mounted());
}

#[test]
fn root_btrfs_mounted_only_in_a_foreign_namespace_is_found() {
    let Some((_serial, s)) = real_kernel_test(BTRFS) else { return };
    let lo = LoopDev::attach(&s.btrfs_image("btrfs.img"));
    let mnt = s.mkdir("mnt");
    let m = HostMount::new(&lo.dev, &mnt, &[]);
    let holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    m.umount();
    assert!(!m.is_mounted() && holder.has_mount(&mnt), "only the foreign copy is left");

    let v = holders(&s, &lo.dev, &[]);
    let mounts = holders_of_kind(&v, "mount");
    let found = mounts.iter().find(|h| {
        h["fstype"] == "btrfs"
            && h["in_host_namespace"] == false
            && h["pids"].as_array().is_some_and(|p| p.contains(&Value::from(holder.pid())))
    });
    assert!(
        found.is_some(),
        "btrfs on {} is mounted in the namespace of pid {} (mountinfo: {:?}), yet no foreign btrfs mount holder with that pid: {v:#}",
        lo.dev,
        holder.pid(),
        mountinfo_line(&holder.pid().to_string(), &mnt)
    );
    let h = found.expect("found");
    assert_eq!(h["mount_namespace"], holder.ns_inode(), "{h:#}");
    assert_eq!(h["mount_point"], utf8(&mnt), "{h:#}");
    assert_eq!(v["verdict"], "in_use", "{v:#}");
}

// ---------------------------------------------------------------------------------------------
// 3: a loop device on top of another loop device's node.

#[test]
fn root_loop_on_loop_is_a_loop_backing_holder_and_clean_refuses() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lower = s.loop_file("lower.img");
    // Declared after `lower`, so dropped first.
    let upper = LoopDev::attach(Path::new(&lower.dev));
    assert!(upper.is_bound(), "{} is backed by the node {}", upper.dev, lower.dev);

    let v = holders(&s, &lower.dev, &[]);
    let lb = holders_of_kind(&v, "loop_backing");
    assert!(
        lb.iter().any(|h| h["device"] == upper.name()),
        "{} is backed by the device node {} (lo_rdevice), yet no loop_backing holder {}: {v:#}",
        upper.name(),
        lower.dev,
        upper.name()
    );
    assert_eq!(v["verdict"], "in_use", "{v:#}");

    let f = files(&s);
    let out = agent(&with_files(&f, &["--grace-period", "0", "clean", &lower.dev, "--apply"]));
    let said = format!("stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert_eq!(
        autoclear(&lower),
        "0",
        "clean set autoclear on {} under {}: {said}",
        lower.name(),
        upper.name()
    );
    assert_eq!(out.status.code(), Some(2), "refused, still held: {said}");
    assert!(lower.is_bound() && upper.is_bound(), "both still bound: {said}");
    assert!(intents(&s, "detach_loop").is_empty(), "no detach_loop intent: {}", journal_text(&s));
}

// ---------------------------------------------------------------------------------------------
// 4: identity, not numbers.

/// Polls GetDevice until `f` holds (15 s at most); returns the last answer.
async fn wait_device(sock: &Path, name: &str, mut f: impl FnMut(&pb::Device) -> bool) -> Option<pb::Device> {
    let mut c = unix_client(sock).await;
    let start = Instant::now();
    loop {
        let d = c.get_device(pb::GetDeviceRequest { device: name.into() }).await.ok().map(|d| d.into_inner());
        if d.as_ref().is_some_and(&mut f) || start.elapsed() > Duration::from_secs(15) {
            return d;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn root_apply_refuses_a_loop_number_rebound_to_another_file_since_plan() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let img_a = s.sparse_file("a.img", 8);
    let img_b = s.sparse_file("b.img", 8);
    let d = Daemon::start(s.dir.path(), &["--grace-period", "0", "--rescan-interval", "1"]);
    let lo_a = LoopDev::attach(&img_a);
    let name = lo_a.name().to_owned();
    let rt = rt();

    let seen = rt.block_on(wait_device(&d.socket, &name, |dev| dev.loop_backing_file == utf8(&img_a)));
    assert!(
        seen.as_ref().is_some_and(|dev| dev.loop_backing_file == utf8(&img_a)),
        "the daemon never listed {name} bound to {}: {seen:?}; log:\n{}",
        img_a.display(),
        d.log_text()
    );
    let plan = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        c.plan(pb::PlanRequest { devices: vec![name.clone()], ..Default::default() })
            .await
            .expect("Plan")
            .into_inner()
    });
    let p = plan
        .plans
        .iter()
        .find(|p| p.device == name)
        .unwrap_or_else(|| panic!("no plan for {name}: {plan:?}"));
    assert_eq!(p.outcome, "done", "an unheld loop device past its grace period may go: {p:?}");
    let planned = p.identity.clone();

    // The number now stands for another device.
    sh("losetup", &["-d", &lo_a.dev]);
    sh("losetup", &[&lo_a.dev, utf8(&img_b)]);
    let lo_b = LoopDev::adopt(&name, &img_b);
    assert!(lo_b.is_bound());
    let now = rt.block_on(wait_device(&d.socket, &name, |dev| dev.loop_backing_file == utf8(&img_b)));
    let now = now.filter(|dev| dev.loop_backing_file == utf8(&img_b)).unwrap_or_else(|| {
        panic!("the daemon never rescanned {name} bound to {}; log:\n{}", img_b.display(), d.log_text())
    });
    let current = now.identity.clone();

    let applied = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        c.apply(pb::ApplyRequest {
            devices: vec![name.clone()],
            identities: vec![planned.clone()],
            ..Default::default()
        })
        .await
    });
    let bound = lo_b.is_bound();
    let e = match applied {
        Err(e) => e,
        Ok(r) => panic!(
            "Apply carried out a plan made for {name} = {} on {name} = {} (planned identity {planned:?}, now {current:?}); \
             {name} still bound to {}: {bound}; response: {:?}",
            img_a.display(),
            img_b.display(),
            img_b.display(),
            r.into_inner()
        ),
    };
    assert!(bound, "{name} was detached from {} although Apply failed: {e:?}", img_b.display());
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(!planned.is_empty(), "Plan gave no identity for {name}: {p:?}");
    assert!(!current.is_empty(), "GetDevice gave no identity for {name}: {now:?}");
    assert_ne!(planned, current, "a loop device re-bound to another file has another identity");
    assert!(
        e.message().contains(&planned) && e.message().contains(&current),
        "the refusal names the planned identity {planned:?} and the current one {current:?}: {:?}",
        e.message()
    );
    assert!(intents(&s, "detach_loop").is_empty(), "no detach_loop intent: {}", journal_text(&s));
    drop(d);
}

// ---------------------------------------------------------------------------------------------
// 5: the state file belongs to one boot.

#[test]
fn root_state_file_from_another_boot_restarts_the_grace_clock() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = s.loop_file("idle.img");
    let state = s.path("state.json");
    let run = || holders(&s, &lo.dev, &["--grace-period", "2"]);

    let v = run();
    assert_eq!(v["verdict"], "suspect", "first sight: {v:#}");
    std::thread::sleep(Duration::from_secs(3));
    let v = run();
    assert_eq!(v["verdict"], "stale", "unheld for longer than the grace period: {v:#}");

    let mut saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state file written")).expect("JSON");
    assert!(
        saved.get("boot_id").is_some_and(|b| b.as_str().is_some_and(|b| !b.is_empty())),
        "the state file is not stamped with the boot id (top-level \"boot_id\"), so its clocks survive a reboot: {saved}"
    );
    saved["boot_id"] = Value::from("00000000-0000-0000-0000-000000000000");
    std::fs::write(&state, serde_json::to_vec(&saved).expect("JSON")).expect("rewrite state");

    let v = run();
    assert_eq!(
        v["verdict"], "suspect",
        "clocks from another boot mean nothing: the grace period starts again: {v:#}"
    );
    let restamped: Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("JSON");
    assert_ne!(
        restamped["boot_id"], "00000000-0000-0000-0000-000000000000",
        "re-stamped with this boot: {restamped}"
    );
    std::thread::sleep(Duration::from_secs(3));
    let v = run();
    assert_eq!(v["verdict"], "stale", "the restarted clock runs on: {v:#}");
}

// ---------------------------------------------------------------------------------------------
// 6: release and propagation.

#[test]
fn root_release_leaves_a_slave_copy_of_a_live_host_mount_alone() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let m = HostMount::new(&lo.dev, &mnt, &[]);
    sh("mount", &["--make-shared", utf8(&mnt)]);
    let host_line = mountinfo_line("self", &mnt).expect("mounted");
    let group = host_line
        .split(' ')
        .find_map(|f| f.strip_prefix("shared:"))
        .unwrap_or_else(|| panic!("--make-shared gave no peer group: {host_line}"))
        .to_owned();
    // As a systemd unit with PrivateTmp: a slave copy, receiving the host's mount events.
    let holder = NsProcess::spawn_with("slave", "exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    let copy = mountinfo_line(&holder.pid().to_string(), &mnt).expect("copy");
    assert!(
        copy.split(' ').any(|f| f == format!("master:{group}")),
        "a slave copy of shared:{group}: {copy}"
    );

    let f = files(&s);
    let out = agent(&with_files(&f, &["release", &lo.dev, "--apply", "--output", "json"]));
    let said = format!("stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert!(
        holder.has_mount(&mnt),
        "release detached a slave (master:{group}) copy of a mount that is live on the host: {said}"
    );
    assert!(intents(&s, "detach_mount").is_empty(), "no detach_mount intent: {}", journal_text(&s));
    assert!(matches!(out.status.code(), Some(0 | 2)), "nothing to do (0) or still held (2): {said}");
    let r: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {said}"));
    let ns = holder.ns_inode();
    let left = r["plans"][0]["left_alone"].as_array().cloned().unwrap_or_default();
    assert!(
        left.iter().any(|l| l.as_str().is_some_and(|t| t.contains(&ns.to_string()) && t.contains("slave"))),
        "the copy in namespace {ns} is left alone because it is a slave: {r:#}"
    );
    let table = text(&agent(&with_files(&f, &["release", &lo.dev])).stdout);
    assert!(table.contains("slave"), "the table says why: {table}");
    assert!(m.is_mounted(), "the host's mount is untouched");
}

#[test]
fn root_release_still_detaches_a_private_copy_of_a_mount_the_host_let_go() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let m = HostMount::new(&lo.dev, &mnt, &[]);
    sh("mount", &["--make-shared", utf8(&mnt)]);
    // The same shared host mount as above, but a private copy (node_exporter, incident 5).
    let mut holder = NsProcess::spawn_with("private", "exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    let copy = mountinfo_line(&holder.pid().to_string(), &mnt).expect("copy");
    assert!(!copy.contains("master:") && !copy.contains("shared:"), "a private copy: {copy}");
    m.umount();
    assert!(holder.has_mount(&mnt), "the private copy outlives the host's unmount");

    let f = files(&s);
    let out = agent(&with_files(&f, &["release", &lo.dev, "--apply"]));
    let said = format!("stdout: {}\nstderr: {}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(!holder.has_mount(&mnt), "the private copy was detached: {said}");
    assert!(holder.is_alive(), "no process is killed");
    assert_eq!(done(&s, "detach_mount"), 1, "{}", journal_text(&s));
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "the filesystem is gone");
}

// ---------------------------------------------------------------------------------------------
// 7: the per-minute budget never starves a plan.

#[test]
fn root_release_mode_runs_a_plan_larger_than_the_per_minute_budget() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    // A kubelet directory with one CSI volume staged the pre-1.24 way and no pod using it.
    let (kdir, gm) = s.staged_csi_volume("two");
    let (host_mount, lo) = s.loop_mount("two.img", &gm);
    // Two processes in namespaces of their own keep copies; kubelet unmounts on the host.
    let mut first = NsProcess::spawn("exec sleep 1000");
    let mut second = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || first.has_mount(&gm) && second.has_mount(&gm)));
    host_mount.umount();

    let d = Daemon::start(
        s.dir.path(),
        &[
            "--mode",
            "release",
            "--max-actions-per-minute",
            "1",
            "--rescan-interval",
            "1",
            "--kubelet-dir",
            utf8(&kdir),
        ],
    );
    // Wait for the journal's results, not only for the mounts to vanish (a result line is
    // written after the umount2 it records).
    let finished = wait_until(Duration::from_secs(20), || {
        !first.has_mount(&gm) && !second.has_mount(&gm) && done(&s, "detach_mount") == 2
    });
    assert!(
        finished,
        "one plan of 2 steps with a budget of 1 a minute must still run: copies left: first {}, second {}; \
         journal:\n{}\nlog:\n{}",
        first.has_mount(&gm),
        second.has_mount(&gm),
        journal_text(&s),
        d.log_text()
    );
    assert!(first.is_alive() && second.is_alive(), "no process is killed");
    assert!(
        wait_until(Duration::from_secs(10), || !lo.is_bound()),
        "the loop device auto-cleared once released"
    );
}

// ---------------------------------------------------------------------------------------------
// 8: hostPID.

/// `unshare --pid --fork --mount-proc --kill-child <agent> ARGS`: the agent as PID 1 of a PID
/// namespace of its own (as in a pod without hostPID).
fn in_pid_namespace(args: &[&str]) -> Command {
    let mut c = Command::new("unshare");
    trust_init(&mut c).args(["--pid", "--fork", "--mount-proc", "--kill-child"]).arg(agent_bin()).args(args);
    c.stdin(Stdio::null());
    c
}

#[test]
fn root_acting_outside_the_host_pid_namespace_is_refused() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = s.loop_file("free.img");
    let f = files(&s);

    let out = in_pid_namespace(&with_files(&f, &["clean", &lo.dev, "--grace-period", "0", "--apply"]))
        .output()
        .expect("unshare");
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert!(
        lo.is_bound(),
        "clean --apply acted from a PID namespace of its own, seeing none of the host's processes: {said}"
    );
    assert_eq!(out.status.code(), Some(4), "refused: {said}");
    assert!(text(&out.stdout).contains("hostPID: true"), "{said}");
    assert!(intents(&s, "detach_loop").is_empty(), "no detach_loop intent: {}", journal_text(&s));

    // serve in clean mode refuses to start there.
    let log = s.path("serve-clean.log");
    let sock = s.path("clean.sock");
    let mut c = in_pid_namespace(&[
        "--journal",
        &f[3],
        "serve",
        "--socket",
        utf8(&sock),
        "--mode",
        "clean",
        "--grace-period",
        "0",
        "--rescan-interval",
        "1",
    ]);
    c.stdout(Stdio::null()).stderr(std::fs::File::create(&log).expect("log"));
    let mut serve = Killed(c.spawn().expect("spawn serve"));
    let mut status = None;
    wait_until(Duration::from_secs(10), || {
        status = serve.0.try_wait().ok().flatten();
        status.is_some()
    });
    let serve_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(lo.is_bound(), "serve --mode clean acted from a PID namespace of its own: {serve_log}");
    let status = status.unwrap_or_else(|| {
        panic!("serve --mode clean kept running outside the host's PID namespace:\n{serve_log}")
    });
    assert_eq!(status.code(), Some(1), "{serve_log}");
    assert!(serve_log.contains("hostPID: true"), "{serve_log}");
    drop(serve);

    // Reading is allowed: serve in report mode starts and answers.
    let log = s.path("serve-report.log");
    let sock = s.path("report.sock");
    let mut c = in_pid_namespace(&["--journal", &f[3], "serve", "--socket", utf8(&sock)]);
    c.stdout(Stdio::null()).stderr(std::fs::File::create(&log).expect("log"));
    let mut serve = Killed(c.spawn().expect("spawn serve"));
    let node = rt().block_on(async {
        let start = Instant::now();
        loop {
            if sock.exists() {
                if let Ok(ch) = blockjanitor_tests::daemon::unix_channel(&sock).await {
                    let mut c = blockjanitor_proto::v1::agent_client::AgentClient::new(ch);
                    if let Ok(n) = c.get_node(pb::GetNodeRequest {}).await {
                        return Some(n.into_inner());
                    }
                }
            }
            if start.elapsed() > Duration::from_secs(20) {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let serve_log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(node.is_some(), "serve (report mode) must run outside the host's PID namespace:\n{serve_log}");
    assert!(matches!(serve.0.try_wait(), Ok(None)), "still serving:\n{serve_log}");
    assert!(lo.is_bound());
}

/// Issue 34, item 3: `holders DEV` run in a PID namespace of its own, while a host process has
/// DEV open, sees none of the host's processes and gets no error for them: it must not answer
/// "free" (exit 0). Its first line is INCOMPLETE naming the PID namespace, the exit is 3
/// (unknown), and the JSON's blind spots say the same. Run again through a procfs of the host's
/// namespace from below (no `--mount-proc`), it sees the holder but cannot tell its own files
/// from others': still a blind spot.
#[test]
fn root_holders_outside_the_host_pid_namespace_is_unknown_not_free() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = s.loop_file("held.img");
    let f = files(&s);
    let mut opener = Command::new("sh");
    opener.args(["-c", &format!("exec 3<{} && exec sleep 1000", lo.dev)]).stdin(Stdio::null());
    let opener = Killed(opener.spawn().expect("spawn the opener"));
    assert!(
        wait_until(Duration::from_secs(5), || {
            std::fs::read_link(format!("/proc/{}/fd/3", opener.0.id())).is_ok_and(|p| p == Path::new(&lo.dev))
        }),
        "the opener never opened {}",
        lo.dev
    );

    let out = in_pid_namespace(&with_files(&f, &["holders", &lo.dev])).output().expect("unshare");
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "unknown, not free: {said}");
    let first = stdout.lines().next().unwrap_or_default();
    assert!(first.starts_with("INCOMPLETE"), "the first line says the view is incomplete: {said}");
    assert!(first.contains("PID namespace") && first.contains("hostPID: true"), "{said}");

    let out = in_pid_namespace(&with_files(&f, &["holders", &lo.dev, "--output", "json"]))
        .output()
        .expect("unshare");
    let v: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("json: {e}: {}", text(&out.stdout)));
    assert_eq!(out.status.code(), Some(3), "{v:#}");
    let spots: Vec<String> = v["blind_spots"]
        .as_array()
        .unwrap_or_else(|| panic!("no blind_spots: {v:#}"))
        .iter()
        .map(|b| b.to_string())
        .collect();
    assert!(spots.iter().any(|b| b.contains("PID namespace")), "{spots:?}");

    // The host's procfs, read from a PID namespace below it: the holder is seen (held, exit 2),
    // and the run still says it cannot vouch for its own view.
    let mut c = Command::new("unshare");
    trust_init(&mut c).args(["--pid", "--fork", "--kill-child"]).arg(agent_bin());
    let out = c.args(with_files(&f, &["holders", &lo.dev])).stdin(Stdio::null()).output().expect("unshare");
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "held: {said}");
    assert!(text(&out.stdout).starts_with("INCOMPLETE"), "{said}");
    drop(opener);
}

// ---------------------------------------------------------------------------------------------
// 9, 10: blind spots.

/// `setpriv` dropping CAP_SYS_PTRACE, then the agent: other root processes keep that capability,
/// so their ns/ and fd/ links cannot be read (EACCES).
fn without_ptrace(args: &[&str]) -> std::process::Output {
    let mut c = Command::new("setpriv");
    trust_init(&mut c)
        .args(["--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"])
        .arg(agent_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv")
}

#[test]
fn root_a_process_the_agent_cannot_inspect_makes_candidates_unknown() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["setpriv"]].concat()) else { return };
    let lo = s.loop_file("free.img");
    let f = files(&s);
    // This test process keeps every capability: an agent without CAP_SYS_PTRACE cannot read it.
    let me = std::process::id();
    let probe = Command::new("setpriv")
        .args([
            "--inh-caps=-sys_ptrace",
            "--bounding-set=-sys_ptrace",
            "readlink",
            &format!("/proc/{me}/ns/mnt"),
        ])
        .output()
        .expect("setpriv readlink");
    assert!(!probe.status.success(), "without CAP_SYS_PTRACE, /proc/{me}/ns/mnt should be unreadable");

    let out =
        without_ptrace(&with_files(&f, &["--grace-period", "0", "holders", &lo.dev, "--output", "json"]));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "a partial scan is still a scan, exit 3 (unknown): {said}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {said}"));
    assert_eq!(v["verdict"], "unknown", "processes it could not inspect could hold {}: {v:#}", lo.name());
    assert!(reasons_mention(&v, "blind spot"), "the reasons name the blind spot: {v:#}");
    let spots = blind_spots(&v);
    assert!(spots.iter().any(|(what, _)| names_some_pid(what)), "a blind spot names a pid: {spots:?}");

    let out = without_ptrace(&with_files(&f, &["--grace-period", "0", "clean", &lo.dev, "--apply"]));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert!(lo.is_bound(), "{said}");
    assert_eq!(out.status.code(), Some(4), "refused, it lacks CAP_SYS_PTRACE: {said}");
    assert!(text(&out.stdout).contains("CAP_SYS_PTRACE"), "{said}");
    assert!(intents(&s, "detach_loop").is_empty(), "no detach_loop intent: {}", journal_text(&s));

    // With every capability, the same device is a plain stale candidate.
    let v = holders(&s, &lo.dev, &["--grace-period", "0"]);
    assert_eq!(v["verdict"], "stale", "{v:#}");
    blind_spots(&v);
}

#[test]
fn root_an_uninspectable_pid1_is_a_blind_spot_unless_trusted() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    if !pid1_uninspectable() {
        eprintln!("SKIPPED: PID 1 can be inspected on this machine (readlink /proc/1/ns/mnt works): nothing to show");
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let lo = s.loop_file("free.img");
    let f = files(&s);
    let out = Command::new(agent_bin())
        .env_remove(TRUST_INIT_ENV)
        .args(with_files(&f, &["--grace-period", "0", "holders", &lo.dev, "--output", "json"]))
        .stdin(Stdio::null())
        .output()
        .expect("agent");
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "unknown: {said}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {said}"));
    assert_eq!(
        v["verdict"],
        "unknown",
        "PID 1 could not be inspected, so it could hold {}: {v:#}",
        lo.name()
    );
    assert!(reasons_mention(&v, "blind spot"), "the reasons name the blind spot: {v:#}");
    let spots = blind_spots(&v);
    assert!(
        spots.iter().any(|(what, hide)| names_pid(what, 1) && hide == "any device"),
        "a blind spot names pid 1 and could hide any device: {spots:?}"
    );
    // Trusted (as every other test here runs on this machine): a plain stale candidate.
    let v = holders(&s, &lo.dev, &["--grace-period", "0"]);
    assert_eq!(v["verdict"], "stale", "{v:#}");
}

/// A holder whose only task is chrooted: its mountinfo shows only what lies under its root, so
/// the mount outside it is invisible there. The namespace is read by entering it, and the mount
/// is released from the namespace's root.
#[test]
fn root_a_chrooted_holder_is_seen_and_released_through_its_namespace() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["chroot"]].concat()) else { return };
    let mnt = s.mkdir("mnt");
    let jail = s.mkdir("jail");
    let img = s.ext4_image("vol.img", 32);
    let lo = LoopDev::attach(&img);
    let host_mount = HostMount::new(&lo.dev, &mnt, &[]);
    // In its own namespace: bind the system into the jail, then chroot there. The loop mount at
    // `mnt` lies outside the jail.
    let script = format!(
        "set -e; for d in usr bin lib lib64; do [ -e /$d ] || continue; mkdir -p {j}/$d; mount --bind /$d {j}/$d; done; exec chroot {j} sleep 1000",
        j = utf8(&jail)
    );
    let holder = NsProcess::spawn_with("private", &script);
    let pid = holder.pid();
    assert!(
        wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{pid}/root"))
            .is_ok_and(|r| r.as_os_str() != "/")),
        "the holder never chrooted"
    );
    host_mount.umount();
    assert!(jbd2_alive(lo.name()), "the holder's namespace keeps the filesystem");
    assert!(mountinfo_line(&pid.to_string(), &mnt).is_none(), "its own mountinfo hides the mount");
    for reader in ["auto", "mountinfo"] {
        let v = holders(&s, &lo.dev, &["--mount-reader", reader]);
        let mounts = holders_of_kind(&v, "mount");
        assert_eq!(mounts.len(), 1, "{reader}: the mount outside the jail is found: {v:#}");
        assert_eq!(mounts[0]["mount_point"], utf8(&mnt), "relative to the namespace's root: {v:#}");
        assert_eq!(mounts[0]["namespace_entry"]["via"], "task_namespace", "{v:#}");
        assert_eq!(v["verdict"], "in_use", "{v:#}");
    }
    let f = files(&s);
    let out = agent(&with_files(&f, &["release", &lo.dev, "--apply"]));
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())),
        "released: the filesystem is gone"
    );
    let mut holder = holder;
    assert!(holder.is_alive(), "no process is killed");
}

/// Gotcha 17: an overlay whose upper directory lives on a filesystem keeps that filesystem alive
/// after it is unmounted everywhere. No mount table shows the device; the kernel does
/// (/sys/fs/ext4/<dev>, its journal thread, its exclusive claim): in use, never cleaned.
#[test]
fn root_a_filesystem_kept_alive_by_an_overlay_is_in_use() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let (lower, ov, fsmnt) = (s.mkdir("lower"), s.mkdir("ov"), s.mkdir("fs"));
    let lo = LoopDev::attach(&s.ext4_image("upper.img", 32));
    let fs = HostMount::new(&lo.dev, &fsmnt, &[]);
    for d in ["upper", "work"] {
        std::fs::create_dir(fsmnt.join(d)).expect("mkdir");
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        utf8(&lower),
        utf8(&fsmnt.join("upper")),
        utf8(&fsmnt.join("work"))
    );
    let overlay = HostMount::new("overlay", &ov, &["-t", "overlay", "-o", &opts]);
    sh("umount", &["-l", utf8(&fsmnt)]);
    drop(fs);
    assert!(mountinfo_line("self", &fsmnt).is_none(), "no mount of the device is left");
    assert!(Path::new("/sys/fs/ext4").join(lo.name()).exists(), "but the kernel keeps its filesystem");
    let v = holders(&s, &lo.dev, &["--grace-period", "0"]);
    assert_eq!(v["verdict"], "in_use", "{v:#}");
    let fsh = holders_of_kind(&v, "filesystem");
    assert_eq!(fsh.len(), 1, "{v:#}");
    assert_eq!(fsh[0]["fstype"], "ext4");
    let f = files(&s);
    let out = agent(&with_files(&f, &["--grace-period", "0", "clean", &lo.dev, "--apply"]));
    assert_eq!(out.status.code(), Some(2), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(text(&out.stdout).contains("filesystem still lives on it"), "{}", text(&out.stdout));
    assert!(lo.is_bound(), "the loop device stays bound");
    assert!(intents(&s, "detach_loop").is_empty(), "{}", journal_text(&s));
    drop(overlay);
}

// ---------------------------------------------------------------------------------------------
// 11 (issue 17): release held to the clean path's standard.

/// A process in a private mount namespace of its own that mounts `lo` at `mnt` there (the host
/// never has it mounted), then runs `then` (a shell command line ending in an `exec`).
fn mounted_only_in_a_namespace(lo: &LoopDev, mnt: &Path, then: &str) -> NsProcess {
    let p = NsProcess::spawn(&format!("mount {} {} && {then}", lo.dev, utf8(mnt)));
    assert!(
        wait_until(Duration::from_secs(5), || p.has_mount(mnt)),
        "the namespace never mounted {}",
        lo.dev
    );
    assert!(mountinfo_line("self", mnt).is_none(), "the host's namespace has no mount of it");
    p
}

/// `release DEV --apply` (plus `extra`), its exit code and everything it said.
fn release_apply(s: &Scratch, lo: &LoopDev, extra: &[&str]) -> (Option<i32>, String, String) {
    let f = files(s);
    let mut args = with_files(&f, &["release", &lo.dev, "--apply"]);
    args.extend(extra);
    let out = agent(&args);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The refusal every "in use" case expects: exit 2, the holder named (pid and what it does),
/// no detach_mount intent, and the mount still in the namespace's own mountinfo.
fn assert_refused_for(s: &Scratch, lo: &LoopDev, holder: &NsProcess, mnt: &Path, what: &str) {
    let (code, out, err) = release_apply(s, lo, &[]);
    let said = format!("exit {code:?}\nstdout: {out}\nstderr: {err}");
    assert_eq!(code, Some(2), "refused (held): {said}");
    assert!(out.contains("refused:"), "{said}");
    assert!(
        names_pid(&out, holder.pid()) && out.contains(what),
        "the refusal names pid {} and `{what}`: {said}",
        holder.pid()
    );
    assert!(out.contains("--force-busy"), "and how to go ahead anyway: {said}");
    assert!(intents(s, "detach_mount").is_empty(), "no detach_mount intent: {}", journal_text(s));
    assert!(
        mountinfo_line(&holder.pid().to_string(), mnt).is_some(),
        "the mount is still in the namespace's own mountinfo: {said}"
    );
    assert!(lo.is_bound());
}

#[test]
fn root_release_refuses_a_mount_whose_namespace_has_its_cwd_on_it_unless_forced() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let mut holder = mounted_only_in_a_namespace(&lo, &mnt, &format!("cd {} && exec sleep 1000", utf8(&mnt)));
    let pid = holder.pid();
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{pid}/cwd"))
        .is_ok_and(|c| c == mnt)));
    assert_refused_for(&s, &lo, &holder, &mnt, "has its working directory on it");

    // The operator forces it, with a reason: detached, the reason in the plan and the audit log.
    let reason = "ticket-4711 the db pod was evicted";
    let (code, out, err) = release_apply(&s, &lo, &["--force-busy", reason]);
    let said = format!("exit {code:?}\nstdout: {out}\nstderr: {err}");
    assert!(mountinfo_line(&pid.to_string(), &mnt).is_none(), "forced: detached: {said}");
    assert_eq!(done(&s, "detach_mount"), 1, "{}", journal_text(&s));
    assert_eq!(code, Some(2), "the cwd still holds the detached filesystem: {said}");
    assert!(out.contains(reason), "the plan says why: {said}");
    let audit = err.lines().find(|l| l.contains("force_busy") || l.contains("mount_users"));
    assert!(
        audit.is_some_and(|l| l.contains("audit") && l.contains(reason) && names_pid(l, pid)),
        "one audit line with the reason and the user: {said}"
    );
    assert!(holder.is_alive(), "no process is killed");
}

#[test]
fn root_release_refuses_a_mount_whose_namespace_has_a_file_on_it_open() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let db = mnt.join("db");
    let holder = mounted_only_in_a_namespace(&lo, &mnt, &format!("exec 3<>{} && exec sleep 1000", utf8(&db)));
    let pid = holder.pid();
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{pid}/fd/3"))
        .is_ok_and(|c| c == db)));
    assert_refused_for(&s, &lo, &holder, &mnt, "has a file on it open");
}

#[test]
fn root_release_refuses_a_mount_whose_namespace_maps_a_file_on_it() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["python3"]].concat()) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let db = mnt.join("db");
    let ready = s.path("mapped");
    // mmap(2) through ctypes, then close the fd: only the mapping holds the file (Python's own
    // mmap module keeps a dup of the fd).
    let prog = s.path("map.py");
    std::fs::write(
        &prog,
        r#"import ctypes, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
os.ftruncate(fd, 4096)
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, 4096, 3, 1, fd, 0)
if addr in (None, ctypes.c_void_p(-1).value):
    sys.exit("mmap failed: errno %d" % ctypes.get_errno())
os.close(fd)
open(sys.argv[2], "w").close()
time.sleep(1000)
"#,
    )
    .expect("write map.py");
    let holder = mounted_only_in_a_namespace(
        &lo,
        &mnt,
        &format!("exec python3 {} {} {}", utf8(&prog), utf8(&db), utf8(&ready)),
    );
    let pid = holder.pid();
    assert!(
        wait_until(Duration::from_secs(10), || ready.exists()),
        "the process never mapped {}",
        db.display()
    );
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    assert!(maps.contains(utf8(&db)), "mapped: {maps}");
    let fds: Vec<PathBuf> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("fd dir")
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(!fds.contains(&db), "only the mapping holds it: {fds:?}");
    assert_refused_for(&s, &lo, &holder, &mnt, "maps a file on it");
}

#[test]
fn root_release_never_detaches_a_slave_of_a_slave_of_a_live_host_mount() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["nsenter"]].concat()) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let m = utf8(&mnt).to_owned();
    let host = HostMount::new(&lo.dev, &mnt, &[]);
    sh("mount", &["--make-shared", &m]);
    let group = |line: &str, prefix: &str| -> Option<String> {
        line.split(' ').find_map(|f| f.strip_prefix(prefix)).map(str::to_owned)
    };
    let host_line = mountinfo_line("self", &mnt).expect("mounted");
    let host_group = group(&host_line, "shared:").expect("shared");
    // A: its copy a slave of the host's and shared in a group of its own.
    let a = NsProcess::spawn_with(
        "unchanged",
        &format!("mount --make-slave {m} && mount --make-shared {m} && exec sleep 1000"),
    );
    let a_line = || mountinfo_line(&a.pid().to_string(), &mnt).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(5), || a_line().contains("master:") && a_line().contains("shared:"))
    );
    let a_group = group(&a_line(), "shared:").expect("A shared");
    assert!(a_line().contains(&format!("master:{host_group}")), "A: {}", a_line());
    // B: made from A's namespace, its copy a slave of A's group only.
    let b = NsProcess {
        child: Command::new("nsenter")
            .args(["-t", &a.pid().to_string(), "-m", "unshare", "-m", "--propagation", "unchanged"])
            .args(["sh", "-c", &format!("mount --make-slave {m} && exec sleep 1000")])
            .stdin(Stdio::null())
            .spawn()
            .expect("nsenter"),
    };
    let b_line = || mountinfo_line(&b.pid().to_string(), &mnt).unwrap_or_default();
    assert!(
        wait_until(Duration::from_secs(5), || b_line().contains(&format!("master:{a_group}"))
            && !b_line().contains("shared:")),
        "B is a slave of A's group {a_group} only: {}",
        b_line()
    );
    // C: a private copy, a leak nobody uses: it goes, the others stay.
    let c = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || c.has_mount(&mnt)));

    let f = files(&s);
    let dry = text(&agent(&with_files(&f, &["release", &lo.dev, "--output", "json"])).stdout);
    let v: Value = serde_json::from_str(&dry).unwrap_or_else(|e| panic!("not JSON ({e}): {dry}"));
    let left = v["plans"][0]["left_alone"].as_array().cloned().unwrap_or_default();
    let b_ns = b.ns_inode().to_string();
    assert!(
        left.iter().any(|l| l.as_str().is_some_and(|t| t.contains(&b_ns)
            && t.contains(&format!("master:{a_group}"))
            && t.contains("chain"))),
        "B's copy is left alone as a slave, through A, of the host's mount: {v:#}"
    );
    let (code, out, err) = release_apply(&s, &lo, &[]);
    let said = format!("exit {code:?}\nstdout: {out}\nstderr: {err}");
    assert!(
        mountinfo_line(&b.pid().to_string(), &mnt).is_some(),
        "B's copy of the live host mount stays: {said}"
    );
    assert!(mountinfo_line(&a.pid().to_string(), &mnt).is_some(), "A's copy stays: {said}");
    assert!(host.is_mounted(), "the host's mount stays: {said}");
    assert!(!c.has_mount(&mnt), "the private leak went: {said}");
    assert_eq!(done(&s, "detach_mount"), 1, "one detach, C's: {}", journal_text(&s));
    assert_eq!(code, Some(2), "still held (the host's mount): {said}");
    drop((c, b, a));
}

#[test]
fn root_release_refuses_when_a_blind_spot_could_hide_the_namespace() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["setpriv"]].concat()) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    // Nobody uses it, but an agent without CAP_SYS_PTRACE cannot read this root process's
    // namespace: it cannot see the mount, nor whether anything there uses it.
    let holder = mounted_only_in_a_namespace(&lo, &mnt, "exec sleep 1000");
    let f = files(&s);
    // The plan itself is refused for the blind spot (exit 3, unknown), naming it.
    let out = without_ptrace(&with_files(&f, &["release", &lo.dev]));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "unknown, not `nothing to do`: {said}");
    let t = text(&out.stdout);
    assert!(t.contains("refused: blind spot") && names_some_pid(&t), "the blind spot is named: {said}");
    // And --apply from a run that cannot see is refused before anything (exit 4, one line).
    let out = without_ptrace(&with_files(&f, &["release", &lo.dev, "--apply"]));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "refused: {said}");
    assert!(
        text(&out.stdout).contains("--apply refused") || text(&out.stderr).contains("--apply refused"),
        "{said}"
    );
    assert!(intents(&s, "detach_mount").is_empty(), "{}", journal_text(&s));
    assert!(holder.has_mount(&mnt), "the mount is still there: {said}");
}

#[test]
fn root_release_detaches_a_copy_nobody_uses_and_frees_the_device() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let mut holder = mounted_only_in_a_namespace(&lo, &mnt, "exec sleep 1000");
    let (code, out, err) = release_apply(&s, &lo, &[]);
    let said = format!("exit {code:?}\nstdout: {out}\nstderr: {err}");
    assert_eq!(code, Some(0), "{said}");
    assert!(out.contains("is free"), "{said}");
    assert!(!holder.has_mount(&mnt), "detached in its namespace: {said}");
    assert!(holder.is_alive(), "no process is killed");
    assert_eq!(done(&s, "detach_mount"), 1, "{}", journal_text(&s));
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "the filesystem is gone");
    let v = holders(&s, &lo.dev, &[]);
    assert_eq!(v["holders"], serde_json::json!([]), "free: {v:#}");
}

/// Issue 34, item 1, for the one-shot commands: `clean DEV --apply` with `--kube-url` builds the
/// same view as the daemon. Against the stand-in API server (Node Ready, nothing of this device
/// in it) the view vouches and the unheld loop device is unbound; against a loopback port
/// nothing listens on (`--kube-wait 2`), the run says on its first line that the API cannot
/// vouch, exits 4 and leaves the device alone. Outside a cluster with nothing configured the
/// API is not asked, and the first line says so.
#[test]
fn root_one_shot_runs_build_the_api_view_or_say_they_did_not() {
    use blockjanitor_tests::kube_mock::{node_object, ready_only, ApiServer, NODE};
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let f = files(&s);
    let lo = s.loop_file("free.img");

    let out = agent(&with_files(&f, &["--grace-period", "0", "clean", &lo.dev]));
    let first = text(&out.stdout).lines().next().unwrap_or_default().to_owned();
    assert!(
        first.starts_with("Kubernetes API: off (not in a cluster"),
        "the first line says the API was not asked: {}",
        text(&out.stdout)
    );

    let nowhere = ["--kube-url", "http://127.0.0.1:9", "--node-name", NODE, "--kube-wait", "2"];
    let mut args: Vec<&str> = nowhere.to_vec();
    args.extend(["--grace-period", "0", "clean", &lo.dev, "--apply"]);
    let out = agent(&with_files(&f, &args));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "refused: {said}");
    assert!(lo.is_bound(), "clean --apply acted although the API did not answer: {said}");
    let first = text(&out.stdout).lines().next().unwrap_or_default().to_owned();
    assert!(first.starts_with("Kubernetes API: cannot vouch: "), "{said}");

    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let url = server.url();
    let args = ["--kube-url", &url, "--node-name", NODE, "--grace-period", "0", "clean", &lo.dev, "--apply"];
    let out = agent(&with_files(&f, &args));
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "the API vouches: done; {said}");
    assert!(!lo.is_bound(), "{said}");
    assert!(!text(&out.stdout).contains("Kubernetes API:"), "nothing to say while it vouches: {said}");
    assert!(server.requests().iter().any(|r| r.path == "/api/v1/pods"), "the run asked the API");
    drop(rt);
}
