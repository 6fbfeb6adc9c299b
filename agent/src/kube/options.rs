//! How the cluster watch runs: its timeouts, backoffs and silence bound.

use std::time::Duration;

use crate::kube::cluster::DEFAULT_SILENCE_BOUND;

/// How often the Node is looked up, how long the API may stay silent, and how watches back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// Between two lookups of this node's Node (each answer is the Node's sign of life).
    /// Default 20 s.
    pub probe_interval: Duration,
    /// The view stops vouching when one watch, or the Node lookup, has not heard from the API
    /// server for longer than this; such a watch is dropped and relisted, and a list or a watch
    /// request not answered within it fails. Default 90 s ([`DEFAULT_SILENCE_BOUND`] says why).
    pub silence_bound: Duration,
    /// The wait before the first relist after a watch breaks. Default 1 s, doubled after every
    /// failed attempt up to [`backoff_max`](Self::backoff_max), and started over once a watch
    /// has held for `backoff_max` after its list; each wait is jittered down by up to half, so
    /// that every node's agent does not relist at the same moment.
    pub backoff_initial: Duration,
    /// The longest wait between two relists. Default 30 s.
    pub backoff_max: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            probe_interval: Duration::from_secs(20),
            silence_bound: DEFAULT_SILENCE_BOUND,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
        }
    }
}

impl WatchOptions {
    /// The defaults, or (`Some(seconds)`) scaled to that silence bound.
    pub fn for_bound(silence_bound_seconds: Option<u64>) -> Self {
        match silence_bound_seconds {
            Some(s) => Self::with_silence_bound(Duration::from_secs(s.max(1))),
            None => Self::default(),
        }
    }

    /// The defaults with another silence bound, the intervals scaled to it: a Node lookup every
    /// quarter of the bound (at most 20 s), relists backing off from an eighth of it (at most
    /// 1 s) up to the bound (at most 30 s).
    pub fn with_silence_bound(bound: Duration) -> Self {
        let d = WatchOptions::default();
        WatchOptions {
            probe_interval: d.probe_interval.min(bound / 4),
            silence_bound: bound,
            backoff_initial: d.backoff_initial.min(bound / 8),
            backoff_max: d.backoff_max.min(bound),
        }
    }
}
