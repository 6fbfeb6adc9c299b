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

/// GetNode's `kubernetes` field and `not_ready_because`.
fn node(rt: &tokio::runtime::Runtime, d: &Daemon) -> pb::Node {
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner()
    })
}

/// Issue 34, item 1: an API that does not answer is not "not configured". `serve --mode clean`
/// (grace 0, a rescan a second) beside a loop device nothing holds, with a Kubernetes source that
/// cannot be used: a kubeconfig that does not exist, one whose server does not answer (a loopback
/// port nothing listens on), and no source at all. Each time the agent service is NOT_SERVING
/// naming the API, GetNode says `cannot vouch` with the reason (never "not configured"), and the
/// device stays bound through several scans. (With `--no-kubernetes`, the operator's word, the
/// same scene is cleaned: `daemon.rs`'s `root_clean_mode_detaches_stale_loop_devices_...`.)
#[test]
fn root_clean_mode_with_an_api_that_does_not_answer_acts_on_nothing() {
    use blockjanitor_tests::LoopDev;
    if !require_real_kernel(&["losetup"]) {
        return;
    }
    let _serial = serial();
    let rt = rt();
    let s = Scratch::new();
    let kubelet = s.path("kubelet");
    std::fs::create_dir(&kubelet).expect("mkdir");
    let nowhere = s.path("nowhere.kubeconfig");
    std::fs::write(
        &nowhere,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
         contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
         users:\n- name: u\n  user:\n    token: not-a-token\n",
    )
    .expect("kubeconfig");
    let missing = s.path("missing.kubeconfig");
    let cases: [(&str, Vec<&str>, &str); 3] = [
        (
            "a kubeconfig that does not exist",
            vec!["--kubeconfig", missing.to_str().expect("utf8")],
            "missing.kubeconfig",
        ),
        (
            "a kubeconfig whose server does not answer",
            vec!["--kubeconfig", nowhere.to_str().expect("utf8")],
            "watch",
        ),
        ("no source at all", vec!["--config", "/dev/null"], "no Kubernetes API configured"),
    ];
    let img = s.sparse_file("free.img", 16);
    let lo = LoopDev::attach(&img);
    for (i, (what, api, reason)) in cases.into_iter().enumerate() {
        let dir = s.path(&format!("case-{i}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let mut args = vec!["--mode", "clean", "--grace-period", "0", "--rescan-interval", "1"];
        args.extend(["--kubelet-dir", kubelet.to_str().expect("utf8")]);
        args.extend(api.iter().copied());
        let d = Daemon::start(&dir, &args);
        d.wait_health(&rt, ServingStatus::NotServing);
        let scans = node(&rt, &d).scans;
        assert!(
            blockjanitor_tests::wait_until(std::time::Duration::from_secs(20), || node(&rt, &d).scans
                >= scans + 3),
            "{what}: the daemon stopped scanning:\n{}",
            d.log_text()
        );
        let n = node(&rt, &d);
        assert!(lo.is_bound(), "{what}: clean mode acted with no word from the API:\n{}", d.log_text());
        assert!(n.kubernetes.starts_with("cannot vouch: ") && n.kubernetes.contains(reason), "{what}: {n:?}");
        assert!(
            n.not_ready_because
                .iter()
                .any(|w| w.starts_with("the Kubernetes API cannot vouch: ") && w.contains("clean mode")),
            "{what}: {n:?}"
        );
        assert!(!d.log_text().contains("not configured"), "{what}: {}", d.log_text());
    }
}
