//! Binding and serving: the unix socket (0660, owned by the configured group), TCP with mutual
//! TLS (refused without it), `/metrics`; health and reflection on both gRPC listeners; the health
//! service alone in plain text when `[health] listen` is set (for kubelet's `grpc` probes);
//! graceful shutdown. Both gRPC listeners read the client's bytes through
//! [`blockjanitor_rpc::authority::AuthorityFix`] (any valid `:authority`, issue 13); TLS is
//! terminated in [`blockjanitor_rpc::tls`].

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::AgentServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::Server;

use blockjanitor_rpc::auth::Policy;
use blockjanitor_rpc::authority::AuthorityFix;
use blockjanitor_rpc::health::{reflection_v1, reflection_v1alpha, HEALTH_SERVICE};
use blockjanitor_rpc::{metrics_http, peer, tls};

use super::service::AgentService;
use crate::daemon::state::AgentState;

/// Between two HTTP/2 pings the agent sends on an idle-or-busy TCP connection.
const PING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);
/// How long a ping may go unanswered before the connection (and its event streams) is dropped.
const PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `/metrics` serves the agent's own exposition.
impl metrics_http::Exposition for crate::daemon::metrics::Metrics {
    fn render(&self) -> String {
        crate::daemon::metrics::Metrics::render(self)
    }
}

/// What stopped the server from starting or serving.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("socket {}: {reason}", path.display())]
    Socket { path: PathBuf, reason: String },
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("cannot read {}: {source}", path.display())]
    ReadTls { path: PathBuf, source: std::io::Error },
    #[error("TLS setup: {0}")]
    Tls(String),
    #[error("socket group '{0}' does not exist")]
    NoSuchGroup(String),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("{0}")]
    Reflection(#[from] blockjanitor_rpc::health::ReflectionError),
}

/// Resolves a group name or numeric GID.
pub fn resolve_group(group: &str) -> Result<u32, ServeError> {
    if let Ok(gid) = group.parse::<u32>() {
        return Ok(gid);
    }
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => Ok(g.gid.as_raw()),
        _ => Err(ServeError::NoSuchGroup(group.to_owned())),
    }
}

/// Binds the unix socket: refuses to replace one another agent is serving on, removes a stale
/// one, creates it 0660 and gives it to `gid`.
pub fn bind_unix(path: &Path, gid: Option<u32>) -> Result<UnixListener, ServeError> {
    let fail = |reason: String| ServeError::Socket { path: path.to_owned(), reason };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create its directory: {e}")))?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(fail("another process is serving on it (is an agent already running?)".into()));
            }
            std::fs::remove_file(path).map_err(|e| fail(format!("cannot remove the stale socket: {e}")))?;
        }
        Ok(_) => return Err(fail("exists and is not a socket; refusing to replace it".into())),
        Err(_) => {}
    }
    // Born 0600 (umask 0177 around the bind), then opened to the group: never wider than 0660,
    // not even between bind and chmod.
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old);
    let listener = bound.map_err(|e| fail(format!("cannot bind: {e}")))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(|e| fail(format!("chmod 0660: {e}")))?;
    if let Some(g) = gid {
        nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(g)))
            .map_err(|e| fail(format!("chown to group {g}: {e}")))?;
    }
    Ok(listener)
}

/// Keeps the agent service's health (`blockjanitor.v1.Agent`, what the DaemonSet's readiness
/// probe asks) in step with the agent's checks ([`crate::daemon::health`]): NOT_SERVING while one
/// fails (a failed scan, an unwritable journal, the API's word missing where the mode acts on
/// it), SERVING again once all pass. The server's own (`""`, the liveness probe's) stays
/// SERVING: restarting the agent mends no hung device.
async fn follow_health(
    reporter: tonic_health::server::HealthReporter,
    mut health: watch::Receiver<crate::daemon::health::Health>,
) {
    use tonic_health::ServingStatus;
    loop {
        let reasons = health.borrow_and_update().reasons();
        let status = if reasons.is_empty() {
            tracing::info!("health: SERVING");
            ServingStatus::Serving
        } else {
            tracing::warn!(reasons = %reasons.join("; "), "health: NOT_SERVING until every check passes");
            ServingStatus::NotServing
        };
        reporter.set_service_status(pb::agent_server::SERVICE_NAME, status).await;
        if health.changed().await.is_err() {
            return;
        }
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ServeError> {
    std::fs::read(path).map_err(|source| ServeError::ReadTls { path: path.to_owned(), source })
}

async fn wait(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Serves until `shutdown` turns true. Logs each listener's real address once it is bound.
pub async fn serve(state: Arc<AgentState>, shutdown: watch::Receiver<bool>) -> Result<(), ServeError> {
    let gid = state.config.socket.group.as_deref().map(resolve_group).transpose()?;
    let policy = policy(&state.config, gid);
    serve_as(state, shutdown, gid, policy).await
}

/// [`serve`] with the socket's group `gid` and who may do what given.
pub(super) async fn serve_as(
    state: Arc<AgentState>,
    shutdown: watch::Receiver<bool>,
    gid: Option<u32>,
    policy: Policy,
) -> Result<(), ServeError> {
    let cfg = state.config.clone();
    let policy = Arc::new(policy);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_serving::<AgentServer<AgentService>>().await;
    tokio::spawn(follow_health(reporter, state.health.subscribe()));
    let sets = [pb::FILE_DESCRIPTOR_SET, tonic_health::pb::FILE_DESCRIPTOR_SET];
    let served = [pb::agent_server::SERVICE_NAME, HEALTH_SERVICE];
    let reflection = || reflection_v1(&sets, &served);
    let reflection_v1alpha = || reflection_v1alpha(&sets, &served);
    let agent =
        || AgentServer::new(AgentService::new(Arc::clone(&state), Arc::clone(&policy), shutdown.clone()));

    let mut tasks = tokio::task::JoinSet::new();
    if let Some(addr) = cfg.metrics.listen {
        tasks.spawn(serve_metrics(addr, &state, &shutdown).await?);
    }
    if let Some(addr) = cfg.health.listen {
        let (l, bound) = bind_tcp(addr).await?;
        tracing::info!(listener = "health", address = %bound, "serving grpc.health.v1.Health (only) on tcp {bound}");
        // Only the health service: no Agent, no reflection, so no TLS is needed here.
        let router = Server::builder().add_service(health.clone());
        let stop = wait(shutdown.clone());
        tasks.spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), stop)
                .await
                .map_err(ServeError::from)
        });
    }
    if let Some(addr) = cfg.tcp.listen {
        let (Some(cert), Some(key), Some(ca)) = (&cfg.tcp.cert, &cfg.tcp.key, &cfg.tcp.client_ca) else {
            return Err(ServeError::Tls("a TCP listener needs tcp.cert, tcp.key and tcp.client_ca".into()));
        };
        let tls =
            tls::server_config(&read(cert)?, &read(key)?, &read(ca)?).map_err(|e| ServeError::Tls(e.0))?;
        let (l, bound) = bind_tcp(addr).await?;
        tracing::info!(listener = "tcp", address = %bound, "serving gRPC on tcp {bound} (mutual TLS)");
        // HTTP/2 pings on every TCP connection: a stream to a caller that vanished (a console
        // stopped or cut off) ends within PING_INTERVAL + PING_TIMEOUT instead of never.
        let router = Server::builder()
            .http2_keepalive_interval(Some(PING_INTERVAL))
            .http2_keepalive_timeout(Some(PING_TIMEOUT))
            .add_service(health.clone())
            .add_service(reflection()?)
            .add_service(reflection_v1alpha()?)
            .add_service(agent());
        let incoming = tls::incoming(l, tls, shutdown.clone());
        let stop = wait(shutdown.clone());
        tasks.spawn(async move {
            router.serve_with_incoming_shutdown(incoming, stop).await.map_err(ServeError::from)
        });
    }
    let uds = bind_unix(&cfg.socket.path, gid)?;
    tracing::info!(listener = "unix", address = %cfg.socket.path.display(), "serving gRPC on unix:{}", cfg.socket.path.display());
    let router = Server::builder()
        .add_service(health)
        .add_service(reflection()?)
        .add_service(reflection_v1alpha()?)
        .add_service(agent());
    let stop = wait(shutdown.clone());
    tasks.spawn(async move {
        router
            .serve_with_incoming_shutdown(
                tokio_stream::StreamExt::map(UnixListenerStream::new(uds), |r| {
                    r.map(|s| AuthorityFix::new(peer::PeerStream::new(s)))
                }),
                stop,
            )
            .await
            .map_err(ServeError::from)
    });

    let result = first_error(tasks).await;
    let _ = std::fs::remove_file(&cfg.socket.path);
    result
}

/// Who may do what: the socket's group (root's without a configured one) and the TCP client
/// certificates' roles.
fn policy(cfg: &crate::config::Config, gid: Option<u32>) -> Policy {
    Policy {
        // Without a configured group the socket stays root's group: its members may connect
        // (mode 0660), so they are viewers, as the file's permissions say.
        socket_gid: Some(gid.unwrap_or(0)),
        socket_group_name: Some(cfg.socket.group.clone().unwrap_or_else(|| "root".into())),
        tcp_operators: cfg.tcp.operators.clone(),
        tcp_viewers: cfg.tcp.viewers.clone(),
        tcp_consoles: cfg.tcp.consoles.clone(),
        socket_operator: None,
    }
}

/// Binds `/metrics` on `addr`: the server, to be spawned.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    state: &AgentState,
    shutdown: &watch::Receiver<bool>,
) -> Result<impl std::future::Future<Output = Result<(), ServeError>> + Send + 'static, ServeError> {
    let (l, bound) = bind_tcp(addr).await?;
    tracing::info!(listener = "metrics", address = %bound, "serving /metrics on http://{bound}/metrics");
    Ok(metrics_http::serve(l, Arc::clone(&state.metrics), shutdown.clone()).map_ok())
}

/// Binds a TCP listener: it, and the address it is bound to (the port chosen when `addr` asks
/// for any).
async fn bind_tcp(addr: std::net::SocketAddr) -> Result<(TcpListener, String), ServeError> {
    let l = TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr: addr.to_string(), source })?;
    let bound = l.local_addr().map_or(addr.to_string(), |a| a.to_string());
    Ok((l, bound))
}

/// Waits for every listener to end: the first error any of them ended with, if one did.
async fn first_error(mut tasks: tokio::task::JoinSet<Result<(), ServeError>>) -> Result<(), ServeError> {
    let mut result = Ok(());
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Err(e)) if result.is_ok() => result = Err(e),
            Err(e) if result.is_ok() => result = Err(ServeError::Tls(format!("listener task failed: {e}"))),
            _ => {}
        }
    }
    result
}

trait MapOk {
    fn map_ok(self) -> impl std::future::Future<Output = Result<(), ServeError>> + Send;
}

impl<F: std::future::Future<Output = ()> + Send> MapOk for F {
    async fn map_ok(self) -> Result<(), ServeError> {
        self.await;
        Ok(())
    }
}
