//! The console's deployment is highly available as deploy/overlays/console renders it: 2+
//! replicas spread over nodes, a PodDisruptionBudget that keeps one, every replica named in the
//! apply Lease by its pod name, and RBAC for exactly that Lease; people reach it with their own
//! credentials (the console reviews them; the user Roles grant verbs on fleet.blockjanitor.io and
//! the published CA, no Secret). Needs kubectl (kustomize); skipped without it (an error in CI).

use std::collections::BTreeSet;

use blockjanitor_tests::deploy::{self, find, kubectl, render, require};
use serde_json::Value;

const LEASE: &str = "blockjanitor-console-apply";

/// deploy/overlays/console rendered; None (the test skipped, or failed under CI=true) without kubectl.
fn rendered_console() -> Option<Vec<Value>> {
    let kubectl = match kubectl() {
        Ok(k) => k,
        Err(why) => {
            require("rendering deploy/overlays/console", &[why]);
            return None;
        }
    };
    Some(render(&kubectl, &deploy::repo().join("deploy/overlays/console")).unwrap_or_else(|e| panic!("{e}")))
}

fn has_arg(args: &[Value], want: &str) -> bool {
    args.iter().any(|a| a.as_str() == Some(want))
}

#[test]
fn the_console_runs_as_spread_replicas_with_one_apply_lease() {
    let Some(objects) = rendered_console() else { return };
    let d = find(&objects, "Deployment", Some("blockjanitor-console")).expect("the console's Deployment");
    assert!(d["spec"]["replicas"].as_i64().unwrap_or(1) >= 2, "replicas: {}", d["spec"]["replicas"]);
    assert_eq!(d["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0, "a rollout keeps every replica");
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    let pod = &d["spec"]["template"]["spec"];
    let anti = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname", "spread over nodes: {pod}");
    assert_eq!(
        &anti["podAffinityTerm"]["labelSelector"]["matchLabels"],
        &d["spec"]["selector"]["matchLabels"]
    );
    let c = &pod["containers"][0];
    let args = c["args"].as_array().expect("args");
    assert!(has_arg(args, &format!("--apply-lease={LEASE}")), "{args:?}");
    assert!(has_arg(args, "--lease-identity=$(POD_NAME)"), "{args:?}");
    let env = c["env"].as_array().expect("env");
    assert!(
        env.iter()
            .any(|e| e["name"] == "POD_NAME" && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "POD_NAME from the downward API: {env:?}"
    );
    assert!(c["readinessProbe"].is_object(), "a readiness probe: the Service sends only to live replicas");
    // Ready once synced (issue 36), not when the port opens; the holder reachable at its pod IP.
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{}", c["readinessProbe"]);
    assert_eq!(c["readinessProbe"]["httpGet"]["port"], "metrics", "{}", c["readinessProbe"]);
    assert!(
        env.iter()
            .any(|e| e["name"] == "POD_IP" && e["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"),
        "POD_IP, the address the holder writes into the Lease: {env:?}"
    );
    assert!(
        has_arg(args, "--peer-console=console.blockjanitor.svc"),
        "the replicas forward to each other: {args:?}"
    );

    let pdb =
        find(&objects, "PodDisruptionBudget", Some("blockjanitor-console")).expect("a PodDisruptionBudget");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    for (k, v) in pdb["spec"]["selector"]["matchLabels"].as_object().expect("selector") {
        assert_eq!(&labels[k], v, "the PodDisruptionBudget selects the console's pods");
    }

    // The Lease: create (no name can be given), get and update of that one Lease, in the
    // console's namespace, bound to its ServiceAccount; nothing else writable.
    let role = find(&objects, "Role", Some("blockjanitor-console-lease")).expect("the Lease Role");
    let rules = role["rules"].as_array().expect("rules");
    let grants = |verb: &str, named: bool| {
        rules.iter().any(|r| {
            r["apiGroups"][0] == "coordination.k8s.io"
                && r["resources"][0] == "leases"
                && r["verbs"].as_array().is_some_and(|v| v.iter().any(|x| x == verb))
                && (!named || r["resourceNames"].as_array().is_some_and(|n| n.len() == 1 && n[0] == LEASE))
        })
    };
    assert!(grants("create", false) && grants("get", true) && grants("update", true), "{rules:?}");
    assert!(!rules
        .iter()
        .any(|r| r["verbs"].as_array().is_some_and(|v| v.iter().any(|x| x == "delete" || x == "*"))));
    let binding = find(&objects, "RoleBinding", Some("blockjanitor-console-lease")).expect("its binding");
    assert_eq!(binding["subjects"][0]["name"], pod["serviceAccountName"]);
    assert_eq!(
        binding["metadata"]["namespace"], d["metadata"]["namespace"],
        "the Lease is in the console's namespace"
    );
}

/// The console's built-in defaults are what the shipped Deployment runs with: every flag the
/// Deployment gives that has a default in `blockjanitor-console --help` gives that default (so a
/// console started by hand, or a manifest that leaves a flag out, finds the same agents with the
/// same server name).
#[test]
fn the_console_defaults_are_the_shipped_manifests() {
    let Some(objects) = rendered_console() else { return };
    let d = find(&objects, "Deployment", Some("blockjanitor-console")).expect("the console's Deployment");
    let args = d["spec"]["template"]["spec"]["containers"][0]["args"].as_array().expect("args");
    let help = std::process::Command::new(blockjanitor_tests::console::bin("blockjanitor-console"))
        .arg("--help")
        .output()
        .expect("run blockjanitor-console --help");
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    // `--flag <VALUE>` on one line, its help (ending in `[default: X]`) on the next ones.
    let mut defaults = std::collections::BTreeMap::new();
    let mut flag: Option<String> = None;
    for line in help.lines() {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("--") {
            flag = Some(rest.split([' ', '<']).next().unwrap_or_default().to_owned());
        }
        if let (Some(f), Some(i)) = (&flag, t.find("[default: ")) {
            let value = t[i + "[default: ".len()..].split(']').next().unwrap_or_default();
            defaults.insert(f.clone(), value.to_owned());
        }
    }
    for must in ["selector", "agent-server-name", "namespace", "agent-port", "listen"] {
        assert!(defaults.contains_key(must), "--{must} has no default in --help:\n{help}");
    }
    let mut compared = 0;
    for a in args.iter().filter_map(Value::as_str) {
        let Some((f, v)) = a.strip_prefix("--").and_then(|a| a.split_once('=')) else { continue };
        let Some(default) = defaults.get(f) else { continue };
        // A value the Deployment fills from the pod (the downward API) is not a default; JSON logs
        // are for the cluster's log collector, text (the default) for a person at a terminal.
        if v.starts_with("$(") || (f == "log-format" && v == "json") {
            continue;
        }
        assert_eq!(v, default, "the Deployment runs --{f}={v}, but the console's default is {default}");
        compared += 1;
    }
    assert!(compared >= 4, "only {compared} flags with defaults compared: {args:?}");
}

/// The rules of `kind` `name` that grant `verb` on `resource` in `group` (and, when the rule names
/// resources, `resource_name` among them).
fn grants(
    objects: &[Value],
    kind: &str,
    name: &str,
    group: &str,
    resource: &str,
    verb: &str,
) -> Option<Value> {
    let role = find(objects, kind, Some(name)).unwrap_or_else(|| panic!("no {kind} {name}"));
    let has = |list: &Value, want: &str| list.as_array().is_some_and(|l| l.iter().any(|x| x == want));
    role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .find(|r| has(&r["apiGroups"], group) && has(&r["resources"], resource) && has(&r["verbs"], verb))
        .cloned()
}

/// People reach the console as themselves: the console may review their tokens and access
/// (create TokenReviews and SubjectAccessReviews, cluster-wide) and publish its serving CA in the
/// one ConfigMap the plugin reads; the Roles people are bound to grant get/plan (viewer) and
/// also apply (operator) on fleet.blockjanitor.io, that ConfigMap, the pods and the port-forward,
/// and nothing else; the console lists no operator certificate.
#[test]
fn people_reach_the_console_with_their_own_credentials() {
    let Some(objects) = rendered_console() else { return };
    for (group, resource) in
        [("authentication.k8s.io", "tokenreviews"), ("authorization.k8s.io", "subjectaccessreviews")]
    {
        assert!(
            grants(&objects, "ClusterRole", "blockjanitor-console", group, resource, "create").is_some(),
            "the console cannot create {resource}"
        );
    }
    let d = find(&objects, "Deployment", Some("blockjanitor-console")).expect("the console's Deployment");
    let args: Vec<&str> = d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("args")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let ca = blockjanitor_ctl::kubectl::DEFAULT_CA_CONFIGMAP;
    assert!(args.contains(&format!("--publish-serving-ca={ca}").as_str()), "{args:?}");
    assert!(!args.iter().any(|a| a.starts_with("--operator")), "no operator certificate: {args:?}");
    let publish =
        grants(&objects, "Role", "blockjanitor-console-ca", "", "configmaps", "update").expect("update");
    assert_eq!(publish["resourceNames"], serde_json::json!([ca]), "the console writes that ConfigMap only");
    assert!(grants(&objects, "Role", "blockjanitor-console-ca", "", "configmaps", "create").is_some());

    for (role, verbs) in [
        ("blockjanitor-fleet-viewer", &["get", "plan"][..]),
        ("blockjanitor-fleet-operator", &["get", "plan", "apply"][..]),
    ] {
        for verb in ["get", "plan", "apply"] {
            let granted = grants(&objects, "Role", role, "blockjanitor.io", "fleet", verb).is_some();
            assert_eq!(granted, verbs.contains(&verb), "{role}: {verb} on fleet.blockjanitor.io");
        }
        let cm = grants(&objects, "Role", role, "", "configmaps", "get").expect("the CA's ConfigMap");
        assert_eq!(cm["resourceNames"], serde_json::json!([ca]), "{role}: that ConfigMap only");
        let r = find(&objects, "Role", Some(role)).expect("role");
        let resources: BTreeSet<String> = r["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .flat_map(|x| x["resources"].as_array().cloned().unwrap_or_default())
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect();
        let want: BTreeSet<String> =
            ["pods", "pods/portforward", "configmaps", "fleet"].into_iter().map(String::from).collect();
        assert_eq!(resources, want, "{role} grants exactly these");
    }
}
