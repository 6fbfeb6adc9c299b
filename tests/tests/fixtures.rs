//! Fixture-tree tests: incident 5 as the kernel showed it, and bad input (truncated mountinfo,
//! garbage in sysfs, unknown devices) giving one-line errors and a non-zero exit, never a panic.

use std::path::{Path, PathBuf};

use blockjanitor_tests::{
    agent, agent_json, blind_spot_parts, find_device, fixtures, kernel_thread_names, text,
};

fn incident5() -> String {
    fixtures().join("incident5").to_string_lossy().into_owned()
}

/// Copies a fixture tree (symlinks kept) into a temp dir so a test can break it.
fn copy_tree(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("read fixture") {
        let entry = entry.expect("entry");
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ft = entry.file_type().expect("type");
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).expect("link"), &dst).expect("symlink");
        } else if ft.is_dir() {
            std::fs::create_dir_all(&dst).expect("mkdir");
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).expect("copy");
        }
    }
}

fn broken_copy() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("incident5");
    std::fs::create_dir_all(&root).expect("mkdir");
    copy_tree(&fixtures().join("incident5"), &root);
    (dir, root)
}

/// Asserts a clean failure: exit 1, one line on stderr naming `needle`, no panic.
fn assert_one_line_error(args: &[&str], needle: &str) -> String {
    let out = agent(args);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "args {args:?}: stdout {} stderr {err}", text(&out.stdout));
    assert!(!err.contains("panicked"), "panic: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    assert!(err.contains(needle), "error does not name {needle:?}: {err}");
    err
}

#[test]
fn incident5_holder_found_only_in_the_threads_namespace() {
    let root = incident5();
    for arg in ["/dev/rbd3", "rbd3", "250:0"] {
        // 2: held (a holder is seen), as `fuser -s` would say.
        let v = agent_json(&["--root", &root, "holders", arg, "--output", "json"], 2);
        assert_eq!(v["name"], "rbd3");
        assert_eq!(v["major"], 250);
        assert_eq!(v["minor"], 0);
        assert_eq!(v["kind"], "rbd");
        let holders = v["holders"].as_array().expect("holders");
        assert_eq!(holders.len(), 1, "exactly one holder: {holders:?}");
        let h = &holders[0];
        assert_eq!(h["kind"], "mount");
        assert_eq!(h["pids"], serde_json::json!([21839]));
        assert_eq!(h["comm"], "node_exporter");
        assert_eq!(h["mount_namespace"], 4026532517u64, "the thread's own namespace");
        assert_eq!(h["in_host_namespace"], false);
        assert_eq!(h["namespace_entry"]["tid"], 28447);
        assert_eq!(
            h["mount_point"],
            "/host/data/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c8381f27-8a0b-11e8-9a3b-fa163e6f1a5c"
        );
        assert_eq!(h["container_id"], "9b7e3c5d1f2a4b6c8d0e1f3a5b7c9d1e3f5a7b9c1d3e5f7a9b1c3d5e7f9a1b3c");
        assert_eq!(h["pod_uid"], "5d1c7c2e-8a0b-11e8-9a3b-fa163e6f1a5c");
        let kthreads = kernel_thread_names(&v);
        assert_eq!(kthreads, vec!["rbd3-task", "jbd2/rbd3-8"], "kernel threads are symptoms, not holders");
    }
}

#[test]
fn incident5_release_plans_one_detach_and_refuses_to_apply_on_a_fixture() {
    let root = incident5();
    let out = agent(&["--root", &root, "release", "rbd3"]);
    assert_eq!(out.status.code(), Some(0));
    let s = text(&out.stdout);
    assert!(
        s.contains("\nrbd3: 1 step\n") && s.ends_with("\ndry run: add --apply to carry them out\n"),
        "{s}"
    );
    assert!(s.contains("via pid 21839 tid 28447 (umount2 MNT_DETACH)"), "{s}");
    let j = tempfile::tempdir().expect("tempdir");
    let journal = j.path().join("journal.jsonl");
    // Refused (exit 4) in one line, before anything is journaled.
    let out =
        agent(&["--root", &root, "--journal", journal.to_str().expect("utf8"), "release", "rbd3", "--apply"]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{said}{}", text(&out.stderr));
    assert_eq!(said.lines().count(), 1, "one line: {said}");
    assert!(said.starts_with("rbd3: refused: --apply refused: "), "{said}");
    assert!(said.contains("is not this process's procfs (a fixture tree?)"), "{said}");
    assert!(said.contains("incident5/proc"), "{said}");
    assert!(!journal.exists(), "nothing journaled when nothing may be done");
}

#[test]
fn scan_of_incident5_lists_every_device_and_the_stack() {
    let v = agent_json(&["--root", &incident5(), "scan", "--output", "json"], 0);
    let devices = v["devices"].as_array().expect("devices");
    let names: Vec<&str> = devices.iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, vec!["rbd3", "sda", "sda1"]);
    let sda = &devices[1];
    assert_eq!(sda["holders"][0]["kind"], "stacked_device");
    assert_eq!(sda["holders"][0]["device"], "sda1");
    let sda1 = &devices[2];
    assert_eq!(sda1["parent"], "sda");
    let in_host: Vec<bool> = sda1["holders"]
        .as_array()
        .expect("h")
        .iter()
        .filter_map(|h| h["in_host_namespace"].as_bool())
        .collect();
    assert_eq!(
        in_host,
        vec![true, false, false],
        "host / plus node_exporter's /host in both of its namespaces"
    );
    assert_eq!(devices.iter().filter(|d| d["in_use"] == true).count(), 3, "held");
}

#[test]
fn clean_refuses_held_devices_and_kinds_it_does_not_handle() {
    // rbd3 is held by node_exporter's mount: refused (exit 2), with the holder as the reason.
    let out = agent(&["--root", &incident5(), "--grace-period", "0", "clean", "rbd3"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    let t = text(&out.stdout);
    assert!(
        t.contains("rbd3 is in_use, not stale") && t.contains("node")
            || t.contains("mounted at /host/data/kubelet"),
        "{t}"
    );
    // A partition is not something clean handles: an error (exit 1), not a refusal.
    let out = agent(&["--root", &incident5(), "clean", "sda1"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(text(&out.stdout)
        .contains("clean handles loop devices, multipath maps, SCSI disks, rbd and nbd devices"));
}

#[test]
fn a_truncated_mountinfo_is_a_blind_spot_naming_file_and_line() {
    let (_d, root) = broken_copy();
    let mi = root.join("proc/21839/task/28447/mountinfo");
    let full = std::fs::read_to_string(&mi).expect("read");
    std::fs::write(&mi, &full[..full.len() - 40]).expect("truncate");
    let v = agent_json(
        &[
            "--root",
            root.to_str().expect("utf8"),
            "--grace-period",
            "0",
            "holders",
            "rbd3",
            "--output",
            "json",
        ],
        // Held: a holder is still seen (2 wins over the blind spot's 3, as a seen holder is
        // certain); the report names the blind spot all the same.
        2,
    );
    let (what, _) = blind_spot(&v, "proc/21839/task/28447/mountinfo");
    assert!(what.contains("line 5") && what.contains("truncated"), "{what}");
    // The mount was in the namespace whose table is unreadable; the kernel's journal thread for
    // rbd3 still says a filesystem lives on it: in use, never stale.
    assert_eq!(v["verdict"], "in_use", "{v:#}");
    assert_eq!(v["holders"][0]["kind"], "filesystem", "{v:#}");
    assert!(v["holders"][0]["path"].as_str().is_some_and(|p| p.contains("jbd2/rbd3-8")), "{v:#}");
}

/// The blind spot of a document whose text mentions `needle`: what could not be read, and what
/// it could hide a holder of.
fn blind_spot(v: &serde_json::Value, needle: &str) -> (String, String) {
    v["blind_spots"]
        .as_array()
        .expect("blind_spots")
        .iter()
        .filter_map(|b| b.as_str())
        .map(blind_spot_parts)
        .find(|(what, _)| what.contains(needle))
        .unwrap_or_else(|| panic!("no blind spot mentions {needle:?}: {:#}", v["blind_spots"]))
}

#[test]
fn garbage_in_sysfs_blinds_the_scan_to_that_device_only() {
    let (_d, root) = broken_copy();
    std::fs::write(root.join("sys/devices/rbd/3/block/rbd3/dev"), "garbage\n").expect("write");
    // A scan with a blind spot exits 3 (unknown).
    let v = agent_json(&["--root", root.to_str().expect("utf8"), "scan", "--output", "json"], 3);
    let (what, could_hide) = blind_spot(&v, "sys/class/block/rbd3/dev");
    assert!(what.contains("'garbage'") && what.contains("MAJ:MIN"), "{what}");
    assert_eq!(could_hide, "rbd3", "it reaches that device only: {what}");
    assert!(v["devices"].as_array().expect("devices").iter().all(|d| d["name"] != "rbd3"));
    assert!(v["devices"].as_array().expect("devices").iter().any(|d| d["name"] == "sda"));
    let (_d2, root2) = broken_copy();
    std::fs::write(root2.join("sys/devices/rbd/3/block/rbd3/size"), "\u{7f}lots\n").expect("write");
    let v = agent_json(&["--root", root2.to_str().expect("utf8"), "holders", "sda", "--output", "json"], 2);
    blind_spot(&v, "rbd3/size");
}

#[test]
fn a_malformed_process_is_a_blind_spot_and_the_rest_is_still_seen() {
    let (_d, root) = broken_copy();
    std::fs::write(root.join("proc/1187/stat"), "1187 (kubelet").expect("write");
    // 2, not 3: a holder is seen, so the device is held whatever the blind spot hides.
    let v = agent_json(&["--root", root.to_str().expect("utf8"), "holders", "rbd3", "--output", "json"], 2);
    assert_eq!(v["holders"][0]["pids"], serde_json::json!([21839]), "the other processes are still seen");
    assert_eq!(blind_spot(&v, "proc/1187/stat").1, "any device");
}

#[test]
fn unknown_devices_are_one_line_errors() {
    let root = incident5();
    assert_one_line_error(&["--root", &root, "holders", "sdz"], "unknown device 'sdz'");
    assert_one_line_error(&["--root", &root, "holders", "9:99"], "no block device 9:99");
    assert_one_line_error(&["--root", &root, "holders", "7:x"], "unknown device '7:x'");
    assert_one_line_error(&["--root", &root, "holders", ""], "empty device argument");
    assert_one_line_error(&["--root", &root, "holders", "/etc/passwd"], "cannot stat");
    assert_one_line_error(&["--root", "/nonexistent", "scan"], "/nonexistent/sys/class/block");
    let out = agent(&["holders"]);
    assert_eq!(out.status.code(), Some(1), "a missing argument is an error (exit 1, not 2)");
    let out = agent(&["--help"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("EXIT CODES"));
}

/// A subcommand's help lists only the global flags it uses, under headings; those it ignores
/// are still accepted (one set of flags for every command in a script).
#[test]
fn a_subcommands_help_lists_only_the_flags_it_uses() {
    let help = |args: &[&str]| {
        let out = agent(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out.stderr));
        text(&out.stdout)
    };
    for args in [&["holders", "--help"][..], &["help", "holders"], &["scan", "-h"]] {
        let h = help(args);
        assert!(h.contains("Usage: blockjanitor-agent "), "{args:?}: {h}");
        assert!(
            !h.contains("--journal") && !h.contains("--lock-wait"),
            "{args:?} lists flags it ignores: {h}"
        );
        assert!(h.contains("Host:") && h.contains("--root") && h.contains("Kubernetes:"), "{args:?}: {h}");
        assert!(!h.contains('\u{1b}'), "no colour when piped: {h}");
    }
    let h = help(&["journal", "--help"]);
    assert!(h.contains("--journal") && !h.contains("--root") && !h.contains("--kubeconfig"), "{h}");
    assert!(help(&["clean", "--help"]).contains("--lock-wait"), "clean --apply waits for the journal's lock");
    // Still accepted where ignored.
    let root = fixtures().join("incident5").to_string_lossy().into_owned();
    agent_json(
        &["--root", &root, "--journal", "/nonexistent/j.jsonl", "--lock-wait", "1", "scan", "-o", "json"],
        0,
    );
}

fn scan_fixture(name: &str) -> serde_json::Value {
    let root = fixtures().join(name).to_string_lossy().into_owned();
    agent_json(&["--root", &root, "scan", "--output", "json"], 0)
}

#[test]
fn iscsi_disks_show_their_session_an_outage_is_never_cleaned_and_an_emptied_session_is_logged_out() {
    let scan = scan_fixture("iscsi");
    let up = find_device(&scan, "sdc");
    assert_eq!(up["scsi"]["state"], "running");
    assert_eq!(
        (up["scsi"]["transport"].as_str(), up["scsi"]["transport_name"].as_str()),
        (Some("iscsi"), Some("session1")),
        "{up:#}"
    );
    assert_eq!(up["scsi"]["transport_state"], "logged_in");
    assert_eq!(up["iscsi_session"]["sid"], 1, "{up:#}");
    assert!(
        up["iscsi_session"]["portal"].as_str().is_some_and(|p| p.starts_with("192.168.10.20:")),
        "{up:#}"
    );
    assert_eq!(up["iscsi_session"]["iface"], "default");
    assert_eq!(up["verdict"], "unused");
    // sdd is offline because session2, the only session to its target and portal, FAILED: an
    // outage, not staleness. Never a candidate, whatever the grace period.
    let down = find_device(&scan, "sdd");
    assert_eq!(down["scsi"]["state"], "transport-offline");
    assert_eq!(down["scsi"]["transport_state"], "failed");
    assert_eq!(down["verdict"], "outage", "{down:#}");
    let why = down["reasons"][0].as_str().expect("reason");
    assert!(
        why.starts_with("outage: the only iSCSI session to portal 192.168.11.20:3260 is down (session2)"),
        "{why}"
    );
    assert_eq!(down["scsi"]["outage_scope"], "portal");
    let root = fixtures().join("iscsi").to_string_lossy().into_owned();
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "sdd"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "refused: {t}{}", text(&out.stderr));
    assert!(t.contains("outage") && !t.contains("delete SCSI disk"), "{t}");
    // session4 is logged in and both its LUNs are offline: each disk's plan deletes it; the
    // session is logged out on the plan of its last disk, after the delete.
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "sde"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}{}", text(&out.stderr));
    assert!(t.contains("delete SCSI disk sde") && !t.contains("log out iSCSI"), "{t}");
    assert!(t.contains("the plan of sdf logs it out"), "{t}");
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "sdf"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}{}", text(&out.stderr));
    let (del, logout) = (t.find("delete SCSI disk sdf"), t.find("log out iSCSI session4"));
    assert!(del.is_some() && logout.is_some() && del < logout, "delete first, then log out: {t}");
    assert!(
        t.contains("iqn.2003-01.org.linux-iscsi.store2.x8664:sn.a at 192.168.12.31:3260, iface default"),
        "{t}"
    );
    let v = agent_json(&["--root", &root, "--grace-period", "0", "clean", "sdf", "--output", "json"], 0);
    let steps = v.to_string();
    assert!(steps.contains("\"action\":\"iscsi_logout\"") && steps.contains("session4"), "{v:#}");
}

#[test]
fn fc_disks_show_their_remote_port_and_blocked_is_not_stale() {
    let scan = scan_fixture("fc");
    let devices = scan["devices"].as_array().expect("devices");
    let blocked = devices.iter().find(|d| d["scsi"]["state"] == "blocked").expect("a blocked disk");
    assert_eq!(blocked["scsi"]["transport_state"], "blocked", "{blocked:#}");
    assert_eq!(blocked["scsi"]["transport"], "fc", "{blocked:#}");
    assert!(blocked["scsi"]["transport_name"].as_str().expect("rport").starts_with("rport-"));
    assert_eq!(blocked["verdict"], "unused", "a blocked transport may come back: never a candidate");
    let online = devices.iter().find(|d| d["scsi"]["state"] == "running").expect("a running disk");
    assert_eq!(online["scsi"]["transport_state"], "online");
    let root = fixtures().join("fc").to_string_lossy().into_owned();
    let name = blocked["name"].as_str().expect("name");
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", name]);
    assert_eq!(out.status.code(), Some(4), "refused: {}", text(&out.stdout));
    assert!(text(&out.stdout).contains("not stale"), "{}", text(&out.stdout));
}

#[test]
fn incident1_unused_mapping_reports_the_watcher_identity_and_plans_the_unmap() {
    let root = fixtures().join("incident1").to_string_lossy().into_owned();
    let image = "/dev/rbd/k8s/kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
    let v = agent_json(&["--root", &root, "--grace-period", "0", "holders", image, "--output", "json"], 0);
    assert_eq!(v["name"], "rbd4");
    assert_eq!(v["holders"], serde_json::json!([]));
    assert_eq!(v["verdict"], "stale", "{v:#}");
    // What matches the cluster's `watcher=10.125.53.47:0/3423687629 client.1138525`.
    assert_eq!(v["rbd"]["client_id"], "client.1138525", "as the cluster's watcher list prints it");
    assert_eq!(v["rbd"]["client_addr"], "10.125.53.47:0/3423687629");
    assert_eq!(v["rbd"]["image_id"], "115f79643c9869", "rbd_data.115f79643c9869");
    assert_eq!(v["rbd"]["pool"], "k8s");
    assert!(v["reasons"][0]
        .as_str()
        .expect("reason")
        .contains("client.1138525 at 10.125.53.47:0/3423687629"));
    // The fixture's config_info holds a (fake) cephx key, as the kernel's does: never read.
    let config_info =
        std::fs::read_to_string(format!("{root}/sys/devices/rbd/4/config_info")).expect("config_info");
    assert!(config_info.contains("secret=AQBfAKE"), "the fixture has a key to leak: {config_info}");
    assert!(!v.to_string().contains("secret"), "config_info (which holds the key) is never read: {v}");
    let scan = agent(&["--root", &root, "scan", "--output", "json"]);
    assert!(!text(&scan.stdout).contains("AQBfAKE"), "the key is in the scan: {}", text(&scan.stdout));
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "rbd4"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("unmap rbd k8s/kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c (rbd4, id 4)"),
        "{t}"
    );
    // `force` only when asked for, and then said plainly.
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "rbd4"]);
    assert!(!text(&out.stdout).contains("force"), "{}", text(&out.stdout));
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "rbd4", "--force"]);
    assert!(text(&out.stdout).contains("with force (in-flight I/O fails)"), "{}", text(&out.stdout));
    // Not yet stale with the default grace: refused (exit 4), with the reason.
    let out = agent(&["--root", &root, "clean", "rbd4"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(text(&out.stdout).contains("suspect, not stale"), "{}", text(&out.stdout));
}

#[test]
fn incident5_kubelet_directory_ties_rbd3_to_its_in_tree_volume() {
    // kubelet ran with --root-dir=/data/kubelet; node_exporter sees it under /host/data/kubelet.
    let v = agent_json(
        &["--root", &incident5(), "--kubelet-dir", "/data/kubelet", "holders", "rbd3", "--output", "json"],
        2,
    );
    assert_eq!(
        v["kubelet_paths"][0],
        "/data/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c8381f27-8a0b-11e8-9a3b-fa163e6f1a5c",
        "{v:#}"
    );
    assert_eq!(v["pod_uids"], serde_json::json!([]), "the pod is gone");
    assert!(v["reasons"].to_string().contains("with no pod on this node"), "{v:#}");
    // Without the kubelet directory the device is still judged, just without that evidence.
    let v = agent_json(&["--root", &incident5(), "holders", "rbd3", "--output", "json"], 2);
    assert_eq!(v["kubelet_paths"], serde_json::json!([]));
}

/// A copy of incident 1 (rbd4 mapped, nothing holds it: `stale` with no grace) with one more
/// user process, pid 4242 (`csi-rbdplugin`), in the host's mount namespace: built from PID 1's
/// entries as the kernel lays them out (`stat`, `comm`, `cmdline`, `cgroup`, `ns/mnt`,
/// `task/<tid>/{ns/mnt,mountinfo}`), with an empty `fd/` and `maps`: it holds nothing.
fn incident1_with_a_plugin() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("incident1");
    std::fs::create_dir_all(&root).expect("mkdir");
    copy_tree(&fixtures().join("incident1"), &root);
    let (init, pid) = (root.join("proc/1"), root.join("proc/4242"));
    std::fs::create_dir_all(pid.join("task/4242")).expect("mkdir");
    copy_tree(&init.join("task/1"), &pid.join("task/4242"));
    std::fs::create_dir_all(pid.join("ns")).expect("mkdir");
    copy_tree(&init.join("ns"), &pid.join("ns"));
    let stat = std::fs::read_to_string(init.join("stat")).expect("stat");
    let rest = stat.split_once(") ").expect("stat has a comm").1;
    // ppid 1, pgrp and session its own; flags 0x400100 (a user task).
    let rest = rest.replacen("S 0 1 1 ", "S 1 4242 4242 ", 1);
    std::fs::write(pid.join("stat"), format!("4242 (csi-rbdplugin) {rest}")).expect("stat");
    std::fs::write(pid.join("comm"), "csi-rbdplugin\n").expect("comm");
    std::fs::write(pid.join("cmdline"), b"/usr/local/bin/cephcsi\0--type=rbd\0").expect("cmdline");
    std::fs::write(pid.join("cgroup"), "0::/system.slice/csi.scope\n").expect("cgroup");
    std::fs::create_dir_all(pid.join("fd")).expect("fd");
    std::fs::write(pid.join("maps"), "").expect("maps");
    (dir, root)
}

/// `holders rbd4` and `clean rbd4` (a dry run) on `root`: the verdict document, and clean's exit
/// code and output.
fn rbd4_verdict_and_clean(root: &Path, code: i32) -> (serde_json::Value, Option<i32>, String) {
    let r = root.to_str().expect("utf8");
    let v = agent_json(&["--root", r, "--grace-period", "0", "holders", "rbd4", "--output", "json"], code);
    let journal = root.join("journal.jsonl");
    let out = agent(&[
        "--root",
        r,
        "--grace-period",
        "0",
        "--journal",
        journal.to_str().expect("utf8"),
        "clean",
        "rbd4",
    ]);
    (v, out.status.code(), format!("{}{}", text(&out.stdout), text(&out.stderr)))
}

#[test]
fn an_unreadable_ns_mnt_fd_dir_or_maps_makes_the_candidate_unknown() {
    // Intact, the extra process holds nothing: rbd4 is stale and clean plans the unmap.
    let (_d, root) = incident1_with_a_plugin();
    let (v, code, said) = rbd4_verdict_and_clean(&root, 0);
    assert_eq!(v["verdict"], "stale", "{v:#}");
    assert_eq!(v["blind_spots"], serde_json::json!([]), "{v:#}");
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("unmap rbd k8s/"), "{said}");

    // Each way the kernel (an LSM, a race) can refuse part of a process: the file is replaced by
    // something reading it fails on, never by nothing (a missing file is a process that exited).
    type Break = fn(&Path);
    let breaks: [(&str, Break, &str); 3] = [
        (
            "ns/mnt",
            |p| {
                let link = p.join("task/4242/ns/mnt");
                std::fs::remove_file(&link).expect("rm");
                std::fs::write(&link, "").expect("not a link");
            },
            "pid 4242 (csi-rbdplugin): reading its ns/mnt",
        ),
        (
            "fd/",
            |p| {
                std::fs::remove_dir(p.join("fd")).expect("rm");
                std::fs::write(p.join("fd"), "").expect("not a directory");
            },
            "proc/4242/fd",
        ),
        (
            "maps",
            |p| {
                std::fs::remove_file(p.join("maps")).expect("rm");
                std::fs::create_dir(p.join("maps")).expect("not a file");
            },
            "memory maps of pid 4242",
        ),
    ];
    for (what, break_it, needle) in breaks {
        let (_d, root) = incident1_with_a_plugin();
        break_it(&root.join("proc/4242"));
        let (v, code, said) = rbd4_verdict_and_clean(&root, 3);
        assert_eq!(v["verdict"], "unknown", "unreadable {what}: pid 4242 could hold rbd4: {v:#}");
        let spot = blind_spot(&v, needle);
        assert_eq!(spot.1, "any device", "unreadable {what}: {spot:?}");
        let reasons = v["reasons"].to_string();
        assert!(reasons.contains("blind spot") && reasons.contains("4242"), "unreadable {what}: {reasons}");
        assert_eq!(code, Some(3), "unreadable {what}: clean refuses an unknown device (exit 3): {said}");
        assert!(said.contains("refused: blind spot") && said.contains("4242"), "unreadable {what}: {said}");
        assert!(!said.contains("unmap rbd k8s/"), "unreadable {what}: no unmap step planned: {said}");
    }
}

/// The trees dumped from the guest's real kernel (tests/fixtures/make-guest-fixtures.py): today's
/// scan reads each without a blind spot and sees the kernel's layout (the issue-12 slices add
/// the assertions about their own kinds).
#[test]
fn guest_generated_trees_scan_cleanly_with_the_kernels_layout() {
    for tree in ["iscsi-guest", "nvme-tcp-guest", "dm-stacks"] {
        let scan = scan_fixture(tree);
        assert_eq!(scan["blind_spots"], serde_json::json!([]), "{tree}: {scan:#}");
    }
    // iSCSI: sde was deleted (its session3 has no LUN left); session4 passed its recovery_tmo
    // (sdf transport-offline), session5 did not (sdg blocked).
    let scan = scan_fixture("iscsi-guest");
    for (disk, session, state) in [
        ("sda", "session1", "running"),
        ("sdb", "session1", "running"),
        ("sdc", "session2", "running"),
        ("sdd", "session2", "running"),
        ("sdf", "session4", "transport-offline"),
        ("sdg", "session5", "blocked"),
    ] {
        let d = find_device(&scan, disk);
        assert_eq!(d["scsi"]["transport_name"], session, "{d:#}");
        assert_eq!(d["scsi"]["state"], state, "{d:#}");
        assert_eq!(d["scsi"]["vendor"], "LIO-ORG", "{d:#}");
    }
    let names = scan["devices"].to_string();
    assert!(!names.contains("\"sde\""), "sde was deleted in the guest: {names}");
    // NVMe/TCP with native multipath: the namespace heads are the block devices.
    let scan = scan_fixture("nvme-tcp-guest");
    for head in ["nvme0n1", "nvme2n1"] {
        assert_eq!(find_device(&scan, head)["kind"], "nvme_namespace");
    }
    // dm stacks: LV, LUKS2 and kpartx maps on three multipath maps over iSCSI paths.
    let scan = scan_fixture("dm-stacks");
    for (dm, name, uuid_prefix, slaves) in [
        ("dm-0", "mpatha", "mpath-36001405", vec!["sda", "sdd"]),
        ("dm-3", "vgdata-lvdata", "LVM-", vec!["dm-0"]),
        ("dm-4", "cryptdata", "CRYPT-LUKS2-", vec!["dm-1"]),
        ("dm-5", "mpathc1", "part1-mpath-36001405", vec!["dm-2"]),
        ("dm-6", "mpathc2", "part2-mpath-36001405", vec!["dm-2"]),
    ] {
        let d = find_device(&scan, dm);
        assert_eq!(d["dm"]["name"], name, "{d:#}");
        assert!(d["dm"]["uuid"].as_str().expect("uuid").starts_with(uuid_prefix), "{d:#}");
        let mut got: Vec<&str> =
            d["stacked_below"].as_array().expect("slaves").iter().filter_map(|s| s.as_str()).collect();
        got.sort_unstable();
        assert_eq!(got, slaves, "{d:#}");
    }
}

/// NVMe/TCP as Debian's 6.1 kernel lays it out (nvme-tcp/, dumped from the guest): a controller
/// reconnecting for ever is a candidate whose plan deletes it; a live one is never stale.
#[test]
fn nvme_tcp_controller_reconnecting_is_a_candidate_and_a_live_one_is_never_stale() {
    let scan = scan_fixture("nvme-tcp");
    let dead = find_device(&scan, "nvme0n1");
    assert_eq!(dead["kind"], "nvme_namespace", "{dead:#}");
    assert_eq!(dead["verdict"], "suspect", "{dead:#}");
    let c = &dead["nvme"]["controllers"][0];
    assert_eq!(c["name"], "nvme0");
    assert_eq!(c["state"], "connecting");
    assert_eq!(c["ctrl_loss_tmo"], "off");
    assert_eq!(c["cntlid"], 1);
    assert_eq!(c["address_raw"], "traddr=127.0.0.1,trsvcid=4420");
    assert_eq!(c["namespaces"][0], "nvme0c0n1", "the hidden path sits under its controller");
    assert_eq!(dead["nvme"]["subsystem"], "nvme-subsys0");
    assert_eq!(dead["nvme"]["role"], "head");
    let live = find_device(&scan, "nvme1n1");
    assert_eq!(live["verdict"], "unused", "{live:#}");
    assert_eq!(live["nvme"]["controllers"][0]["src_addr"], "127.0.0.1", "{live:#}");
    // A hidden per-path device has no dev attribute and no node: not a block device of the scan.
    let names: Vec<&str> =
        scan["devices"].as_array().expect("devices").iter().filter_map(|d| d["name"].as_str()).collect();
    assert_eq!(names, vec!["nvme0n1", "nvme1n1"], "{scan:#}");
    let root = fixtures().join("nvme-tcp").to_string_lossy().into_owned();
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "nvme0n1"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{t}{}", text(&out.stderr));
    assert!(
        t.contains("delete NVMe controller nvme0 (tcp traddr=127.0.0.1,trsvcid=4420, subsystem nqn.2026-11.io.blockjanitor:a)"),
        "{t}"
    );
    let out = agent(&["--root", &root, "--grace-period", "0", "clean", "nvme1n1"]);
    let t = text(&out.stdout);
    assert_ne!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("never deleted while any path of its subsystem is live"), "{t}");
}
