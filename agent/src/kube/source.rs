//! Where the Kubernetes API's word comes from, and what its absence means.
//!
//! The API is *off* only when the operator says so (`--no-kubernetes`, or `enabled = false` in
//! the config's `[kubernetes]`): verdicts then rest on the node's own evidence, and every report
//! says so. Otherwise a source is looked for: an explicit URL, a kubeconfig file, or the pod's
//! service account (in a cluster: `KUBERNETES_SERVICE_HOST`, or the token file). A source that
//! is configured but cannot be used (a kubeconfig that points nowhere or cannot be read, a token
//! missing) is never "off": the view says why it cannot vouch, and [`supervise`] tries again with
//! backoff, so a device a PV could own is left alone until the API answers. A daemon that finds
//! no source at all is blind the same way ([`Choice::NoneFound`]); a one-shot run says on its
//! first line that it did not ask the API.

use std::path::Path;
use std::time::Duration;

use ::kube::Client;
use tokio::sync::watch;

use super::cache::watch_into;
use super::cluster::ClusterView;
use super::connect::{connect, KubeConfig};
use super::options::WatchOptions;

/// Where the pod's service account token is mounted.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";

/// What the operator configured, and what this process finds around it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Wanted {
    /// `Some(false)`: the operator turned the API off.
    pub enabled: Option<bool>,
    /// Why it is off, in the operator's words (`--no-kubernetes`, the config key).
    pub off_by: Option<String>,
    pub url: Option<String>,
    pub kubeconfig: Option<std::path::PathBuf>,
    pub node_name: String,
}

/// Where the API's word will come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The operator turned it off (why, as said).
    Off(String),
    /// Nothing configured and no sign of a cluster (why, as a sentence).
    NoneFound(String),
    /// Connect this way.
    Use(KubeConfig),
}

/// The signs of running in a pod: the API service's address in the environment, or the
/// service account's token mounted.
pub fn in_cluster() -> bool {
    std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() || Path::new(SERVICE_ACCOUNT_TOKEN).exists()
}

/// Decides where the API's word comes from (`in_cluster`: [`in_cluster`]).
pub fn choose(w: &Wanted, in_cluster: bool) -> Choice {
    if w.enabled == Some(false) {
        return Choice::Off(w.off_by.clone().unwrap_or_else(|| "turned off in the configuration".to_owned()));
    }
    if w.url.is_none() && w.kubeconfig.is_none() && !in_cluster {
        return Choice::NoneFound(
            "no Kubernetes API configured: no --kube-url, no --kubeconfig, and not running in a cluster (no service-account token)".to_owned(),
        );
    }
    Choice::Use(KubeConfig {
        url: w.url.clone(),
        kubeconfig: w.kubeconfig.clone(),
        node_name: w.node_name.clone(),
    })
}

/// What the API's word is worth now, as every report shows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ApiState {
    /// The API is not asked (why: the operator turned it off, or a one-shot run outside a
    /// cluster): verdicts rest on the node's own evidence.
    Off(String),
    /// The view is current and may be taken as evidence.
    Vouching,
    /// The API is in use but its view cannot be taken as evidence now (why).
    CannotVouch(String),
}

impl ApiState {
    /// The state of `view` at `now` (`None`: not asked, for `off`).
    pub fn of(view: Option<&ClusterView>, off: &str, now: crate::host::clock::BootTime) -> Self {
        match view {
            None => Self::Off(off.to_owned()),
            Some(v) => match v.vouch(now) {
                Ok(()) => Self::Vouching,
                Err(why) => Self::CannotVouch(why),
            },
        }
    }

    /// Why the API's word is missing, if it is (off or cannot vouch), as one line.
    pub fn missing(&self) -> Option<String> {
        match self {
            Self::Vouching => None,
            other => Some(format!("Kubernetes API: {other}")),
        }
    }
}

/// As its words (the JSON has always carried the state as one string).
impl serde::Serialize for ApiState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for ApiState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Off(why) => write!(f, "off ({why}): verdicts rest on this node's evidence alone"),
            Self::Vouching => f.write_str("vouching"),
            Self::CannotVouch(why) => write!(f, "cannot vouch: {why}"),
        }
    }
}

/// A view that cannot vouch because the API cannot be reached at all (`why`).
pub fn unreachable(node_name: &str, why: String, silence_bound: Duration) -> ClusterView {
    ClusterView {
        node_name: node_name.to_owned(),
        silence_bound,
        connect_error: Some(why),
        ..ClusterView::default()
    }
}

/// Connects with `cfg` and keeps the view current in `tx`; while a client cannot be made, the
/// view says why ([`ClusterView::connect_error`]) and connecting is tried again, backing off
/// from `options.backoff_initial` to `options.backoff_max`. `on_client` gets the client once it
/// is made (the reporter posts Events with it). Ends when every receiver is gone.
pub async fn supervise(
    cfg: KubeConfig,
    options: WatchOptions,
    tx: watch::Sender<ClusterView>,
    on_client: impl FnOnce(Client) + Send,
) {
    let mut wait = options.backoff_initial.max(Duration::from_millis(100));
    loop {
        match connect(&cfg).await {
            Ok(client) => {
                on_client(client.clone());
                let task = watch_into(client, &cfg.node_name, options, tx);
                let _ = task.await;
                return;
            }
            Err(e) => {
                let why = e.to_string();
                let first = tx.borrow().connect_error.as_deref() != Some(why.as_str());
                if first {
                    tracing::warn!(retry_in = ?wait, "the Kubernetes API cannot be reached: {why}; devices a PV could own are left alone until it can");
                }
                tx.send_if_modified(|v| {
                    let changed = v.connect_error.as_deref() != Some(why.as_str());
                    v.connect_error = Some(why);
                    changed
                });
            }
        }
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = tx.closed() => return,
        }
        wait = (wait * 2).min(options.backoff_max.max(wait));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted() -> Wanted {
        Wanted { node_name: "n1".into(), ..Wanted::default() }
    }

    #[test]
    fn off_only_when_the_operator_says_so() {
        let off = Wanted { enabled: Some(false), off_by: Some("--no-kubernetes".into()), ..wanted() };
        assert_eq!(choose(&off, true), Choice::Off("--no-kubernetes".into()));
        assert!(matches!(choose(&wanted(), false), Choice::NoneFound(_)));
        assert!(matches!(choose(&wanted(), true), Choice::Use(_)));
        let configured = Wanted { kubeconfig: Some("/nowhere".into()), ..wanted() };
        assert!(matches!(choose(&configured, false), Choice::Use(k) if k.kubeconfig.is_some()));
    }

    #[test]
    fn an_unreachable_api_never_vouches_and_says_why() {
        let v = unreachable("n1", "kubeconfig /x: No such file".into(), Duration::from_secs(90));
        let why = v.vouch(crate::host::clock::BootTime::now()).expect_err("cannot vouch");
        assert!(why.contains("kubeconfig /x: No such file"), "{why}");
    }

    #[tokio::test]
    async fn a_source_that_fails_is_retried_and_said() {
        let cfg = KubeConfig {
            url: None,
            kubeconfig: Some("/nonexistent/blockjanitor-kubeconfig".into()),
            node_name: "n1".into(),
        };
        let options = WatchOptions {
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(20),
            ..WatchOptions::default()
        };
        let (tx, mut rx) = watch::channel(ClusterView::default());
        let task = tokio::spawn(supervise(cfg, options, tx, |_| panic!("no client can be made")));
        rx.changed().await.expect("a view");
        let why = rx.borrow().connect_error.clone().expect("the connect error");
        assert!(why.contains("/nonexistent/blockjanitor-kubeconfig"), "{why}");
        drop(rx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ends with its readers")
            .expect("join");
    }
}
