//! The deployment in `deploy/` (kustomize), checked against the code it deploys:
//!
//! - every kustomization under `deploy/` (found by walking it, so new ones are checked too)
//!   renders with kubectl's built-in kustomize, and every object survives a round trip through
//!   its typed model with no field lost (so nothing is misspelled or misplaced); the DaemonSet has
//!   what the agent needs to see the host safely;
//! - every ConfigMap's `agent.toml` loads through the agent's own config code, and the mode
//!   overlays change only the mode and the action budget; `serve` uses the config's
//!   `kubelet_dir` (the flag overrode it even when not given);
//! - RBAC is exactly enough: the agent's real Kubernetes code, run against the recording API
//!   server (`kube_mock`), makes only requests the ClusterRole allows, and uses every rule;
//! - the PrometheusRule passes `promtool check rules`, and every metric name in its alerts and in
//!   the Grafana dashboard is served by a live agent's /metrics;
//! - within each rendering every reference resolves (namespaces, the binding's subjects, the
//!   DaemonSet's ConfigMap and Secrets, the Service's pods and ports, the ServiceMonitor's Service);
//! - the plain-text health listener the probes use serves the health service and nothing else;
//! - `deploy/tls/make-certs.sh` makes certificates the agent and agentctl accept, with the roles
//!   the TLS overlays configure (an operator only by a person's own certificate);
//! - no rendering grants anyone Secrets, and none ships an operator identity or certificate a
//!   team would share.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor::config::{Config, Mode};
use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::deploy::{self, find, kubectl, kustomizations, render, require, round_trip};
use blockjanitor_tests::http::http_get;
use blockjanitor_tests::{
    agent_bin, real_kernel_test, require_real_kernel, serial, text, wait_until, LoopDev, Scratch,
};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::rbac::v1::ClusterRole;
use serde_json::{json, Value};

/// Every rendered kustomization (not Components), keyed by its path under deploy/; None when
/// kubectl is missing (and the test is to be skipped).
fn rendered(test: &str) -> Option<BTreeMap<String, Vec<Value>>> {
    let kubectl = match kubectl() {
        Ok(k) => k,
        Err(why) => {
            require(test, &[why]);
            return None;
        }
    };
    let root = deploy::repo().join("deploy");
    let mut out = BTreeMap::new();
    for (dir, component) in kustomizations() {
        if component {
            continue;
        }
        let objects = render(&kubectl, &dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(!objects.is_empty(), "{} renders no objects", dir.display());
        let key = dir.strip_prefix(&root).expect("under deploy/").display().to_string();
        out.insert(key, objects);
    }
    Some(out)
}

fn base(all: &BTreeMap<String, Vec<Value>>) -> &[Value] {
    all.get("base").expect("deploy/base is rendered")
}

/// The agent's config as the DaemonSet mounts it: the ConfigMap `blockjanitor-config`'s keys as
/// the files of a directory, loaded by the agent's own loader (every `*.toml` part, merged).
fn agent_toml(objects: &[Value], what: &str) -> Config {
    let cm = objects
        .iter()
        .find(|o| {
            o["kind"] == "ConfigMap"
                && o["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("blockjanitor-config"))
        })
        .unwrap_or_else(|| panic!("{what}: no ConfigMap blockjanitor-config"));
    let dir = tempfile::tempdir().expect("tempdir");
    for (key, text) in cm["data"].as_object().unwrap_or_else(|| panic!("{what}: no data")) {
        std::fs::write(dir.path().join(key), text.as_str().expect("string")).expect("write part");
    }
    let c =
        Config::load(dir.path()).unwrap_or_else(|e| panic!("{what}: the agent cannot load its config: {e}"));
    c.validate().unwrap_or_else(|e| panic!("{what}: the agent refuses its config: {e}"));
    c
}

#[test]
fn every_kustomization_renders_and_round_trips_through_typed_models() {
    let Some(all) = rendered("rendering deploy/") else { return };
    for must in [
        "base",
        "overlays/release-mode",
        "overlays/clean-mode",
        "overlays/tls",
        "overlays/monitoring",
        "overlays/console",
    ] {
        assert!(
            all.contains_key(must),
            "deploy/{must} is missing; found {:?}",
            all.keys().collect::<Vec<_>>()
        );
    }
    // Every Component is used by some kustomization (else it is never rendered, so never checked).
    for (dir, component) in kustomizations() {
        if !component {
            continue;
        }
        let name = dir.file_name().expect("name").to_string_lossy().into_owned();
        // Listed by a kustomization (`.../components/NAME`) or by another Component beside it
        // (`../NAME`, as the monitoring Components list the Prometheus selector).
        let used = kustomizations().iter().any(|(d, c)| {
            let listed = if *c { format!("../{name}") } else { format!("components/{name}") };
            d != &dir
                && std::fs::read_to_string(d.join("kustomization.yaml")).is_ok_and(|t| t.contains(&listed))
        });
        assert!(used, "component {} is used by no kustomization", dir.display());
    }
    let mut kinds = BTreeSet::new();
    for (dir, objects) in &all {
        for o in objects {
            let what = format!("deploy/{dir}: {} {}", o["kind"], o["metadata"]["name"]);
            let lost = round_trip(o).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(lost.is_empty(), "{what} does not survive its typed model:\n{}", lost.join("\n"));
            kinds.insert(o["kind"].as_str().unwrap_or_default().to_owned());
        }
        // The agent can load the config each one deploys.
        agent_toml(objects, dir);
    }
    for k in [
        "DaemonSet",
        "Deployment",
        "ClusterRole",
        "Role",
        "Certificate",
        "Issuer",
        "ServiceMonitor",
        "PrometheusRule",
    ] {
        assert!(kinds.contains(k), "no {k} was checked; kinds: {kinds:?}");
    }
}

/// People reach the agents with their own identity only: no rendering grants any Role or
/// ClusterRole on Secrets (the plugin no longer reads a client certificate from one; no user may
/// fetch another's key), none makes an operator certificate (cert-manager Certificates are the
/// console's, the agents' and a machine viewer's), and no agent.toml lists an operator identity.
#[test]
fn no_role_grants_secrets_and_no_operator_certificate_is_shipped() {
    let Some(all) = rendered("rendering deploy/") else { return };
    let mut roles = 0;
    let mut certificates = BTreeSet::new();
    for (dir, objects) in &all {
        for o in objects {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            if o["kind"] == "Role" || o["kind"] == "ClusterRole" {
                roles += 1;
                for rule in o["rules"].as_array().into_iter().flatten() {
                    let resources = rule["resources"].as_array().cloned().unwrap_or_default();
                    assert!(
                        !resources.iter().any(|r| r == "secrets" || r == "*"),
                        "deploy/{dir}: {} {name} grants {rule}",
                        o["kind"]
                    );
                }
            }
            if o["kind"] == "Certificate" {
                let secret = o["spec"]["secretName"].as_str().unwrap_or_default().to_owned();
                let names: Vec<&str> = [&o["spec"]["commonName"]]
                    .into_iter()
                    .chain(o["spec"]["dnsNames"].as_array().into_iter().flatten())
                    .filter_map(Value::as_str)
                    .collect();
                assert!(
                    !secret.contains("operator") && !names.iter().any(|n| n.contains("operator")),
                    "deploy/{dir}: Certificate {name} is an operator certificate a team would share: {names:?}"
                );
                certificates.insert(secret);
            }
        }
        let c = agent_toml(objects, dir);
        assert!(c.tcp.operators.is_empty(), "deploy/{dir}: agent.toml ships operators {:?}", c.tcp.operators);
    }
    assert!(roles >= 4, "only {roles} Roles/ClusterRoles checked");
    let want: BTreeSet<String> = [
        "blockjanitor-agent-tls",
        "blockjanitor-ca",
        "blockjanitor-console-serving-tls",
        "blockjanitor-console-tls",
        "blockjanitor-viewer-tls",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(certificates, want, "the Certificates shipped");
}

#[test]
fn a_misspelled_or_misplaced_field_fails_the_round_trip() {
    let Some(all) = rendered("rendering deploy/") else { return };
    let ds = find(base(&all), "DaemonSet", None).expect("a DaemonSet").clone();
    assert!(round_trip(&ds).expect("model").is_empty());
    let mut typo = ds.clone();
    typo["spec"]["template"]["spec"]["hostPid"] = json!(true);
    let lost = round_trip(&typo).expect("model");
    assert!(lost.iter().any(|l| l.contains("hostPid")), "a misspelled field went unnoticed: {lost:?}");
    let mut misplaced = ds.clone();
    misplaced["spec"]["template"]["spec"]["containers"][0]["mountPropagation"] = json!("HostToContainer");
    assert!(!round_trip(&misplaced).expect("model").is_empty(), "a misplaced field went unnoticed");
    // The CRD models refuse unknown fields outright.
    let all_objects: Vec<&Value> = all.values().flatten().collect();
    let mut cert = (*all_objects.iter().find(|o| o["kind"] == "Certificate").expect("a Certificate")).clone();
    cert["spec"]["dnsName"] = json!(["x"]);
    assert!(round_trip(&cert).is_err(), "a misspelled Certificate field was accepted");
    let mut rule =
        (*all_objects.iter().find(|o| o["kind"] == "PrometheusRule").expect("a PrometheusRule")).clone();
    rule["spec"]["groups"][0]["rules"][0]["fro"] = json!("5m");
    assert!(round_trip(&rule).is_err(), "a misspelled rule field was accepted");
    // And an unknown kind is not waved through.
    assert!(round_trip(&json!({"apiVersion": "v9", "kind": "Thing", "metadata": {}})).is_err());
}

/// The DaemonSet (in every kustomization) gives the agent what it needs to see the host as the
/// host sees itself, and never makes it a holder of the host's mounts.
#[test]
fn the_daemonset_sees_the_host_safely() {
    let Some(all) = rendered("rendering deploy/") else { return };
    for (dir, objects) in &all {
        let raw =
            find(objects, "DaemonSet", Some("blockjanitor")).unwrap_or_else(|| panic!("{dir}: no DaemonSet"));
        let ds: DaemonSet = serde_json::from_value(raw.clone()).expect("typed");
        let cfg = agent_toml(objects, dir);
        let spec = ds.spec.as_ref().expect("spec");
        let pod = spec.template.spec.as_ref().expect("pod spec");
        assert_eq!(pod.host_pid, Some(true), "{dir}: hostPID");
        assert_eq!(pod.priority_class_name.as_deref(), Some("system-node-critical"), "{dir}");
        let tol = pod.tolerations.as_deref().unwrap_or_default();
        assert!(
            tol.iter()
                .any(|t| t.operator.as_deref() == Some("Exists") && t.key.is_none() && t.effect.is_none()),
            "{dir}: the agent must tolerate every taint: {tol:?}"
        );
        let grace = pod.termination_grace_period_seconds.unwrap_or(30);
        assert!(grace >= 60, "{dir}: terminationGracePeriodSeconds {grace} is too short for a running plan");
        let strategy = spec.update_strategy.as_ref().expect("update strategy");
        assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"), "{dir}");
        assert!(strategy.rolling_update.as_ref().and_then(|r| r.max_unavailable.as_ref()).is_some(), "{dir}");
        assert_eq!(pod.containers.len(), 1, "{dir}");
        let c = &pod.containers[0];
        assert_eq!(c.security_context.as_ref().and_then(|s| s.privileged), Some(true), "{dir}: privileged");
        // NODE_NAME from the downward API, passed to the agent.
        let env = c.env.as_deref().unwrap_or_default();
        let node =
            env.iter().find(|e| e.name == "NODE_NAME").unwrap_or_else(|| panic!("{dir}: no NODE_NAME"));
        let field =
            node.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
        assert_eq!(field, Some("spec.nodeName"), "{dir}");
        let args = c.args.as_deref().unwrap_or_default();
        assert!(args.iter().any(|a| a == "--node-name=$(NODE_NAME)"), "{dir}: {args:?}");
        assert!(args.first().is_some_and(|a| a == "serve"), "{dir}: {args:?}");
        // Host paths: never "/", the kubelet dir HostToContainer at the same path.
        let volumes = pod.volumes.as_deref().unwrap_or_default();
        let host_path = |name: &str| {
            volumes.iter().find(|v| v.name == name).and_then(|v| v.host_path.as_ref()).map(|h| h.path.clone())
        };
        for v in volumes {
            if let Some(h) = &v.host_path {
                let p = h.path.trim_end_matches('/');
                assert!(!p.is_empty(), "{dir}: the host root is mounted (volume {})", v.name);
            }
        }
        let mounts = c.volume_mounts.as_deref().unwrap_or_default();
        let mount_of = |host: &str| {
            mounts
                .iter()
                .find(|m| host_path(&m.name).as_deref() == Some(host))
                .unwrap_or_else(|| panic!("{dir}: the host's {host} is not mounted"))
        };
        let kubelet = mount_of(cfg.kubelet_dir.to_str().expect("utf8"));
        assert_eq!(kubelet.mount_path, cfg.kubelet_dir.to_str().expect("utf8"), "{dir}");
        assert_eq!(
            kubelet.mount_propagation.as_deref(),
            Some("HostToContainer"),
            "{dir}: kubelet propagation"
        );
        for host in ["/sys", "/dev"] {
            let m = mount_of(host);
            assert_eq!(m.mount_path, host, "{dir}");
            assert_ne!(m.mount_propagation.as_deref(), Some("Bidirectional"), "{dir}: {host}");
        }
        for m in mounts {
            assert_ne!(
                m.mount_propagation.as_deref(),
                Some("Bidirectional"),
                "{dir}: {} propagates back",
                m.name
            );
        }
        // The socket and the journal live on host paths (agentctl on the node; survive restarts).
        let socket_dir = cfg.socket.path.parent().expect("socket dir").to_str().expect("utf8").to_owned();
        assert_eq!(mount_of(&socket_dir).mount_path, socket_dir, "{dir}");
        let journal_dir = cfg.journal.parent().expect("journal dir").to_str().expect("utf8").to_owned();
        assert_eq!(mount_of(&journal_dir).mount_path, journal_dir, "{dir}");
        // multipath-tools' wwids file, edited when a map is removed through multipathd: the host's
        // /etc/multipath, writable, where HostRoot looks for it (the host root is "/" in the pod).
        let multipath = mount_of("/etc/multipath");
        assert_eq!(multipath.mount_path, "/etc/multipath", "{dir}");
        assert_ne!(multipath.read_only, Some(true), "{dir}: /etc/multipath must be writable");
        assert_eq!(
            blockjanitor::host::HostRoot::default().multipath_wwids(),
            std::path::Path::new(&multipath.mount_path).join("wwids"),
            "{dir}"
        );
        // Probes: native gRPC against the health listener the config opens.
        let health = cfg.health.listen.unwrap_or_else(|| panic!("{dir}: no [health] listen for the probes"));
        for (what, probe) in [
            ("liveness", &c.liveness_probe),
            ("readiness", &c.readiness_probe),
            ("startup", &c.startup_probe),
        ] {
            let grpc = probe
                .as_ref()
                .and_then(|p| p.grpc.as_ref())
                .unwrap_or_else(|| panic!("{dir}: no grpc {what} probe"));
            assert_eq!(grpc.port, i32::from(health.port()), "{dir}: {what} probe port");
        }
        assert!(!health.ip().is_loopback(), "{dir}: kubelet probes the pod IP, not the pod's loopback");
        // Resources are set.
        let res = c.resources.as_ref().expect("resources");
        assert!(
            res.requests.as_ref().is_some_and(|r| r.contains_key("memory") && r.contains_key("cpu")),
            "{dir}"
        );
        assert!(res.limits.as_ref().is_some_and(|l| l.contains_key("memory")), "{dir}");
        // TLS overlays: the listener's files come from a mounted Secret.
        if cfg.tcp.listen.is_some() {
            let cert = cfg.tcp.cert.as_ref().expect("cert");
            let secret_mount = mounts
                .iter()
                .find(|m| cert.starts_with(&m.mount_path))
                .unwrap_or_else(|| panic!("{dir}: nothing mounted at {}", cert.display()));
            let v = volumes.iter().find(|v| v.name == secret_mount.name).expect("volume");
            assert!(v.secret.is_some(), "{dir}: TLS files must come from a Secret");
        }
    }
}

#[test]
fn mode_overlays_change_only_the_mode_and_the_budget() {
    let Some(all) = rendered("rendering deploy/") else { return };
    let b = agent_toml(base(&all), "base");
    assert_eq!(b.mode, Mode::Report, "deploy/base runs in report mode");
    for (overlay, mode) in [("overlays/release-mode", Mode::Release), ("overlays/clean-mode", Mode::Clean)] {
        let mut c = agent_toml(all.get(overlay).expect("overlay rendered"), overlay);
        assert_eq!(c.mode, mode, "{overlay}");
        c.mode = b.mode;
        c.max_actions_per_minute = b.max_actions_per_minute;
        assert_eq!(c, b, "{overlay} changes more than the mode and the budget");
        // Everything else rendered is the same as the base's, apart from the config's name.
        let strip = |objects: &[Value]| -> Vec<Value> {
            objects
                .iter()
                .filter(|o| o["kind"] != "ConfigMap")
                .map(|o| {
                    let mut o = o.clone();
                    if let Some(vs) = o["spec"]["template"]["spec"]["volumes"].as_array_mut() {
                        for v in vs {
                            if v["configMap"].is_object() {
                                v["configMap"]["name"] = json!("CONFIG");
                            }
                        }
                    }
                    o
                })
                .collect()
        };
        assert_eq!(strip(all.get(overlay).expect("overlay")), strip(base(&all)), "{overlay}: objects differ");
    }
    for overlay in ["overlays/tls", "overlays/tls-manual", "overlays/console"] {
        let Some(objects) = all.get(overlay) else { continue };
        let mut c = agent_toml(objects, overlay);
        assert!(
            c.tcp.listen.is_some() && !c.tcp.consoles.is_empty() && !c.tcp.viewers.is_empty(),
            "{overlay}: a TCP listener with roles"
        );
        assert!(
            c.tcp.operators.is_empty(),
            "{overlay}: operators are people, added one by one: {:?}",
            c.tcp.operators
        );
        c.tcp = b.tcp.clone();
        assert_eq!(c, b, "{overlay} changes more than [tcp]");
    }
}

/// (apiGroup, resource incl. subresource, verb) of one API request, as the API server's
/// authorizer sees it.
fn attributes(method: &hyper::Method, path: &str, watch: bool) -> (String, String, String) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] => (String::new(), rest.to_vec()),
        ["apis", group, _version, rest @ ..] => ((*group).to_owned(), rest.to_vec()),
        _ => panic!("not an API path: {path}"),
    };
    let rest = match rest.as_slice() {
        ["namespaces", _ns, r @ ..] if !r.is_empty() => r.to_vec(),
        r => r.to_vec(),
    };
    let (resource, name, sub) = match rest.as_slice() {
        [r] => (*r, None, None),
        [r, n] => (*r, Some(*n), None),
        [r, n, s] => (*r, Some(*n), Some(*s)),
        _ => panic!("unexpected API path {path}"),
    };
    let verb = match (method.as_str(), name.is_some()) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PATCH", _) => "patch",
        ("PUT", _) => "update",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => panic!("unexpected method {m} {path}"),
    };
    let resource = match sub {
        Some(s) => format!("{resource}/{s}"),
        None => resource.to_owned(),
    };
    (group, resource, verb.to_owned())
}

#[test]
fn request_attributes_are_mapped_as_the_api_server_does() {
    use hyper::Method;
    let a = |m: &Method, p: &str, w: bool| {
        let (g, r, v) = attributes(m, p, w);
        format!("{g}|{r}|{v}")
    };
    assert_eq!(a(&Method::GET, "/api/v1/pods", false), "|pods|list");
    assert_eq!(a(&Method::GET, "/api/v1/pods", true), "|pods|watch");
    assert_eq!(a(&Method::GET, "/api/v1/nodes/n1", false), "|nodes|get");
    assert_eq!(a(&Method::PATCH, "/api/v1/nodes/n1/status", false), "|nodes/status|patch");
    assert_eq!(a(&Method::POST, "/api/v1/namespaces/default/events", false), "|events|create");
    assert_eq!(
        a(&Method::GET, "/apis/storage.k8s.io/v1/volumeattachments", true),
        "storage.k8s.io|volumeattachments|watch"
    );
}

/// Events go where people look (issue 35 item 6): on the Node and PVs in `default`, on a PVC or
/// a pod in its own namespace. The one `events create` rule reaches every namespace only because
/// the role is a ClusterRole bound by a ClusterRoleBinding (a RoleBinding would grant it in one
/// namespace); and it names no object (`resourceNames` cannot name an object not yet created).
/// Nothing else is needed for it: a PV's UID comes from the PV watch, a PVC's from the PV's
/// `claimRef`, a pod's from the pods watch (`root_rbac_grants_exactly_what_the_agent_calls`
/// proves no other request is made).
#[test]
fn the_agents_event_grant_reaches_every_namespace() {
    let Some(all) = rendered("the event grant check") else { return };
    let binding =
        find(base(&all), "ClusterRoleBinding", Some("blockjanitor-agent")).expect("the agent's binding");
    assert_eq!(binding["roleRef"]["kind"], "ClusterRole", "{binding:#}");
    assert_eq!(binding["roleRef"]["name"], "blockjanitor-agent", "{binding:#}");
    assert!(
        !base(&all)
            .iter()
            .any(|o| o["kind"] == "RoleBinding" && o["roleRef"]["name"] == "blockjanitor-agent"),
        "the agent's role is bound in one namespace only"
    );
    let role: ClusterRole = serde_json::from_value(
        find(base(&all), "ClusterRole", Some("blockjanitor-agent")).expect("the agent's ClusterRole").clone(),
    )
    .expect("typed ClusterRole");
    let events: Vec<_> = role
        .rules
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.resources.as_deref().unwrap_or_default().iter().any(|x| x == "events"))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].verbs, ["create"], "only ever created, never patched or read");
    assert!(events[0].resource_names.is_none(), "{events:?}");
}

/// The agent's real Kubernetes code (the daemon, against the recording API server) makes only
/// requests the rendered ClusterRole allows, and every rule in it is used.
#[test]
fn root_rbac_grants_exactly_what_the_agent_calls() {
    use blockjanitor_tests::daemon::reporting_daemon;
    use blockjanitor_tests::kube_mock::NODE;
    use blockjanitor_tests::rt;
    if !require_real_kernel(&["losetup"]) {
        return;
    }
    let Some(all) = rendered("RBAC check") else { return };
    let role: ClusterRole = serde_json::from_value(
        find(base(&all), "ClusterRole", Some("blockjanitor-agent")).expect("the agent's ClusterRole").clone(),
    )
    .expect("typed ClusterRole");
    let rules = role.rules.clone().unwrap_or_default();
    // Every kustomization deploys the same role (an overlay must not widen it silently).
    for (dir, objects) in &all {
        let r: ClusterRole = serde_json::from_value(
            find(objects, "ClusterRole", Some("blockjanitor-agent")).expect("role").clone(),
        )
        .expect("typed");
        assert_eq!(r.rules, role.rules, "deploy/{dir} changes the ClusterRole");
    }
    let _serial = serial();
    let rt = rt();
    let s = Scratch::new();
    // A stale loop device (grace 0) makes the agent post an Event and set the Node condition.
    let (server, d) = reporting_daemon(&s, &rt, &["--rescan-interval", "1"]);
    let lo = s.loop_file("rbac.img");
    let needed: [(&str, &str, &str); 10] = [
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "persistentvolumes", "list"),
        ("", "persistentvolumes", "watch"),
        ("storage.k8s.io", "volumeattachments", "list"),
        ("storage.k8s.io", "volumeattachments", "watch"),
        ("", "nodes", "get"),
        ("", "nodes/status", "get"),
        ("", "nodes/status", "patch"),
        ("", "events", "create"),
    ];
    let seen = || -> BTreeSet<(String, String, String)> {
        server.requests().iter().map(|r| attributes(&r.method, &r.path, r.is_watch())).collect()
    };
    let all_seen = || {
        let s = seen();
        needed.iter().all(|(g, r, v)| s.contains(&((*g).to_owned(), (*r).to_owned(), (*v).to_owned())))
    };
    let ok = wait_until(Duration::from_secs(30), all_seen);
    let requests = server.requests();
    assert!(
        ok,
        "the scenario did not exercise every call the agent can make; seen {:?}\nlog:\n{}",
        seen(),
        d.log_text()
    );
    drop(d);
    drop(lo);
    // Pods are only ever asked for this node's.
    for r in requests.iter().filter(|r| r.path == "/api/v1/pods") {
        assert_eq!(
            r.query.get("fieldSelector").map(String::as_str),
            Some(format!("spec.nodeName={NODE}").as_str()),
            "pods requested beyond this node: {:?}",
            r.query
        );
    }
    let allows = |g: &str, res: &str, verb: &str| {
        rules.iter().any(|rule| {
            rule.resource_names.is_none()
                && rule.api_groups.as_deref().unwrap_or_default().iter().any(|x| x == g || x == "*")
                && rule.resources.as_deref().unwrap_or_default().iter().any(|x| x == res || x == "*")
                && rule.verbs.iter().any(|x| x == verb || x == "*")
        })
    };
    // Every request is allowed...
    let used = seen();
    for (g, res, verb) in &used {
        assert!(
            allows(g, res, verb),
            "the ClusterRole does not allow {verb} {res} (group {g:?}), which the agent calls"
        );
    }
    // ...and every grant is used.
    for rule in &rules {
        assert!(rule.non_resource_urls.is_none(), "non-resource URLs are granted: {rule:?}");
        for g in rule.api_groups.as_deref().unwrap_or_default() {
            for res in rule.resources.as_deref().unwrap_or_default() {
                for verb in &rule.verbs {
                    assert!(
                        used.contains(&(g.clone(), res.clone(), verb.clone())),
                        "the ClusterRole grants {verb} {res} (group {g:?}), which the agent never calls; used: {used:?}"
                    );
                }
            }
        }
    }
    drop(rt);
}

/// `promtool check rules` accepts the alerts, and every metric name the alerts and the dashboard
/// use is served by a live agent.
#[test]
fn root_alerts_and_dashboard_use_only_metrics_the_agent_serves() {
    let promtool = deploy::on_path("promtool");
    let mut missing = Vec::new();
    if promtool.is_none() {
        missing.push("promtool (Debian package prometheus)".to_owned());
    }
    if !require("the metrics check", &missing) || !require_real_kernel(&[]) {
        return;
    }
    let Some(all) = rendered("the metrics check") else { return };
    let mon = all.get("overlays/monitoring").expect("deploy/overlays/monitoring");
    let rule: deploy::PrometheusRule =
        serde_json::from_value(find(mon, "PrometheusRule", None).expect("PrometheusRule").clone())
            .expect("typed");
    let s = Scratch::new();
    let rules_file = s.path("rules.yaml");
    std::fs::write(&rules_file, serde_yaml_ng::to_string(&rule.spec).expect("yaml")).expect("write rules");
    let out = Command::new(promtool.expect("promtool"))
        .args(["check", "rules"])
        .arg(&rules_file)
        .output()
        .expect("run promtool");
    let n_rules: usize = rule.spec.groups.iter().map(|g| g.rules.len()).sum();
    assert!(
        out.status.success() && text(&out.stdout).contains(&format!("SUCCESS: {n_rules} rules found")),
        "promtool check rules: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let alerts: BTreeSet<&str> =
        rule.spec.groups.iter().flat_map(|g| &g.rules).filter_map(|r| r.alert.as_deref()).collect();
    assert!(alerts.len() >= 5, "alerts: {alerts:?}");

    // Every expression: the rules', and the dashboard's targets and label_values() queries.
    let mut exprs: Vec<(String, String)> = rule
        .spec
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .map(|r| (format!("alert {}", r.alert.clone().unwrap_or_default()), r.expr.clone()))
        .collect();
    let dash_cm = mon
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1")
        .expect("a dashboard ConfigMap labelled grafana_dashboard: \"1\"");
    let dash_text = dash_cm["data"].as_object().and_then(|d| d.values().next()).and_then(Value::as_str);
    let dash: Value =
        serde_json::from_str(dash_text.expect("dashboard JSON")).expect("the dashboard is JSON");
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            exprs.push((format!("panel {}", p["title"]), t["expr"].as_str().expect("expr").to_owned()));
        }
    }
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = v["definition"].as_str().and_then(|d| d.strip_prefix("label_values(")) {
            exprs.push((format!("variable {}", v["name"]), q.split(',').next().expect("metric").to_owned()));
        }
    }
    for needed in ["Devices by verdict and kind", "Holders", "Scan duration", "Actions by result"] {
        assert!(
            dash["panels"]
                .as_array()
                .expect("panels")
                .iter()
                .any(|p| p["title"].as_str().is_some_and(|t| t.contains(needed))),
            "the dashboard has no panel for {needed}"
        );
    }

    // A live agent's names.
    let _serial = serial();
    let d = Daemon::start(s.dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    let body = http_get(d.metrics.expect("metrics address"), "/metrics");
    let served = deploy::exposed_names(&body);
    assert!(served.contains("blockjanitor_devices"), "the first scan's series are served: {served:?}");
    // `up` is Prometheus's own series for each target; it must name the Service's job.
    let service = find(mon, "Service", Some("blockjanitor-metrics")).expect("the metrics Service");
    let job = service["metadata"]["name"].as_str().expect("name");
    let mut used = BTreeSet::new();
    for (what, e) in &exprs {
        let names = deploy::promql_metric_names(e);
        assert!(!names.is_empty(), "{what}: no metric in {e}");
        for n in names {
            if n == "up" {
                assert!(
                    e.contains(&format!("job=\"{job}\"")),
                    "{what}: `up` for another job than {job}: {e}"
                );
                continue;
            }
            assert!(
                served.contains(&n),
                "{what} uses {n}, which the agent does not serve; served: {served:?}"
            );
            used.insert(n);
        }
    }
    for family in ["blockjanitor_devices", "blockjanitor_holders", "blockjanitor_actions_total"] {
        assert!(used.contains(family), "nothing uses {family}");
    }
    // The check itself catches a wrong name.
    let wrong = deploy::promql_metric_names("sum(blockjanitor_device{verdict=\"stale\"})");
    assert!(wrong.iter().any(|n| !served.contains(n)), "a misspelled metric would pass");
}

/// The probes' listener serves grpc.health.v1 (SERVING for "" and for the Agent service) in plain
/// text, and nothing else: the Agent service itself is not reachable there.
#[test]
fn root_health_listener_serves_health_only() {
    let Some((_serial, s)) = real_kernel_test(&[]) else { return };
    let d = Daemon::start(s.dir.path(), &["--health-listen", "127.0.0.1:0"]);
    let addr = d.health.expect("the health listener's address is logged");
    let rt = blockjanitor_tests::rt();
    rt.block_on(async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
            .expect("plain-text connection");
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
        for service in ["", "blockjanitor.v1.Agent"] {
            let r = h
                .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
                .await
                .unwrap_or_else(|e| panic!("health check {service:?}: {e}"));
            assert_eq!(
                r.into_inner().status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
                "{service:?}"
            );
        }
        let mut agent = blockjanitor_proto::v1::agent_client::AgentClient::new(ch);
        let e =
            agent.get_node(blockjanitor_proto::v1::GetNodeRequest::default()).await.expect_err("not served");
        assert_eq!(e.code(), tonic::Code::Unimplemented, "the Agent service is reachable without TLS: {e}");
    });
}

fn agentctl_tls(addr: std::net::SocketAddr, dir: &Path, who: &str, args: &[&str]) -> std::process::Output {
    Command::new(agent_bin().with_file_name("agentctl"))
        .arg("--addr")
        .arg(addr.to_string())
        .arg("--cert")
        .arg(dir.join(format!("{who}.crt")))
        .arg("--key")
        .arg(dir.join(format!("{who}.key")))
        .arg("--ca")
        .arg(dir.join("ca.crt"))
        .args(["--server-name", "agent.blockjanitor.svc", "--timeout", "10"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run agentctl")
}

/// deploy/tls/make-certs.sh makes a CA and certificates the agent serves with, and agentctl's
/// TLS flags connect with, in the roles deploy/components/tls/tls.toml gives them.
#[test]
fn root_make_certs_gives_working_mutual_tls_identities() {
    let missing: Vec<String> =
        if deploy::on_path("openssl").is_none() { vec!["openssl".into()] } else { Vec::new() };
    if !require("the make-certs.sh check", &missing) || !require_real_kernel(&[]) {
        return;
    }
    let s = Scratch::new();
    let certs: PathBuf = s.path("certs");
    let out = Command::new(deploy::repo().join("deploy/tls/make-certs.sh"))
        .arg(&certs)
        .arg("alice")
        .output()
        .expect("run");
    assert!(out.status.success(), "make-certs.sh: {}{}", text(&out.stdout), text(&out.stderr));
    assert!(!certs.join("operator.crt").exists(), "no operator certificate a team would share");
    // The tls Component's part of the config ([tcp] alone), as the agent merges it.
    let toml = std::fs::read_to_string(deploy::repo().join("deploy/components/tls/tls.toml")).expect("read");
    let cfg = Config::parse(&toml, Path::new("deploy/components/tls/tls.toml")).expect("parses");
    let mut args: Vec<String> = vec!["--listen".into(), "127.0.0.1:0".into()];
    for (flag, file) in
        [("--tls-cert", "agent.crt"), ("--tls-key", "agent.key"), ("--tls-client-ca", "ca.crt")]
    {
        args.push(flag.into());
        args.push(certs.join(file).display().to_string());
    }
    assert!(cfg.tcp.operators.is_empty(), "the shipped config names no operator");
    // A person's own certificate, listed by its identity as an operator adds it.
    args.extend(["--tls-operator".to_owned(), "alice".to_owned()]);
    for c in &cfg.tcp.consoles {
        args.extend(["--tls-console".to_owned(), c.clone()]);
    }
    for v in &cfg.tcp.viewers {
        args.extend(["--tls-viewer".to_owned(), v.clone()]);
    }
    args.extend(["--grace-period".to_owned(), "0".to_owned()]);
    let _serial = serial();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = Daemon::start(s.dir.path(), &args);
    let addr = d.tcp.expect("tcp listener");
    for who in ["console", "alice", "viewer"] {
        let out = agentctl_tls(addr, &certs, who, &["node", "-o", "json"]);
        assert!(out.status.success(), "agentctl as {who}: {}{}", text(&out.stdout), text(&out.stderr));
    }
    // An unheld loop device (grace 0: stale at once): the viewer may not clean it, nor the console
    // on its own; alice, an operator by her own certificate, may, and does (and the audit says so).
    let lo = s.loop_file("tls.img");
    let name = lo.name().to_owned();
    let mut last = String::new();
    let refused = wait_until(Duration::from_secs(20), || {
        let out = agentctl_tls(addr, &certs, "viewer", &["apply", &name, "--yes"]);
        last = format!("{}{}", text(&out.stdout), text(&out.stderr));
        !out.status.success() && last.contains("needs the operator role")
    });
    assert!(refused, "the viewer's apply of {name} was not refused for its role: {last}");
    assert!(lo.is_bound(), "a viewer's apply changed something");
    // The console's certificate alone may not act: it applies only on behalf of a named
    // operator (the console itself adds the caller; agentctl does not).
    let out = agentctl_tls(addr, &certs, "console", &["apply", &name, "--yes"]);
    last = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success() && last.contains("only on behalf of"), "console without a caller: {last}");
    assert!(lo.is_bound(), "the console's own apply changed something");
    let done = wait_until(Duration::from_secs(20), || {
        let out = agentctl_tls(addr, &certs, "alice", &["apply", &name, "--yes"]);
        last = format!("{}{}", text(&out.stdout), text(&out.stderr));
        out.status.success()
    });
    assert!(done && !lo.is_bound(), "alice could not clean {name}: {last}");
    assert!(
        wait_until(Duration::from_secs(5), || d.log_text().contains("Apply requested by alice")),
        "the audit names alice: {}",
        d.log_text()
    );
    // A certificate from another CA is refused.
    let other = s.path("other");
    let out =
        Command::new(deploy::repo().join("deploy/tls/make-certs.sh")).arg(&other).output().expect("run");
    assert!(out.status.success());
    std::fs::copy(certs.join("ca.crt"), other.join("ca.crt")).expect("trust the agent's CA");
    let stranger = agentctl_tls(addr, &other, "console", &["node"]);
    assert!(!stranger.status.success(), "a client certificate from another CA was accepted");
    drop(d);
}

/// Within each rendering, every name an object refers to exists: the namespace of every
/// namespaced object, the ServiceAccount and ClusterRole of the binding, the DaemonSet's
/// ServiceAccount, ConfigMaps and Secrets (made by a cert-manager Certificate in the same
/// rendering, or by deploy/tls/make-certs.sh), the pods a Service selects and the port it
/// targets, the Service a ServiceMonitor selects and its port, the Issuers of Certificates.
#[test]
fn references_resolve_within_each_rendering() {
    let Some(all) = rendered("rendering deploy/") else { return };
    let make_certs =
        std::fs::read_to_string(deploy::repo().join("deploy/tls/make-certs.sh")).expect("make-certs.sh");
    let labels_match = |selector: &Value, labels: &Value| {
        selector.as_object().is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| &labels[k] == v))
    };
    for (dir, objects) in &all {
        let ns = find(objects, "Namespace", None).unwrap_or_else(|| panic!("{dir}: no Namespace"));
        let ns = ns["metadata"]["name"].as_str().expect("name");
        let named = |kind: &str, name: &str| find(objects, kind, Some(name)).is_some();
        for o in objects {
            let kind = o["kind"].as_str().unwrap_or_default();
            if !["Namespace", "ClusterRole", "ClusterRoleBinding"].contains(&kind) {
                assert_eq!(
                    o["metadata"]["namespace"], ns,
                    "deploy/{dir}: {kind} {} is outside {ns}",
                    o["metadata"]["name"]
                );
            }
        }
        for b in objects.iter().filter(|o| o["kind"] == "ClusterRoleBinding" || o["kind"] == "RoleBinding") {
            let role_kind = b["roleRef"]["kind"].as_str().expect("roleRef kind");
            assert!(
                named(role_kind, b["roleRef"]["name"].as_str().expect("roleRef")),
                "deploy/{dir}: {} {}: roleRef {}",
                b["kind"],
                b["metadata"]["name"],
                b["roleRef"]
            );
            for s in b["subjects"].as_array().expect("subjects") {
                assert!(
                    s["kind"] == "ServiceAccount"
                        && s["namespace"] == ns
                        && named("ServiceAccount", s["name"].as_str().expect("name")),
                    "deploy/{dir}: subject {s}"
                );
            }
        }
        // Every workload (the agent's DaemonSet, the console's Deployment): its ServiceAccount,
        // ConfigMaps and Secrets exist.
        let workloads: Vec<&Value> =
            objects.iter().filter(|o| o["kind"] == "DaemonSet" || o["kind"] == "Deployment").collect();
        assert!(workloads.iter().any(|w| w["kind"] == "DaemonSet"), "deploy/{dir}: no DaemonSet");
        let produced_secrets: Vec<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "Certificate")
            .filter_map(|o| o["spec"]["secretName"].as_str())
            .collect();
        for w in &workloads {
            let pod = &w["spec"]["template"];
            let what = format!("deploy/{dir}: {} {}", w["kind"], w["metadata"]["name"]);
            assert!(
                named(
                    "ServiceAccount",
                    pod["spec"]["serviceAccountName"].as_str().expect("serviceAccountName")
                ),
                "{what}: its ServiceAccount"
            );
            for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
                if let Some(cm) = v["configMap"]["name"].as_str() {
                    assert!(named("ConfigMap", cm), "{what}: ConfigMap {cm} is not deployed");
                }
                if let Some(secret) = v["secret"]["secretName"].as_str() {
                    assert!(
                        produced_secrets.contains(&secret) || make_certs.contains(secret),
                        "{what}: nothing makes Secret {secret}"
                    );
                }
            }
        }
        // Every Service selects the pods of some workload, on ports its containers declare.
        for svc in objects.iter().filter(|o| o["kind"] == "Service") {
            let w = workloads
                .iter()
                .find(|w| {
                    labels_match(&svc["spec"]["selector"], &w["spec"]["template"]["metadata"]["labels"])
                })
                .unwrap_or_else(|| {
                    panic!("deploy/{dir}: Service {} selects no pod", svc["metadata"]["name"])
                });
            let container_ports: Vec<&Value> = w["spec"]["template"]["spec"]["containers"]
                .as_array()
                .expect("containers")
                .iter()
                .flat_map(|c| c["ports"].as_array().into_iter().flatten())
                .collect();
            for p in svc["spec"]["ports"].as_array().expect("ports") {
                let target = &p["targetPort"];
                assert!(
                    container_ports.iter().any(|c| &c["name"] == target || &c["containerPort"] == target),
                    "deploy/{dir}: Service {}: no container port {target}",
                    svc["metadata"]["name"]
                );
            }
        }
        for sm in objects.iter().filter(|o| o["kind"] == "ServiceMonitor") {
            let svc = objects
                .iter()
                .find(|o| {
                    o["kind"] == "Service"
                        && labels_match(&sm["spec"]["selector"]["matchLabels"], &o["metadata"]["labels"])
                })
                .unwrap_or_else(|| panic!("deploy/{dir}: the ServiceMonitor selects no Service"));
            for e in sm["spec"]["endpoints"].as_array().expect("endpoints") {
                assert!(
                    svc["spec"]["ports"].as_array().expect("ports").iter().any(|p| p["name"] == e["port"]),
                    "deploy/{dir}: the Service has no port {}",
                    e["port"]
                );
            }
        }
        for cert in objects.iter().filter(|o| o["kind"] == "Certificate") {
            let issuer = cert["spec"]["issuerRef"]["name"].as_str().expect("issuer");
            assert!(named("Issuer", issuer), "deploy/{dir}: no Issuer {issuer}");
        }
        for issuer in objects.iter().filter(|o| o["kind"] == "Issuer") {
            if let Some(secret) = issuer["spec"]["ca"]["secretName"].as_str() {
                assert!(
                    produced_secrets.contains(&secret),
                    "deploy/{dir}: no Certificate makes the CA Secret {secret}"
                );
            }
        }
    }
}

/// The deployed config's `kubelet_dir` is the one `serve` uses (the `--kubelet-dir` flag overrides
/// it only when given): a volume mounted under a kubelet directory named only in the config is
/// recognised as kubelet's.
#[test]
fn root_serve_takes_the_kubelet_dir_from_its_config() {
    use blockjanitor_tests::HostMount;
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "mount", "umount"]) else { return };
    let kdir = s.mkdir("kubelet-elsewhere");
    let target = kdir.join("plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-1");
    std::fs::create_dir_all(&target).expect("mkdir");
    let img = s.ext4_image("vol.img", 16);
    let lo = LoopDev::attach(&img);
    let mount = HostMount::new(&lo.dev, &target, &[]);
    // deploy/base's config, with the kubelet directory moved and the listeners on free ports.
    let base = std::fs::read_to_string(deploy::repo().join("deploy/base/agent.toml")).expect("read");
    let moved =
        base.replace("kubelet_dir = \"/var/lib/kubelet\"", &format!("kubelet_dir = \"{}\"", kdir.display()));
    assert_ne!(moved, base, "deploy/base/agent.toml names kubelet_dir");
    let moved = moved.replace("0.0.0.0:9910", "127.0.0.1:0").replace("0.0.0.0:9911", "127.0.0.1:0");
    let config = s.path("agent.toml");
    std::fs::write(&config, moved).expect("write config");
    let d = Daemon::start(s.dir.path(), &["--config", config.to_str().expect("utf8")]);
    let name = lo.name().to_owned();
    let mut last = Value::Null;
    let seen = wait_until(Duration::from_secs(20), || {
        let out = Command::new(agent_bin().with_file_name("agentctl"))
            .arg("--socket")
            .arg(&d.socket)
            .args(["device", &name, "-o", "json"])
            .output()
            .expect("agentctl");
        last = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let dev = if last["device"].is_object() { &last["device"] } else { &last };
        dev["kubelet_paths"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p.as_str() == Some(target.to_str().expect("utf8"))))
    });
    assert!(seen, "the config's kubelet_dir was not used: {last:#}\nlog:\n{}", d.log_text());
    drop(d);
    drop(mount);
}

/// The workspace's version and repository, from the top Cargo.toml.
fn workspace_package(field: &str) -> String {
    let text = std::fs::read_to_string(deploy::repo().join("Cargo.toml")).expect("read Cargo.toml");
    let doc: toml::Table = text.parse().expect("Cargo.toml is TOML");
    doc["workspace"]["package"][field]
        .as_str()
        .unwrap_or_else(|| panic!("workspace.package.{field}"))
        .to_owned()
}

/// Kubernetes' recommended labels are on every object of every rendering, and the version they
/// carry is the agent's own; no selector uses them (a new version must not orphan old pods).
#[test]
fn every_object_carries_the_recommended_labels() {
    let Some(all) = rendered("the recommended labels") else { return };
    let version = workspace_package("version");
    for (dir, objects) in &all {
        for o in objects {
            let what = format!("deploy/{dir}: {} {}", o["kind"], o["metadata"]["name"]);
            let labels = &o["metadata"]["labels"];
            for (k, want) in [
                ("app.kubernetes.io/name", "blockjanitor"),
                ("app.kubernetes.io/part-of", "blockjanitor"),
                ("app.kubernetes.io/instance", "blockjanitor"),
                ("app.kubernetes.io/managed-by", "kustomize"),
                ("app.kubernetes.io/version", version.as_str()),
            ] {
                assert_eq!(labels[k].as_str(), Some(want), "{what}: label {k} in {labels}");
            }
            for selector in [&o["spec"]["selector"]["matchLabels"], &o["spec"]["selector"]] {
                for k in [
                    "app.kubernetes.io/version",
                    "app.kubernetes.io/instance",
                    "app.kubernetes.io/managed-by",
                ] {
                    assert!(selector[k].is_null(), "{what}: its selector uses {k}: {selector}");
                }
            }
        }
    }
}

/// Every alert of both monitoring Components names its runbook: a URL in this repository
/// (Cargo.toml's `repository`, branch main) whose page exists under docs/runbooks/, named after
/// the alert; and every runbook page belongs to an alert.
#[test]
fn every_alert_has_a_runbook_that_exists() {
    let Some(all) = rendered("the runbooks") else { return };
    let prefix = format!("{}/blob/main/", workspace_package("repository"));
    let mut alerts = BTreeSet::new();
    for overlay in ["overlays/monitoring", "overlays/console-monitoring"] {
        let objects = all.get(overlay).unwrap_or_else(|| panic!("deploy/{overlay}"));
        let rules: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
        assert!(!rules.is_empty(), "deploy/{overlay} has no PrometheusRule");
        for rule in rules {
            let rule: deploy::PrometheusRule = serde_json::from_value(rule.clone()).expect("typed");
            for r in rule.spec.groups.iter().flat_map(|g| &g.rules) {
                let Some(alert) = &r.alert else { continue };
                let url = r
                    .annotations
                    .get("runbook_url")
                    .unwrap_or_else(|| panic!("deploy/{overlay}: alert {alert} has no runbook_url"));
                let path = url
                    .strip_prefix(&prefix)
                    .unwrap_or_else(|| panic!("alert {alert}: runbook_url {url} is not under {prefix}"));
                assert_eq!(path, format!("docs/runbooks/{alert}.md"), "alert {alert}: its runbook's name");
                let page = std::fs::read_to_string(deploy::repo().join(path))
                    .unwrap_or_else(|e| panic!("alert {alert}: runbook {path}: {e}"));
                assert!(page.starts_with(&format!("# {alert}")), "{path} is not {alert}'s page");
                alerts.insert(alert.clone());
            }
        }
    }
    for new in ["BlockJanitorDeviceUnresponsive", "BlockJanitorDevicesUnknown", "BlockJanitorConsoleDown"] {
        assert!(alerts.contains(new), "no alert {new}: {alerts:?}");
    }
    let pages = std::fs::read_dir(deploy::repo().join("docs/runbooks")).expect("docs/runbooks");
    for page in pages {
        let name = page.expect("entry").file_name().to_string_lossy().into_owned();
        let Some(alert) = name.strip_suffix(".md").filter(|n| *n != "README") else { continue };
        assert!(alerts.contains(alert), "docs/runbooks/{name} belongs to no alert");
    }
}

/// The agents' monitoring is a Component that combines with every mode and TLS overlay, as a
/// user's own kustomization lists it: the rendering keeps the overlay's mode, and adds the
/// metrics Service (selecting the DaemonSet's pods), the ServiceMonitor and PrometheusRule
/// (with the Prometheus operator's selector label) and the dashboard.
/// A user's kustomization in a scratch directory (kustomize takes only relative paths): the
/// resource `overlay` under deploy/ with the Components `components`, rendered.
fn combined(kubectl: &Path, overlay: &str, components: &[&str]) -> Result<Vec<Value>, String> {
    let root = deploy::repo().join("deploy");
    let s = Scratch::new();
    let up = "../".repeat(s.dir.path().components().count() - 1);
    let from_scratch =
        |p: &str| format!("{up}{}", root.join(p).display().to_string().trim_start_matches('/'));
    let mut k = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: blockjanitor\nresources:\n  - {}\n",
        from_scratch(overlay)
    );
    if !components.is_empty() {
        k.push_str("components:\n");
        for c in components {
            k.push_str(&format!("  - {}\n", from_scratch(&format!("components/{c}"))));
        }
    }
    std::fs::write(s.path("kustomization.yaml"), k).expect("write kustomization");
    render(kubectl, s.dir.path())
}

/// The agent container's declared ports.
fn agent_ports(ds: &Value) -> Vec<i64> {
    ds["spec"]["template"]["spec"]["containers"][0]["ports"]
        .as_array()
        .map(|ps| ps.iter().filter_map(|p| p["containerPort"].as_i64()).collect())
        .unwrap_or_default()
}

/// What the README documents: each mode (deploy/base, the mode overlays) with any of the
/// Components (tls, monitoring, both) in a kustomization of one's own, and the shipped overlays
/// that bundle them. Every one renders with its mode intact (the tls Component adds `[tcp]` and
/// nothing else: it once replaced the whole config, switching clean mode back to report), the
/// ports and the Service selectors its Components bring, and the monitoring objects under the
/// Prometheus operator's selector label.
#[test]
fn every_documented_combination_keeps_its_mode_and_components() {
    let kubectl = match kubectl() {
        Ok(k) => k,
        Err(why) => {
            require("combining the overlays and Components", &[why]);
            return;
        }
    };
    let root = deploy::repo().join("deploy");
    let selector = std::fs::read_to_string(root.join("components/prometheus-selector/selector.yaml"))
        .expect("the selector transformer");
    let selector: serde_yaml_ng::Value = serde_yaml_ng::from_str(&selector).expect("yaml");
    let (sel_key, sel_value) = selector["labels"]
        .as_mapping()
        .and_then(|m| m.iter().next())
        .map(|(k, v)| (k.as_str().expect("key").to_owned(), v.as_str().expect("value").to_owned()))
        .expect("one selector label");
    let modes = [
        ("base", Mode::Report),
        ("overlays/release-mode", Mode::Release),
        ("overlays/clean-mode", Mode::Clean),
    ];
    let mut cases: Vec<(String, Vec<&str>, Mode, bool, bool)> = Vec::new();
    for (overlay, mode) in modes {
        for components in [&[][..], &["tls"], &["monitoring"], &["tls", "monitoring"]] {
            let tls = components.contains(&"tls");
            cases.push((
                overlay.to_owned(),
                components.to_vec(),
                mode,
                tls,
                components.contains(&"monitoring"),
            ));
        }
    }
    for (overlay, tls, monitoring) in [
        ("overlays/tls", true, false),
        ("overlays/tls-manual", true, false),
        ("overlays/console", true, false),
        ("overlays/monitoring", false, true),
        // The console's own monitoring (its ServiceMonitor and alerts), not the agents'.
        ("overlays/console-monitoring", true, false),
    ] {
        cases.push((overlay.to_owned(), Vec::new(), Mode::Report, tls, monitoring));
    }
    for (overlay, components, mode, tls, monitoring) in cases {
        let what = format!("deploy/{overlay} + {components:?}");
        let objects = combined(&kubectl, &overlay, &components).unwrap_or_else(|e| panic!("{what}: {e}"));
        let c = agent_toml(&objects, &what);
        assert_eq!(c.mode, mode, "{what}: the mode");
        assert_eq!(c.tcp.listen.is_some(), tls, "{what}: the TCP listener");
        let ds = find(&objects, "DaemonSet", Some("blockjanitor"))
            .unwrap_or_else(|| panic!("{what}: no DaemonSet"));
        assert_eq!(
            agent_ports(ds).contains(&9443),
            tls,
            "{what}: the agent's TLS port: {:?}",
            agent_ports(ds)
        );
        let pod_labels = &ds["spec"]["template"]["metadata"]["labels"];
        assert_eq!(
            pod_labels["app.kubernetes.io/component"], "agent",
            "{what}: the agent's pods' component label"
        );
        for svc in objects.iter().filter(|o| o["kind"] == "Service") {
            let sel = svc["spec"]["selector"].as_object().expect("selector");
            if sel.get("app.kubernetes.io/component").is_some_and(|v| v == "agent") {
                for (k, v) in sel {
                    assert_eq!(
                        &pod_labels[k], v,
                        "{what}: Service {} misses the agent's pods",
                        svc["metadata"]["name"]
                    );
                }
            }
        }
        // Every ServiceMonitor and PrometheusRule (the agents' or the console's) is where the
        // Prometheus operator looks for it.
        for o in objects.iter().filter(|o| o["kind"] == "ServiceMonitor" || o["kind"] == "PrometheusRule") {
            assert_eq!(o["metadata"]["labels"][&sel_key], sel_value.as_str(), "{what}: the selector label");
            assert_eq!(o["metadata"]["namespace"], "blockjanitor", "{what}: the namespace");
        }
        let metrics_service = find(&objects, "Service", Some("blockjanitor-metrics")).is_some();
        assert_eq!(metrics_service, monitoring, "{what}: the agents' metrics Service");
        if monitoring {
            for kind in ["ServiceMonitor", "PrometheusRule"] {
                assert!(find(&objects, kind, None).is_some(), "{what}: no {kind}");
            }
            let svc = find(&objects, "Service", Some("blockjanitor-metrics"))
                .unwrap_or_else(|| panic!("{what}: no metrics Service"));
            for (k, v) in svc["spec"]["selector"].as_object().expect("selector") {
                assert_eq!(
                    &pod_labels[k], v,
                    "{what}: the metrics Service's selector {k} misses the agent's pods"
                );
            }
            let dashboard = objects
                .iter()
                .any(|o| o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1");
            assert!(dashboard, "{what}: no dashboard");
        }
    }
}
