//! `explain` end to end on this host's real kernel (issue 35): a pod stuck in ContainerCreating
//! is explained from the stand-in API server (the pod, its events in both Event APIs, its PVC,
//! PV, VolumeAttachment and Nodes, in the real API's shapes) and two real agents, one per "node"
//! (each with its own kubelet directory: node-old's ties the device to the PV, node-new's is
//! empty), through the real console and `agentctl fleet explain`:
//!
//! - incident 5: the volume's loop device is held only by a private copy of its mount in another
//!   mount namespace, whose process sits in a cgroup named as kubelet names a pod's container
//!   (`pod<UID>/<container id>`), the pod node-old's node exporter; the diagnosis names node-old,
//!   the device, that pid, pod, container and mount namespace, the `release` command and the
//!   manifest fix; the release printed (run through the agent's socket) frees the device, and
//!   the same pod is then explained as attached to node-old with nothing there (incident 2);
//! - incident 2: attached to node-old (VolumeAttachment, volumesAttached) where the agent finds
//!   nothing: the VolumeAttachment to delete;
//! - node-old's agent stopped while its Node stays Ready: the last view with its age, exit 3,
//!   never fencing advice.

#[path = "support/schema.rs"]
#[allow(dead_code)]
mod schema;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use blockjanitor_tests::console::{bin, console_args, Console};
use blockjanitor_tests::daemon::{Daemon, Pki, ServerFiles};
use blockjanitor_tests::explanation::{cause, commands, fences};
use blockjanitor_tests::kube_mock::ApiServer;
use blockjanitor_tests::kube_objects::{
    ago, core_event, csi_pv, node_status, pod_object, pvc_object, volume_attachment, PodSpec,
};
use blockjanitor_tests::kube_reads::{EVENTS, PODS};
use blockjanitor_tests::*;
use serde_json::{json, Value};

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];
const DRIVER: &str = "hostpath.csi.k8s.io";
const HANDLE: &str = "6f1c2e9a-4b3d-11ef-9a71-5c2d8e4f6b10";
const PV: &str = "pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10";
const VA: &str = "csi-7d1b0c3e2f4a59687b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c";
const EXPORTER_UID: &str = "4b1e7c2a-9d3f-4e6b-8a1c-2f3e4d5c6b7a";
const EXPORTER_CID: &str = "9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b";
const SELECTOR: &str = "app.kubernetes.io/name=blockjanitor-agent";

fn unique() -> String {
    format!("kubernetes.io/csi/{DRIVER}^{HANDLE}")
}

/// A process moved into a cgroup named as kubelet names a pod's container (`pod<UID>/<ID>` in
/// the v1 `pids` hierarchy), so the agent reads that pod and container from
/// `/proc/PID/cgroup`; moved back and the cgroups removed on drop.
struct PodCgroup {
    dirs: Vec<PathBuf>,
    pid: u32,
}

impl PodCgroup {
    fn new(pid: u32, uid: &str, cid: &str) -> Self {
        let top = PathBuf::from(format!("/sys/fs/cgroup/pids/bj-explain-{}", std::process::id()));
        let pod = top.join(format!("pod{uid}"));
        let leaf = pod.join(cid);
        std::fs::create_dir_all(&leaf).expect("mkdir the pod's cgroup");
        std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).expect("move the holder into it");
        let me = PodCgroup { dirs: vec![leaf, pod, top], pid };
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        assert!(text.contains(&format!("pod{uid}/{cid}")), "{text}");
        me
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write("/sys/fs/cgroup/pids/cgroup.procs", self.pid.to_string());
        for d in &self.dirs {
            let deadline = Instant::now() + Duration::from_secs(5);
            while std::fs::remove_dir(d).is_err() && d.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// A port free on 127.0.0.2 and 127.0.0.3 (the agents' pod IPs share it, as pods share a
/// containerPort).
fn free_port() -> u16 {
    for _ in 0..50 {
        let l = std::net::TcpListener::bind("127.0.0.2:0").expect("bind 127.0.0.2");
        let port = l.local_addr().expect("addr").port();
        drop(l);
        if std::net::TcpListener::bind(format!("127.0.0.3:{port}")).is_ok() {
            return port;
        }
    }
    panic!("no port free on 127.0.0.2-3");
}

/// node-old's kubelet directory with the PV staged the pre-1.24 way; its globalmount.
fn staged(s: &Scratch) -> (PathBuf, PathBuf) {
    let kdir = s.mkdir("kubelet-old");
    let pv_dir = kdir.join(format!("plugins/kubernetes.io/csi/pv/{PV}"));
    let gm = pv_dir.join("globalmount");
    std::fs::create_dir_all(&gm).expect("mkdir globalmount");
    let vol_data = json!({"driverName": DRIVER, "specVolID": PV, "volumeHandle": HANDLE,
                          "attachmentID": VA, "nodeName": "node-old", "volumeLifecycleMode": "Persistent"});
    std::fs::write(pv_dir.join("vol_data.json"), vol_data.to_string()).expect("vol_data.json");
    (kdir, gm)
}

fn agent_pod(name: &str, node: &str, ip: &str) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "blockjanitor", "uid": format!("uid-{name}"), "resourceVersion": "50",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "labels": {"app.kubernetes.io/name": "blockjanitor-agent"}},
        "spec": {"nodeName": node, "hostPID": true, "containers": [{"name": "agent", "image": "blockjanitor-agent:0.1"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip}
    })
}

/// What the API serves: the stuck pod on node-new, node-old's node exporter (mounting
/// `kubelet_dir` from the host at the same path), the claim, PV, VolumeAttachment, Nodes and
/// the pod's events.
fn fill_api(api: &ApiServer, kubelet_dir: &Path, old_in_use: bool) {
    let stuck = PodSpec {
        name: "db-0",
        namespace: "shop",
        uid: "5e0f8c1d-2a3b-4c5d-8e9f-0a1b2c3d4e5f",
        node: "node-new",
        phase: "Pending",
        waiting: Some("ContainerCreating"),
        volumes: vec![json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-db-0"}})],
        containers: vec![("db", "")],
        mounts: vec![],
    };
    let kdir = kubelet_dir.to_str().expect("utf8");
    let exporter = PodSpec {
        name: "node-exporter-x7k2p",
        namespace: "monitoring",
        uid: EXPORTER_UID,
        node: "node-old",
        phase: "Running",
        waiting: None,
        volumes: vec![json!({"name": "kubelet-dir", "hostPath": {"path": kdir, "type": "Directory"}})],
        containers: vec![("node-exporter", EXPORTER_CID)],
        mounts: vec![("kubelet-dir", kdir)],
    };
    let pod_ref = ("Pod", "shop", "db-0", "5e0f8c1d-2a3b-4c5d-8e9f-0a1b2c3d4e5f");
    let multi = format!(
        "Multi-Attach error for volume \"{PV}\" Volume is already exclusively attached to one node and can't be attached to another"
    );
    let failed_mount =
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data]: timed out waiting for the condition";
    let u = unique();
    let in_use: Vec<&str> = if old_in_use { vec![u.as_str()] } else { vec![] };
    let mut st = api.state.lock().expect("state");
    st.lists.insert(PODS, vec![pod_object(&stuck), pod_object(&exporter)]);
    st.lists.insert(
        EVENTS,
        vec![
            core_event(pod_ref, ("FailedAttachVolume", &multi), "attachdetach-controller", 7, &ago(300)),
            core_event(pod_ref, ("FailedMount", failed_mount), "kubelet", 3, &ago(150)),
        ],
    );
    st.lists.insert(
        "/api/v1/namespaces/blockjanitor/pods",
        vec![
            agent_pod("blockjanitor-agent-x7k2p", "node-old", "127.0.0.2"),
            agent_pod("blockjanitor-agent-m3q9d", "node-new", "127.0.0.3"),
        ],
    );
    st.lists.insert(
        "/api/v1/nodes",
        vec![
            node_status("node-old", "10.0.0.2", "True", &[&u], &in_use),
            node_status("node-new", "10.0.0.3", "True", &[], &[]),
        ],
    );
    st.lists.insert(
        "/api/v1/persistentvolumes",
        vec![csi_pv(PV, DRIVER, HANDLE, json!({}), ("shop", "data-db-0"))],
    );
    st.lists.insert("/api/v1/persistentvolumeclaims", vec![pvc_object("shop", "data-db-0", PV)]);
    let mut va = volume_attachment(VA, "node-old", PV, true, 95);
    va["spec"]["attacher"] = json!(DRIVER);
    st.lists.insert("/apis/storage.k8s.io/v1/volumeattachments", vec![va]);
}

/// The console, two real agents and the API.
struct Scene {
    // Drop order: the console, the agents, then the API and the scratch directory.
    console: Console,
    old: Daemon,
    _new: Daemon,
    _api: ApiServer,
    pki: Pki,
    s: Scratch,
}

fn agent(dir: &Path, node: &str, listen: &str, tls: &ServerFiles, kubelet: &Path) -> Daemon {
    let k = kubelet.to_str().expect("utf8");
    Daemon::start_tls(
        dir,
        &[],
        listen,
        tls,
        &[
            "--tls-console",
            "console",
            "--node-name",
            node,
            "--kubelet-dir",
            k,
            "--grace-period",
            "0",
            "--rescan-interval",
            "1",
        ],
    )
}

impl Scene {
    async fn start(s: Scratch, kubelet_old: &Path, old_in_use: bool) -> Scene {
        let pki = Pki::new("blockjanitor explain test CA");
        let tls = pki.write_server(s.dir.path());
        let port = free_port();
        let old = agent(&s.mkdir("agent-old"), "node-old", &format!("127.0.0.2:{port}"), &tls, kubelet_old);
        let new = agent(
            &s.mkdir("agent-new"),
            "node-new",
            &format!("127.0.0.3:{port}"),
            &tls,
            &s.mkdir("kubelet-new"),
        );
        let api = ApiServer::start(json!(null)).await;
        fill_api(&api, kubelet_old, old_in_use);
        let (port, url) = (port.to_string(), api.url());
        let args = console_args(
            &s,
            &pki,
            &tls,
            &[
                "--namespace",
                "blockjanitor",
                "--selector",
                SELECTOR,
                "--agent-port",
                &port,
                "--kube-url",
                &url,
                "--call-timeout-ms",
                "2000",
                "--connect-timeout-ms",
                "1000",
                "--backoff-max-seconds",
                "1",
            ],
        );
        let console = Console::start(&args);
        Scene { console, old, _new: new, _api: api, pki, s }
    }

    /// `agentctl fleet ARGS` against the console as the viewer `dashboard`.
    fn ctl(&self, args: &[&str]) -> (i32, String, String) {
        let pem = self.pki.issue("dashboard", &["dashboard"]);
        let (c, k, ca) = (self.s.path("dashboard.crt"), self.s.path("dashboard.key"), self.s.path("ca.crt"));
        std::fs::write(&c, pem.cert).expect("cert");
        std::fs::write(&k, pem.key).expect("key");
        let out = Command::new(bin("agentctl"))
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
            .arg(&c)
            .arg("--key")
            .arg(&k)
            .arg("--ca")
            .arg(&ca)
            .stdin(Stdio::null())
            .output()
            .expect("agentctl");
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    /// `explain ARGS -o json`, checked against the schema; its exit code and document.
    fn explain(&self, args: &[&str]) -> (i32, Value) {
        let mut all = vec!["explain"];
        all.extend_from_slice(args);
        all.extend(["-o", "json"]);
        let (code, out, err) = self.ctl(&all);
        let v: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("explain {args:?} ({e}): {err}{out}"));
        schema::Schema::load().check(&v, "explanation", "agentctl fleet explain -o json");
        (code, v)
    }

    /// Waits until `ok` holds for the explanation of pod shop/db-0 (bounded), returning it.
    fn explain_until(&self, what: &str, ok: impl Fn(&Value) -> bool) -> (i32, Value) {
        let deadline = Instant::now() + Duration::from_secs(40);
        loop {
            let (code, v) = self.explain(&["pod/db-0", "-n", "shop"]);
            if ok(&v) {
                return (code, v);
            }
            assert!(Instant::now() < deadline, "{what}: never so:\n{v:#}\n{}", self.console.log_text());
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Incident 5, then 2: see the module docs.
#[test]
fn root_explain_incident5_names_the_private_copy_its_pod_and_the_release_then_incident2() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let (kdir, gm) = staged(&s);
    let (host_mount, lo) = s.loop_mount("vol.img", &gm);
    let holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&gm)), "the namespace copied the mount");
    let _cgroup = PodCgroup::new(holder.pid(), EXPORTER_UID, EXPORTER_CID);
    host_mount.umount();
    let dev = lo.name().to_owned();
    rt().block_on(async {
        let sc = Scene::start(s, &kdir, true).await;
        let (code, v) = sc.explain_until("incident 5", |v| cause(v) == "private_mount_copy");
        let d = &v["diagnosis"];
        assert_eq!((code, v["outcome"].as_str()), (2, Some("blocked")), "{v:#}");
        assert_eq!(
            (d["node"].as_str(), d["device"].as_str()),
            (Some("node-old"), Some(dev.as_str())),
            "{v:#}"
        );
        let h = &d["holders"][0];
        assert_eq!(h["pid"], holder.pid(), "{v:#}");
        assert_eq!((h["command"].as_str(), h["kind"].as_str()), (Some("sleep"), Some("mount")));
        assert_eq!(
            (h["pod"].as_str(), h["container"].as_str()),
            (Some("monitoring/node-exporter-x7k2p"), Some("node-exporter"))
        );
        assert_eq!(
            (h["mount_namespace"].as_u64(), h["in_host_namespace"].as_bool()),
            (Some(holder.ns_inode()), Some(false))
        );
        let cmds = commands(&v);
        assert_eq!(
            cmds[0],
            format!("kubectl -n blockjanitor exec blockjanitor-agent-x7k2p -- agentctl release {dev}")
        );
        assert_eq!(cmds[1], format!("{} --apply", cmds[0]));
        let fix = d["next"]
            .as_array()
            .expect("next")
            .iter()
            .find(|a| a["manifest"].as_str().is_some_and(|m| !m.is_empty()));
        let manifest = fix.expect("the manifest fix")["manifest"].as_str().unwrap_or("").to_owned();
        assert!(
            manifest.contains("- name: node-exporter")
                && manifest.contains("- name: kubelet-dir")
                && manifest.contains(&format!("mountPath: {}", kdir.display()))
                && manifest.contains("mountPropagation: HostToContainer"),
            "{manifest}"
        );
        assert!(!fences(&v), "node-old answers: {v:#}");
        // Its events, from both APIs, each once; the volume node by node.
        let reasons: Vec<&str> =
            v["events"].as_array().expect("events").iter().filter_map(|e| e["reason"].as_str()).collect();
        assert_eq!(reasons, ["FailedMount", "FailedAttachVolume"], "newest first, once each: {v:#}");
        let vol = &v["volumes"][0];
        assert_eq!(
            (vol["pvc"].as_str(), vol["pv"].as_str(), vol["driver"].as_str()),
            (Some("shop/data-db-0"), Some(PV), Some(DRIVER))
        );
        let nodes: Vec<&str> =
            vol["nodes"].as_array().expect("nodes").iter().filter_map(|n| n["node"].as_str()).collect();
        assert_eq!(nodes, ["node-new", "node-old"], "{vol:#}");
        // The same from the claim and from the PV, and as a table.
        let pv_arg = format!("pv/{PV}");
        for args in [vec!["pvc/data-db-0", "-n", "shop"], vec![pv_arg.as_str()]] {
            let (code, v) = sc.explain(&args);
            assert_eq!(
                (code, cause(&v), v["pod"]["name"].as_str()),
                (2, "private_mount_copy", Some("db-0")),
                "{args:?}: {v:#}"
            );
        }
        // The README's commands, as written (the plugin's arguments are agentctl fleet's).
        let block = blockjanitor_tests::readme::sh_block("A stuck pod: `kubectl blockjanitor explain`");
        let readme = blockjanitor_tests::readme::commands(&block);
        assert_eq!(readme.len(), 3, "{block}");
        for line in readme {
            let words: Vec<&str> = line.split('#').next().unwrap_or("").split_whitespace().collect();
            assert_eq!(words[..2], ["kubectl", "blockjanitor"], "{line}");
            let (code, out, err) = sc.ctl(&words[2..]);
            assert_eq!(code, 2, "{line}: blocked: {err}{out}");
            let doc: Option<Value> = match words.iter().position(|w| *w == "-o").map(|i| words[i + 1]) {
                Some("json") => Some(serde_json::from_str(&out).expect("JSON")),
                Some("yaml") => Some(serde_yaml_ng::from_str(&out).expect("YAML")),
                _ => None,
            };
            if let Some(doc) = doc {
                schema::Schema::load().check(&doc, "explanation", line);
                assert_eq!(cause(&doc), "private_mount_copy", "{line}");
            } else {
                assert!(out.contains("BLOCKED: "), "{line}: {out}");
            }
        }
        let (code, table, err) = sc.ctl(&["explain", "pod/db-0", "-n", "shop"]);
        assert_eq!(code, 2, "{err}{table}");
        assert!(
            table.starts_with("pod shop/db-0 on node-new: Pending (ContainerCreating)\n\nBLOCKED: "),
            "{table}"
        );
        eprintln!("--- agentctl fleet explain pod/db-0 -n shop (incident 5) ---\n{table}");

        // The release printed, run where it says (the agent on node-old), frees the device.
        let ctl = |args: &[&str]| {
            Command::new(bin("agentctl"))
                .arg("--socket")
                .arg(&sc.old.socket)
                .args(args)
                .output()
                .expect("agentctl")
        };
        let dry = ctl(&["release", &dev]);
        assert_eq!(
            dry.status.code(),
            Some(0),
            "the dry run may go: {}{}",
            text(&dry.stdout),
            text(&dry.stderr)
        );
        let done = ctl(&["release", &dev, "--apply"]);
        assert_eq!(done.status.code(), Some(0), "{}{}", text(&done.stdout), text(&done.stderr));
        assert!(wait_until(Duration::from_secs(10), || !holder.has_mount(&gm)), "the copy is released");
        // Nothing on node-old now, the VolumeAttachment still there: incident 2.
        let (code, v) = sc.explain_until("after the release", |v| cause(v) == "attached_not_in_use");
        assert_eq!(
            (code, v["diagnosis"]["node"].as_str(), v["diagnosis"]["device"].as_str()),
            (2, Some("node-old"), Some("")),
            "{v:#}"
        );
        assert!(
            commands(&v).contains(&format!("kubectl delete volumeattachment {VA} --dry-run=server")),
            "{v:#}"
        );
    });
}

#[test]
fn root_explain_incident2_attached_to_a_node_that_finds_nothing_names_the_va_to_delete() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let (kdir, _gm) = staged(&s);
    rt().block_on(async {
        let sc = Scene::start(s, &kdir, false).await;
        let (code, v) = sc.explain_until("incident 2", |v| cause(v) == "attached_not_in_use");
        let d = &v["diagnosis"];
        assert_eq!(
            (code, d["node"].as_str(), d["device"].as_str()),
            (2, Some("node-old"), Some("")),
            "{v:#}"
        );
        assert_eq!(commands(&v), [format!("kubectl delete volumeattachment {VA} --dry-run=server")], "{v:#}");
        let evidence = d["evidence"].to_string();
        assert!(
            evidence.contains(&format!("node node-old: VolumeAttachment {VA} attached=true")),
            "{evidence}"
        );
        assert!(
            evidence.contains("lists the volume in volumesAttached and does not list it in volumesInUse"),
            "{evidence}"
        );
        assert!(
            evidence.contains("node node-old: its agent answers and finds no device of the volume"),
            "{evidence}"
        );
        assert!(!fences(&v), "{v:#}");
        let (_, table, _) = sc.ctl(&["explain", "pod/db-0", "-n", "shop"]);
        eprintln!("--- agentctl fleet explain pod/db-0 -n shop (incident 2) ---\n{table}");
    });
}

/// node-old's agent stops while its Node stays Ready: not believed dead, so the answer is
/// "unknown" from its last view, with its age; never fencing advice.
#[test]
fn root_explain_a_node_that_does_not_answer_is_explained_from_its_last_view_with_its_age() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let (kdir, gm) = staged(&s);
    let (host_mount, lo) = s.loop_mount("vol.img", &gm);
    let holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&gm)));
    host_mount.umount();
    let dev = lo.name().to_owned();
    rt().block_on(async {
        let mut sc = Scene::start(s, &kdir, true).await;
        sc.explain_until("the scene", |v| cause(v) == "private_mount_copy");
        sc.old.stop();
        let (code, v) = sc.explain_until("node-old down", |v| cause(v) == "unknown");
        assert_eq!((code, v["outcome"].as_str()), (3, Some("unknown")), "{v:#}");
        let missing = &v["missing_nodes"][0];
        assert_eq!(missing["node"], "node-old", "{v:#}");
        assert!(missing["reason"].as_str().is_some_and(|r| r.contains("its last view is")), "{v:#}");
        let evidence = v["diagnosis"]["evidence"].to_string();
        assert!(
            evidence.contains(&format!("node node-old: {dev} (loop, verdict"))
                && evidence.contains("as last seen"),
            "{evidence}"
        );
        assert!(evidence.contains("its Node is Ready"), "{evidence}");
        let old = v["volumes"][0]["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["node"] == "node-old")
            .cloned()
            .expect("node-old");
        assert_eq!(
            (old["liveness"]["agent_answers"].as_bool(), old["liveness"]["believed_dead"].as_bool()),
            (Some(false), Some(false))
        );
        assert!(old["liveness"]["view_age_seconds"].as_f64().is_some_and(|a| a > 0.0), "{old:#}");
        assert!(!fences(&v), "a Ready node is never fenced: {v:#}");
        let (code, table, _) = sc.ctl(&["explain", "pod/db-0", "-n", "shop"]);
        assert_eq!(code, 3, "{table}");
        assert!(table.contains("not answering now (explained from their last view):"), "{table}");
    });
}
