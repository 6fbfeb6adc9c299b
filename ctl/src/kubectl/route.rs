//! What reaching the console through the Kubernetes API takes ([`Route`]: kubeconfig, context,
//! namespace, credentials, server name), the shipped manifests' names it defaults to, and why it
//! can fail ([`Error`], one line each).

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
    /// The console's namespace (`-n`, `--console-namespace`); `None`: [`DEFAULT_NAMESPACE`], or
    /// found by the console's labels when `find_namespace`.
    pub namespace: Option<String>,
    /// Find the console's namespace by its pods' labels (`explain`, whose -n is the object's):
    /// every namespace when the user may list pods cluster-wide, else [`DEFAULT_NAMESPACE`].
    pub find_namespace: bool,
    /// Who the plugin is to the console.
    pub credentials: Credentials,
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
    #[error("no console pod in namespace '{namespace}' (pods labelled {CONSOLE_SELECTOR}): is deploy/overlays/console applied there? (-n NAMESPACE, or --console-namespace for explain, to look elsewhere)")]
    NoConsole { namespace: String },
    #[error("console pods in several namespaces ({namespaces}): name one with --console-namespace")]
    ManyConsoles { namespaces: String },
    #[error("no console pod is running and ready in namespace '{namespace}' (found: {found})")]
    NotReady { namespace: String, found: String },
    #[error("no ConfigMap {name} in namespace '{namespace}' (the console's serving CA, which the console publishes with --publish-serving-ca): is the console running there? --ca FILE gives the CA instead")]
    NoCaConfigMap { namespace: String, name: String },
    #[error("ConfigMap {namespace}/{name} has no PEM certificate under ca.crt: the console publishes its serving CA there (--publish-serving-ca); --ca FILE gives it instead")]
    CaConfigMapKey { namespace: String, name: String },
    #[error("context '{context}' {how}, which the console cannot review: use a token (an OIDC or exec credential plugin that gives one, a token or token file), or --cert, --key and --ca with a client certificate of your own that the console lists")]
    NoToken { context: String, how: String },
    #[error("context '{context}' impersonates '{user}' (as:), which the console does not honour: it reviews the token's own user; use a context without impersonation")]
    Impersonation { context: String, user: String },
    #[error("cannot read {flag} {path}: {message}")]
    File { flag: &'static str, path: String, message: String },
    #[error("the port-forward to pod {namespace}/{pod} port {port} failed: {message}")]
    PortForward { namespace: String, pod: String, port: u16, message: String },
    #[error("cannot connect to the console (pod {namespace}/{pod}, through the API server's port-forward): {message}")]
    Connect { namespace: String, pod: String, message: String },
    #[error("no connection to the console within {seconds}s (through the API server's port-forward)")]
    Timeout { seconds: u64 },
}

/// The ConfigMap (key `ca.crt`) in the console's namespace holding the CA of the console's
/// serving certificate: the console publishes it (`--publish-serving-ca`); anyone the shipped
/// Roles name may read it. A CA certificate is public: no Secret is read.
pub const DEFAULT_CA_CONFIGMAP: &str = "blockjanitor-console-ca";

/// Who the plugin is to the console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// The kubeconfig user's own: their bearer token (a static token, a token file, an exec or
    /// OIDC plugin's output, as kube resolves it), which the console has the API server review;
    /// the console's certificate checked against `ca`.
    Kubeconfig { ca: CaSource },
    /// A client certificate of one's own (PEM files), which the console lists by identity.
    Certificate { cert: PathBuf, key: PathBuf, ca: PathBuf },
}

/// Where the CA of the console's serving certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaSource {
    /// A ConfigMap (key `ca.crt`) in the console's namespace.
    ConfigMap(String),
    /// A PEM file (`--ca`).
    File(PathBuf),
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
