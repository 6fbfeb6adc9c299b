//! What failed while reaching or talking to the Kubernetes API.

use std::path::PathBuf;
use std::time::Duration;

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
