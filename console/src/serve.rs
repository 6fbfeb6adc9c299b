//! Putting the console together and serving it: discovery feeding the links, the Kubernetes
//! view, the callers' reviews ([`crate::access`]), `blockjanitor.v1.Fleet` with `grpc.health.v1`
//! and reflection on TCP with TLS (a client certificate when the caller has one; a bearer token
//! otherwise), `/metrics` (behind the same review with `--metrics-review`), the serving CA
//! published for the kubectl plugin ([`crate::serving_ca`]); graceful shutdown.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_server::FleetServer;
use blockjanitor_rpc::auth::Policy;
use blockjanitor_rpc::metrics_http::Gate;
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

use crate::access::{Access, MetricsGate};
use crate::apply::StepBudget;
use crate::limits::Limits;
use crate::peer::PeerTls;
use crate::person_budget::PersonBudget;
use crate::ready::Readiness;
use crate::review::{ReviewOptions, Reviewer};
use crate::service::{CallerLimits, FleetService};
use crate::serving_ca;
use crate::sweeper::Sweeper;

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
    /// Client certificate identities with the operator role, one per person.
    pub operators: Vec<String>,
    pub viewers: Vec<String>,
    pub metrics_listen: Option<SocketAddr>,
    /// `/metrics` only to a scraper the API server reviews (a bearer token, `get` on the path).
    pub metrics_review: bool,
    /// The namespace RBAC is asked about (SubjectAccessReviews of `fleet.blockjanitor.io`).
    pub access_namespace: String,
    /// How callers' tokens and access are reviewed.
    pub review: ReviewOptions,
    /// The serving CA to publish in a ConfigMap for the kubectl plugin.
    pub publish_ca: Option<serving_ca::Publish>,
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
    /// An answering agent whose latest scan is older than this (seconds) is stale (0: never).
    pub stale_after_seconds: f64,
    /// How many fresh fan-outs, plans and sweeps run at once, per person and in total.
    pub concurrency: crate::limits::Concurrency,
    /// Certificate identities of the other replicas, which may forward an Apply on behalf of a
    /// person (the console role).
    pub peer_consoles: Vec<String>,
    /// The name the replicas' serving certificates carry (to reach the Lease's holder).
    pub peer_server_name: String,
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
    #[error("{0} needs the Kubernetes API (--kube-url, --kubeconfig or --in-cluster)")]
    NeedsKube(&'static str),
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

/// What every scrape of `/metrics` must pass (`None`: nothing).
type MetricsDoor = Option<Arc<dyn Gate>>;

/// Who may call the console and scrape it: certificates and the API server's reviews; and the
/// serving CA published for the kubectl plugin (its task pushed onto `tasks`).
fn doors(
    opts: &ConsoleOptions,
    client: Option<&kube::Client>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<(Arc<Access>, MetricsDoor), ConsoleError> {
    let reviewer = client.cloned().map(|c| Arc::new(Reviewer::new(c, opts.review.clone())));
    let access = Arc::new(Access {
        policy: Policy {
            socket_gid: None,
            socket_group_name: None,
            tcp_operators: opts.operators.clone(),
            tcp_viewers: opts.viewers.clone(),
            tcp_consoles: opts.peer_consoles.clone(),
            socket_operator: None,
        },
        reviewer: reviewer.clone(),
        namespace: opts.access_namespace.clone(),
    });
    if let Some(p) = &opts.publish_ca {
        let Some(c) = client.cloned() else { return Err(ConsoleError::NeedsKube("--publish-serving-ca")) };
        tasks.push(serving_ca::spawn(c, p.clone()));
    }
    let metrics_gate: MetricsDoor = match (opts.metrics_review, &reviewer) {
        (false, _) => None,
        (true, Some(r)) => Some(Arc::new(MetricsGate(Arc::clone(r)))),
        (true, None) => return Err(ConsoleError::NeedsKube("--metrics-review")),
    };
    Ok((access, metrics_gate))
}

/// Follows the agents: a static list, or the agent pods (watched); `Some(listed)` with pods,
/// turning true once they were listed in full.
fn follow_agents(
    opts: &ConsoleOptions,
    client: Option<&kube::Client>,
    links: &Arc<Links>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<Option<Arc<std::sync::atomic::AtomicBool>>, ConsoleError> {
    match &opts.discovery {
        Discovery::Static(agents) => {
            links.set(agents);
            Ok(None)
        }
        Discovery::Pods { namespace, selector, port } => {
            let Some(c) = client.cloned() else { return Err(ConsoleError::NoDiscovery) };
            let (mut rx, t, listed) = discover::watch_pods(c, namespace, selector, *port);
            tasks.push(t);
            let l = Arc::clone(links);
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
            Ok(Some(listed))
        }
    }
}

/// How this replica reaches the others (the Lease's holder): its own client certificate, the
/// serving CA, the serving name.
fn peer_tls(opts: &ConsoleOptions) -> Result<Option<PeerTls>, ConsoleError> {
    if opts.apply_lease.is_none() {
        return Ok(None);
    }
    let ca = match &opts.publish_ca {
        Some(p) => read(&p.ca_file)?,
        None => read(&opts.tls_client_ca)?,
    };
    Ok(Some(PeerTls {
        ca,
        cert: read(&opts.links.tls.cert)?,
        key: read(&opts.links.tls.key)?,
        server_name: opts.peer_server_name.clone(),
        connect_timeout: opts.links.connect_timeout,
    }))
}

/// Marks `blockjanitor.v1.Fleet` serving in `grpc.health.v1` once the replica is ready.
async fn serve_when_ready(reporter: tonic_health::server::HealthReporter, ready: Arc<Readiness>) {
    reporter.set_not_serving::<FleetServer<FleetService>>().await;
    loop {
        if ready.check().is_ok() {
            reporter.set_serving::<FleetServer<FleetService>>().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Serves `/metrics` and `/readyz` on their own thread, when asked for.
fn serve_metrics(
    opts: &ConsoleOptions,
    metrics: &Arc<Metrics>,
    gate: MetricsDoor,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), ConsoleError> {
    let Some(addr) = opts.metrics_listen else { return Ok(()) };
    let l = std::net::TcpListener::bind(addr).map_err(|source| ConsoleError::Bind { addr, source })?;
    let bound = l.local_addr().map_or(addr.to_string(), |a| a.to_string());
    let reviewed = if gate.is_some() { " (each scrape reviewed by the API server)" } else { "" };
    tracing::info!(listener = "metrics", address = %bound, "serving /metrics on http://{bound}/metrics{reviewed} and /readyz");
    metrics::serve_on_own_thread(l, Arc::clone(metrics), gate, shutdown.clone())
        .map_err(|e| ConsoleError::Setup(format!("cannot start the metrics thread: {e}")))?;
    Ok(())
}

/// What the gRPC service is built from, made by [`run`].
struct Parts {
    index: Index,
    links: Arc<Links>,
    cluster: Option<Cluster>,
    access: Arc<Access>,
    metrics: Arc<Metrics>,
    sweeper: Arc<Sweeper>,
}

/// The gRPC service, put together.
fn service(opts: &ConsoleOptions, parts: Parts, lease: ApplyLease) -> Result<FleetService, ConsoleError> {
    let Parts { index, links, cluster, access, metrics, sweeper } = parts;
    Ok(FleetService {
        index,
        links,
        cluster,
        access,
        metrics,
        apply_timeout: opts.apply_timeout,
        apply_limit: PeerLimit::new(opts.caller_limits.applies_per_minute),
        plan_limit: PeerLimit::new(opts.caller_limits.plans_per_minute),
        fresh_limit: PeerLimit::new(opts.caller_limits.fresh_per_minute),
        limits: opts.caller_limits,
        budget: StepBudget::new(opts.steps_per_minute).with_lease(lease.clone()),
        person_budget: PersonBudget::new(opts.caller_limits.steps_per_minute),
        sweeper,
        concurrency: Limits::new(opts.concurrency),
        lease,
        peer: peer_tls(opts)?,
        applying: std::sync::Mutex::new(std::collections::BTreeSet::new()),
    })
}

/// Runs the console until `shutdown` turns true.
pub async fn run(opts: ConsoleOptions, shutdown: watch::Receiver<bool>) -> Result<(), ConsoleError> {
    let index = Index::with_stale_after(opts.stale_after_seconds);
    let links = Arc::new(Links::new(index.clone(), opts.links.clone()));
    let mut tasks: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    let client = if opts.kube.configured() { Some(kube_client(&opts.kube).await?) } else { None };
    let cluster = client.as_ref().map(|c| Cluster::new(c.clone()));
    // The sweep listens to the tables before their watches start.
    let sweeper = Sweeper::new(index.clone(), cluster.clone());
    if let Some(c) = &cluster {
        tasks.extend(c.follow());
    }
    sweeper.spawn();
    let lease = match (&opts.apply_lease, &client) {
        (None, _) => ApplyLease::alone(),
        (Some(l), Some(c)) => {
            let (lease, t) = ApplyLease::spawn(c.clone(), l.clone());
            tasks.push(t);
            lease
        }
        (Some(_), None) => return Err(ConsoleError::LeaseWithoutKube),
    };
    let listed = follow_agents(&opts, client.as_ref(), &links, &mut tasks)?;
    let readiness = Arc::new(Readiness::new(index.clone(), cluster.clone(), listed, Arc::clone(&sweeper)));
    let metrics = Arc::new(
        Metrics::new(Arc::clone(&sweeper), cluster.clone())
            .map_err(|e| ConsoleError::Setup(e.to_string()))?
            .with_readiness(Arc::clone(&readiness)),
    );
    let (access, metrics_gate) = doors(&opts, client.as_ref(), &mut tasks)?;
    let parts =
        Parts { index, links: Arc::clone(&links), cluster, access, metrics: Arc::clone(&metrics), sweeper };
    let service = service(&opts, parts, lease)?;
    let (reporter, health) = tonic_health::server::health_reporter();
    tasks.push(tokio::spawn(serve_when_ready(reporter, readiness)));
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
        // A certificate is checked when the caller has one; a caller without one must send a
        // bearer token (the kubectl plugin's way), else every call is UNAUTHENTICATED.
        .client_auth_optional(true);
    serve_metrics(&opts, &metrics, metrics_gate, &shutdown)?;
    let l = TcpListener::bind(opts.listen)
        .await
        .map_err(|source| ConsoleError::Bind { addr: opts.listen, source })?;
    let bound = l.local_addr().map_or(opts.listen.to_string(), |a| a.to_string());
    tracing::info!(listener = "tcp", address = %bound, "serving blockjanitor.v1.Fleet on tcp {bound} (TLS; a bearer token or a client certificate)");
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
