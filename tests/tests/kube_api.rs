//! The Kubernetes API client against a local HTTP server on 127.0.0.1 that answers as
//! kube-apiserver does (a real one cannot run here): lists with resource versions, chunked watch
//! streams that close after a while and resume from the last resource version, Node lookups,
//! Event creation and Node status patches. Every request is recorded for the assertions.
//!
//! The view's warrant ([`ClusterView::vouch`]) is tested against the real `spawn_watch` and that
//! server made to fail: a watch cut off mid-stream or answered with HTTP 500, lists failing, a
//! node name with no Node, a server gone silent.

use std::time::Duration;

use blockjanitor::host::clock::BootTime;
use blockjanitor::kube::error::KubeError;
use blockjanitor::kube::{
    connect, spawn_watch, ClusterView, Delivery, EventReason, KubeConfig, Reporter, WatchHealth, WatchOptions,
};
use blockjanitor_tests::kube_mock::*;
use hyper::Method;
use serde_json::json;
use tokio::sync::watch;

const PODS: &str = "/api/v1/pods";
const VAS: &str = "/apis/storage.k8s.io/v1/volumeattachments";

fn cfg(url: &str) -> KubeConfig {
    KubeConfig { url: Some(url.to_string()), kubeconfig: None, node_name: NODE.to_string() }
}

/// Short intervals: a Node lookup every 200 ms, silence bound 1 s, relists 100-400 ms apart.
fn fast() -> WatchOptions {
    WatchOptions {
        probe_interval: Duration::from_millis(200),
        silence_bound: Duration::from_secs(1),
        backoff_initial: Duration::from_millis(100),
        backoff_max: Duration::from_millis(400),
    }
}

/// Whether the view vouches right now.
fn vouches(v: &ClusterView) -> bool {
    v.vouch(BootTime::now()).is_ok()
}

/// The requests for `collection` from the `from`th request on.
fn requests_for(server: &ApiServer, collection: &str, from: usize) -> Vec<Recorded> {
    server.requests().into_iter().skip(from).filter(|r| r.path == collection).collect()
}

/// The error of a connect that must fail (a `Client` has no `Debug` for `expect_err`).
fn connect_err(r: Result<kube::Client, KubeError>) -> KubeError {
    match r {
        Ok(_) => panic!("connect succeeded"),
        Err(e) => e,
    }
}

/// Waits (bounded) until the view satisfies `pred`, returning it.
async fn wait_for(
    rx: &mut watch::Receiver<ClusterView>,
    what: &str,
    pred: impl Fn(&ClusterView) -> bool,
) -> ClusterView {
    let waited = tokio::time::timeout(WAIT, rx.wait_for(|v| pred(v))).await.map(|r| r.map(|v| v.clone()));
    match waited {
        Ok(Ok(v)) => v,
        Ok(Err(_)) => panic!("watcher ended while waiting for {what}"),
        Err(_) => panic!("timed out waiting for {what}; view: {:#?}", *rx.borrow()),
    }
}

/// Every PV and VolumeAttachment of a large cluster is listed in pages at the most recent
/// version (the API server pages only those; from its watch cache a list of 50,000 is one answer,
/// decoded whole, past the agent's 128 MiB): this node's volume, behind more than two pages of
/// other nodes' volumes, is found; this node's pods are still listed from the watch cache.
#[tokio::test]
async fn whole_collections_are_listed_in_pages_and_this_nodes_pods_from_the_watch_cache() {
    const OTHERS: usize = 1_100;
    let server = ApiServer::start(node_object(ready_only())).await;
    {
        let mut st = server.state.lock().expect("state");
        for (collection, other) in [
            (
                "/api/v1/persistentvolumes",
                (|i| pv(&format!("pvc-other-{i}"), "logs", "x", "csi-x")) as fn(usize) -> _,
            ),
            (VAS, |i| {
                volume_attachment(&format!("csi-other-{i}"), "node-b", &format!("pvc-other-{i}"), true, 9)
            }),
        ] {
            let list = st.lists.get_mut(collection).expect(collection);
            let theirs: Vec<_> = (0..OTHERS).map(other).collect();
            list.splice(0..0, theirs);
        }
    }
    let client = connect(&cfg(&server.url())).await.expect("connect");
    let (mut rx, handle) = spawn_watch(client, NODE, WatchOptions::default());
    let view = wait_for(&mut rx, "initial sync", |v| v.synced).await;
    assert!(view.pv_attached_to_node(PV), "this node's attachment, on the last page: {view:#?}");
    for collection in ["/api/v1/persistentvolumes", VAS] {
        let lists: Vec<Recorded> =
            requests_for(&server, collection, 0).into_iter().filter(|r| !r.is_watch()).collect();
        assert_eq!(lists.len(), 3, "{collection}: {} objects in pages of 500: {lists:#?}", OTHERS + 2);
        for r in &lists {
            assert_eq!(r.query.get("limit").map(String::as_str), Some("500"), "{collection}: {r:?}");
            assert_eq!(r.query.get("resourceVersion"), None, "{collection}: the most recent version: {r:?}");
        }
        assert_eq!(lists[1].query.get("continue").map(String::as_str), Some("500"), "{lists:#?}");
    }
    let pods = requests_for(&server, PODS, 0);
    let pod_list = pods.iter().find(|r| !r.is_watch()).expect("pod list");
    assert_eq!(pod_list.query.get("resourceVersion").map(String::as_str), Some("0"), "{pod_list:?}");
    assert_eq!(pod_list.query.get("limit"), None, "{pod_list:?}");
    handle.abort();
}

#[tokio::test]
async fn view_syncs_and_follows_watch_events() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    let (mut rx, handle) = spawn_watch(client, NODE, WatchOptions::default());
    assert!(!rx.borrow().synced, "nothing listed yet");
    assert_eq!(rx.borrow().vouch(BootTime::now()), Err("the pods watch is not synced yet".to_string()));

    let view = wait_for(&mut rx, "initial sync", |v| v.synced).await;
    assert_eq!(view.node_name, NODE);
    assert_eq!(view.last_error, None);
    let view = wait_for(&mut rx, "the Node looked up", |v| v.node_found.is_some()).await;
    assert_eq!(view.node_found, Some(true));
    assert_eq!(view.vouch(BootTime::now()), Ok(()));
    let lookup = server
        .requests()
        .into_iter()
        .find(|r| r.method == Method::GET && r.path == "/api/v1/nodes/node-a")
        .expect("node lookup");
    assert!(lookup.accept.contains("as=PartialObjectMetadata"), "metadata only: {lookup:?}");
    let names: Vec<&str> = view.pods_on_node.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["batch-7", "web-0"]);
    let web = view.pods_on_node.iter().find(|p| p.name == "web-0").expect("web-0");
    assert_eq!(
        (web.uid.as_str(), web.namespace.as_str(), web.phase.as_str()),
        ("uid-web-0", "shop", "Running")
    );
    assert_eq!(web.pvc_names, ["data"]);
    assert_eq!(web.pv_names, [PV]);

    assert_eq!(view.pvs.len(), 2);
    let bound = view.pv(PV).expect("pv");
    assert_eq!(bound.claim, Some(("shop".to_string(), "data".to_string())));
    let csi = bound.csi.as_ref().expect("csi source");
    assert_eq!(csi.driver, "rbd.csi.ceph.com");
    assert_eq!(csi.volume_handle, "0001-0009-rook-ceph-0000000000000002-csi-vol-5f3c");
    assert_eq!(view.pv_for_rbd("replicapool", "csi-vol-5f3c").map(|p| p.name.as_str()), Some(PV));

    // Only this node's attachment is kept.
    assert_eq!(view.volume_attachments.len(), 1);
    let va = &view.volume_attachments[0];
    assert_eq!((va.name.as_str(), va.attacher.as_str(), va.node.as_str()), (VA, "rbd.csi.ceph.com", NODE));
    assert_eq!(va.pv.as_deref(), Some(PV));
    assert!(va.attached);
    assert!(view.pv_attached_to_node(PV));
    assert!(!view.pv_attached_to_node(OTHER_PV), "attached to node-b, not here");
    assert!(!view.pv_attached_to_node("pvc-unknown"));

    // The finished pod's claim does not count; the running one does.
    let users: Vec<&str> = view.running_pods_using_pv(PV).iter().map(|p| p.name.as_str()).collect();
    assert_eq!(users, ["web-0"]);
    assert!(view.running_pods_using_pv(OTHER_PV).is_empty());

    // Pods were listed with this node's field selector, from the watch cache.
    let reqs = server.requests();
    let pod_list = reqs.iter().find(|r| r.path == "/api/v1/pods" && !r.is_watch()).expect("pod list");
    assert_eq!(pod_list.query.get("fieldSelector").map(String::as_str), Some("spec.nodeName=node-a"));
    assert_eq!(pod_list.query.get("resourceVersion").map(String::as_str), Some("0"));

    // Watch events: the attachment is detached, another node's attachment comes and goes
    // unseen, the pod is deleted.
    server.publish(
        "/apis/storage.k8s.io/v1/volumeattachments",
        "MODIFIED",
        volume_attachment(VA, NODE, PV, false, 0),
    );
    let view = wait_for(&mut rx, "VA detached", |v| !v.pv_attached_to_node(PV)).await;
    assert_eq!(view.volume_attachments.len(), 1);
    assert!(!view.volume_attachments[0].attached);
    server.publish(
        "/apis/storage.k8s.io/v1/volumeattachments",
        "ADDED",
        volume_attachment("csi-elsewhere", "node-c", OTHER_PV, true, 0),
    );
    server.publish("/api/v1/pods", "DELETED", pod("web-0", "Running", "data"));
    let view = wait_for(&mut rx, "pod deleted", |v| v.pods_on_node.iter().all(|p| p.name != "web-0")).await;
    assert!(view.running_pods_using_pv(PV).is_empty());
    assert_eq!(view.volume_attachments.len(), 1, "node-c's attachment is not kept");
    assert!(view.synced);

    // After the server ends a watch, the watcher resumes from the last resource version it saw
    // (no relist), and events published meanwhile still arrive.
    tokio::time::sleep(WATCH_HOLD + Duration::from_millis(500)).await;
    server.publish("/api/v1/persistentvolumes", "DELETED", pv(OTHER_PV, "logs", "ingest", "csi-vol-9d21"));
    let view = wait_for(&mut rx, "PV deleted", |v| v.pv(OTHER_PV).is_none()).await;
    assert_eq!(view.pvs.len(), 1);
    let reqs = server.requests();
    let pod_watches: Vec<&Recorded> =
        reqs.iter().filter(|r| r.path == "/api/v1/pods" && r.is_watch()).collect();
    assert!(pod_watches.len() >= 2, "the pod watch was resumed: {pod_watches:#?}");
    let last = pod_watches.last().expect("watch");
    assert!(
        last.query.get("resourceVersion").and_then(|v| v.parse::<u64>().ok()).is_some_and(|rv| rv > 100),
        "resumed from the deletion's resource version: {last:?}"
    );
    assert_eq!(last.query.get("fieldSelector").map(String::as_str), Some("spec.nodeName=node-a"));
    let lists = reqs.iter().filter(|r| r.path == "/api/v1/pods" && !r.is_watch()).count();
    assert_eq!(lists, 1, "a closed watch is resumed, not relisted");
    handle.abort();
}

#[tokio::test]
async fn events_are_posted_on_the_node_once_per_window() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let reporter = Reporter::new(connect(&cfg(&server.url())).await.expect("connect"), NODE);
    let stale = "no holder and no pod uses PV pvc-0a5e6f1c for 10m";
    let first = reporter.event(EventReason::StaleBlockDevice, "/dev/rbd0", stale);
    assert_eq!(tokio::time::timeout(WAIT, first).await.expect("in time").expect("posted"), Delivery::Sent);
    let again = reporter.event(EventReason::StaleBlockDevice, "/dev/rbd0", stale);
    assert_eq!(tokio::time::timeout(WAIT, again).await.expect("in time").expect("ok"), Delivery::Suppressed);
    let cleaned =
        reporter.event(EventReason::BlockDeviceCleaned, "/dev/rbd0", "unmapped replicapool/csi-vol-5f3c");
    assert_eq!(tokio::time::timeout(WAIT, cleaned).await.expect("in time").expect("posted"), Delivery::Sent);

    let posts: Vec<Recorded> = server
        .requests()
        .into_iter()
        .filter(|r| r.method == Method::POST && r.path == "/api/v1/namespaces/default/events")
        .collect();
    assert_eq!(posts.len(), 2, "the duplicate was not posted: {posts:#?}");
    let ev = &posts[0].body;
    assert_eq!(ev["involvedObject"]["kind"], "Node");
    assert_eq!(ev["involvedObject"]["name"], NODE);
    assert_eq!(ev["involvedObject"]["apiVersion"], "v1");
    assert_eq!(ev["metadata"]["namespace"], "default");
    assert!(ev["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("node-a.")), "{ev}");
    assert_eq!(ev["reason"], "StaleBlockDevice");
    assert_eq!(ev["type"], "Warning");
    assert_eq!(ev["message"], format!("/dev/rbd0: {stale}"));
    assert_eq!(ev["source"]["component"], "blockjanitor");
    assert_eq!(ev["source"]["host"], NODE);
    assert_eq!(ev["count"], 1);
    assert!(ev["firstTimestamp"].is_string() && ev["lastTimestamp"].is_string(), "{ev}");
    let ev = &posts[1].body;
    assert_eq!((ev["reason"].as_str(), ev["type"].as_str()), (Some("BlockDeviceCleaned"), Some("Normal")));
    assert_eq!(ev["message"], "/dev/rbd0: unmapped replicapool/csi-vol-5f3c");
    assert_ne!(posts[0].body["metadata"]["name"], posts[1].body["metadata"]["name"]);
}

#[tokio::test]
async fn node_condition_true_then_false() {
    // The node already carries the condition, True since a restart ago.
    let mut conditions = ready_only();
    conditions.as_array_mut().expect("array").push(json!({
        "type": "StaleBlockDevices", "status": "True", "reason": "StaleBlockDevicesFound",
        "message": "stale block devices: /dev/rbd0", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
        "lastTransitionTime": "2020-01-01T00:00:00Z"}));
    let server = ApiServer::start(node_object(conditions)).await;
    let reporter = Reporter::new(connect(&cfg(&server.url())).await.expect("connect"), NODE);

    let devices = ["/dev/rbd0".to_string(), "/dev/loop3".to_string()];
    tokio::time::timeout(WAIT, reporter.set_condition(&devices)).await.expect("in time").expect("patched");
    tokio::time::timeout(WAIT, reporter.set_condition(&[])).await.expect("in time").expect("patched");

    let reqs = server.requests();
    let patches: Vec<&Recorded> = reqs.iter().filter(|r| r.method == Method::PATCH).collect();
    assert_eq!(patches.len(), 2);
    let gets =
        reqs.iter().filter(|r| r.method == Method::GET && r.path.starts_with("/api/v1/nodes/")).count();
    assert_eq!(gets, 1, "the node is read once, for the transition time before this process");
    for p in &patches {
        assert_eq!(p.path, "/api/v1/nodes/node-a/status");
        assert_eq!(p.content_type, "application/strategic-merge-patch+json");
        let conds = p.body["status"]["conditions"].as_array().expect("conditions");
        assert_eq!(conds.len(), 1, "only our condition is sent: {}", p.body);
    }
    let t = &patches[0].body["status"]["conditions"][0];
    assert_eq!(t["type"], "StaleBlockDevices");
    assert_eq!(t["status"], "True");
    assert_eq!(t["reason"], "StaleBlockDevicesFound");
    assert_eq!(t["message"], "stale block devices: /dev/rbd0, /dev/loop3");
    assert_eq!(t["lastTransitionTime"], "2020-01-01T00:00:00Z", "still True: the transition time is kept");
    assert!(t["lastHeartbeatTime"].as_str().is_some_and(|h| h > "2026"), "{t}");

    let f = &patches[1].body["status"]["conditions"][0];
    assert_eq!(f["type"], "StaleBlockDevices");
    assert_eq!(f["status"], "False");
    assert_eq!(f["reason"], "NoStaleBlockDevices");
    assert_eq!(f["message"], "no stale block devices");
    assert_ne!(f["lastTransitionTime"], "2020-01-01T00:00:00Z", "flipped: a new transition time");
    assert_eq!(f["lastTransitionTime"], f["lastHeartbeatTime"]);
}

#[tokio::test]
async fn unreachable_api_is_an_error_not_a_panic() {
    // A port that was just free: connections are refused.
    let addr = {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr")
    };
    let client = connect(&cfg(&format!("http://{addr}"))).await.expect("no I/O in connect");
    let (mut rx, handle) = spawn_watch(client.clone(), NODE, WatchOptions::default());
    // The Node lookup fails too; a watch's error is the one shown once there is one.
    let view = wait_for(&mut rx, "a watch error", |v| v.watches.iter().any(|w| w.error.is_some())).await;
    assert!(!view.synced);
    assert_eq!(view.node_found, None);
    assert_eq!(view.last_contact, None);
    let why = view.vouch(BootTime::now()).expect_err("an unreachable API vouches for nothing");
    assert!(why.contains(" watch broke (") && why.ends_with("): relisting"), "{why}");
    assert!(view.pods_on_node.is_empty() && view.pvs.is_empty() && view.volume_attachments.is_empty());
    let err = view.last_error.expect("error");
    assert!(
        ["pods: ", "volumeattachments: ", "persistentvolumes: "].iter().any(|k| err.starts_with(k)),
        "{err}"
    );
    assert!(!handle.is_finished(), "the watcher keeps retrying with backoff");
    handle.abort();

    let reporter = Reporter::new(client, NODE);
    for _ in 0..2 {
        // A failed post is not remembered: the second call tries again instead of being suppressed.
        let r = tokio::time::timeout(WAIT, reporter.event(EventReason::CleanupFailed, "/dev/nbd2", "EBUSY"))
            .await;
        let err = r.expect("in time").expect_err("refused");
        assert!(matches!(err, KubeError::Api { .. }), "{err:?}");
        assert!(
            err.to_string().contains("create Event CleanupFailed on Node node-a (/dev/nbd2: EBUSY)"),
            "{err}"
        );
    }
    let r = tokio::time::timeout(WAIT, reporter.set_condition(&["/dev/nbd2".to_string()])).await;
    let err = r.expect("in time").expect_err("refused");
    assert!(err.to_string().contains("patch condition StaleBlockDevices=True on node node-a"), "{err}");
}

#[tokio::test]
async fn connect_sources_and_their_errors() {
    let no_node = KubeConfig { url: Some("http://127.0.0.1:1".into()), ..Default::default() };
    assert!(matches!(connect(&no_node).await, Err(KubeError::NoNodeName)));

    let bad_url = cfg("http://[not a url");
    let err = connect_err(connect(&bad_url).await);
    assert!(matches!(err, KubeError::Url { .. }) && err.to_string().contains("[not a url"), "{err}");

    let missing = KubeConfig {
        kubeconfig: Some("/nonexistent/blockjanitor/kubeconfig".into()),
        node_name: NODE.into(),
        ..Default::default()
    };
    let err = connect_err(connect(&missing).await);
    assert!(err.to_string().contains("/nonexistent/blockjanitor/kubeconfig"), "{err}");

    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_none() {
        let none = KubeConfig { node_name: NODE.into(), ..Default::default() };
        let err = connect_err(connect(&none).await);
        assert!(matches!(err, KubeError::NotConfigured { .. }), "{err:?}");
    }

    // A kubeconfig naming the local server works like the URL, and sends its token.
    let server = ApiServer::start(node_object(ready_only())).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let from_file = write_kubeconfig(dir.path(), &server.url(), None);
    post_one_event(&from_file, &server).await;
}

#[tokio::test]
async fn tls_with_the_kubeconfig_ca() {
    // rustls with the ring provider (no OpenSSL, no aws-lc), the CA from the kubeconfig, the
    // server certificate for 127.0.0.1.
    let pki = blockjanitor_tests::daemon::Pki::new("kube test CA");
    let server = ApiServer::start_tls(node_object(ready_only()), &pki.server.cert, &pki.server.key).await;
    assert!(server.url().starts_with("https://127.0.0.1:"));
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &pki.ca.cert).expect("write ca");
    post_one_event(&write_kubeconfig(dir.path(), &server.url(), Some(&ca)), &server).await;

    // A CA that did not sign the server's certificate: refused.
    let rogue = blockjanitor_tests::daemon::Pki::new("rogue CA");
    let rogue_ca = dir.path().join("rogue.crt");
    std::fs::write(&rogue_ca, &rogue.ca.cert).expect("write rogue ca");
    let other = tempfile::tempdir().expect("tempdir");
    let client =
        connect(&write_kubeconfig(other.path(), &server.url(), Some(&rogue_ca))).await.expect("connect");
    let reporter = Reporter::new(client, NODE);
    let r = tokio::time::timeout(WAIT, reporter.event(EventReason::CleanupFailed, "/dev/rbd1", "x")).await;
    let err = r.expect("in time").expect_err("untrusted server");
    assert!(matches!(err, KubeError::Api { .. }), "{err:?}");
}

/// A kubeconfig for `server` with a bearer token and, for https, a CA file.
fn write_kubeconfig(dir: &std::path::Path, server: &str, ca: Option<&std::path::Path>) -> KubeConfig {
    let ca = ca.map(|p| format!("    certificate-authority: {}\n", p.display())).unwrap_or_default();
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n{ca}\
         users:\n- name: agent\n  user:\n    token: not-a-real-token\n\
         contexts:\n- name: local\n  context:\n    cluster: local\n    user: agent\n\
         current-context: local\n"
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, kubeconfig).expect("write kubeconfig");
    KubeConfig { kubeconfig: Some(path), node_name: NODE.into(), ..Default::default() }
}

/// Connects with `cfg` and posts one Event, which `server` must receive with the token.
async fn post_one_event(cfg: &KubeConfig, server: &ApiServer) {
    let reporter = Reporter::new(connect(cfg).await.expect("connect from kubeconfig"), NODE);
    let sent = tokio::time::timeout(
        WAIT,
        reporter.event(EventReason::BlockDeviceReleased, "/dev/loop3", "detached"),
    )
    .await
    .expect("in time")
    .expect("posted");
    assert_eq!(sent, Delivery::Sent);
    let reqs = server.requests();
    let post = reqs.iter().find(|r| r.method == Method::POST).expect("event posted");
    assert_eq!(post.body["reason"], "BlockDeviceReleased");
    assert_eq!(post.authorization, "Bearer not-a-real-token");
}

#[tokio::test]
async fn a_watch_cut_off_mid_stream_stops_vouching_until_it_has_relisted() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    let (mut rx, handle) = spawn_watch(client, NODE, fast());
    wait_for(&mut rx, "vouching", vouches).await;

    // The pod watch's connection drops mid-stream and the API server behind it is failing:
    // resuming the watch is answered with HTTP 500, and so are lists. (A cut that resumes fine
    // loses nothing: the watch goes on from its resource version, or the API answers 410 Gone.)
    server.fail_lists(PODS, true);
    server.fail_watches(PODS, true);
    let cut_at = server.requests().len();
    server.cut_watches(PODS);
    let view = wait_for(&mut rx, "the pods table unsynced", |v| !v.synced).await;
    let why = view.vouch(BootTime::now()).expect_err("a broken watch cannot vouch");
    assert!(why.starts_with("the pods watch broke (") && why.ends_with("): relisting"), "{why}");
    assert!(why.contains("etcdserver: request timed out"), "the API's own message: {why}");
    assert!(view.last_error.as_deref().is_some_and(|e| e.starts_with("pods: ")), "{view:#?}");
    let health: Vec<(&str, bool)> = view.watches.iter().map(|w| (w.resource, w.synced)).collect();
    assert_eq!(health, [("pods", false), ("volumeattachments", true), ("persistentvolumes", true)]);
    assert_eq!(view.pods_on_node.len(), 2, "the pods stay as last seen, for operators");

    // Watches would work again, lists still fail, and a new pod comes to this node. It is not
    // seen and the table does not sync again without a relist; kube's own backoff would resume
    // the watch from its resource version, take the event and go on vouching.
    server.fail_watches(PODS, false);
    server.publish(PODS, "ADDED", pod("web-1", "Running", "data"));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let view = rx.borrow().clone();
    assert!(!view.synced);
    assert!(view.pods_on_node.iter().all(|p| p.name != "web-1"), "{view:#?}");
    let why = view.vouch(BootTime::now()).expect_err("still broken");
    assert!(why.starts_with("the pods watch broke (failed to perform initial object list: "), "{why}");
    let since = requests_for(&server, PODS, cut_at);
    let watches: Vec<usize> = (0..since.len()).filter(|&i| since[i].is_watch()).collect();
    assert_eq!(watches, [0], "one resumption (answered 500), then relists only: {since:#?}");
    assert!(since.len() >= 3, "relists retried with backoff: {since:#?}");
    assert!(
        since[1..].iter().all(|r| r.query.get("resourceVersion").map(String::as_str) == Some("0")),
        "relists from the watch cache: {since:#?}"
    );

    // Lists are answered again: the relist commits, the table vouches again, the pod is there.
    server.fail_lists(PODS, false);
    let view = wait_for(&mut rx, "relisted", |v| v.synced).await;
    assert!(view.pods_on_node.iter().any(|p| p.name == "web-1"), "{view:#?}");
    assert_eq!(view.last_error, None);
    assert_eq!(view.vouch(BootTime::now()), Ok(()));
    let WatchHealth { resource, synced, error, heard } = view.watches[0].clone();
    assert_eq!((resource, synced, error), ("pods", true, None));
    assert!(heard.is_some());
    handle.abort();
}

#[tokio::test]
async fn a_watch_answered_with_500_stops_vouching_until_it_has_relisted() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    let (mut rx, handle) = spawn_watch(client, NODE, fast());
    wait_for(&mut rx, "vouching", vouches).await;
    let va_lists = requests_for(&server, VAS, 0).iter().filter(|r| !r.is_watch()).count();
    assert_eq!(va_lists, 1);

    // The open watch ends at its timeout; the next watch request is answered with HTTP 500.
    server.fail_watches(VAS, true);
    let view = wait_for(&mut rx, "the VolumeAttachments table unsynced", |v| !v.synced).await;
    let why = view.vouch(BootTime::now()).expect_err("a broken watch cannot vouch");
    assert!(
        why.starts_with("the volumeattachments watch broke (failed to start watching object: ")
            && why.contains("etcdserver: request timed out")
            && why.ends_with("): relisting"),
        "{why}"
    );

    server.fail_watches(VAS, false);
    let view = wait_for(&mut rx, "vouching again", vouches).await;
    assert_eq!(view.last_error, None);
    let va_lists = requests_for(&server, VAS, 0).iter().filter(|r| !r.is_watch()).count();
    assert!(va_lists >= 2, "synced again by a relist, not by the next watch");
    // And it stays so: the watch that follows holds, and ends at its timeout as usual.
    tokio::time::sleep(WATCH_HOLD + Duration::from_millis(500)).await;
    assert_eq!(rx.borrow().vouch(BootTime::now()), Ok(()));
    handle.abort();
}

#[tokio::test]
async fn a_node_name_with_no_node_cannot_vouch() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    // No Node is named so: the field selector selects no pods, which must not read as "no pod
    // uses it".
    let (mut rx, handle) = spawn_watch(client.clone(), "node-gone", fast());
    let view = wait_for(&mut rx, "synced, the Node looked up", |v| v.synced && v.node_found.is_some()).await;
    assert!(view.pods_on_node.is_empty());
    assert_eq!(view.node_found, Some(false));
    assert_eq!(view.last_error, None, "a 404 is an answer, not an error");
    assert_eq!(
        view.vouch(BootTime::now()),
        Err("no Node named 'node-gone' in the cluster: its pods and attachments cannot be told from none"
            .to_string())
    );
    assert!(server.requests().iter().any(|r| r.method == Method::GET && r.path == "/api/v1/nodes/node-gone"));
    handle.abort();

    // This node exists, then is deleted.
    let (mut rx, handle) = spawn_watch(client, NODE, fast());
    wait_for(&mut rx, "vouching", vouches).await;
    server.remove_node();
    let view = wait_for(&mut rx, "the Node gone", |v| v.node_found == Some(false)).await;
    assert_eq!(
        view.vouch(BootTime::now()),
        Err("no Node named 'node-a' in the cluster: its pods and attachments cannot be told from none"
            .to_string())
    );
    assert!(view.synced, "the watches are fine; the node is not");
    handle.abort();
}

#[tokio::test]
async fn a_silent_api_stops_vouching_after_the_bound_without_blocking() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    let options = fast();
    let (mut rx, handle) = spawn_watch(client, NODE, options);
    let view = wait_for(&mut rx, "vouching", vouches).await;

    // Signs of life refresh the contact time in place; with nothing else changing, readers are
    // not woken for them.
    let first = view.last_contact.expect("contact");
    rx.mark_unchanged();
    tokio::time::sleep(options.probe_interval * 3).await;
    assert!(!rx.has_changed().expect("watching"), "a bare contact notifies nobody");
    assert!(rx.borrow().last_contact.is_some_and(|c| c > first), "but it is refreshed");

    // Nothing answers any more; the watches stay open and say nothing.
    server.go_silent();
    let silent_at = std::time::Instant::now();
    let why = loop {
        let started = std::time::Instant::now();
        let verdict = rx.borrow().vouch(BootTime::now());
        assert!(started.elapsed() < Duration::from_millis(50), "vouch never waits on the API");
        if let Err(why) = verdict {
            break why;
        }
        assert!(silent_at.elapsed() < WAIT, "still vouching after {:?} of silence", silent_at.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = silent_at.elapsed();
    // The first source past the bound is named (each watch heard from last by a bookmark at
    // most BOOKMARK_EVERY before the silence, the Node a lookup at most probe_interval before).
    assert!(
        why.contains("has not heard from the API server for ")
            || why.contains("has not been answered for ")
            || why.contains("heard nothing from the API server for 1s, not even a bookmark"),
        "{why}"
    );
    assert!(
        after
            >= options.silence_bound
                - options.probe_interval.max(BOOKMARK_EVERY)
                - Duration::from_millis(100),
        "not before the bound: {after:?}"
    );
    assert_eq!(rx.borrow().node_found, Some(true), "the last answer is kept");

    // Each silent watch is dropped and relisted; the relists go unanswered, so none is synced
    // again, and every one names why.
    let view = wait_for(&mut rx, "every watch dropped", |v| v.watches.iter().all(|w| !w.synced)).await;
    for w in &view.watches {
        let e = w.error.as_deref().unwrap_or_default();
        assert!(
            e == "it heard nothing from the API server for 1s, not even a bookmark"
                || e == "failed to start watching object: no answer within 1s"
                || e == "failed to perform initial object list: no answer within 1s",
            "{w:?}"
        );
    }
    assert!(view.vouch(BootTime::now()).is_err_and(|e| e.starts_with("the pods watch broke (")));
    handle.abort();
}

/// One watch stalls (its connection open, nothing sent, not even a bookmark) while the other
/// watches and the Node lookups answer: within the bound the view stops vouching and names that
/// watch, and stays so while the stall lasts; once the collection answers again the watch is
/// relisted and the view vouches again. A quiet but live watch (no events, bookmarks only) never
/// stops vouching.
#[tokio::test]
async fn one_stalled_watch_stops_vouching_and_is_named_until_it_answers_again() {
    let server = ApiServer::start(node_object(ready_only())).await;
    let client = connect(&cfg(&server.url())).await.expect("connect");
    // A 2 s bound: bookmarks come every 300 ms, so a loaded machine does not make a quiet watch
    // look stalled.
    let options = WatchOptions { silence_bound: Duration::from_secs(2), ..fast() };
    let (mut rx, handle) = spawn_watch(client, NODE, options);
    wait_for(&mut rx, "vouching", vouches).await;

    // Quiet but live, for three bounds: no event at all, but bookmarks (and the watches the
    // server ends and the agent resumes) keep every watch vouching.
    let quiet = std::time::Instant::now();
    while quiet.elapsed() < options.silence_bound * 2 {
        let verdict = rx.borrow().vouch(BootTime::now());
        assert_eq!(verdict, Ok(()), "a quiet watch that hears bookmarks does not flap");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let watches: Vec<Recorded> = server.requests().into_iter().filter(|r| r.is_watch()).collect();
    assert!(watches.len() >= 3);
    for w in &watches {
        assert_eq!(w.query.get("allowWatchBookmarks").map(String::as_str), Some("true"), "{w:?}");
        assert_eq!(w.query.get("timeoutSeconds").map(String::as_str), Some("290"), "{w:?}");
    }
    let pod_lists = |s: &ApiServer| requests_for(s, PODS, 0).iter().filter(|r| !r.is_watch()).count();
    assert_eq!(pod_lists(&server), 1, "bookmarks and resumptions, no relist");

    // The pods watch stalls; everything else answers.
    let lists_at_stall = pod_lists(&server);
    server.stall(PODS, true);
    let stalled_at = std::time::Instant::now();
    let why = loop {
        if let Err(why) = rx.borrow().vouch(BootTime::now()) {
            break why;
        }
        assert!(
            stalled_at.elapsed() < WAIT,
            "still vouching after {:?} of a stalled watch",
            stalled_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = stalled_at.elapsed();
    assert!(why.starts_with("the pods watch "), "the silent watch is named: {why}");
    assert!(
        why.contains("has not heard from the API server for 2s (bound 2s)")
            || why.contains("heard nothing from the API server for 2s, not even a bookmark"),
        "{why}"
    );
    assert!(after >= options.silence_bound / 2, "not at once: it was heard from just before: {after:?}");
    assert!(
        after <= options.silence_bound + Duration::from_millis(500),
        "noticed within the bound: {after:?}"
    );

    // While the stall lasts the view never vouches, always naming the pods watch, and the other
    // watches and the Node stay live.
    let held = std::time::Instant::now();
    let mut seen = std::collections::BTreeSet::new();
    while held.elapsed() < options.silence_bound * 2 {
        let view = rx.borrow().clone();
        let why = view.vouch(BootTime::now()).expect_err("a stalled watch never vouches");
        assert!(why.starts_with("the pods watch "), "{why}");
        seen.insert(why.split(" (").next().unwrap_or_default().to_string());
        for w in &view.watches[1..] {
            assert!(w.synced && w.error.is_none(), "{w:?}");
            let heard = w.heard.expect("heard");
            assert!(BootTime::now().since(heard) <= options.silence_bound, "{w:?}");
        }
        assert_eq!(view.node_found, Some(true));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(seen.contains("the pods watch broke"), "dropped and relisting: {seen:?}");
    let view = rx.borrow().clone();
    assert!(!view.watches[0].synced);
    assert!(view.last_error.as_deref().is_some_and(|e| e.starts_with("pods: ")), "{view:#?}");

    assert!(pod_lists(&server) > lists_at_stall, "the silent watch was dropped for a relist");

    // The pods collection answers again: relisted, vouching again.
    server.stall(PODS, false);
    let view = wait_for(&mut rx, "vouching again", vouches).await;
    assert!(view.watches[0].synced && view.watches[0].error.is_none(), "{view:#?}");
    assert_eq!(view.last_error, None);
    // And it stays so.
    tokio::time::sleep(options.silence_bound * 2).await;
    assert_eq!(rx.borrow().vouch(BootTime::now()), Ok(()));
    handle.abort();
}

/// The same stall seen through the agent: a daemon following the stand-in API (silence bound
/// 3 s) judges an unheld loop device `stale`; the pods watch stalls while everything else
/// answers, and the device becomes `unknown` with a reason naming the pods watch; once the
/// collection answers again and the watch has relisted, the device is `stale` again. (Report
/// mode: nothing is cleaned either way.)
#[test]
fn root_one_stalled_watch_makes_a_candidate_unknown_naming_it() {
    use blockjanitor_proto::v1 as pb;
    use blockjanitor_tests::daemon::{reporting_daemon, unix_client};
    use blockjanitor_tests::{require_real_kernel, rt, serial, wait_until, Scratch, REACT};
    if !require_real_kernel(&["losetup"]) {
        return;
    }
    let _serial = serial();
    let rt = rt();
    let s = Scratch::new();
    let (server, d) =
        reporting_daemon(&s, &rt, &["--rescan-interval", "1", "--kube-silence-bound-seconds", "3"]);
    let lo = s.loop_file("candidate.img");
    let name = lo.name().to_owned();
    let device = || -> Option<(i32, String)> {
        rt.block_on(async {
            let mut c = unix_client(&d.socket).await;
            c.get_device(pb::GetDeviceRequest { device: name.clone() })
                .await
                .ok()
                .map(|r| r.into_inner())
                .map(|r| (r.verdict, r.reasons.join("; ")))
        })
    };
    let is =
        |v: pb::Verdict| move |got: &Option<(i32, String)>| got.as_ref().is_some_and(|(g, _)| *g == v as i32);
    assert!(
        wait_until(REACT, || is(pb::Verdict::Stale)(&device())),
        "an unheld loop device with a vouching API is stale: {:?}\nlog:\n{}",
        device(),
        d.log_text()
    );

    server.stall(PODS, true);
    let stalled_at = std::time::Instant::now();
    let mut last = None;
    let unknown = wait_until(REACT, || {
        last = device();
        is(pb::Verdict::Unknown)(&last)
    });
    let after = stalled_at.elapsed();
    assert!(unknown, "still {last:?} with the pods watch stalled\nlog:\n{}", d.log_text());
    let (_, reasons) = last.expect("device");
    assert!(reasons.contains("the pods watch "), "the silent watch is named: {reasons}");
    assert!(
        after < Duration::from_secs(3 + 1 + 5),
        "noticed within the bound (3 s), a rescan (1 s) and slack: {after:?}"
    );
    assert!(lo.is_bound());

    server.stall(PODS, false);
    assert!(
        wait_until(REACT, || is(pb::Verdict::Stale)(&device())),
        "the watch answers again: {:?}\nlog:\n{}",
        device(),
        d.log_text()
    );
    assert!(lo.is_bound(), "report mode cleans nothing");
    drop(d);
    drop(rt);
}
