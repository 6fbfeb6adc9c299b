//! `serve`: the long-running agent: the daemon started ([`crate::daemon::start`]), the journal's
//! recovery once the Kubernetes API's view is up, then the gRPC server, until SIGTERM.

use super::args::*;
use super::render::say_recovery;
use super::settings::*;
use crate::daemon::start;
use crate::daemon::state::AgentState;
use crate::server::listen;
use anyhow::{Context, Result};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

pub fn serve(cli: &Cli, args: &ServeArgs) -> Result<u8> {
    let config = serve_config(cli, args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let spec = host_spec(cli);
    let engine = start::engine(&spec, &config).map_err(|why| anyhow::anyhow!(why))?;
    rt.block_on(async move {
        let state = start::state(&spec, config, engine, statmount_memo_path(cli))?;
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(async move {
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot handle SIGTERM: {e}");
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            }
            let _ = stop_tx.send(true);
        });
        start::connect_kubernetes(&state).await;
        tokio::spawn(recover_journal(Arc::clone(&state), stop.clone()));
        start::run(&state, &stop).await;
        listen::serve(state, stop).await?;
        tracing::info!("stopped");
        Ok::<u8, anyhow::Error>(0)
    })
}

/// The journal's recovery at start ([`AgentState::recover_at_start`]: once the Kubernetes
/// API's view is up), said in the log.
async fn recover_journal(state: Arc<AgentState>, stop: watch::Receiver<bool>) {
    match Arc::clone(&state).recover_at_start(stop).await {
        None => {}
        Some(Ok(out)) => {
            say_recovery(&out, |line| tracing::warn!("{line}"));
            for r in &out.resumed {
                tracing::warn!("{}", r.describe());
            }
            if let Some((_, why)) = &out.refusal {
                tracing::warn!("journal recovery postponed: {why}");
            }
        }
        Some(Err(err)) => {
            tracing::warn!("cannot recover the journal {}: {err}", state.config.journal.display())
        }
    }
}
