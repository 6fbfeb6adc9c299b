//! The kubectl-like flags of `fleet` (and of the kubectl plugin): which kubeconfig, context and
//! namespace reach the console through the Kubernetes API, and which Secret holds the client
//! certificate.

use std::path::PathBuf;

use clap::Args;

/// `--kubeconfig`, `--context`, `-n`, `--tls-secret`.
#[derive(Args, Debug, Default, Clone)]
pub(crate) struct KubeArgs {
    /// fleet: the kubeconfig file [default: $KUBECONFIG, else ~/.kube/config, as kubectl].
    #[arg(long, global = true, help_heading = "Kubernetes (fleet)", value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// fleet: the kubeconfig context [default: its current context].
    #[arg(long, global = true, help_heading = "Kubernetes (fleet)", value_name = "NAME")]
    pub(crate) context: Option<String>,
    /// fleet: the console's namespace [default: blockjanitor, the shipped manifests'; the
    /// context's namespace is not used].
    #[arg(long, short = 'n', global = true, help_heading = "Kubernetes (fleet)", value_name = "NAMESPACE")]
    pub(crate) namespace: Option<String>,
    /// fleet: the Secret in the console's namespace holding the client certificate (tls.crt,
    /// tls.key, ca.crt), read with the kubeconfig's credentials [default:
    /// blockjanitor-viewer-tls; blockjanitor-operator-tls for apply].
    #[arg(long, global = true, help_heading = "Kubernetes (fleet)", value_name = "SECRET")]
    pub(crate) tls_secret: Option<String>,
}

impl KubeArgs {
    /// Whether any of them was given.
    pub(crate) fn any(&self) -> bool {
        self.kubeconfig.is_some()
            || self.context.is_some()
            || self.namespace.is_some()
            || self.tls_secret.is_some()
    }
}
