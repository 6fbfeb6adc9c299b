//! The rbd incidents (1, 4 and 5) against a real Ceph cluster and Debian's kernel client.

use blockjanitor_tests::ceph::{require_ceph, run_ceph_scenario};
use blockjanitor_tests::guest::Run;

fn json(run: &Run, name: &str) -> serde_json::Value {
    let text = run.section(name);
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("section {name} is not JSON ({e}):\n{text}\n--- output ---\n{}", run.output)
    })
}

fn host_line<'a>(run: &'a Run, prefix: &str) -> &'a str {
    run.output
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no '{prefix}' line in\n{}", run.output))
}

#[test]
fn root_ceph_incident1_unused_mapping_is_unmapped_and_the_watcher_goes() {
    if !require_ceph() {
        return;
    }
    let run = run_ceph_scenario("rbd-incident1.sh");
    run.assert_ok();
    let h = json(&run, "holders");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    assert_eq!(h["rbd"]["pool"], "k8s");
    assert_eq!(h["rbd"]["image"], "vol");
    let watcher = format!(
        "watcher={} {}",
        h["rbd"]["client_addr"].as_str().expect("addr"),
        h["rbd"]["watcher_client"].as_str().expect("id")
    );
    let mapped = host_line(&run, "HOST watchers-mapped:");
    assert!(
        mapped.contains(&watcher),
        "the cluster's watcher is the client the agent reports: {mapped} vs {watcher}"
    );
    let clean = run.section("clean");
    assert!(
        clean.contains("unmap rbd k8s/vol") && clean.contains(": done") && clean.contains("rc=0"),
        "{clean}"
    );
    let after = host_line(&run, "HOST watchers-after:");
    assert!(!after.contains("watcher="), "no watcher once unmapped: {after}");
}

#[test]
fn root_ceph_incident5_foreign_mount_on_rbd_is_released_then_unmapped() {
    if !require_ceph() {
        return;
    }
    let run = run_ceph_scenario("rbd-incident5.sh");
    run.assert_ok();
    let h = json(&run, "holders");
    let m = &h["holders"][0];
    assert_eq!(m["kind"], "mount", "{h:#}");
    assert_eq!(m["in_host_namespace"], false);
    assert_eq!(m["mount_point"], "/mnt/vol");
    assert!(run.section("release").contains(": done"), "{}", run.section("release"));
    let clean = run.section("clean");
    assert!(clean.contains("unmap rbd k8s/vol") && clean.contains("rc=0"), "{clean}");
}

#[test]
fn root_ceph_incident4_fenced_client_is_reported_and_still_cleaned_locally() {
    if !require_ceph() {
        return;
    }
    let run = run_ceph_scenario("rbd-incident4.sh");
    run.assert_ok();
    let h = json(&run, "holders");
    let watcher = format!(
        "watcher={} {}",
        h["rbd"]["client_addr"].as_str().expect("addr"),
        h["rbd"]["watcher_client"].as_str().expect("id")
    );
    assert!(host_line(&run, "HOST watchers-mapped:").contains(&watcher), "{}", run.output);
    let fenced = json(&run, "fenced");
    assert!(
        fenced["rbd"]["fenced"].is_string(),
        "the agent reports the mapping fenced:\n{fenced:#}\n{}",
        run.section("dmesg")
    );
    assert!(fenced["reasons"].to_string().contains("fenced"), "{fenced:#}");
    let clean = run.section("clean");
    assert!(clean.contains("unmap rbd k8s/vol") && clean.contains("rc=0"), "{clean}");
}

#[test]
fn root_ceph_release_mode_detaches_a_stale_rbd_mount_by_itself() {
    if !require_ceph() {
        return;
    }
    let run = run_ceph_scenario("rbd-release-mode.sh");
    run.assert_ok();
    let journal = run.section("journal");
    assert!(
        journal.contains("\"action\":\"detach_mount\"") && journal.contains("\"result\":\"done\""),
        "{journal}"
    );
    assert!(journal.contains("rbd0"), "the released device is the rbd image: {journal}");
}
