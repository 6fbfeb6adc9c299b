//! Benchmark of the fleet console (issue 11), printed as Markdown for BENCHMARKS.md.
//!
//! A fleet of 500 agents on loopback, every one a real gRPC server speaking `blockjanitor.v1.Agent`
//! over mutual TLS: 3 real `blockjanitor-agent serve` processes on fixture roots (incident 1's
//! old and new node, incident 3's multipath node) and 497 light in-process stand-ins (the
//! generated tonic server trait) serving generated device sets (20 devices each: a disk and its
//! partitions, 5 rbd mappings with their own images and client addresses, loop and nbd devices).
//! 25 addresses (5 %) refuse connections (nothing listens) and 25 stand-ins (5 %) answer every call
//! after 5 s, past the console's 1 s deadline. The real `blockjanitor-console` binary follows them
//! (static `--agents` list).
//!
//! Measured: index convergence after a cold start (every answering agent synced), `Where` and
//! `WhoWatches` latency from the index (2,000 calls each, p50/p99), forced fan-out (`Where` with
//! `fresh`, 30 calls, p50/p99/max) and the console's RSS.
//!
//! Run: `cargo build --release --bins && cargo bench -p blockjanitor-tests --bench console_fleet`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::{Agent, AgentServer};
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::daemon::{tls_channel, Daemon, Pki};
use blockjanitor_tests::measure::{ms, percentile, status_kib};
use tokio_stream::Stream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

const AGENTS: usize = 500;
const REFUSING: usize = 25;
const SLOW: usize = 25;
const REAL: usize = 3;
const DEVICES: usize = 20;

/// A stand-in agent: a generated device set, optionally slow.
struct StandIn {
    node: String,
    devices: Arc<Vec<pb::Device>>,
    delay: Duration,
}

fn devices_for(i: usize) -> Vec<pb::Device> {
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
            client_addr: format!("10.{}.{}.{}:0/{}", i / 65536, (i / 256) % 256, i % 256, 3_000_000 + i),
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

/// Raises the soft open-files limit to the hard one (the stand-ins, their connections and the
/// console's, which inherits it, need more than the usual 1,024).
fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local rlimit.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max.min(65_536);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim);
    }
    lim.rlim_cur
}

fn target_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    exe.parent().and_then(std::path::Path::parent).expect("target dir").to_owned()
}

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let nofile = raise_nofile();
    assert!(nofile >= 4096, "open-files limit {nofile}: raise the hard limit (ulimit -Hn) to run this bench");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("bench CA");
    let (cert, key, ca) = pki.write_server(dir.path());
    let console_pem = pki.issue("console", &["console"]);
    let (ccert, ckey) = (dir.path().join("console.crt"), dir.path().join("console.key"));
    std::fs::write(&ccert, &console_pem.cert).expect("write");
    std::fs::write(&ckey, &console_pem.key).expect("write");
    let fixtures = blockjanitor_tests::fixtures();

    // Real agents.
    let mut reals = Vec::new();
    for (i, fixture) in ["incident1", "incident1-newnode", "multipath-incident3"].iter().enumerate() {
        let d = dir.path().join(format!("real{i}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        let root = fixtures.join(fixture).to_string_lossy().into_owned();
        reals.push(Daemon::start_with_global(
            &d,
            &["--root", &root],
            &[
                "--listen",
                "127.0.0.1:0",
                "--tls-cert",
                cert.to_str().expect("utf8"),
                "--tls-key",
                key.to_str().expect("utf8"),
                "--tls-client-ca",
                ca.to_str().expect("utf8"),
                "--tls-console",
                "console",
                "--node-name",
                &format!("node-{i:03}"),
            ],
        ));
    }
    let mut entries: Vec<String> =
        reals.iter().enumerate().map(|(i, d)| format!("node-{i:03}={}", d.tcp.expect("tcp"))).collect();

    // Stand-ins, slow ones, refusing addresses.
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server.cert, &pki.server.key))
        .client_ca_root(Certificate::from_pem(&pki.ca.cert));
    let addrs: Vec<(usize, SocketAddr)> = rt.block_on(async {
        let mut out = Vec::new();
        for i in REAL..AGENTS {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = l.local_addr().expect("addr");
            if i >= AGENTS - REFUSING {
                drop(l); // nothing listens: connections are refused
                out.push((i, addr));
                continue;
            }
            let slow = i >= AGENTS - REFUSING - SLOW;
            let svc = StandIn {
                node: format!("node-{i:03}"),
                devices: Arc::new(devices_for(i)),
                delay: if slow { Duration::from_secs(5) } else { Duration::ZERO },
            };
            let router =
                Server::builder().tls_config(tls.clone()).expect("tls").add_service(AgentServer::new(svc));
            let incoming =
                tokio_stream::StreamExt::map(tokio_stream::wrappers::TcpListenerStream::new(l), |r| {
                    r.inspect(|s| {
                        let _ = s.set_nodelay(true);
                    })
                });
            tokio::spawn(router.serve_with_incoming(incoming));
            out.push((i, addr));
        }
        out
    });
    entries.extend(addrs.iter().map(|(i, a)| format!("node-{i:03}={a}")));
    let answering = AGENTS - REFUSING - SLOW;

    let started = Instant::now();
    let mut child = Command::new(target_dir().join("blockjanitor-console"))
        .args(["--listen", "127.0.0.1:0", "--log-format", "json"])
        .args(["--tls-cert", cert.to_str().expect("utf8"), "--tls-key", key.to_str().expect("utf8")])
        .args(["--tls-client-ca", ca.to_str().expect("utf8"), "--viewer", "bench"])
        .args(["--agent-cert", ccert.to_str().expect("utf8"), "--agent-key", ckey.to_str().expect("utf8")])
        .args(["--agent-ca", ca.to_str().expect("utf8"), "--agent-server-name", "localhost"])
        .args(["--call-timeout-ms", "1000", "--connect-timeout-ms", "1000", "--backoff-max-seconds", "5"])
        .arg("--agents")
        .arg(entries.join(","))
        .env("RUST_LOG", "warn,blockjanitor_console=info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the console");
    let stderr = child.stderr.take().expect("stderr");
    let pid = child.id();
    let _guard = Kill(child);
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                if std::env::var_os("BENCH_CONSOLE_LOG").is_some() {
                    eprintln!("console: {line}");
                }
                if v["listener"] == "tcp" {
                    if let Some(a) = v["address"].as_str().and_then(|a| a.parse().ok()) {
                        let _ = tx.send(a);
                    }
                }
            }
        }
    });
    let console_addr = rx.recv_timeout(Duration::from_secs(20)).expect("the console listens");
    let bench = pki.issue("bench", &["bench"]);

    rt.block_on(async {
        let ch = tls_channel(console_addr, &pki.ca.cert, Some((&bench.cert, &bench.key))).await.expect("connect");
        let mut c = FleetClient::new(ch).max_decoding_message_size(64 << 20);
        // Convergence: every answering agent synced.
        let converged = loop {
            let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
            let up = n.nodes.iter().filter(|x| x.reachable).count();
            if up >= answering {
                break started.elapsed();
            }
            assert!(started.elapsed() < Duration::from_secs(120), "no convergence: {up} of {answering} up");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let nodes = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let devices: u32 = nodes.nodes.iter().map(|n| n.devices).sum();
        let missing = nodes.missing_nodes.len();
        let rss_converged = status_kib(pid, "VmRSS:");

        let mut where_lat = Vec::new();
        for k in 0..2000 {
            let i = REAL + k % (answering - REAL);
            let req = pb::WhereRequest { image: format!("k8s/csi-vol-{i:04}-{}", k % 5), ..Default::default() };
            let t = Instant::now();
            let r = c.r#where(req).await.expect("Where").into_inner();
            where_lat.push(t.elapsed());
            assert_eq!(r.matches.len(), 1, "{r:?}");
        }
        let mut who_lat = Vec::new();
        for k in 0..2000 {
            let i = REAL + k % (answering - REAL);
            let text = format!(
                "Watchers:\n\twatcher=10.{}.{}.{}:0/{} client.{} cookie=18446462598732840961\n",
                i / 65536,
                (i / 256) % 256,
                i % 256,
                3_000_000 + i,
                100_000 + i
            );
            let t = Instant::now();
            let r = c.who_watches(pb::WhoWatchesRequest { text, ..Default::default() }).await.expect("WhoWatches").into_inner();
            who_lat.push(t.elapsed());
            assert_eq!(r.watchers[0].mappings.len(), 5, "{r:?}");
        }
        let mut fan = Vec::new();
        for k in 0..30 {
            let i = REAL + k % (answering - REAL);
            let req = pb::WhereRequest { image: format!("k8s/csi-vol-{i:04}-0"), fresh: true, ..Default::default() };
            let t = Instant::now();
            let r = c.r#where(req).await.expect("Where fresh").into_inner();
            fan.push(t.elapsed());
            assert_eq!(r.matches.len(), 1);
        }
        let rss = status_kib(pid, "VmRSS:");
        let hwm = status_kib(pid, "VmHWM:");
        where_lat.sort();
        who_lat.sort();
        fan.sort();
        println!("| figure | measured | target |");
        println!("|---|---|---|");
        println!("| agents (answering / slow / refusing) | {AGENTS} ({answering} / {SLOW} / {REFUSING}), {REAL} of them real | |");
        println!("| index after convergence | {} nodes, {devices} devices, {missing} missing | |", nodes.nodes.len());
        println!("| index convergence after cold start | {:.2} s | ≤ 5 s |", converged.as_secs_f64());
        println!("| `Where` from the index, p50 / p99 (2,000 calls) | {} / {} | p99 ≤ 50 ms |", ms(percentile(&where_lat, 0.5)), ms(percentile(&where_lat, 0.99)));
        println!("| `WhoWatches` from the index, p50 / p99 (2,000 calls) | {} / {} | p99 ≤ 50 ms |", ms(percentile(&who_lat, 0.5)), ms(percentile(&who_lat, 0.99)));
        println!("| forced fan-out (`Where` fresh), p50 / p99 / max (30 calls) | {} / {} / {} | p99 ≤ 2 s |", ms(percentile(&fan, 0.5)), ms(percentile(&fan, 0.99)), ms(fan[fan.len() - 1]));
        println!("| console RSS at convergence / after the queries (peak) | {:.1} / {:.1} MiB ({:.1} MiB) | ≤ 150 MiB |", rss_converged as f64 / 1024.0, rss as f64 / 1024.0, hwm as f64 / 1024.0);
    });
    drop(reals);
}
