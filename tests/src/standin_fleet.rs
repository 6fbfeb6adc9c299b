//! A fleet for the console's bench and tests: light stand-in agents (the generated tonic server
//! trait, real gRPC over mutual TLS on loopback, generated device sets, optionally slow),
//! addresses that refuse connections, and console processes (`blockjanitor-console`, the real
//! binary) found by their JSON log and killed on drop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::{Agent, AgentServer};
use tokio_stream::Stream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use crate::daemon::Pki;

/// Devices each stand-in serves.
pub const DEVICES: usize = 20;

/// A stand-in agent: a generated device set, optionally slow.
pub struct StandIn {
    pub node: String,
    pub devices: Arc<Vec<pb::Device>>,
    /// Every call waits this long before answering.
    pub delay: Duration,
}

/// The rbd client address of stand-in `i` (`10.a.b.c:0/NONCE`).
pub fn client_addr(i: usize) -> String {
    format!("10.{}.{}.{}:0/{}", i / 65536, (i / 256) % 256, i % 256, 3_000_000 + i)
}

/// Stand-in `i`'s [`DEVICES`] devices: a disk and 4 partitions, 5 rbd mappings (images
/// `k8s/csi-vol-{i:04}-{0..5}`, client `client.{100000+i}` at [`client_addr`]), 6 loop and 4
/// nbd devices.
pub fn devices_for(i: usize) -> Vec<pb::Device> {
    let mut v = Vec::with_capacity(DEVICES);
    let dev = |name: String, kind: pb::DeviceKind, verdict: pb::Verdict| pb::Device {
        name,
        kind: kind as i32,
        verdict: verdict as i32,
        size_bytes: 10 << 30,
        ..Default::default()
    };
    v.push(dev("sda".into(), pb::DeviceKind::Disk, pb::Verdict::InUse));
    for p in 1..=4 {
        v.push(dev(format!("sda{p}"), pb::DeviceKind::Partition, pb::Verdict::InUse));
    }
    for r in 0..5 {
        let mut d = dev(
            format!("rbd{r}"),
            pb::DeviceKind::Rbd,
            if r == 0 { pb::Verdict::Stale } else { pb::Verdict::InUse },
        );
        d.rbd = Some(pb::RbdMapping {
            id: r as u32,
            pool: "k8s".into(),
            image: format!("csi-vol-{i:04}-{r}"),
            image_id: format!("{:x}", i * 100 + r),
            snap: "-".into(),
            client_id: format!("client.{}", 100_000 + i),
            client_addr: client_addr(i),
            cluster_fsid: "b2e1c3d4-5f60-4a7b-8c9d-0e1f2a3b4c5d".into(),
            ..Default::default()
        });
        d.pv_names = vec![format!("pvc-{i:04}-{r}")];
        v.push(d);
    }
    for l in 0..6 {
        v.push(dev(format!("loop{l}"), pb::DeviceKind::Loop, pb::Verdict::Unused));
    }
    for n in 0..4 {
        let mut d = dev(format!("nbd{n}"), pb::DeviceKind::Nbd, pb::Verdict::Unused);
        d.nbd_backend = format!("k8s/nbd-{i}-{n}");
        v.push(d);
    }
    v
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for StandIn {
    async fn get_node(&self, _: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(pb::Node {
            name: self.node.clone(),
            devices: self.devices.len() as u32,
            mode: "report".into(),
            ..Default::default()
        }))
    }
    async fn list_devices(
        &self,
        _: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(pb::ListDevicesResponse {
            devices: self.devices.to_vec(),
            scan_unix_seconds: 1.0,
            scan: 1,
        }))
    }
    async fn get_device(&self, _: Request<pb::GetDeviceRequest>) -> Result<Response<pb::Device>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn list_holders(
        &self,
        _: Request<pb::ListHoldersRequest>,
    ) -> Result<Response<pb::ListHoldersResponse>, Status> {
        Err(Status::unimplemented("stand-in"))
    }
    async fn plan(&self, _: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        Ok(Response::new(pb::PlanResponse::default()))
    }
    async fn apply(&self, _: Request<pb::ApplyRequest>) -> Result<Response<pb::ApplyResponse>, Status> {
        Err(Status::permission_denied("stand-in"))
    }
    type WatchEventsStream = EventStream;
    async fn watch_events(
        &self,
        _: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(Box::pin(tokio_stream::pending())))
    }
}

/// The stand-ins' server TLS: the PKI's server certificate, clients signed by its CA.
pub fn server_tls(pki: &Pki) -> ServerTlsConfig {
    ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server.cert, &pki.server.key))
        .client_ca_root(Certificate::from_pem(&pki.ca.cert))
}

/// Serves `svc` on a fresh `127.0.0.1` port (a task on the current runtime, `TCP_NODELAY` on
/// every accepted connection); returns its address.
pub async fn serve(tls: &ServerTlsConfig, svc: StandIn) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind a stand-in");
    let addr = l.local_addr().expect("addr");
    let router = Server::builder().tls_config(tls.clone()).expect("tls").add_service(AgentServer::new(svc));
    let incoming = tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(l), |r| {
        r.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    });
    tokio::spawn(router.serve_with_incoming(incoming));
    addr
}

/// A loopback address where nothing listens (bound, then closed): connections are refused.
pub async fn refusing() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    l.local_addr().expect("addr")
}

/// Raises the soft open-files limit towards the hard one (at most `want`); returns the new
/// soft limit. The stand-ins, their connections and the consoles (which inherit it) need more
/// than the usual 1,024.
pub fn raise_nofile(want: u64) -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max.min(want).max(lim.rlim_cur);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
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
    /// Writes them into `dir`.
    pub fn write(pki: &Pki, dir: &Path) -> Self {
        let (cert, key, ca) = pki.write_server(dir);
        let pem = pki.issue("console", &["console"]);
        let (agent_cert, agent_key) = (dir.join("console.crt"), dir.join("console.key"));
        std::fs::write(&agent_cert, &pem.cert).expect("write");
        std::fs::write(&agent_key, &pem.key).expect("write");
        ConsoleFiles { cert, key, ca, agent_cert, agent_key }
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

/// A real `blockjanitor-agent serve` on fixture `fixture` (a directory of
/// [`crate::fixtures`]), as node `node`, serving mutual TLS on a free loopback port with the
/// console's certificate (identity `console`) given the console role.
pub fn real_agent(dir: &Path, files: &ConsoleFiles, fixture: &str, node: &str) -> crate::daemon::Daemon {
    let d = dir.join(format!("agent-{node}"));
    std::fs::create_dir_all(&d).expect("mkdir");
    let root = crate::fixtures().join(fixture).to_string_lossy().into_owned();
    let p = |p: &PathBuf| p.to_string_lossy().into_owned();
    let (cert, key, ca) = (p(&files.cert), p(&files.key), p(&files.ca));
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--tls-cert",
        &cert,
        "--tls-key",
        &key,
        "--tls-client-ca",
        &ca,
        "--tls-console",
        "console",
        "--node-name",
        node,
    ];
    crate::daemon::Daemon::start_with_global(&d, &["--root", &root], &args)
}

/// A `blockjanitor-console` process (JSON log on stderr, listening on a free loopback port),
/// killed on drop.
pub struct ConsoleProc {
    child: Child,
    pub pid: u32,
    /// Its gRPC address.
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
}

impl ConsoleProc {
    /// Starts `bin` with `args` and waits (20 s at most) for its gRPC listener. With `echo`,
    /// its log lines are also printed on stderr.
    pub fn start(bin: &Path, args: &[String], echo: bool) -> Self {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
            .args(args)
            .env("RUST_LOG", "warn,blockjanitor_console=info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", bin.display()));
        let stderr = child.stderr.take().expect("stderr");
        let pid = child.id();
        let log = Arc::new(Mutex::new(Vec::new()));
        let log2 = Arc::clone(&log);
        let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("console {pid}: {line}");
                }
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if let Some(a) = v["address"].as_str().filter(|_| v["listener"] == "tcp") {
                        if let Ok(a) = a.parse() {
                            let _ = tx.send(a);
                        }
                    }
                }
                if let Ok(mut g) = log2.lock() {
                    g.push(line);
                }
            }
        });
        let addr = rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| {
            panic!(
                "the console did not listen; its log:\n{}",
                log.lock().map(|g| g.join("\n")).unwrap_or_default()
            )
        });
        ConsoleProc { child, pid, addr, log }
    }

    /// Its log so far.
    pub fn log_text(&self) -> String {
        self.log.lock().map(|g| g.join("\n")).unwrap_or_default()
    }

    /// SIGKILL, as a node failure or an OOM kill does it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ConsoleProc {
    fn drop(&mut self) {
        self.kill();
    }
}
