//! Reaching the fleet console the way kubectl reaches a pod: the user's kubeconfig and context
//! ([`config`]), the console's pod found by the shipped manifests' labels ([`find`]), who the
//! plugin is to the console: the user's own Kubernetes credentials as a bearer token, the
//! console's certificate checked against the CA it publishes in a ConfigMap (or files)
//! ([`credentials`]), and gRPC over the API server's `pods/portforward` subresource, one
//! forwarded stream per connection ([`forward`]). Every failure is one [`Error`] line
//! ([`route`], with what a route takes): no kubeconfig or context, no console pod, no token, the
//! API server refusing, the port-forward failing.

use std::time::Duration;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

mod config;
mod credentials;
mod find;
mod forward;
mod route;

pub use route::{
    CaSource, Credentials, Error, Route, CONSOLE_SELECTOR, DEFAULT_CA_CONFIGMAP, DEFAULT_NAMESPACE,
    DEFAULT_PORT, DEFAULT_SERVER_NAME,
};

/// Adds `authorization: Bearer TOKEN` to every call, when there is a token.
#[derive(Clone, Default)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    /// The token as metadata (marked sensitive: never printed by tonic's debug output); `None`
    /// when it cannot travel as a header.
    pub fn new(token: Option<&str>) -> Option<Self> {
        let Some(token) = token else { return Some(Bearer(None)) };
        let mut value = MetadataValue::try_from(format!("Bearer {token}")).ok()?;
        value.set_sensitive(true);
        Some(Bearer(Some(value)))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel to the console that carries the caller's token, when it has one.
pub type ConsoleChannel = InterceptedService<Channel, Bearer>;

/// The namespace the route's kubeconfig context names (kubectl's default for an object's
/// namespace), `default` when it names none.
pub async fn context_namespace(route: &Route) -> Result<String, Error> {
    Ok(config::client(route).await?.config.default_namespace)
}

/// A gRPC channel to one console pod through the API server's port-forward, as `route` says;
/// the whole attempt is bounded by `timeout`.
pub async fn connect(route: &Route, timeout: Duration) -> Result<ConsoleChannel, Error> {
    let attempt = async {
        let ctx = config::client(route).await?;
        let namespace = match (&route.namespace, route.find_namespace) {
            (None, true) => find::console_namespace(&ctx.client, &ctx.server).await?,
            _ => route.namespace().to_owned(),
        };
        let namespace = namespace.as_str();
        let (pod, port) = find::console_pod(&ctx.client, &ctx.server, namespace).await?;
        let tls = credentials::load(&ctx, namespace, &route.credentials).await?;
        let bearer = Bearer::new(tls.token.as_deref()).ok_or_else(|| Error::NoToken {
            context: ctx.name.clone(),
            how: "gives a token that cannot travel as a header".into(),
        })?;
        let channel = forward::channel(
            ctx.client,
            &ctx.server,
            namespace,
            &pod,
            port,
            &tls,
            &route.server_name,
            timeout,
        )
        .await?;
        Ok(InterceptedService::new(channel, bearer))
    };
    tokio::time::timeout(timeout, attempt).await.unwrap_or(Err(Error::Timeout { seconds: timeout.as_secs() }))
}
