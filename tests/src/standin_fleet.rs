//! Stand-in agents for the console's bench and tests: light servers of the generated tonic
//! trait (real gRPC over mutual TLS on loopback, generated device sets, optionally slow), and
//! addresses that refuse connections. The console process and real agents are in
//! [`crate::console`] and [`crate::daemon`].
//!
//! A stand-in's devices can change while it serves ([`NodeState::change`]): the change is what
//! its next `ListDevices` answers, and every open `WatchEvents` stream gets it as an event, as a
//! real agent sends one after a scan (a subscriber that falls behind gets `EVENTS_DROPPED`, as from
//! a real agent, and reads the list again). Without changes the stream stays open and silent.
//! Its `ListDevices` alone can be slowed while it serves ([`NodeState::slow_lists`]): a slow agent
//! whose link stays alive (its stream open, `GetNode` answered at once).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// Its devices as they are now, and the subscribers of its events.
    pub state: Arc<NodeState>,
    /// Every call waits this long before answering.
    pub delay: Duration,
}

impl StandIn {
    pub fn new(node: String, devices: Vec<pb::Device>, delay: Duration) -> Self {
        StandIn { node, state: Arc::new(NodeState::new(devices)), delay }
    }
}

/// Events a subscriber may fall behind by before it is told it missed some.
const EVENT_BACKLOG: usize = 64;

/// A stand-in's devices as they change, its scan count, and its event subscribers.
pub struct NodeState {
    devices: Mutex<Vec<pb::Device>>,
    scan: AtomicU64,
    events: tokio::sync::broadcast::Sender<pb::Event>,
    /// Extra wait before every `ListDevices` answer, milliseconds.
    list_delay_ms: AtomicU64,
}

fn now_unix() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1.0, |d| d.as_secs_f64())
}

impl NodeState {
    pub fn new(devices: Vec<pb::Device>) -> Self {
        let (events, _) = tokio::sync::broadcast::channel(EVENT_BACKLOG);
        NodeState {
            devices: Mutex::new(devices),
            scan: AtomicU64::new(1),
            events,
            list_delay_ms: AtomicU64::new(0),
        }
    }

    /// From now on every `ListDevices` answers `d` later (besides the stand-in's own delay);
    /// `Duration::ZERO` ends that.
    pub fn slow_lists(&self, d: Duration) {
        self.list_delay_ms.store(d.as_millis() as u64, Ordering::Release);
    }

    /// The devices as they are now.
    pub fn devices(&self) -> Vec<pb::Device> {
        self.devices.lock().expect("devices").clone()
    }

    /// How many devices it has.
    pub fn device_count(&self) -> usize {
        self.devices.lock().expect("devices").len()
    }

    /// Changes device `name` with `f`, as a new scan found it, and sends every subscriber an
    /// event of `kind` carrying the device as it is now. Returns how many subscribers were sent
    /// it (`None`: there is no such device).
    pub fn change(
        &self,
        name: &str,
        kind: pb::event::Type,
        f: impl FnOnce(&mut pb::Device),
    ) -> Option<usize> {
        let scan = self.scan.fetch_add(1, Ordering::AcqRel) + 1;
        let current = {
            let mut devices = self.devices.lock().expect("devices");
            let d = devices.iter_mut().find(|d| d.name == name)?;
            f(d);
            d.last_seen_scan = scan;
            d.last_seen_unix_seconds = now_unix();
            d.clone()
        };
        let ev = pb::Event {
            r#type: kind as i32,
            device: name.to_owned(),
            unix_seconds: now_unix(),
            message: format!("{name}: {}", kind.as_str_name()),
            current: Some(current),
            scan,
            ..Default::default()
        };
        Some(self.events.send(ev).unwrap_or(0))
    }

    /// Its open event streams.
    pub fn subscribers(&self) -> usize {
        self.events.receiver_count()
    }
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

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl Agent for StandIn {
    async fn get_node(&self, _: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        tokio::time::sleep(self.delay).await;
        Ok(Response::new(pb::Node {
            name: self.node.clone(),
            devices: self.state.device_count() as u32,
            mode: "report".into(),
            ..Default::default()
        }))
    }
    async fn list_devices(
        &self,
        _: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        let slow = Duration::from_millis(self.state.list_delay_ms.load(Ordering::Acquire));
        tokio::time::sleep(self.delay + slow).await;
        Ok(Response::new(pb::ListDevicesResponse {
            devices: self.state.devices(),
            // It "scans" as it is asked: a scan time long past would make it stale (issue 36).
            scan_unix_seconds: now_unix(),
            scan: self.state.scan.load(Ordering::Acquire),
            ..Default::default()
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
        use tokio_stream::wrappers::{errors::BroadcastStreamRecvError, BroadcastStream};
        let events = BroadcastStream::new(self.state.events.subscribe());
        let stream = tokio_stream::StreamExt::map(events, |e| {
            Ok(match e {
                Ok(ev) => ev,
                Err(BroadcastStreamRecvError::Lagged(n)) => pb::Event {
                    r#type: pb::event::Type::EventsDropped as i32,
                    unix_seconds: now_unix(),
                    message: format!("this client missed {n} events: read the devices again"),
                    ..Default::default()
                },
            })
        });
        Ok(Response::new(Box::pin(stream)))
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
pub async fn serve<A: Agent>(tls: &ServerTlsConfig, svc: A) -> SocketAddr {
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

/// [`raise_nofile`] for a bench of `agents` stand-ins followed by `replicas` consoles: a
/// listener per stand-in, a connection per stand-in and replica, and `spare` more; fails the bench
/// naming the hard limit when it is too low.
pub fn raise_nofile_for(agents: usize, replicas: usize, spare: usize) {
    let want = (agents * (replicas + 1) + spare) as u64;
    let nofile = raise_nofile(want);
    assert!(nofile >= want, "open-files limit {nofile} < {want}: raise the hard limit (ulimit -Hn)");
}
