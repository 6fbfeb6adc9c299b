//! The agent's readiness follows what it needs to do its job (`daemon::health`): the agent
//! service's health (the DaemonSet's readiness probe) is NOT_SERVING, `GetNode` says why and
//! `blockjanitor_not_ready{check}` is 1 while the journal cannot be written (a tmpfs remounted
//! read-only under the running daemon) or, in release mode, the Kubernetes API's view does not
//! vouch (the stand-in API server's pods watch stalled); all three come back once the cause is
//! gone. The server's own health (the liveness probe's) stays SERVING throughout.

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{reporting_daemon, unix_client, Daemon};
use blockjanitor_tests::http::http_get;
use blockjanitor_tests::{require_real_kernel, rt, serial, sh, HostMount, Scratch};
use tonic_health::pb::health_check_response::ServingStatus;

fn not_ready_because(rt: &tokio::runtime::Runtime, d: &Daemon) -> Vec<String> {
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner().not_ready_because
    })
}

/// The `not_ready` series of the daemon's metrics listener, as `check=value` pairs.
fn not_ready_metric(d: &Daemon) -> Vec<String> {
    let addr = d.metrics.expect("the daemon serves metrics");
    let body = http_get(addr, "/metrics");
    body.lines()
        .filter_map(|l| l.strip_prefix("blockjanitor_not_ready{check=\""))
        .map(|l| l.replacen("\"} ", "=", 1))
        .collect()
}

#[test]
fn root_health_is_not_serving_while_the_journal_cannot_be_written() {
    if !require_real_kernel(&["mount"]) {
        return;
    }
    let rt = rt();
    let s = Scratch::new();
    let state = s.path("state");
    std::fs::create_dir(&state).expect("mkdir");
    let fs = HostMount::new("tmpfs", &state, &["-t", "tmpfs", "-o", "size=8m"]);
    let d = Daemon::start(&state, &["--rescan-interval", "1", "--metrics-listen", "127.0.0.1:0"]);
    d.wait_health(&rt, ServingStatus::Serving);
    assert!(not_ready_because(&rt, &d).is_empty());
    assert!(not_ready_metric(&d).contains(&"journal=0".to_owned()), "{:?}", not_ready_metric(&d));

    sh("mount", &["-o", "remount,ro", fs.target.to_str().expect("utf8")]);
    d.wait_health(&rt, ServingStatus::NotServing);
    let why = not_ready_because(&rt, &d);
    assert!(
        why.iter().any(|w| w.starts_with("the journal cannot be written: ") && w.contains("journal.jsonl")),
        "GetNode names the journal: {why:?}"
    );
    assert!(not_ready_metric(&d).contains(&"journal=1".to_owned()), "{:?}", not_ready_metric(&d));
    assert!(d.log_text().contains("NOT_SERVING until every check passes"), "{}", d.log_text());

    sh("mount", &["-o", "remount,rw", fs.target.to_str().expect("utf8")]);
    d.wait_health(&rt, ServingStatus::Serving);
    assert!(not_ready_because(&rt, &d).is_empty());
    assert!(not_ready_metric(&d).contains(&"journal=0".to_owned()), "{:?}", not_ready_metric(&d));
    drop(d);
    drop(fs);
}

#[test]
fn root_health_in_release_mode_follows_the_kubernetes_api() {
    if !require_real_kernel(&[]) {
        return;
    }
    let _serial = serial();
    let rt = rt();
    let s = Scratch::new();
    let kubelet = s.path("kubelet");
    std::fs::create_dir(&kubelet).expect("mkdir");
    let (server, d) = reporting_daemon(
        &s,
        &rt,
        &[
            "--rescan-interval",
            "1",
            "--kube-silence-bound-seconds",
            "3",
            "--mode",
            "release",
            "--kubelet-dir",
            kubelet.to_str().expect("utf8"),
        ],
    );
    d.wait_health(&rt, ServingStatus::Serving);
    server.stall("/api/v1/pods", true);
    d.wait_health(&rt, ServingStatus::NotServing);
    let why = not_ready_because(&rt, &d);
    assert!(
        why.iter().any(|w| w.starts_with("the Kubernetes API cannot vouch: ")
            && w.contains("pods watch")
            && w.contains("release mode")),
        "GetNode names the silent watch: {why:?}"
    );
    server.stall("/api/v1/pods", false);
    d.wait_health(&rt, ServingStatus::Serving);
    assert!(not_ready_because(&rt, &d).is_empty());
    drop(d);
    drop(rt);
}
