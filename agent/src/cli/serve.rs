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
use crate::engine::workflow;
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
    // Before anything acts: close the steps a run that died left open, each re-checked against
    // its device as it is now; the devices are then planned afresh by the scans.
    // An unfinished plan is resumed (each remaining step re-checked) only by a daemon that acts
    // by itself; a reporting one lists it.
    let resume = config.mode != crate::config::Mode::Report;
    match engine.recover_all(&config.journal, workflow::LOCK_WAIT, resume) {
        Ok(out) => {
            say_recovery(&out, |line| tracing::warn!("{line}"));
            for r in &out.resumed {
                tracing::warn!("{}", r.describe());
            }
            if let Some((_, why)) = &out.refusal {
                tracing::warn!("journal recovery postponed: {why}");
            }
        }
        Err(err) => tracing::warn!("cannot recover the journal {}: {err}", config.journal.display()),
    }
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

/// Uses the Kubernetes API when it is configured (URL, kubeconfig) or the agent runs in a
/// cluster; otherwise, or when connecting fails, runs without it and says so.
pub async fn connect_kubernetes(state: &Arc<AgentState>) {
    let k = &state.config.kubernetes;
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if k.enabled == Some(false) || (k.url.is_none() && k.kubeconfig.is_none() && !in_cluster) {
        tracing::info!("running without the Kubernetes API (none configured)");
        return;
    }
    let cfg = crate::kube::KubeConfig {
        url: k.url.clone(),
        kubeconfig: k.kubeconfig.clone(),
        node_name: state.node_name.clone(),
    };
    match crate::kube::connect(&cfg).await {
        Ok(client) => {
            let (view, _task) = crate::kube::spawn_watch(client.clone(), &state.node_name, watch_options(k));
            state.use_kubernetes(view, crate::kube::Reporter::new(client, &state.node_name));
            tracing::info!(node = %state.node_name, "using the Kubernetes API");
        }
        Err(e) => tracing::warn!("running without the Kubernetes API: {e}"),
    }
}
