//! Every Prometheus series the agent exports, in one place, with the prefix `blockjanitor_` and
//! bounded label values (device kinds, verdicts, holder kinds, triggers, actions, results are
//! closed sets; no device names, PIDs or paths as labels), except `device_info`: one series per
//! rbd, nbd, multipath, stack layer (LV, crypt, partition map) or SCSI device (bounded by the node's devices of those kinds, reset on
//! every scan so a device that went takes its series with it), for joining a device to its image,
//! client, WWID and PV in queries, with labels that never change while the device lives (its
//! verdict is the state set `device_verdict`: one series per verdict, 1 for the current one, so a
//! verdict change moves a value, not a series); and `device_unresponsive`: one series per device
//! that does not answer I/O (reset on every scan the same way; `unresponsive_devices` counts them
//! by kind, at 0 from the start, for alerts).
//!
//! `pin_risks` and `pin_risk_copies` have one series per pod with a pin risk (its namespace and
//! name, or UID when the API does not name it; `""` for processes in no pod), bounded by the
//! pods on the node (kubelet's `maxPods`, 110 by default) and capped at [`PIN_SERIES_MAX`]: pods
//! beyond it share the series `pod="(other)"`. They are reset on every scan.
//!
//! No series carries the node's name: the scrape adds it (the ServiceMonitor makes the pod's node
//! the target label `node`), and a label of the agent's own by that name would clash with it.
//! The process's own series (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_open_fds`, ...) come from the Prometheus client's process collector, unprefixed as
//! the convention has them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounterVec, Opts, Registry, TextEncoder,
};

use crate::engine::view::View;
use crate::judge::Verdict;
use crate::model::{DeviceKind, HolderKind};

/// What can trigger a scan (the `trigger` label).
pub const TRIGGERS: [&str; 7] = ["start", "uevent", "udev", "mount", "filesystem", "timer", "apply"];
const VERDICTS: [Verdict; 7] = [
    Verdict::InUse,
    Verdict::Unused,
    Verdict::Suspect,
    Verdict::Stale,
    Verdict::Protected,
    Verdict::Unknown,
    Verdict::Outage,
];
/// Transports the outage guard watches (the `transport` label of `transport_outages`).
pub const OUTAGE_TRANSPORTS: [&str; 2] = ["iscsi", "nvme"];

/// Most pods with series of their own in `pin_risks` and `pin_risk_copies`.
pub const PIN_SERIES_MAX: usize = 256;

/// The health checks (the `check` label of `not_ready`; see `daemon::health`).
const HEALTH_CHECKS: [&str; 3] = ["scan", "journal", "kubernetes"];

/// The agent's metrics and their registry.
pub struct Metrics {
    registry: Registry,
    devices: GaugeVec,
    holders: GaugeVec,
    scan_duration: Histogram,
    scans: IntCounterVec,
    scan_failures: IntCounterVec,
    actions: IntCounterVec,
    last_scan: Gauge,
    device_info: GaugeVec,
    device_verdict: GaugeVec,
    device_unresponsive: GaugeVec,
    unresponsive_devices: GaugeVec,
    /// The process collector's registry (no prefix: `process_*` by the convention).
    process: Registry,
    blocked_reads: Gauge,
    nvme_controllers: GaugeVec,
    nvme_outages: GaugeVec,
    outages: GaugeVec,
    not_ready: GaugeVec,
    orphaned_dirs: GaugeVec,
    pin_risks: GaugeVec,
    pin_copies: GaugeVec,
    pin_unknown: GaugeVec,
}

/// NVMe controller states (the `state` label); anything else is `other`.
const NVME_STATES: [&str; 8] =
    ["new", "live", "resetting", "connecting", "deleting", "deleting_noio", "dead", "other"];
/// NVMe transports (the `transport` label); anything else is `other`.
const NVME_TRANSPORTS: [&str; 6] = ["tcp", "rdma", "fc", "loop", "pcie", "other"];

/// A gauge per value of `labels`.
fn gauges(name: &str, help: &str, labels: &[&str]) -> Result<GaugeVec, MetricsError> {
    Ok(GaugeVec::new(Opts::new(name, help), labels)?)
}

/// The per-device gauges: `device_info`, `device_verdict`, `device_unresponsive`, and
/// `unresponsive_devices` by kind.
fn device_gauges() -> Result<[GaugeVec; 4], MetricsError> {
    let device_info = gauges("device_info", "Always 1: an rbd, nbd, multipath, stack layer (lvm_lv, crypt, partition_map) or SCSI device in the latest scan, with what it is a view of (pool is the pool alone, rados_namespace the image's namespace, \"\" for the default).", &["device", "kind", "pool", "rados_namespace", "image", "client_addr", "wwid", "pv"])?;
    let device_verdict = gauges("device_verdict", "The verdict of each device device_info describes, as a state set: one series per verdict, 1 for the device's current verdict and 0 for the others.", &["device", "verdict"])?;
    let device_unresponsive = gauges("device_unresponsive", "Always 1: a device in the latest scan that does not answer (I/O in flight and none completing for at least the unresponsive threshold); one series per such device.", &["device", "kind"])?;
    let unresponsive_devices = gauges("unresponsive_devices", "Devices in the latest scan that do not answer (I/O in flight and none completing for at least the unresponsive threshold), by kind.", &["kind"])?;
    Ok([device_info, device_verdict, device_unresponsive, unresponsive_devices])
}

/// The transport gauges: NVMe controllers by transport and state, NVMe targets down, and
/// transport outages.
fn transport_gauges() -> Result<[GaugeVec; 3], MetricsError> {
    let nvme_controllers = gauges(
        "nvme_controllers",
        "NVMe controllers serving the namespaces of the latest scan, by transport and state.",
        &["transport", "state"],
    )?;
    let nvme_outages = gauges("nvme_outage_targets", "NVMe targets (an array address or a subsystem NQN) to which every controller of this node is down at once: an outage, reported and never cleaned.", &["transport"])?;
    let outages = gauges("transport_outages", "Targets or portals every session (controller) to which is down at once in the latest scan: an array or network outage; the devices behind it have verdict outage and are never cleaned.", &["transport", "scope"])?;
    Ok([nvme_controllers, nvme_outages, outages])
}

/// The node's gauges: health checks failing, orphaned pod volume directories, and pin risks.
fn node_gauges() -> Result<[GaugeVec; 5], MetricsError> {
    let not_ready = gauges("not_ready", "1 while this health check fails (scan: the latest scan failed; journal: the journal cannot be written; kubernetes: release or clean mode and the API's view does not vouch), else 0; the agent service's health is NOT_SERVING while any is 1.", &["check"])?;
    let orphaned_dirs = gauges("orphaned_volume_dirs", "Pod volume directories below the kubelet directory whose pod is not proven to be on this node, in the latest full scan, by verdict (unknown: a proof is missing; mounted: the pod is gone but something is mounted on it in some namespace; kept: orphaned but not empty; pending: orphaned and empty, within the grace period; removable: clean mode removes it with rmdir).", &["verdict"])?;
    let pin_risks = gauges("pin_risks", "Mount namespaces of a pod (pod_namespace and pod: its namespace and name, or its UID when the API does not name it; \"\" for processes in no pod) that hold a private copy (neither shared nor slave) of a live host mount under the kubelet's or a runtime's directory, or of the host root: when the host unmounts such a mount, the copy keeps its device busy.", &["pod_namespace", "pod"])?;
    let pin_copies = gauges("pin_risk_copies", "Mounts under the kubelet's and runtimes' directories (volumes) that a pod's pin-risk namespaces hold private copies of now.", &["pod_namespace", "pod"])?;
    let pin_unknown = gauges("pin_risks_unknown", "Mount namespaces that could not be judged for pin risks (scope namespace), or 1 when the host's own mount table could not be read and none could (scope host).", &["scope"])?;
    Ok([not_ready, orphaned_dirs, pin_risks, pin_copies, pin_unknown])
}

/// A metric could not be defined (a bug: names and labels are constants).
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    /// The agent's metrics, registered, with every series of a closed label set at zero.
    pub fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new_custom(Some("blockjanitor".into()), None)?;
        let devices = gauges(
            "devices",
            "Block devices in the latest scan, by kind and verdict.",
            &["kind", "verdict"],
        )?;
        let holders =
            gauges("holders", "Holders of block devices in the latest scan, by holder kind.", &["kind"])?;
        let scan_duration = Histogram::with_opts(
            HistogramOpts::new("scan_duration_seconds", "Wall time of a full scan of the host.")
                .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
        )?;
        let scans = IntCounterVec::new(
            Opts::new("scans_total", "Scans completed, by what triggered them."),
            &["trigger"],
        )?;
        let scan_failures = IntCounterVec::new(
            Opts::new("scan_failures_total", "Scans that failed or overran their deadline."),
            &["trigger"],
        )?;
        let actions = IntCounterVec::new(
            Opts::new("actions_total", "Destructive steps carried out, by action and result."),
            &["action", "result"],
        )?;
        let last_scan = Gauge::new(
            "last_scan_timestamp_seconds",
            "When the latest scan finished, in seconds since the epoch.",
        )?;
        let build_info = gauges("build_info", "Always 1; the agent's version as a label.", &["version"])?;
        build_info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1.0);
        let [device_info, device_verdict, device_unresponsive, unresponsive_devices] = device_gauges()?;
        let blocked_reads = Gauge::new(
            "blocked_reads",
            "Kernel reads of the scan (a loop device's status, a stuck process's maps) still blocked on their helper thread after their deadline.",
        )?;
        let [nvme_controllers, nvme_outages, outages] = transport_gauges()?;
        let [not_ready, orphaned_dirs, pin_risks, pin_copies, pin_unknown] = node_gauges()?;
        let m = Self {
            registry,
            devices,
            holders,
            scan_duration,
            scans,
            scan_failures,
            actions,
            last_scan,
            device_info,
            device_verdict,
            device_unresponsive,
            unresponsive_devices,
            process: blockjanitor_rpc::metrics_http::process_registry()?,
            blocked_reads,
            nvme_controllers,
            nvme_outages,
            outages,
            not_ready,
            orphaned_dirs,
            pin_risks,
            pin_copies,
            pin_unknown,
        };
        m.register(build_info)?;
        m.export_at_zero();
        Ok(m)
    }

    /// Registers every metric of the agent's own (not the process collector's), `build_info`
    /// among them.
    fn register(&self, build_info: GaugeVec) -> Result<(), MetricsError> {
        for c in [
            Box::new(self.orphaned_dirs.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(self.pin_risks.clone()),
            Box::new(self.pin_copies.clone()),
            Box::new(self.pin_unknown.clone()),
            Box::new(self.not_ready.clone()),
            Box::new(self.nvme_controllers.clone()),
            Box::new(self.nvme_outages.clone()),
            Box::new(self.outages.clone()),
            Box::new(self.devices.clone()),
            Box::new(self.holders.clone()),
            Box::new(self.scan_duration.clone()),
            Box::new(self.scans.clone()),
            Box::new(self.scan_failures.clone()),
            Box::new(self.actions.clone()),
            Box::new(self.last_scan.clone()),
            Box::new(build_info),
            Box::new(self.device_info.clone()),
            Box::new(self.device_verdict.clone()),
            Box::new(self.device_unresponsive.clone()),
            Box::new(self.unresponsive_devices.clone()),
            Box::new(self.blocked_reads.clone()),
        ] {
            self.registry.register(c)?;
        }
        Ok(())
    }

    /// Exports every series of a closed label set from the start, at zero.
    fn export_at_zero(&self) {
        for check in HEALTH_CHECKS {
            self.not_ready.with_label_values(&[check]).set(0.0);
        }
        for v in crate::judge::orphans::DirVerdict::ALL.into_iter().filter(|v| v.as_str() != "in_use") {
            self.orphaned_dirs.with_label_values(&[v.as_str()]).set(0.0);
        }
        for scope in ["namespace", "host"] {
            self.pin_unknown.with_label_values(&[scope]).set(0.0);
        }
        let (scans, scan_failures, outages, actions) =
            (&self.scans, &self.scan_failures, &self.outages, &self.actions);
        for t in TRIGGERS {
            scans.with_label_values(&[t]);
            scan_failures.with_label_values(&[t]);
        }
        for t in OUTAGE_TRANSPORTS {
            for sc in crate::graph::outage::Scope::ALL {
                outages.with_label_values(&[t, sc.as_str()]);
            }
        }
        use crate::act::journal::StepResult;
        let names = crate::plan::ActionKind::ALL.map(crate::plan::ActionKind::as_str);
        for a in names.into_iter().chain([crate::plan::pod_volume::DirStep::ACTION]) {
            for r in StepResult::ALL.into_iter().filter(|r| *r != StepResult::Skipped) {
                actions.with_label_values(&[a, r.as_str()]);
            }
        }
    }

    /// `orphaned_volume_dirs{verdict}` from the latest full scan's report (every verdict but
    /// `in_use`, whose directories are not listed; all at 0 when there are none).
    fn observe_pod_volumes(&self, view: &View) {
        use crate::judge::orphans::DirVerdict;
        for v in DirVerdict::ALL.into_iter().filter(|v| *v != DirVerdict::InUse) {
            self.orphaned_dirs.with_label_values(&[v.as_str()]).set(view.pod_volumes.count(v) as f64);
        }
    }

    /// `pin_risks` and `pin_risk_copies` per pod (at most [`PIN_SERIES_MAX`] pods, the rest as
    /// `(other)`), and the namespaces that could not be judged.
    fn observe_pins(&self, report: &crate::graph::pin_risks::PinReport) {
        use std::collections::BTreeMap;
        self.pin_risks.reset();
        self.pin_copies.reset();
        let mut per_pod: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
        for r in report.known() {
            let key = match (&r.pod, &r.pod_uid) {
                (Some(p), _) => (p.namespace.clone(), p.name.clone()),
                (None, Some(uid)) => (String::new(), uid.clone()),
                (None, None) => (String::new(), String::new()),
            };
            let key = if per_pod.len() >= PIN_SERIES_MAX && !per_pod.contains_key(&key) {
                (String::new(), "(other)".to_owned())
            } else {
                key
            };
            let e = per_pod.entry(key).or_default();
            e.0 += 1;
            e.1 += r.copies.len();
        }
        for ((ns, pod), (n, copies)) in per_pod {
            self.pin_risks.with_label_values(&[&ns, &pod]).set(n as f64);
            self.pin_copies.with_label_values(&[&ns, &pod]).set(copies as f64);
        }
        let unknown = report.risks.iter().filter(|r| r.unknown.is_some()).count();
        self.pin_unknown.with_label_values(&["namespace"]).set(unknown as f64);
        self.pin_unknown.with_label_values(&["host"]).set(f64::from(u8::from(report.unknown.is_some())));
    }

    /// Controllers by transport and state, and targets in outage, from the namespaces' views
    /// (each controller and each target counted once).
    fn observe_nvme(&self, view: &View) {
        use std::collections::BTreeMap;
        let label = |v: &str, set: &[&'static str]| -> &'static str {
            let v = v.replace(' ', "_").replace(['(', ')'], "");
            set.iter().copied().find(|s| *s == v).unwrap_or("other")
        };
        let mut ctrls: BTreeMap<&str, (&'static str, &'static str)> = BTreeMap::new();
        let mut outages: BTreeMap<&str, &'static str> = BTreeMap::new();
        for v in view.devices.iter().filter_map(|d| d.entry.nvme.as_ref()) {
            for c in &v.controllers {
                let t = label(&c.transport, &NVME_TRANSPORTS);
                ctrls.insert(c.name.as_str(), (t, label(c.state.as_str(), &NVME_STATES)));
            }
            if let (Some(o), Some(c)) = (&v.outage, v.controllers.first()) {
                outages.insert(o.target.as_str(), label(&c.transport, &NVME_TRANSPORTS));
            }
        }
        for t in NVME_TRANSPORTS {
            for s in NVME_STATES {
                let n = ctrls.values().filter(|(ct, cs)| *ct == t && *cs == s).count();
                self.nvme_controllers.with_label_values(&[t, s]).set(n as f64);
            }
            let n = outages.values().filter(|ot| **ot == t).count();
            self.nvme_outages.with_label_values(&[t]).set(n as f64);
        }
        // The same groups in the transport-agnostic series: an array address is a portal, a
        // subsystem NQN a target.
        let portals = outages.keys().filter(|k| k.starts_with("traddr=")).count();
        self.outages.with_label_values(&["nvme", "portal"]).set(portals as f64);
        self.outages.with_label_values(&["nvme", "target"]).set((outages.len() - portals) as f64);
    }

    /// Records a finished scan and the state it found.
    pub fn observe_scan(&self, trigger: &'static str, took: Duration, view: &View) {
        self.device_info.reset();
        self.device_verdict.reset();
        for d in &view.devices {
            let e = &d.entry;
            let multipath = e.device.dm.as_ref().is_some_and(|dm| dm.uuid.starts_with("mpath-"));
            let layer = crate::graph::stack::layer_of(&e.device).is_some();
            if !(e.rbd.is_some()
                || e.device.kind == DeviceKind::Nbd
                || multipath
                || layer
                || e.scsi.is_some())
            {
                continue;
            }
            // The pool alone, and the rados namespace as its own label ("" for the default).
            let (pool, namespace, image, client_addr) = e
                .rbd
                .as_ref()
                .map(|r| (r.pool.as_str(), r.pool_ns.as_str(), r.image.as_str(), r.client_addr.as_str()))
                .unwrap_or_default();
            let wwid = e.wwid();
            let pv = e.kubernetes.as_ref().map(|k| k.pv_names.join(",")).unwrap_or_default();
            self.device_info
                .with_label_values(&[
                    e.device.name.as_str(),
                    crate::graph::stack::kind_label(&e.device),
                    pool,
                    namespace,
                    image,
                    client_addr,
                    wwid.as_str(),
                    pv.as_str(),
                ])
                .set(1.0);
            for v in VERDICTS {
                let current = if d.judgement.verdict == v { 1.0 } else { 0.0 };
                self.device_verdict.with_label_values(&[e.device.name.as_str(), v.as_str()]).set(current);
            }
        }
        self.device_unresponsive.reset();
        for k in Self::kind_labels() {
            self.unresponsive_devices.with_label_values(&[k]).set(0.0);
        }
        for d in &view.devices {
            if d.unresponsive.is_some() {
                let dev = &d.entry.device;
                let kind = crate::graph::stack::kind_label(dev);
                self.device_unresponsive.with_label_values(&[dev.name.as_str(), kind]).set(1.0);
                self.unresponsive_devices.with_label_values(&[kind]).inc();
            }
        }
        self.blocked_reads.set(crate::host::bounded::blocked_now() as f64);
        self.observe_nvme(view);
        self.observe_pod_volumes(view);
        self.observe_pins(&view.pin_risks);
        let mut groups: Vec<&crate::graph::outage::Outage> =
            view.devices.iter().filter_map(|d| d.entry.scsi.as_ref()?.outage.as_ref()).collect();
        groups.sort_by(|a, b| (a.scope, &a.key).cmp(&(b.scope, &b.key)));
        groups.dedup_by(|a, b| a.scope == b.scope && a.key == b.key);
        for (scope, n) in
            crate::graph::outage::count_by_scope(&groups.into_iter().cloned().collect::<Vec<_>>())
        {
            self.outages.with_label_values(&["iscsi", scope.as_str()]).set(n as f64);
        }
        self.scans.with_label_values(&[trigger]).inc();
        self.scan_duration.observe(took.as_secs_f64());
        for k in Self::kind_labels() {
            for v in VERDICTS {
                let n = view
                    .devices
                    .iter()
                    .filter(|d| {
                        crate::graph::stack::kind_label(&d.entry.device) == k && d.judgement.verdict == v
                    })
                    .count();
                self.devices.with_label_values(&[k, v.as_str()]).set(n as f64);
            }
        }
        // One pass over every holder (thousands of a busy node's image disk), not one per kind.
        let mut per_kind = [0usize; HolderKind::ALL.len()];
        for h in view.devices.iter().flat_map(|d| &d.entry.holders) {
            if let Some(i) = HolderKind::ALL.iter().position(|k| *k == h.kind) {
                per_kind[i] += 1;
            }
        }
        for (hk, n) in HolderKind::ALL.iter().zip(per_kind) {
            self.holders.with_label_values(&[hk.as_str()]).set(n as f64);
        }
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        self.last_scan.set(now);
    }

    /// Every value of the `kind` label: the device kinds, and stack layers (LVs, crypt mappings,
    /// partition maps) under their own kind, not `dm`.
    fn kind_labels() -> impl Iterator<Item = &'static str> {
        let kinds = DeviceKind::ALL.iter().map(|k| k.as_str());
        kinds.chain(crate::graph::stack::LayerKind::ALL.iter().map(|k| k.as_str()))
    }

    /// Sets `not_ready{check}` from the health checks.
    pub fn observe_health(&self, health: &super::health::Health) {
        let failing: Vec<&str> = health.failing().map(|(check, _)| check).collect();
        for check in HEALTH_CHECKS {
            self.not_ready.with_label_values(&[check]).set(f64::from(u8::from(failing.contains(&check))));
        }
    }

    pub fn scan_failed(&self, trigger: &'static str) {
        self.scan_failures.with_label_values(&[trigger]).inc();
    }

    /// Counts one destructive step (`result`: done, already_absent, deferred, failed).
    pub fn action(&self, action: &'static str, result: crate::act::journal::StepResult) {
        self.actions.with_label_values(&[action, result.as_str()]).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::nvme::CtrlState;
    use crate::engine::view::DeviceView;
    use crate::graph::identity::Identity;
    use crate::graph::nvme::test_support::{ctrl, entries};
    use crate::judge::Judgement;

    /// NVMe controllers by transport and state, and outages by transport: closed label sets.
    #[test]
    fn nvme_controllers_and_outages() {
        let m = Metrics::new().expect("metrics");
        let mut view = View::empty();
        let heads = entries(
            &["nvme0n1"],
            vec![ctrl("nvme0", "nqn.a", "4420", CtrlState::Connecting, true)],
            vec![ctrl("nvme1", "nqn.c", "4421", CtrlState::Connecting, true)],
        );
        for e in heads {
            view.devices.push(std::sync::Arc::new(DeviceView {
                identity: Identity::of(&e),
                judgement: Judgement {
                    verdict: Verdict::Unknown,
                    reasons: Vec::new(),
                    summary: String::new(),
                },
                entry: e,
                unresponsive: None,
                last_seen_scan: 1,
                last_seen: None,
                api_word: 0,
            }));
        }
        m.observe_scan("start", Duration::from_millis(5), &view);
        let text = m.render();
        assert!(
            text.contains("blockjanitor_nvme_controllers{state=\"connecting\",transport=\"tcp\"} 1"),
            "{text}"
        );
        assert!(text.contains("blockjanitor_nvme_controllers{state=\"live\",transport=\"tcp\"} 0"), "{text}");
        assert!(text.contains("blockjanitor_nvme_outage_targets{transport=\"tcp\"} 1"), "{text}");
        assert!(
            text.contains("blockjanitor_transport_outages{scope=\"portal\",transport=\"nvme\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("blockjanitor_actions_total{action=\"nvme_delete_controller\",result=\"done\"} 0"),
            "{text}"
        );
    }

    /// One series per pod with a pin risk, by its namespace and name (its UID without the API,
    /// "" for no pod), at most PIN_SERIES_MAX pods and the rest as "(other)"; reset each scan.
    #[test]
    fn pin_risks_per_pod_with_a_bounded_number_of_series() {
        use crate::graph::pin_risks::{PinReport, PinRisk, PodRef};
        let risk = |i: usize, pod: Option<PodRef>, uid: Option<String>| PinRisk {
            mount_namespace: crate::model::MountNsId(4026532000 + i as u64),
            pids: vec![],
            pid_count: 1,
            comm: None,
            pod_uid: uid,
            container_id: None,
            pod,
            container: None,
            host_root_copy: Some("/host".into()),
            copies: vec![],
            fix: String::new(),
            unknown: None,
        };
        let named = |i: usize| {
            Some(PodRef { namespace: "mon".into(), name: format!("ne-{i}"), uid: format!("u{i}") })
        };
        let mut risks: Vec<PinRisk> = (0..PIN_SERIES_MAX + 5).map(|i| risk(i, named(i), None)).collect();
        risks.push(risk(9000, None, Some("0a5e".into())));
        risks.push(risk(9001, None, None));
        let m = Metrics::new().expect("metrics");
        let mut view = View::empty();
        view.pin_risks = std::sync::Arc::new(PinReport { checked: true, risks, unknown: None });
        m.observe_scan("timer", Duration::from_millis(1), &view);
        let t = m.render();
        let series = t.lines().filter(|l| l.starts_with("blockjanitor_pin_risks{")).count();
        assert_eq!(series, PIN_SERIES_MAX + 1, "{t}");
        assert!(t.contains("blockjanitor_pin_risks{pod=\"ne-0\",pod_namespace=\"mon\"} 1"), "{t}");
        assert!(t.contains("blockjanitor_pin_risks{pod=\"(other)\",pod_namespace=\"\"} 7"), "{t}");
        view.pin_risks = std::sync::Arc::default();
        m.observe_scan("timer", Duration::from_millis(1), &view);
        assert!(!m.render().contains("blockjanitor_pin_risks{"), "reset when gone");
    }

    use crate::engine::world::LinuxWorld;
    use crate::engine::{Engine, Settings};
    use crate::graph::scan::Target;
    use crate::host::HostRoot;
    use crate::judge::grace::Clocks;
    use crate::snapshot::ScanOptions;

    const ISCSI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/iscsi");

    #[test]
    fn transport_outages_count_each_group_once_with_bounded_labels() {
        let m = Metrics::new().expect("metrics");
        let zero = m.render();
        for scope in ["target", "portal"] {
            let series = format!("blockjanitor_transport_outages{{scope=\"{scope}\",transport=\"iscsi\"}} 0");
            assert!(zero.contains(&series), "{series} missing from\n{zero}");
        }
        assert!(zero.contains("blockjanitor_actions_total{action=\"iscsi_logout\",result=\"done\"} 0"));
        let world = LinuxWorld::new(HostRoot::new(ISCSI), ScanOptions::default(), Duration::from_secs(5));
        let engine = Engine::new(world, Settings::default());
        let judged = engine.judge(engine.scan(Target::All).expect("scan"), &mut Clocks::new(None));
        let view = View::of(judged, 1);
        m.observe_scan("start", Duration::from_millis(1), &view);
        let t = m.render();
        // session2 is the only session to its target and to its portal: one group of each.
        assert!(t.contains("blockjanitor_transport_outages{scope=\"portal\",transport=\"iscsi\"} 1"), "{t}");
        assert!(t.contains("blockjanitor_transport_outages{scope=\"target\",transport=\"iscsi\"} 0"), "{t}");
        assert!(t.contains("blockjanitor_devices{kind=\"disk\",verdict=\"outage\"} 1"), "{t}");
    }
}
