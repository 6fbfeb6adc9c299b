//! Starting the long-running agent (`serve`): its engine over the host the flags name, read as
//! its config says ([`engine`]); its state, with the statmount memo it writes ([`state`]); the
//! Kubernetes API's view it judges with ([`connect_kubernetes`]); then its first scan, the
//! scanner, the triggers and the followers ([`run`]). The gRPC server and the journal's
//! recovery at start are the caller's (`cli/serve.rs`), between these steps.

use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;

use super::metrics::{Metrics, MetricsError};
use super::mount_watch::MountWatch;
use super::state::{AgentState, NamespaceWatch};
use super::triggers;
use super::world::DaemonWorld;
use crate::config::{Config, Mode};
use crate::engine::requests::setup::HostSpec;
use crate::engine::world::{LinuxWorld, World};
use crate::engine::{Engine, Settings};
use crate::kube::options::WatchOptions;
use crate::kube::source::{self, Choice};
use crate::snapshot::ScanOptions;

/// The daemon's engine: the host `spec` names, read as `config` says (its kubelet directory,
/// protected paths and devices, PID 1 vouched for), remembering processes between full scans;
/// refused (why) when the config's mode acts by itself and this agent may not act.
pub fn engine(spec: &HostSpec, config: &Config) -> Result<Engine<DaemonWorld>, String> {
    let world = LinuxWorld::new(
        spec.host(),
        ScanOptions {
            kubelet_dir: config.kubelet_dir.clone(),
            trust_unreadable_init: config.trust_unreadable_init,
            protected_paths: config.protected_paths.clone(),
            protected_devices: config.protected_devices.clone(),
            ..spec.scan_options()
        },
        spec.timeout,
    );
    world.remember_processes(config.full_read_every);
    if config.mode != Mode::Report {
        world.can_act().map_err(|why| format!("mode {} acts by itself, but {why}", config.mode.as_str()))?;
    }
    let settings = Settings {
        unresponsive_after: config.unresponsive_after(),
        ..Settings::with_grace(config.grace_period(), config.rescan_interval())
    };
    Ok(Engine::new(DaemonWorld::Linux(world), settings))
}

/// The daemon's state over `engine`, with its metrics, writing the statmount memo at
/// `statmount_cache_file` after each full scan that learned something (none when `None`).
pub fn state(
    spec: &HostSpec,
    config: Config,
    engine: Engine<DaemonWorld>,
    statmount_cache_file: Option<&Path>,
) -> Result<Arc<AgentState>, MetricsError> {
    let host = spec.host();
    let metrics = Arc::new(Metrics::new()?);
    let memo_file = statmount_cache_file
        .and_then(|path| crate::engine::statmount_cache_file::Kept::written_only(&host, path));
    let state = AgentState::new(host, config, metrics, engine);
    if let Some(kept) = memo_file {
        state.keep_statmount_cache_file(kept);
    }
    Ok(state)
}

/// Where the daemon's Kubernetes view comes from ([`source`]): off only when the operator says
/// so; a configured source (or the pod's service account) is connected to, and while it cannot
/// be, the view says why and cannot vouch (retried with backoff); with no source at all the
/// view cannot vouch either. Returns at once: connecting goes on in the background.
pub async fn connect_kubernetes(state: &Arc<AgentState>) {
    let k = &state.config.kubernetes;
    let wanted = source::Wanted {
        enabled: k.enabled,
        off_by: k.off_by.clone().or_else(|| Some("enabled = false in [kubernetes] of the config".to_owned())),
        url: k.url.clone(),
        kubeconfig: k.kubeconfig.clone(),
        node_name: state.node_name.clone(),
    };
    let options = WatchOptions::for_bound(k.silence_bound_seconds);
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

/// The daemon at work until `stop`: the kernel's mount events followed where it reports them,
/// the first scan, then the scanner, the held-device events, the followers of live filesystems,
/// the uevent, udev, mount and timer triggers, each spawned.
pub async fn run(state: &Arc<AgentState>, stop: &watch::Receiver<bool>) {
    let every = state.config.rescan_interval();
    let mount_watch = match MountWatch::open() {
        Ok(w) => {
            let w = Arc::new(w);
            state.use_mount_watch(Arc::clone(&w) as Arc<dyn NamespaceWatch>);
            Some(w)
        }
        Err(e) => {
            tracing::info!("the kernel cannot report mount events ({e}; Linux 6.15+): watching the host's mount table and rescanning on the timer");
            None
        }
    };
    state.scan_once("start", false).await;
    tokio::spawn(Arc::clone(state).run_scanner(stop.clone()));
    tokio::spawn(Arc::clone(state).send_held_events(stop.clone()));
    tokio::spawn(Arc::clone(state).follow_filesystem_ends(stop.clone()));
    tokio::spawn(triggers::watch_kernel_uevents(Arc::clone(state), stop.clone()));
    triggers::spawn_udev_watch(Arc::clone(state), stop.clone());
    match mount_watch {
        Some(w) => tokio::spawn(super::watch_mounts(Arc::clone(state), w, stop.clone())),
        None => tokio::spawn(triggers::watch_mount_table(Arc::clone(state), stop.clone())),
    };
    tokio::spawn(triggers::timer(Arc::clone(state), every, stop.clone()));
}

/// The daemon's state on the simulated host `world` (no root, no kernel: the gRPC suite's), as
/// `config` says, its host root `dir` (where nothing is read), with the first scan done.
pub async fn on_sim(
    world: Arc<crate::engine::sim::SimWorld>,
    config: Config,
    dir: &Path,
) -> Result<Arc<AgentState>, MetricsError> {
    let settings = Settings {
        unresponsive_after: config.unresponsive_after(),
        ..Settings::with_grace(config.grace_period(), config.rescan_interval())
    };
    let engine = Engine::new(DaemonWorld::Sim(world), settings);
    let state = AgentState::new(crate::host::HostRoot::new(dir), config, Arc::new(Metrics::new()?), engine);
    state.scan_once("start", false).await;
    Ok(state)
}
