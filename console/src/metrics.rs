//! The console's Prometheus series (prefix `blockjanitor_console_`): agents up and down, the
//! index's size, the Kubernetes objects kept (and their bytes), query latency by method, calls
//! refused for concurrency, the fleet-wide sweep (findings per kind, whether it was complete,
//! nodes it could not ask and those of them with a volume at stake), and the process's own
//! (`process_*`: CPU, memory, file descriptors); served as `/metrics` over plain HTTP/1 on its own
//! address, with `/readyz` beside it (not reviewed: kubelet probes it without a token).
//!
//! A scrape never sweeps and never waits on a fan-out or the index: it reads what the sweep
//! ([`crate::sweeper`]) last published, and it is served on a thread of its own with its own
//! runtime ([`serve_on_own_thread`]), so a runtime busy with 5,000 agents' answers does not delay
//! it.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::ready::Readiness;
use crate::sweeper::Sweeper;

/// Every method of the Fleet service (the `method` label).
pub const METHODS: [&str; 11] = [
    "ListNodes",
    "ListDevices",
    "Where",
    "WhoWatches",
    "MultiAttach",
    "Sweep",
    "Plan",
    "Apply",
    "Explain",
    "WhoWatchesStream",
    "ListPinRisks",
];

/// The console's metrics.
pub struct Metrics {
    registry: Registry,
    /// The process collector's registry (no prefix: `process_*` by the convention).
    process: Registry,
    agents: GaugeVec,
    index_size: GaugeVec,
    kube_objects: GaugeVec,
    kube_bytes: GaugeVec,
    kube_synced: Gauge,
    latency: HistogramVec,
    refused: IntCounterVec,
    findings: GaugeVec,
    sweep_complete: Gauge,
    sweep_missing: Gauge,
    sweep_at_stake: Gauge,
    sweeper: Arc<Sweeper>,
    cluster: Option<Cluster>,
    readiness: Option<Arc<Readiness>>,
}

/// A metric could not be defined (a bug: names and labels are constants).
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

fn gauges(registry: &Registry, name: &str, help: &str, label: &str) -> Result<GaugeVec, MetricsError> {
    let g = GaugeVec::new(Opts::new(name, help), &[label])?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

fn gauge(registry: &Registry, name: &str, help: &str) -> Result<Gauge, MetricsError> {
    let g = Gauge::new(name, help)?;
    registry.register(Box::new(g.clone()))?;
    Ok(g)
}

impl Metrics {
    pub fn new(sweeper: Arc<Sweeper>, cluster: Option<Cluster>) -> Result<Self, MetricsError> {
        let r = Registry::new_custom(Some("blockjanitor_console".into()), None)?;
        let latency = HistogramVec::new(
            HistogramOpts::new("query_duration_seconds", "Time to answer a Fleet call, by method.").buckets(
                vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            ),
            &["method"],
        )?;
        r.register(Box::new(latency.clone()))?;
        let refused = IntCounterVec::new(
            Opts::new(
                "calls_refused_total",
                "Calls refused with RESOURCE_EXHAUSTED because too many of their kind ran at once, by what \
                 (fresh, plan, sweep) and whose limit (caller, total).",
            ),
            &["what", "limit"],
        )?;
        r.register(Box::new(refused.clone()))?;
        for m in METHODS {
            latency.with_label_values(&[m]);
        }
        Ok(Self {
            agents: gauges(&r, "agents", "Agents known to the console, by state (up: answering with a fresh view; not_refreshed: connected, but a read of its list missed its deadline; down).", "state")?,
            index_size: gauges(&r, "index_entries", "What the fleet index holds, by what (nodes, devices, volumes).", "what")?,
            kube_objects: gauges(&r, "kube_objects", "Kubernetes objects the console keeps, by kind.", "kind")?,
            kube_bytes: gauges(&r, "kube_object_bytes", "Bytes of the Kubernetes objects the console keeps (compact JSON and index keys), by kind.", "kind")?,
            kube_synced: gauge(&r, "kube_view_synced", "1 when the console's Kubernetes view (Nodes, PVs, PVCs, VolumeAttachments) is listed in full and its watches have not failed since (1 without the API).")?,
            findings: gauges(&r, "sweep_findings", "Findings of the fleet-wide sweep, kept current as events arrive, by kind (multi_node, attached_not_in_use, dead_node_watcher); read with sweep_complete: 0 findings of an incomplete sweep is not clean.", "kind")?,
            sweep_complete: gauge(&r, "sweep_complete", "1 when the sweep hears from every node (and a synced Kubernetes view), 0 when it is incomplete.")?,
            sweep_missing: gauge(&r, "sweep_missing_nodes", "Nodes the sweep cannot ask (down, not synced, stale, no agent).")?,
            sweep_at_stake: gauge(&r, "sweep_uncovered_nodes_with_volumes", "Of the nodes the sweep cannot ask, those missing for 5 minutes or longer with a volume at stake (attached by a VolumeAttachment, or mapped as last seen): where an incident could hide (an agent restarting in a rollout is back sooner).")?,
            registry: r,
            process: blockjanitor_rpc::metrics_http::process_registry()?,
            latency,
            refused,
            sweeper,
            cluster,
            readiness: None,
        })
    }

    /// What `/readyz` answers with.
    pub fn with_readiness(mut self, r: Arc<Readiness>) -> Self {
        self.readiness = Some(r);
        self
    }

    /// Records how long a call took.
    pub fn observe(&self, method: &'static str, took: Duration) {
        self.latency.with_label_values(&[method]).observe(took.as_secs_f64());
    }

    /// Counts a call refused for concurrency.
    pub fn refused(&self, what: &str, limit: &str) {
        self.refused.with_label_values(&[what, limit]).inc();
    }

    /// The text exposition format, with the gauges from what the sweep last published.
    pub fn render(&self) -> String {
        let p = self.sweeper.published();
        self.agents.with_label_values(&["up"]).set(p.agents_up as f64);
        self.agents.with_label_values(&["not_refreshed"]).set(p.agents_not_refreshed as f64);
        self.agents.with_label_values(&["down"]).set(p.agents_down as f64);
        self.index_size.with_label_values(&["nodes"]).set(p.nodes as f64);
        self.index_size.with_label_values(&["devices"]).set(p.devices as f64);
        self.index_size.with_label_values(&["volumes"]).set(p.volumes as f64);
        for (kind, n) in &p.counts {
            self.findings.with_label_values(&[kind]).set(f64::from(*n));
        }
        self.sweep_complete.set(if p.complete { 1.0 } else { 0.0 });
        self.sweep_missing.set(p.missing as f64);
        self.sweep_at_stake.set(p.uncovered_with_volumes as f64);
        self.kube_synced.set(if p.kube_synced { 1.0 } else { 0.0 });
        if let Some(c) = &self.cluster {
            for (kind, (n, bytes)) in c.sizes() {
                self.kube_objects.with_label_values(&[kind]).set(n as f64);
                self.kube_bytes.with_label_values(&[kind]).set(bytes as f64);
            }
        }
        let mut buf = Vec::new();
        let mut families = self.registry.gather();
        families.extend(self.process.gather());
        if let Err(e) = TextEncoder::new().encode(&families, &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl blockjanitor_rpc::metrics_http::Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }

    fn ready(&self) -> Option<Result<String, String>> {
        self.readiness.as_ref().map(|r| r.check())
    }
}

/// Serves `/metrics` (and `/readyz`) on `listener` until `shutdown` turns true, on a thread of
/// its own with a runtime of its own (see the module docs).
pub fn serve_on_own_thread(
    listener: std::net::TcpListener,
    metrics: Arc<Metrics>,
    gate: Option<Arc<dyn blockjanitor_rpc::metrics_http::Gate>>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "cannot start the metrics runtime: /metrics is not served");
                return;
            }
        };
        rt.block_on(async move {
            match tokio::net::TcpListener::from_std(listener) {
                Ok(l) => blockjanitor_rpc::metrics_http::serve_gated(l, metrics, gate, shutdown).await,
                Err(e) => tracing::error!(error = %e, "cannot serve /metrics"),
            }
        });
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Index;
    use blockjanitor_proto::v1 as pb;

    #[test]
    fn the_sweep_is_counted_per_kind_and_an_unanswering_node_makes_it_incomplete() {
        let index = Index::new();
        let sweeper = Sweeper::new(index.clone(), None);
        let m = Metrics::new(Arc::clone(&sweeper), None).expect("metrics");
        sweeper.flush();
        let text = m.render();
        assert!(text.contains("blockjanitor_console_sweep_complete 1"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_findings{kind=\"multi_node\"} 0"), "{text}");
        {
            let mut w = index.write();
            w.upsert_node("a", "127.0.0.1:1", "static", Some("connection refused"));
            let d = pb::Device {
                name: "rbd0".into(),
                rbd: Some(pb::RbdMapping { pool: "k8s".into(), image: "db".into(), ..Default::default() }),
                ..Default::default()
            };
            w.replace_devices("a", vec![d]);
        }
        let before = m.render();
        assert!(
            before.contains("blockjanitor_console_sweep_complete 1"),
            "a scrape does not sweep: {before}"
        );
        sweeper.flush();
        let text = m.render();
        assert!(text.contains("blockjanitor_console_sweep_complete 0"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_missing_nodes 1"), "{text}");
        assert!(
            text.contains("blockjanitor_console_sweep_uncovered_nodes_with_volumes 0"),
            "missing only now: {text}"
        );
        assert!(text.contains("blockjanitor_console_sweep_findings{kind=\"dead_node_watcher\"} 1"), "{text}");
        assert!(
            text.contains("blockjanitor_console_sweep_findings{kind=\"attached_not_in_use\"} 0"),
            "{text}"
        );
    }
}
