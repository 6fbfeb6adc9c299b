//! When a replica is ready (issue 36): not when its port opens, but once it has listed what the
//! Kubernetes API says (Nodes, PVs, PVCs, VolumeAttachments, the pods Explain needs; the agent
//! pods, with pod discovery), every agent it knows has had its first try (its full device list
//! read, or its connection failed), and the sweep has gone over everything once. Until then
//! `/readyz` answers 503 saying what it waits for, and `grpc.health.v1` says NOT_SERVING for
//! `blockjanitor.v1.Fleet`, so the Service sends it no caller that would get "not synced"
//! answers. Once ready it stays ready: a watch that fails later is said by every answer that needs
//! it (an unready replica would take answers from the agents away too).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::cluster::Cluster;
use crate::index::Index;
use crate::sweeper::Sweeper;

/// What a replica waits for before it is ready.
pub struct Readiness {
    pub index: Index,
    pub cluster: Option<Cluster>,
    /// Pod discovery's first complete list (`None`: a static list of agents).
    pub discovery: Option<Arc<AtomicBool>>,
    pub sweeper: Arc<Sweeper>,
    ready: AtomicBool,
}

impl Readiness {
    pub fn new(
        index: Index,
        cluster: Option<Cluster>,
        discovery: Option<Arc<AtomicBool>>,
        sweeper: Arc<Sweeper>,
    ) -> Self {
        Readiness { index, cluster, discovery, sweeper, ready: AtomicBool::new(false) }
    }

    /// Ready (the line says so), or what it still waits for.
    pub fn check(&self) -> Result<String, String> {
        if self.ready.load(Ordering::Acquire) {
            return Ok("ready".into());
        }
        let mut waits = Vec::new();
        if let Some(c) = &self.cluster {
            if !c.all_synced() {
                let not: Vec<&str> = [
                    ("nodes", c.nodes.synced()),
                    ("persistentvolumes", c.pvs.synced()),
                    ("persistentvolumeclaims", c.pvcs.synced()),
                    ("volumeattachments", c.vas.synced()),
                    ("pods", c.pods.synced()),
                ]
                .into_iter()
                .filter(|(_, s)| !s)
                .map(|(n, _)| n)
                .collect();
                waits.push(format!("the Kubernetes view is not listed yet ({})", not.join(", ")));
            }
        }
        if self.discovery.as_ref().is_some_and(|d| !d.load(Ordering::Acquire)) {
            waits.push("the agent pods are not listed yet".into());
        }
        {
            let ix = self.index.read();
            let untried = ix.nodes.values().filter(|n| !n.tried()).count();
            if untried > 0 {
                waits.push(format!("{untried} of {} agents not tried yet", ix.nodes.len()));
            }
        }
        if !self.sweeper.published().stepped {
            waits.push("the sweep has not gone over the fleet yet".into());
        }
        if waits.is_empty() {
            self.ready.store(true, Ordering::Release);
            let n = self.index.read().nodes.len();
            tracing::info!(agents = n, "ready: synced with the Kubernetes API and every agent tried");
            return Ok("ready".into());
        }
        Err(format!("not ready: {}", waits.join("; ")))
    }
}
