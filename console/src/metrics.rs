//! The console's Prometheus series (prefix `blockjanitor_console_`): agents up and down, the
//! index's size, query latency by method, and the fleet-wide sweep at each scrape (findings per
//! kind, whether it was complete, nodes it could not ask), and the process's own (`process_*`:
//! CPU, memory, file descriptors); served as `/metrics` over plain HTTP/1 on its own address.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::cluster::Cluster;
use crate::index::Index;

/// Every method of the Fleet service (the `method` label).
pub const METHODS: [&str; 8] =
    ["ListNodes", "ListDevices", "Where", "WhoWatches", "MultiAttach", "Sweep", "Plan", "Apply"];

/// The console's metrics.
pub struct Metrics {
    registry: Registry,
    /// The process collector's registry (no prefix: `process_*` by the convention).
    process: Registry,
    agents: GaugeVec,
    index_size: GaugeVec,
    latency: HistogramVec,
    findings: GaugeVec,
    sweep_complete: Gauge,
    sweep_missing: Gauge,
    index: Index,
    cluster: Option<Cluster>,
}

/// A metric could not be defined (a bug: names and labels are constants).
#[derive(Debug, thiserror::Error)]
#[error("cannot register metrics: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

impl Metrics {
    pub fn new(index: Index) -> Result<Self, MetricsError> {
        let registry = Registry::new_custom(Some("blockjanitor_console".into()), None)?;
        let agents = GaugeVec::new(
            Opts::new("agents", "Agents known to the console, by state (up, down)."),
            &["state"],
        )?;
        let index_size = GaugeVec::new(
            Opts::new("index_entries", "What the fleet index holds, by what (nodes, devices)."),
            &["what"],
        )?;
        let latency = HistogramVec::new(
            HistogramOpts::new("query_duration_seconds", "Time to answer a Fleet call, by method.").buckets(
                vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0],
            ),
            &["method"],
        )?;
        registry.register(Box::new(agents.clone()))?;
        registry.register(Box::new(index_size.clone()))?;
        let findings = GaugeVec::new(
            Opts::new(
                "sweep_findings",
                "Findings of the fleet-wide sweep at this scrape, by kind (multi_node, attached_not_in_use, \
                 dead_node_watcher); read with sweep_complete: 0 findings of an incomplete sweep is not clean.",
            ),
            &["kind"],
        )?;
        let sweep_complete = Gauge::new(
            "sweep_complete",
            "1 when the sweep at this scrape heard from every node (and a synced Kubernetes view), 0 when it is incomplete.",
        )?;
        let sweep_missing = Gauge::new(
            "sweep_missing_nodes",
            "Nodes the sweep at this scrape could not ask (down, not synced, no agent).",
        )?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(findings.clone()))?;
        registry.register(Box::new(sweep_complete.clone()))?;
        registry.register(Box::new(sweep_missing.clone()))?;
        for m in METHODS {
            latency.with_label_values(&[m]);
        }
        Ok(Self {
            registry,
            process: blockjanitor_rpc::metrics_http::process_registry()?,
            agents,
            index_size,
            latency,
            findings,
            sweep_complete,
            sweep_missing,
            index,
            cluster: None,
        })
    }

    /// Sweeps with the cluster's view too (VolumeAttachments, Nodes without an agent).
    pub fn with_cluster(mut self, cluster: Option<Cluster>) -> Self {
        self.cluster = cluster;
        self
    }

    /// Records how long a call took.
    pub fn observe(&self, method: &'static str, took: Duration) {
        self.latency.with_label_values(&[method]).observe(took.as_secs_f64());
    }

    /// The text exposition format, with the gauges read from the index now.
    pub fn render(&self) -> String {
        {
            let ix = self.index.read();
            let up = ix.nodes.values().filter(|n| n.missing_reason().is_none()).count();
            self.agents.with_label_values(&["up"]).set(up as f64);
            self.agents.with_label_values(&["down"]).set((ix.nodes.len() - up) as f64);
            self.index_size.with_label_values(&["nodes"]).set(ix.nodes.len() as f64);
            self.index_size.with_label_values(&["devices"]).set(ix.device_count() as f64);
            let sweep = crate::sweep::counts(&ix, self.cluster.as_ref());
            for (kind, n) in &sweep.counts {
                self.findings.with_label_values(&[kind]).set(f64::from(*n));
            }
            self.sweep_complete.set(if sweep.complete { 1.0 } else { 0.0 });
            self.sweep_missing.set(sweep.missing_nodes.len() as f64);
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
}

/// Serves `/metrics` until `shutdown` turns true (the agent's server, with the console's figures).
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: watch::Receiver<bool>) {
    blockjanitor_rpc::metrics_http::serve(listener, metrics, shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockjanitor_proto::v1 as pb;

    #[test]
    fn the_sweep_is_counted_per_kind_and_an_unanswering_node_makes_it_incomplete() {
        let index = Index::new();
        let m = Metrics::new(index.clone()).expect("metrics");
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
        let text = m.render();
        assert!(text.contains("blockjanitor_console_sweep_complete 0"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_missing_nodes 1"), "{text}");
        assert!(text.contains("blockjanitor_console_sweep_findings{kind=\"dead_node_watcher\"} 1"), "{text}");
        assert!(
            text.contains("blockjanitor_console_sweep_findings{kind=\"attached_not_in_use\"} 0"),
            "{text}"
        );
    }
}
