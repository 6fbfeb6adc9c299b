//! `explain` for the rbd incidents (issue 35) against a real Ceph cluster and Debian's kernel
//! client: the qemu guest is node-old (it maps the image, mounts it, a process keeps its working
//! directory on it, and a real agent serves it through qemu's hostfwd); node-new, where the pod
//! waits, is a real agent on this host; the stand-in API server serves the pod, its events, PVC,
//! ceph-csi PV, VolumeAttachment and Nodes; the console and agentctl run in the cluster's network
//! namespace (tests/ceph/README.md: nothing leaves the machine).
//!
//! - incident 1: node-old still maps the image and a process holds it: the diagnosis names
//!   node-old, the device, the process (pid, command) and the next commands;
//! - incident 4: node-old's Node goes NotReady while its agent still heartbeats: no fencing advice
//!   (the machine runs); then its agent is killed: node-old is believed dead, and the dead-node
//!   advice fences exactly its client instance (run here as printed: the cluster's watcher goes),
//!   with the NetworkFence and the out-of-service taint, each with its warning.

#[path = "support/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use blockjanitor_tests::ceph::{ack, require_ceph, wait_handshake, Cluster, NsApi, Proc};
use blockjanitor_tests::console::{bin, Console, ConsoleFiles};
use blockjanitor_tests::daemon::{Daemon, Pki};
use blockjanitor_tests::explanation::{cause, commands, fences};
use blockjanitor_tests::kube_objects::{
    ago, core_event, csi_pv, node_status, pod_object, pvc_object, volume_attachment, PodSpec,
};
use blockjanitor_tests::kube_reads::{EVENTS, PODS};
use blockjanitor_tests::netns::NetNs;
use blockjanitor_tests::{serial, text};
use serde_json::{json, Value};

/// qemu's port (127.0.0.1 of the cluster's namespace) for the guest agent's 9443.
const AGENT_PORT: u16 = 19445;
const PV: &str = "pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10";
const HANDLE: &str = "0001-0009-rook-ceph-0000000000000002-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10";
const VA: &str = "csi-2b4c6d8e0f1a3b5c7d9e1f2a4b6c8d0e2f4a6b8c0d2e4f6a8b0c2d4e6f8a0b2c";

fn unique() -> String {
    format!("kubernetes.io/csi/rbd.csi.ceph.com^{HANDLE}")
}

/// node-old with `ip` (its kernel client's address as Ceph sees it) and its Ready condition.
fn node_old(ip: &str, ready: &str) -> Value {
    node_status("node-old", ip, ready, &[&unique()], &[&unique()])
}

/// The pod db-0 waiting on node-new for the image `pool/image`, and everything around it.
fn fill_api(
    api: &blockjanitor_tests::kube_mock::ApiServer,
    ip: &str,
    (pool, image, fsid): (&str, &str, &str),
) {
    let pod = PodSpec {
        name: "db-0",
        namespace: "shop",
        uid: "8a1c2f3e-4d5c-4b7a-9e1f-0a2b3c4d5e6f",
        node: "node-new",
        phase: "Pending",
        waiting: Some("ContainerCreating"),
        volumes: vec![json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}})],
        containers: vec![("db", "")],
        mounts: vec![],
    };
    let r = ("Pod", "shop", "db-0", "8a1c2f3e-4d5c-4b7a-9e1f-0a2b3c4d5e6f");
    let multi = format!("Multi-Attach error for volume \"{PV}\" Volume is already exclusively attached to one node and can't be attached to another");
    let still = format!("MountVolume.MountDevice failed for volume \"{PV}\" : rpc error: code = Internal desc = rbd image {pool}/{image} is still being used");
    let mut st = api.state.lock().expect("state");
    st.lists.insert(PODS, vec![pod_object(&pod)]);
    st.lists.insert(
        EVENTS,
        vec![
            core_event(r, ("FailedAttachVolume", &multi), "attachdetach-controller", 4, &ago(300)),
            core_event(r, ("FailedMount", &still), "kubelet", 2, &ago(150)),
        ],
    );
    st.lists.insert(
        "/api/v1/nodes",
        vec![node_old(ip, "True"), node_status("node-new", "10.0.2.16", "True", &[], &[])],
    );
    let attrs = json!({"clusterID": fsid, "pool": pool, "imageName": image, "imageFeatures": "layering",
                       "journalPool": pool, "storage.kubernetes.io/csiProvisionerIdentity": "1730000000000-8081-rbd.csi.ceph.com"});
    st.lists.insert(
        "/api/v1/persistentvolumes",
        vec![csi_pv(PV, "rbd.csi.ceph.com", HANDLE, attrs, ("shop", "data-db-0"))],
    );
    st.lists.insert("/api/v1/persistentvolumeclaims", vec![pvc_object("shop", "data-db-0", PV)]);
    st.lists.insert(
        "/apis/storage.k8s.io/v1/volumeattachments",
        vec![volume_attachment(VA, "node-old", PV, true, 95)],
    );
}

/// The scene: the cluster, the guest (node-old), node-new's agent, the API, the console.
struct Scene {
    // Drop order: the console, node-new's agent, the guest, the API, then the cluster.
    console: Console,
    _new: Daemon,
    guest: Proc,
    api: NsApi,
    cluster: Cluster,
    share: PathBuf,
    out: PathBuf,
    viewer: (PathBuf, PathBuf, PathBuf),
    /// The guest's mapping: device, client id, client address, the holder's pid.
    mapping: (String, String, String, u32),
    /// node-old's address: its kernel client's IP as the cluster sees it (qemu's user
    /// networking makes the guest's connections from the namespace's address).
    ip: String,
}

impl Scene {
    fn start() -> Scene {
        let t0 = Instant::now();
        let cluster = Cluster::up();
        cluster.image(&["create", "vol", "64"]);
        let env = cluster.script("cluster.sh", &["env"]);
        let var = |k: &str| {
            env.lines()
                .find_map(|l| l.trim().strip_prefix(&format!("export {k}=")))
                .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_owned())
                .unwrap_or_else(|| panic!("no {k} in cluster.sh env"))
        };
        let (pool, fsid) = (var("BJ_CEPH_POOL"), var("BJ_CEPH_FSID"));
        let top = cluster.dir.path().to_owned();
        let (extra, share, host) = cluster.guest_dirs();
        let pki = Pki::new("blockjanitor ceph explain CA");
        std::fs::create_dir_all(extra.join("tls")).expect("mkdir tls");
        pki.write_server(&extra.join("tls"));
        let files = ConsoleFiles::write(&pki, &host);
        let pem = pki.issue("dashboard", &["dashboard"]);
        let viewer = (host.join("dashboard.crt"), host.join("dashboard.key"), files.ca.clone());
        std::fs::write(&viewer.0, pem.cert).expect("cert");
        std::fs::write(&viewer.1, pem.key).expect("key");

        let out = top.join("guest.out");
        let guest = cluster.start_rbd_guest("rbd-explain.sh", AGENT_PORT, 400);
        let api = NsApi::start(&cluster.netns, json!(null));
        let ns = cluster.netns.clone();
        let new_dir = top.join("agent-new");
        std::fs::create_dir_all(new_dir.join("kubelet")).expect("mkdir");
        let kubelet = new_dir.join("kubelet").to_string_lossy().into_owned();
        let new = Daemon::start_tls_configured(
            &new_dir,
            &[],
            "127.0.0.1:0",
            &files.server(),
            &[
                "--tls-console",
                "console",
                "--node-name",
                "node-new",
                "--kubelet-dir",
                &kubelet,
                "--grace-period",
                "0",
            ],
            |cmd| NetNs::enter_named_command(&ns, cmd),
        );
        let mut guest = guest;
        let mapped = wait_handshake(&share, "mapped", &mut guest, &out, 240);
        let w: Vec<&str> = mapped.split_whitespace().collect();
        assert_eq!(w.len(), 4, "rbdN client.N ADDR PID: {mapped}");
        let mapping = (w[0].to_owned(), w[1].to_owned(), w[2].to_owned(), w[3].parse().expect("pid"));
        let ip = mapping.2.split(':').next().unwrap_or_default().to_owned();
        eprintln!("guest mapped in {:.1} s: {mapped}", t0.elapsed().as_secs_f64());
        fill_api(&api.api, &ip, (&pool, "vol", &fsid));
        let mut args = files.args("dashboard");
        let agents =
            format!("node-old=https://127.0.0.1:{AGENT_PORT},node-new=https://{}", new.tcp.expect("tcp"));
        let api_url = api.api.url();
        args.extend(
            [
                "--agents",
                &agents,
                "--kube-url",
                &api_url,
                "--call-timeout-ms",
                "5000",
                "--connect-timeout-ms",
                "2000",
                "--backoff-max-seconds",
                "1",
                "--keepalive-interval-ms",
                "1000",
                "--keepalive-timeout-ms",
                "2000",
            ]
            .map(String::from),
        );
        let console = Console::start_command(cluster.command(&bin("blockjanitor-console")), &args, None);
        Scene { console, _new: new, guest, api, cluster, share, out, viewer, mapping, ip }
    }

    /// `agentctl fleet ARGS` in the cluster's namespace, as the viewer `dashboard`.
    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let (c, k, ca) = &self.viewer;
        let o = self
            .cluster
            .command(&bin("agentctl"))
            .arg("fleet")
            .args(args)
            .args([
                "--console",
                &self.console.tcp.to_string(),
                "--server-name",
                "localhost",
                "--timeout",
                "20",
            ])
            .arg("--cert")
            .arg(c)
            .arg("--key")
            .arg(k)
            .arg("--ca")
            .arg(ca)
            .stdin(Stdio::null())
            .output()
            .expect("agentctl");
        (o.status.code().unwrap_or(-1), text(&o.stdout), text(&o.stderr))
    }

    /// The explanation of pod shop/db-0 once `ok` holds (bounded): exit code and document.
    fn explain_until(&self, what: &str, ok: impl Fn(&Value) -> bool) -> (i32, Value) {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let (code, o, e) = self.ctl(&["explain", "pod/db-0", "-n", "shop", "-o", "json"]);
            if let Ok(v) = serde_json::from_str::<Value>(&o) {
                schema::Schema::load().check(&v, "explanation", "agentctl fleet explain -o json");
                if ok(&v) {
                    return (code, v);
                }
                assert!(Instant::now() < deadline, "{what}: never so:\n{v:#}\n{}", self.console.log_text());
            } else {
                assert!(Instant::now() < deadline, "{what}: {e}{o}\n{}", self.console.log_text());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn table(&self) -> String {
        let (_, t, e) = self.ctl(&["explain", "pod/db-0", "-n", "shop"]);
        format!("{t}{e}")
    }

    /// Acks the guest's last handshake with "done" and waits for it to end well.
    fn finish(mut self, name: &str) {
        ack(&self.share, name, "done");
        let deadline = Instant::now() + Duration::from_secs(120);
        let code = loop {
            if let Some(s) = self.guest.0.try_wait().expect("wait guest") {
                break s.code();
            }
            assert!(Instant::now() < deadline, "the guest did not finish");
            std::thread::sleep(Duration::from_millis(100));
        };
        let output = std::fs::read_to_string(&self.out).unwrap_or_default();
        assert_eq!(code, Some(0), "guest scenario failed:\n{output}");
        assert!(output.contains("OK"), "{output}");
    }
}

/// Incident 1: see the module docs.
#[test]
fn root_ceph_explain_incident1_names_the_old_node_its_device_and_the_process_holding_it() {
    if !require_ceph() {
        return;
    }
    let _serial = serial();
    let sc = Scene::start();
    let (dev, id, addr, pid) = sc.mapping.clone();
    let (code, v) = sc.explain_until("incident 1", |v| cause(v) == "held_elsewhere");
    let d = &v["diagnosis"];
    assert_eq!(
        (code, d["node"].as_str(), d["device"].as_str()),
        (2, Some("node-old"), Some(dev.as_str())),
        "{v:#}"
    );
    let h = d["holders"]
        .as_array()
        .expect("holders")
        .iter()
        .find(|h| h["pid"] == pid)
        .unwrap_or_else(|| panic!("pid {pid}: {v:#}"));
    assert_eq!(
        (h["command"].as_str(), h["kind"].as_str(), h["in_host_namespace"].as_bool()),
        (Some("sleep"), Some("cwd"), Some(true))
    );
    let cmds = commands(&v);
    assert!(
        cmds[0].starts_with("kubectl debug node/node-old")
            && cmds[0].ends_with(&format!("ps -o pid,args -p {pid}")),
        "{cmds:?}"
    );
    assert!(cmds.contains(&format!("kubectl blockjanitor plan node-old/{dev}")), "{cmds:?}");
    assert!(!fences(&v), "node-old answers: {v:#}");
    let vol = &v["volumes"][0];
    assert_eq!(vol["identity"][0], "rbd image k8s/vol", "{vol:#}");
    let old =
        vol["nodes"].as_array().expect("nodes").iter().find(|n| n["node"] == "node-old").expect("node-old");
    let rbd = &old["devices"][0]["device"]["rbd"];
    assert_eq!(
        (rbd["client_id"].as_str(), rbd["client_addr"].as_str()),
        (Some(id.as_str()), Some(addr.as_str())),
        "{old:#}"
    );
    // The cluster's own watcher is that client.
    let status = sc.cluster.image(&["status", "vol"]);
    assert!(status.contains(&format!("watcher={addr} {id}")), "{status}");
    eprintln!("--- agentctl fleet explain pod/db-0 -n shop (incident 1) ---\n{}", sc.table());
    sc.finish("mapped");
}

/// Incident 4: see the module docs.
#[test]
fn root_ceph_explain_incident4_fences_the_dead_nodes_exact_client_never_a_live_one() {
    if !require_ceph() {
        return;
    }
    let _serial = serial();
    let mut sc = Scene::start();
    let (dev, id, addr, _pid) = sc.mapping.clone();
    assert!(sc.cluster.image(&["status", "vol"]).contains(&format!("watcher={addr} {id}")));
    sc.explain_until("node-old synced", |v| cause(v) == "held_elsewhere");
    // The kubelet stops posting: the Node goes NotReady, the agent still heartbeats.
    sc.api.api.publish("/api/v1/nodes", "MODIFIED", node_old(&sc.ip, "Unknown"));
    let (code, v) = sc.explain_until("NotReady, agent alive", |v| {
        v["diagnosis"]["evidence"].to_string().contains("NotReady")
    });
    assert_eq!((code, cause(&v)), (2, "held_elsewhere"), "{v:#}");
    assert!(!fences(&v), "its agent still answers: never fenced: {v:#}");
    assert!(
        v["diagnosis"]["evidence"].to_string().contains("its agent still answers: the machine runs"),
        "{v:#}"
    );
    eprintln!(
        "--- agentctl fleet explain pod/db-0 -n shop (NotReady, agent heartbeating) ---\n{}",
        sc.table()
    );

    // The agent dies with the node: believed dead, the dead-node advice.
    ack(&sc.share, "mapped", "stop");
    let (guest, share, out) = (&mut sc.guest, sc.share.clone(), sc.out.clone());
    wait_handshake(&share, "stopped", guest, &out, 120);
    let (code, v) = sc.explain_until("node-old dead", |v| cause(v) == "dead_node");
    let d = &v["diagnosis"];
    assert_eq!(
        (code, d["node"].as_str(), d["device"].as_str()),
        (2, Some("node-old"), Some(dev.as_str())),
        "{v:#}"
    );
    let cmds = commands(&v);
    assert_eq!(cmds[0], format!("ceph osd blocklist add {addr}"), "the exact instance, never the IP: {v:#}");
    let note = d["next"][0]["note"].as_str().unwrap_or("");
    assert!(note.contains("expires after one hour") && note.contains("not the whole IP"), "{note}");
    let fence = d["next"]
        .as_array()
        .expect("next")
        .iter()
        .find(|a| a["manifest"].as_str().is_some_and(|m| m.contains("kind: NetworkFence")))
        .expect("NetworkFence");
    let manifest = fence["manifest"].as_str().unwrap_or("");
    assert!(
        manifest.contains(&format!("- {}/32", sc.ip))
            && manifest.contains("driver: rbd.csi.ceph.com")
            && manifest.contains("fenceState: Fenced"),
        "{manifest}"
    );
    assert!(fence["note"].as_str().is_some_and(
        |n| n.contains("set fenceState: Unfenced") && n.contains("deleting it alone does not unfence")
    ));
    assert!(
        cmds.contains(
            &"kubectl taint nodes node-old node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"
                .to_owned()
        ),
        "{cmds:?}"
    );
    let why = d["evidence"].to_string();
    assert!(
        why.contains("has not answered since")
            && why.contains("its Node is NotReady (Ready=Unknown)")
            && why.contains("nothing of it answers"),
        "{why}"
    );
    assert_eq!(v["missing_nodes"][0]["node"], "node-old", "{v:#}");
    eprintln!("--- agentctl fleet explain pod/db-0 -n shop (incident 4) ---\n{}", sc.table());

    // The fence as printed: the cluster drops exactly that watcher.
    assert!(sc.cluster.image(&["watchers", "vol"]).contains(&addr));
    let printed = cmds[0].strip_prefix("ceph osd blocklist add ").expect("the command");
    sc.cluster.image(&["blocklist-add", printed]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while sc.cluster.image(&["watchers", "vol"]).contains(&addr) {
        assert!(Instant::now() < deadline, "the watcher {addr} is still there");
        std::thread::sleep(Duration::from_millis(300));
    }
    let listed = sc.cluster.image(&["blocklist-ls"]);
    assert!(
        listed.contains(&addr) && !listed.contains(&format!("{}:0/0", sc.ip)),
        "exactly that instance: {listed}"
    );
    // Unfencing it is not safe: node-old, dead, still maps it as last seen.
    let (code, o, e) = sc.ctl(&["who-watches", &addr, "-o", "json"]);
    assert_eq!(code, 0, "{e}");
    let w: Value = serde_json::from_str(&o).expect("json");
    assert_eq!(
        (w["watchers"][0]["answer"].as_str(), w["watchers"][0]["unfence_safe"].as_bool()),
        (Some("no"), Some(false)),
        "{w:#}"
    );
    sc.finish("stopped");
}
