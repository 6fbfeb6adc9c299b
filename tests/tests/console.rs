//! End-to-end tests of the fleet console (`blockjanitor-console`) with real processes: a local
//! stand-in kube-apiserver serving the agent DaemonSet's pods (by label), Nodes with
//! `volumesAttached`/`volumesInUse`, the PV (in-tree RBD), its PVC and VolumeAttachments; real
//! `blockjanitor-agent serve` processes on fixture roots: the old node of incident 1 (a stale rbd
//! mapping of the image), the node the pod moved to (`incident1-newnode`: the same image mapped
//! and mounted), a node with other storage (`multipath-incident3`: FC multipath), and a node whose agent pod is
//! listed but where nothing listens. The console discovers them from the pod list (pod IPs
//! 127.0.0.x, the agent port from its flags) and is asked over mutual TLS.
//!
//! Also: the agent's `blockjanitor_device_info` series on a real serve process, and
//! `agentctl fleet` / `kubectl blockjanitor` against the console.

// Only `Schema` is used here.
#[allow(dead_code)]
#[path = "support/schema.rs"]
mod schema;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{bin, console_args, start_agent, Console};
use blockjanitor_tests::daemon::{
    assert_serving_and_reflected, console_client, console_facing_agent, tls_channel, Daemon, Pki,
};
use blockjanitor_tests::http::http_get;
use blockjanitor_tests::kube_mock::{self, ApiServer, Recorded};
use blockjanitor_tests::*;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;

const IMAGE: &str = "kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
const PV: &str = "pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
const PVC: &str = "shop/data-db-0";
const NS: &str = "blockjanitor";
const SELECTOR: &str = "app.kubernetes.io/name=blockjanitor-agent";
/// The old node's watcher, as `rbd status` printed it in incident 1 (the field notes), in the
/// layout the Ceph guest captured (`Watchers:` then a tab: tests/ceph/README.md).
const RBD_STATUS_OLD: &str =
    "Watchers:\n\twatcher=10.125.53.47:0/3423687629 client.1138525 cookie=18446462598732840961\n";

/// A port free on 127.0.0.2..6 (the agents' pod IPs share it, as pods share a containerPort).
fn free_port() -> u16 {
    for _ in 0..50 {
        let l = std::net::TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
        let port = l.local_addr().expect("addr").port();
        drop(l);
        if (3..=6).all(|i| std::net::TcpListener::bind(format!("127.0.0.{i}:{port}")).is_ok()) {
            return port;
        }
    }
    panic!("no port free on 127.0.0.2-6");
}

fn agent_pod(name: &str, node: &str, ip: &str, app: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": NS, "uid": format!("uid-{name}"), "resourceVersion": "50",
                     "creationTimestamp": "2026-11-01T00:00:00Z",
                     "labels": {"app.kubernetes.io/name": app, "controller-revision-hash": "7c9d"}},
        "spec": {"nodeName": node, "hostPID": true,
                 "containers": [{"name": "agent", "image": "blockjanitor-agent:0.1",
                                 "ports": [{"name": "grpc", "containerPort": 9443}]}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip}
    })
}

fn node(name: &str, ip: &str, attached: bool, in_use: bool) -> Value {
    let vol = format!("kubernetes.io/rbd/k8s:{IMAGE}");
    let mut status = json!({"conditions": kube_mock::ready_only(),
                            "addresses": [{"type": "InternalIP", "address": ip},
                                          {"type": "Hostname", "address": name}]});
    if attached {
        status["volumesAttached"] = json!([{"name": vol, "devicePath": ""}]);
    }
    if in_use {
        status["volumesInUse"] = json!([vol]);
    }
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": "900",
                        "labels": {"kubernetes.io/hostname": name}},
           "spec": {}, "status": status})
}

fn rbd_pv() -> Value {
    json!({
        "metadata": {"name": PV, "resourceVersion": "17", "finalizers": ["kubernetes.io/pv-protection"],
                     "annotations": {"pv.kubernetes.io/provisioned-by": "kubernetes.io/rbd"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "10Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "shop",
                         "name": "data-db-0", "uid": "uid-claim-data-db-0", "resourceVersion": "16"},
            "rbd": {"monitors": ["10.125.53.10:6789"], "image": IMAGE, "pool": "k8s", "user": "admin",
                    "secretRef": {"name": "ceph-secret", "namespace": "kube-system"}, "fsType": "ext4"},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "rbd", "volumeMode": "Filesystem"
        },
        "status": {"phase": "Bound"}
    })
}

fn rbd_pvc() -> Value {
    json!({
        "metadata": {"name": "data-db-0", "namespace": "shop", "uid": "uid-claim-data-db-0", "resourceVersion": "16"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                 "storageClassName": "rbd", "volumeName": PV, "volumeMode": "Filesystem"},
        "status": {"phase": "Bound", "capacity": {"storage": "10Gi"}}
    })
}

/// More objects than two list pages of the console hold (500 each).
const FILLERS: usize = 1_200;

/// [`FILLERS`] objects made by `filler`, then `last`.
fn after_fillers(last: Value, filler: fn(usize) -> Value) -> Vec<Value> {
    (0..FILLERS).map(filler).chain([last]).collect()
}

/// An NFS volume of another namespace's claim: no block device, no node.
fn filler_pv(i: usize) -> Value {
    json!({
        "metadata": {"name": format!("pv-nfs-{i}"), "resourceVersion": "5"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "nfs": {"server": "10.9.0.1", "path": format!("/exports/{i}")},
                 "claimRef": {"namespace": "other", "name": format!("nfs-{i}")}},
        "status": {"phase": "Bound"}
    })
}

fn filler_pvc(i: usize) -> Value {
    json!({
        "metadata": {"name": format!("nfs-{i}"), "namespace": "other", "resourceVersion": "5"},
        "spec": {"accessModes": ["ReadWriteMany"], "volumeName": format!("pv-nfs-{i}")},
        "status": {"phase": "Bound"}
    })
}

fn va(name: &str, node: &str) -> Value {
    let mut v = kube_mock::volume_attachment(name, node, PV, true, 95);
    v["spec"]["attacher"] = json!("kubernetes.io/rbd");
    v
}

/// The whole cluster: API, agents, console, and the certificates to talk to it.
struct Cluster {
    s: Scratch,
    pki: Pki,
    api: ApiServer,
    agents: Vec<(String, Daemon)>,
    console: Console,
}

impl Cluster {
    fn agent(&self, node: &str) -> &Daemon {
        &self.agents.iter().find(|(n, _)| n == node).expect("agent").1
    }

    async fn client(&self, who: &str) -> FleetClient<Channel> {
        FleetClient::new(self.channel(who).await)
    }

    async fn channel(&self, who: &str) -> Channel {
        let pem = self.pki.issue(who, &[who]);
        tls_channel(self.console.tcp, &self.pki.ca.cert, Some((&pem.cert, &pem.key)))
            .await
            .expect("connect to the console")
    }
}

async fn start_cluster() -> Cluster {
    start_cluster_with(&[]).await
}

/// [`start_cluster`], and a client of its console as the viewer `dashboard`.
async fn dashboard_cluster() -> (Cluster, FleetClient<Channel>) {
    let cl = start_cluster().await;
    let c = cl.client("dashboard").await;
    (cl, c)
}

/// [`start_cluster`] with more console flags.
async fn start_cluster_with(console_extra: &[&str]) -> Cluster {
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let port = free_port();
    let mut agents = Vec::new();
    for (node, ip, fixture) in [
        ("node-old", "127.0.0.2", "incident1"),
        ("node-new", "127.0.0.3", "incident1-newnode"),
        ("node-free", "127.0.0.5", "multipath-incident3"),
    ] {
        let dir = s.mkdir(node);
        let listen = format!("{ip}:{port}");
        let d = start_agent(&dir, fixture, node, &listen, &tls);
        assert_eq!(d.tcp.map(|a| a.to_string()), Some(listen), "agent listens on its pod IP");
        agents.push((node.to_owned(), d));
    }

    let api = ApiServer::start(kube_mock::node_object(kube_mock::ready_only())).await;
    {
        let mut st = api.state.lock().expect("state");
        st.lists.insert(
            "/api/v1/namespaces/blockjanitor/pods",
            vec![
                agent_pod("blockjanitor-agent-x7k2p", "node-old", "127.0.0.2", "blockjanitor-agent"),
                agent_pod("blockjanitor-agent-m3q9d", "node-new", "127.0.0.3", "blockjanitor-agent"),
                // Listed, Running, and nothing listens at its IP.
                agent_pod("blockjanitor-agent-z8w4t", "node-gone", "127.0.0.4", "blockjanitor-agent"),
                agent_pod("blockjanitor-agent-c5v1n", "node-free", "127.0.0.5", "blockjanitor-agent"),
                // Another app in the namespace: not an agent (the label selector must leave it out).
                agent_pod("log-shipper-4kd8s", "node-x", "127.0.0.6", "log-shipper"),
            ],
        );
        st.lists.insert(
            "/api/v1/nodes",
            vec![
                node("node-old", "10.125.53.47", true, false),
                node("node-new", "10.125.53.48", true, true),
                // Incident 4's node: down, its watcher still on the image.
                node("node-gone", "192.168.73.52", true, false),
                node("node-free", "10.125.53.49", false, false),
            ],
        );
        // The rbd volume last, behind more than two of the console's list pages of other volumes
        // (the stand-in API server pages a list at the most recent version, as the real one
        // does): found only when every page is read.
        st.lists.insert("/api/v1/persistentvolumes", after_fillers(rbd_pv(), filler_pv));
        st.lists.insert("/api/v1/persistentvolumeclaims", after_fillers(rbd_pvc(), filler_pvc));
        st.lists.insert(
            "/apis/storage.k8s.io/v1/volumeattachments",
            vec![
                va("csi-old-1f0c7a4e", "node-old"),
                va("csi-new-9e8d7c6b", "node-new"),
                va("csi-gone-3b2a1f0e", "node-gone"),
                va("csi-free-5d4c3b2a", "node-free"),
            ],
        );
    }
    let port_text = port.to_string();
    let url = api.url();
    let args = console_args(
        &s,
        &pki,
        &tls,
        &[
            "--operator",
            "admin",
            "--namespace",
            NS,
            "--selector",
            SELECTOR,
            "--agent-port",
            &port_text,
            "--kube-url",
            &url,
            "--call-timeout-ms",
            "2000",
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "2",
        ]
        .into_iter()
        .chain(console_extra.iter().copied())
        .collect::<Vec<_>>(),
    );
    let console = Console::start(&args);
    let cl = Cluster { s, pki, api, agents, console };
    // Converged: ready (the Kubernetes view listed, every agent tried, the sweep gone over the
    // fleet), three agents synced, the fourth known and unreachable.
    let mut c = cl.client("dashboard").await;
    wait_serving(cl.channel("dashboard").await, "blockjanitor.v1.Fleet").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let up: Vec<&str> = nodes.nodes.iter().filter(|n| n.reachable).map(|n| n.name.as_str()).collect();
        let gone = nodes.nodes.iter().find(|n| n.name == "node-gone");
        if up == ["node-free", "node-new", "node-old"] && gone.is_some_and(|g| !g.error.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the console did not converge: {nodes:#?}\n{}",
            cl.console.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cl
}

fn devs(list: &[pb::FleetDevice]) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = list
        .iter()
        .map(|d| (d.node.clone(), d.device.as_ref().map(|x| x.name.clone()).unwrap_or_default()))
        .collect();
    v.sort();
    v
}

fn pair(node: &str, dev: &str) -> (String, String) {
    (node.to_owned(), dev.to_owned())
}

#[test]
fn console_discovers_agents_by_label_and_answers_where_from_image_pv_and_pvc() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let nodes = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let names: Vec<&str> = nodes.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["node-free", "node-gone", "node-new", "node-old"], "the log shipper is no agent");
        let gone = nodes.nodes.iter().find(|n| n.name == "node-gone").expect("node-gone");
        assert!(
            !gone.reachable
                && gone.address == format!("127.0.0.4:{}", cl.agent("node-old").tcp.expect("tcp").port())
        );
        assert_eq!(nodes.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["node-gone"]);
        let old = nodes.nodes.iter().find(|n| n.name == "node-old").expect("node-old");
        assert_eq!(old.agent.as_ref().map(|a| a.name.as_str()), Some("node-old"), "GetNode was read");

        let want = vec![pair("node-new", "rbd0"), pair("node-old", "rbd4")];
        for (what, req) in [
            ("image", pb::WhereRequest { image: format!("k8s/{IMAGE}"), ..Default::default() }),
            ("pv", pb::WhereRequest { pv: PV.into(), ..Default::default() }),
            ("pvc", pb::WhereRequest { pvc: PVC.into(), ..Default::default() }),
            ("guessed pvc", pb::WhereRequest { query: PVC.into(), ..Default::default() }),
            ("fresh", pb::WhereRequest { image: format!("k8s/{IMAGE}"), fresh: true, ..Default::default() }),
        ] {
            let r = c.r#where(req).await.unwrap_or_else(|e| panic!("Where {what}: {e:?}")).into_inner();
            assert_eq!(devs(&r.matches), want, "Where by {what}: {r:#?}");
            assert_eq!(r.missing_nodes.len(), 1, "{what}: {r:#?}");
            assert_eq!(r.missing_nodes[0].node, "node-gone");
            assert!(r.missing_nodes[0].reason.starts_with("unreachable"), "{:?}", r.missing_nodes);
            let by_node = |n: &str| {
                r.matches.iter().find(|d| d.node == n).and_then(|d| d.device.clone()).expect("device")
            };
            assert_eq!(by_node("node-old").verdict, pb::Verdict::Stale as i32);
            assert!(by_node("node-old").holders.is_empty());
            assert_eq!(by_node("node-new").verdict, pb::Verdict::InUse as i32);
            assert_eq!(by_node("node-new").holders[0].kind, pb::HolderKind::Mount as i32);
            assert_eq!(
                by_node("node-new").rbd.as_ref().map(|r| r.client_addr.as_str()),
                Some("10.125.53.48:0/2208145901")
            );
            if what.contains("pvc") {
                assert!(
                    r.resolved.starts_with(&format!("PVC {PVC} -> PV {PV} -> rbd image k8s/{IMAGE}")),
                    "{}",
                    r.resolved
                );
            }
        }
        // A WWID: the multipath map of incident 3 and both its paths.
        for req in [
            pb::WhereRequest { wwid: "3618CF24100F8F457014A764C000001F6".into(), ..Default::default() },
            pb::WhereRequest { query: "3618cf24100f8f457014a764c000001f6".into(), ..Default::default() },
        ] {
            let r = c.r#where(req).await.expect("Where wwid").into_inner();
            let want = vec![pair("node-free", "dm-12"), pair("node-free", "sdi"), pair("node-free", "sdj")];
            assert_eq!(devs(&r.matches), want, "{r:#?}");
        }
        // Every list the console made was paged at the most recent version, and the volumes'
        // lists took every page (the rbd volume is on the third).
        {
            let st = cl.api.state.lock().expect("state");
            let lists: Vec<&Recorded> =
                st.requests.iter().filter(|r| r.method == "GET" && !r.is_watch()).collect();
            let pv_pages = lists.iter().filter(|r| r.path == "/api/v1/persistentvolumes").count();
            assert!(pv_pages >= 3, "{FILLERS} + 1 PVs in pages of 500: {pv_pages} list requests");
            let watched = [
                "/api/v1/nodes",
                "/api/v1/persistentvolumes",
                "/api/v1/persistentvolumeclaims",
                "/apis/storage.k8s.io/v1/volumeattachments",
                "/api/v1/pods",
                "/api/v1/namespaces/blockjanitor/pods",
            ];
            for r in lists.iter().filter(|r| watched.contains(&r.path.as_str())) {
                assert_eq!(r.query.get("limit").map(String::as_str), Some("500"), "{} {:?}", r.path, r.query);
                assert!(
                    r.query.get("resourceVersion").is_none_or(|v| v.is_empty()),
                    "{} {:?}",
                    r.path,
                    r.query
                );
            }
        }
        let none = c
            .r#where(pb::WhereRequest { image: "k8s/no-such-image".into(), ..Default::default() })
            .await
            .expect("Where");
        assert!(none.into_inner().matches.is_empty());
        let e = c
            .r#where(pb::WhereRequest { pvc: "shop/nope".into(), ..Default::default() })
            .await
            .expect_err("no PVC");
        assert_eq!(e.code(), Code::NotFound, "{e:?}");

        // Metrics: agents up and down, the index's size, as the sweep last published them (a
        // scrape never sweeps: the sweeper's next step, within its period, catches up).
        let deadline = Instant::now() + Duration::from_secs(30);
        let m = loop {
            let m = http_get(cl.console.metrics, "/metrics");
            if m.contains("blockjanitor_console_agents{state=\"up\"} 3") || Instant::now() > deadline {
                break m;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(m.contains("blockjanitor_console_agents{state=\"up\"} 3"), "{m}");
        assert!(m.contains("blockjanitor_console_agents{state=\"down\"} 1"), "{m}");
        assert!(m.contains("blockjanitor_console_query_duration_seconds_count{method=\"Where\"} 8"), "{m}");
        assert!(m.contains("blockjanitor_console_index_entries{what=\"nodes\"} 4"), "{m}");
        // The console process's own series, unprefixed as the convention has them.
        for series in
            ["\nprocess_resident_memory_bytes ", "\nprocess_cpu_seconds_total ", "\nprocess_open_fds "]
        {
            assert!(m.contains(series), "the console's process metrics ({series:?}): {m}");
        }
        if require_real_kernel(&["promtool"]) {
            let mut child = Command::new("promtool")
                .args(["check", "metrics"])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("promtool");
            std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), m.as_bytes()).expect("write");
            let out = child.wait_with_output().expect("promtool");
            assert!(out.status.success(), "promtool: {}{}", text(&out.stdout), text(&out.stderr));
        }
    });
}

#[test]
fn who_watches_maps_rbd_status_text_to_the_node_and_unfence_waits_for_every_node() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let r = c
            .who_watches(pb::WhoWatchesRequest { text: RBD_STATUS_OLD.into(), ..Default::default() })
            .await
            .expect("WhoWatches")
            .into_inner();
        assert_eq!(r.watchers.len(), 1, "{r:#?}");
        let w = &r.watchers[0];
        assert_eq!(
            (w.client_addr.as_str(), w.client_id.as_str()),
            ("10.125.53.47:0/3423687629", "client.1138525")
        );
        assert_eq!(devs(&w.mappings), vec![pair("node-old", "rbd4")]);
        assert!(!w.unfence_safe, "the old node still maps the image: {w:#?}");
        // By client id as sysfs prints it, and by the bare IP.
        let r = c
            .who_watches(pb::WhoWatchesRequest { client_id: "client1140012".into(), ..Default::default() })
            .await
            .expect("by id")
            .into_inner();
        assert_eq!(devs(&r.watchers[0].mappings), vec![pair("node-new", "rbd0")]);
        let r = c
            .who_watches(pb::WhoWatchesRequest { client_addr: "10.125.53.48".into(), ..Default::default() })
            .await
            .expect("by ip")
            .into_inner();
        assert_eq!(devs(&r.watchers[0].mappings), vec![pair("node-new", "rbd0")]);

        // A watcher no answering node maps: still not safe while node-gone cannot be asked.
        let dead =
            "Watchers:\n\twatcher=192.168.73.52:0/319745466 client.2474196 cookie=18446462598732841025\n";
        let r = c
            .who_watches(pb::WhoWatchesRequest { text: dead.into(), ..Default::default() })
            .await
            .expect("dead")
            .into_inner();
        assert!(r.watchers[0].mappings.is_empty());
        assert!(!r.watchers[0].unfence_safe, "node-gone did not answer: {r:#?}");
        assert_eq!(r.watchers[0].node_by_address, "node-gone", "the watcher's IP is node-gone's InternalIP");
        assert_eq!(r.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["node-gone"]);

        // The agent pod on node-gone is deleted.
        let pod = cl.api.state.lock().expect("state").lists["/api/v1/namespaces/blockjanitor/pods"]
            .iter()
            .find(|p| p["spec"]["nodeName"] == "node-gone")
            .cloned()
            .expect("pod");
        cl.api.publish("/api/v1/namespaces/blockjanitor/pods", "DELETED", pod);
        // Still a Node with no agent to ask: not safe.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = c
                .who_watches(pb::WhoWatchesRequest { text: dead.into(), ..Default::default() })
                .await
                .expect("dead")
                .into_inner();
            let reasons: Vec<&str> = r.missing_nodes.iter().map(|m| m.reason.as_str()).collect();
            if reasons == ["no blockjanitor agent pod on this node"] {
                assert!(!r.watchers[0].unfence_safe, "{r:#?}");
                break;
            }
            assert!(Instant::now() < deadline, "the agent pod's deletion was not seen: {r:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The node is deleted from the cluster: every node answers now, but the watcher's IP was
        // a Node deleted while its machine may still run: unknown, never safe (issue 35).
        let node_gone = cl.api.state.lock().expect("state").lists["/api/v1/nodes"]
            .iter()
            .find(|n| n["metadata"]["name"] == "node-gone")
            .cloned()
            .expect("node");
        cl.api.publish("/api/v1/nodes", "DELETED", node_gone);
        loop {
            let r = c
                .who_watches(pb::WhoWatchesRequest { text: dead.into(), ..Default::default() })
                .await
                .expect("dead")
                .into_inner();
            // Never safe at any moment; once the node has left the fleet and the view has the
            // Node's deletion (two watches: either may come first), the detail says why.
            if let Some(w) = r.watchers.first() {
                assert!(!w.unfence_safe && w.answer != "yes", "{r:#?}");
            }
            let settled = r.watchers.first().is_some_and(|w| w.detail.contains("its Node was deleted"));
            if r.missing_nodes.is_empty() && settled {
                let w = &r.watchers[0];
                assert!(!w.unfence_safe && w.answer == "unknown", "{r:#?}");
                assert!(
                    w.detail.contains("its Node was deleted") && w.detail.contains("may still run"),
                    "{}",
                    w.detail
                );
                assert_eq!(w.nodes, ["node-gone"], "the deleted Node is still named: {w:#?}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node-gone never left the fleet: {r:#?}\n{}",
                cl.console.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // The old node's client is still mapped there: never safe, whoever answers.
        let r = c
            .who_watches(pb::WhoWatchesRequest { text: RBD_STATUS_OLD.into(), ..Default::default() })
            .await
            .expect("old")
            .into_inner();
        assert!(!r.watchers[0].unfence_safe);
        let e = c
            .who_watches(pb::WhoWatchesRequest { text: "Watchers: none\n".into(), ..Default::default() })
            .await
            .expect_err("no watcher");
        assert_eq!(e.code(), Code::InvalidArgument);
    });
}

/// Issue 35, item 3: with every node answering, nothing is "safe" without evidence about the
/// client's own node: `IP:0/0` (every client of the IP, as `ceph osd blocklist add IP` stores
/// it), an IP of no node the console knows, the IP of a Node deleted while its machine may still
/// run, and an instance on a node that answers but never reported it as a kernel client (an
/// rbd-nbd or librbd client: its agent cannot see one) are "unknown"; a daemon's address and a
/// blocklist line with a word that is no expiry are refused as questions (exit 1).
#[test]
fn who_watches_never_answers_safe_without_evidence_about_the_clients_own_node() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        // node-gone leaves the fleet (its agent pod, then its Node, deleted): every node answers.
        for (list, field) in
            [("/api/v1/namespaces/blockjanitor/pods", "/spec/nodeName"), ("/api/v1/nodes", "/metadata/name")]
        {
            let obj = cl.api.state.lock().expect("state").lists[list]
                .iter()
                .find(|o| o.pointer(field).and_then(Value::as_str) == Some("node-gone"))
                .cloned()
                .expect("object");
            cl.api.publish(list, "DELETED", obj);
        }
        let ask = |text: &str| pb::WhoWatchesRequest { text: text.into(), ..Default::default() };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = c.who_watches(ask("10.125.53.49:0/5")).await.expect("who-watches").into_inner();
            if r.missing_nodes.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "node-gone never left: {r:#?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (text, why) in [
            ("10.125.53.49:0/0", "covers every client of that IP on node node-free"),
            ("10.125.53.49:0/0 2026-11-27T03:00:00.000000+0000", "covers every client of that IP"),
            ("10.125.53.49", "covers every client of that IP"),
            ("10.99.0.1:0/5", "belongs to no node this console knows"),
            ("192.168.73.52:0/319745466", "its Node was deleted"),
            ("10.125.53.49:0/77777", "never saw it there as a kernel rbd client"),
            ("client.4242", "belongs to no node this console knows"),
        ] {
            let r = c.who_watches(ask(text)).await.unwrap_or_else(|e| panic!("{text}: {e:?}")).into_inner();
            let w = &r.watchers[0];
            assert!(!w.unfence_safe && w.answer == "unknown", "{text}: {w:#?}");
            assert!(w.detail.contains(why), "{text}: {}", w.detail);
            assert!(r.missing_nodes.is_empty(), "{text}: every node answered: {r:#?}");
        }
        for (text, why) in [
            ("10.125.53.49:6789/0", "a monitor's msgr1 address"),
            ("v2:10.125.53.49:3300/0", "a monitor's msgr2 address"),
            ("10.125.53.49:6800/0", "an OSD's, MDS's or manager's address"),
            ("10.125.53.49:0/5 12:30", "not a blocklist expiry"),
            ("10.125.53.49:0/5 2026-11-27T03:00:00.000000+0000 extra", "not a blocklist expiry"),
        ] {
            let e = c.who_watches(ask(text)).await.expect_err(text);
            assert_eq!(e.code(), Code::InvalidArgument, "{text}: {e:?}");
            assert!(e.message().contains(why), "{text}: {}", e.message());
        }
        let (code, out, err) = ctl(&cl, &bin("agentctl"), &["fleet", "who-watches", "10.125.53.49:0/0"]);
        assert_eq!(code, 0, "{err}");
        assert!(
            out.starts_with("watcher 10.125.53.49:0/0 : unfence safe: unknown (unknown, never safe: "),
            "{out}"
        );
        let (code, _, err) = ctl(&cl, &bin("agentctl"), &["fleet", "who-watches", "10.125.53.49:6789/0"]);
        assert_eq!(code, 1, "refused: {err}");
    });
}

/// Issue 18: the address as Ceph prints it (`v1:` prefix, vector, `ceph osd blocklist ls` line,
/// range) finds the mapping and is never "safe"; what is not understood is INVALID_ARGUMENT (exit 1
/// in agentctl), never an answer.
#[test]
fn who_watches_reads_every_ceph_address_form_and_refuses_what_it_does_not_understand() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let old = vec![pair("node-old", "rbd4")];
        for text in [
            "v1:10.125.53.47:0/3423687629",
            "any:10.125.53.47:0/3423687629",
            "[v2:10.125.53.47:3300/3423687629,v1:10.125.53.47:6789/3423687629]",
            "10.125.53.47:0/3423687629 2026-11-27T03:00:00.000000+0000\nlisted 1 entries\n",
            "Watchers:\n\twatcher=v1:10.125.53.47:0/3423687629 client.1138525 cookie=18446462598732840961\n",
            "client.1138525",
            "1138525",
        ] {
            let r = c
                .who_watches(pb::WhoWatchesRequest { text: text.into(), ..Default::default() })
                .await
                .unwrap_or_else(|e| panic!("{text:?}: {e:?}"))
                .into_inner();
            assert_eq!(r.watchers.len(), 1, "{text:?}: {r:#?}");
            let w = &r.watchers[0];
            assert_eq!(devs(&w.mappings), old, "{text:?}: {r:#?}");
            assert!(!w.unfence_safe, "{text:?}: {w:#?}");
            assert!(w.detail.contains("still mapped on node-old/rbd4"), "{text:?}: {}", w.detail);
        }
        // The same through client_addr, and a range covering both nodes' clients.
        let r = c
            .who_watches(pb::WhoWatchesRequest {
                client_addr: "v1:10.125.53.47:0/3423687629".into(),
                ..Default::default()
            })
            .await
            .expect("client_addr with v1:")
            .into_inner();
        assert_eq!(devs(&r.watchers[0].mappings), old, "{r:#?}");
        assert!(!r.watchers[0].unfence_safe);
        let r = c
            .who_watches(pb::WhoWatchesRequest { text: "10.125.53.0/24".into(), ..Default::default() })
            .await
            .expect("range")
            .into_inner();
        let mut found = devs(&r.watchers[0].mappings);
        found.sort();
        assert_eq!(found, vec![pair("node-new", "rbd0"), pair("node-old", "rbd4")], "{r:#?}");
        // Another instance from the same IP (another nonce) is not this mapping.
        let r = c
            .who_watches(pb::WhoWatchesRequest { text: "v1:10.125.53.47:0/1".into(), ..Default::default() })
            .await
            .expect("other nonce")
            .into_inner();
        assert!(r.watchers[0].mappings.is_empty(), "{r:#?}");

        for text in [
            "garbage",
            "v1:10.125.53.47",
            "10.125.53.47:0/",
            "10.125.53.47:0/3423687629 tomorrow",
            "watcher=v1:10.125.53.47:0/x client.1138525 cookie=1",
            "Watchers:\n\twatcher=10.125.53.47:0/3423687629 client.1138525 cookie=1\n\twatcher=bogus client.2 cookie=2\n",
        ] {
            let e = c
                .who_watches(pb::WhoWatchesRequest { text: text.into(), ..Default::default() })
                .await
                .expect_err(text);
            assert_eq!(e.code(), Code::InvalidArgument, "{text:?}: {e:?}");
            assert!(e.message().contains("10.0.0.5:0/3710147553"), "no example: {}", e.message());
        }
        for req in [
            pb::WhoWatchesRequest { client_addr: "node-old".into(), ..Default::default() },
            pb::WhoWatchesRequest { client_id: "osd.3".into(), ..Default::default() },
            pb::WhoWatchesRequest::default(),
        ] {
            let e = c.who_watches(req.clone()).await.expect_err("not understood");
            assert_eq!(e.code(), Code::InvalidArgument, "{req:?}: {e:?}");
        }

        // agentctl: the pasted form answers; garbage is one error line and exit 1.
        let agentctl = bin("agentctl");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "who-watches", "v1:10.125.53.47:0/3423687629"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("unfence safe: no") && out.contains("node-old"), "{out}");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "who-watches", "v1:10.125.53.47:0/zz"]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(!out.contains("unfence safe"), "{out}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("is not a Ceph address"), "{err}");
    });
}

#[test]
fn multiattach_diagnoses_each_node_and_apply_is_forwarded_on_behalf_of_the_operator() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let r = c
            .multi_attach(pb::MultiAttachRequest { pvc: PVC.into(), ..Default::default() })
            .await
            .expect("MultiAttach")
            .into_inner();
        assert_eq!(r.pv, PV);
        let d = |n: &str| {
            r.nodes.iter().find(|x| x.node == n).unwrap_or_else(|| panic!("no diagnosis for {n}: {r:#?}"))
        };
        assert_eq!(r.nodes.len(), 4, "{r:#?}");

        let old = d("node-old");
        assert_eq!(old.diagnosis, pb::Diagnosis::StaleMapping as i32, "{old:#?}");
        assert_eq!(old.volume_attachments, ["csi-old-1f0c7a4e (attached=true)"]);
        assert!(old.in_volumes_attached && !old.in_volumes_in_use);
        let steps: Vec<(&str, &str)> =
            old.clear_steps.iter().map(|s| (s.action.as_str(), s.device.as_str())).collect();
        assert_eq!(steps, [("rbd_unmap", "rbd4")], "the agent's own plan: {old:#?}");
        assert_eq!(old.identities.len(), 1);
        assert!(old.identities[0].contains("rbd="), "{:?}", old.identities);

        let new = d("node-new");
        assert_eq!(new.diagnosis, pb::Diagnosis::InUseCorrect as i32, "{new:#?}");
        assert!(new.in_volumes_attached && new.in_volumes_in_use);
        assert!(new.clear_steps.is_empty());

        let free = d("node-free");
        assert_eq!(free.diagnosis, pb::Diagnosis::SafeToDeleteVa as i32, "{free:#?}");
        assert!(free.devices.is_empty() && free.detail.contains("csi-free-5d4c3b2a"), "{free:#?}");

        let gone = d("node-gone");
        assert_eq!(gone.diagnosis, pb::Diagnosis::Unknown as i32, "never safe: {gone:#?}");
        assert_eq!(r.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["node-gone"]);

        // By PV name too.
        let by_pv = c
            .multi_attach(pb::MultiAttachRequest { pv: PV.into(), ..Default::default() })
            .await
            .expect("by pv")
            .into_inner();
        assert_eq!(by_pv.nodes.len(), 4);

        // Apply: a viewer is refused by the console; nothing reaches the agent.
        let req = pb::FleetApplyRequest {
            node: "node-old".into(),
            devices: vec!["rbd4".into()],
            identities: old.identities.clone(),
            execute: true,
            ..Default::default()
        };
        let e = c.apply(req.clone()).await.expect_err("viewer Apply");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(!cl.agent("node-old").log_text().contains("on_behalf_of"));
        // An operator's Apply reaches the agent as the console on behalf of the operator and is
        // audited so (on a fixture tree the agent then refuses to act: nothing changes).
        let mut admin = cl.client("admin").await;
        let e = admin.apply(req).await.expect_err("a fixture tree cannot be acted on");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("the agent on node-old"), "{e:?}");
        let log = cl.agent("node-old").log_text();
        let audit = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["target"] == "audit" && v["phase"] == "request")
            .unwrap_or_else(|| panic!("no audit line: {log}"));
        assert_eq!(audit["caller"], "console");
        assert_eq!(audit["on_behalf_of"], "admin");
        assert_eq!(audit["devices"], "rbd4");
        // Plan forwarded.
        let p = c
            .plan(pb::FleetPlanRequest { node: "node-old".into(), devices: vec!["rbd4".into()] })
            .await
            .expect("Plan")
            .into_inner();
        assert_eq!(p.plan.expect("plan").plans[0].steps[0].action, "rbd_unmap");
        let e = c
            .plan(pb::FleetPlanRequest { node: "node-gone".into(), devices: vec![] })
            .await
            .expect_err("unreachable");
        assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    });
}

/// The agent's audit lines for Apply requests.
fn apply_audits(d: &Daemon) -> Vec<Value> {
    d.log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit" && v["phase"] == "request")
        .collect()
}

/// The console's Apply across real agents: identities required (refused naming the device,
/// before any agent is asked), a dry run of every node's plan first (the summary always
/// returned; nothing runs without `execute`, nor when the dry run refuses anywhere), a
/// fleet-wide step budget a minute (refused naming the budget and when it frees), and rate limits
/// per caller (one operator over its limit does not slow another).
#[test]
fn console_apply_needs_identities_dry_runs_every_node_and_keeps_a_budget_and_per_caller_limits() {
    rt().block_on(async {
        let cl = start_cluster_with(&[
            "--operator",
            "admin2",
            "--fleet-steps-per-minute",
            "1",
            "--applies-per-minute-per-caller",
            "4",
        ])
        .await;
        let mut admin = cl.client("admin").await;
        let plan =
            |node: &str, dev: &str| pb::FleetPlanRequest { node: node.into(), devices: vec![dev.into()] };
        let old = admin.plan(plan("node-old", "rbd4")).await.expect("plan old").into_inner();
        let old = old.plan.expect("plan").plans.remove(0);
        assert_eq!((old.steps.len(), old.refusal.as_str()), (1, ""), "{old:#?}");
        assert!(old.identity.contains("rbd="), "{old:#?}");
        let new = admin.plan(plan("node-new", "rbd0")).await.expect("plan new").into_inner();
        let new = new.plan.expect("plan").plans.remove(0);
        assert!(!new.refusal.is_empty(), "rbd0 is in use on node-new: {new:#?}");
        // The agents count the console's forwarded Plans per caller.
        let audits_before = apply_audits(cl.agent("node-old")).len();

        // 1. Identities are required: refused naming the device, before any agent is asked.
        let bare = pb::FleetApplyRequest {
            node: "node-old".into(),
            devices: vec!["rbd4".into()],
            execute: true,
            ..Default::default()
        };
        let e = admin.apply(bare).await.expect_err("no identity");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("no identity for node-old/rbd4: "), "{e:?}");
        let mut two = pb::FleetApplyRequest {
            node: "node-old".into(),
            devices: vec!["rbd4".into()],
            identities: vec![old.identity.clone()],
            targets: vec![pb::FleetApplyTarget {
                node: "node-new".into(),
                devices: vec!["rbd0".into()],
                identities: vec![String::new()],
            }],
            execute: true,
        };
        let e = admin.apply(two.clone()).await.expect_err("no identity on the second node");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("no identity for node-new/rbd0: "), "{e:?}");

        // 2. A dry run across two nodes: every node's plan summarised, nothing run.
        two.targets[0].identities = vec![new.identity.clone()];
        let dry = admin
            .apply(pb::FleetApplyRequest { execute: false, ..two.clone() })
            .await
            .expect("dry run")
            .into_inner();
        assert!(!dry.executed && dry.results.is_empty() && dry.result.is_none(), "{dry:#?}");
        assert_eq!(dry.on_behalf_of, "admin");
        let nodes: Vec<&str> = dry.summary.iter().map(|n| n.node.as_str()).collect();
        assert_eq!(nodes, ["node-old", "node-new"]);
        let (s_old, s_new) = (&dry.summary[0], &dry.summary[1]);
        assert_eq!((s_old.steps, s_old.refusal.as_str()), (1, ""), "{s_old:#?}");
        assert_eq!(s_old.plan.as_ref().expect("plan").plans[0].steps[0].action, "rbd_unmap");
        assert!(s_new.refusal.starts_with("rbd0: "), "the refused device is named: {s_new:#?}");
        assert!(s_new.refusal.contains(&new.refusal), "with the agent's reason: {s_new:#?}");
        assert_eq!((dry.budget_steps_per_minute, dry.budget_steps_left), (1, 1));
        assert_eq!(apply_audits(cl.agent("node-old")).len(), audits_before, "a dry run applies nothing");

        // 3. Executing while the dry run refuses on one node runs nothing anywhere.
        let e = admin.apply(two.clone()).await.expect_err("node-new refuses");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("the dry run refuses, so nothing ran: node-new: rbd0: "), "{e:?}");
        assert_eq!(apply_audits(cl.agent("node-old")).len(), audits_before, "node-old was not asked to act");
        assert_eq!(apply_audits(cl.agent("node-new")).len(), 0);

        // 4. node-old alone: the dry run passes, the Apply reaches the agent on behalf of admin
        // (which, on a fixture tree, refuses to act) and takes the fleet's one step this minute.
        let one = pb::FleetApplyRequest { targets: Vec::new(), ..two.clone() };
        let e = admin.apply(one.clone()).await.expect_err("a fixture tree cannot be acted on");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("the agent on node-old: "), "{e:?}");
        // The agent logs the audit line before it answers; the test reads its stderr on a thread
        // of its own, which may not have the line yet.
        wait_until(Duration::from_secs(10), || apply_audits(cl.agent("node-old")).len() > audits_before);
        let audits = apply_audits(cl.agent("node-old"));
        assert_eq!(audits.len(), audits_before + 1, "{audits:#?}");
        let last = audits.last().expect("audit");
        assert_eq!(
            (last["caller"].as_str(), last["on_behalf_of"].as_str()),
            (Some("console"), Some("admin"))
        );

        // 5. The fleet-wide budget is spent: the next Apply is refused before reaching any agent,
        // naming the budget and when it frees.
        let e = admin.apply(one.clone()).await.expect_err("over budget");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message().starts_with(
                "the fleet-wide step budget (1 steps a minute, --fleet-steps-per-minute) has 0 left and this \
                 Apply needs 1: enough frees in "
            ) && e.message().ends_with(" s; nothing ran"),
            "{e:?}"
        );
        assert_eq!(apply_audits(cl.agent("node-old")).len(), audits_before + 1, "nothing forwarded");

        // 6. admin has made its four Applies this minute (the refusals for a missing identity
        // were not counted); another operator has its own.
        let e = admin
            .apply(pb::FleetApplyRequest { execute: false, ..one.clone() })
            .await
            .expect_err("admin's fifth Apply");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(
            e.message()
                .starts_with("admin asked for more than 4 Applies a minute on this console: try again in "),
            "{e:?}"
        );
        let mut admin2 = cl.client("admin2").await;
        let dry2 = admin2
            .apply(pb::FleetApplyRequest { execute: false, ..one.clone() })
            .await
            .expect("another caller is not slowed")
            .into_inner();
        assert_eq!(dry2.on_behalf_of, "admin2");
        assert_eq!(dry2.budget_steps_left, 0, "but the fleet's budget is shared");
        let e = admin2.apply(one).await.expect_err("the shared budget");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("fleet-wide step budget"), "{e:?}");
        let log = cl.console.log_text();
        assert!(log.contains("Apply dry run for admin"), "the dry run is audited: {log}");
    });
}

#[test]
fn the_console_role_cannot_apply_without_naming_an_operator() {
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let d = start_agent(s.dir.path(), "incident1", "node-old", "127.0.0.1:0", &tls);
    let console = pki.issue("console", &["console"]);
    rt().block_on(async {
        let ch = tls_channel(d.tcp.expect("tcp"), &pki.ca.cert, Some((&console.cert, &console.key)))
            .await
            .expect("connect");
        let mut a = blockjanitor_proto::v1::agent_client::AgentClient::new(ch);
        let list =
            a.list_devices(pb::ListDevicesRequest::default()).await.expect("the console reads").into_inner();
        assert!(list.devices.iter().any(|x| x.name == "rbd4"));
        let e = a
            .apply(pb::ApplyRequest { devices: vec!["rbd4".into()], ..Default::default() })
            .await
            .expect_err("no operator named");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(e.message().contains("x-blockjanitor-on-behalf-of"), "{e:?}");
        let mut req =
            tonic::Request::new(pb::ApplyRequest { devices: vec!["rbd4".into()], ..Default::default() });
        req.metadata_mut().insert("x-blockjanitor-on-behalf-of", "alice".parse().expect("value"));
        let e = a.apply(req).await.expect_err("fixture tree");
        assert_eq!(e.code(), Code::FailedPrecondition, "past the role check: {e:?}");
    });
    // The log is read by a thread of its own: the line may land a moment after the answer.
    let logged = wait_until(Duration::from_secs(5), || d.log_text().contains("\"on_behalf_of\":\"alice\""));
    assert!(logged, "{}", d.log_text());
}

/// The agent counts the Plans the console forwards per caller named in
/// `x-blockjanitor-on-behalf-of` ("console for alice"), not the console as one caller: one
/// person over the limit does not stop the others.
#[test]
fn the_agent_counts_the_consoles_forwarded_plans_per_caller() {
    let s = Scratch::new();
    let (d, pki) = console_facing_agent(&s, "incident1", "plans_per_minute_per_client = 2\n");
    rt().block_on(async {
        let mut a = console_client(&d, &pki).await;
        let plan = |who: &str| {
            let mut req =
                tonic::Request::new(pb::PlanRequest { devices: vec!["rbd4".into()], ..Default::default() });
            req.metadata_mut().insert("x-blockjanitor-on-behalf-of", who.parse().expect("value"));
            req
        };
        for _ in 0..2 {
            a.plan(plan("alice")).await.expect("within alice's limit");
        }
        let e = a.plan(plan("alice")).await.expect_err("alice's third Plan this minute");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().starts_with("console for alice asked for more than 2 plans a minute"), "{e:?}");
        a.plan(plan("bob")).await.expect("bob has his own limit");
    });
}

fn copy_tree(from: &Path, to: &Path) {
    let st = Command::new("cp").arg("-a").arg(from).arg(to).status().expect("cp");
    assert!(st.success());
}

#[test]
fn device_info_series_follow_the_devices_of_the_latest_scan() {
    let s = Scratch::new();
    let root = s.path("incident1");
    copy_tree(&fixtures().join("incident1"), &root);
    // The image in a rados namespace (`k8s/tenants/IMAGE`): the pool and the namespace are two
    // labels, never `pool="tenants"`.
    std::fs::write(root.join("sys/devices/rbd/4/pool_ns"), "tenants\n").expect("write pool_ns");
    let d = Daemon::start_with_global(
        s.dir.path(),
        &["--root", root.to_str().expect("utf8"), "--rescan-interval", "1"],
        &["--metrics-listen", "127.0.0.1:0", "--node-name", "node-old", "--grace-period", "5"],
    );
    let addr = d.metrics.expect("metrics address");
    let m = http_get(addr, "/metrics");
    // No `node` label (the scrape adds it) and no verdict: the info series never changes while the
    // device lives.
    let rbd = "blockjanitor_device_info{client_addr=\"10.125.53.47:0/3423687629\",device=\"rbd4\",image=\"kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c\",kind=\"rbd\",pool=\"k8s\",pv=\"\",rados_namespace=\"tenants\",wwid=\"\"} 1";
    assert!(m.contains(rbd), "{m}");
    let info = |m: &str| -> Vec<String> {
        m.lines().filter(|l| l.starts_with("blockjanitor_device_info{")).map(str::to_owned).collect()
    };
    let verdict_of = |m: &str, v: &str| {
        m.contains(&format!("blockjanitor_device_verdict{{device=\"rbd4\",verdict=\"{v}\"}} 1"))
    };
    // Across a verdict change on the live agent (unheld, then stale once the 5 s grace period has
    // passed): the state set moves, the info series stay exactly as they were.
    assert!(!verdict_of(&m, "stale"), "rbd4 is stale before its grace period passed: {m}");
    let before = info(&m);
    let mut after = String::new();
    assert!(
        wait_until(Duration::from_secs(30), || {
            after = http_get(addr, "/metrics");
            verdict_of(&after, "stale")
        }),
        "rbd4 never became stale: {after}"
    );
    assert_eq!(info(&after), before, "a verdict change changed the info series");
    assert!(
        after.contains("blockjanitor_device_verdict{device=\"rbd4\",verdict=\"in_use\"} 0"),
        "every verdict of the state set is exported: {after}"
    );
    assert!(
        !after.lines().any(|l| l.starts_with("blockjanitor_") && l.contains("node=")),
        "a series carries a node label, which would clash with the scrape's: {after}"
    );
    assert!(after.contains("\nprocess_resident_memory_bytes "), "process metrics: {after}");
    let m = after;
    assert!(
        m.lines().any(|l| l.starts_with("blockjanitor_device_info{")
            && l.contains("device=\"sda\"")
            && l.contains("kind=\"disk\"")
            && l.contains("rados_namespace=\"\"")),
        "SCSI disks too: {m}"
    );
    assert!(!m.contains("device=\"sda1\""), "partitions are not listed: {m}");
    // The mapping goes (as `rbd unmap` leaves sysfs): its series goes with the next scan.
    for p in ["sys/class/block/rbd4", "sys/bus/rbd/devices/4"] {
        std::fs::remove_file(root.join(p)).expect("remove link");
    }
    std::fs::remove_dir_all(root.join("sys/devices/rbd/4")).expect("remove rbd 4");
    assert!(
        wait_until(Duration::from_secs(20), || !http_get(addr, "/metrics").contains("device=\"rbd4\"")),
        "the rbd4 series stayed after the device went"
    );
    assert!(http_get(addr, "/metrics").contains("device=\"sda\""));

    // A multipath node (incident 3): the map and its SCSI paths carry the WWID multipath uses.
    let mp = Daemon::start_with_global(
        &s.mkdir("mp"),
        &["--root", fixtures().join("multipath-incident3").to_str().expect("utf8")],
        &["--metrics-listen", "127.0.0.1:0", "--node-name", "node-fc"],
    );
    let m = http_get(mp.metrics.expect("metrics address"), "/metrics");
    for dev in ["dm-12", "sdi", "sdj"] {
        let line = m
            .lines()
            .find(|l| l.starts_with("blockjanitor_device_info{") && l.contains(&format!("device=\"{dev}\"")))
            .unwrap_or_else(|| panic!("no device_info for {dev}: {m}"));
        assert!(line.contains("wwid=\"3618cf24100f8f457014a764c000001f6\""), "{line}");
        assert!(!line.contains("node="), "{line}");
    }
}

/// Runs `bin` (agentctl, or its kubectl-plugin symlink) against the console as `dashboard`.
fn ctl(cl: &Cluster, bin: &Path, args: &[&str]) -> (i32, String, String) {
    let pem = cl.pki.issue("dashboard", &["dashboard"]);
    let (c, k, ca) = (cl.s.path("dashboard.crt"), cl.s.path("dashboard.key"), cl.s.path("ca.crt"));
    std::fs::write(&c, pem.cert).expect("write cert");
    std::fs::write(&k, pem.key).expect("write key");
    let out = Command::new(bin)
        .args(args)
        .env("BLOCKJANITOR_CONSOLE", cl.console.tcp.to_string())
        .env("BLOCKJANITOR_CERT", &c)
        .env("BLOCKJANITOR_KEY", &k)
        .env("BLOCKJANITOR_CA", &ca)
        .args(["--server-name", "localhost", "--timeout", "10"])
        .stdin(Stdio::null())
        .output()
        .expect("run agentctl");
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Runs agentctl against the console as `who`, with `stdin` as its input.
fn ctl_as(cl: &Cluster, who: &str, args: &[&str], stdin: &str) -> (i32, String, String) {
    use std::io::Write as _;
    let pem = cl.pki.issue(who, &[who]);
    let (c, k, ca) =
        (cl.s.path(&format!("{who}.crt")), cl.s.path(&format!("{who}.key")), cl.s.path("ca.crt"));
    std::fs::write(&c, pem.cert).expect("write cert");
    std::fs::write(&k, pem.key).expect("write key");
    let mut child = Command::new(bin("agentctl"))
        .args(args)
        .env("BLOCKJANITOR_CONSOLE", cl.console.tcp.to_string())
        .env("BLOCKJANITOR_CERT", &c)
        .env("BLOCKJANITOR_KEY", &k)
        .env("BLOCKJANITOR_CA", &ca)
        .args(["--server-name", "localhost", "--timeout", "10"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run agentctl");
    child.stdin.take().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    let out = child.wait_with_output().expect("agentctl output");
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `agentctl fleet apply`: the console's dry run of every node's plan is shown first; only
/// `--yes` carries it out (as `agentctl apply`: no question, even when one is answered on
/// stdin), and a refusal anywhere stops everything with the dry run's exit code.
#[test]
fn agentctl_fleet_apply_shows_the_dry_run_and_runs_only_with_yes() {
    rt().block_on(async {
        let cl = start_cluster().await;
        let audits = || apply_audits(cl.agent("node-old")).len();
        let before = audits();

        // Without --yes: shown, nothing run, and no question (a "y" on stdin changes nothing).
        let (code, out, err) = ctl_as(&cl, "admin", &["fleet", "apply", "node-old/rbd4"], "y\n");
        assert_eq!(code, 2, "{out}{err}");
        assert!(out.starts_with("node-old: 1 step(s)\n  rbd_unmap rbd4: "), "{out}");
        assert!(out.contains("fleet budget: 20 of 20 steps left this minute"), "{out}");
        assert_eq!(err.trim(), "not applied: add --yes to carry it out", "as agentctl apply says it");
        assert_eq!(audits(), before, "nothing reached the agent");

        // A refusal on one node: nothing runs anywhere, and no question is asked.
        let (code, out, err) =
            ctl_as(&cl, "admin", &["fleet", "apply", "node-old/rbd4", "node-new/rbd0", "--yes"], "");
        assert_eq!(code, 2, "{out}{err}");
        assert!(out.contains("node-new: REFUSED: rbd0: "), "{out}");
        assert!(err.contains("nothing ran: the dry run refuses"), "{err}");
        assert_eq!(audits(), before);

        // With --yes: the same plan goes to the agent, bound to its identity, on behalf of the
        // operator (a fixture tree: the agent then refuses to act).
        let (code, out, err) = ctl_as(&cl, "admin", &["fleet", "apply", "node-old/rbd4", "--yes"], "");
        assert_eq!(code, 4, "refused (FailedPrecondition, as the agent exits): {out}{err}");
        assert!(out.starts_with("node-old: 1 step(s)"), "{out}");
        assert!(err.contains("the agent on node-old: "), "{err}");
        let all = apply_audits(cl.agent("node-old"));
        assert_eq!(all.len(), before + 1, "{all:#?}");
        assert_eq!(all.last().expect("audit")["on_behalf_of"], "admin");

        // A viewer cannot even dry-run an Apply.
        let (code, _, err) = ctl_as(&cl, "dashboard", &["fleet", "apply", "node-old/rbd4", "--yes"], "");
        assert_eq!(code, 1);
        assert!(err.contains("operator role"), "{err}");
    });
}

#[test]
fn agentctl_fleet_and_the_kubectl_plugin_ask_the_console() {
    rt().block_on(async {
        let cl = start_cluster().await;
        let agentctl = bin("agentctl");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "where", PVC, "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).expect("json");
        let schema = schema::Schema::load();
        schema.check(&v, "fleet_where", "agentctl fleet where -o json");
        let mut found: Vec<(String, String)> = v["matches"]
            .as_array()
            .expect("matches")
            .iter()
            .map(|m| {
                (
                    m["node"].as_str().unwrap_or("").to_owned(),
                    m["device"]["name"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        found.sort();
        assert_eq!(found, vec![pair("node-new", "rbd0"), pair("node-old", "rbd4")], "{v:#}");
        assert_eq!(v["matches"][1]["device"]["verdict"], "stale", "{v:#}");
        assert_eq!(v["missing_nodes"][0]["node"], "node-gone");

        // The kubectl plugin: the same binary named kubectl-blockjanitor is `agentctl fleet`.
        let plugin = cl.s.path("kubectl-blockjanitor");
        std::os::unix::fs::symlink(&agentctl, &plugin).expect("symlink");
        let (code, out, err) = ctl(&cl, &plugin, &["where", PVC]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with(&format!("PVC {PVC} -> PV {PV}")), "{out}");
        let row = out.lines().find(|l| l.starts_with("node-old")).unwrap_or_else(|| panic!("{out}"));
        assert!(row.contains("rbd4") && row.contains("stale") && row.contains("client.1138525"), "{out}");
        assert!(out.contains("node-gone: unreachable"), "{out}");

        let (code, out, err) = ctl(&cl, &plugin, &["multiattach", PVC, "-o", "yaml"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("diagnosis: safe_to_delete_va"), "{out}");
        assert!(out.contains("diagnosis: stale_mapping"), "{out}");
        let (code, out, _) = ctl(&cl, &plugin, &["multiattach", PVC]);
        assert_eq!(code, 0);
        assert!(out.contains("to clear the stale mapping on node-old:\n  rbd_unmap:"), "{out}");

        let (code, out, err) = ctl(&cl, &plugin, &["who-watches", "client.1138525"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("unfence safe: no") && out.contains("node-old"), "{out}");
        // `rbd status ... | kubectl blockjanitor who-watches -`
        let mut child = Command::new(&plugin)
            .args(["who-watches", "-", "-o", "json", "--server-name", "localhost"])
            .env("BLOCKJANITOR_CONSOLE", cl.console.tcp.to_string())
            .env("BLOCKJANITOR_CERT", cl.s.path("dashboard.crt"))
            .env("BLOCKJANITOR_KEY", cl.s.path("dashboard.key"))
            .env("BLOCKJANITOR_CA", cl.s.path("ca.crt"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the plugin");
        std::io::Write::write_all(&mut child.stdin.take().expect("stdin"), RBD_STATUS_OLD.as_bytes())
            .expect("write");
        let out = child.wait_with_output().expect("plugin");
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).expect("json");
        assert_eq!(v["watchers"][0]["client_addr"], "10.125.53.47:0/3423687629", "{v:#}");
        assert_eq!(v["watchers"][0]["mappings"][0]["node"], "node-old", "{v:#}");
        assert_eq!(v["watchers"][0]["mappings"][0]["device"]["name"], "rbd4", "{v:#}");
        assert_eq!(v["watchers"][0]["unfence_safe"], false);

        let (code, out, _) = ctl(&cl, &plugin, &["nodes", "-o", "json"]);
        assert_eq!(code, 0);
        let v: Value = serde_json::from_str(&out).expect("json");
        schema.check(&v, "fleet_nodes", "kubectl blockjanitor nodes -o json");
        assert_eq!(v["nodes"].as_array().map(Vec::len), Some(4));
        // Without a console address the plugin goes through the kubeconfig (tests/kubectl_plugin.rs);
        // without one either: one clear line, exit 1.
        let out = Command::new(&plugin)
            .args(["nodes"])
            .env_remove("BLOCKJANITOR_CONSOLE")
            .env("KUBECONFIG", cl.s.path("no-kubeconfig"))
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1));
        assert!(
            text(&out.stderr).starts_with("error: cannot read the kubeconfig: "),
            "{}",
            text(&out.stderr)
        );
    });
}

async fn wait_for<F: Fn(&pb::ListNodesResponse) -> bool>(c: &mut FleetClient<Channel>, what: &str, ok: F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        if ok(&n) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {n:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn reachable(n: &pb::ListNodesResponse, node: &str) -> bool {
    n.nodes.iter().any(|x| x.name == node && x.reachable)
}

/// Waits (at most 30 s) until `grpc.health.v1` says `service` is SERVING: a console replica is
/// NOT_SERVING until it has synced.
async fn wait_serving(ch: Channel, service: &str) {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let req = tonic_health::pb::HealthCheckRequest { service: service.into() };
        let status = h.check(req).await.expect("health").into_inner().status;
        if status == ServingStatus::Serving as i32 {
            return;
        }
        assert!(Instant::now() < deadline, "{service} not SERVING after 30 s: {status}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn static_agents_reconnect_with_backoff_and_a_lost_agent_becomes_missing() {
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let port = free_port();
    let (old_addr, late_addr) = (format!("127.0.0.2:{port}"), format!("127.0.0.4:{port}"));
    // The old node's agent scans a copy of incident 1 every second: its rbd4 goes later.
    let root = s.path("incident1");
    copy_tree(&fixtures().join("incident1"), &root);
    let mut old = Daemon::start_tls(
        &s.mkdir("old"),
        &["--root", root.to_str().expect("utf8"), "--rescan-interval", "1"],
        &old_addr,
        &tls,
        &["--tls-console", "console", "--grace-period", "0", "--node-name", "node-old"],
    );
    let agents = format!("node-old=https://{old_addr},node-late={late_addr}");
    let args = console_args(
        &s,
        &pki,
        &tls,
        &[
            "--agents",
            &agents,
            "--call-timeout-ms",
            "2000",
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "1",
        ],
    );
    let console = Console::start(&args);
    let viewer = pki.issue("dashboard", &["dashboard"]);
    rt().block_on(async {
        let ch =
            tls_channel(console.tcp, &pki.ca.cert, Some((&viewer.cert, &viewer.key))).await.expect("connect");
        // Health: NOT_SERVING until every agent has had its first try (issue 36), then SERVING;
        // and reflection.
        wait_serving(ch.clone(), "blockjanitor.v1.Fleet").await;
        assert_serving_and_reflected(ch.clone(), "blockjanitor.v1.Fleet").await;
        let mut c = FleetClient::new(ch);

        wait_for(&mut c, "node-old synced, node-late refused", |n| {
            reachable(n, "node-old")
                && n.missing_nodes.iter().any(|m| m.node == "node-late" && m.reason.contains("refused"))
        })
        .await;
        let image = format!("k8s/{IMAGE}");
        let r = c
            .r#where(pb::WhereRequest { image: image.clone(), ..Default::default() })
            .await
            .expect("Where")
            .into_inner();
        assert_eq!(devs(&r.matches), vec![pair("node-old", "rbd4")]);
        // Without the Kubernetes API, volume questions say so.
        let e = c
            .multi_attach(pb::MultiAttachRequest { pv: PV.into(), ..Default::default() })
            .await
            .expect_err("no API");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("without the Kubernetes API"), "{e:?}");

        // The late agent comes up: the link's retries find it.
        let _late = start_agent(&s.mkdir("late"), "incident1-newnode", "node-late", &late_addr, &tls);
        wait_for(&mut c, "node-late connected on a retry", |n| reachable(n, "node-late")).await;
        let r = c
            .r#where(pb::WhereRequest { image: image.clone(), ..Default::default() })
            .await
            .expect("Where")
            .into_inner();
        assert_eq!(devs(&r.matches), vec![pair("node-late", "rbd0"), pair("node-old", "rbd4")]);
        assert!(r.missing_nodes.is_empty(), "{r:#?}");

        // rbd4 is unmapped on the old node (sysfs as `rbd unmap` leaves it): the agent's event
        // reaches the index long before the next full resync (60 s).
        for p in ["sys/class/block/rbd4", "sys/bus/rbd/devices/4"] {
            std::fs::remove_file(root.join(p)).expect("remove link");
        }
        std::fs::remove_dir_all(root.join("sys/devices/rbd/4")).expect("remove rbd 4");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let r = c
                .r#where(pb::WhereRequest { image: image.clone(), ..Default::default() })
                .await
                .expect("Where")
                .into_inner();
            if devs(&r.matches) == vec![pair("node-late", "rbd0")] {
                break;
            }
            assert!(Instant::now() < deadline, "the DEVICE_REMOVED event never reached the index: {r:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        // The old node's agent stops: the link notices, and the node is missing from answers.
        old.stop();
        wait_for(&mut c, "node-old lost", |n| !reachable(n, "node-old")).await;
        let r =
            c.r#where(pb::WhereRequest { image, ..Default::default() }).await.expect("Where").into_inner();
        assert_eq!(
            r.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(),
            ["node-old"],
            "{r:#?}"
        );
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let o = n.nodes.iter().find(|x| x.name == "node-old").expect("node-old");
        assert!(!o.error.is_empty() && o.last_seen_unix_seconds > 0.0, "{o:#?}");
    });
    drop(console);
}

#[test]
fn discovery_follows_agent_pods_without_an_ip_and_their_new_addresses() {
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let port = free_port();
    let late_addr = format!("127.0.0.3:{port}");
    rt().block_on(async {
        let api = ApiServer::start(kube_mock::node_object(kube_mock::ready_only())).await;
        let mut pending = agent_pod("blockjanitor-agent-p4n2d", "node-late", "", "blockjanitor-agent");
        pending["status"] = json!({"phase": "Pending"});
        api.state
            .lock()
            .expect("state")
            .lists
            .insert("/api/v1/namespaces/blockjanitor/pods", vec![pending.clone()]);
        api.state
            .lock()
            .expect("state")
            .lists
            .insert("/api/v1/nodes", vec![node("node-late", "10.0.0.3", false, false)]);
        api.state.lock().expect("state").lists.insert("/api/v1/persistentvolumeclaims", vec![]);
        let url = api.url();
        let port_text = port.to_string();
        let args = console_args(
            &s,
            &pki,
            &tls,
            &[
                "--namespace",
                NS,
                "--selector",
                SELECTOR,
                "--agent-port",
                &port_text,
                "--kube-url",
                &url,
                "--backoff-max-seconds",
                "1",
            ],
        );
        let console = Console::start(&args);
        let viewer = pki.issue("dashboard", &["dashboard"]);
        let ch =
            tls_channel(console.tcp, &pki.ca.cert, Some((&viewer.cert, &viewer.key))).await.expect("connect");
        let mut c = FleetClient::new(ch);
        wait_for(&mut c, "the pending pod's node listed, with why it cannot be asked", |n| {
            n.missing_nodes.iter().any(|m| m.node == "node-late" && m.reason.contains("has no IP yet"))
        })
        .await;
        // The pod gets its IP and the agent runs: the console connects to the new address.
        let _agent = start_agent(&s.mkdir("late"), "incident1-newnode", "node-late", &late_addr, &tls);
        let running = agent_pod("blockjanitor-agent-p4n2d", "node-late", "127.0.0.3", "blockjanitor-agent");
        api.publish("/api/v1/namespaces/blockjanitor/pods", "MODIFIED", running);
        wait_for(&mut c, "node-late reachable at its pod IP", |n| reachable(n, "node-late")).await;
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        assert_eq!(n.nodes[0].address, late_addr);
        assert_eq!(n.nodes[0].source, "kubernetes");
        assert!(n.missing_nodes.is_empty(), "{n:#?}");
        let r = c
            .r#where(pb::WhereRequest { image: format!("k8s/{IMAGE}"), ..Default::default() })
            .await
            .expect("Where")
            .into_inner();
        assert_eq!(devs(&r.matches), vec![pair("node-late", "rbd0")]);

        // The PVC watch breaks and lists fail: PVC questions say the view is not synced, instead
        // of answering from a table that may have missed changes; once lists work again, a
        // complete relist makes it answer again.
        let pvcs = "/api/v1/persistentvolumeclaims";
        let ask = || pb::WhereRequest { pvc: "shop/data-db-0".into(), ..Default::default() };
        let e = c.r#where(ask()).await.expect_err("no such PVC");
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        api.fail_lists(pvcs, true);
        api.fail_watches(pvcs, true);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let e = c.r#where(ask()).await.expect_err("no answer");
            if e.code() == Code::Unavailable {
                assert!(e.message().contains("persistentvolumeclaims"), "{e:?}");
                break;
            }
            assert!(Instant::now() < deadline, "the broken watch was never noticed: {e:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        api.fail_lists(pvcs, false);
        api.fail_watches(pvcs, false);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let e = c.r#where(ask()).await.expect_err("no such PVC");
            if e.code() == Code::NotFound {
                break;
            }
            assert!(Instant::now() < deadline, "never relisted: {e:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        drop(console);
    });
}

fn finding_kinds(r: &pb::SweepResponse) -> Vec<(String, String, Vec<String>)> {
    r.findings
        .iter()
        .map(|f| {
            let kind =
                pb::FindingKind::try_from(f.kind).map(|k| k.as_str_name().to_owned()).unwrap_or_default();
            (kind, f.volume.clone(), f.nodes.clone())
        })
        .collect()
}

/// Issue 18: the fleet-wide sweep (Sweep, MultiAttach with no argument, `agentctl fleet sweep`,
/// the console's metrics) over real agents: the image on two nodes, the stale mapping, the
/// VolumeAttachment to a node with nothing of it, the one to a node whose agent cannot be asked;
/// "incomplete" (exit 3), never "clean", while node-gone is missing; complete once it leaves the
/// fleet. WhoWatches by client id alone names the node; a client id no node reports is "safe" only
/// when every node answered.
#[test]
fn sweep_finds_every_volume_and_is_incomplete_while_a_node_is_missing_and_who_watches_by_id_names_the_node() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let image = format!("k8s/{IMAGE}");
        let r = c.sweep(pb::SweepRequest::default()).await.expect("Sweep").into_inner();
        let found = finding_kinds(&r);
        let has = |kind: &str, volume: &str, nodes: &[&str]| {
            found.iter().any(|(k, v, n)| {
                k == kind && v == volume && n.iter().map(String::as_str).eq(nodes.iter().copied())
            })
        };
        assert!(has("FINDING_KIND_MULTI_NODE", &image, &["node-new", "node-old"]), "{r:#?}");
        assert!(has("FINDING_KIND_ATTACHED_NOT_IN_USE", &image, &["node-old"]), "rbd4 is stale: {r:#?}");
        assert!(has("FINDING_KIND_ATTACHED_NOT_IN_USE", &image, &["node-free"]), "VA csi-free: {r:#?}");
        assert!(has("FINDING_KIND_DEAD_NODE_WATCHER", &image, &["node-gone"]), "VA csi-gone: {r:#?}");
        assert!(!has("FINDING_KIND_ATTACHED_NOT_IN_USE", &image, &["node-new"]), "rbd0 is in use: {r:#?}");
        let multi = r.findings.iter().find(|f| f.kind == pb::FindingKind::MultiNode as i32).expect("multi");
        assert_eq!(multi.pv, PV, "{multi:#?}");
        assert!(!r.complete, "node-gone did not answer: {r:#?}");
        assert!(r.summary.starts_with("incomplete: 1 node(s) did not answer (node-gone)"), "{}", r.summary);
        assert_eq!(r.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["node-gone"]);
        assert_eq!(r.counts.get("multi_node"), Some(&1), "{:?}", r.counts);

        // MultiAttach with no argument is the same sweep.
        let m = c.multi_attach(pb::MultiAttachRequest::default()).await.expect("MultiAttach").into_inner();
        let s = m.sweep.expect("a sweep");
        assert_eq!(finding_kinds(&s), found);
        assert!(!s.complete && m.pv.is_empty() && m.nodes.is_empty());

        // The console's metrics: counts per kind, and the sweep incomplete.
        let text = http_get(cl.console.metrics, "/metrics");
        assert!(text.contains("blockjanitor_console_sweep_findings{kind=\"multi_node\"} 1"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_findings{kind=\"dead_node_watcher\"} 1"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_complete 0"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_missing_nodes 1"), "{text}");

        // agentctl: exit 3 (incomplete), the verdict line first, the missing node named.
        let agentctl = bin("agentctl");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "sweep"]);
        assert_eq!(code, 3, "{out}{err}");
        assert!(
            out.starts_with("sweep of ") && out.contains("volume(s): incomplete: 1 node(s) did not answer"),
            "{out}"
        );
        assert!(out.contains("multi_node") && out.contains("node-new,node-old"), "{out}");
        assert!(out.contains("node-gone: unreachable"), "{out}");
        assert!(!out.contains("clean"), "{out}");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "sweep", "--kind", "multi_node", "-o", "json"]);
        assert_eq!(code, 3, "{out}{err}");
        let v: Value = serde_json::from_str(&out).expect("json");
        schema::Schema::load().check(&v, "fleet_sweep", "agentctl fleet sweep -o json");
        assert_eq!(v["complete"], false);
        assert_eq!(v["findings"].as_array().map(Vec::len), Some(1), "{v:#}");
        assert_eq!(v["findings"][0]["kind"], "multi_node");
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "multiattach"]);
        assert_eq!(code, 3, "multiattach with no volume sweeps: {out}{err}");
        assert!(out.starts_with("sweep of ") && out.contains("incomplete"), "{out}");
        let (code, _, err) = ctl(&cl, &agentctl, &["fleet", "sweep", "--kind", "bogus"]);
        assert_ne!(code, 0);
        assert!(err.contains("expected multi_node, attached_not_in_use or dead_node_watcher"), "{err}");

        // WhoWatches by client id alone: the node is named (by the agents' reports, and by address).
        for id in ["client.1138525", "1138525"] {
            let r = c
                .who_watches(pb::WhoWatchesRequest { client_id: id.into(), ..Default::default() })
                .await
                .expect("by id")
                .into_inner();
            let w = &r.watchers[0];
            assert_eq!(w.nodes, ["node-old"], "{id}: {w:#?}");
            assert_eq!(w.node_by_address, "node-old", "{id}: the mapping's address is node-old's InternalIP");
            assert!(!w.unfence_safe);
            assert!(w.detail.starts_with("client.1138525 is on node-old: "), "{}", w.detail);
        }
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "who-watches", "client.1140012"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("  on node(s): node-new"), "{out}");
        // A client id nobody reports and this console never saw: which node it is on is not
        // known, so it is never safe (issue 35: "safe" needs that node's own answer).
        let nobody = pb::WhoWatchesRequest { client_id: "client.999".into(), ..Default::default() };
        let r = c.who_watches(nobody.clone()).await.expect("nobody").into_inner();
        assert!(r.watchers[0].nodes.is_empty() && !r.watchers[0].unfence_safe, "{r:#?}");
        assert_eq!(r.watchers[0].answer, "unknown", "{r:#?}");
        assert!(
            r.watchers[0].detail.contains("belongs to no node this console knows"),
            "{}",
            r.watchers[0].detail
        );

        // node-gone leaves the fleet (agent pod and Node deleted): the sweep is complete.
        for (list, field, value) in [
            ("/api/v1/namespaces/blockjanitor/pods", "/spec/nodeName", "node-gone"),
            ("/api/v1/nodes", "/metadata/name", "node-gone"),
        ] {
            let obj = cl.api.state.lock().expect("state").lists[list]
                .iter()
                .find(|o| o.pointer(field).and_then(Value::as_str) == Some(value))
                .cloned()
                .expect("object");
            cl.api.publish(list, "DELETED", obj);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let r = loop {
            let r = c.sweep(pb::SweepRequest::default()).await.expect("Sweep").into_inner();
            if r.complete {
                break r;
            }
            assert!(
                Instant::now() < deadline,
                "node-gone never left the fleet: {r:#?}\n{}",
                cl.console.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(r.summary.contains("every node answered"), "{}", r.summary);
        assert!(r.missing_nodes.is_empty());
        // Its VolumeAttachment stays: a finding still, never dropped with the node.
        let dead =
            r.findings.iter().find(|f| f.kind == pb::FindingKind::DeadNodeWatcher as i32).expect("dead");
        assert_eq!(dead.nodes, ["node-gone"]);
        assert!(dead.detail.contains("no Node of the cluster any more"), "{}", dead.detail);
        let (code, out, err) = ctl(&cl, &agentctl, &["fleet", "sweep"]);
        assert_eq!(code, 2, "complete, with findings: {out}{err}");
        // Every node answers now, and still nothing says which node client.999 is on: unknown.
        let r = c.who_watches(nobody).await.expect("nobody").into_inner();
        assert!(!r.watchers[0].unfence_safe && r.watchers[0].answer == "unknown", "{r:#?}");
        let text = http_get(cl.console.metrics, "/metrics");
        assert!(text.contains("blockjanitor_console_sweep_complete 1"), "{text}");
    });
}

/// `agentctl fleet plan`: each node's plan through the console, summarised per node as `fleet
/// apply` shows its dry run, nothing changed; a refusal (or a node that cannot be asked) is shown
/// with its reason and exit 2. `fleet apply` refuses, clearly and before asking, what the fleet
/// budget cannot take.
#[test]
fn agentctl_fleet_plan_shows_each_nodes_plan_and_apply_shows_the_budgets_refusal() {
    rt().block_on(async {
        let cl = start_cluster_with(&["--fleet-steps-per-minute", "1"]).await;
        let audits = || apply_audits(cl.agent("node-old")).len();
        let before = audits();
        let (code, out, err) = ctl_as(&cl, "dashboard", &["fleet", "plan", "node-old"], "");
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.starts_with("node-old: 1 step(s)\n  rbd_unmap rbd4: "), "{out}");
        let (code, out, err) =
            ctl_as(&cl, "dashboard", &["fleet", "plan", "node-old/rbd4", "node-new/rbd0", "node-gone"], "");
        assert_eq!(code, 3, "unknown: node-gone's plan could not be had (worse than held): {out}{err}");
        assert!(out.contains("node-old: 1 step(s)"), "{out}");
        assert!(out.contains("node-new: REFUSED: rbd0: "), "{out}");
        assert!(out.contains("node-gone: REFUSED: its plan could not be had: "), "{out}");
        // The same table as `agentctl plan`: rbd0 is in use on node-new, held (2).
        let (code, out, err) = ctl_as(&cl, "dashboard", &["fleet", "plan", "node-new/rbd0"], "");
        assert_eq!(code, 2, "held: {out}{err}");
        let (code, out, err) = ctl_as(&cl, "dashboard", &["fleet", "plan", "node-old", "-o", "json"], "");
        assert_eq!(code, 0, "{err}");
        let v: Value = serde_json::from_str(&out).expect("json");
        assert_eq!(v["summary"][0]["node"], "node-old");
        assert_eq!(v["summary"][0]["steps"], 1);
        assert_eq!(v["summary"][0]["plans"]["plans"][0]["device"], "rbd4", "{v:#}");
        let (code, _, err) = ctl_as(&cl, "dashboard", &["fleet", "plan", "node-old/"], "");
        assert_eq!(code, 1);
        assert!(err.contains("is not NODE or NODE/DEVICE"), "{err}");
        assert_eq!(audits(), before, "a plan changes nothing");

        // The budget (1 step a minute): the first apply takes it (the agent, on a fixture tree,
        // then refuses to act); the next one is refused by the budget, saying why (exit 4).
        let (code, out, err) = ctl_as(&cl, "admin", &["fleet", "apply", "node-old/rbd4", "--yes"], "");
        assert_eq!(code, 4, "refused (FailedPrecondition, as the agent exits): {out}{err}");
        let (code, out, err) = ctl_as(&cl, "admin", &["fleet", "apply", "node-old/rbd4", "--yes"], "");
        assert_eq!(code, 4, "{out}{err}");
        assert!(out.contains("fleet budget: 0 of 1 steps left this minute"), "{out}");
        assert!(
            out.contains("REFUSED by the fleet budget: these 1 step(s) need more than the 0 of 1 steps left"),
            "{out}"
        );
        assert!(err.contains("nothing ran: REFUSED by the fleet budget"), "{err}");
        assert_eq!(audits(), before + 1, "only the first apply reached the agent");
    });
}

/// Issue 18: Where reads what it is given (an image in a rados namespace, a WWID as udev names
/// it, an IQN, an NQN) and refuses what it does not understand (INVALID_ARGUMENT naming what was
/// expected; agentctl exit 1), never an empty answer that reads as "nowhere".
#[test]
fn where_reads_every_identifier_form_and_refuses_what_it_does_not_understand() {
    rt().block_on(async {
        let (cl, mut c) = dashboard_cluster().await;
        let q = |query: &str| pb::WhereRequest { query: query.into(), ..Default::default() };
        // The multipath map of incident 3 by its udev name (wwn-0x<naa>) and its sysfs form.
        for form in ["wwn-0x618cf24100f8f457014a764c000001f6", "naa.618CF24100F8F457014A764C000001F6"] {
            let r = c.r#where(q(form)).await.expect(form).into_inner();
            assert!(r.resolved.starts_with("WWID 3618cf24100f8f457014a764c000001f6"), "{}", r.resolved);
            let want = vec![pair("node-free", "dm-12"), pair("node-free", "sdi"), pair("node-free", "sdj")];
            assert_eq!(devs(&r.matches), want, "{form}: {r:#?}");
        }
        let r = c.r#where(q("replicapool/tenants/csi-vol-1")).await.expect("namespaced").into_inner();
        assert_eq!(r.resolved, "rbd image replicapool/tenants/csi-vol-1");
        let r = c.r#where(q("iqn.2004-10.com.example:disk1")).await.expect("iqn").into_inner();
        assert_eq!(r.resolved, "iSCSI target iqn.2004-10.com.example:disk1");
        let r = c.r#where(q("nqn.2019-08.org.qemu:nvme-tcp-target")).await.expect("nqn").into_inner();
        assert_eq!(r.resolved, "NVMe subsystem nqn.2019-08.org.qemu:nvme-tcp-target");
        assert_eq!(r.missing_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["node-gone"]);

        for (req, want) in [
            (q("no-such-pv-or-wwid"), "expected an rbd image (pool/image or pool/namespace/image)"),
            (q(&format!("k8s/{IMAGE}@daily")), "names a snapshot"),
            (q("a/b/c/d"), "expected pool/image or pool/namespace/image"),
            (q("naa.61"), "is not a WWID"),
            (q("iqn.2004.com.example"), "is not an iSCSI name"),
            (pb::WhereRequest { image: "k8s".into(), ..Default::default() }, "no pool"),
            (pb::WhereRequest { wwid: "disk1".into(), ..Default::default() }, "is not a WWID"),
            (pb::WhereRequest { pvc: "shop".into(), ..Default::default() }, "expected NAMESPACE/NAME"),
            (pb::WhereRequest::default(), "give exactly one of"),
        ] {
            let e = c.r#where(req.clone()).await.expect_err("not understood");
            assert_eq!(e.code(), Code::InvalidArgument, "{req:?}: {e:?}");
            assert!(e.message().contains(want), "{req:?}: {}", e.message());
        }
        let (code, out, err) = ctl(&cl, &bin("agentctl"), &["fleet", "where", "no-such-pv-or-wwid"]);
        assert_eq!(code, 1, "{out}{err}");
        assert!(out.is_empty(), "{out}");
        assert!(err.contains("is not understood: expected an rbd image"), "{err}");
    });
}
