//! Who the plugin is to the console, and how it knows the console is the console.
//!
//! By default the kubeconfig user's own credentials: the bearer token kube resolves for the
//! context (a static token, a token file, an exec or OIDC credential plugin's output, as
//! `kubectl` would send it to the API server), sent to the console in the `authorization`
//! metadata; the console has the API server review it (TokenReview) and decides by the cluster's
//! RBAC (SubjectAccessReview). A user whose kubeconfig authenticates with a client certificate
//! (or basic auth), or impersonates someone, is refused with one line saying what to use: the
//! console cannot review a certificate the cluster's CA issued. The console's serving CA comes
//! from the ConfigMap the console publishes (`blockjanitor-console-ca`, key `ca.crt`; a CA
//! certificate is public, so the plugin reads no Secret), or `--ca FILE`; the token is sent only
//! over TLS that verified the console's certificate against it.
//!
//! Or a client certificate of one's own (`--cert`, `--key`, `--ca`): the console lists it by
//! identity, one per person.

use std::path::Path;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::Api;
use kube::client::ConfigExt;

use super::config::Context;
use super::route::{api_error, CaSource, Credentials, Error};

/// What the connection to the console carries.
pub(crate) struct Tls {
    /// The CA the console's certificate must chain to (PEM).
    pub ca: Vec<u8>,
    /// A client certificate and key (PEM), for [`Credentials::Certificate`].
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// The bearer token, for [`Credentials::Kubeconfig`].
    pub token: Option<String>,
}

/// Reads what `credentials` name: the CA (a ConfigMap through the API as the kubeconfig's user,
/// or a file), the token, the certificate files.
pub(crate) async fn load(ctx: &Context, namespace: &str, credentials: &Credentials) -> Result<Tls, Error> {
    match credentials {
        Credentials::Certificate { cert, key, ca } => Ok(Tls {
            ca: read("--ca", ca)?,
            identity: Some((read("--cert", cert)?, read("--key", key)?)),
            token: None,
        }),
        Credentials::Kubeconfig { ca } => {
            let token = token(ctx).await?;
            let ca = match ca {
                CaSource::File(path) => read("--ca", path)?,
                CaSource::ConfigMap(name) => ca_from_configmap(ctx, namespace, name).await?,
            };
            Ok(Tls { ca, identity: None, token: Some(token) })
        }
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::File {
        flag,
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// The CA under `ca.crt` in the ConfigMap `name`.
async fn ca_from_configmap(ctx: &Context, namespace: &str, name: &str) -> Result<Vec<u8>, Error> {
    let maps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), namespace);
    let what = format!("read the ConfigMap {name} (the console's serving CA)");
    let cm = maps.get(name).await.map_err(|e| match e {
        kube::Error::Api(s) if s.code == 404 => {
            Error::NoCaConfigMap { namespace: namespace.to_owned(), name: name.to_owned() }
        }
        e => api_error(&ctx.server, &what, namespace, e),
    })?;
    cm.data
        .unwrap_or_default()
        .remove("ca.crt")
        .filter(|pem| pem.contains("-----BEGIN CERTIFICATE-----"))
        .map(String::into_bytes)
        .ok_or_else(|| Error::CaConfigMapKey { namespace: namespace.to_owned(), name: name.to_owned() })
}

/// The bearer token kube would send for the context: its authentication layer applied to an
/// empty request, and the `authorization` header it set read back.
async fn token(ctx: &Context) -> Result<String, Error> {
    use tower::{Layer, ServiceExt};
    let context = ctx.name.clone();
    let info = &ctx.config.auth_info;
    if let Some(user) = &info.impersonate {
        return Err(Error::Impersonation { context, user: user.clone() });
    }
    let failed = |message: String| Error::Context { context: context.clone(), message };
    let layer = ctx.config.auth_layer().map_err(|e| failed(blockjanitor_rpc::client::error_chain(&e)))?;
    let Some(layer) = layer else {
        let how = if info.client_certificate.is_some()
            || info.client_certificate_data.is_some()
            || info.exec.is_some()
        {
            "authenticates with a client certificate"
        } else {
            "has no credentials"
        };
        return Err(Error::NoToken { context, how: how.into() });
    };
    let capture = tower::service_fn(|req: http::Request<kube::client::Body>| async move {
        let header = req.headers().get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        Ok::<_, tower::BoxError>(http::Response::new(header.map(str::to_owned)))
    });
    let header = layer
        .layer(capture)
        .oneshot(http::Request::new(kube::client::Body::empty()))
        .await
        .map_err(|e| failed(format!("cannot get its token: {e}")))?
        .into_body();
    match header.as_deref().and_then(|h| h.strip_prefix("Bearer ")).map(str::trim) {
        Some(t) if !t.is_empty() => Ok(t.to_owned()),
        _ if header.as_deref().is_some_and(|h| h.starts_with("Basic ")) => {
            Err(Error::NoToken { context, how: "authenticates with a username and password".into() })
        }
        _ => Err(Error::NoToken { context, how: "gives no bearer token".into() }),
    }
}
