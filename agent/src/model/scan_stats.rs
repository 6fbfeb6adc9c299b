//! What one scan read, in figures: the summary line under a report, the `stats` of `ListDevices`
//! and the benchmark's. Plain data the snapshot fills in and every front shows.

use std::time::Duration;

use serde::Serialize;

/// Counters for the summary line and the benchmark.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScanStats {
    pub processes: usize,
    pub tasks: usize,
    pub kernel_threads: usize,
    pub mount_namespaces: usize,
    /// Mounts seen, over all namespaces.
    pub mounts: usize,
    /// Namespaces checked with `statmount` alone (no mountinfo text needed).
    pub namespaces_via_statmount: usize,
    /// mountinfo text read.
    pub mountinfo_bytes: usize,
    #[serde(serialize_with = "ser_ms")]
    pub duration: Duration,
}

fn ser_ms<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}
