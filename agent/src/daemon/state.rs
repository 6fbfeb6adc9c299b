//! The daemon's state: the latest scan (a [`View`]), the rescan loop, plans and actions on
//! request, and the event stream.
//!
//! Scans run on a blocking thread with a deadline; while one runs, further triggers collapse into
//! a single follow-up scan (a `Notify` holds at most one permit), so scans never stack. A scan
//! that overruns its deadline is reported; no new scan starts until it has finished.

use std::collections::{BTreeSet, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use tokio::sync::{broadcast, Notify};

use super::events::{diff, AgentEvent, EventKind};
use super::protect::protected_devices;
use crate::act::linux::LinuxActuator;
use crate::act::{execute, StepReport};
use crate::config::Config;
use crate::discover::blockdev;
use crate::discover::namespaces::MountReader;
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::host::HostRoot;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::model::{DevNum, MountNsId};
use crate::plan::{self, Plan};
use crate::policy::{Judgement, Tracker, Verdict};
use crate::resolve;
use crate::snapshot::{ScanOptions, ScanStats, Scope, Snapshot};

/// Longest a scan may take before it is reported as overrunning.
pub const SCAN_DEADLINE: Duration = Duration::from_secs(60);

/// A device with its verdict.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceView {
    pub entry: DeviceEntry,
    pub judgement: Judgement,
}

/// The result of one scan.
#[derive(Debug, Clone, Serialize)]
pub struct View {
    pub scan_number: u64,
    pub scanned_at: Option<SystemTime>,
    pub stats: ScanStats,
    pub host_ns: MountNsId,
    pub devices: Vec<DeviceView>,
    pub warnings: Vec<String>,
}

impl View {
    fn empty() -> Self {
        Self {
            scan_number: 0,
            scanned_at: None,
            stats: ScanStats::default(),
            host_ns: MountNsId(0),
            devices: Vec::new(),
            warnings: Vec::new(),
        }
    }
}

/// Why a request failed; mapped to a gRPC status by the server.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    PermissionDenied(String),
    /// The request is well-formed but the device's state forbids it (e.g. it is protected).
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Internal(String),
}

/// Everything the server and the background tasks share.
pub struct AgentState {
    pub host: HostRoot,
    pub config: Config,
    pub node_name: String,
    pub kernel: String,
    pub metrics: Arc<Metrics>,
    pub events: broadcast::Sender<AgentEvent>,
    view: RwLock<Arc<View>>,
    tracker: Mutex<Tracker>,
    rescan: Notify,
    pending_trigger: Mutex<Option<&'static str>>,
    act_lock: tokio::sync::Mutex<()>,
    /// The Kubernetes API's view of this node, when the API is in use.
    cluster: std::sync::OnceLock<tokio::sync::watch::Receiver<crate::kube::ClusterView>>,
    /// Events and the Node condition, when the API is in use.
    reporter: std::sync::OnceLock<crate::kube::Reporter>,
    /// When recent destructive steps of release/clean mode ran (the rate limit's window).
    recent_actions: Mutex<std::collections::VecDeque<Instant>>,
}

/// The plan for one device: loop devices are unbound once free (releasing foreign mounts
/// first); multipath maps and SCSI disks are torn down only once the daemon has judged them
/// stale (all paths failed, or offline, for the grace period across scans).
fn plan_for(e: &DeviceEntry, graph: &DeviceGraph, view: &View) -> Plan {
    let judged = view.devices.iter().find(|d| d.entry.device.devnum == e.device.devnum).map(|d| &d.judgement);
    let mut p = if plan::needs_stale_verdict(e) {
        plan::for_clean(e, graph, plan::CleanOptions::default())
    } else {
        plan::cleanup(e)
    };
    plan::gate(&mut p, e, judged);
    p
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
    Ok(())
}

impl AgentState {
    pub fn new(host: HostRoot, config: Config, metrics: Arc<Metrics>) -> Arc<Self> {
        let node_name = config.node_name.clone().unwrap_or_else(|| {
            nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "unknown".into())
        });
        let kernel = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        let (events, _) = broadcast::channel(1024);
        Arc::new(Self {
            host,
            config,
            node_name,
            kernel,
            metrics,
            events,
            view: RwLock::new(Arc::new(View::empty())),
            tracker: Mutex::new(Tracker::default()),
            rescan: Notify::new(),
            pending_trigger: Mutex::new(None),
            act_lock: tokio::sync::Mutex::new(()),
            cluster: std::sync::OnceLock::new(),
            reporter: std::sync::OnceLock::new(),
            recent_actions: Mutex::new(std::collections::VecDeque::new()),
        })
    }

    /// Uses the Kubernetes API from now on: its view weighs in on verdicts, and stale devices
    /// and actions are reported as Events and a Node condition.
    pub fn use_kubernetes(
        &self,
        cluster: tokio::sync::watch::Receiver<crate::kube::ClusterView>,
        reporter: crate::kube::Reporter,
    ) {
        let _ = self.cluster.set(cluster);
        let _ = self.reporter.set(reporter);
    }

    fn scan_options(&self) -> ScanOptions {
        ScanOptions { reader: MountReader::Auto, kubelet_dir: self.config.kubelet_dir.clone() }
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

    /// Scans the whole host (blocking) and returns the new view.
    fn scan_blocking(&self, scan_number: u64) -> Result<View, String> {
        let snap =
            Snapshot::take_opts(&self.host, &Scope::All, &self.scan_options()).map_err(|e| e.to_string())?;
        let graph = DeviceGraph::build(&snap);
        let protected = protected_devices(
            &self.host,
            &graph,
            &self.config.protected_paths,
            &self.config.protected_devices,
        );
        let judgements = self.tracker.lock().map_err(|_| "policy tracker poisoned".to_owned())?.judge(
            &graph,
            &protected,
            self.config.grace_period(),
            SystemTime::now(),
        );
        let api = self.cluster.get().map(|rx| rx.borrow().clone());
        let devices = graph
            .devices
            .into_iter()
            .map(|entry| {
                let judgement = judgements
                    .get(&entry.device.devnum)
                    .cloned()
                    .unwrap_or(Judgement { verdict: Verdict::Unused, reasons: Vec::new() });
                let judgement = crate::policy::with_api(judgement, &entry, api.as_ref());
                DeviceView { entry, judgement }
            })
            .collect();
        Ok(View {
            scan_number,
            scanned_at: Some(SystemTime::now()),
            stats: snap.stats,
            host_ns: snap.host_ns,
            devices,
            warnings: snap.warnings,
        })
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
                self.metrics.observe_scan(trigger, elapsed, &view);
                let old = self.view();
                let events = diff(&old, &view);
                if let Ok(mut v) = self.view.write() {
                    *v = Arc::new(view);
                }
                for e in events {
                    let _ = self.events.send(e);
                }
                true
            }
            Err(e) => {
                self.metrics.scan_failed(trigger);
                tracing::error!(trigger, "scan failed: {e}");
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
            // Let a burst of uevents or mount changes settle into one scan.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let trigger = self.pending_trigger.lock().ok().and_then(|mut p| p.take()).unwrap_or("timer");
            if self.scan_once(trigger).await {
                self.report_to_kubernetes().await;
                self.act_by_mode().await;
            }
        }
    }

    /// Events for devices that are stale, and the Node condition naming every stale one (the
    /// reporter de-duplicates repeated events).
    async fn report_to_kubernetes(&self) {
        let Some(reporter) = self.reporter.get() else { return };
        let view = self.view();
        let stale: Vec<&DeviceView> =
            view.devices.iter().filter(|d| d.judgement.verdict == Verdict::Stale).collect();
        for d in &stale {
            let why = d.judgement.reasons.first().cloned().unwrap_or_default();
            let name = d.entry.device.name.as_str();
            if let Err(e) = reporter.event(crate::kube::EventReason::StaleBlockDevice, name, &why).await {
                tracing::warn!(device = name, "cannot post a StaleBlockDevice event: {e}");
            }
        }
        let names: Vec<String> = stale.iter().map(|d| d.entry.device.name.to_string()).collect();
        if let Err(e) = reporter.set_condition(&names).await {
            tracing::warn!("cannot set the StaleBlockDevices node condition: {e}");
        }
    }

    /// In release and clean modes, acts on what the latest scan found, at most
    /// `max_actions_per_minute` destructive steps a minute. Every plan passes the same gates as an
    /// operator's Apply; each step is journaled and audited.
    async fn act_by_mode(self: &Arc<Self>) {
        use crate::config::Mode;
        let mode = self.config.mode;
        if mode == Mode::Report {
            return;
        }
        let view = self.view();
        let names: Vec<String> = view
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
            .map(|d| d.entry.device.name.to_string())
            .collect();
        if names.is_empty() {
            return;
        }
        let _guard = self.act_lock.lock().await;
        let planned = match mode {
            Mode::Release => self.plan_releases(&names).await,
            _ => self.plan(&names).await,
        };
        let Ok(mut plans) = planned else { return };
        let mut budget = self.action_budget();
        plans.retain(|p| {
            let n = p.steps.len();
            if p.refusal.is_some() || n == 0 {
                return false;
            }
            if n > budget {
                tracing::warn!(device = %p.device, steps = n, limit = self.config.max_actions_per_minute, "rate limit reached: postponed");
                return false;
            }
            budget -= n;
            true
        });
        if plans.is_empty() {
            return;
        }
        let me = Arc::clone(self);
        let todo = plans.clone();
        let reports = match tokio::task::spawn_blocking(move || me.execute_blocking(&todo)).await {
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
        if let Ok(mut recent) = self.recent_actions.lock() {
            recent.extend(std::iter::repeat_n(Instant::now(), reports.len()));
        }
        if let Some(reporter) = self.reporter.get() {
            for r in &reports {
                let (word, detail) = r.word();
                let reason = match (word, &r.step) {
                    ("failed", _) => crate::kube::EventReason::CleanupFailed,
                    (_, plan::Step::DetachMount { .. }) => crate::kube::EventReason::BlockDeviceReleased,
                    _ => crate::kube::EventReason::BlockDeviceCleaned,
                };
                let msg = if detail.is_empty() {
                    r.step.describe()
                } else {
                    format!("{}: {detail}", r.step.describe())
                };
                let _ = reporter.event(reason, r.step.device().as_str(), &msg).await;
            }
        }
        self.request_rescan("apply");
    }

    /// Destructive steps still allowed in the current minute.
    fn action_budget(&self) -> usize {
        let Ok(mut recent) = self.recent_actions.lock() else { return 0 };
        let now = Instant::now();
        while recent.front().is_some_and(|t| now.duration_since(*t) > Duration::from_secs(60)) {
            recent.pop_front();
        }
        (self.config.max_actions_per_minute as usize).saturating_sub(recent.len())
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

    /// Plans for the named devices, or for every stale one when none is named. Plans come from
    /// a fresh scan of each device, not the cached view.
    /// Release mode's plans: only the detaching of the devices' mounts in other namespaces, from
    /// a fresh scan of each, through the safety gate (a held device is `in_use`, so the stale
    /// gate of [`AgentState::plan`] would leave nothing to release).
    async fn plan_releases(self: &Arc<Self>, devices: &[String]) -> Result<Vec<Plan>, ApiError> {
        let targets: Vec<DevNum> =
            devices.iter().filter_map(|d| self.find(d).ok()).map(|d| d.entry.device.devnum).collect();
        let me = Arc::clone(self);
        let view = self.view();
        tokio::task::spawn_blocking(move || {
            let mut plans = Vec::new();
            for dn in targets {
                let Some((e, _)) = me.fresh_entry(dn)? else { continue };
                let judged = view.devices.iter().find(|d| d.entry.device.devnum == dn).map(|d| &d.judgement);
                let mut p = plan::release(&e);
                plan::safety_gate(&mut p, &e, judged);
                plans.push(p);
            }
            Ok(plans)
        })
        .await
        .map_err(|e| ApiError::Internal(format!("planning thread failed: {e}")))?
    }

    pub async fn plan(self: &Arc<Self>, devices: &[String]) -> Result<Vec<Plan>, ApiError> {
        let targets: Vec<DevNum> = if devices.is_empty() {
            self.view()
                .devices
                .iter()
                .filter(|d| d.judgement.verdict == Verdict::Stale)
                .map(|d| d.entry.device.devnum)
                .collect()
        } else {
            let mut seen = BTreeSet::new();
            for d in devices {
                seen.insert(self.find(d)?.entry.device.devnum);
            }
            seen.into_iter().collect()
        };
        let me = Arc::clone(self);
        let view = self.view();
        tokio::task::spawn_blocking(move || {
            targets
                .into_iter()
                .filter_map(|dn| me.fresh_entry(dn).transpose())
                .map(|r| r.map(|(e, graph)| plan_for(&e, &graph, &view)))
                .collect()
        })
        .await
        .map_err(|e| ApiError::Internal(format!("planning thread failed: {e}")))?
    }

    /// A fresh scan of one device and what is stacked on it; `None` when it is gone.
    fn fresh_entry(&self, devnum: DevNum) -> Result<Option<(DeviceEntry, DeviceGraph)>, ApiError> {
        let started = Instant::now();
        let devices = blockdev::scan(&self.host).map_err(|e| ApiError::Internal(e.to_string()))?;
        if !devices.iter().any(|d| d.devnum == devnum) {
            return Ok(None);
        }
        let scope = blockdev::with_descendants(&devices, devnum);
        let snap =
            Snapshot::take_with(&self.host, devices, &Scope::Devices(scope), started, &self.scan_options())
                .map_err(|e| ApiError::Internal(e.to_string()))?;
        let graph = DeviceGraph::build(&snap);
        Ok(graph.get(devnum).cloned().map(|e| (e, graph)))
    }

    /// Plans and carries out the cleanup of the named devices, one Apply at a time. Protected
    /// devices are refused.
    pub async fn apply(
        self: &Arc<Self>,
        devices: &[String],
    ) -> Result<(Vec<Plan>, Vec<StepReport>), ApiError> {
        if devices.is_empty() {
            return Err(ApiError::InvalidArgument("apply needs at least one device".into()));
        }
        let protected: HashSet<DevNum> = self
            .view()
            .devices
            .iter()
            .filter(|d| d.judgement.verdict == Verdict::Protected)
            .map(|d| d.entry.device.devnum)
            .collect();
        for d in devices {
            let v = self.find(d)?;
            if protected.contains(&v.entry.device.devnum) {
                return Err(ApiError::FailedPrecondition(format!(
                    "{} is protected: {}",
                    v.entry.device.name,
                    v.judgement.reasons.join("; ")
                )));
            }
        }
        let _guard = self.act_lock.lock().await;
        let plans = self.plan(devices).await?;
        let me = Arc::clone(self);
        let plans2 = plans.clone();
        let reports = tokio::task::spawn_blocking(move || me.execute_blocking(&plans2))
            .await
            .map_err(|e| ApiError::Internal(format!("apply thread failed: {e}")))??;
        self.request_rescan("apply");
        Ok((plans, reports))
    }

    fn execute_blocking(&self, plans: &[Plan]) -> Result<Vec<StepReport>, ApiError> {
        let mut journal = Journal::open(&self.config.journal).map_err(|e| {
            ApiError::Unavailable(format!("cannot open the journal {}: {e}", self.config.journal.display()))
        })?;
        let actuator = LinuxActuator::new(self.host.clone(), crate::act::linux::DEFAULT_TIMEOUT);
        let mut out = Vec::new();
        for p in plans.iter().filter(|p| p.refusal.is_none() && !p.steps.is_empty()) {
            let name = p.device.as_str();
            let _ = self.events.send(AgentEvent::new(
                EventKind::ActionStarted,
                name,
                format!("{} {name}: {} step(s)", p.operation, p.steps.len()),
                None,
            ));
            let devnum = p.devnum;
            let reports = execute(p, &actuator, &mut journal, |step| {
                plan::recheck(step, || self.fresh_entry(devnum).map(|found| found.map(|(e, _)| e)))
            });
            let mut counts: std::collections::BTreeMap<&str, usize> = std::collections::BTreeMap::new();
            for r in &reports {
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
            out.extend(reports);
        }
        Ok(out)
    }
}
