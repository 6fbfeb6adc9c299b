//! What reaching the console through the Kubernetes API takes ([`Route`]: kubeconfig, context,
//! namespace, client identity, server name), the shipped manifests' names it defaults to, and
//! why it can fail ([`Error`], one line each).

use std::path::PathBuf;

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

/// The viewer's client certificate Secret (deploy/overlays/tls, Certificate blockjanitor-viewer).
pub const DEFAULT_VIEWER_SECRET: &str = "blockjanitor-viewer-tls";
/// The operator's (Certificate blockjanitor-operator): what `apply` needs.
pub const DEFAULT_OPERATOR_SECRET: &str = "blockjanitor-operator-tls";

/// Where the client certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// A TLS Secret (`tls.crt`, `tls.key`, `ca.crt`) in the console's namespace.
    Secret(String),
    /// PEM files.
    Files { cert: PathBuf, key: PathBuf, ca: PathBuf },
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
