//! The rbd incidents (1, 4 and 5) against a real Ceph cluster and Debian's kernel client, and
//! the console's `who-watches` on the cluster's own watcher list (issue 11).

#[path = "support/scenario_documents.rs"]
mod scenario_documents;
// Only `Schema` is used here (the conformance test uses the rest).
#[allow(dead_code)]
#[path = "support/schema.rs"]
mod schema;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use blockjanitor_tests::ceph::{ack, require_ceph, run_ceph_scenario, wait_handshake, Cluster};
use blockjanitor_tests::console::{bin, Console, ConsoleFiles};
use blockjanitor_tests::daemon::Pki;
use blockjanitor_tests::guest::Run;
use blockjanitor_tests::{serial, text};
use scenario_documents::schema_valid;
use serde_json::Value;

/// The port qemu listens on (127.0.0.1 of the cluster's namespace) for the guest agent's 9443.
const AGENT_PORT: u16 = 19443;

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
    schema_valid(&run);
    let h = run.device("holders");
    assert_eq!(h["verdict"], "stale", "{h:#}");
    assert_eq!(h["rbd"]["pool"], "k8s");
    assert_eq!(h["rbd"]["image"], "vol");
    let watcher = format!(
        "watcher={} {}",
        h["rbd"]["client_addr"].as_str().expect("addr"),
        h["rbd"]["client_id"].as_str().expect("id")
    );
    let mapped = host_line(&run, "HOST watchers-mapped:");
    assert!(
        mapped.contains(&watcher),
        "the cluster's watcher is the client the agent reports: {mapped} vs {watcher}"
    );
    let clean = run.section("clean");
    assert!(
        clean.contains("unmap rbd k8s/vol") && clean.contains(" -> done") && clean.contains("rc=0"),
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
    schema_valid(&run);
    let h = run.device("holders");
    let m = &h["holders"][0];
    assert_eq!(m["kind"], "mount", "{h:#}");
    assert_eq!(m["in_host_namespace"], false);
    assert_eq!(m["mount_point"], "/mnt/vol");
    assert!(run.section("release").contains(" -> done"), "{}", run.section("release"));
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
    schema_valid(&run);
    let h = run.device("holders");
    let watcher = format!(
        "watcher={} {}",
        h["rbd"]["client_addr"].as_str().expect("addr"),
        h["rbd"]["client_id"].as_str().expect("id")
    );
    assert!(host_line(&run, "HOST watchers-mapped:").contains(&watcher), "{}", run.output);
    let fenced = run.device("fenced");
    // The blocklist line krbd logged ("" while the client is not fenced).
    assert!(
        fenced["rbd"]["fenced"].as_str().is_some_and(|f| !f.is_empty()),
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
    schema_valid(&run);
    let journal = run.section("journal");
    assert!(
        journal.contains("\"action\":\"detach_mount\"") && journal.contains("\"result\":\"done\""),
        "{journal}"
    );
    assert!(journal.contains("rbd0"), "the released device is the rbd image: {journal}");
}

/// The console, started inside the cluster's namespace.
fn start_console(cluster: &Cluster, args: &[String]) -> Console {
    Console::start_command(cluster.command(&bin("blockjanitor-console")), args, None)
}

/// `rbdN client.N ADDR` lines: (device, client id, address).
fn mappings(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3 && w[0].starts_with("rbd")).then(|| (w[0].into(), w[1].into(), w[2].into()))
        })
        .collect()
}

/// The watcher entry of `who-watches -o json` for `addr`.
fn watcher<'a>(v: &'a Value, addr: &str) -> &'a Value {
    v["watchers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["client_addr"] == addr))
        .unwrap_or_else(|| panic!("no watcher {addr} in the answer:\n{v:#}"))
}

/// (node, device, the device's rbd client address) of each mapping the console names.
fn mapped_on(w: &Value) -> Vec<(String, String, String)> {
    w["mappings"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .map(|m| {
                    (
                        m["node"].as_str().unwrap_or("").to_owned(),
                        m["device"]["name"].as_str().unwrap_or("").to_owned(),
                        m["device"]["rbd"]["client_addr"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 11's Ceph acceptance item, end to end: the guest maps k8s/vol twice (`noshare`: two
/// kernel clients, two watchers) and runs one real agent (node guest-a) with a TLS listener that
/// qemu forwards to 127.0.0.1:19443 of the cluster's namespace; the console (static agent list)
/// and `agentctl fleet who-watches -` run in that namespace, fed the cluster's own `rbd status`.
/// Each watcher is named guest-a and the device of that client; after one unmap, that watcher has
/// no mapping left (unfence safe) and the other still maps its device.
///
/// One guest and one agent: two agents in one guest would both see both devices (not two nodes).
#[test]
fn root_ceph_console_who_watches_names_the_node_and_device() {
    if !require_ceph() {
        return;
    }
    let _serial = serial();
    let t0 = Instant::now();
    let cluster = Cluster::up();
    cluster.image(&["create", "vol", "64"]);
    eprintln!("cluster up and image created in {:.1} s", t0.elapsed().as_secs_f64());

    let top = cluster.dir.path();
    let (extra, share, host) = cluster.guest_dirs();
    let pki = Pki::new("blockjanitor ceph test CA");
    std::fs::create_dir_all(extra.join("tls")).expect("mkdir tls");
    pki.write_server(&extra.join("tls"));
    let files = ConsoleFiles::write(&pki, &host);
    let path = |p: &Path| p.to_str().expect("utf8").to_owned();
    let write_pem = |name: &str| {
        let pem = pki.issue(name, &[name]);
        let (c, k) = (host.join(format!("{name}.crt")), host.join(format!("{name}.key")));
        std::fs::write(&c, pem.cert).expect("write cert");
        std::fs::write(&k, pem.key).expect("write key");
        (c, k)
    };
    let (vcert, vkey) = write_pem("dashboard");

    let out = top.join("guest.out");
    let mut guest = cluster.start_rbd_guest("rbd-console-who-watches.sh", AGENT_PORT, 150);

    let mut console_args = files.args("dashboard");
    console_args.extend(
        [
            "--agents",
            &format!("guest-a=https://127.0.0.1:{AGENT_PORT}"),
            "--call-timeout-ms",
            "5000",
            "--connect-timeout-ms",
            "2000",
            "--backoff-max-seconds",
            "1",
        ]
        .map(String::from),
    );
    let console = start_console(&cluster, &console_args);
    let console_addr = console.tcp.to_string();
    // agentctl, in the namespace, as the viewer `dashboard`; stdin the text given.
    let ctl = |args: &[&str], stdin: &str| -> (i32, String, String) {
        let mut child = cluster
            .command(&bin("agentctl"))
            .arg("fleet")
            .args(args)
            .args(["--console", &console_addr, "--server-name", "localhost", "--timeout", "20"])
            .args(["--cert", &path(&vcert), "--key", &path(&vkey), "--ca", &path(&files.ca)])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("agentctl");
        child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
        let o = child.wait_with_output().expect("agentctl");
        (o.status.code().unwrap_or(-1), text(&o.stdout), text(&o.stderr))
    };
    let schema = schema::Schema::load();
    let who_watches = |status: &str| -> Value {
        let (code, o, e) = ctl(&["who-watches", "-", "-o", "json"], status);
        assert_eq!(code, 0, "who-watches: {e}{o}");
        let v: Value =
            serde_json::from_str(&o).unwrap_or_else(|e| panic!("who-watches output is not JSON ({e}): {o}"));
        schema.check(&v, "fleet_who_watches", "agentctl fleet who-watches -o json");
        v
    };

    // 1. Both mappings, the agent listening.
    let mapped = mappings(&wait_handshake(&share, "mapped", &mut guest, &out, 120));
    eprintln!("guest mapped in {:.1} s: {mapped:?}", t0.elapsed().as_secs_f64());
    assert_eq!(mapped.len(), 2, "{mapped:?}");
    let status = cluster.image(&["status", "vol"]);
    for (_, id, addr) in &mapped {
        let line = format!("watcher={addr} {id} cookie=");
        assert_eq!(status.matches(&line).count(), 1, "the cluster lists {line}..., once:\n{status}");
    }
    assert_eq!(status.matches("watcher=").count(), 2, "two watchers, one per client:\n{status}");

    // The console has synced the guest's agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, o, e) = ctl(&["nodes", "-o", "json"], "");
        let v: Value = serde_json::from_str(&o).unwrap_or(Value::Null);
        if code == 0 && v["nodes"][0]["name"] == "guest-a" && v["nodes"][0]["reachable"] == true {
            schema.check(&v, "fleet_nodes", "agentctl fleet nodes -o json");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console did not reach guest-a: {e}{o}\n{}",
            console.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let v = who_watches(&status);
    assert_eq!(v["watchers"].as_array().map(Vec::len), Some(2), "{v:#}");
    assert!(v["missing_nodes"].as_array().expect("missing_nodes").is_empty(), "{v:#}");
    for (dev, id, addr) in &mapped {
        let w = watcher(&v, addr);
        assert_eq!(w["client_id"], id.as_str(), "{v:#}");
        assert_eq!(
            mapped_on(w),
            vec![("guest-a".to_owned(), dev.clone(), addr.clone())],
            "watcher {addr} is {dev} on guest-a, and only that:\n{v:#}"
        );
        assert_eq!(w["unfence_safe"], false, "{v:#}");
        eprintln!("  {} {id} -> {:?}", addr, mapped_on(w));
    }
    eprintln!("who-watches while mapped: ok at {:.1} s", t0.elapsed().as_secs_f64());
    ack(&share, "mapped", "ok");

    // 2. The guest unmaps the second mapping; its watcher goes, the first stays.
    let gone = wait_handshake(&share, "unmapped", &mut guest, &out, 60).trim().to_owned();
    let (kept, lost) = (&mapped[0], &mapped[1]);
    assert_eq!(gone, lost.0, "the guest unmapped the second mapping");
    let after = cluster.image(&["status", "vol"]);
    assert!(after.contains(&format!("watcher={} {}", kept.2, kept.1)), "{after}");
    assert!(!after.contains(&lost.2), "the unmapped client no longer watches:\n{after}");
    // Asked with the list from before (what an operator pasted while both were mapped), the
    // console must learn of the unmap from the agent's events.
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        let v = who_watches(&status);
        if watcher(&v, &lost.2)["mappings"].as_array().expect("mappings").is_empty() {
            break v;
        }
        assert!(Instant::now() < deadline, "the console still maps {} after 30 s:\n{v:#}", lost.0);
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("who-watches saw the unmap at {:.1} s", t0.elapsed().as_secs_f64());
    let w = watcher(&v, &lost.2);
    assert_eq!(w["unfence_safe"], true, "no node maps {} any more:\n{v:#}", lost.2);
    let w = watcher(&v, &kept.2);
    assert_eq!(mapped_on(w), vec![("guest-a".to_owned(), kept.0.clone(), kept.2.clone())], "{v:#}");
    assert_eq!(w["unfence_safe"], false, "{v:#}");
    // And with the cluster's list of now: one watcher, still guest-a's.
    let v = who_watches(&after);
    assert_eq!(v["watchers"].as_array().map(Vec::len), Some(1), "{v:#}");
    assert_eq!(mapped_on(watcher(&v, &kept.2)).len(), 1, "{v:#}");
    ack(&share, "unmapped", "ok");

    let deadline = Instant::now() + Duration::from_secs(60);
    let code = loop {
        if let Some(s) = guest.0.try_wait().expect("wait guest") {
            break s.code();
        }
        assert!(Instant::now() < deadline, "the guest did not finish");
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = std::fs::read_to_string(&out).unwrap_or_default();
    assert_eq!(
        code,
        Some(0),
        "guest scenario failed:\n{output}\n--- harness ---\n{}",
        std::fs::read_to_string(top.join("guest.err")).unwrap_or_default()
    );
    assert!(output.contains("OK"), "{output}");
    assert_eq!(cluster.image(&["watchers", "vol"]).trim(), "", "no watcher at the end");
    eprintln!("done in {:.1} s", t0.elapsed().as_secs_f64());
}
