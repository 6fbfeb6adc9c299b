//! The user's kubeconfig, read as kubectl reads it: `--kubeconfig FILE`, else every file
//! `$KUBECONFIG` lists (merged), else `~/.kube/config`; `--context`, else its current context.
//! Its credentials (tokens, client certificates, exec plugins) are the user's: the API server's
//! RBAC decides what the plugin may see, and the same credentials (as a bearer token) are who the
//! plugin is to the console.

use kube::config::{KubeConfigOptions, Kubeconfig, KubeconfigError};

use super::route::{Error, Route};

/// What a context gives: a client, its API server's URL (for messages), its configuration (for
/// the user's credentials) and its name.
pub(crate) struct Context {
    pub client: kube::Client,
    pub server: String,
    pub config: kube::Config,
    pub name: String,
}

/// A client for the route's context, and what else the context says.
pub(crate) async fn client(route: &Route) -> Result<Context, Error> {
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
    let client = kube::Client::try_from(config.clone()).map_err(|e| Error::Context {
        context: context.clone(),
        message: blockjanitor_rpc::client::error_chain(&e),
    })?;
    Ok(Context { client, server, config, name: context })
}
