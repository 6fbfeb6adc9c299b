//! The statmount memo kept between report-only one-shot runs (issue 20), on the real kernel:
//! the real binary's `holders` run twice on a loop device mounted only in a mount namespace the
//! test makes. The second run loads what the first kept (its debug line says how many mounts),
//! asks the kernel about fewer mounts than it lists, and shows the same holders; a mount made
//! between runs (a new mount ID) is still found; a tampered file (a flipped byte, another boot's
//! ID, a group-writable mode) is ignored with its reason, the answer is still right, and the run
//! writes a good file again. A command that acts (`release`, even a dry run) never reads it, and
//! `--statmount-memo ''` keeps none. The daemon writes the file after its full scans and never
//! reads it, so a first `holders` on its node starts warm.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "nsenter", "mount", "umount"];

/// One run of the agent with the memo module's debug lines on stderr.
struct Run {
    json: Value,
    log: String,
}

impl Run {
    /// The number after `name=` on the memo's debug line that contains `what`.
    fn field(&self, what: &str, name: &str) -> u64 {
        let line = self
            .log
            .lines()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no debug line '{what}' in:\n{}", self.log));
        let at = line.find(&format!(" {name}=")).unwrap_or_else(|| panic!("no {name}= in: {line}"));
        let rest = &line[at + name.len() + 2..];
        rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).expect("a number")
    }

    fn says(&self, what: &str) -> bool {
        self.log.lines().any(|l| l.contains(what))
    }

    fn mounts(&self) -> Vec<&Value> {
        self.json["holders"].as_array().expect("holders").iter().filter(|h| h["kind"] == "mount").collect()
    }
}

fn run(memo: &Path, args: &[&str]) -> (std::process::Output, String) {
    let out = trust_init(&mut Command::new(agent_bin()))
        .env("BLOCKJANITOR_LOG", "warn,blockjanitor::engine::statmount_cache_file=debug")
        .args(["--statmount-memo", memo.to_str().expect("utf8")])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run blockjanitor-agent");
    let log = text(&out.stderr);
    (out, log)
}

fn holders(memo: &Path, dev: &str) -> Run {
    let (out, log) = run(memo, &["holders", dev, "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "held: exit 2\n{}\n{log}", text(&out.stdout));
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {log}"));
    Run { json, log }
}

/// The run ignored the memo file for `reason`, answered right (`mounts` mount holders) and
/// wrote a good file again.
fn ignored_then_rewritten(memo: &Path, dev: &str, reason: &str, mounts: usize) {
    let r = holders(memo, dev);
    let line = r.log.lines().find(|l| l.contains("statmount memo ignored")).unwrap_or_else(|| {
        panic!("a tampered file ({reason}) was not ignored:\n{}", r.log);
    });
    assert!(line.contains(reason), "ignored for '{reason}': {line}");
    assert!(!r.says("statmount memo loaded"), "{}", r.log);
    assert_eq!(r.mounts().len(), mounts, "the answer is still right: {:#}", r.json);
    let (listed, asked) =
        (r.field("statmount memo saved", "listed"), r.field("statmount memo saved", "asked"));
    assert_eq!(asked, listed, "every mount asked of the kernel: {}", r.log);
    let mode = std::fs::metadata(memo).expect("rewritten").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert!(holders(memo, dev).says("statmount memo loaded"), "the rewritten file is good");
}

/// An ext4 loop device mounted at `mnt` only in the mount namespace of a sleeper (mounted on
/// the host before the sleeper unshared, then unmounted on the host): its mount point, its
/// device and the sleeper.
fn mounted_in_a_namespace_only(s: &Scratch) -> (std::path::PathBuf, LoopDev, NsProcess) {
    let mnt = s.mkdir("mnt");
    let (host_mount, lo) = s.loop_mount("vol.img", &mnt);
    let holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    host_mount.umount();
    (mnt, lo, holder)
}

#[test]
fn root_holders_keeps_what_statmount_said_between_runs_and_trusts_only_a_sound_file() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let again = s.mkdir("again");
    let (mnt, lo, holder) = mounted_in_a_namespace_only(&s);
    // Under the test's own scratch directory (mode 0700, root's); the agent makes `memo/`.
    let memo = s.path("memo/statmount-memo");

    let first = holders(&memo, &lo.dev);
    assert!(first.says("statmount memo ignored") && first.says("no file yet"), "{}", first.log);
    let (listed, asked) = (first.field("memo saved", "listed"), first.field("memo saved", "asked"));
    assert!(listed > 0 && asked == listed, "a cold run asks about every mount: {}", first.log);
    let saved = first.field("statmount memo saved", "mounts");
    let mounts = first.mounts();
    assert_eq!(mounts.len(), 1, "{:#}", first.json);
    assert!(mounts[0]["pids"].as_array().expect("pids").contains(&Value::from(holder.pid())));
    assert_eq!(mounts[0]["mount_namespace"], holder.ns_inode());

    let second = holders(&memo, &lo.dev);
    let loaded = second.field("statmount memo loaded", "mounts");
    assert_eq!(loaded, saved, "the second run loads what the first saved");
    let what = if second.says("memo unchanged") { "memo unchanged" } else { "memo saved" };
    let (listed, asked) = (second.field(what, "listed"), second.field(what, "asked"));
    assert!(
        asked < listed,
        "the second run answers from the memo ({asked} of {listed} asked): {}",
        second.log
    );
    assert_eq!(second.json["holders"], first.json["holders"], "the same holders");

    // A mount made between runs has an ID the memo never saw: it is asked about, and found.
    let pid = holder.pid().to_string();
    sh("nsenter", &["-t", &pid, "-m", "mount", &lo.dev, utf8(&again)]);
    let third = holders(&memo, &lo.dev);
    assert!(third.says("statmount memo loaded"), "{}", third.log);
    assert!(third.field("statmount memo saved", "asked") >= 1, "{}", third.log);
    let points: Vec<&str> = third.mounts().iter().map(|h| h["mount_point"].as_str().expect("path")).collect();
    assert!(points.contains(&utf8(&again)) && points.contains(&utf8(&mnt)), "both mounts: {:#}", third.json);

    // Tampered files are ignored, each with its reason, and the answer stays right.
    let bytes = std::fs::read(&memo).expect("memo file");
    let mut flipped = bytes.clone();
    let at = flipped.len() - 8; // the last mount's old mount ID: well-formed, wrong
    flipped[at] ^= 1;
    std::fs::write(&memo, &flipped).expect("flip a byte");
    ignored_then_rewritten(&memo, &lo.dev, "checksum", 2);

    let mut other_boot = std::fs::read(&memo).expect("memo file");
    other_boot[16] ^= 0xff; // the boot ID is header bytes 16..32
    std::fs::write(&memo, &other_boot).expect("another boot");
    ignored_then_rewritten(&memo, &lo.dev, "another boot", 2);

    std::fs::set_permissions(&memo, std::fs::Permissions::from_mode(0o620)).expect("chmod");
    ignored_then_rewritten(&memo, &lo.dev, "writable by its group or others", 2);

    // `scan` (it only shows) uses it too; a command that acts never reads it.
    let (out, log) = run(&memo, &["scan", "--output", "json"]);
    assert_ne!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("statmount memo loaded"), "{log}");
    let before = std::fs::read(&memo).expect("memo file");
    let (out, log) = run(&memo, &["--journal", utf8(&s.path("journal.jsonl")), "release", &lo.dev]);
    assert_eq!(out.status.code(), Some(0), "a dry run: {}{log}", text(&out.stdout));
    assert!(!log.contains("statmount memo"), "release never loads or saves the memo: {log}");
    assert_eq!(std::fs::read(&memo).expect("memo file"), before, "nor writes it");
    // `--statmount-memo ''` keeps none.
    let (out, log) = run(Path::new(""), &["holders", &lo.dev, "--output", "json"]);
    assert_eq!(out.status.code(), Some(2), "{log}");
    assert!(!log.contains("statmount memo"), "no memo: {log}");
    drop(holder);
}

/// How many times the daemon's log says it wrote the memo file.
fn daemon_saves(d: &Daemon) -> usize {
    d.log_text().lines().filter(|l| l.contains("statmount memo saved")).count()
}

#[test]
fn root_the_daemon_writes_the_file_so_a_first_holders_starts_warm() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let (_mnt, lo, holder) = mounted_in_a_namespace_only(&s);
    let memo = s.path("memo/statmount-memo");
    // A file of another boot is there before the daemon starts: it never reads it (no debug
    // line), and replaces it after its first full scan.
    let cold = holders(&memo, &lo.dev);
    let mut other_boot = std::fs::read(&memo).expect("memo file");
    other_boot[16] ^= 0xff;
    std::fs::write(&memo, &other_boot).expect("another boot");

    let log = "info,blockjanitor::engine::statmount_cache_file=debug";
    let memo_arg = utf8(&memo).to_owned();
    let d = Daemon::start_configured(
        s.dir.path(),
        &["--statmount-memo", &memo_arg],
        &["--rescan-interval", "1"],
        |c| {
            c.env("BLOCKJANITOR_LOG", log);
        },
    );
    assert!(
        wait_until(Duration::from_secs(20), || daemon_saves(&d) >= 1),
        "the daemon never wrote the memo file: {}",
        d.log_text()
    );
    let text = d.log_text();
    assert!(!text.contains("statmount memo loaded") && !text.contains("statmount memo ignored"), "{text}");
    assert_ne!(std::fs::read(&memo).expect("memo file"), other_boot, "rewritten for this boot");

    // A first one-shot run (nothing of its own kept) answers from the daemon's file.
    let warm = holders(&memo, &lo.dev);
    assert!(warm.field("statmount memo loaded", "mounts") > 0, "{}", warm.log);
    let what = if warm.says("memo unchanged") { "memo unchanged" } else { "memo saved" };
    let (listed, asked) = (warm.field(what, "listed"), warm.field(what, "asked"));
    assert!(
        asked * 2 < listed,
        "warm from the daemon's file: {asked} of {listed} mounts asked: {}",
        warm.log
    );
    assert_eq!(warm.json["holders"], cold.json["holders"], "the same holders");

    // A steady node: more full scans (one a second), no more writes.
    let saves = daemon_saves(&d);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(daemon_saves(&d), saves, "nothing changed, nothing written: {}", d.log_text());
    drop(d);
    drop(holder);
}
