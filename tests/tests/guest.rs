//! Scenarios in the qemu guest (Debian's kernel): what this host's kernel cannot show
//! (scsi_debug disks, device-mapper multipath, nbd, rbd), with the real agent binary inside.

#[path = "support/scenario_documents.rs"]
mod scenario_documents;
// Only `Schema` is used here (the conformance test uses the rest).
#[allow(dead_code)]
#[path = "support/schema.rs"]
mod schema;

use blockjanitor_tests::find_device;
use blockjanitor_tests::guest::{
    check_document, require_guest, run_scenario, run_scenario_with, run_scenario_within, scan_device,
};
use scenario_documents::schema_valid;

#[test]
fn root_guest_agent_scans_a_scsi_disk_and_releases_a_foreign_mount() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("agent-scan.sh");
    run.assert_ok();
    schema_valid(&run);
    let scan = run.devices("scan");
    let sda = find_device(&scan, "sda");
    assert_eq!(sda["kind"], "disk");
    assert_eq!(sda["size_bytes"], 16 << 20);
    let holders = run.device("holders");
    let h = &holders["holders"][0];
    assert_eq!(h["kind"], "mount");
    assert_eq!(h["in_host_namespace"], false);
    assert_eq!(h["mount_point"], "/mnt/vol");
    assert_eq!(h["comm"], "sleep");
}

#[test]
fn root_guest_incident3_dead_map_and_paths_are_reported_and_torn_down() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("incident3.sh");
    run.assert_ok();
    schema_valid(&run);
    let scan = run.devices("scan");
    let map = find_device(&scan, "dm-0");
    assert_eq!(map["verdict"], "stale", "{map:#}");
    let reason = map["reasons"][0].as_str().expect("reason");
    assert!(
        reason.contains("map mpathb (dm-0): both paths failed")
            && reason.contains("open count 0")
            && reason.contains("no mount in any namespace"),
        "{reason}"
    );
    let mp = &map["multipath"];
    assert_eq!(mp["wwid"], "333333330000007d0");
    assert_eq!(mp["queue_if_no_path"], "on");
    let states: Vec<&str> =
        mp["paths"].as_array().expect("paths").iter().filter_map(|p| p["state"].as_str()).collect();
    assert_eq!(states, vec!["failed", "failed"]);
    for disk in ["sda", "sdb"] {
        let d = find_device(&scan, disk);
        assert_eq!(d["verdict"], "stale", "{d:#}");
        assert_eq!(d["scsi"]["state"], "offline");
        assert_eq!(d["scsi"]["path_of"], "dm-0");
        assert!(d["reasons"][0].as_str().expect("reason").contains("path of dm-0"));
    }
    let table = run.section("table");
    assert!(
        table.contains(
            "multipath mpathb (333333330000007d0): 0 of 2 path(s) active, queue_if_no_path (I/O hangs)"
        ),
        "{table}"
    );
    assert!(table.contains("path sda 8:0 failed") && table.contains("scsi 0:0:0:0"), "{table}");
    let clean = run.section("clean");
    for step in [
        "send 'fail_if_no_path' to map dm-0",
        "remove dm device dm-0",
        "set SCSI disk sda",
        "delete SCSI disk sdb",
    ] {
        assert!(clean.contains(step), "missing {step:?} in\n{clean}");
    }
    assert!(clean.contains("rc=0"), "{clean}");
}

#[test]
fn root_guest_map_with_an_active_path_is_never_stale() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("one-path-active.sh");
    run.assert_ok();
    schema_valid(&run);
    let h = run.device("holders");
    assert_eq!(h["verdict"], "unused", "{h:#}");
    assert!(h["reasons"].to_string().contains("1 of 2 path(s) active"), "{h:#}");
    let clean = run.section("clean");
    assert!(clean.contains("refused") && clean.contains("rc=4"), "refused (exit 4): {clean}");
}

#[test]
fn root_guest_stuck_reader_is_freed_by_fail_if_no_path_and_the_api_keeps_answering() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("stuck-reader.sh");
    run.assert_ok();
    schema_valid(&run);
    assert!(run.output.contains("state: D"), "the reader hung in D state:\n{}", run.output);
    let api = run.device("api");
    assert!(api.to_string().contains("open_device"), "the API answers while the reader is stuck: {api:#}");
    let h = run.device("holders");
    let holder = &h["holders"][0];
    assert_eq!(holder["kind"], "open_device");
    assert_eq!(holder["process_state"], "D");
    let clean = run.section("clean");
    assert!(clean.contains("fail_if_no_path") && clean.contains("rc=0"), "{clean}");
    assert!(
        run.output.contains("reader exit: 1"),
        "dd ended with an error once queueing stopped:\n{}",
        run.output
    );
    check_document(&run.json("api-after"), "node", "the API still answers after teardown");
}

#[test]
fn root_guest_foreign_mount_on_a_map_is_released_first() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("foreign-mount-on-map.sh");
    run.assert_ok();
    schema_valid(&run);
    let h = run.device("holders");
    assert_eq!(h["holders"][0]["kind"], "mount");
    assert_eq!(h["holders"][0]["in_host_namespace"], false);
    let clean = run.section("clean");
    let order: Vec<usize> =
        ["fail_if_no_path", "detach mount /mnt/vol", "remove dm device", "delete SCSI disk"]
            .iter()
            .map(|s| clean.find(s).unwrap_or_else(|| panic!("missing {s:?} in\n{clean}")))
            .collect();
    assert!(order.windows(2).all(|w| w[0] < w[1]), "steps out of order:\n{clean}");
    assert!(clean.contains("rc=0"), "{clean}");
}

#[test]
fn root_guest_standalone_offline_disk_is_deleted() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("offline-disk.sh");
    run.assert_ok();
    schema_valid(&run);
    let h = run.device("holders");
    assert_eq!(h["scsi"]["state"], "offline");
    let clean = run.section("clean");
    assert!(clean.contains("delete SCSI disk sda") && clean.contains("rc=0"), "{clean}");
}

#[test]
fn root_guest_nbd_device_whose_server_died_is_stale_then_disconnected() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("nbd-dead-server.sh");
    run.assert_ok();
    schema_valid(&run);
    assert_eq!(
        run.section("server").trim(),
        "nbd-server processes after the kill: 0",
        "the server process itself is gone before the agent looks"
    );
    let h = run.device("holders");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    assert_eq!(h["nbd"]["server_alive"], false, "{h:#}");
    assert!(h["reasons"][0].as_str().expect("reason").contains("is gone"), "{h:#}");
    let clean = run.section("clean");
    assert!(
        clean.contains("disconnect nbd device nbd0 (NBD_DISCONNECT) -> done") && clean.contains("rc=0"),
        "{clean}"
    );
}

/// Issue 34 (tests/guest/scenarios/nbd-in-flight.sh): nbd0's server died and nothing the scan
/// sees holds it, but an fd of it is in flight over a unix socket. The kernel keeps an open nbd
/// device's configuration until the last close, so the disconnect is reported deferred (exit 2,
/// the journal's result `deferred`), never done; the opener gone, the device is disconnected.
#[test]
fn root_guest_an_nbd_device_open_in_flight_is_never_disconnected_and_done() {
    if !require_guest() {
        return;
    }
    let run = run_scenario_with("nbd-in-flight.sh", None, stage_fd_in_flight);
    run.assert_ok();
    let opener = run.section("opener");
    assert!(!opener.contains("/dev/nbd0"), "no fd of nbd0 shows in /proc for the opener: {opener}");
    let clean = run.section("clean");
    assert!(clean.contains("rc=2"), "not done: held (exit 2): {clean}");
    assert!(
        clean.contains("deferred") && clean.contains("something still has /dev/nbd0 open"),
        "says why: {clean}"
    );
    assert!(!clean.contains("(NBD_DISCONNECT) -> done"), "{clean}");
    assert!(run.section("after").contains("size 32768"), "still set up while open: {}", run.section("after"));
    let records = blockjanitor_tests::journal::parse(run.section("journal").lines(), "the guest's journal");
    let results: Vec<&str> =
        records.iter().filter(|r| r["phase"] == "result").filter_map(|r| r["result"].as_str()).collect();
    assert_eq!(results, ["deferred"], "{records:?}");
    assert!(run.section("after_free").contains("size 0"), "{}", run.section("after_free"));
}

// ---- Issue 9: btrfs (an anonymous 0:NN device in mountinfo) on a device the agent tears down.
// These state the contract the fixed agent must meet; today's agent sees no holder, judges the
// device stale and sends fail_if_no_path / NBD_DISCONNECT under the mounted filesystem. Every
// broken clause is reported, not only the first, so a failure shows the whole picture.

/// Fails with everything the guest said unless the scenario got as far as running the agent
/// (`marker` is a section it prints after the setup).
fn require_reached(run: &blockjanitor_tests::guest::Run, marker: &str) {
    if !run.output.lines().any(|l| l.trim() == format!("BEGIN {marker}")) {
        run.assert_ok();
        panic!("the scenario printed no section {marker}:\n{}", run.output);
    }
}

/// The clauses of the contract a run broke.
#[derive(Default)]
struct Violations(Vec<String>);

impl Violations {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    /// `holders --output json` shows the btrfs filesystem as what holds the device: verdict
    /// in_use and a mount of fstype btrfs, or a holder of kind `filesystem` (a live filesystem on
    /// the device with no visible mount, as the kernel-side probe reports it).
    fn btrfs_holds(&mut self, run: &blockjanitor_tests::guest::Run, section: &str) {
        let h = run.device(section);
        let btrfs = h["holders"].as_array().is_some_and(|hs| {
            hs.iter().any(|x| (x["kind"] == "mount" && x["fstype"] == "btrfs") || x["kind"] == "filesystem")
        });
        self.check(btrfs && h["verdict"] == "in_use", || {
            format!(
                "{section}: the mounted btrfs must hold the device (verdict in_use, a holder of kind mount \
                 with fstype btrfs, or of kind filesystem); got verdict {}, holders {}, reasons {}",
                h["verdict"], h["holders"], h["reasons"]
            )
        });
    }

    /// `clean --apply` refused because the device is still held: exit code 2.
    fn clean_refused(&mut self, run: &blockjanitor_tests::guest::Run, section: &str) {
        let clean = run.section(section);
        let rc =
            clean.lines().rev().find_map(|l| l.trim().strip_prefix("rc=")).unwrap_or("(none)").to_owned();
        let steps: Vec<&str> =
            clean.lines().filter(|l| l.trim_start().starts_with(char::is_numeric)).collect();
        self.check(rc == "2", || {
            format!("{section}: clean --apply must refuse (exit 2, still held); it exited {rc}, steps: {steps:#?}")
        });
    }

    /// The journal has no intent record (written before a step touches the kernel) for `actions`.
    fn no_intent(&mut self, run: &blockjanitor_tests::guest::Run, actions: &[&str]) {
        let found: Vec<String> = run
            .section("journal")
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .unwrap_or_else(|e| panic!("journal line {l:?}: {e}"))
            })
            .filter(|r| r["phase"] == "intent")
            .filter_map(|r| r["step"]["action"].as_str().map(str::to_owned))
            .filter(|a| actions.contains(&a.as_str()))
            .collect();
        self.check(found.is_empty(), || format!("journal: intents {found:?} under a mounted btrfs"));
    }

    fn assert_none(self, run: &blockjanitor_tests::guest::Run) {
        assert!(
            self.0.is_empty(),
            "{} clause(s) of the contract broken:\n- {}\n--- mountinfo and btrfs sysfs in the guest ---\n{}\n\
             --- journal ---\n{}",
            self.0.len(),
            self.0.join("\n- "),
            run.section("mountinfo"),
            run.section("journal")
        );
        // Anything else the scenario itself found wrong (its setup, the foreign namespace's holder).
        run.assert_ok();
        schema_valid(run);
    }
}

#[test]
fn root_guest_btrfs_on_a_dead_map_is_never_torn_down() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("btrfs-on-dead-map.sh");
    require_reached(&run, "clean");
    let mut v = Violations::default();
    v.btrfs_holds(&run, "holders");
    v.clean_refused(&run, "clean");
    v.no_intent(&run, &["dm_message", "dm_remove"]);
    // The kernel's side: queueing was not stopped (fail_if_no_path removes the feature from the
    // table), the map and both its paths are still there, the mount too.
    let table = run.section("table");
    let line = table.lines().next().unwrap_or_default().to_owned();
    v.check(line.contains("multipath") && line.contains("queue_if_no_path"), || {
        format!("table: queueing was stopped (fail_if_no_path): {line:?}")
    });
    let exists = run.section("exists");
    for want in ["map mpathb (dm-0) exists", "sda offline", "sdb offline"] {
        v.check(exists.contains(want), || format!("exists: missing {want:?} in {exists:?}"));
    }
    let mount = run.section("mount");
    v.check(mount.contains(" /mnt/vol "), || format!("mount: the btrfs mount is gone: {mount:?}"));
    v.assert_none(&run);
}

#[test]
fn root_guest_btrfs_on_nbd_is_never_disconnected() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("btrfs-on-nbd.sh");
    require_reached(&run, "clean-nbd1");
    let mut v = Violations::default();
    // nbd0: mounted in the root namespace; nbd1: mounted only in a foreign namespace.
    for dev in ["nbd0", "nbd1"] {
        v.btrfs_holds(&run, &format!("holders-{dev}"));
        v.clean_refused(&run, &format!("clean-{dev}"));
        let after = run.section(&format!("after-{dev}"));
        v.check(after.contains("size=") && !after.contains("size=0") && !after.contains("pid=none"), || {
            format!("after-{dev}: disconnected: {after:?}")
        });
    }
    v.no_intent(&run, &["nbd_disconnect"]);
    // While btrfs keeps the device open the kernel keeps its size and pid even after a disconnect,
    // so sysfs is not enough: the kernel logs each NBD_DISCONNECT it gets.
    let got: Vec<String> =
        run.section("kernel").lines().filter(|l| l.contains("NBD_DISCONNECT")).map(str::to_owned).collect();
    v.check(got.is_empty(), || format!("kernel: got NBD_DISCONNECT: {got:?}"));
    let mount = run.section("mount");
    v.check(mount.contains(" /mnt/nbd0 ") && mount.contains(" /mnt/nbd1 "), || {
        format!("mount: a btrfs mount is gone: {mount:?}")
    });
    v.assert_none(&run);
}

// ---- Issue 13: crash safety. `crash-recovery.sh` kills the clean-mode daemon with SIGKILL right
// after each journal record of a dead map's teardown in turn, restarts it, and once more with the
// interrupted step's disk replaced while the agent was down.

/// The step records (intents, results, recovered) of one phase, parsed; the plan records
/// (`plan`, `plan_end`) are left out.
fn journal_records(run: &blockjanitor_tests::guest::Run, label: &str) -> Vec<serde_json::Value> {
    let section = run.section(&format!("journal-{label}"));
    let lines = section.lines().filter(|l| l.trim_start().starts_with('{'));
    let mut records = blockjanitor_tests::journal::parse(lines, &format!("journal-{label}"));
    records.retain(|r| !matches!(r["phase"].as_str(), Some("plan" | "plan_end")));
    records
}

/// The pid that wrote a step record (`<ns>-<pid>-<counter>`).
fn writer(r: &serde_json::Value) -> &str {
    r["id"]
        .as_str()
        .and_then(|id| id.split('-').nth(1))
        .unwrap_or_else(|| panic!("record without an id: {r}"))
}

/// One phase's journal: what the killed daemon wrote and how the restarted one recovered.
struct Phase {
    /// Step records the killed daemon wrote, in order.
    killed: Vec<serde_json::Value>,
    recovered: Vec<serde_json::Value>,
}

impl Phase {
    /// The crash point: `action device phase` of the killed daemon's last record.
    fn crash_point(&self) -> String {
        let last = self.killed.last().expect("a record");
        let intent =
            self.killed.iter().find(|r| r["id"] == last["id"] && r["phase"] == "intent").expect("its intent");
        format!(
            "{} {} {}",
            intent["step"]["action"].as_str().unwrap_or("?"),
            intent["step"]["device"].as_str().unwrap_or("?"),
            last["phase"].as_str().unwrap_or("?")
        )
    }
}

/// The map and both paths are gone after phase `label`.
fn assert_all_removed(run: &blockjanitor_tests::guest::Run, label: &str) {
    let after = run.section(&format!("after-{label}"));
    assert!(
        after.lines().all(|l| !l.starts_with("sd") && !l.starts_with("dm-"))
            && after.contains("No devices found"),
        "phase {label}: the map and its paths end removed:\n{after}"
    );
}

/// The twelve records of the teardown: intent and result of each step, in order.
const TEARDOWN: [&str; 12] = [
    "dm_message dm-0 intent",
    "dm_message dm-0 result",
    "dm_remove dm-0 intent",
    "dm_remove dm-0 result",
    "scsi_offline sda intent",
    "scsi_offline sda result",
    "scsi_delete sda intent",
    "scsi_delete sda result",
    "scsi_offline sdb intent",
    "scsi_offline sdb result",
    "scsi_delete sdb intent",
    "scsi_delete sdb result",
];

/// Checks phase `label`'s journal against the rules of crash recovery. The daemon was killed by
/// the fault point `(when, n)` (`("after", 7)`, `("before", 8)`) having written `written` step
/// records.
fn check_phase(
    run: &blockjanitor_tests::guest::Run,
    label: &str,
    (when, n): (&str, usize),
    written: usize,
) -> Phase {
    let k = written;
    let crash = run.section(&format!("crash-{label}"));
    let fault = format!("SIGKILL {when} journal step record {n} ");
    assert!(
        crash.contains("rc=137") && crash.contains(&fault),
        "phase {label}: the daemon must die by {fault}:\n{crash}"
    );
    let records = journal_records(run, label);
    let first = writer(&records[0]).to_owned();
    let killed: Vec<serde_json::Value> =
        records.iter().take_while(|r| r["phase"] != "recovered" && writer(r) == first).cloned().collect();
    assert_eq!(
        killed.len(),
        k,
        "phase {label}: the killed daemon wrote exactly {k} record(s):\n{records:#?}"
    );
    let open_at_crash = usize::from(killed[k - 1]["phase"] == "intent");
    let closed = |id: &serde_json::Value, phase: &str| {
        records.iter().filter(|r| r["id"] == *id && r["phase"] == phase).count()
    };
    // Every intent is closed exactly once: by its result, or (interrupted) by one recovered record.
    for r in records.iter().filter(|r| r["phase"] == "intent") {
        let (res, rec) = (closed(&r["id"], "result"), closed(&r["id"], "recovered"));
        assert_eq!(
            res + rec,
            1,
            "phase {label}: intent closed {res} time(s) by a result, {rec} by recovery: {r}\n{records:#?}"
        );
    }
    let recovered: Vec<serde_json::Value> =
        records.iter().filter(|r| r["phase"] == "recovered").cloned().collect();
    let interrupted: Vec<&serde_json::Value> =
        killed.iter().filter(|r| r["phase"] == "intent" && closed(&r["id"], "result") == 0).collect();
    assert_eq!(interrupted.len(), open_at_crash, "phase {label}: interrupted steps: {interrupted:#?}");
    assert_eq!(
        recovered.len(),
        interrupted.len(),
        "phase {label}: one recovered record per interrupted step: {recovered:#?}"
    );
    for (i, rec) in interrupted.iter().zip(&recovered) {
        assert_eq!(rec["id"], i["id"], "phase {label}");
        let pos = records.iter().position(|r| r == rec).expect("in the journal");
        assert_eq!(
            pos,
            killed.len(),
            "phase {label}: the restarted daemon closes the interrupted step before any step of its own:\n{records:#?}"
        );
        let detail = rec["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!(
                "{} of {}",
                i["step"]["action"].as_str().unwrap_or("?"),
                i["step"]["device"].as_str().unwrap_or("?")
            )) || detail.contains(&format!("{} '", i["step"]["action"].as_str().unwrap_or("?"))),
            "phase {label}: the resolution names the step: {detail}"
        );
        assert!(detail.contains("was interrupted"), "phase {label}: {detail}");
    }
    // Every step ran against the device as the scenario set it up (name, number, disk sequence):
    // none against a device that had changed.
    let setup = run.section(&format!("setup-{label}"));
    let tokens: Vec<String> = setup
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3).then(|| format!("{}@{}#{};", f[0], f[1], f[2]))
        })
        .collect();
    assert_eq!(tokens.len(), 3, "phase {label}: setup\n{setup}");
    for r in records.iter().filter(|r| r["phase"] == "intent") {
        let id = r["step"]["identity"].as_str().unwrap_or_default();
        assert!(
            tokens.iter().any(|t| id.starts_with(t.as_str())),
            "phase {label}: a step against a device other than the one set up ({tokens:?}): {r}"
        );
    }
    // A step is repeated (the same action, parameters and identity) only when its earlier run was
    // interrupted and recovery found its effect not in place (`replan`): an idempotent re-run
    // against the same device. (The freed paths are re-planned as standalone offline disks, whose
    // offline step requires them to be offline still: a different step.)
    let intents: Vec<&serde_json::Value> = records.iter().filter(|r| r["phase"] == "intent").collect();
    for (n, r) in intents.iter().enumerate() {
        for earlier in intents[..n].iter().filter(|e| e["step"] == r["step"]) {
            let how = recovered.iter().find(|x| x["id"] == earlier["id"]).map(|x| x["result"].clone());
            assert_eq!(
                how,
                Some(serde_json::json!("replan")),
                "phase {label}: {} of {} ran again although its earlier run {} was not an interrupted step left to the re-plan:\n{records:#?}",
                r["step"]["action"],
                r["step"]["device"],
                earlier["id"]
            );
        }
    }
    Phase { killed, recovered }
}

#[test]
fn root_guest_kill9_at_each_journal_phase_converges() {
    if !require_guest() {
        return;
    }
    let started = std::time::Instant::now();
    // 19 phases of two daemon runs each, 28 of two one-shot runs each: 3-6 min here, more on a
    // loaded machine.
    let run = run_scenario_within("crash-recovery.sh", Some(900));
    eprintln!(
        "crash-recovery.sh: {:.1} s on the host; {}",
        started.elapsed().as_secs_f64(),
        run.output.lines().find(|l| l.starts_with("all phases:")).unwrap_or("(no total)")
    );
    run.assert_ok();
    schema_valid(&run);
    // Killed right after each record: an interrupted step is one whose kernel call was not
    // made; recovery finds the map or the disk still there (`replan`), except the paths' offline
    // step, which the scenario's own offlining already did (`in_place`).
    let mut crash_points = Vec::new();
    for k in 1..=TEARDOWN.len() {
        let label = k.to_string();
        let p = check_phase(&run, &label, ("after", k), k);
        assert_all_removed(&run, &label);
        crash_points.push(p.crash_point());
        if let Some(rec) = p.recovered.first() {
            let want = if p.crash_point().starts_with("scsi_offline") { "in_place" } else { "replan" };
            assert_eq!(rec["result"], want, "phase {k}: {rec}");
        }
    }
    assert_eq!(crash_points, TEARDOWN, "killed after every record of every step, in order");
    // The last phase's killed run finished the whole plan: its restart had nothing left to do.
    let full = journal_records(&run, &TEARDOWN.len().to_string());
    assert_eq!(
        full.len(),
        TEARDOWN.len(),
        "the teardown has more records than the scenario covers:\n{full:#?}"
    );

    // Killed right before each result record: the kernel call was made, the journal does not
    // know. Recovery finds the effect: queueing off, the map or the disk gone, the disk offline.
    for k in (2..=TEARDOWN.len()).step_by(2) {
        let label = format!("before-{k}");
        let p = check_phase(&run, &label, ("before", k), k - 1);
        assert_all_removed(&run, &label);
        assert_eq!(p.crash_point(), TEARDOWN[k - 2], "phase {label}");
        let want = match p.crash_point().split(' ').next() {
            Some("dm_remove" | "scsi_delete") => "gone",
            _ => "in_place",
        };
        let rec = p.recovered.first().unwrap_or_else(|| panic!("phase {label}: no recovered record"));
        assert_eq!(rec["result"], want, "phase {label}: {rec}");
    }

    // The interrupted delete's disk was replaced while the agent was down: the step is closed as
    // `identity_changed` and never run against the new disk, which is left alone.
    let p = check_phase(&run, "changed", ("after", 7), 7);
    let new = run.section("new-sda");
    let f: Vec<&str> = new.split_whitespace().collect();
    assert_eq!(f.len(), 4, "new-sda: {new}");
    let new_token = format!("sda@{}#{};", f[1], f[2]);
    let rec = p.recovered.first().expect("the interrupted delete is recovered");
    assert_eq!(rec["result"], "identity_changed", "{rec}");
    let detail = rec["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("scsi_delete of sda")
            && detail.contains(&new_token)
            && detail.contains("not repeated"),
        "{detail}"
    );
    let records = journal_records(&run, "changed");
    let against_new: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| {
            r["phase"] == "intent"
                && r["step"]["identity"].as_str().is_some_and(|t| t.starts_with(&new_token))
        })
        .collect();
    assert!(against_new.is_empty(), "steps against the new sda: {against_new:#?}");
    let after = run.section("after-changed");
    assert!(
        after.lines().any(|l| l == "sda") && !after.lines().any(|l| l == "sdb"),
        "the new sda stays, sdb goes:\n{after}"
    );

    // Issue 17: the same teardown by the one-shot `clean mpathb --apply`, killed at every journal
    // record, then the SAME command run again: it resumes the plan (before resolving its
    // argument: the map may be gone) and finishes it, or says the map is gone. The scenario
    // itself fails unless the map and both paths end removed and the journal has nothing open.
    let mut resumed = vec!["plan-1".to_owned()];
    for k in 1..=TEARDOWN.len() {
        resumed.extend([format!("before-{k}"), k.to_string()]);
    }
    resumed.push("plan-before-2".into());
    for label in &resumed {
        let again = run.section(&format!("again-cli-{label}"));
        assert!(
            again.contains("rc=0") && again.contains("resumed the unfinished teardown of"),
            "cli-{label}: the second run resumes the plan:\n{again}"
        );
        let records = journal_records(&run, &format!("cli-{label}"));
        for r in records.iter().filter(|r| r["phase"] == "intent") {
            let closed = records
                .iter()
                .filter(|x| x["id"] == r["id"] && (x["phase"] == "result" || x["phase"] == "recovered"))
                .count();
            assert_eq!(closed, 1, "cli-{label}: every intent closed once: {r}\n{records:#?}");
        }
        // No kernel call was made twice: a step done (or found in place) runs no second time.
        let done: Vec<&serde_json::Value> = records
            .iter()
            .filter(|r| r["phase"] == "intent")
            .filter(|r| {
                records.iter().any(|x| {
                    x["id"] == r["id"]
                        && ((x["phase"] == "result" && x["result"] == "done")
                            || (x["phase"] == "recovered" && x["result"] != "replan"))
                })
            })
            .collect();
        for (n, r) in done.iter().enumerate() {
            assert!(
                !done[..n].iter().any(|e| e["step"] == r["step"]),
                "cli-{label}: {} of {} done twice:\n{records:#?}",
                r["step"]["action"],
                r["step"]["device"]
            );
        }
    }
    let gone = run.section("again-cli-plan-2");
    assert!(gone.contains("rc=0") && gone.contains("mpathb is gone"), "killed after the plan's end:\n{gone}");
    let fresh = run.section("again-cli-plan-before-1");
    assert!(fresh.contains("rc=0") && fresh.contains(": 6 steps\n"), "nothing journaled:\n{fresh}");
}

/// Issue 12, "multipathd in sync": with multipathd running, a dead map is removed through its
/// control socket and stays removed, and its wwid leaves /etc/multipath/wwids; with multipathd
/// running but not answering, nothing is removed and the failure names the map.
#[test]
fn root_guest_multipathd_removes_the_dead_map_and_forgets_its_wwid() {
    if !require_guest() {
        return;
    }
    let started = std::time::Instant::now();
    let run = run_scenario("multipathd-dead-map.sh");
    eprintln!("multipathd-dead-map.sh: {:.1} s in all", started.elapsed().as_secs_f64());
    run.assert_ok();
    schema_valid(&run);
    let wwid = "333333330000007d0";

    // Control: a root process named multipathd that holds no control socket (multipathd
    // stopped, a stand-in of that name left running): whose map it is cannot be told, so fail
    // closed (issue 34: a name is no daemon; before, the agent asked the stand-in's namespace
    // and its connection failed).
    let refused = run.section("unreachable");
    assert!(!refused.contains("rc=0"), "{refused}");
    assert!(
        refused.contains("remove dm device dm-0 (mpath-333333330000007d0) -> FAILED")
            && refused.contains("a root process named multipathd (pid")
            && refused.contains("runs but holds no control socket @/org/kernel/linux/storage/multipathd")
            && refused.contains("the map is left in place"),
        "{refused}"
    );
    assert!(!refused.contains("delete SCSI disk sda (0:0:0:0) -> done"), "{refused}");
    // Control: multipathd stopped: its socket accepts but does not answer.
    let silent = run.section("silent");
    assert!(!silent.contains("rc=0"), "{silent}");
    assert!(
        silent.contains("remove dm device dm-0 (mpath-333333330000007d0) -> FAILED")
            && silent.contains("no answer to 'show daemon'")
            && silent.contains("the map is left in place"),
        "{silent}"
    );

    // Through multipathd.
    let clean = run.section("clean");
    assert!(clean.contains("rc=0"), "{clean}");
    assert!(
        clean.contains(&format!(
            "remove dm device dm-0 (mpath-{wwid}) -> done: removed through multipathd (pid"
        )) && clean.contains(&format!("'del map mpatha'); wwid {wwid} removed from /etc/multipath/wwids")),
        "{clean}"
    );
    for step in ["delete SCSI disk sda (0:0:0:0) -> done", "delete SCSI disk sdb (1:0:0:0) -> done"] {
        assert!(clean.contains(step), "missing {step:?} in\n{clean}");
    }
    let log = run.section("multipathd-log");
    assert!(log.contains("mpatha: remove map (operator)"), "multipathd was not asked:\n{log}");
    let journal = run.section("journal");
    assert!(journal.contains("removed through multipathd"), "{journal}");

    // Still gone several checker intervals later, and the wwid forgotten, other lines kept.
    let after = run.section("after");
    assert!(after.contains("dmsetup: No devices found"), "{after}");
    assert!(!after.contains("mpatha"), "{after}");
    let before = run.section("wwids-before");
    assert!(before.contains(&format!("/{wwid}/")), "{before}");
    assert_eq!(run.section("wwids-after"), before.replace(&format!("\n/{wwid}/"), ""));
}

// ---- Issue 12: stacks on dead maps (LVM, LUKS, kpartx).

/// The step intents of a journal section, in order: (action, device).
fn intents(run: &blockjanitor_tests::guest::Run, section: &str) -> Vec<(String, String)> {
    run.section(section)
        .lines()
        .filter(|l| l.trim_start().starts_with('{'))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{section}: {l:?}: {e}"))
        })
        .filter(|r| r["phase"] == "intent")
        .map(|r| {
            (
                r["step"]["action"].as_str().unwrap_or("?").to_owned(),
                r["step"]["device"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect()
}

/// The kernel name (`dm-N`) the scenario's `layers` section gives a dm name.
fn layer_dev(run: &blockjanitor_tests::guest::Run, name: &str) -> String {
    let layers = run.section("layers");
    layers
        .lines()
        .find(|l| l.split(' ').next() == Some(name))
        .and_then(|l| l.split(' ').nth(1))
        .unwrap_or_else(|| panic!("no {name} in the layers section:\n{layers}"))
        .to_owned()
}

/// Where `(action, device)` is in `steps`.
fn position(steps: &[(String, String)], action: &str, device: &str) -> usize {
    steps
        .iter()
        .position(|(a, d)| a == action && d == device)
        .unwrap_or_else(|| panic!("no {action} of {device} in {steps:?}"))
}

#[test]
fn root_guest_lvm_and_luks_on_a_dead_map_are_removed_top_down() {
    if !require_guest() {
        return;
    }
    let started = std::time::Instant::now();
    let run = run_scenario_within("stack-on-dead-map.sh", Some(240));
    eprintln!(
        "stack-on-dead-map.sh: {:.1} s wall time; {}",
        started.elapsed().as_secs_f64(),
        run.section("timing")
    );
    run.assert_ok();
    schema_valid(&run);
    let layers = run.section("layers");
    assert!(layers.contains("uuid=LVM-") && layers.contains("uuid=CRYPT-LUKS2-"), "{layers}");
    let (map, lv0, lv1, crypt) = (
        layer_dev(&run, "mpathb"),
        layer_dev(&run, "vg0-lv0"),
        layer_dev(&run, "vg0-lv1"),
        layer_dev(&run, "secret"),
    );

    // Held on the host: the map is in use, and says by what and through which layer.
    let held = run.device("holders-held");
    assert_eq!(held["verdict"], "in_use", "{held:#}");
    let reasons = held["reasons"].to_string();
    assert!(
        reasons.contains("mounted at /mnt/lv in the host's mount namespace")
            && reasons.contains(&format!("(on LV vg0/lv0 ({lv0}), stacked on {map})")),
        "{reasons}"
    );
    let clean = run.section("clean-held");
    assert!(clean.contains("rc=2"), "{clean}");
    let exists = run.section("exists-held");
    for d in [&map, &lv0, &lv1, &crypt] {
        assert!(exists.contains(&format!("{d} present")), "{d}: {exists}");
    }

    // The daemon in clean mode: stop queueing, release, the layers top-down, the map, the paths.
    let steps = intents(&run, "journal");
    let order = [
        position(&steps, "dm_message", &map),
        position(&steps, "detach_mount", &lv0),
        position(&steps, "dm_remove", &crypt),
        position(&steps, "dm_remove", &lv1),
        position(&steps, "dm_remove", &map),
        position(&steps, "scsi_delete", "sdb"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "steps out of order: {steps:?}");
    assert!(position(&steps, "dm_remove", &lv0) < position(&steps, "dm_remove", &map), "{steps:?}");
    let after = run.section("exists-after");
    for d in [&map, &lv0, &lv1, &crypt] {
        assert!(after.contains(&format!("{d} gone")), "{d}: {after}");
    }
}

#[test]
fn root_guest_kpartx_partition_maps_go_before_their_dead_map() {
    if !require_guest() {
        return;
    }
    let started = std::time::Instant::now();
    let run = run_scenario("kpartx-on-dead-map.sh");
    eprintln!(
        "kpartx-on-dead-map.sh: {:.1} s wall time; {}",
        started.elapsed().as_secs_f64(),
        run.section("timing")
    );
    run.assert_ok();
    schema_valid(&run);
    let layers = run.section("layers");
    let parts: Vec<&str> =
        layers.lines().filter(|l| l.contains("uuid=part")).filter_map(|l| l.split(' ').nth(1)).collect();
    assert_eq!(parts.len(), 2, "{layers}");
    let map = layer_dev(&run, "mpathb");
    let h = run.device("holders");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    assert!(h["reasons"].to_string().contains("2 layer(s) stacked on it removed first"), "{h:#}");
    let clean = run.section("clean");
    assert!(clean.contains("rc=0"), "{clean}");
    let steps = intents(&run, "journal");
    let stop = position(&steps, "dm_message", &map);
    let remove_map = position(&steps, "dm_remove", &map);
    for p in &parts {
        let at = position(&steps, "dm_remove", p);
        assert!(stop < at && at < remove_map, "{p}: {steps:?}");
    }
    assert!(remove_map < position(&steps, "scsi_delete", "sda"), "{steps:?}");
}

// ---- Issue 12: NVMe over Fabrics (NVMe/TCP over the guest's loopback, nvmet via configfs).

/// The value of `key` in an NVMe controller's address (`traddr=127.0.0.1,trsvcid=4420`).
fn address_part<'a>(address: &'a str, key: &str) -> Option<&'a str> {
    address.split(',').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
}

/// A scenario that found its prerequisite missing from the guest image: fails in CI, else
/// prints SKIPPED with the reason (true: skipped).
fn skipped_in_guest(run: &blockjanitor_tests::guest::Run) -> bool {
    let Some(line) = run.output.lines().find(|l| l.starts_with("SKIPPED:")) else { return false };
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{line}");
    eprintln!("{line}");
    true
}

#[test]
fn root_guest_nvme_tcp_stale_controller_is_deleted_a_mounted_or_live_one_never() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("nvme-tcp-stale-controller.sh");
    if skipped_in_guest(&run) {
        return;
    }
    run.assert_ok();
    schema_valid(&run);
    // Before the grace period: a candidate with the controller's evidence.
    let first = run.device("first");
    assert_eq!(first["verdict"], "suspect", "{first:#}");
    assert_eq!(first["kind"], "nvme_namespace", "{first:#}");
    let nv = &first["nvme"];
    assert_eq!(nv["role"], "head", "{nv:#}");
    assert_eq!(nv["subsysnqn"], "nqn.2026-11.io.blockjanitor:a", "{nv:#}");
    let c = &nv["controllers"][0];
    assert_eq!(c["state"], "connecting", "{c:#}");
    assert_eq!(c["transport"], "tcp", "{c:#}");
    assert_eq!(c["ctrl_loss_tmo"], "off", "{c:#}");
    // `address` is the target end (`traddr=..,trsvcid=..`); nvme-tcp's src_addr, which the kernel
    // shows only for a live controller, is a field of its own and in the raw address.
    let address = c["address"].as_str().unwrap_or_else(|| panic!("address: {c:#}"));
    assert_eq!(address_part(address, "traddr"), Some("127.0.0.1"), "{c:#}");
    assert_eq!(address_part(address, "trsvcid"), Some("4420"), "{c:#}");
    let raw = c["address_raw"].as_str().unwrap_or_else(|| panic!("address_raw: {c:#}"));
    assert!(address_part(raw, "traddr") == Some("127.0.0.1"), "the kernel's address: {c:#}");
    assert!(
        c["src_addr"] == "" && address_part(raw, "src_addr").is_none(),
        "no src_addr while not live: {c:#}"
    );
    assert!(first["reasons"][0].as_str().expect("reason").contains("no live controller"), "{first:#}");
    // After it: stale; the mounted one in use; the live one unused.
    let scan = run.devices("scan");
    let by_nqn =
        |nqn: &str| scan_device(&scan, &format!("namespace of {nqn}"), |d| d["nvme"]["subsysnqn"] == nqn);
    let (a, b, c) = (
        by_nqn("nqn.2026-11.io.blockjanitor:a"),
        by_nqn("nqn.2026-11.io.blockjanitor:b"),
        by_nqn("nqn.2026-11.io.blockjanitor:c"),
    );
    assert_eq!(a["verdict"], "stale", "{a:#}");
    assert_eq!(b["verdict"], "in_use", "{b:#}");
    assert_eq!(b["holders"][0]["kind"], "mount", "{b:#}");
    assert_eq!(b["holders"][0]["in_host_namespace"], false, "{b:#}");
    assert!(b["reasons"].to_string().contains("not released by the agent"), "{b:#}");
    assert_eq!(c["verdict"], "unused", "{c:#}");
    assert_eq!(c["nvme"]["live_controllers"], 1, "{c:#}");
    assert!(c["reasons"].to_string().contains("never stale"), "{c:#}");
    let clean_a = run.section("clean_a");
    assert!(
        clean_a.contains("delete NVMe controller") && clean_a.contains("(delete_controller) -> done"),
        "{clean_a}"
    );
    assert!(clean_a.contains("rc=0"), "{clean_a}");
    let clean_b = run.section("clean_b");
    assert!(clean_b.contains("refused") && clean_b.contains("rc=2"), "{clean_b}");
    assert!(!clean_b.contains("detach mount"), "never released under a dead path: {clean_b}");
    let clean_c = run.section("clean_c");
    assert!(clean_c.contains("live") && clean_c.contains("rc=4"), "refused (exit 4): {clean_c}");
    // Every controller to 127.0.0.1 down at once: an outage, nothing cleaned.
    let outage = run.device("outage");
    assert_eq!(outage["verdict"], "outage", "{outage:#}");
    assert!(outage["reasons"][0].as_str().expect("reason").starts_with("outage:"), "{outage:#}");
    let co = run.section("clean_outage");
    assert!(co.contains("outage") && co.contains("rc=4"), "refused (exit 4): {co}");
    // The scenario itself checked the kernel's side (controller gone, mount kept, live untouched).
    assert!(run.output.contains("after clean: nvme0 gone"), "{}", run.output);
}

/// Issue 12, iSCSI (tests/guest/scenarios/iscsi-stale-session.sh): the LUNs of session A are
/// removed on the LIO target; the agent deletes A's disks and then logs A out through iscsid;
/// the mounted session B and the idle session C are untouched; with the whole portal down, every
/// disk behind it is an outage and nothing is cleaned.
#[test]
fn root_guest_iscsi_session_whose_luns_are_gone_is_emptied_then_logged_out_and_an_outage_is_never_cleaned() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("iscsi-stale-session.sh");
    run.assert_ok();
    schema_valid(&run);
    // Without I/O the kernel shows nothing; the read a path checker makes logs the target's answer.
    let quiet = run.section("kernel-after-removal");
    assert!(quiet.contains("state=running") && quiet.contains("LOGGED_IN"), "{quiet}");
    let read = run.section("kernel-after-read");
    assert_eq!(read.matches("Logical unit not supported").count(), 2, "{read}");
    let before = run.device("before");
    assert_eq!(before["verdict"], "unused", "a running LUN nothing said is gone: {before:#}");
    let session = &before["iscsi_session"];
    assert_eq!(session["target"], "iqn.2026-11.io.blockjanitor:stale-a", "{before:#}");
    // Connection 0's persistent portal (address and port), as the logout step names it.
    assert_eq!(session["portal"], "127.0.0.1:3260", "{before:#}");
    // Within the grace period: suspect, and a clean refuses; after it: stale.
    let h = run.device("holders");
    assert_eq!(h["verdict"], "suspect", "{h:#}");
    assert!(h["reasons"][0].as_str().expect("reason").contains("reports the LUN gone"), "{h:#}");
    let soon = run.section("too-soon");
    assert!(!soon.contains("rc=0") && !soon.contains(" -> done"), "nothing before the grace period: {soon}");
    let h = run.device("holders-after");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    let first = run.section("clean1");
    assert!(first.contains("rc=0") && !first.contains("iscsi_logout"), "{first}");
    let second = run.section("clean2");
    assert!(second.contains("rc=0"), "{second}");
    let (del, logout) = (
        second.find("2. scsi_delete: delete SCSI disk"),
        second.find("3. iscsi_logout: log out iSCSI session1 (iqn.2026-11.io.blockjanitor:stale-a"),
    );
    assert!(del.is_some() && logout.is_some() && del < logout, "delete first, then logout: {second}");
    assert!(
        second[logout.unwrap_or(0)..].lines().next().is_some_and(|l| l.ends_with(" -> done")),
        "{second}"
    );
    // The journal: the logout's intent (with the session's identity) and its result.
    let records: Vec<serde_json::Value> =
        run.section("journal").lines().map(|l| serde_json::from_str(l).expect("journal line")).collect();
    let intent = records
        .iter()
        .find(|r| r["phase"] == "intent" && r["step"]["action"] == "iscsi_logout")
        .unwrap_or_else(|| panic!("no logout intent in {records:#?}"));
    assert_eq!(intent["step"]["target"], "iqn.2026-11.io.blockjanitor:stale-a", "{intent:#}");
    assert_eq!(intent["step"]["portal"], "127.0.0.1:3260", "{intent:#}");
    assert!(
        records.iter().any(|r| r["phase"] == "result" && r["id"] == intent["id"] && r["result"] == "done"),
        "{records:#?}"
    );
    // The outage: both remaining sessions down, their disks transport-offline.
    let kernel = run.section("outage-kernel");
    assert_eq!(kernel.matches("transport-offline").count(), 2, "{kernel}");
    let scan = run.devices("outage-scan");
    let disks: Vec<&serde_json::Value> =
        scan["devices"].as_array().expect("devices").iter().filter(|d| d["scsi"].is_object()).collect();
    assert!(disks.len() >= 2, "the disks of both sessions are in the scan: {scan:#}");
    for d in disks {
        assert_eq!(d["verdict"], "outage", "{d:#}");
        assert!(d["reasons"][0].as_str().expect("reason").starts_with("outage: "), "{d:#}");
    }
    assert!(scan["blind_spots"].as_array().expect("blind_spots").is_empty(), "{:#}", scan["blind_spots"]);
    let refused = run.section("outage-clean");
    assert!(refused.contains("rc=4") && refused.contains("outage"), "refused (exit 4): {refused}");
}

// ---- Issue 17: everything a step removes is scanned; openers the scan cannot see.

/// Issue 17 (tests/guest/scenarios/nvme-sibling-held.sh): one NVMe/TCP subsystem with two
/// namespaces, its controller reconnecting for ever, a process holding the SECOND namespace
/// open. A one-shot `clean` of the FIRST is refused (non-zero exit code) naming the second and
/// its holder, and the controller stays; the holder gone, the same command deletes it.
#[test]
fn root_guest_clean_of_an_nvme_namespace_whose_sibling_is_open_is_refused() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("nvme-sibling-held.sh");
    if skipped_in_guest(&run) {
        return;
    }
    run.assert_ok();
    schema_valid(&run);
    let devices = run.section("devices");
    let field = |k: &str| {
        devices
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")).map(str::to_owned))
            .unwrap_or_else(|| panic!("no {k} in {devices}"))
    };
    let (ctrl, n1, n2) = (field("controller"), field("n1"), field("n2"));
    let clean = run.section("clean");
    assert!(!clean.contains("rc=0") && clean.contains("rc=2"), "refused with the 'held' exit code: {clean}");
    assert!(
        clean.contains(&format!("{n2}, which goes with the same controller(s)"))
            && clean.contains("(sleep) has the device node open"),
        "names the sibling and its holder: {clean}"
    );
    assert!(!clean.contains("delete_controller) -> done"), "{clean}");
    let after = run.section("after");
    assert!(after.contains(&format!("controller {ctrl} connecting")), "the controller stays: {after}");
    assert!(after.contains(&format!("{n1} present")) && after.contains(&format!("{n2} present")), "{after}");
    assert!(after.contains(&format!("alive: /dev/{n2}")), "the holder keeps its namespace: {after}");
    // Nothing held: the same one-shot command deletes the controller, both namespaces with it.
    let free = run.section("clean_free");
    assert!(free.contains("rc=0") && free.contains("(delete_controller) -> done"), "{free}");
    let after = run.section("after_free");
    assert!(
        after.contains(&format!("controller {ctrl} gone")) && after.contains(&format!("{n2} gone")),
        "{after}"
    );
}

/// Builds tests/guest/scenario-lib/fd-in-flight.c on the host, static, into `extra/bin/`.
fn stage_fd_in_flight(extra: &std::path::Path) {
    let src = blockjanitor_tests::guest::guest_dir().join("scenario-lib/fd-in-flight.c");
    std::fs::create_dir_all(extra.join("bin")).expect("mkdir bin");
    let out = std::process::Command::new("gcc")
        .args(["-static", "-O2", "-Wall", "-Werror", "-o"])
        .arg(extra.join("bin/fd-in-flight"))
        .arg(&src)
        .output()
        .expect("gcc (needed to build the guest's fd-in-flight helper)");
    assert!(out.status.success(), "gcc -static fd-in-flight.c: {}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 34 (tests/guest/scenarios/dm-dup-and-in-flight.sh): two readers stuck on a dead map
/// share one open file of it (a dup'd fd, inherited over fork: two processes, four fds), and a
/// third process's open file of it is in flight over a unix socket. The kernel counts 2 opens;
/// the readers are 1 open file (kcmp), so `clean --apply` is refused naming "open count 2,
/// accounted 1", fail_if_no_path is not sent and nothing is removed. (Before, the four fds
/// covered the count, and fail_if_no_path went out under the hidden opener.) The opener gone,
/// the same command tears the map down.
#[test]
fn root_guest_dupd_readers_do_not_hide_an_fd_in_flight() {
    if !require_guest() {
        return;
    }
    let run = run_scenario_with("dm-dup-and-in-flight.sh", None, stage_fd_in_flight);
    run.assert_ok();
    let opener = run.section("opener");
    assert!(opener.contains("open count 2"), "the kernel counts one open file per opener: {opener}");
    assert!(!opener.contains("/dev/dm-"), "no fd of the map shows in /proc for the opener: {opener}");
    let readers = run.section("readers");
    assert_eq!(
        readers.matches("state D fds: 2 of the map").count(),
        2,
        "two stuck readers, two fds each: {readers}"
    );
    let clean = run.section("clean");
    assert!(clean.contains("rc=2"), "held (the stuck readers, and what the count shows): {clean}");
    assert!(
        clean.contains("open count 2, accounted 1 (1 open file(s) of stuck readers, 4 fd(s)): something the scan cannot see holds dm-"),
        "names the difference, the readers counted per open file: {clean}"
    );
    assert!(!clean.contains(" -> done"), "no step ran: {clean}");
    let after = run.section("after");
    assert!(after.contains("present") && !after.contains("gone"), "{after}");
    assert!(after.contains("queue_if_no_path"), "fail_if_no_path was not sent: {after}");
    assert!(after.contains("stuck readers: 2"), "{after}");
    let free = run.section("clean_free");
    assert!(free.contains("rc=0"), "{free}");
    let after = run.section("after_free");
    assert!(
        !after.contains("present") && after.contains("readers left: 0"),
        "the map and its paths are gone: {after}"
    );
}

/// Issue 17 (tests/guest/scenarios/dm-fd-in-flight.sh): an fd of a dead multipath map passed
/// over a unix socket (SCM_RIGHTS) and still in flight: no /proc/PID/fd shows it, the dm open
/// count does. `clean MAP --apply` is refused naming the difference, fail_if_no_path is not
/// sent (the map keeps queueing) and nothing is removed; the opener gone, the same command
/// tears the map down.
#[test]
fn root_guest_an_fd_in_flight_over_a_unix_socket_keeps_a_dead_maps_teardown_refused() {
    if !require_guest() {
        return;
    }
    let run = run_scenario_with("dm-fd-in-flight.sh", None, stage_fd_in_flight);
    run.assert_ok();
    schema_valid(&run);
    let opener = run.section("opener");
    assert!(opener.contains("open count 1"), "the kernel counts the fd in flight: {opener}");
    assert!(!opener.contains("/dev/dm-"), "no fd of the map shows in /proc: {opener}");
    let clean = run.section("clean");
    assert!(
        clean.contains("rc=4"),
        "refused (exit 4: the kernel's count, not a holder the scan saw): {clean}"
    );
    assert!(
        clean.contains("open count 1, accounted 0 (nothing): something the scan cannot see holds dm-"),
        "names the difference: {clean}"
    );
    assert!(!clean.contains(" -> done"), "no step ran: {clean}");
    let after = run.section("after");
    assert!(after.contains("present") && !after.contains("gone"), "{after}");
    assert!(after.contains("queue_if_no_path"), "fail_if_no_path was not sent: {after}");
    let free = run.section("clean_free");
    assert!(free.contains("rc=0"), "{free}");
    let after = run.section("after_free");
    assert!(!after.contains("present"), "the map and its paths are gone: {after}");
}
