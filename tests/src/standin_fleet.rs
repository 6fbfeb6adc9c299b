//! Stand-in agents for the console's bench and tests: light servers of the generated tonic
//! trait (real gRPC over mutual TLS on loopback, generated device sets, optionally slow), and
//! addresses that refuse connections. The console process and real agents are in
//! [`crate::console`] and [`crate::daemon`].

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
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

pub type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

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
            // It "scans" as it is asked: a scan time long past would make it stale (issue 36).
            scan_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1.0, |d| d.as_secs_f64()),
            scan: 1,
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
