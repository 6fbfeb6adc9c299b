//! The daemon half of `pin_risks.rs`: a real agent on this host reporting to the stand-in
//! API server, and the console following it (see that file's module doc).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor_tests::console::{bin, Console, ConsoleFiles};
use blockjanitor_tests::daemon::{Daemon, Pki};
use blockjanitor_tests::http::http_get;
use blockjanitor_tests::kube_mock::{ApiServer, NODE, OTHER_PV, PV};
use blockjanitor_tests::kube_objects::{node_object, ready_only};
use blockjanitor_tests::{rt, sh, text, utf8, wait_until, LoopDev, Scratch};
use k8s_openapi::api::core::v1::Event;
use serde_json::{json, Value};

use super::schema::Schema;
use super::{pod_namespace, risk_of, Node};

const EXPORTER_UID: &str = "6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b";
const EXPORTER_CID: &str = "3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
const EXPORTER: &str = "node-exporter-x7k2p";

/// node_exporter's pod as the API server has it: the host root (here its stand-in) at /host
/// without mountPropagation, running in a container whose ID its cgroup shows.
fn exporter_pod(host: &Path) -> Value {
    json!({
        "metadata": {"name": EXPORTER, "namespace": "monitoring", "uid": EXPORTER_UID, "resourceVersion": "51"},
        "spec": {
            "nodeName": NODE,
            "containers": [{"name": "node-exporter", "image": "quay.io/prometheus/node-exporter:v1.8.2",
                            "volumeMounts": [{"name": "root", "mountPath": "/host", "readOnly": true}]}],
            "volumes": [{"name": "root", "hostPath": {"path": utf8(host)}}]
        },
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "node-exporter", "ready": true, "restartCount": 0,
            "image": "quay.io/prometheus/node-exporter:v1.8.2", "imageID": "quay.io/prometheus/node-exporter@sha256:00",
            "containerID": format!("containerd://{EXPORTER_CID}")}]}
    })
}

/// A pod's cgroup (cgroupfs driver, cgroup v2) holding a process; the process moved back to the
/// root and the cgroups removed on drop.
struct PodCgroup {
    root: PathBuf,
    dirs: Vec<PathBuf>,
}

impl PodCgroup {
    fn new(pid: u32) -> Self {
        let unified = Path::new("/sys/fs/cgroup/unified");
        let root = if unified.join("cgroup.procs").exists() { unified } else { Path::new("/sys/fs/cgroup") };
        let pod = root.join(format!("kubepods/burstable/pod{EXPORTER_UID}"));
        let container = pod.join(EXPORTER_CID);
        std::fs::create_dir_all(&container).expect("mkdir cgroup");
        std::fs::write(container.join("cgroup.procs"), pid.to_string()).expect("move into the pod's cgroup");
        let dirs = vec![container, pod, root.join("kubepods/burstable"), root.join("kubepods")];
        PodCgroup { root: root.to_owned(), dirs }
    }
}

impl Drop for PodCgroup {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dirs[0].join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.root.join("cgroup.procs"), pid);
            }
        }
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// A stale raw block volume of PV `OTHER_PV`: a loop device nothing holds whose node kubelet's
/// directory has as the PV's publish file (kubelet before 1.18: `publish/<pv>`, no pod), so the
/// agent joins it to the PV by device number.
fn stale_raw_block(s: &Scratch, node: &Node) -> LoopDev {
    let lo = LoopDev::attach(&s.sparse_file("raw.img", 8));
    let publish = node.kubelet.join("plugins/kubernetes.io/csi/volumeDevices/publish");
    std::fs::create_dir_all(&publish).expect("mkdir");
    let dev = std::fs::read_to_string(format!("/sys/class/block/{}/dev", lo.name())).expect("dev");
    let (major, minor) = dev.trim().split_once(':').expect("MAJ:MIN");
    sh("mknod", &[utf8(&publish.join(OTHER_PV)), "b", major, minor]);
    lo
}

/// Whether an Event with `reason` was posted on the object (kind, namespace, name, uid), in the
/// object's namespace (`default` for cluster-scoped ones), naming `device` and the node.
fn posted(
    events: &[(String, Event)],
    reason: &str,
    object: (&str, Option<&str>, &str, &str),
    device: &str,
) -> bool {
    let (kind, ns, name, uid) = object;
    events.iter().any(|(in_ns, e)| {
        let o = &e.involved_object;
        e.reason.as_deref() == Some(reason)
            && o.kind.as_deref() == Some(kind)
            && o.namespace.as_deref() == ns
            && o.name.as_deref() == Some(name)
            && o.uid.as_deref() == Some(uid)
            && o.api_version.as_deref() == Some("v1")
            && in_ns == ns.unwrap_or("default")
            && e.type_.as_deref() == Some("Warning")
            && e.message.as_deref().is_some_and(|m| m.contains(device))
    })
}

/// `agentctl fleet pin-risks -o json` against the console: exit code and document.
fn fleet_pin_risks(console: &Console, s: &Scratch, pki: &Pki) -> (i32, Value) {
    let pem = pki.issue("dashboard", &["dashboard"]);
    let (c, k) = (s.path("dashboard.crt"), s.path("dashboard.key"));
    std::fs::write(&c, pem.cert).expect("cert");
    std::fs::write(&k, pem.key).expect("key");
    let out = Command::new(bin("agentctl"))
        .args(["fleet", "pin-risks", "-o", "json", "--server-name", "localhost", "--timeout", "10"])
        .env("BLOCKJANITOR_CONSOLE", console.tcp.to_string())
        .env("BLOCKJANITOR_CERT", &c)
        .env("BLOCKJANITOR_KEY", &k)
        .env("BLOCKJANITOR_CA", s.path("ca.crt"))
        .stdin(Stdio::null())
        .output()
        .expect("run agentctl");
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("agentctl fleet pin-risks: not JSON ({e}): {}{}", text(&out.stdout), text(&out.stderr))
    });
    (out.status.code().unwrap_or(-1), doc)
}

pub fn daemon_scenario(s: &Scratch) {
    let node = Node::new(s);
    let stale = stale_raw_block(s, &node);
    let mut exporter = Some(pod_namespace(s, &node, "exporter", "rprivate"));
    let ns = exporter.as_ref().expect("exporter").ns_inode();
    let cgroup = PodCgroup::new(exporter.as_ref().expect("exporter").pid());
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    server
        .state
        .lock()
        .expect("state")
        .lists
        .get_mut("/api/v1/pods")
        .expect("pods")
        .push(exporter_pod(&node.host));
    let pki = Pki::new("pin-risk-ca");
    let files = ConsoleFiles::write(&pki, s.dir.path());
    let url = server.url();
    let kdir = utf8(&node.kubelet).to_owned();
    let d = Daemon::start_tls(
        s.dir.path(),
        &[],
        "127.0.0.1:0",
        &files.server(),
        &[
            "--kubelet-dir",
            &kdir,
            "--kube-url",
            &url,
            "--node-name",
            NODE,
            "--grace-period",
            "0",
            "--rescan-interval",
            "1",
            "--metrics-listen",
            "127.0.0.1:0",
            "--tls-console",
            "console",
            "--tls-viewer",
            "dashboard",
        ],
    );
    let mut console_args = files.args("dashboard");
    console_args.extend(["--agents".to_owned(), format!("{NODE}={}", d.tcp.expect("tcp"))]);
    let console = Console::start(&console_args);

    // Events where people look.
    let dev = node.lo.name().to_owned();
    let stale_dev = stale.name().to_owned();
    let all_posted = |ev: &[(String, Event)]| {
        posted(ev, "MountPinRisk", ("Pod", Some("monitoring"), EXPORTER, EXPORTER_UID), "")
            && posted(ev, "VolumeHeldElsewhere", ("Node", None, NODE, NODE), &dev)
            && posted(
                ev,
                "VolumeHeldElsewhere",
                ("PersistentVolume", None, PV, &format!("uid-pv-{PV}")),
                &dev,
            )
            && posted(
                ev,
                "VolumeHeldElsewhere",
                ("PersistentVolumeClaim", Some("shop"), "data", "uid-claim-data"),
                &dev,
            )
            && posted(ev, "VolumeHeldElsewhere", ("Pod", Some("shop"), "web-0", "uid-web-0"), &dev)
            && posted(
                ev,
                "StaleBlockDevice",
                ("PersistentVolume", None, OTHER_PV, &format!("uid-pv-{OTHER_PV}")),
                &stale_dev,
            )
            && posted(
                ev,
                "StaleBlockDevice",
                ("PersistentVolumeClaim", Some("logs"), "ingest", "uid-claim-ingest"),
                &stale_dev,
            )
    };
    let ok = wait_until(Duration::from_secs(40), || all_posted(&server.events()));
    let summary: Vec<String> = server
        .events()
        .iter()
        .map(|(n, e)| {
            format!(
                "{n}: {:?} {:?}/{:?} {:?}",
                e.reason, e.involved_object.kind, e.involved_object.name, e.message
            )
        })
        .collect();
    assert!(ok, "not every Event was posted: {summary:#?}\nagent log:\n{}", d.log_text());
    let events = server.events();
    let pin_event = events
        .iter()
        .find(|(_, e)| e.reason.as_deref() == Some("MountPinRisk"))
        .map(|(_, e)| e.message.clone().unwrap_or_default())
        .expect("pin event");
    assert!(
        pin_event.contains("container node-exporter")
            && pin_event.contains(&format!("{dev} (PV {PV})"))
            && pin_event.contains("volumeMount root"),
        "{pin_event}"
    );
    // No PVC is read for it (a PV's claimRef names the claim and its UID): no new RBAC.
    assert!(
        !server.requests().iter().any(|r| r.path.contains("persistentvolumeclaims")),
        "the agent asked for PVCs"
    );
    let conditions = server.condition_patches("MountPinRisk");
    assert!(
        conditions
            .iter()
            .any(|c| c["status"] == "True" && c["message"].as_str().is_some_and(|m| m.contains(EXPORTER))),
        "{conditions:#?}"
    );

    // The API (agentctl scan on the socket): pod and container named, the fix on the volumeMount.
    let out = Command::new(bin("agentctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(["scan", "-o", "json"])
        .output()
        .expect("agentctl");
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    Schema::load().check(&doc, "devices", "agentctl scan -o json");
    let r = risk_of(&doc["pin_risks"], ns).unwrap_or_else(|| panic!("{:#}", doc["pin_risks"]));
    assert_eq!(
        (r["pod_namespace"].as_str(), r["pod_name"].as_str()),
        (Some("monitoring"), Some(EXPORTER)),
        "{r:#}"
    );
    assert_eq!(
        (r["pod_uid"].as_str(), r["container_name"].as_str()),
        (Some(EXPORTER_UID), Some("node-exporter"))
    );
    assert!(r["fix"].as_str().is_some_and(|f| f.starts_with(&format!(
        "set mountPropagation: HostToContainer on volumeMount root (hostPath {} at /host) of container node-exporter",
        node.host.display()
    ))), "{r:#}");
    let copy = r["copies"].as_array().and_then(|c| c.iter().find(|c| c["device"] == dev.as_str())).cloned();
    assert_eq!(copy.map(|c| c["pv_name"].clone()), Some(json!(PV)), "{r:#}");

    // The metric per pod.
    let metrics = http_get(d.metrics.expect("metrics"), "/metrics");
    let series = format!("blockjanitor_pin_risks{{pod=\"{EXPORTER}\",pod_namespace=\"monitoring\"}} 1");
    assert!(metrics.contains(&series), "{series} missing:\n{metrics}");

    // The console's fleet-wide list.
    let schema = Schema::load();
    let listed = |doc: &Value| {
        doc["pin_risks"].as_array().is_some_and(|l| {
            l.iter().any(|f| f["node"] == NODE && f["risk"]["mount_namespace"].as_u64() == Some(ns))
        })
    };
    let mut last = (0, Value::Null);
    assert!(
        wait_until(Duration::from_secs(20), || {
            last = fleet_pin_risks(&console, s, &pki);
            listed(&last.1)
        }),
        "the console does not list the pin risk: {:#}\nconsole log:\n{}",
        last.1,
        console.log_text()
    );
    schema.check(&last.1, "fleet_pin_risks", "agentctl fleet pin-risks -o json");
    assert_eq!(last.0, 2, "pin risks listed: exit code 2");

    // The namespace goes: so does its risk, from the agent's report, the condition and the
    // console (by the agent's PIN_RISKS_CHANGED event or its next resync).
    drop(exporter.take());
    drop(cgroup);
    assert!(
        wait_until(Duration::from_secs(20), || {
            last = fleet_pin_risks(&console, s, &pki);
            !listed(&last.1)
        }),
        "the console still lists the pin risk of a namespace that is gone: {:#}",
        last.1
    );
    assert!(
        wait_until(Duration::from_secs(20), || server
            .condition_patches("MountPinRisk")
            .last()
            .is_some_and(|c| !c["message"].as_str().unwrap_or_default().contains(EXPORTER))),
        "the MountPinRisk condition still names the pod: {:#?}",
        server.condition_patches("MountPinRisk").last()
    );
    drop(console);
    drop(d);
    drop(stale);
    drop(rt);
}
