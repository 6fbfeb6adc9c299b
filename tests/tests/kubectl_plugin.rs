//! The kubectl plugin as kubectl runs it: `kubectl-blockjanitor` (a symlink to agentctl in a
//! temporary directory) with a kubeconfig of two clusters (two stand-in API servers, one over
//! HTTPS) and three
//! contexts, each cluster with a real console process on loopback that its API server's
//! `pods/portforward` leads to; the plugin finds the console's pod by the shipped manifests'
//! labels, reads the viewer's client certificate from the Secret the manifests name with the
//! context's own token, and speaks gRPC with mutual TLS through the forward. Errors (a wrong
//! context, a namespace without a console, the API server refusing, a forward that fails behind
//! it) are one line and exit 1. And the krew manifest names this binary and this repository.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use blockjanitor_tests::console::{bin, start_agent, Console, ConsoleFiles};
use blockjanitor_tests::daemon::{Daemon, Pki};
use blockjanitor_tests::kube_mock::{self, ApiServer};
use blockjanitor_tests::kube_portforward;
use blockjanitor_tests::{rt, Scratch};
use serde_json::{json, Value};

/// Where cluster B's console runs (not the default namespace).
const OPS: &str = "tenant-ops";
/// The console's serving certificate name in the shipped manifests (the plugin's default).
const SERVER_NAME: &str = "console.blockjanitor.svc";
const VIEWER: &str = "viewer.blockjanitor.svc";

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
    _agents: Vec<Daemon>,
}

impl Clusters {
    /// Cluster A: a console in `blockjanitor` following one unreachable static agent
    /// (`node-alpha`); cluster B: a console in [`OPS`] following a real agent (`node-b`,
    /// fixture incident1), a Pending replica listed before it, a namespace `broken` whose console
    /// pod forwards to a closed port, one (`nosecret`) without the client certificate's Secret. Contexts: `a` (current; token alice), `b` (token bob,
    /// namespace `shop`: not where the console is), `b-eve` (token eve, refused everything).
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
        let console = |agents: String| {
            let mut args = files.args(VIEWER);
            args.extend(["--agents".into(), agents, "--connect-timeout-ms".into(), "500".into()]);
            Console::start(&args)
        };
        let console_a = console("node-alpha=https://127.0.0.1:9".into());
        let console_b = console(format!("node-b=https://{}", agent.tcp.expect("agent tcp")));

        let node = kube_mock::node_object(kube_mock::ready_only());
        // A over plain HTTP, B over HTTPS (its certificate from the test CA, for 127.0.0.1), as
        // clusters are: the kubeconfig carries the CA.
        let (a, b) = (
            ApiServer::start(node.clone()).await,
            ApiServer::start_tls(node, &pki.server.cert, &pki.server.key).await,
        );
        let viewer = pki.issue(VIEWER, &[VIEWER]);
        let operator = pki.issue("operator.blockjanitor.svc", &["operator.blockjanitor.svc"]);
        for (api, ns) in [(&a, "blockjanitor"), (&b, OPS), (&b, "broken")] {
            api.tls_secret(ns, "blockjanitor-viewer-tls", &viewer.cert, &viewer.key, &pki.ca.cert);
            api.tls_secret(ns, "blockjanitor-operator-tls", &operator.cert, &operator.key, &pki.ca.cert);
        }
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
            // A console, and no Secret with the client certificate.
            st.lists.insert(
                "/api/v1/namespaces/nosecret/pods",
                vec![console_pod("nosecret", "blockjanitor-console-1a2b3-c4d5e", true)],
            );
            st.lists.insert(
                "/api/v1/namespaces/broken/pods",
                vec![console_pod("broken", "blockjanitor-console-0dead-beef0", true)],
            );
        }
        b.forward(OPS, "blockjanitor-console-8f4b2-zz9kq", console_b.tcp);
        let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr");
        b.forward("broken", "blockjanitor-console-0dead-beef0", closed);
        b.forbid("eve-token", "/api/v1/namespaces/");
        // RBAC on the operator's Secret decides who may apply: bob may view, not clean.
        b.forbid("bob-token", "/secrets/blockjanitor-operator-tls");

        let kubeconfig = s.path("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_yaml(&a, &b, &pki.ca.cert)).expect("write kubeconfig");
        let plugin_dir = s.mkdir("bin");
        let plugin = plugin_dir.join("kubectl-blockjanitor");
        std::os::unix::fs::symlink(bin("agentctl"), &plugin).expect("symlink");
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
            _agents: vec![agent],
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

    /// A one-line error and exit 1, never a panic.
    fn refused(&self, args: &[&str]) -> String {
        let (code, out, err) = self.plugin(args);
        assert_eq!(code, 1, "{args:?}: exit {code}\nstdout: {out}\nstderr: {err}");
        assert!(out.is_empty(), "{args:?}: {out}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
        assert!(!err.contains("panicked"), "{err}");
        err
    }
}

fn kubeconfig_yaml(a: &ApiServer, b: &ApiServer, ca: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: a\n\
clusters:\n- name: a\n  cluster:\n    server: {}\n- name: b\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
users:\n- name: alice\n  user:\n    token: alice-token\n- name: bob\n  user:\n    token: bob-token\n\
- name: eve\n  user:\n    token: eve-token\n\
contexts:\n- name: a\n  context:\n    cluster: a\n    user: alice\n\
- name: b\n  context:\n    cluster: b\n    user: bob\n    namespace: shop\n\
- name: b-eve\n  context:\n    cluster: b\n    user: eve\n",
        a.url(),
        b.url(),
        kube_portforward::base64(ca.as_bytes())
    )
}

/// (verb, resource, name) of a request the plugin makes, as RBAC sees it; a port-forward is
/// checked as both verbs an API server may ask for it.
fn rbac_terms(r: &kube_mock::Recorded) -> Vec<(&'static str, String, Option<String>)> {
    let rest = r.path.strip_prefix("/api/v1/namespaces/").and_then(|p| p.split_once('/')).map(|(_, p)| p);
    let parts: Vec<&str> = rest.unwrap_or_default().split('/').collect();
    match parts.as_slice() {
        ["pods"] => vec![("list", "pods".into(), None)],
        ["secrets", name] => vec![("get", "secrets".into(), Some((*name).to_owned()))],
        ["pods", name, "portforward"] => ["get", "create"]
            .into_iter()
            .map(|v| (v, "pods/portforward".to_owned(), Some((*name).to_owned())))
            .collect(),
        _ => panic!("a request the plugin should not make: {} {}", r.method, r.path),
    }
}

/// The Role `role` as deploy/overlays/console renders it grants every request in `requests`
/// (skipped without kubectl, an error under CI=true).
fn check_granted(role: &str, requests: &[kube_mock::Recorded]) {
    use blockjanitor_tests::deploy;
    let kubectl = match deploy::kubectl() {
        Ok(k) => k,
        Err(why) => {
            deploy::require("rendering deploy/overlays/console", &[why]);
            return;
        }
    };
    let objects = deploy::render(&kubectl, &deploy::repo().join("deploy/overlays/console"))
        .unwrap_or_else(|e| panic!("{e}"));
    let rendered = deploy::find(&objects, "Role", Some(role)).unwrap_or_else(|| panic!("no Role {role}"));
    let rules = rendered["rules"].as_array().expect("rules");
    let has = |list: &Value, want: &str| list.as_array().is_some_and(|l| l.iter().any(|x| x == want));
    assert!(!requests.is_empty());
    for r in requests {
        for (verb, resource, name) in rbac_terms(r) {
            let granted = rules.iter().any(|rule| {
                has(&rule["apiGroups"], "")
                    && has(&rule["resources"], &resource)
                    && has(&rule["verbs"], verb)
                    && (rule["resourceNames"].is_null()
                        || name.as_deref().is_some_and(|n| has(&rule["resourceNames"], n)))
            });
            assert!(
                granted,
                "{role} does not grant {verb} {resource} {name:?} ({} {}): {rules:?}",
                r.method, r.path
            );
        }
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

#[test]
fn the_plugin_reaches_each_contexts_console_through_its_api_server() {
    rt().block_on(async {
        let c = Clusters::start().await;
        assert!(c.b.url().starts_with("https://"), "cluster B over HTTPS");
        // The current context (a), the default namespace (blockjanitor): cluster A's console.
        let (code, out, err) = c.plugin(&["nodes", "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        assert_eq!(node_names(&out), vec![("node-alpha".to_owned(), false)], "{out}");
        let forwards: Vec<_> =
            c.a.requests().into_iter().filter(|r| r.path.ends_with("/portforward")).collect();
        assert_eq!(forwards.len(), 1, "one port-forward: {forwards:?}");
        assert_eq!(
            forwards[0].path,
            "/api/v1/namespaces/blockjanitor/pods/blockjanitor-console-5c7d9-qx2lp/portforward"
        );
        assert_eq!(forwards[0].query.get("ports").map(String::as_str), Some("9444"), "the pod's grpc port");
        assert_eq!(forwards[0].authorization, "Bearer alice-token");
        assert!(c.b.requests().is_empty(), "cluster B was not asked: {:?}", c.b.requests());

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
        let b_reqs = c.b.requests();
        assert!(b_reqs.iter().all(|r| r.authorization == "Bearer bob-token"), "{b_reqs:?}");
        assert!(
            b_reqs.iter().any(|r| r.path == "/api/v1/namespaces/tenant-ops/secrets/blockjanitor-viewer-tls"),
            "the viewer's certificate from its Secret: {b_reqs:?}"
        );
        assert!(
            b_reqs.iter().filter(|r| r.path.ends_with("/portforward")).all(|r| r.path
                == "/api/v1/namespaces/tenant-ops/pods/blockjanitor-console-8f4b2-zz9kq/portforward"),
            "the ready replica only: {b_reqs:?}"
        );
        assert!(
            !b_reqs.iter().any(|r| r.path.contains("/namespaces/shop/")),
            "the context's namespace is not used"
        );

        // agentctl itself, with the kubeconfig flags.
        let kc = c.kubeconfig.to_string_lossy().into_owned();
        let (code, out, err) = c.run(
            &bin("agentctl"),
            &["fleet", "--kubeconfig", &kc, "--context", "b", "--namespace", OPS, "nodes", "-o", "json"],
        );
        assert_eq!(code, 0, "{err}");
        assert_eq!(node_names(&out), vec![("node-b".to_owned(), true)], "{out}");

        // Every request the plugin made as a viewer is one the shipped viewer Role grants.
        check_granted("blockjanitor-fleet-viewer", &c.b.requests());
        check_granted("blockjanitor-fleet-operator", &c.b.requests());

        // What the way through the API costs, per call (printed, not asserted): the plugin through
        // the port-forward (kubeconfig, pod list, Secret, forward, TLS) against --console direct.
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

        // Apply reads the operator's Secret: bob may not (RBAC decides), and says so.
        let err = c.refused(&["--context", "b", "-n", OPS, "apply", "node-b/rbd4", "--yes"]);
        assert!(
            err.starts_with("error: forbidden: the API server (")
                && err.contains("refuses to read the Secret blockjanitor-operator-tls")
                && err.contains("namespace 'tenant-ops'"),
            "{err}"
        );
    });
}

#[test]
fn a_wrong_context_no_console_a_refusal_and_a_failed_forward_are_one_clear_line() {
    rt().block_on(async {
        let c = Clusters::start().await;
        let err = c.refused(&["--context", "nope", "nodes"]);
        assert_eq!(err.trim_end(), "error: no context 'nope' in the kubeconfig (its contexts: a, b, b-eve)");

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

        let err = c.refused(&["--context", "b", "-n", "nosecret", "nodes"]);
        assert!(
            err.starts_with("error: no Secret blockjanitor-viewer-tls in namespace 'nosecret' (the client certificate"),
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
