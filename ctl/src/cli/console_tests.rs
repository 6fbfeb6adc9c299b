//! Unit tests of how `fleet` reaches the console: `--console` with files, or the kubeconfig
//! (the plugin's default), its namespace, context and credentials (the user's token, the
//! console's CA from a ConfigMap or a file; or a certificate of one's own).

use std::path::PathBuf;

use super::console::ConsoleRoute;
use super::tests::{parse, route};
use crate::kubectl::{CaSource, Credentials, Route};

fn kube(args: &[&str], plugin: bool) -> Route {
    let cli = parse(args).expect("parse");
    match route(&cli, plugin).expect("route") {
        ConsoleRoute::Kube(r) => r,
        other => panic!("{args:?}: {other:?}"),
    }
}

#[test]
fn the_plugin_goes_through_the_kubeconfig_by_default() {
    let r = kube(&["fleet", "nodes"], true);
    assert_eq!(r.kubeconfig, None);
    assert_eq!(r.context, None);
    assert_eq!(r.namespace(), "blockjanitor", "the shipped manifests' namespace");
    let published = Credentials::Kubeconfig { ca: CaSource::ConfigMap("blockjanitor-console-ca".into()) };
    assert_eq!(r.credentials, published, "the user's own token; the CA the console publishes");
    assert_eq!(r.server_name, "console.blockjanitor.svc", "the shipped serving certificate's name");
    // Apply too: the same person, whom the cluster's RBAC lets apply or not; no Secret is read.
    let r = kube(&["fleet", "apply", "node-a/rbd4", "--yes"], true);
    assert_eq!(r.credentials, published);
}

#[test]
fn kubectl_flags_name_the_kubeconfig_context_namespace_and_the_consoles_ca() {
    let r = kube(
        &[
            "fleet",
            "--kubeconfig",
            "/k",
            "--context",
            "b",
            "-n",
            "ops",
            "where",
            "x/y",
            "--ca-configmap",
            "me",
        ],
        false,
    );
    assert_eq!(r.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!((r.context.as_deref(), r.namespace()), (Some("b"), "ops"));
    assert_eq!(r.credentials, Credentials::Kubeconfig { ca: CaSource::ConfigMap("me".into()) });
    let r = kube(&["fleet", "nodes", "-n", "ops", "--ca", "a"], false);
    assert_eq!(
        r.credentials,
        Credentials::Kubeconfig { ca: CaSource::File("a".into()) },
        "a token, the CA from a file"
    );
    let r = kube(&["fleet", "nodes", "--namespace", "ops", "--cert", "c", "--key", "k", "--ca", "a"], false);
    assert_eq!(r.credentials, Credentials::Certificate { cert: "c".into(), key: "k".into(), ca: "a".into() });
    let r = kube(&["fleet", "nodes", "-n", "ops", "--server-name", "console.ops.svc"], false);
    assert_eq!(r.server_name, "console.ops.svc");
}

#[test]
fn conflicting_or_missing_routes_are_one_clear_line() {
    let err = |args: &[&str], plugin: bool| {
        let cli = parse(args).expect("parse");
        route(&cli, plugin).expect_err("refused").to_string()
    };
    let e = err(&["fleet", "nodes", "--console", "c:1", "--context", "b"], false);
    assert!(e.starts_with("--console and the kubeconfig flags"), "{e}");
    let e = err(&["fleet", "nodes", "--ca-configmap", "s", "--ca", "a"], false);
    assert!(e.starts_with("--ca-configmap and --ca both name the console's CA"), "{e}");
    let e = err(&["fleet", "nodes", "-n", "ops", "--cert", "c"], false);
    assert!(e.contains("go together"), "{e}");
    let e = err(&["fleet", "nodes"], false);
    assert!(e.starts_with("fleet needs the console: --context/-n/--kubeconfig"), "{e}");
}

#[test]
fn kubectl_flags_are_refused_outside_fleet() {
    let cli = parse(&["--context", "b", "devices"]).expect("parse");
    let e = super::run(&cli).expect_err("refused");
    assert_eq!(
        e.to_string(),
        "--kubeconfig, --context, -n, --console-namespace and --ca-configmap reach the fleet console: use them with `fleet`"
    );
}

/// `explain`'s -n is the object's namespace, as in kubectl: the console's is found by its labels
/// unless --console-namespace names it; the other commands keep -n for the console.
#[test]
fn explain_takes_n_for_the_object_and_finds_the_console_by_its_labels() {
    let r = kube(&["fleet", "explain", "pod/db-0", "-n", "shop"], true);
    assert_eq!((r.namespace.as_deref(), r.find_namespace), (None, true), "-n names the pod's namespace");
    let r = kube(&["fleet", "explain", "pod/db-0", "-n", "shop", "--console-namespace", "ops"], true);
    assert_eq!((r.namespace(), r.find_namespace), ("ops", false));
    let r = kube(&["fleet", "--console-namespace", "ops", "nodes"], true);
    assert_eq!((r.namespace(), r.find_namespace), ("ops", false), "every command takes it");
    let r = kube(&["fleet", "-n", "ops", "nodes"], true);
    assert_eq!((r.namespace(), r.find_namespace), ("ops", false));
    let cli = parse(&["fleet", "-n", "a", "--console-namespace", "b", "nodes"]).expect("parse");
    assert!(route(&cli, true).is_err(), "two namespaces for one console");
    // With --console, -n still names the object, not a second way to the console.
    let cli = parse(&[
        "fleet",
        "explain",
        "db-0",
        "-n",
        "shop",
        "--console",
        "c:9444",
        "--cert",
        "c",
        "--key",
        "k",
        "--ca",
        "a",
    ])
    .expect("parse");
    assert!(matches!(route(&cli, false), Ok(ConsoleRoute::Direct(_))), "{:?}", route(&cli, false));
}

#[test]
fn explain_objects_are_named_as_kubectl_names_them() {
    use super::fleet::explain_object;
    let ok = |o: &str| explain_object(o).map(|(k, n)| format!("{k} {n}")).expect(o);
    assert_eq!(ok("pod/db-0"), "pod db-0");
    assert_eq!(ok("db-0"), "pod db-0", "a bare name is a pod, as kubectl logs takes it");
    assert_eq!(ok("pvc/data-db-0"), "pvc data-db-0");
    assert_eq!(ok("persistentvolume/pvc-1"), "pv pvc-1");
    for bad in ["deploy/x", "pod/", "pod/a/b"] {
        assert!(explain_object(bad).is_err(), "{bad}");
    }
}
