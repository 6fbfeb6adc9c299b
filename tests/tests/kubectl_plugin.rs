//! The kubectl plugin as kubectl runs it: `kubectl-blockjanitor` (a symlink to agentctl in a
//! temporary directory) with a kubeconfig of two clusters (two stand-in API servers, one over
//! HTTPS) and several contexts, each cluster with a real console process on loopback that its API
//! server's `pods/portforward` leads to; the plugin finds the console's pod by the shipped
//! manifests' labels, reads the console's serving CA from the ConfigMap the console published
//! there (no Secret), and speaks gRPC over TLS through the forward, sending the context's own
//! token. Each console reviews that token with its API server (TokenReview) and asks it whether
//! the user may do the call's verb on `fleet.blockjanitor.io` in its namespace
//! (SubjectAccessReview), served by the stand-in from a table of users and RBAC bindings the test
//! sets ([`blockjanitor_tests::kube_review`]). Errors (a wrong context, a namespace without a
//! console or without its CA, the API server refusing, a forward that fails behind it, a user
//! RBAC refuses, a token nobody is, reviews that cannot be had) are one line and exit 1. And the
//! krew manifest names this binary and this repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use blockjanitor_tests::console::{
    bin, console_kubeconfig, start_agent, Console, ConsoleFiles, CONSOLE_TOKEN,
};
use blockjanitor_tests::daemon::{Daemon, Pki};
use blockjanitor_tests::kube_mock::{self, ApiServer};
use blockjanitor_tests::kube_portforward;
use blockjanitor_tests::{rt, wait_until, Scratch};
use serde_json::{json, Value};

/// Where cluster B's console runs (not the default namespace).
const OPS: &str = "tenant-ops";
/// The console's serving certificate name in the shipped manifests (the plugin's default).
const SERVER_NAME: &str = "console.blockjanitor.svc";
const VIEWER: &str = "viewer.blockjanitor.svc";
/// The ConfigMap the console publishes its serving CA in (the plugin's default).
const CA_MAP: &str = "blockjanitor-console-ca";
const FLEET: (&str, &str) = ("blockjanitor.io", "fleet");

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A console pod as the shipped Deployment makes it (labels, the `grpc` port).
fn console_pod(namespace: &str, name: &str, ready: bool) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "88",
                     "labels": {"app.kubernetes.io/name": "blockjanitor",
                                "app.kubernetes.io/component": "console"}},
        "spec": {"containers": [{"name": "console", "image": "blockjanitor",
                 "ports": [{"name": "grpc", "containerPort": 9444}, {"name": "metrics", "containerPort": 9912}]}]},
        "status": {"phase": if ready { "Running" } else { "Pending" }, "podIP": "10.244.0.9",
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
}

/// Waits until the console has published its CA in `namespace` (it does at start).
fn published(api: &ApiServer, namespace: &str, console: &Console) -> Value {
    let mut found = None;
    let ok = wait_until(Duration::from_secs(20), || {
        found = api.configmap(namespace, CA_MAP);
        found.is_some()
    });
    assert!(ok, "the console did not publish {namespace}/{CA_MAP}: {}", console.log_text());
    found.expect("configmap")
}

/// Two clusters, their consoles, the kubeconfig and the plugin's symlink.
struct Clusters {
    s: Scratch,
    a: ApiServer,
    b: ApiServer,
    kubeconfig: PathBuf,
    plugin: PathBuf,
    consoles: Vec<Console>,
    /// The viewer's certificate, key and the CA as files (for `--console`).
    viewer_files: [PathBuf; 3],
    agents: Vec<Daemon>,
}

impl Clusters {
    /// Cluster A: a console in `blockjanitor` following one unreachable static agent
    /// (`node-alpha`); cluster B: a console in [`OPS`] following a real agent (`node-b`,
    /// fixture incident1), a Pending replica listed before it, a namespace `broken` whose console
    /// pod forwards to a closed port, one (`noca`) with a console pod and no published CA. Each
    /// console reviews callers with its own API server (reviews cached 5 s, each within 1 s).
    /// Contexts: `a` (current; alice, who may get and plan on A), `b` (bob, group sre, who may get
    /// and plan in tenant-ops; namespace `shop`: not where the console is), `b-carol` (carol, who
    /// may also apply there), `b-dave` (dave, an operator too, never seen before), `b-eve` (eve,
    /// refused everything by the API server), `b-mallory` (a token nobody is).
    async fn start() -> Self {
        let s = Scratch::new();
        let pki = Pki::new("blockjanitor-ca");
        let agent_tls = pki.write_server(s.dir.path());
        let serving = pki.issue(SERVER_NAME, &[SERVER_NAME, "blockjanitor-console.blockjanitor.svc"]);
        let (cert, key) = (s.path("console-serving.crt"), s.path("console-serving.key"));
        std::fs::write(&cert, &serving.cert).expect("write");
        std::fs::write(&key, &serving.key).expect("write");
        let files = ConsoleFiles::with_server(&pki, s.dir.path(), (cert, key, agent_tls.2.clone()));
        let agent = start_agent(&s.mkdir("agent-b"), "incident1", "node-b", "127.0.0.1:0", &agent_tls);

        let node = kube_mock::node_object(kube_mock::ready_only());
        // A over plain HTTP, B over HTTPS (its certificate from the test CA, for 127.0.0.1), as
        // clusters are: the kubeconfig carries the CA.
        let (a, b) = (
            ApiServer::start(node.clone()).await,
            ApiServer::start_tls(node, &pki.server.cert, &pki.server.key).await,
        );
        a.user("alice-token", "alice", &["dev"]);
        a.grant("User:alice", FLEET.0, FLEET.1, &["get", "plan"], Some("blockjanitor"));
        b.user("bob-token", "bob", &["sre"]);
        b.grant("Group:sre", FLEET.0, FLEET.1, &["get", "plan"], Some(OPS));
        b.user("carol-token", "carol", &["storage-admins"]);
        b.grant("User:carol", FLEET.0, FLEET.1, &["get", "plan", "apply"], Some(OPS));
        b.user("dave-token", "dave", &[]);
        b.grant("User:dave", FLEET.0, FLEET.1, &["get", "plan", "apply"], Some(OPS));
        // Granted elsewhere only: no use in tenant-ops.
        b.grant("User:bob", FLEET.0, FLEET.1, &["apply"], Some("shop"));

        let console = |api: &ApiServer, namespace: &str, agents: String, name: &str| {
            let kubeconfig = console_kubeconfig(s.dir.path(), name, api, &pki.ca.cert);
            let mut args = files.args(VIEWER);
            args.extend(
                [
                    "--agents",
                    &agents,
                    "--connect-timeout-ms",
                    "500",
                    "--namespace",
                    namespace,
                    "--kubeconfig",
                    &kubeconfig.to_string_lossy(),
                    "--publish-serving-ca",
                    CA_MAP,
                    "--review-cache-seconds",
                    "5",
                    "--review-timeout-ms",
                    "1000",
                ]
                .map(str::to_owned),
            );
            Console::start(&args)
        };
        let console_a = console(&a, "blockjanitor", "node-alpha=https://127.0.0.1:9".into(), "a");
        let console_b = console(&b, OPS, format!("node-b=https://{}", agent.tcp.expect("agent tcp")), "b");
        published(&a, "blockjanitor", &console_a);
        let ca_map = published(&b, OPS, &console_b);
        {
            let mut st = a.state.lock().expect("state");
            st.lists.insert(
                "/api/v1/namespaces/blockjanitor/pods",
                vec![console_pod("blockjanitor", "blockjanitor-console-5c7d9-qx2lp", true)],
            );
        }
        a.forward("blockjanitor", "blockjanitor-console-5c7d9-qx2lp", console_a.tcp);
        {
            let mut st = b.state.lock().expect("state");
            st.lists.insert(
                "/api/v1/namespaces/tenant-ops/pods",
                vec![
                    console_pod(OPS, "blockjanitor-console-8f4b2-zz9kq", true),
                    console_pod(OPS, "blockjanitor-console-8f4b2-aa1bc", false),
                ],
            );
            // As the API server lists a namespace with no pods (or none at all): empty.
            st.lists.insert("/api/v1/namespaces/blockjanitor/pods", vec![]);
            st.lists.insert("/api/v1/namespaces/empty/pods", vec![]);
            // A console, and no CA published.
            st.lists.insert(
                "/api/v1/namespaces/noca/pods",
                vec![console_pod("noca", "blockjanitor-console-1a2b3-c4d5e", true)],
            );
            st.lists.insert(
                "/api/v1/namespaces/broken/pods",
                vec![console_pod("broken", "blockjanitor-console-0dead-beef0", true)],
            );
            st.forwards.configmaps.insert(("broken".into(), CA_MAP.into()), ca_map);
        }
        b.forward(OPS, "blockjanitor-console-8f4b2-zz9kq", console_b.tcp);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
        b.forward("broken", "blockjanitor-console-0dead-beef0", closed);
        b.forward("noca", "blockjanitor-console-1a2b3-c4d5e", console_b.tcp);
        b.forbid("eve-token", "/api/v1/namespaces/");

        let kubeconfig = s.path("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&a, &b, &pki.ca.cert)).expect("write kubeconfig");
        let plugin_dir = s.mkdir("bin");
        let plugin = plugin_dir.join("kubectl-blockjanitor");
        std::os::unix::fs::symlink(bin("agentctl"), &plugin).expect("symlink");
        let viewer = pki.issue(VIEWER, &[VIEWER]);
        let viewer_files = [s.path("viewer.crt"), s.path("viewer.key"), agent_tls.2.clone()];
        std::fs::write(&viewer_files[0], &viewer.cert).expect("write");
        std::fs::write(&viewer_files[1], &viewer.key).expect("write");
        Clusters {
            s,
            a,
            b,
            kubeconfig,
            plugin,
            consoles: vec![console_a, console_b],
            viewer_files,
            agents: vec![agent],
        }
    }

    /// Runs `program` as kubectl would run its plugin: the user's environment, KUBECONFIG set,
    /// no console address or certificate files in it.
    fn run(&self, program: &Path, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(program)
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.s.dir.path())
            .env_remove("BLOCKJANITOR_CONSOLE")
            .env_remove("BLOCKJANITOR_CERT")
            .env_remove("BLOCKJANITOR_KEY")
            .env_remove("BLOCKJANITOR_CA")
            .output()
            .expect("run the plugin");
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    fn plugin(&self, args: &[&str]) -> (i32, String, String) {
        self.run(&self.plugin, args)
    }

    /// A one-line error and exit `code`, never a panic.
    fn refused_with(&self, code: i32, args: &[&str]) -> String {
        let (got, out, err) = self.plugin(args);
        assert_eq!(got, code, "{args:?}: exit {got}\nstdout: {out}\nstderr: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(!err.contains("panicked"), "{err}");
        err
    }

    /// A one-line error and exit 1.
    fn refused(&self, args: &[&str]) -> String {
        self.refused_with(1, args)
    }

    /// The requests a user's token made to `api` (not the console's own).
    fn by(api: &ApiServer, token: &str) -> Vec<kube_mock::Recorded> {
        let want = format!("Bearer {token}");
        api.requests().into_iter().filter(|r| r.authorization == want).collect()
    }
}

fn kubeconfig_yaml(a: &ApiServer, b: &ApiServer, ca: &str) -> String {
    let mut y = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n\
clusters:\n- name: a\n  cluster:\n    server: {}\n- name: b\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n",
        a.url(),
        b.url(),
        kube_portforward::base64(ca.as_bytes())
    );
    y.push_str("users:\n");
    for u in ["alice", "bob", "carol", "dave", "eve", "mallory"] {
        y.push_str(&format!("- name: {u}\n  user:\n    token: {u}-token\n"));
    }
    y.push_str("contexts:\n- name: a\n  context:\n    cluster: a\n    user: alice\n");
    y.push_str("- name: b\n  context:\n    cluster: b\n    user: bob\n    namespace: shop\n");
    for u in ["carol", "dave", "eve", "mallory"] {
        y.push_str(&format!("- name: b-{u}\n  context:\n    cluster: b\n    user: {u}\n"));
    }
    y
}

/// (verb, resource, name) of a request the plugin makes, as RBAC sees it; a port-forward is
/// checked as both verbs an API server may ask for it.
fn rbac_terms(r: &kube_mock::Recorded) -> Vec<(&'static str, String, Option<String>)> {
    let rest = r.path.strip_prefix("/api/v1/namespaces/").and_then(|p| p.split_once('/')).map(|(_, p)| p);
    let parts: Vec<&str> = rest.unwrap_or_default().split('/').collect();
    match parts.as_slice() {
        ["pods"] => vec![("list", "pods".into(), None)],
        ["configmaps", name] => vec![("get", "configmaps".into(), Some((*name).to_owned()))],
        ["pods", name, "portforward"] => ["get", "create"]
            .into_iter()
            .map(|v| (v, "pods/portforward".to_owned(), Some((*name).to_owned())))
            .collect(),
        _ => panic!("a request the plugin should not make: {} {}", r.method, r.path),
    }
}

/// The shipped Role `role`'s rules, as deploy/overlays/console renders it (None: skipped without
/// kubectl, an error under CI=true).
fn rendered_role(role: &str) -> Option<Vec<Value>> {
    use blockjanitor_tests::deploy;
    let kubectl = match deploy::kubectl() {
        Ok(k) => k,
        Err(why) => {
            deploy::require("rendering deploy/overlays/console", &[why]);
            return None;
        }
    };
    let objects = deploy::render(&kubectl, &deploy::repo().join("deploy/overlays/console"))
        .unwrap_or_else(|e| panic!("{e}"));
    let rendered = deploy::find(&objects, "Role", Some(role)).unwrap_or_else(|| panic!("no Role {role}"));
    Some(rendered["rules"].as_array().expect("rules").clone())
}

/// Whether `rules` grant `verb` on `resource` (of `group`; `name` when the rule names some).
fn allows(rules: &[Value], group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    let has = |list: &Value, want: &str| list.as_array().is_some_and(|l| l.iter().any(|x| x == want));
    rules.iter().any(|rule| {
        has(&rule["apiGroups"], group)
            && has(&rule["resources"], resource)
            && has(&rule["verbs"], verb)
            && (rule["resourceNames"].is_null() || name.is_some_and(|n| has(&rule["resourceNames"], n)))
    })
}

/// The Role `role` as deploy/overlays/console renders it grants every request in `requests`, and
/// each fleet verb in `verbs` (what the console asked the API server about for that user).
fn check_granted(role: &str, requests: &[kube_mock::Recorded], verbs: &[&str]) {
    let Some(rules) = rendered_role(role) else { return };
    assert!(!requests.is_empty());
    for r in requests {
        for (verb, resource, name) in rbac_terms(r) {
            assert!(
                allows(&rules, "", &resource, verb, name.as_deref()),
                "{role} does not grant {verb} {resource} {name:?} ({} {}): {rules:?}",
                r.method,
                r.path
            );
        }
    }
    for verb in verbs {
        assert!(
            allows(&rules, FLEET.0, FLEET.1, verb, None),
            "{role} does not grant {verb} on fleet: {rules:?}"
        );
    }
}

fn node_names(out: &str) -> Vec<(String, bool)> {
    let v: Value = serde_json::from_str(out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut names: Vec<(String, bool)> = v["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{v:#}"))
        .iter()
        .map(|n| (n["name"].as_str().unwrap_or("").to_owned(), n["reachable"].as_bool().unwrap_or(false)))
        .collect();
    names.sort();
    names
}

/// The SubjectAccessReviews `api` received about `user`, as (verb, namespace).
fn access_asked(api: &ApiServer, user: &str) -> Vec<(String, String)> {
    api.reviews_received()
        .into_iter()
        .filter(|r| r.path.ends_with("/subjectaccessreviews") && r.body["spec"]["user"] == user)
        .map(|r| {
            let a = &r.body["spec"]["resourceAttributes"];
            assert_eq!((&a["group"], &a["resource"]), (&json!(FLEET.0), &json!(FLEET.1)), "{:#}", r.body);
            (a["verb"].as_str().unwrap_or("").to_owned(), a["namespace"].as_str().unwrap_or("").to_owned())
        })
        .collect()
}

/// The agent's audit lines for Apply requests.
fn apply_audits(d: &Daemon) -> Vec<Value> {
    d.log_text()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"] == "audit" && v["phase"] == "request")
        .collect()
}

#[test]
fn the_plugin_reaches_each_contexts_console_through_its_api_server() {
    rt().block_on(async {
        let c = Clusters::start().await;
        assert!(c.b.url().starts_with("https://"), "cluster B over HTTPS");
        // The current context (a), the default namespace (blockjanitor): cluster A's console.
        let (code, out, err) = c.plugin(&["nodes", "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(node_names(&out), vec![("node-alpha".to_owned(), false)], "{out}");
        let alice = Clusters::by(&c.a, "alice-token");
        let forwards: Vec<_> = alice.iter().filter(|r| r.path.ends_with("/portforward")).collect();
        assert_eq!(forwards.len(), 1, "one port-forward: {forwards:?}");
        assert_eq!(
            forwards[0].path,
            "/api/v1/namespaces/blockjanitor/pods/blockjanitor-console-5c7d9-qx2lp/portforward"
        );
        assert_eq!(forwards[0].query.get("ports").map(String::as_str), Some("9444"), "the pod's grpc port");
        assert!(
            alice.iter().any(|r| r.path == "/api/v1/namespaces/blockjanitor/configmaps/blockjanitor-console-ca"),
            "the console's CA from the ConfigMap it published: {alice:?}"
        );
        // The console reviewed alice's own token, with its own credentials, and asked RBAC.
        let tr: Vec<_> =
            c.a.reviews_received().into_iter().filter(|r| r.path.ends_with("/tokenreviews")).collect();
        assert!(!tr.is_empty(), "no TokenReview");
        assert!(tr.iter().all(|r| r.authorization == format!("Bearer {CONSOLE_TOKEN}")), "{tr:?}");
        assert_eq!(tr[0].body["spec"]["token"], "alice-token");
        assert!(tr[0].body["spec"]["audiences"].is_null(), "no audience: the API server's own");
        assert_eq!(access_asked(&c.a, "alice"), [("get".to_owned(), "blockjanitor".to_owned())]);
        assert!(Clusters::by(&c.b, "alice-token").is_empty(), "cluster B was not asked");

        // --context b -n tenant-ops: cluster B's console (the ready replica), as bob, until the
        // agent it follows is synced; the table too.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (code, out, err) = c.plugin(&["--context", "b", "-n", OPS, "nodes", "-o", "json"]);
            assert_eq!(code, 0, "{err}");
            if node_names(&out) == vec![("node-b".to_owned(), true)] {
                break;
            }
            assert!(Instant::now() < deadline, "node-b never reachable: {out}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let (code, out, err) = c.plugin(&["devices", "--context", "b", "-n", OPS, "--stale"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.lines().any(|l| l.starts_with("node-b") && l.contains("rbd4")), "{out}");
        let b_reqs = Clusters::by(&c.b, "bob-token");
        assert!(
            b_reqs.iter().any(|r| r.path == "/api/v1/namespaces/tenant-ops/configmaps/blockjanitor-console-ca"),
            "the console's CA from its ConfigMap: {b_reqs:?}"
        );
        assert!(!c.b.requests().iter().any(|r| r.path.contains("/secrets/")), "no Secret is read");
        assert!(
            b_reqs.iter().filter(|r| r.path.ends_with("/portforward")).all(|r| r.path
                == "/api/v1/namespaces/tenant-ops/pods/blockjanitor-console-8f4b2-zz9kq/portforward"),
            "the ready replica only: {b_reqs:?}"
        );
        assert!(
            !b_reqs.iter().any(|r| r.path.contains("/namespaces/shop/")),
            "the context's namespace is not used"
        );
        // Reviews are cached: the calls above (within the 5 s the console keeps an answer) cost a
        // few reviews, not one per call.
        let bob_reviews = c
            .b
            .reviews_received()
            .into_iter()
            .filter(|r| r.body["spec"]["token"] == "bob-token")
            .count();
        assert!(bob_reviews <= 3, "{bob_reviews} TokenReviews for bob's calls");

        // agentctl itself, with the kubeconfig flags.
        let kc = c.kubeconfig.to_string_lossy().into_owned();
        let (code, out, err) = c.run(
            &bin("agentctl"),
            &["fleet", "--kubeconfig", &kc, "--context", "b", "--namespace", OPS, "nodes", "-o", "json"],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(node_names(&out), vec![("node-b".to_owned(), true)], "{out}");

        // Every request the plugin made as bob is one the shipped viewer Role grants, and so is
        // every fleet verb the console asked about.
        let asked: Vec<String> = access_asked(&c.b, "bob").into_iter().map(|(v, _)| v).collect();
        let asked: Vec<&str> = asked.iter().map(String::as_str).collect();
        check_granted("blockjanitor-fleet-viewer", &Clusters::by(&c.b, "bob-token"), &asked);
        check_granted("blockjanitor-fleet-operator", &Clusters::by(&c.b, "bob-token"), &asked);

        // What the way through the API costs, per call (printed, not asserted): the plugin through
        // the port-forward (kubeconfig, pod list, CA, forward, TLS, reviews) against --console
        // direct with a certificate.
        let timed = |program: &Path, args: &[&str]| {
            let start = Instant::now();
            for _ in 0..5 {
                let (code, _, err) = c.run(program, args);
                assert_eq!(code, 0, "{err}");
            }
            start.elapsed() / 5
        };
        let through_api = timed(&c.plugin, &["nodes", "-o", "json"]);
        let [cert, key, ca] = c.viewer_files.clone().map(|p| p.to_string_lossy().into_owned());
        let addr = c.consoles[0].tcp.to_string();
        let direct = timed(
            &c.plugin,
            &["nodes", "-o", "json", "--console", &addr, "--cert", &cert, "--key", &key, "--ca", &ca, "--server-name", SERVER_NAME],
        );
        println!("kubectl-blockjanitor nodes, mean of 5: through the API server's port-forward {through_api:?}, direct {direct:?}");
    });
}

/// Acceptance for a person behind every Apply: two users with different RBAC on the same
/// cluster, through the plugin, to a real agent behind the console. Carol (whom a RoleBinding
/// lets apply on fleet.blockjanitor.io in the console's namespace) reaches the agent, whose audit
/// line names her (and her groups); bob (the viewer Role through his group; apply granted only in
/// another namespace) is refused PERMISSION_DENIED naming the verb, the resource, the namespace
/// and the Role to ask for, and nothing reaches the agent. A token the API server does not
/// authenticate is UNAUTHENTICATED. When the reviews cannot be had (the API server does not
/// answer them), every caller is refused UNAVAILABLE once their cached answer expires, and
/// nothing is forwarded.
#[test]
fn only_the_person_rbac_lets_apply_reaches_the_agent_and_the_audit_names_them() {
    rt().block_on(async {
        let c = Clusters::start().await;
        let agent = &c.agents[0];
        let ok = wait_until(Duration::from_secs(30), || {
            let (code, out, _) = c.plugin(&["--context", "b", "-n", OPS, "nodes", "-o", "json"]);
            code == 0 && node_names(&out) == vec![("node-b".to_owned(), true)]
        });
        assert!(ok, "node-b never reachable");
        let before = apply_audits(agent).len();

        // bob may plan (the viewer Role through his group), and the plan is the agent's.
        let (code, out, err) = c.plugin(&["--context", "b", "-n", OPS, "plan", "node-b/rbd4"]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(out.contains("rbd_unmap rbd4"), "{out}");
        // bob may not apply: refused by the console, naming what to ask for.
        let err = c.refused(&["--context", "b", "-n", OPS, "apply", "node-b/rbd4", "--yes"]);
        assert!(
            err.starts_with(
                "error: PermissionDenied: user bob may not 'apply' fleet.blockjanitor.io in namespace tenant-ops: \
                 ask for the blockjanitor-fleet-operator role"
            ),
            "{err}"
        );
        assert!(access_asked(&c.b, "bob").contains(&("apply".to_owned(), OPS.to_owned())));
        assert_eq!(apply_audits(agent).len(), before, "bob's Apply reached the agent");

        // carol may: her Apply reaches the agent on her behalf (a fixture tree: the agent then
        // refuses to act, exit 4, after the role check and the audit).
        let (code, out, err) = c.plugin(&["--context", "b-carol", "-n", OPS, "apply", "node-b/rbd4", "--yes"]);
        assert_eq!(code, 4, "past the console, refused by the agent on a fixture tree: {out}{err}");
        assert!(err.contains("the agent on node-b: "), "{err}");
        let ok = wait_until(Duration::from_secs(10), || apply_audits(agent).len() > before);
        assert!(ok, "carol's Apply never reached the agent: {}", agent.log_text());
        let audits = apply_audits(agent);
        assert_eq!(audits.len(), before + 1, "{audits:#?}");
        let line = audits.last().expect("audit");
        assert_eq!(line["caller"], "console", "the console forwards it: {line}");
        assert_eq!(line["on_behalf_of"], "carol", "{line}");
        assert_eq!(line["person"], "carol", "{line}");
        assert_eq!(line["groups"], "storage-admins,system:authenticated", "{line}");
        assert_eq!(line["devices"], "rbd4", "{line}");
        let console_log = c.consoles[1].log_text();
        assert!(
            console_log.contains("forwarding Apply to the agent on node-b for carol"),
            "the console's audit names carol: {console_log}"
        );
        assert!(console_log.contains("\"authenticated_by\":\"tokenreview\""), "{console_log}");

        // A token nobody is.
        let err = c.refused(&["--context", "b-mallory", "-n", OPS, "nodes"]);
        assert!(
            err.starts_with("error: Unauthenticated: the Kubernetes API server does not authenticate this token"),
            "{err}"
        );

        // The API server stops answering reviews: fail closed. dave, never seen, is refused at
        // once (within the review's deadline); carol too once her cached answer (5 s) is gone.
        c.b.hang_reviews(true);
        let err = c.refused(&["--context", "b-dave", "-n", OPS, "apply", "node-b/rbd4", "--yes"]);
        assert!(
            err.starts_with(
                "error: Unavailable: cannot review the caller with the Kubernetes API server (TokenReview): no \
                 answer within 1000 ms; nothing was done"
            ),
            "{err}"
        );
        tokio::time::sleep(Duration::from_secs(6)).await;
        let err = c.refused(&["--context", "b-carol", "-n", OPS, "apply", "node-b/rbd4", "--yes"]);
        assert!(err.starts_with("error: Unavailable: cannot review the caller"), "{err}");
        assert_eq!(apply_audits(agent).len(), before + 1, "nothing was forwarded while the reviews failed");
        c.b.hang_reviews(false);
    });
}

#[test]
fn a_wrong_context_no_console_a_refusal_and_a_failed_forward_are_one_clear_line() {
    rt().block_on(async {
        let c = Clusters::start().await;
        let err = c.refused(&["--context", "nope", "nodes"]);
        assert_eq!(
            err.trim_end(),
            "error: no context 'nope' in the kubeconfig (its contexts: a, b, b-carol, b-dave, b-eve, b-mallory)"
        );

        // Context b without -n: the console is looked for in blockjanitor, not in the context's
        // namespace (shop); neither has one.
        let err = c.refused(&["--context", "b", "nodes"]);
        assert!(err.starts_with("error: no console pod in namespace 'blockjanitor' (pods labelled "), "{err}");
        let err = c.refused(&["--context", "b", "-n", "empty", "sweep"]);
        assert!(err.starts_with("error: no console pod in namespace 'empty'"), "{err}");

        let err = c.refused(&["--context", "b-eve", "-n", OPS, "nodes"]);
        assert!(err.starts_with("error: forbidden: the API server ("), "{err}");
        assert!(
            err.contains("refuses to list the console's pods in namespace 'tenant-ops' to the kubeconfig's user: ")
                && err.contains("eve-token"),
            "{err}"
        );

        let err = c.refused(&["--context", "b", "-n", "noca", "nodes"]);
        assert!(
            err.starts_with("error: no ConfigMap blockjanitor-console-ca in namespace 'noca' (the console's serving CA"),
            "{err}"
        );

        let err = c.refused(&["--context", "b", "-n", "broken", "nodes"]);
        assert!(
            err.starts_with(
                "error: the port-forward to pod broken/blockjanitor-console-0dead-beef0 port 9444 failed: error forwarding port 9444"
            ),
            "{err}"
        );

        // A kubeconfig that is not there.
        let (code, _, err) = c.plugin(&["--kubeconfig", "/nonexistent/kubeconfig", "nodes"]);
        assert_eq!(code, 1);
        assert!(
            err.starts_with("error: cannot read the kubeconfig: /nonexistent/kubeconfig: No such file or directory"),
            "{err}"
        );

        // A user who authenticates to the API server with a client certificate: the console cannot
        // review it; the plugin says what to use instead, before sending anything to the console.
        let cert_kc = c.s.path("cert-kubeconfig");
        let pem = Pki::new("cluster client CA").issue("alice", &[]);
        let b64 = |s: &str| kube_portforward::base64(s.as_bytes());
        let yaml = std::fs::read_to_string(&c.kubeconfig).expect("read").replace(
            "- name: alice\n  user:\n    token: alice-token\n",
            &format!(
                "- name: alice\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
                b64(&pem.cert),
                b64(&pem.key)
            ),
        );
        std::fs::write(&cert_kc, yaml).expect("write");
        let kc = cert_kc.to_string_lossy().into_owned();
        let err = c.refused(&["--kubeconfig", &kc, "nodes"]);
        assert!(
            err.starts_with("error: context 'a' authenticates with a client certificate, which the console cannot review"),
            "{err}"
        );
    });
}

/// The krew manifest: a Plugin named after the binary (`kubectl-blockjanitor` is what krew
/// links; `kubectl blockjanitor` what users type), pointing at this repository, every platform's
/// `bin` the plugin's name.
#[test]
fn the_krew_manifest_names_the_binary_and_the_repository() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_owned();
    let text =
        std::fs::read_to_string(root.join("deploy/krew/blockjanitor.yaml")).expect("read the krew manifest");
    let m: Value = serde_yaml_ng::from_str(&text).expect("YAML");
    let cargo: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml")).expect("toml");
    let repository = cargo["workspace"]["package"]["repository"].as_str().expect("repository");
    let version = cargo["workspace"]["package"]["version"].as_str().expect("version");
    assert_eq!(m["apiVersion"], "krew.googlecontainertools.github.com/v1alpha2");
    assert_eq!(m["kind"], "Plugin");
    assert_eq!(m["metadata"]["name"], "blockjanitor", "kubectl blockjanitor");
    assert_eq!(m["spec"]["version"], format!("v{version}"));
    assert_eq!(m["spec"]["homepage"], repository);
    assert!(m["spec"]["shortDescription"].as_str().is_some_and(|d| !d.is_empty() && d.len() <= 50), "{m:#}");
    assert!(m["spec"]["description"].as_str().is_some_and(|d| d.contains("kubectl blockjanitor")), "{m:#}");
    let platforms = m["spec"]["platforms"].as_array().expect("platforms");
    assert!(!platforms.is_empty());
    for p in platforms {
        assert_eq!(p["bin"], "kubectl-blockjanitor", "{p:#}");
        let uri = p["uri"].as_str().expect("uri");
        assert!(uri.starts_with(&format!("{repository}/releases/download/v{version}/")), "{uri}");
        let sha = p["sha256"].as_str().expect("sha256");
        assert!(sha.len() == 64 && sha.chars().all(|c| c.is_ascii_hexdigit()), "{sha}");
        assert_eq!(p["selector"]["matchLabels"]["os"], "linux", "{p:#}");
        let files = p["files"].as_array().expect("files");
        assert!(files.iter().any(|f| f["from"] == "kubectl-blockjanitor"), "{p:#}");
        assert!(files.iter().any(|f| f["from"] == "LICENSE"), "{p:#}");
    }
    assert!(root.join("LICENSE").exists(), "the LICENSE the archive carries");
}

/// deploy/krew/package.sh packs the built agentctl as the manifest says (kubectl-blockjanitor
/// and LICENSE at the archive's top, where `files` takes them from) and writes the archive's
/// sha256 and the version into a copy of the manifest; the plugin it packs runs as the plugin.
#[test]
fn the_krew_package_script_packs_the_plugin_and_writes_its_sum() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("root").to_owned();
    let s = Scratch::new();
    let manifest = s.path("blockjanitor.yaml");
    std::fs::copy(root.join("deploy/krew/blockjanitor.yaml"), &manifest).expect("copy the manifest");
    let out_dir = s.mkdir("out");
    let out = Command::new(root.join("deploy/krew/package.sh"))
        .args([
            "9.8.7".as_ref(),
            bin("agentctl").as_os_str(),
            "amd64".as_ref(),
            out_dir.as_os_str(),
            manifest.as_os_str(),
        ])
        .output()
        .expect("run package.sh");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let archive = out_dir.join("kubectl-blockjanitor_v9.8.7_linux_amd64.tar.gz");
    let sum = Command::new("sha256sum").arg(&archive).output().expect("sha256sum");
    let sum = text(&sum.stdout).split_whitespace().next().expect("sum").to_owned();
    let m: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(&manifest).expect("read")).expect("YAML");
    assert_eq!(m["spec"]["version"], "v9.8.7");
    let platform = |arch: &str| {
        m["spec"]["platforms"]
            .as_array()
            .expect("platforms")
            .iter()
            .find(|p| p["selector"]["matchLabels"]["arch"] == arch)
            .cloned()
            .expect("platform")
    };
    let amd64 = platform("amd64");
    assert_eq!(amd64["sha256"], sum.as_str(), "{m:#}");
    assert!(
        amd64["uri"].as_str().is_some_and(
            |u| u.ends_with("/releases/download/v9.8.7/kubectl-blockjanitor_v9.8.7_linux_amd64.tar.gz")
        ),
        "{amd64:#}"
    );
    assert_ne!(platform("arm64")["sha256"], sum.as_str(), "only amd64's sum changes");

    let unpacked = s.mkdir("unpacked");
    let tar = Command::new("tar").arg("xzf").arg(&archive).arg("-C").arg(&unpacked).output().expect("tar");
    assert!(tar.status.success(), "{}", text(&tar.stderr));
    let mut names: Vec<String> = std::fs::read_dir(&unpacked)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["LICENSE", "kubectl-blockjanitor"]);
    // Run as krew links it: `kubectl-blockjanitor` is `agentctl fleet`.
    let help =
        Command::new(unpacked.join("kubectl-blockjanitor")).arg("--help").output().expect("run the plugin");
    assert!(help.status.success(), "{}", text(&help.stderr));
    assert!(
        text(&help.stdout).contains("who-watches") && text(&help.stdout).contains("--context"),
        "{}",
        text(&help.stdout)
    );
}

/// `kubectl blockjanitor explain`: as in kubectl, -n is the pod's namespace; the console's own is
/// found by its pods' labels in every namespace (cluster B's, tenant-ops, which no flag names), or,
/// for a user who may not list pods cluster-wide (the shipped Roles grant it in the console's
/// namespace only), in the shipped namespace; `--console-namespace` names it. The console reads the
/// pod and its events itself, with its own credentials: the user's token reaches the console's
/// namespace only.
#[test]
fn explain_takes_n_for_the_pod_and_finds_the_console_by_its_labels() {
    rt().block_on(async {
        let c = Clusters::start().await;
        {
            let mut st = c.b.state.lock().expect("state");
            let consoles = st.lists["/api/v1/namespaces/tenant-ops/pods"].clone();
            st.lists.entry("/api/v1/pods").or_default().extend(consoles);
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        let doc: Value = loop {
            let (code, out, err) =
                c.plugin(&["--context", "b-carol", "explain", "pod/web-0", "-n", "shop", "-o", "json"]);
            if code == 0 {
                break serde_json::from_str(&out).expect("JSON");
            }
            assert!(
                Instant::now() < deadline && err.contains("not synced"),
                "exit {code}: {err}{out}\n{}",
                c.consoles[1].log_text()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        };
        assert_eq!(
            (doc["document"].as_str(), doc["target"].as_str()),
            (Some("explanation"), Some("pod shop/web-0")),
            "{doc:#}"
        );
        assert_eq!(
            (doc["pod"]["node"].as_str(), doc["outcome"].as_str()),
            (Some("node-a"), Some("not_blocked")),
            "{doc:#}"
        );
        let carol = Clusters::by(&c.b, "carol-token");
        assert!(
            carol.iter().any(|r| r.path == "/api/v1/pods"
                && r.query.get("labelSelector").is_some_and(|l| l.contains("component=console"))),
            "the console found by its labels: {carol:?}"
        );
        assert!(carol
            .iter()
            .any(|r| r.path.starts_with("/api/v1/namespaces/tenant-ops/pods/")
                && r.path.ends_with("/portforward")));
        assert!(
            !carol.iter().any(|r| r.path.contains("/namespaces/shop/")),
            "the pod is the console's to read: {carol:?}"
        );
        // The console read the pod with its own credentials: the pod itself, or the pod list its
        // Kubernetes view keeps (a pod with a volume is kept from the list and watch).
        let console_reads: Vec<String> =
            c.b.requests()
                .into_iter()
                .filter(|r| r.authorization == format!("Bearer {CONSOLE_TOKEN}"))
                .map(|r| r.path)
                .collect();
        assert!(
            console_reads
                .iter()
                .any(|p| p == "/api/v1/namespaces/shop/pods/web-0" || p.starts_with("/api/v1/pods")),
            "the console read the pod with its own credentials: {console_reads:?}"
        );
        assert_eq!(access_asked(&c.b, "carol"), [("get".to_owned(), OPS.to_owned())], "explain is a get");

        // Bob may not list pods in every namespace: the shipped namespace is tried, where B has none.
        c.b.forbid("bob-token", "/api/v1/pods");
        let err = c.refused(&["--context", "b", "explain", "pod/web-0", "-n", "shop"]);
        assert!(
            err.contains("no console pod in namespace 'blockjanitor'") && err.contains("--console-namespace"),
            "{err}"
        );
        let (code, out, err) =
            c.plugin(&["--context", "b", "--console-namespace", OPS, "explain", "pod/web-0", "-n", "shop"]);
        assert_eq!(code, 0, "{err}");
        assert!(out.starts_with("pod shop/web-0 on node-a: Running\n"), "{out}");

        // The k9s plugin of docs/console.md, as written: on the selected pod, in its context.
        let (command, args) = k9s_plugin();
        assert_eq!(command, "kubectl");
        assert_eq!(args[0], "blockjanitor", "kubectl runs kubectl-blockjanitor with the rest");
        let args: Vec<String> = args[1..]
            .iter()
            .map(|a| a.replace("$NAMESPACE", "shop").replace("$NAME", "web-0").replace("$CONTEXT", "b-carol"))
            .collect();
        let (code, out, err) = c.plugin(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(out.starts_with("pod shop/web-0 on node-a: Running\n"), "{out}");
    });
}

/// The k9s plugin of docs/console.md (the ```yaml block of its section "k9s: explain on the
/// selected pod", which the README links to): its command and
/// arguments, after checking it is what k9s reads (plugins.<name>: shortCut, description,
/// scopes [pods], command, background false, args).
fn k9s_plugin() -> (String, Vec<String>) {
    let page = std::fs::read_to_string(blockjanitor_tests::deploy::repo().join("docs/console.md"))
        .expect("docs/console.md");
    let section = page.split("\n## ").find(|s| s.starts_with("k9s: explain")).expect("the section");
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let yaml = &section[start..start + section[start..].find("\n```").expect("closed")];
    let v: Value = serde_yaml_ng::from_str(yaml).expect("YAML");
    let plugins = v["plugins"].as_object().expect("plugins");
    assert_eq!(plugins.len(), 1, "{yaml}");
    let p = plugins.values().next().expect("one plugin");
    for key in ["shortCut", "description", "command"] {
        assert!(p[key].as_str().is_some_and(|s| !s.is_empty()), "{key}: {yaml}");
    }
    assert_eq!(p["scopes"], json!(["pods"]), "{yaml}");
    assert_eq!(p["background"], json!(false), "{yaml}");
    let args = p["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|a| a.as_str().expect("a string").to_owned())
        .collect();
    (p["command"].as_str().unwrap_or("").to_owned(), args)
}
