//! The Kubernetes side of the agent, all optional: the agent scans and cleans with no API at all.
//!
//! - [`connect`](connect::connect) builds a client from an explicit URL, a kubeconfig file or the
//!   pod's service account, in that order of precedence.
//! - [`spawn_watch`](cache::spawn_watch) keeps a [`ClusterView`] of this node's pods, its
//!   VolumeAttachments and every PersistentVolume current with watches, relisting after a backoff
//!   when a watch breaks, and looks up this node's Node periodically.
//!   [`ClusterView::vouch`] says whether the view may be taken as evidence now: not while a watch
//!   has not relisted since it broke, any one watch (events or bookmarks) or the Node lookup has
//!   not heard from the API server within the silence bound (90 s by default), or no Node has
//!   this node's name.
//! - [`Reporter`](report::Reporter) posts de-duplicated Events on the Node and keeps the Node's
//!   `StaleBlockDevices` condition, as node-problem-detector does.
//!
//! The API needs (ClusterRole): `list`/`watch` on pods, `volumeattachments.storage.k8s.io` and
//! persistentvolumes; `get` on nodes (without it the view never vouches); `create` on events;
//! `get`/`patch` on `nodes/status`.

pub mod cache;
pub mod cluster;
pub mod connect;
pub mod report;

use std::path::PathBuf;
use std::time::Duration;

pub use cache::{spawn_watch, WatchOptions};
pub use cluster::{
    ClusterView, CsiVolume, PodInfo, PvInfo, RbdImage, VaInfo, WatchHealth, DEFAULT_SILENCE_BOUND,
};
pub use connect::{connect, KubeConfig};
pub use report::{Delivery, EventReason, Reporter};

/// What failed while reaching or talking to the Kubernetes API.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The node name is needed to select this node's pods and to name the Node object.
    #[error("no node name for the Kubernetes API client (set it from the downward API: spec.nodeName)")]
    NoNodeName,
    /// The explicit API URL does not parse.
    #[error("invalid Kubernetes API URL '{url}': {source}")]
    Url { url: String, source: http::uri::InvalidUri },
    /// The kubeconfig file cannot be read or does not describe a usable cluster.
    #[error("kubeconfig {}: {source}", path.display())]
    Kubeconfig { path: PathBuf, source: ::kube::config::KubeconfigError },
    /// Neither a URL nor a kubeconfig was given, and this is not a pod with a service account.
    #[error(
        "no Kubernetes API configured: no URL, no kubeconfig, and no in-cluster service account ({source})"
    )]
    NotConfigured { source: ::kube::config::InClusterError },
    /// The HTTP client for the API cannot be built (TLS, proxy or auth settings).
    #[error("cannot build a Kubernetes client for {url}: {source}")]
    Client { url: String, source: ::kube::Error },
    /// An API request failed; `action` says which (verb, object, node).
    #[error("{action}: {source}")]
    Api { action: String, source: ::kube::Error },
    /// An API request got no answer in time.
    #[error("{action}: no answer from the Kubernetes API within {timeout:?}")]
    TimedOut { action: String, timeout: Duration },
}
