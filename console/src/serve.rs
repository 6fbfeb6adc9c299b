//! Putting the console together and serving it: discovery feeding the links, the Kubernetes
//! view, `blockjanitor.v1.Fleet` with `grpc.health.v1` and reflection on TCP with mutual TLS,
//! and `/metrics`; graceful shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_server::FleetServer;
use blockjanitor_rpc::auth::Policy;
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use crate::cluster::Cluster;
use crate::discover::{self, AgentSpec};
use crate::index::Index;
use crate::lease::{ApplyLease, LeaseOptions};
use crate::link::{LinkOptions, Links};
use crate::metrics::{self, Metrics};
use blockjanitor_rpc::peer_limit::PeerLimit;

use crate::apply::StepBudget;
use crate::service::{CallerLimits, FleetService};

/// Where the agents come from.
#[derive(Debug, Clone)]
pub enum Discovery {
    /// A fixed list.
    Static(BTreeMap<String, AgentSpec>),
    /// The agent pods: namespace, label selector, agent port.
    Pods { namespace: String, selector: String, port: u16 },
}

/// Where the Kubernetes API is.
#[derive(Debug, Clone, Default)]
pub struct KubeSource {
    pub url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    pub in_cluster: bool,
}

impl KubeSource {
    fn configured(&self) -> bool {
        self.url.is_some() || self.kubeconfig.is_some() || self.in_cluster
    }
}

/// Everything the console needs.
#[derive(Debug, Clone)]
pub struct ConsoleOptions {
    pub listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_client_ca: PathBuf,
    pub operators: Vec<String>,
    pub viewers: Vec<String>,
    pub metrics_listen: Option<SocketAddr>,
    pub discovery: Discovery,
    pub kube: KubeSource,
    pub links: LinkOptions,
    pub apply_timeout: Duration,
    /// Fleet-wide: steps a minute across every node and caller (0: no budget).
    pub steps_per_minute: u32,
    /// Per caller: Applies (dry runs included) and Plans a minute (0: no limit).
    pub caller_limits: CallerLimits,
    /// With several replicas: the Lease whose holder alone carries out Applies (needs the
    /// Kubernetes API). `None`: this console is the only one.
    pub apply_lease: Option<LeaseOptions>,
}

/// The fleet-wide step budget's default: steps a minute across the fleet. A handful of devices
/// torn down a minute covers the incidents the console is for (a few stale mappings after a node
/// failure) and bounds what one mistaken Apply across many nodes can do before anyone can react.
pub const DEFAULT_STEPS_PER_MINUTE: u32 = 20;

/// What stopped the console.
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error("Kubernetes API: {0}")]
    Kube(String),
    #[error(
        "pod discovery needs the Kubernetes API (--kube-url, --kubeconfig or --in-cluster), or give --agents"
    )]
    NoDiscovery,
    #[error("--apply-lease needs the Kubernetes API (--kube-url, --kubeconfig or --in-cluster)")]
    LeaseWithoutKube,
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Setup(String),
}

fn read(path: &Path) -> Result<Vec<u8>, ConsoleError> {
    std::fs::read(path).map_err(|source| ConsoleError::Read { path: path.to_owned(), source })
}

async fn kube_client(k: &KubeSource) -> Result<kube::Client, ConsoleError> {
    let config = if let Some(url) = &k.url {
        Config::new(url.parse().map_err(|e| ConsoleError::Kube(format!("invalid URL '{url}': {e}")))?)
    } else if let Some(path) = &k.kubeconfig {
        let kc = Kubeconfig::read_from(path)
            .map_err(|e| ConsoleError::Kube(format!("{}: {e}", path.display())))?;
        Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| ConsoleError::Kube(format!("{}: {e}", path.display())))?
    } else {
        Config::incluster().map_err(|e| ConsoleError::Kube(format!("in-cluster config: {e}")))?
    };
    kube::Client::try_from(config).map_err(|e| ConsoleError::Kube(e.to_string()))
}

/// The accepted connections with Nagle's algorithm off: small answers go out at once instead of
/// waiting for the peer's delayed ACK (40 ms on Linux).
fn nodelay(l: TcpListener) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    use tokio_stream::StreamExt;
    TcpListenerStream::new(l).map(|r| {
        r.inspect(|s| {
            let _ = s.set_nodelay(true);
        })
    })
}

async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Runs the console until `shutdown` turns true.
pub async fn run(opts: ConsoleOptions, shutdown: watch::Receiver<bool>) -> Result<(), ConsoleError> {
    let index = Index::new();
    let links = Arc::new(Links::new(index.clone(), opts.links.clone()));
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let client = if opts.kube.configured() { Some(kube_client(&opts.kube).await?) } else { None };
    let cluster = client.as_ref().map(|c| {
        let (cluster, t) = Cluster::spawn(c.clone());
        tasks.extend(t);
        cluster
    });
    let lease = match (&opts.apply_lease, &client) {
        (None, _) => ApplyLease::alone(),
        (Some(l), Some(c)) => {
            let (lease, t) = ApplyLease::spawn(c.clone(), l.clone());
            tasks.push(t);
            lease
        }
        (Some(_), None) => return Err(ConsoleError::LeaseWithoutKube),
    };
    match &opts.discovery {
        Discovery::Static(agents) => links.set(agents),
        Discovery::Pods { namespace, selector, port } => {
            let Some(c) = client.clone() else { return Err(ConsoleError::NoDiscovery) };
            let (mut rx, t) = discover::watch_pods(c, namespace, selector, *port);
            tasks.push(t);
            let l = Arc::clone(&links);
            tasks.push(tokio::spawn(async move {
                loop {
                    let agents = rx.borrow_and_update().clone();
                    tracing::info!(agents = agents.len(), "agent pods changed");
                    l.set(&agents);
                    if rx.changed().await.is_err() {
                        return;
                    }
                }
            }));
        }
    }

    let metrics = Arc::new(
        Metrics::new(index.clone())
            .map_err(|e| ConsoleError::Setup(e.to_string()))?
            .with_cluster(cluster.clone()),
    );
    let policy = Arc::new(Policy {
        socket_gid: None,
        socket_group_name: None,
        tcp_operators: opts.operators.clone(),
        tcp_viewers: opts.viewers.clone(),
        tcp_consoles: Vec::new(),
    });
    let service = FleetService {
        index: index.clone(),
        links: Arc::clone(&links),
        cluster,
        policy,
        metrics: Arc::clone(&metrics),
        apply_timeout: opts.apply_timeout,
        apply_limit: PeerLimit::new(opts.caller_limits.applies_per_minute),
        plan_limit: PeerLimit::new(opts.caller_limits.plans_per_minute),
        limits: opts.caller_limits,
        budget: StepBudget::new(opts.steps_per_minute).with_lease(lease),
    };
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<FleetServer<FleetService>>().await;
    let sets = [pb::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    // Only what the console serves: the descriptor set also holds the agent's service.
    let served = [pb::fleet_server::SERVICE_NAME, blockjanitor_rpc::health::HEALTH_SERVICE];
    let reflection = blockjanitor_rpc::health::reflection_v1(&sets, &served)
        .map_err(|e| ConsoleError::Setup(e.to_string()))?;
    let reflection_v1alpha = blockjanitor_rpc::health::reflection_v1alpha(&sets, &served)
        .map_err(|e| ConsoleError::Setup(e.to_string()))?;
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(read(&opts.tls_cert)?, read(&opts.tls_key)?))
        .client_ca_root(Certificate::from_pem(read(&opts.tls_client_ca)?))
        .client_auth_optional(false);

    if let Some(addr) = opts.metrics_listen {
        let l = TcpListener::bind(addr).await.map_err(|source| ConsoleError::Bind { addr, source })?;
        let bound = l.local_addr().map_or(addr.to_string(), |a| a.to_string());
        tracing::info!(listener = "metrics", address = %bound, "serving /metrics on http://{bound}/metrics");
        tasks.push(tokio::spawn(metrics::serve(l, Arc::clone(&metrics), shutdown.clone())));
    }
    let l = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ConsoleError::Bind { addr: opts.listen, source })?;
    let bound = l.local_addr().map_or(opts.listen.to_string(), |a| a.to_string());
    tracing::info!(listener = "tcp", address = %bound, "serving blockjanitor.v1.Fleet on tcp {bound} (mutual TLS)");
    let result = Server::builder()
        .tls_config(tls)?
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(FleetServer::new(service).max_encoding_message_size(64 << 20))
        .serve_with_incoming_shutdown(nodelay(l), wait(shutdown))
        .await;
    for t in tasks {
        t.abort();
    }
    result.map_err(ConsoleError::from)
}
