//! Scenarios in the qemu guest (Debian's kernel): what this host's kernel cannot show
//! (scsi_debug disks, device-mapper multipath, nbd, rbd), with the real agent binary inside.

use blockjanitor_tests::find_device;
use blockjanitor_tests::guest::{require_guest, run_scenario};

#[test]
fn root_guest_agent_scans_a_scsi_disk_and_releases_a_foreign_mount() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("agent-scan.sh");
    run.assert_ok();
    let scan: serde_json::Value = serde_json::from_str(&run.section("scan")).expect("scan JSON");
    let sda = scan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"]["name"] == "sda")
        .unwrap_or_else(|| panic!("no sda in {scan:#}"));
    assert_eq!(sda["device"]["kind"], "disk");
    assert_eq!(sda["device"]["size_bytes"], 16 << 20);
    let holders: serde_json::Value = serde_json::from_str(&run.section("holders")).expect("holders JSON");
    let h = &holders["holders"][0];
    assert_eq!(h["kind"], "mount");
    assert_eq!(h["in_host_namespace"], false);
    assert_eq!(h["mount_point"], "/mnt/vol");
    assert_eq!(h["comm"], "sleep");
}

fn json_section(run: &blockjanitor_tests::guest::Run, name: &str) -> serde_json::Value {
    let text = run.section(name);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("section {name} is not JSON ({e}):\n{text}\n--- output ---\n{}", run.output)
    })
}

#[test]
fn root_guest_incident3_dead_map_and_paths_are_reported_and_torn_down() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("incident3.sh");
    run.assert_ok();
    let scan = json_section(&run, "scan");
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
    assert_eq!(mp["queue_if_no_path"], true);
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
    let h = json_section(&run, "holders");
    assert_eq!(h["verdict"], "unused", "{h:#}");
    assert!(h["reasons"].to_string().contains("1 of 2 path(s) active"), "{h:#}");
    let clean = run.section("clean");
    assert!(clean.contains("refused") && clean.contains("rc=2"), "{clean}");
}

#[test]
fn root_guest_stuck_reader_is_freed_by_fail_if_no_path_and_the_api_keeps_answering() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("stuck-reader.sh");
    run.assert_ok();
    assert!(run.output.contains("state: D"), "the reader hung in D state:\n{}", run.output);
    let api = json_section(&run, "api");
    assert!(api.to_string().contains("open_device"), "the API answers while the reader is stuck: {api:#}");
    let h = json_section(&run, "holders");
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
    assert!(!run.section("api-after").is_empty(), "the API still answers after teardown");
}

#[test]
fn root_guest_foreign_mount_on_a_map_is_released_first() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("foreign-mount-on-map.sh");
    run.assert_ok();
    let h = json_section(&run, "holders");
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
    let h = json_section(&run, "holders");
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
    let h = json_section(&run, "holders");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    assert_eq!(h["nbd"]["server_alive"], false, "{h:#}");
    assert!(h["reasons"][0].as_str().expect("reason").contains("is gone"), "{h:#}");
    let clean = run.section("clean");
    assert!(
        clean.contains("disconnect nbd device nbd0 (NBD_DISCONNECT): done") && clean.contains("rc=0"),
        "{clean}"
    );
}
