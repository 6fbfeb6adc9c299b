//! The kubectl-like flags of `fleet` (and of the kubectl plugin): which kubeconfig, context and
//! namespace reach the console through the Kubernetes API, and which ConfigMap holds the
//! console's CA.

use std::path::PathBuf;

use clap::Args;

/// `--kubeconfig`, `--context`, `-n`, `--ca-configmap`.
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
    /// fleet: the console's namespace, for `explain` (whose -n, as in kubectl, is the object's)
    /// and any other command (instead of -n) [default for explain: found by the console's labels].
    #[arg(long, global = true, help_heading = "Kubernetes (fleet)", value_name = "NAMESPACE")]
    pub(crate) console_namespace: Option<String>,
    /// fleet: the ConfigMap in the console's namespace holding the console's serving CA (key
    /// ca.crt; the console publishes it), read with the kubeconfig's credentials; --ca FILE gives
    /// it instead [default: blockjanitor-console-ca].
    #[arg(long, global = true, help_heading = "Kubernetes (fleet)", value_name = "CONFIGMAP")]
    pub(crate) ca_configmap: Option<String>,
}

impl KubeArgs {
    /// Whether any of them was given.
    pub(crate) fn any(&self) -> bool {
        self.namespace.is_some() || self.names_the_console()
    }

    /// Whether any flag that reaches the console through the kubeconfig was given (for
    /// `explain`, -n names the object, not the console).
    pub(crate) fn names_the_console(&self) -> bool {
        self.kubeconfig.is_some()
            || self.context.is_some()
            || self.console_namespace.is_some()
            || self.ca_configmap.is_some()
    }
}
