//! `serve`: the long-running agent: recovery of the journal, then the daemon's scanner, its
//! triggers and the gRPC server, until SIGTERM.

use super::args::*;
use super::render::say_recovery;
use super::settings::*;
use crate::daemon;
use crate::daemon::metrics::Metrics;
use crate::daemon::mount_watch::MountWatch;
use crate::daemon::state::AgentState;
use crate::daemon::triggers;
use crate::engine::world::LinuxWorld;
use crate::engine::world::World;
use crate::engine::Engine;
use crate::host::HostRoot;
use crate::plan;
use crate::server;
use crate::snapshot::ScanOptions;
use anyhow::{Context, Result};
use std::sync::Arc;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

pub fn serve(cli: &Cli, args: &ServeArgs, host: HostRoot) -> Result<u8> {
    let config = serve_config(cli, args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let world = LinuxWorld::new(
        host.clone(),
        ScanOptions {
            kubelet_dir: config.kubelet_dir.clone(),
            trust_unreadable_init: config.trust_unreadable_init,
            protected_paths: config.protected_paths.clone(),
            protected_devices: config.protected_devices.clone(),
            ..scan_options(cli)
        },
        Duration::from_secs(cli.timeout),
    );
    world.remember_processes(config.full_read_every);
    if config.mode != crate::config::Mode::Report {
        world
            .can_act()
            .map_err(|why| anyhow::anyhow!("mode {} acts by itself, but {why}", config.mode.as_str()))?;
    }
    let settings = settings(
        config.grace_period(),
        config.rescan_interval(),
        plan::clean::CleanOptions::default(),
        config.unresponsive_after(),
    );
    let engine = Engine::new(world, settings);
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::new()?);
        let every = config.rescan_interval();
        let memo_file = statmount_memo_path(cli)
            .and_then(|path| crate::discover::mount_memo_file::Kept::written_only(&host, path));
        let state = AgentState::new(host, config, metrics, engine);
        if let Some(kept) = memo_file {
            state.keep_statmount_memo(kept);
        }
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
        connect_kubernetes(&state).await;
        tokio::spawn(recover_journal(Arc::clone(&state), stop.clone()));
        let mount_watch = match MountWatch::open() {
            Ok(w) => {
                let w = Arc::new(w);
                state.use_mount_watch(Arc::clone(&w) as Arc<dyn crate::daemon::state::NamespaceWatch>);
                Some(w)
            }
            Err(e) => {
                tracing::info!("the kernel cannot report mount events ({e}; Linux 6.15+): watching the host's mount table and rescanning on the timer");
                None
            }
        };
        state.scan_once("start", false).await;
        tokio::spawn(Arc::clone(&state).run_scanner(stop.clone()));
        tokio::spawn(Arc::clone(&state).send_held_events(stop.clone()));
        tokio::spawn(Arc::clone(&state).follow_filesystem_ends(stop.clone()));
        tokio::spawn(triggers::watch_kernel_uevents(Arc::clone(&state), stop.clone()));
        triggers::spawn_udev_watch(Arc::clone(&state), stop.clone());
        match mount_watch {
            Some(w) => tokio::spawn(daemon::watch_mounts(Arc::clone(&state), w, stop.clone())),
            None => tokio::spawn(triggers::watch_mount_table(Arc::clone(&state), stop.clone())),
        };
        tokio::spawn(triggers::timer(Arc::clone(&state), every, stop.clone()));
        server::listen::serve(state, stop).await?;
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

/// Where the daemon's Kubernetes view comes from ([`kube::source`]): off only when the operator
/// says so; a configured source (or the pod's service account) is connected to, and while it
/// cannot be, the view says why and cannot vouch (retried with backoff); with no source at all
/// the view cannot vouch either. Returns at once: connecting goes on in the background.
pub async fn connect_kubernetes(state: &Arc<AgentState>) {
    use crate::kube::source::{self, Choice};
    let k = &state.config.kubernetes;
    let wanted = source::Wanted {
        enabled: k.enabled,
        off_by: k.off_by.clone().or_else(|| Some("enabled = false in [kubernetes] of the config".to_owned())),
        url: k.url.clone(),
        kubeconfig: k.kubeconfig.clone(),
        node_name: state.node_name.clone(),
    };
    let options = watch_options(k);
    match source::choose(&wanted, source::in_cluster()) {
        Choice::Off(why) => {
            tracing::info!(
                "not asking the Kubernetes API ({why}): verdicts rest on this node's evidence alone"
            );
            state.api_off(why);
        }
        Choice::NoneFound(why) => {
            let why = format!("{why}; pass --no-kubernetes (or enabled = false in [kubernetes]) to act on this node's evidence alone");
            tracing::warn!("{why}");
            let (_tx, rx) = watch::channel(source::unreachable(&state.node_name, why, options.silence_bound));
            state.use_cluster_view(rx);
        }
        Choice::Use(cfg) => {
            let (tx, rx) = watch::channel(crate::kube::ClusterView {
                node_name: state.node_name.clone(),
                silence_bound: options.silence_bound,
                ..Default::default()
            });
            state.use_cluster_view(rx);
            let me = Arc::clone(state);
            let node = state.node_name.clone();
            tokio::spawn(source::supervise(cfg, options, tx, move |client| {
                tracing::info!(node = %node, "using the Kubernetes API");
                me.use_reporter(crate::kube::Reporter::new(client, &node));
            }));
        }
    }
}
