//! Unit tests of how `fleet` reaches the console: `--console` with files, or the kubeconfig
//! (the plugin's default), its namespace, context and client certificate.

use std::path::PathBuf;

use super::console::ConsoleRoute;
use super::tests::{parse, route};
use crate::kubectl::{Identity, Route};

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
    assert_eq!(r.identity, Identity::Secret("blockjanitor-viewer-tls".into()));
    assert_eq!(r.server_name, "console.blockjanitor.svc", "the shipped serving certificate's name");
    // Apply needs the operator role: the operator's Secret (RBAC on it decides who may).
    let r = kube(&["fleet", "apply", "node-a/rbd4", "--yes"], true);
    assert_eq!(r.identity, Identity::Secret("blockjanitor-operator-tls".into()));
}

#[test]
fn kubectl_flags_name_the_kubeconfig_context_namespace_and_secret() {
    let r = kube(
        &["fleet", "--kubeconfig", "/k", "--context", "b", "-n", "ops", "where", "x/y", "--tls-secret", "me"],
        false,
    );
    assert_eq!(r.kubeconfig, Some(PathBuf::from("/k")));
    assert_eq!((r.context.as_deref(), r.namespace()), (Some("b"), "ops"));
    assert_eq!(r.identity, Identity::Secret("me".into()));
    let r = kube(&["fleet", "nodes", "--namespace", "ops", "--cert", "c", "--key", "k", "--ca", "a"], false);
    assert_eq!(r.identity, Identity::Files { cert: "c".into(), key: "k".into(), ca: "a".into() });
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
    let e = err(&["fleet", "nodes", "--tls-secret", "s", "--cert", "c", "--key", "k", "--ca", "a"], false);
    assert!(e.starts_with("--tls-secret and --cert/--key/--ca"), "{e}");
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
        "--kubeconfig, --context, -n and --tls-secret reach the fleet console: use them with `fleet`"
    );
}
