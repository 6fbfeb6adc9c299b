//! The console's Prometheus series (prefix `blockjanitor_console_`): agents up and down, the
//! index's size, and query latency by method; served as `/metrics` over plain HTTP/1 on its own
//! address.

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Encoder, GaugeVec, HistogramOpts, HistogramVec, Opts, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::index::Index;

/// Every method of the Fleet service (the `method` label).
pub const METHODS: [&str; 7] =
    ["ListNodes", "ListDevices", "Where", "WhoWatches", "MultiAttach", "Plan", "Apply"];

/// The console's metrics.
pub struct Metrics {
    registry: Registry,
    agents: GaugeVec,
    index_size: GaugeVec,
    latency: HistogramVec,
    index: Index,
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
        registry.register(Box::new(latency.clone()))?;
        for m in METHODS {
            latency.with_label_values(&[m]);
        }
        Ok(Self { registry, agents, index_size, latency, index })
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
        }
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            return format!("# error encoding metrics: {e}\n");
        }
        String::from_utf8_lossy(&buf).into_owned()
    }
}

impl blockjanitor::server::metrics_http::Exposition for Metrics {
    fn render(&self) -> String {
        Metrics::render(self)
    }
}

/// Serves `/metrics` until `shutdown` turns true (the agent's server, with the console's figures).
pub async fn serve(listener: TcpListener, metrics: Arc<Metrics>, shutdown: watch::Receiver<bool>) {
    blockjanitor::server::metrics_http::serve(listener, metrics, shutdown).await;
}
