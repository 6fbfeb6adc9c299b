//! The daemon's state: the engine and its grace clocks, the latest judged scan (a [`View`]),
//! what is waiting for the scanner, and the event stream. Every scan, verdict, plan and action
//! goes through the one engine ([`crate::engine`]); the rescan loop is [`super::scanner`], plans
//! and actions on request and by mode [`super::requests`].

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, Notify};

use super::budget::Budget;
use super::events::{diff, AgentEvent};
use super::world::DaemonWorld;
use crate::config::Config;
use crate::daemon::metrics::Metrics;
use crate::engine::error::EngineError;
use crate::engine::view::View;
use crate::engine::Engine;
use crate::host::HostRoot;
use crate::judge::grace::Clocks;
use crate::model::MountNsId;
use crate::snapshot::reread::Changes;

/// Longest a scan may take before it is reported as overrunning.
pub const SCAN_DEADLINE: Duration = Duration::from_secs(60);

/// Why a request failed; mapped to a gRPC status by the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// The request is well-formed but the device's state forbids it (protected, its identity
    /// changed since it was planned, the agent may not act here).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NotFound(m) => ApiError::NotFound(m),
            e @ (EngineError::IdentityChanged { .. } | EngineError::CannotAct(_)) => {
                ApiError::FailedPrecondition(e.to_string())
            }
            e @ EngineError::Journal { .. } => ApiError::Unavailable(e.to_string()),
            e @ EngineError::Discover(_) => ApiError::Internal(e.to_string()),
        }
    }
}

/// The timer's trigger: the one scan that does not settle and may stop for a waiting change.
pub(super) const TIMER: &str = "timer";

/// The changes waiting for the scanner, locked, with the flag a stoppable scan asks.
pub(super) struct Pending<'a> {
    changes: std::sync::MutexGuard<'a, Changes>,
    waiting: &'a AtomicBool,
}

impl Pending<'_> {
    /// Adds to what is waiting.
    pub(super) fn add(&mut self, f: impl FnOnce(&mut Changes)) {
        f(&mut self.changes);
        self.waiting.store(!self.changes.is_empty(), Ordering::Release);
    }

    /// Takes what is waiting.
    pub(super) fn take(&mut self) -> Changes {
        self.waiting.store(false, Ordering::Release);
        std::mem::take(&mut *self.changes)
    }
}

/// Everything the server and the background tasks share.
pub struct AgentState {
    pub host: HostRoot,
    pub config: Config,
    pub node_name: String,
    pub kernel: String,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<AgentEvent>,
    /// The per-device cap on state events; every event goes out through
    /// [`AgentState::send_event`].
    pub(super) event_rate: Arc<super::event_rate::EventRate>,
    /// The devices held by live filesystems with no mount, followed until those end
    /// ([`super::fs_end`]: the kernel reports no superblock's end).
    pub(super) fs_ends: Arc<super::fs_end::FsEnds>,
    pub(super) engine: Engine<DaemonWorld>,
    pub(super) clocks: Mutex<Clocks>,
    pub(super) view: RwLock<Arc<View>>,
    pub(super) rescan: Notify,
    pub(super) pending_trigger: Mutex<Option<&'static str>>,
    /// What the kernel reported changed since the last scan (read again alone, when no full
    /// scan is pending).
    pub(super) pending_changes: Mutex<Changes>,
    /// Whether `pending_changes` holds something (set and cleared under its lock): what a
    /// stoppable scan asks as it goes.
    pub(super) change_waiting: AtomicBool,
    /// Mount namespaces new since the last full scan whose processes are being looked for off
    /// the scanner's path, before their read in full is asked for ([`Changes::awaiting`]).
    pub(super) awaiting: Mutex<HashSet<MountNsId>>,
    /// The kernel's mount events, when it offers them.
    pub(super) mount_watch: std::sync::OnceLock<Arc<dyn NamespaceWatch>>,
    /// The file the one-shot commands start from, written after full scans ([`super::statmount_cache_saver`]).
    pub(super) statmount_cache_file:
        std::sync::OnceLock<Arc<Mutex<crate::engine::statmount_cache_file::Kept>>>,
    pub(super) act_lock: tokio::sync::Mutex<()>,
    /// Events and the Node condition, when the API is in use.
    pub(super) reporter: std::sync::OnceLock<crate::kube::Reporter>,
    /// Destructive steps of release/clean mode in the last minute (the rate limit's window).
    pub(super) budget: Mutex<Budget>,
    /// Plan calls a minute per caller (each scans afresh).
    pub plan_limit: blockjanitor_rpc::peer_limit::PeerLimit,
    /// Whether the agent can do its job, and why not ([`super::health`]): the health service
    /// answers NOT_SERVING for the agent service while a check fails.
    pub health: tokio::sync::watch::Sender<super::health::Health>,
}

/// Something that watches mount namespaces for changes (the kernel's mount events, see
/// `daemon::mount_watch`): told after each full scan which namespaces there are, each with a
/// file that names it.
pub trait NamespaceWatch: Send + Sync {
    /// Watches the namespaces not watched yet and forgets those gone; returns how many were
    /// added.
    fn sync(&self, namespaces: &[(MountNsId, Option<u64>, std::path::PathBuf)]) -> usize;
    /// The host the scans read (where its `/proc` is), told once before the first scan.
    fn use_host(&self, _host: &HostRoot) {}
}

/// Checks the shape of a device argument before looking it up: empty, overlong, or containing
/// white space or control characters is malformed (InvalidArgument), not merely unknown.
pub fn check_device_arg(arg: &str) -> Result<(), ApiError> {
    if arg.is_empty() {
        return Err(ApiError::InvalidArgument("device name is empty".into()));
    }
    if arg.len() > 255 || arg.chars().any(|c| c.is_whitespace() || c.is_control()) {
        let shown: String = arg.chars().take(64).collect();
        return Err(ApiError::InvalidArgument(format!(
            "malformed device name {shown:?}: expected a kernel name, /dev path, dm name or MAJ:MIN"
        )));
    }
    // A client names a device, never a host file: a path outside /dev would let any viewer
    // probe the host's file tree through the agent's stat (and hang it on a dead NFS path).
    if arg.starts_with('/') {
        let under_dev = arg.strip_prefix("/dev/").is_some_and(|rest| {
            !rest.is_empty() && rest.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
        });
        if !under_dev {
            let shown: String = arg.chars().take(64).collect();
            return Err(ApiError::InvalidArgument(format!(
                "{shown:?} is not under /dev: a path argument must name a device node in /dev \
                 (or give a kernel name, dm name or MAJ:MIN)"
            )));
        }
    }
    Ok(())
}

impl AgentState {
    pub fn new(
        host: HostRoot,
        config: Config,
        metrics: Arc<Metrics>,
        engine: Engine<DaemonWorld>,
    ) -> Arc<Self> {
        let cap_device_events = config.cap_device_events;
        let node_name = config.node_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into())
        });
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let (events, _) = broadcast::channel(1024);
        let clocks = Clocks::new(crate::host::clock::boot_id(&host));
        let budget = Budget::new(config.max_actions_per_minute as usize, Duration::from_secs(60));
        let plan_limit = blockjanitor_rpc::peer_limit::PeerLimit::new(config.plans_per_minute_per_client);
        Arc::new(Self {
            host,
            config,
            node_name,
            kernel,
            metrics,
            events,
            event_rate: Arc::new(super::event_rate::EventRate::new(cap_device_events)),
            fs_ends: Arc::default(),
            engine,
            clocks: Mutex::new(clocks),
            view: RwLock::new(Arc::new(View::empty())),
            rescan: Notify::new(),
            pending_trigger: Mutex::new(None),
            pending_changes: Mutex::new(Changes::default()),
            change_waiting: AtomicBool::new(false),
            awaiting: Mutex::new(HashSet::new()),
            mount_watch: std::sync::OnceLock::new(),
            statmount_cache_file: std::sync::OnceLock::new(),
            act_lock: tokio::sync::Mutex::new(()),
            reporter: std::sync::OnceLock::new(),
            budget: Mutex::new(budget),
            plan_limit,
            health: tokio::sync::watch::channel(Default::default()).0,
        })
    }

    /// Takes the Kubernetes API's view from now on (one that cannot vouch while the API cannot
    /// be reached): it weighs in on verdicts and gates.
    pub fn use_cluster_view(&self, cluster: tokio::sync::watch::Receiver<crate::kube::ClusterView>) {
        self.engine.world.use_cluster_view(cluster);
    }

    /// Events and the Node condition go out through `reporter` (once the API is connected).
    pub fn use_reporter(&self, reporter: crate::kube::Reporter) {
        let _ = self.reporter.set(reporter);
    }

    /// The API is not asked, for `why` (the operator's word).
    pub fn api_off(&self, why: String) {
        self.engine.world.set_api_off(why);
    }

    /// Whether this agent may act on the host (hostPID, a live procfs); why not otherwise.
    pub fn can_act(&self) -> Result<(), String> {
        use crate::engine::world::World;
        self.engine.world.can_act()
    }

    /// The latest scan.
    pub fn view(&self) -> Arc<View> {
        self.view.read().map(|v| Arc::clone(&v)).unwrap_or_else(|p| Arc::clone(&p.into_inner()))
    }

    /// Asks for a rescan; triggers that arrive while one is pending or running coalesce (any
    /// other trigger takes the timer's place: its scan is one that settles and runs to its end).
    pub fn request_rescan(&self, trigger: &'static str) {
        if let Ok(mut p) = self.pending_trigger.lock() {
            if p.is_none_or(|t| t == TIMER) {
                *p = Some(trigger);
            }
        }
        self.rescan.notify_one();
    }

    /// Asks for the mounts of `namespaces` to be re-read (a full scan, if one is pending or the
    /// re-read cannot stand in for one).
    pub fn request_namespace_rescan(&self, namespaces: HashSet<MountNsId>) {
        if namespaces.is_empty() {
            return;
        }
        self.pending().add(|c| c.namespaces.extend(namespaces));
        self.rescan.notify_one();
    }

    /// Tells the scanner that `namespaces` no longer exist (a re-read drops them; a full scan,
    /// if one is pending or the re-read cannot stand in for one).
    pub fn request_namespaces_gone(&self, namespaces: HashSet<MountNsId>) {
        if namespaces.is_empty() {
            return;
        }
        self.pending().add(|c| c.gone.extend(namespaces));
        self.rescan.notify_one();
    }

    /// Says that the processes of mount namespaces `ids` (new since the last full scan) are
    /// being looked for, to ask for their read in full next ([`Self::request_new_namespaces`],
    /// or [`Self::stop_awaiting`] if that cannot be): until then a mount change in one of them
    /// is left to that read.
    pub fn await_new_namespaces(&self, ids: impl IntoIterator<Item = MountNsId>) {
        self.awaiting_set().extend(ids);
    }

    /// The namespaces `ids` will not be asked for after all (gone, or a full scan instead).
    pub fn stop_awaiting(&self, ids: &[MountNsId]) {
        let mut awaiting = self.awaiting_set();
        for id in ids {
            awaiting.remove(id);
        }
    }

    pub(super) fn awaiting_set(&self) -> std::sync::MutexGuard<'_, HashSet<MountNsId>> {
        self.awaiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Asks for mount namespaces new since the last full scan to be read in full, processes and
    /// all, each given with the processes found in it off the scanner's path
    /// ([`crate::snapshot::new_namespace_read::processes_in`]; a full scan, if one is pending or the re-read cannot
    /// stand in for one). They are no longer awaited once asked for (in that order: the
    /// scanner looks at what is awaited before it takes what is asked for).
    pub fn request_new_namespaces(&self, found: BTreeMap<MountNsId, BTreeSet<u32>>) {
        if found.is_empty() {
            return;
        }
        let ids: Vec<MountNsId> = found.keys().copied().collect();
        self.pending().add(|c| {
            for (id, pids) in found {
                c.new_namespaces.entry(id).or_default().extend(pids);
            }
        });
        self.stop_awaiting(&ids);
        self.rescan.notify_one();
    }

    /// The processes with a task in each of `ids`, from every task's link on the host
    /// (blocking: about 11 ms at 200 namespaces; the daemon runs it off the scanner's path).
    pub fn find_processes_in(
        &self,
        ids: &HashSet<MountNsId>,
    ) -> Result<BTreeMap<MountNsId, BTreeSet<u32>>, String> {
        self.engine.world.processes_in(ids)
    }

    /// Asks for block device `name` (named by a uevent) to be read again, with what is stacked
    /// on it (a full scan, if one is pending or the re-read cannot stand in for one).
    pub fn request_device_rescan(&self, name: String) {
        self.pending().add(|c| {
            c.devices.insert(name);
        });
        self.rescan.notify_one();
    }

    pub(super) fn pending(&self) -> Pending<'_> {
        Pending {
            changes: self.pending_changes.lock().unwrap_or_else(|p| p.into_inner()),
            waiting: &self.change_waiting,
        }
    }

    /// Uses the kernel's mount events: every full scan's namespaces are watched from now on.
    pub fn use_mount_watch(&self, watch: Arc<dyn NamespaceWatch>) {
        watch.use_host(&self.host);
        let _ = self.mount_watch.set(watch);
    }

    pub(super) fn clocks(&self) -> std::sync::MutexGuard<'_, Clocks> {
        self.clocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sends `e` to the watchers, through the per-device cap on state events
    /// ([`super::event_rate`]).
    pub(super) fn send_event(&self, e: AgentEvent) {
        for e in self.event_rate.admit(e, Instant::now()) {
            let _ = self.events.send(e);
        }
    }

    /// Sends the held state events when their second is up ([`super::event_rate::EventRate::flush_held`]:
    /// asleep while nothing is held), until `shutdown`.
    pub async fn send_held_events(self: Arc<Self>, shutdown: tokio::sync::watch::Receiver<bool>) {
        let rate = Arc::clone(&self.event_rate);
        rate.flush_held(
            |e| {
                let _ = self.events.send(e);
            },
            shutdown,
        )
        .await
    }

    /// Follows each device held by a live filesystem with no mount until it ends
    /// ([`super::fs_end`]: asleep while there is none), until `shutdown`: held by the filesystem
    /// alone, the device is read again; held by processes too, a full scan is asked for once
    /// they are all gone (a device re-read carries processes over from the last full scan).
    pub async fn follow_filesystem_ends(self: Arc<Self>, shutdown: tokio::sync::watch::Receiver<bool>) {
        let fs_ends = Arc::clone(&self.fs_ends);
        let try_one = |name: String, pids: Vec<u32>| {
            if pids.is_empty() {
                self.request_device_rescan(name);
            } else if pids.iter().all(|p| super::fs_end::process_gone(&self.host, *p)) {
                tracing::debug!(device = %name, ?pids, "the processes holding a detached filesystem are gone");
                self.request_rescan("filesystem");
            }
        };
        fs_ends.follow(try_one, shutdown).await
    }

    /// Makes `view` the latest and sends what changed.
    pub(super) fn publish(&self, trigger: &'static str, elapsed: Duration, view: View) {
        let started = Instant::now();
        let view = Arc::new(view);
        let old = self.view();
        let events = diff(&old, &view);
        if let Ok(mut v) = self.view.write() {
            *v = Arc::clone(&view);
        }
        for e in events {
            self.send_event(e);
        }
        self.fs_ends.saw(super::fs_end::ending_filesystems(&view), Instant::now());
        let sent = started.elapsed();
        // The metrics are the slowest part (a series per device): after the API and the
        // watchers have what changed.
        self.metrics.observe_scan(trigger, elapsed, &view);
        tracing::debug!(
            trigger,
            scan_us = elapsed.as_micros() as u64,
            publish_us = sent.as_micros() as u64,
            metrics_us = (started.elapsed() - sent).as_micros() as u64,
            "published"
        );
    }
}
