//! Reaching the fleet console the way kubectl reaches a pod: the user's kubeconfig and context
//! ([`config`]), the console's pod found by the shipped manifests' labels ([`find`]), the
//! client identity for the console's mutual TLS from a Secret read with the user's own
//! credentials, or from files ([`identity`]), and gRPC over the API server's `pods/portforward`
//! subresource, one forwarded stream per connection ([`forward`]). Every failure is one
//! [`Error`] line: no kubeconfig or context, no console pod, the API server refusing, the
//! port-forward failing.

use std::path::PathBuf;
use std::time::Duration;

use tonic::transport::Channel;

mod config;
mod find;
mod forward;
mod identity;

pub use identity::{Identity, DEFAULT_OPERATOR_SECRET, DEFAULT_VIEWER_SECRET};

/// The namespace the console is looked for in without `-n`: the shipped manifests'. The
/// context's own namespace is not used: it names where a user's workloads are, not where the
/// console runs (as `kubectl rook-ceph` looks in `rook-ceph` unless told).
pub const DEFAULT_NAMESPACE: &str = "blockjanitor";

/// The labels the shipped manifests give the console's pods (deploy/components/console).
pub const CONSOLE_SELECTOR: &str = "app.kubernetes.io/name=blockjanitor,app.kubernetes.io/component=console";

/// The console's gRPC port when its pod names none `grpc` (the shipped Deployment's).
pub const DEFAULT_PORT: u16 = 9444;

/// The name the console's serving certificate carries in the shipped manifests (its
/// Certificate's common name, whatever the namespace).
pub const DEFAULT_SERVER_NAME: &str = "console.blockjanitor.svc";

/// How to reach the console through the Kubernetes API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The kubeconfig file (`--kubeconfig`); `None`: `$KUBECONFIG` (every file it lists,
    /// merged), else `~/.kube/config`, as kubectl.
    pub kubeconfig: Option<PathBuf>,
    /// The context (`--context`); `None`: the kubeconfig's current context.
    pub context: Option<String>,
    /// The console's namespace (`-n`); `None`: [`DEFAULT_NAMESPACE`].
    pub namespace: Option<String>,
    /// Who the plugin is to the console.
    pub identity: Identity,
    /// The name the console's certificate must carry.
    pub server_name: String,
}

impl Route {
    /// The namespace asked.
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE)
    }
}

/// Why the console cannot be reached through the API, in one line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the kubeconfig: {0} (--kubeconfig FILE or KUBECONFIG; or --console HOST:PORT to reach the console directly)")]
    Kubeconfig(String),
    #[error("no context '{name}' in the kubeconfig (its contexts: {known})")]
    NoContext { name: String, known: String },
    #[error("the kubeconfig names no current context: pass --context (its contexts: {known})")]
    NoCurrentContext { known: String },
    #[error("cannot use context '{context}': {message}")]
    Context { context: String, message: String },
    #[error("forbidden: the API server ({server}) refuses to {what} in namespace '{namespace}' to the kubeconfig's user: {message}")]
    Forbidden { server: String, what: String, namespace: String, message: String },
    #[error(
        "the API server ({server}) refused to {what} in namespace '{namespace}': HTTP {code}: {message}"
    )]
    Api { server: String, what: String, namespace: String, code: u16, message: String },
    #[error("cannot reach the API server ({server}) to {what}: {message}")]
    Unreachable { server: String, what: String, message: String },
    #[error("no console pod in namespace '{namespace}' (pods labelled {CONSOLE_SELECTOR}): is deploy/overlays/console applied there? (-n NAMESPACE to look elsewhere)")]
    NoConsole { namespace: String },
    #[error("no console pod is running and ready in namespace '{namespace}' (found: {found})")]
    NotReady { namespace: String, found: String },
    #[error("no Secret {secret} in namespace '{namespace}' (the client certificate for the console, made by deploy/overlays/tls): --tls-secret NAME, or --cert, --key and --ca")]
    NoSecret { namespace: String, secret: String },
    #[error("Secret {namespace}/{secret} has no {key}: it should be a cert-manager TLS Secret (tls.crt, tls.key, ca.crt)")]
    SecretKey { namespace: String, secret: String, key: &'static str },
    #[error("cannot read {flag} {path}: {message}")]
    File { flag: &'static str, path: String, message: String },
    #[error("the port-forward to pod {namespace}/{pod} port {port} failed: {message}")]
    PortForward { namespace: String, pod: String, port: u16, message: String },
    #[error("cannot connect to the console (pod {namespace}/{pod}, through the API server's port-forward): {message}")]
    Connect { namespace: String, pod: String, message: String },
    #[error("no connection to the console within {seconds}s (through the API server's port-forward)")]
    Timeout { seconds: u64 },
}

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

/// A kube API error as this module's, for `what` in `namespace` on `server`.
pub(crate) fn api_error(server: &str, what: &str, namespace: &str, e: kube::Error) -> Error {
    let (server, what, namespace) = (server.to_owned(), what.to_owned(), namespace.to_owned());
    match e {
        kube::Error::Api(s) if s.code == 403 => {
            Error::Forbidden { server, what, namespace, message: s.message }
        }
        kube::Error::Api(s) => Error::Api { server, what, namespace, code: s.code, message: s.message },
        other => Error::Unreachable { server, what, message: blockjanitor_rpc::client::error_chain(&other) },
    }
}
