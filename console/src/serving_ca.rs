//! The console's serving CA, published where anyone allowed may read it: a ConfigMap (key
//! `ca.crt`) in the console's namespace, as kube-controller-manager publishes `kube-root-ca.crt`
//! into every namespace. The kubectl plugin reads it to check the console's certificate before it
//! sends the user's token, and needs no Secret for that: a CA certificate is public, its key is
//! not. Written at start and every [`EVERY`] after (so a CA rotated by cert-manager reaches the
//! ConfigMap without a restart of the console), only when it differs; each replica writes the same
//! content. A failed write is logged and retried, never fatal: the console serves on, and the
//! plugin says which ConfigMap it cannot read (or takes `--ca FILE`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, PostParams};
use kube::Api;

/// Between two checks of the ConfigMap.
pub const EVERY: Duration = Duration::from_secs(300);
/// The key the CA is under (as in `kube-root-ca.crt`).
pub const KEY: &str = "ca.crt";

/// Where the CA comes from and goes.
#[derive(Clone, Debug)]
pub struct Publish {
    /// The PEM file of the CA that signed the console's serving certificate (re-read each time).
    pub ca_file: PathBuf,
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
}

/// Why one publication failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("cannot read the serving CA {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("{} holds no PEM certificate", .0.display())]
    NotPem(PathBuf),
    #[error("ConfigMap {namespace}/{name}: {message}")]
    Api { namespace: String, name: String, message: String },
}

/// Publishes now and every [`EVERY`] after, until the task is aborted.
pub fn spawn(client: kube::Client, p: Publish) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let api: Api<ConfigMap> = Api::namespaced(client, &p.namespace);
        loop {
            match publish(&api, &p).await {
                Ok(true) => {
                    tracing::info!(configmap = %p.name, "published the serving CA for the kubectl plugin")
                }
                Ok(false) => {}
                Err(e) => tracing::warn!("cannot publish the serving CA: {e}"),
            }
            tokio::time::sleep(EVERY).await;
        }
    })
}

/// Writes the CA into the ConfigMap when it is not there already; whether it wrote.
pub async fn publish(api: &Api<ConfigMap>, p: &Publish) -> Result<bool, PublishError> {
    let pem = std::fs::read_to_string(&p.ca_file)
        .map_err(|source| PublishError::Read { path: p.ca_file.clone(), source })?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(PublishError::NotPem(p.ca_file.clone()));
    }
    let failed = |e: kube::Error| PublishError::Api {
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        message: blockjanitor_rpc::client::error_chain(&e),
    };
    let data = BTreeMap::from([(KEY.to_owned(), pem)]);
    match api.get_opt(&p.name).await.map_err(failed)? {
        Some(cm) if cm.data.as_ref() == Some(&data) => Ok(false),
        Some(mut cm) => {
            cm.data = Some(data);
            api.replace(&p.name, &PostParams::default(), &cm).await.map_err(failed)?;
            Ok(true)
        }
        None => {
            let labels = BTreeMap::from([
                ("app.kubernetes.io/name".to_owned(), "blockjanitor".to_owned()),
                ("app.kubernetes.io/component".to_owned(), "console".to_owned()),
            ]);
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(p.name.clone()),
                    labels: Some(labels),
                    ..Default::default()
                },
                data: Some(data),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await.map_err(failed)?;
            Ok(true)
        }
    }
}
