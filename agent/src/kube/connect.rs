//! Building a Kubernetes client: an explicit URL, else a kubeconfig file, else the pod's service
//! account. Nothing here talks to the API; an unreachable server shows up later, in the watcher's
//! `last_error` and in the reporter's errors, and the agent goes on without the API.

use std::path::PathBuf;

use ::kube::config::{Config, KubeConfigOptions, Kubeconfig};
use ::kube::Client;

use super::error::KubeError;

/// Where the API is, and which node this agent runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KubeConfig {
    /// An explicit API URL (`http://127.0.0.1:8001` behind `kubectl proxy`, or a test server):
    /// no credentials, no TLS settings beyond the system roots.
    pub url: Option<String>,
    /// A kubeconfig file; its current context is used.
    pub kubeconfig: Option<PathBuf>,
    /// This node's name (`spec.nodeName`, from the downward API).
    pub node_name: String,
}

/// Builds a client from the first configured source: `url`, then `kubeconfig`, then the in-cluster
/// service account. A source that is configured but broken is an error; the next one is not tried
/// (a wrong `--kubeconfig` silently falling back to another cluster would be worse). No implicit
/// `~/.kube/config` or `$KUBECONFIG`: a node agent talks to the cluster it was told about.
pub async fn connect(cfg: &KubeConfig) -> Result<Client, KubeError> {
    if cfg.node_name.is_empty() {
        return Err(KubeError::NoNodeName);
    }
    let config = if let Some(url) = &cfg.url {
        let uri = url.parse().map_err(|source| KubeError::Url { url: url.clone(), source })?;
        Config::new(uri)
    } else if let Some(path) = &cfg.kubeconfig {
        let kubeconfig = Kubeconfig::read_from(path)
            .map_err(|source| KubeError::Kubeconfig { path: path.clone(), source })?;
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|source| KubeError::Kubeconfig { path: path.clone(), source })?
    } else {
        Config::incluster().map_err(|source| KubeError::NotConfigured { source })?
    };
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|source| KubeError::Client { url: url.clone(), source })?;
    tracing::info!(url = %url, node = %cfg.node_name, "Kubernetes API client configured");
    Ok(client)
}
