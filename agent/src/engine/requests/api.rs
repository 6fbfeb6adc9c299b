//! The Kubernetes API's view for a one-shot run: the same view the daemon keeps (its watches,
//! [`crate::kube::source`]), built when the API is configured (a URL, a kubeconfig) or the run is
//! in a cluster (a service-account token), and waited for up to [`ApiWanted::wait`] before
//! anything is judged. An API that does not answer by then leaves a view that cannot vouch:
//! every device a PV could own is `unknown`, never `stale`. Outside a cluster with nothing
//! configured, or turned off, the API is not asked; either way the report says what the API's
//! word was worth on its first lines ([`api_line`]).

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::engine::world::{LinuxWorld, World};
use crate::kube::source::{self, Choice};
use crate::kube::{ApiState, ClusterView, KubeConfig, WatchOptions};

/// The runtime the one-shot run's watches live on, until the process exits.
static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// What a one-shot run's flags say of the Kubernetes API.
#[derive(Debug, Clone)]
pub struct ApiWanted {
    /// The operator turned the API off (`--no-kubernetes`).
    pub off: bool,
    pub url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, as the API knows it.
    pub node_name: String,
    /// The longest silence of a watch that still vouches (unset: the default).
    pub silence_bound_seconds: Option<u64>,
    /// How long to wait for the view to vouch before judging anything.
    pub wait: Duration,
}

/// Gives `world` the API's view as `wanted` and the surroundings say (see the module docs).
pub(super) fn connect(wanted: &ApiWanted, world: &LinuxWorld) {
    let chosen = source::Wanted {
        enabled: wanted.off.then_some(false),
        off_by: Some("--no-kubernetes".to_owned()),
        url: wanted.url.clone(),
        kubeconfig: wanted.kubeconfig.clone(),
        node_name: wanted.node_name.clone(),
    };
    match source::choose(&chosen, source::in_cluster()) {
        Choice::Off(why) => {
            let _ = world.api_off.set(why);
        }
        Choice::NoneFound(_) => {
            let _ = world.api_off.set("not in a cluster, and no --kubeconfig or --kube-url".to_owned());
        }
        Choice::Use(cfg) => {
            let rx = watch_until_vouched(cfg, wanted);
            let _ = world.cluster.set(rx);
        }
    }
}

/// Starts the watches on the one-shot runtime and waits (at most [`ApiWanted::wait`]) for the
/// view to vouch; returns its receiver, vouching or not.
fn watch_until_vouched(cfg: KubeConfig, wanted: &ApiWanted) -> watch::Receiver<ClusterView> {
    let options = WatchOptions::for_bound(wanted.silence_bound_seconds);
    let (tx, mut rx) = watch::channel(ClusterView {
        node_name: cfg.node_name.clone(),
        silence_bound: options.silence_bound,
        ..ClusterView::default()
    });
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(e) => {
            tx.send_replace(source::unreachable(
                &cfg.node_name,
                format!("cannot start a runtime for the API's watches: {e}"),
                options.silence_bound,
            ));
            return rx;
        }
    };
    rt.spawn(source::supervise(cfg, options, tx, |_| {}));
    let deadline = Instant::now() + wanted.wait;
    rt.block_on(async {
        loop {
            if rx.borrow_and_update().vouch(crate::host::clock::BootTime::now()).is_ok() {
                return;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Woken by a change, else once a second (the silence bound is on the clock).
            let tick = left.min(Duration::from_secs(1));
            if left.is_zero() || tokio::time::timeout(tick, rx.changed()).await.is_ok_and(|r| r.is_err()) {
                return;
            }
        }
    });
    rx
}

fn runtime() -> std::io::Result<&'static tokio::runtime::Runtime> {
    if let Some(rt) = RUNTIME.get() {
        return Ok(rt);
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    Ok(RUNTIME.get_or_init(|| rt))
}

/// The line a one-shot report opens with when the API's word is missing (off, not asked, or it
/// cannot vouch): `None` while it vouches.
pub(super) fn api_line(world: &LinuxWorld) -> Option<String> {
    ApiState::of(world.cluster().as_ref(), &world.api_off(), world.now()).missing()
}
