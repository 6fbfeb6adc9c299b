//! The daemon's state: the engine and its grace clocks, the latest judged scan (a [`View`]), the
//! rescan loop, plans and actions on request and by mode, and the event stream. Every scan,
//! verdict, plan and action goes through the one engine ([`crate::engine`]); this file only
//! schedules it.
//!
//! Scans run on a blocking thread with a deadline; while one runs, further triggers collapse into
//! a single follow-up scan (a `Notify` holds at most one permit), so scans never stack. A scan
//! that overruns its deadline is reported; no new scan starts until it has finished.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, Notify};

use super::budget::Budget;
use super::events::{diff, AgentEvent, EventKind};
use crate::act::StepReport;
use crate::config::{Config, Mode};
use crate::daemon::metrics::Metrics;
use crate::engine::error::EngineError;
pub use crate::engine::view::{DeviceView, View};
use crate::engine::workflow::{Outcome, Request, Subject};
use crate::engine::world::LinuxWorld;
use crate::engine::{Engine, Operation};
use crate::graph::resolve;
use crate::graph::scan::Target;
use crate::host::HostRoot;
use crate::judge::grace::Clocks;
use crate::judge::Verdict;
use crate::model::{DevNum, MountNsId};
use crate::plan::Plan;
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

/// Everything the server and the background tasks share.
pub struct AgentState {
    pub host: HostRoot,
    pub config: Config,
    pub node_name: String,
    pub kernel: String,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<AgentEvent>,
    engine: Engine<LinuxWorld>,
    clocks: Mutex<Clocks>,
    view: RwLock<Arc<View>>,
    rescan: Notify,
    pending_trigger: Mutex<Option<&'static str>>,
    /// What the kernel reported changed since the last scan (read again alone, when no full
    /// scan is pending).
    pending_changes: Mutex<Changes>,
    /// The kernel's mount events, when it offers them.
    mount_watch: std::sync::OnceLock<Arc<dyn NamespaceWatch>>,
    act_lock: tokio::sync::Mutex<()>,
    /// Events and the Node condition, when the API is in use.
    reporter: std::sync::OnceLock<crate::kube::Reporter>,
    /// Destructive steps of release/clean mode in the last minute (the rate limit's window).
    budget: Mutex<Budget>,
    /// Plan calls a minute per caller (each scans afresh).
    pub plan_limit: super::peer_limit::PeerLimit,
    /// Why the latest scan failed (`None`: it succeeded): the health service answers NOT_SERVING
    /// while it is `Some`, since every answer then rests on an older view.
    pub scan_failure: tokio::sync::watch::Sender<Option<String>>,
}

/// Something that watches mount namespaces for changes (the kernel's mount events, see
/// `daemon::mount_watch`): told after each full scan which namespaces there are, each with a
/// file that names it.
pub trait NamespaceWatch: Send + Sync {
    /// Watches the namespaces not watched yet and forgets those gone; returns how many were
    /// added.
    fn sync(&self, namespaces: &[(MountNsId, std::path::PathBuf)]) -> usize;
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
        engine: Engine<LinuxWorld>,
    ) -> Arc<Self> {
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
        let plan_limit = super::peer_limit::PeerLimit::new(config.plans_per_minute_per_client);
        Arc::new(Self {
            host,
            config,
            node_name,
            kernel,
            metrics,
            events,
            engine,
            clocks: Mutex::new(clocks),
            view: RwLock::new(Arc::new(View::empty())),
            rescan: Notify::new(),
            pending_trigger: Mutex::new(None),
            pending_changes: Mutex::new(Changes::default()),
            mount_watch: std::sync::OnceLock::new(),
            act_lock: tokio::sync::Mutex::new(()),
            reporter: std::sync::OnceLock::new(),
            budget: Mutex::new(budget),
            plan_limit,
            scan_failure: tokio::sync::watch::channel(None).0,
        })
    }

    /// Uses the Kubernetes API from now on: its view weighs in on verdicts and gates, and stale
    /// devices and actions are reported as Events and a Node condition.
    pub fn use_kubernetes(
        &self,
        cluster: tokio::sync::watch::Receiver<crate::kube::ClusterView>,
        reporter: crate::kube::Reporter,
    ) {
        let _ = self.engine.world.cluster.set(cluster);
        let _ = self.reporter.set(reporter);
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

    /// Asks for a rescan; triggers that arrive while one is pending or running coalesce.
    pub fn request_rescan(&self, trigger: &'static str) {
        if let Ok(mut p) = self.pending_trigger.lock() {
            p.get_or_insert(trigger);
        }
        self.rescan.notify_one();
    }

    /// Asks for the mounts of `namespaces` to be re-read (a full scan, if one is pending or the
    /// re-read cannot stand in for one).
    pub fn request_namespace_rescan(&self, namespaces: HashSet<MountNsId>) {
        if namespaces.is_empty() {
            return;
        }
        self.pending().namespaces.extend(namespaces);
        self.rescan.notify_one();
    }

    /// Tells the scanner that `namespaces` no longer exist (a re-read drops them; a full scan,
    /// if one is pending or the re-read cannot stand in for one).
    pub fn request_namespaces_gone(&self, namespaces: HashSet<MountNsId>) {
        if namespaces.is_empty() {
            return;
        }
        self.pending().gone.extend(namespaces);
        self.rescan.notify_one();
    }

    /// Asks for block device `name` (named by a uevent) to be read again, with what is stacked
    /// on it (a full scan, if one is pending or the re-read cannot stand in for one).
    pub fn request_device_rescan(&self, name: String) {
        self.pending().devices.insert(name);
        self.rescan.notify_one();
    }

    fn pending(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.pending_changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Uses the kernel's mount events: every full scan's namespaces are watched from now on.
    pub fn use_mount_watch(&self, watch: Arc<dyn NamespaceWatch>) {
        watch.use_host(&self.host);
        let _ = self.mount_watch.set(watch);
    }

    fn clocks(&self) -> std::sync::MutexGuard<'_, Clocks> {
        self.clocks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Scans the whole host and judges it (blocking).
    fn scan_blocking(&self, scan_number: u64) -> Result<View, String> {
        let scan = self.engine.scan(Target::All).map_err(|e| e.to_string())?;
        if let Some(watch) = self.mount_watch.get() {
            watch.sync(&self.engine.world.namespace_files());
        }
        let judged = self.engine.judge(scan, &mut self.clocks());
        Ok(View::of(judged, scan_number))
    }

    /// Brings the latest view up to date after what the kernel reported changed (blocking).
    /// Judged on a copy of the grace clocks: a re-read carries the full scan's fds and
    /// processes, so it may show a verdict and restart a clock, but never advances one.
    /// `Err`: why only a full scan will do.
    fn rescan_changed_blocking(
        &self,
        changes: &Changes,
        scan_number: u64,
        previous: &View,
    ) -> Result<View, String> {
        use crate::engine::world::World;
        let t0 = Instant::now();
        let scan = self.engine.world.rescan_changed(changes)?;
        let t1 = Instant::now();
        let mut scratch = self.clocks().clone();
        let judged = self.engine.judge(scan, &mut scratch);
        // It may restart a clock (it saw the device held: a mount is evidence enough), never
        // advance one.
        self.clocks().retain(|id| scratch.get(id).is_some());
        let t2 = Instant::now();
        let view = View::of(judged, scan_number).carrying_device_reads_of(previous);
        tracing::debug!(
            read_us = (t1 - t0).as_micros() as u64,
            judge_us = (t2 - t1).as_micros() as u64,
            view_us = t2.elapsed().as_micros() as u64,
            "re-read what changed"
        );
        Ok(view)
    }

    /// Reads again what the kernel reported changed and publishes the result; false when only
    /// a full scan will do.
    async fn rescan_changed_once(self: &Arc<Self>, changes: Changes) -> bool {
        let previous = self.view();
        let number = previous.scan_number + 1;
        let me = Arc::clone(self);
        let started = Instant::now();
        let handle =
            tokio::task::spawn_blocking(move || me.rescan_changed_blocking(&changes, number, &previous));
        match tokio::time::timeout(SCAN_DEADLINE, handle).await {
            Ok(Ok(Ok(view))) => {
                self.publish("changes", started.elapsed(), view);
                true
            }
            Ok(Ok(Err(why))) => {
                tracing::debug!("{why}: scanning in full");
                false
            }
            Ok(Err(join)) => {
                tracing::error!("re-read thread failed: {join}");
                false
            }
            Err(_) => {
                tracing::error!("a re-read overran its {SCAN_DEADLINE:?} deadline");
                false
            }
        }
    }

    /// Makes `view` the latest and sends what changed.
    fn publish(&self, trigger: &'static str, elapsed: Duration, view: View) {
        let started = Instant::now();
        let view = Arc::new(view);
        let old = self.view();
        let events = diff(&old, &view);
        if let Ok(mut v) = self.view.write() {
            *v = Arc::clone(&view);
        }
        for e in events {
            let _ = self.events.send(e);
        }
        let sent = started.elapsed();
        // The metrics are the slowest part (a series per device): after the API and the
        // watchers have what changed.
        self.metrics.observe_scan(&self.node_name, trigger, elapsed, &view);
        tracing::debug!(
            trigger,
            scan_us = elapsed.as_micros() as u64,
            publish_us = sent.as_micros() as u64,
            metrics_us = (started.elapsed() - sent).as_micros() as u64,
            "published"
        );
    }

    /// Runs one scan now on a blocking thread, publishes it and its events. Returns false when
    /// the scan failed or overran (the previous view stays).
    pub async fn scan_once(self: &Arc<Self>, trigger: &'static str) -> bool {
        let number = self.view().scan_number + 1;
        let me = Arc::clone(self);
        let started = Instant::now();
        let handle = tokio::task::spawn_blocking(move || me.scan_blocking(number));
        let result = match tokio::time::timeout(SCAN_DEADLINE, handle).await {
            Ok(Ok(r)) => r,
            Ok(Err(join)) => Err(format!("scan thread failed: {join}")),
            Err(_) => {
                Err(format!("scan overran its {SCAN_DEADLINE:?} deadline; a device or process may be hung"))
            }
        };
        let elapsed = started.elapsed();
        match result {
            Ok(view) => {
                self.publish(trigger, elapsed, view);
                self.scan_failure.send_if_modified(|f| f.take().is_some());
                true
            }
            Err(e) => {
                self.metrics.scan_failed(trigger);
                tracing::error!(trigger, "scan failed: {e}");
                self.scan_failure.send_replace(Some(e));
                false
            }
        }
    }

    /// The rescan loop: waits for triggers and scans, one at a time, until `shutdown` fires.
    pub async fn run_scanner(self: Arc<Self>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        loop {
            tokio::select! {
                _ = self.rescan.notified() => {}
                _ = shutdown.changed() => return,
            }
            let changes = std::mem::take(&mut *self.pending());
            let full_pending = self.pending_trigger.lock().map(|p| p.is_some()).unwrap_or(true);
            // What the kernel reported is shown at once, without waiting to settle.
            if !full_pending && !changes.is_empty() && self.rescan_changed_once(changes).await {
                continue;
            }
            // Let a burst of uevents or mount changes settle into one scan.
            tokio::time::sleep(Duration::from_millis(100)).await;
            *self.pending() = Changes::default();
            let trigger = self.pending_trigger.lock().ok().and_then(|mut p| p.take()).unwrap_or("mount");
            if self.scan_once(trigger).await {
                self.report_to_kubernetes().await;
                self.act_by_mode().await;
            }
        }
    }

    /// Events for devices that are stale, and the Node condition naming every stale one. An
    /// Event says the verdict's summary (no age, no command line), so the reporter's
    /// de-duplication holds across scans.
    async fn report_to_kubernetes(&self) {
        let Some(reporter) = self.reporter.get() else { return };
        let view = self.view();
        let stale: Vec<&DeviceView> =
            view.devices.iter().filter(|d| d.judgement.verdict == Verdict::Stale).collect();
        for d in &stale {
            let name = d.entry.device.name.as_str();
            if let Err(e) =
                reporter.event(crate::kube::EventReason::StaleBlockDevice, name, &d.judgement.summary).await
            {
                tracing::warn!(device = name, "cannot post a StaleBlockDevice event: {e}");
            }
        }
        let names: Vec<String> = stale.iter().map(|d| d.entry.device.name.to_string()).collect();
        if let Err(e) = reporter.set_condition(&names).await {
            tracing::warn!("cannot set the StaleBlockDevices node condition: {e}");
        }
    }

    /// In release and clean modes, acts on what the latest scan found. Each device's plan comes
    /// from a fresh scan through the engine's gates, and runs as a unit within the per-minute
    /// step budget (a plan larger than the whole budget runs once the window is empty).
    async fn act_by_mode(self: &Arc<Self>) {
        let mode = self.config.mode;
        let op = match mode {
            Mode::Report => return,
            Mode::Release => Operation::Release,
            Mode::Clean => Operation::Clean,
        };
        let view = self.view();
        let targets: Vec<DevNum> = view
            .devices
            .iter()
            .filter(|d| match mode {
                Mode::Clean => d.judgement.verdict == Verdict::Stale,
                // Volumes kubelet knows and no pod of its uses, still mounted in other namespaces.
                Mode::Release => {
                    d.judgement.verdict != Verdict::Protected
                        && d.entry.kubernetes.as_ref().is_some_and(|k| k.pod_uids.is_empty())
                        && d.entry.holders.iter().any(|h| h.is_foreign_mount())
                }
                Mode::Report => false,
            })
            .map(|d| d.entry.device.devnum)
            .collect();
        if targets.is_empty() {
            return;
        }
        let _guard = self.act_lock.lock().await;
        let me = Arc::clone(self);
        let outcome = tokio::task::spawn_blocking(move || me.act_blocking(&targets, op)).await;
        let reports = match outcome {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::error!(mode = mode.as_str(), "{e}");
                return;
            }
            Err(e) => {
                tracing::error!(mode = mode.as_str(), "the action thread failed: {e}");
                return;
            }
        };
        if reports.is_empty() {
            return;
        }
        if let Some(reporter) = self.reporter.get() {
            for r in &reports {
                let (word, detail) = r.word();
                let reason = match (word, r.step.is_release()) {
                    ("failed" | "skipped", _) => crate::kube::EventReason::CleanupFailed,
                    (_, true) => crate::kube::EventReason::BlockDeviceReleased,
                    _ => crate::kube::EventReason::BlockDeviceCleaned,
                };
                let msg = if detail.is_empty() {
                    r.step.describe()
                } else {
                    format!("{}: {detail}", r.step.describe())
                };
                let _ = reporter.event(reason, r.step.device.as_str(), &msg).await;
            }
        }
        self.request_rescan("apply");
    }

    /// A request for `op` on `devnum` through the one workflow ([`Engine::carry_out`]), with
    /// the daemon's journal and grace clocks.
    /// (Set `expected_identity` and `admit` with struct update syntax.)
    fn request(&self, devnum: DevNum, op: Operation, apply: bool, by: &str) -> Request<'_> {
        Request {
            op,
            subject: Subject::Device(devnum),
            argument: devnum.to_string(),
            expected_identity: None,
            apply,
            by: by.to_owned(),
            journal: &self.config.journal,
            lock_wait: crate::engine::workflow::LOCK_WAIT,
            clocks: &self.clocks,
            admit: None,
        }
    }

    /// Plans `op` for each target from a fresh scan (a dry run of the one workflow), then carries
    /// out, bound to the identity it planned for, each plan the budget admits.
    fn act_blocking(&self, targets: &[DevNum], op: Operation) -> Result<Vec<StepReport>, ApiError> {
        let by = format!("daemon mode {}", self.config.mode.as_str());
        let mut plans = Vec::new();
        for &devnum in targets {
            match self.engine.carry_out(&self.request(devnum, op, false, &by)) {
                Ok(Outcome { plan: Some(p), .. }) if p.refusal.is_none() && !p.steps.is_empty() => {
                    plans.push(p)
                }
                // The latest view called it a candidate; the fresh scan behind the plan did not
                // agree. Said, so an operator can see why a stale device was left alone.
                Ok(Outcome { plan: Some(p), .. }) if p.refusal.is_some() => {
                    let why = p.refusal.as_deref().unwrap_or_default();
                    tracing::info!(device = %p.device, op = ?op, "not acting on it: {why}");
                }
                Ok(_) | Err(EngineError::NotFound(_)) => {}
                Err(e) => tracing::warn!(device = %devnum, "cannot plan: {e}"),
            }
        }
        // A plan that logs an iSCSI session out after its disk runs after the plans that delete
        // the session's other disks (its logout needs them gone; stable otherwise).
        plans.sort_by_key(|p| {
            p.steps.iter().any(|s| matches!(s.action, crate::plan::Action::IscsiLogout { .. }))
        });
        let admit = |p: &Plan| {
            let mut budget = self.budget.lock().unwrap_or_else(|p| p.into_inner());
            if budget.admit(p.steps.len(), Instant::now()) {
                self.action_started(p);
                Ok(())
            } else {
                Err(format!(
                    "rate limit reached ({} steps a minute): {} step(s) postponed to a later scan",
                    self.config.max_actions_per_minute,
                    p.steps.len()
                ))
            }
        };
        let mut out = Vec::new();
        for p in plans {
            let req = Request {
                argument: p.device.to_string(),
                expected_identity: Some(p.identity.token()),
                admit: Some(&admit),
                ..self.request(p.devnum, op, true, &by)
            };
            match self.engine.carry_out(&req) {
                Ok(o) => {
                    if let Some((_, why)) = &o.refusal {
                        tracing::warn!(device = %p.device, op = ?op, "not acting on it: {why}");
                    }
                    out.extend(self.finished(o));
                }
                Err(e) => tracing::warn!(device = %p.device, "cannot act: {e}"),
            }
        }
        Ok(out)
    }

    fn action_started(&self, p: &Plan) {
        let name = p.device.as_str();
        let _ = self.events.send(AgentEvent::new(
            EventKind::ActionStarted,
            name,
            format!("{} {name}: {} step(s)", p.operation, p.steps.len()),
            None,
        ));
    }

    /// Metrics and the ActionFinished event of a carried-out request; its step reports (those
    /// of unfinished plans it resumed first).
    fn finished(&self, o: Outcome) -> Vec<StepReport> {
        let mut reports: Vec<StepReport> = o.resumed.into_iter().flat_map(|r| r.reports).collect();
        for r in &reports {
            self.metrics.action(r.step.action(), r.word().0);
        }
        if let (Some(p), true) = (&o.plan, o.applied) {
            let name = p.device.as_str();
            let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
            for r in &o.reports {
                let (word, _) = r.word();
                self.metrics.action(r.step.action(), word);
                *counts.entry(word).or_default() += 1;
            }
            let summary: Vec<String> = counts.iter().map(|(w, n)| format!("{n} {w}")).collect();
            let _ = self.events.send(AgentEvent::new(
                EventKind::ActionFinished,
                name,
                format!("{} {name}: {}", p.operation, summary.join(", ")),
                None,
            ));
        }
        reports.extend(o.reports);
        reports
    }

    /// Looks a device argument up in the latest view.
    pub fn find(&self, arg: &str) -> Result<DeviceView, ApiError> {
        check_device_arg(arg)?;
        let view = self.view();
        if view.scanned_at.is_none() {
            return Err(ApiError::Unavailable("no scan has finished yet; try again in a moment".into()));
        }
        let dev = resolve::device(&self.host, view.devices.iter().map(|d| &d.entry.device), arg)
            .map_err(|e| ApiError::NotFound(e.to_string()))?;
        let devnum = dev.devnum;
        view.devices
            .iter()
            .find(|d| d.entry.device.devnum == devnum)
            .cloned()
            .ok_or_else(|| ApiError::NotFound(format!("unknown device '{arg}'")))
    }

    /// The devices named (each once), or every stale one when none is named.
    fn targets(&self, devices: &[String]) -> Result<Vec<DevNum>, ApiError> {
        if devices.is_empty() {
            return Ok(self
                .view()
                .devices
                .iter()
                .filter(|d| d.judgement.verdict == Verdict::Stale)
                .map(|d| d.entry.device.devnum)
                .collect());
        }
        let mut seen = BTreeSet::new();
        for d in devices {
            seen.insert(self.find(d)?.entry.device.devnum);
        }
        Ok(seen.into_iter().collect())
    }

    /// `op` plans for the named devices (or, for a cleanup, every stale one), each from a fresh
    /// scan of the device judged with the daemon's grace clocks. Changes nothing.
    pub async fn plan(self: &Arc<Self>, devices: &[String], op: Operation) -> Result<Vec<Plan>, ApiError> {
        if devices.is_empty() && op == Operation::Release {
            return Err(ApiError::InvalidArgument("a release plan needs the devices named".into()));
        }
        let targets = self.targets(devices)?;
        let me = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut plans = Vec::new();
            for devnum in targets {
                let req = me.request(devnum, op, false, "Plan");
                match me.engine.carry_out(&req) {
                    Ok(o) => plans.extend(o.plan),
                    Err(EngineError::NotFound(_)) => {}
                    Err(e) => return Err(ApiError::from(e)),
                }
            }
            Ok(plans)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("planning thread failed: {e}")))?
    }

    /// Plans and carries out `op` (a cleanup, or a release of foreign mount copies) on the named
    /// devices, one Apply at a time.
    /// `identities`, when given, are the identities a Plan answered for the same devices (same
    /// order, "" for none): a device that is now another one is refused (FailedPrecondition
    /// naming both) before anything runs.
    pub async fn apply(
        self: &Arc<Self>,
        devices: &[String],
        identities: &[String],
        op: Operation,
    ) -> Result<(Vec<Plan>, Vec<StepReport>), ApiError> {
        if devices.is_empty() {
            return Err(ApiError::InvalidArgument("apply needs at least one device".into()));
        }
        if !identities.is_empty() && identities.len() != devices.len() {
            return Err(ApiError::InvalidArgument(format!(
                "{} identities for {} devices: give one per device (\"\" for none), in the same order",
                identities.len(),
                devices.len()
            )));
        }
        self.can_act().map_err(ApiError::FailedPrecondition)?;
        let mut wanted = Vec::new();
        for (i, d) in devices.iter().enumerate() {
            let v = self.find(d)?;
            if v.judgement.verdict == Verdict::Protected {
                return Err(ApiError::FailedPrecondition(format!(
                    "{} is protected: {}",
                    v.entry.device.name,
                    v.judgement.reasons.join("; ")
                )));
            }
            let expected = identities.get(i).filter(|t| !t.is_empty()).cloned();
            wanted.push((v.entry.device.devnum, expected));
        }
        let _guard = self.act_lock.lock().await;
        let me = Arc::clone(self);
        let (plans, reports) = tokio::task::spawn_blocking(move || {
            // Every device bound to the identity the caller saw before anything runs (a dry run
            // of each), then each carried out through the one workflow, bound to it again.
            let by = "Apply".to_owned();
            let mut bound = Vec::new();
            for (devnum, expected) in &wanted {
                let o = me.engine.carry_out(&Request {
                    expected_identity: expected.clone(),
                    ..me.request(*devnum, op, false, &by)
                })?;
                if let Some((_, why)) = o.refusal {
                    return Err(ApiError::FailedPrecondition(why));
                }
                let token = o.plan.as_ref().map(|p| p.identity.token());
                bound.push((*devnum, expected.clone().or(token)));
            }
            let admit = |p: &Plan| {
                me.action_started(p);
                Ok(())
            };
            let mut plans = Vec::new();
            let mut reports = Vec::new();
            for (devnum, expected) in bound {
                let o = me.engine.carry_out(&Request {
                    expected_identity: expected,
                    admit: Some(&admit),
                    ..me.request(devnum, op, true, &by)
                })?;
                if let Some((_, why)) = &o.refusal {
                    if plans.is_empty() && reports.is_empty() {
                        return Err(ApiError::FailedPrecondition(why.clone()));
                    }
                    tracing::warn!(device = %devnum, "Apply: not acting on it: {why}");
                }
                plans.extend(o.plan.clone());
                reports.extend(me.finished(o));
            }
            Ok::<_, ApiError>((plans, reports))
        })
        .await
        .map_err(|e| ApiError::Internal(format!("apply thread failed: {e}")))??;
        self.request_rescan("apply");
        Ok((plans, reports))
    }
}
