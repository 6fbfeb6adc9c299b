//! grpc-python (gRPC's C core, from PyPI) against the real agent, with DEFAULT channel options
//! (issue 13): over the unix socket, where the C core sends the percent-encoded socket path as
//! `:authority` (h2 alone resets such streams), and over mutual TLS. Health, server reflection
//! v1 and v1alpha, ListDevices through a stub built from the reflected descriptors (no
//! generated code), and Apply refused to a viewer. The client is `tests/python/agent_client.py`,
//! run in the venv `tests/python/setup-venv.sh` makes (a cached one under /var/cache).
//!
//! Needs root (loop device, a client as another uid, the venv's cache), `losetup`, `setpriv`,
//! `python3` and PyPI: when one is missing it fails with CI=true and is skipped elsewhere.

use std::path::{Path, PathBuf};
use std::process::Command;

use blockjanitor_tests::daemon::{Daemon, Pki};
use blockjanitor_tests::*;

/// The venv's python, set up by `tests/python/setup-venv.sh`; None (after saying why) when the
/// test must be skipped; panics instead when CI=true.
fn venv_python() -> Option<PathBuf> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    let missing = |why: String| {
        assert!(!ci, "CI=true and grpc-python is unavailable: {why}");
        eprintln!("SKIPPED: {why}");
        None
    };
    if !nix::unistd::geteuid().is_root() {
        return missing("not root (the venv lives in /var/cache/blockjanitor-py)".into());
    }
    let venv =
        std::env::var("BLOCKJANITOR_PY_VENV").unwrap_or_else(|_| "/var/cache/blockjanitor-py/venv".into());
    let script = python_dir().join("setup-venv.sh");
    match Command::new(&script).arg(&venv).stdin(std::process::Stdio::null()).output() {
        Ok(o) if o.status.success() => Some(Path::new(&venv).join("bin/python")),
        Ok(o) => missing(format!("{} failed: {}", script.display(), text(&o.stderr))),
        Err(e) => missing(format!("cannot run {}: {e}", script.display())),
    }
}

fn python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python")
}

/// Runs agent_client.py (copied to `dir`, readable by any uid) with `args` under `wrapper`
/// (e.g. setpriv); returns its JSON answer.
fn run_client(python: &Path, dir: &Path, wrapper: &[&str], args: &[&str]) -> serde_json::Value {
    let client = dir.join("agent_client.py");
    std::fs::copy(python_dir().join("agent_client.py"), &client).expect("copy client");
    let mut cmd = match wrapper.split_first() {
        Some((w, rest)) => {
            let mut c = Command::new(w);
            c.args(rest).arg(python);
            c
        }
        None => Command::new(python),
    };
    let out = cmd.arg(&client).args(args).stdin(std::process::Stdio::null()).output().expect("run python");
    assert!(
        out.status.success(),
        "agent_client.py {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

/// What every answer must show: SERVING, both reflection versions listing the agent and
/// describing it, the test's loop device listed through either version's descriptors, and
/// Apply refused to the viewer.
fn assert_answer(over: &str, got: &serde_json::Value, loop_name: &str) {
    for name in ["", "blockjanitor.v1.Agent"] {
        assert_eq!(got["health"][name], "SERVING", "{over}: health of {name:?}: {got}");
    }
    for (version, own) in [
        ("v1", "grpc.reflection.v1.ServerReflection"),
        ("v1alpha", "grpc.reflection.v1alpha.ServerReflection"),
    ] {
        let services = strings(&got["reflection"][version]["services"]);
        for s in ["blockjanitor.v1.Agent", "grpc.health.v1.Health", own] {
            assert!(
                services.iter().any(|x| x == s),
                "{over}: reflection {version} lists {services:?}, not {s}"
            );
        }
        let files = strings(&got["reflection"][version]["files"]);
        assert!(
            files.iter().any(|f| f == "blockjanitor/v1/agent.proto"),
            "{over}: {version} files {files:?}"
        );
    }
    let devices = strings(&got["devices"]);
    assert!(devices.iter().any(|d| d == loop_name), "{over}: ListDevices lacks {loop_name}: {devices:?}");
    assert_eq!(
        got["devices"], got["devices_v1alpha"],
        "{over}: the same answer through v1alpha's descriptors"
    );
    assert_eq!(got["apply"], "PERMISSION_DENIED", "{over}: a viewer's Apply: {got}");
}

#[test]
fn root_grpc_python_default_options_over_socket_and_mtls() {
    if !require_real_kernel(&["losetup", "setpriv"]) {
        return;
    }
    let Some(python) = venv_python() else { return };
    let s = Scratch::new();
    // Reachable by uid 65534 (the socket viewer).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let lo = s.loop_file("py.img");

    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let viewer = pki.issue("dashboard", &["dashboard"]);
    let (vcert, vkey) = (s.path("viewer.crt"), s.path("viewer.key"));
    std::fs::write(&vcert, &viewer.cert).expect("write");
    std::fs::write(&vkey, &viewer.key).expect("write");
    let p = |p: &Path| p.to_str().expect("utf8").to_owned();
    let args = ["--socket-group", "1", "--tls-viewer", "dashboard"];
    let d = Daemon::start_tls(s.dir.path(), &[], "127.0.0.1:0", &tls, &args);
    // The C core's :authority for this socket is its path, percent-encoded: h2 refuses that.
    let authority = p(&d.socket).trim_start_matches('/').replace('/', "%2F");
    assert!(
        blockjanitor_rpc::authority::h2_refuses(authority.as_bytes()),
        "{authority} would not exercise issue 13"
    );

    // The unix socket, as uid 65534 in the socket's group (GID 1): a viewer.
    let target = format!("unix:{}", p(&d.socket));
    let got = run_client(
        &python,
        s.dir.path(),
        &["setpriv", "--reuid", "65534", "--regid", "1", "--clear-groups"],
        &["--target", &target, "--device", lo.name()],
    );
    assert_answer("unix socket", &got, lo.name());

    // Mutual TLS with the viewer's certificate.
    let addr = d.tcp.expect("tcp address logged");
    let target = format!("localhost:{}", addr.port());
    let got = run_client(
        &python,
        s.dir.path(),
        &[],
        &[
            "--target",
            &target,
            "--ca",
            &p(&tls.2),
            "--cert",
            &p(&vcert),
            "--key",
            &p(&vkey),
            "--device",
            lo.name(),
        ],
    );
    assert_answer("mTLS", &got, lo.name());
    assert!(lo.is_bound(), "the viewer's Apply left {} alone", lo.name());
}
