//! Running the fleet console in tests: its binary, the process (stopped with SIGTERM on drop) with
//! its listeners' addresses read from its JSON log, its mutual-TLS flags, and agents serving a
//! fixture root over TCP with mutual TLS. Shared by `tests/console.rs` and
//! `tests/console_liveness.rs`.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::daemon::{Daemon, Pki};
use crate::{fixtures, Scratch};

/// A binary built next to this test executable (`blockjanitor-console`, `agentctl`...).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: build it first (cargo build --workspace --bins)", bin.display());
    bin
}

/// The console process, stopped on drop; its listeners' addresses from its JSON log.
pub struct Console {
    pub child: Child,
    pub tcp: SocketAddr,
    pub metrics: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl Console {
    pub fn start(args: &[String]) -> Self {
        Self::start_configured(args, |_| {})
    }

    /// Like [`Console::start`], with `configure` applied to the command first (e.g. to start it
    /// in a network namespace).
    pub fn start_configured(args: &[String], configure: impl FnOnce(&mut Command)) -> Self {
        let mut command = Command::new(bin("blockjanitor-console"));
        configure(&mut command);
        let mut child = command
            .args(args)
            .args(["--log-format", "json", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn blockjanitor-console");
        let stderr = child.stderr.take().expect("stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel::<(String, String)>();
        let log2 = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line) {
                    if let (Some(l), Some(a)) = (v["listener"].as_str(), v["address"].as_str()) {
                        let _ = tx.send((l.to_owned(), a.to_owned()));
                    }
                }
                if let Ok(mut g) = log2.lock() {
                    g.push(line);
                }
            }
        });
        let (mut tcp, mut metrics) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while tcp.is_none() || metrics.is_none() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((l, a)) if l == "tcp" => tcp = a.parse().ok(),
                Ok((l, a)) if l == "metrics" => metrics = a.parse().ok(),
                Ok(_) => {}
                Err(_) => panic!(
                    "the console did not start listening; its log:\n{}",
                    log.lock().map(|g| g.join("\n")).unwrap_or_default()
                ),
            }
        }
        Console { child, tcp: tcp.expect("tcp"), metrics: metrics.expect("metrics"), log }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().map(|g| g.join("\n")).unwrap_or_default()
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        for _ in 0..250 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The console's flags for its own mutual-TLS listener (`cert`, `key`, the CA clients must come
/// from, with the viewer `dashboard`) and for reaching the agents as the console (a certificate
/// issued here, trusting the same CA, the agents' certificate for `localhost`), then `extra`.
pub fn console_args(
    s: &Scratch,
    pki: &Pki,
    (cert, key, ca): (&Path, &Path, &Path),
    extra: &[&str],
) -> Vec<String> {
    let console_pem = pki.issue("console", &["console"]);
    let (ccert, ckey) = (s.path("console.crt"), s.path("console.key"));
    std::fs::write(&ccert, console_pem.cert).expect("write cert");
    std::fs::write(&ckey, console_pem.key).expect("write key");
    let utf8 = |p: &Path| p.to_str().expect("utf8").to_owned();
    let mut args = vec![
        "--tls-cert".to_owned(),
        utf8(cert),
        "--tls-key".to_owned(),
        utf8(key),
        "--tls-client-ca".to_owned(),
        utf8(ca),
        "--viewer".to_owned(),
        "dashboard".to_owned(),
        "--agent-cert".to_owned(),
        utf8(&ccert),
        "--agent-key".to_owned(),
        utf8(&ckey),
        "--agent-ca".to_owned(),
        utf8(ca),
        "--agent-server-name".to_owned(),
        "localhost".to_owned(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// An agent serving `fixture` as node `node` on `listen` with mutual TLS (the console role for
/// the certificate named `console`, the viewer role for `dashboard`).
pub fn start_agent(
    dir: &Path,
    fixture: &str,
    node: &str,
    listen: &str,
    tls: &(PathBuf, PathBuf, PathBuf),
) -> Daemon {
    start_agent_configured(dir, fixture, node, listen, tls, |_| {})
}

/// Like [`start_agent`], with `configure` applied to the command (e.g. a network namespace).
pub fn start_agent_configured(
    dir: &Path,
    fixture: &str,
    node: &str,
    listen: &str,
    tls: &(PathBuf, PathBuf, PathBuf),
    configure: impl FnOnce(&mut Command),
) -> Daemon {
    let root = fixtures().join(fixture).to_string_lossy().into_owned();
    let (cert, key, ca) = tls;
    Daemon::start_configured(
        dir,
        &["--root", &root],
        &[
            "--listen",
            listen,
            "--tls-cert",
            cert.to_str().expect("utf8"),
            "--tls-key",
            key.to_str().expect("utf8"),
            "--tls-client-ca",
            ca.to_str().expect("utf8"),
            "--tls-console",
            "console",
            "--tls-viewer",
            "dashboard",
            "--grace-period",
            "0",
            "--node-name",
            node,
        ],
        configure,
    )
}
