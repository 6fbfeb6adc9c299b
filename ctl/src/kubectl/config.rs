//! The user's kubeconfig, read as kubectl reads it: `--kubeconfig FILE`, else every file
//! `$KUBECONFIG` lists (merged), else `~/.kube/config`; `--context`, else its current context.
//! Its credentials (tokens, client certificates, exec plugins) are the user's: the API server's
//! RBAC decides what the plugin may see.

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use super::route::{Error, Route};

/// A client for the route's context, and its API server's URL (for messages).
pub(crate) async fn client(route: &Route) -> Result<(kube::Client, String), Error> {
    let kubeconfig = match &route.kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(|e| match e {
        KubeconfigError::ReadConfig(io, path) => Error::Kubeconfig(format!("{}: {io}", path.display())),
        e => Error::Kubeconfig(blockjanitor_rpc::client::error_chain(&e)),
    })?;
    let known = || {
        let names: Vec<&str> = kubeconfig.contexts.iter().map(|c| c.name.as_str()).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    let context = match (&route.context, &kubeconfig.current_context) {
        (Some(c), _) => c.clone(),
        (None, Some(c)) if !c.is_empty() => c.clone(),
        (None, _) => return Err(Error::NoCurrentContext { known: known() }),
    };
    if !kubeconfig.contexts.iter().any(|c| c.name == context) {
        return Err(Error::NoContext { name: context, known: known() });
    }
    let options = KubeConfigOptions { context: Some(context.clone()), ..Default::default() };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options).await.map_err(|e| {
        Error::Context { context: context.clone(), message: blockjanitor_rpc::client::error_chain(&e) }
    })?;
    let server = config.cluster_url.to_string();
    let server = server.trim_end_matches('/').to_owned();
    let client = kube::Client::try_from(config)
        .map_err(|e| Error::Context { context, message: blockjanitor_rpc::client::error_chain(&e) })?;
    Ok((client, server))
}
