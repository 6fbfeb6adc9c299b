//! Who the plugin is to the console (its mutual TLS): by default the client certificate in a
//! Secret the shipped manifests make (cert-manager's `blockjanitor-viewer-tls`, or
//! `blockjanitor-operator-tls` for `apply`), read from the console's namespace with the user's
//! own kubeconfig credentials, so that Kubernetes RBAC on that Secret decides who may view and
//! who may clean; or files given with `--cert`, `--key`, `--ca`.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;

use super::route::{api_error, Error, Identity};

/// The PEMs: certificate, key, CA.
pub(crate) struct Pems {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

/// Reads the identity (the Secret through the API as the kubeconfig's user).
pub(crate) async fn load(
    client: &kube::Client,
    server: &str,
    namespace: &str,
    identity: &Identity,
) -> Result<Pems, Error> {
    match identity {
        Identity::Files { cert, key, ca } => {
            let read = |flag: &'static str, path: &PathBuf| {
                std::fs::read(path).map_err(|e| Error::File {
                    flag,
                    path: path.display().to_string(),
                    message: e.to_string(),
                })
            };
            Ok(Pems { cert: read("--cert", cert)?, key: read("--key", key)?, ca: read("--ca", ca)? })
        }
        Identity::Secret(name) => {
            let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
            let what = format!("read the Secret {name} (the client certificate for the console)");
            let secret = secrets.get(name).await.map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => {
                    Error::NoSecret { namespace: namespace.to_owned(), secret: name.clone() }
                }
                e => api_error(server, &what, namespace, e),
            })?;
            let data = secret.data.unwrap_or_default();
            let key =
                |key: &'static str| {
                    data.get(key).map(|b| b.0.clone()).filter(|b| !b.is_empty()).ok_or_else(|| {
                        Error::SecretKey { namespace: namespace.to_owned(), secret: name.clone(), key }
                    })
                };
            Ok(Pems { cert: key("tls.crt")?, key: key("tls.key")?, ca: key("ca.crt")? })
        }
    }
}
