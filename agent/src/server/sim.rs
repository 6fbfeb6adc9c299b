//! The agent's gRPC service on a simulated host ([`crate::engine::sim`]), on a unix socket in a
//! directory the caller gives (a temp dir): what the gRPC suite (`tests/tests/grpc_plan_apply.rs`)
//! drives as a normal user through the real tonic client. The daemon's state is the real one
//! (its engine, grace clocks, journal, events), with the sim as its world; only the rescan loop
//! and the triggers are not started (the caller asks for scans). The user running it is an
//! operator on its socket, as root is on a live node's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::watch;

use super::listen::{serve_as, ServeError};
use crate::config::{Config, Mode};
use crate::daemon::start;
use crate::daemon::state::AgentState;
use crate::engine::sim::SimWorld;
use blockjanitor_rpc::auth::Policy;

/// A running agent on a simulated host.
pub struct SimAgent {
    /// The unix socket it serves on.
    pub socket: PathBuf,
    /// Its daemon state (for rescans, its view and its events).
    pub state: Arc<AgentState>,
    stop: watch::Sender<bool>,
    served: tokio::task::JoinHandle<Result<(), ServeError>>,
}

impl SimAgent {
    /// Starts the service on `world`, in report mode, with its socket (`agent.sock`) and journal
    /// (`journal.jsonl`) in `dir`; returns once the first scan is done and the socket is bound.
    pub async fn start(world: Arc<SimWorld>, dir: &Path) -> Result<Self, ServeError> {
        let mut config =
            Config { journal: dir.join("journal.jsonl"), mode: Mode::Report, ..Config::default() };
        config.socket.path = dir.join("agent.sock");
        config.socket.group = None;
        config.metrics.listen = None;
        config.health.listen = None;
        config.tcp.listen = None;
        let socket = config.socket.path.clone();
        let state = start::on_sim(world, config, dir)
            .await
            .map_err(|e| ServeError::Socket { path: socket.clone(), reason: format!("metrics: {e}") })?;
        let policy = Policy { socket_operator: Some(nix::unistd::geteuid().as_raw()), ..Policy::default() };
        let (stop, shutdown) = watch::channel(false);
        let served = tokio::spawn(serve_as(Arc::clone(&state), shutdown, None, policy));
        while !socket.exists() {
            if served.is_finished() {
                return Err(Self { socket, state, stop, served }.stop().await.err().unwrap_or_else(|| {
                    ServeError::Tls("the simulated agent's server ended before it bound its socket".into())
                }));
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(Self { socket, state, stop, served })
    }

    /// Stops serving; what the server ended with.
    pub async fn stop(self) -> Result<(), ServeError> {
        let _ = self.stop.send(true);
        self.served.await.map_err(|e| ServeError::Tls(format!("the server task failed: {e}")))?
    }
}
