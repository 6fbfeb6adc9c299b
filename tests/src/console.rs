//! Running the fleet console (`blockjanitor-console`, the real binary) in tests: its binary, the
//! process (SIGTERM on drop, SIGKILL on demand) with its listeners' addresses read from its JSON
//! log, its mutual-TLS files and flags, and the agents the console tests follow.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::child_log::{self, Log};
use crate::daemon::{fixture_agent, Daemon, Pki, ServerFiles};
use crate::kube_mock::ApiServer;
use crate::Scratch;

/// A binary built next to this test executable (`blockjanitor-console`, `agentctl`...).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join(name);
    assert!(bin.exists(), "{} is missing: build it first (cargo build --workspace --bins)", bin.display());
    bin
}

/// The console process, stopped with SIGTERM on drop; its listeners' addresses from its JSON log.
pub struct Console {
    pub child: Child,
    pub pid: u32,
    /// Its gRPC address.
    pub tcp: SocketAddr,
    pub metrics: SocketAddr,
    log: Log,
}

impl Console {
    /// Starts the console with `args`, its JSON log, and its gRPC and metrics listeners on free
    /// loopback ports; waits (20 s at most) until both listen.
    pub fn start(args: &[String]) -> Self {
        Self::start_configured(args, None, |_| {})
    }

    /// Like [`Console::start`], with `configure` applied to the command first (e.g. to start it
    /// in a network namespace); with `echo`, its log lines are also printed on stderr, each with
    /// that prefix.
    pub fn start_configured(
        args: &[String],
        echo: Option<&str>,
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let mut command = Command::new(bin("blockjanitor-console"));
        configure(&mut command);
        Self::start_command(command, args, echo)
    }

    /// Like [`Console::start_configured`], with `command` running the console (e.g. `ip netns
    /// exec NS blockjanitor-console`, which execs it).
    pub fn start_command(mut command: Command, args: &[String], echo: Option<&str>) -> Self {
        // A test that names the gRPC port (to advertise it to the other replica) gives `--listen`.
        if !args.iter().any(|a| a == "--listen") {
            command.args(["--listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .args(args)
            .args(["--log-format", "json", "--metrics-listen", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn blockjanitor-console");
        let pid = child.id();
        let echo = echo.map(|e| format!("{e} {pid}"));
        let (log, rx) = child_log::follow(child.stderr.take().expect("stderr"), echo);
        let (mut tcp, mut metrics) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(20);
        while tcp.is_none() || metrics.is_none() {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((l, a)) if l == "tcp" => tcp = a.parse().ok(),
                Ok((l, a)) if l == "metrics" => metrics = a.parse().ok(),
                Ok(_) => {}
                Err(_) => panic!("the console did not start listening; its log:\n{}", log.text()),
            }
        }
        Console { child, pid, tcp: tcp.expect("tcp"), metrics: metrics.expect("metrics"), log }
    }

    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// SIGKILL, as a node failure or an OOM kill does it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            child_log::stop(&mut self.child);
        }
    }
}

/// The files a console needs: its serving certificate (the PKI's server one), the CA, and its
/// client certificate towards the agents (identity `console`).
pub struct ConsoleFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub agent_cert: PathBuf,
    pub agent_key: PathBuf,
}

impl ConsoleFiles {
    /// Writes them into `dir`, the server files too.
    pub fn write(pki: &Pki, dir: &Path) -> Self {
        Self::with_server(pki, dir, pki.write_server(dir))
    }

    /// Writes the console's client certificate into `dir`, next to the server files `server`
    /// written already.
    pub fn with_server(pki: &Pki, dir: &Path, (cert, key, ca): ServerFiles) -> Self {
        let pem = pki.issue("console", &["console"]);
        let (agent_cert, agent_key) = (dir.join("console.crt"), dir.join("console.key"));
        std::fs::write(&agent_cert, &pem.cert).expect("write cert");
        std::fs::write(&agent_key, &pem.key).expect("write key");
        ConsoleFiles { cert, key, ca, agent_cert, agent_key }
    }

    /// The server files, as the agents serve them.
    pub fn server(&self) -> ServerFiles {
        (self.cert.clone(), self.key.clone(), self.ca.clone())
    }

    /// The console's TLS flags (`viewer` gets the viewer role), and the agents' server name as
    /// the test PKI issues it.
    pub fn args(&self, viewer: &str) -> Vec<String> {
        let p = |p: &PathBuf| p.to_string_lossy().into_owned();
        [
            ("--tls-cert", p(&self.cert)),
            ("--tls-key", p(&self.key)),
            ("--tls-client-ca", p(&self.ca)),
            ("--viewer", viewer.to_owned()),
            ("--agent-cert", p(&self.agent_cert)),
            ("--agent-key", p(&self.agent_key)),
            ("--agent-ca", p(&self.ca)),
            ("--agent-server-name", "localhost".to_owned()),
        ]
        .into_iter()
        .flat_map(|(f, v)| [f.to_owned(), v])
        .collect()
    }
}

/// The console's flags for its own mutual-TLS listener (the server files `tls`, the viewer
/// `dashboard`) and for reaching the agents as the console (a certificate issued here into `s`),
/// then `extra`.
pub fn console_args(s: &Scratch, pki: &Pki, tls: &ServerFiles, extra: &[&str]) -> Vec<String> {
    let mut args = ConsoleFiles::with_server(pki, s.dir.path(), tls.clone()).args("dashboard");
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// A real agent the console follows, in `dir/agent-NODE`: [`fixture_agent`] on a
/// free loopback port with the console's server files.
pub fn fleet_agent(dir: &Path, files: &ConsoleFiles, fixture: &str, node: &str) -> Daemon {
    let d = dir.join(format!("agent-{node}"));
    std::fs::create_dir_all(&d).expect("mkdir");
    fixture_agent(&d, fixture, node, "127.0.0.1:0", &files.server(), &[], |_| {})
}

/// Real agents the console follows, node `node-NNNN` serving `fixtures[NNNN]` (see
/// [`fleet_agent`]), and their `--agents` entries (`node-NNNN=ADDRESS`).
pub fn fleet_agents(dir: &Path, files: &ConsoleFiles, fixtures: &[&str]) -> (Vec<Daemon>, Vec<String>) {
    let agents: Vec<Daemon> = fixtures
        .iter()
        .enumerate()
        .map(|(i, fixture)| fleet_agent(dir, files, fixture, &format!("node-{i:04}")))
        .collect();
    let entries =
        agents.iter().enumerate().map(|(i, d)| format!("node-{i:04}={}", d.tcp.expect("tcp"))).collect();
    (agents, entries)
}

/// The flags the console tests' agents get besides [`fixture_agent`]'s: the viewer
/// role for `dashboard`, and no grace period.
const AGENT_ARGS: &[&str] = &["--tls-viewer", "dashboard", "--grace-period", "0"];

/// An agent as the console tests run it: [`fixture_agent`] with the viewer role
/// for `dashboard` and no grace period.
pub fn start_agent(dir: &Path, fixture: &str, node: &str, listen: &str, tls: &ServerFiles) -> Daemon {
    start_agent_configured(dir, fixture, node, listen, tls, |_| {})
}

/// Like [`start_agent`], with `configure` applied to the command (e.g. a network namespace).
pub fn start_agent_configured(
    dir: &Path,
    fixture: &str,
    node: &str,
    listen: &str,
    tls: &ServerFiles,
    configure: impl FnOnce(&mut Command),
) -> Daemon {
    fixture_agent(dir, fixture, node, listen, tls, AGENT_ARGS, configure)
}

/// The console's own bearer token towards a stand-in API server (its service account's).
pub const CONSOLE_TOKEN: &str = "console-sa-token";

/// Readies `api` for a console that reviews its callers there, and writes the console's
/// kubeconfig (`dir/NAME.kubeconfig`: [`CONSOLE_TOKEN`], the CA `ca` for HTTPS): that token may
/// create reviews, and the collections a console with the API watches are served (empty).
pub fn console_kubeconfig(dir: &Path, name: &str, api: &ApiServer, ca: &str) -> PathBuf {
    {
        let mut st = api.state.lock().expect("state");
        st.lists.entry("/api/v1/nodes").or_default();
        st.lists.entry("/api/v1/persistentvolumeclaims").or_default();
    }
    api.reviewer(CONSOLE_TOKEN);
    let yaml = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: sa\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {}\n\
users:\n- name: sa\n  user:\n    token: {CONSOLE_TOKEN}\ncontexts:\n- name: sa\n  context:\n    cluster: c\n    user: sa\n",
        api.url(),
        crate::kube_portforward::base64(ca.as_bytes())
    );
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, yaml).expect("write the console's kubeconfig");
    path
}
