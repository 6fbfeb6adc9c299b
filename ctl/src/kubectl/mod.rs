//! Reaching the fleet console the way kubectl reaches a pod: the user's kubeconfig and context
//! ([`config`]), the console's pod found by the shipped manifests' labels ([`find`]), the
//! client identity for the console's mutual TLS from a Secret read with the user's own
//! credentials, or from files ([`identity`]), and gRPC over the API server's `pods/portforward`
//! subresource, one forwarded stream per connection ([`forward`]). Every failure is one
//! [`Error`] line ([`route`], with what a route takes): no kubeconfig or context, no console pod,
//! the API server refusing, the port-forward failing.

use std::time::Duration;

use tonic::transport::Channel;

mod config;
mod find;
mod forward;
mod identity;
mod route;

pub use route::{
    Error, Identity, Route, CONSOLE_SELECTOR, DEFAULT_NAMESPACE, DEFAULT_OPERATOR_SECRET, DEFAULT_PORT,
    DEFAULT_SERVER_NAME, DEFAULT_VIEWER_SECRET,
};

/// A gRPC channel to one console pod through the API server's port-forward, as `route` says;
/// the whole attempt is bounded by `timeout`.
pub async fn connect(route: &Route, timeout: Duration) -> Result<Channel, Error> {
    let attempt = async {
        let (client, server) = config::client(route).await?;
        let namespace = route.namespace();
        let (pod, port) = find::console_pod(&client, &server, namespace).await?;
        let identity = identity::load(&client, &server, namespace, &route.identity).await?;
        forward::channel(client, &server, namespace, &pod, port, &identity, &route.server_name, timeout).await
    };
    tokio::time::timeout(timeout, attempt).await.unwrap_or(Err(Error::Timeout { seconds: timeout.as_secs() }))
}
