//! gRPC over the API server's `pods/portforward` subresource (WebSocket, `v4.channel.k8s.io`,
//! as `kubectl port-forward` speaks it): the console's HTTP/2 and TLS (the console's certificate
//! checked against its CA; a client certificate when the user gave one) run inside the forwarded
//! stream, end to end between the plugin and the console (the API server only sees bytes). One forward per connection: tonic's connector opens a new one when it reconnects.
//! A forward the API server accepts but that fails behind it (nothing listens on the pod's port,
//! the pod went away) says why on its error channel; that reason is the error's.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::io::DuplexStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

use super::credentials::Tls;
use super::route::{api_error, Error};

/// The reason a forward's error channel gave, once it gave one.
type Failure = Arc<Mutex<Option<String>>>;

/// One forwarded port of one pod.
#[derive(Clone)]
struct Forward {
    pods: Api<Pod>,
    server: String,
    namespace: String,
    pod: String,
    port: u16,
    failure: Failure,
}

impl Forward {
    /// Opens a forward: its data stream; its error channel's message goes to `failure`.
    async fn open(&self) -> Result<DuplexStream, Error> {
        let what = format!("port-forward to pod {} port {}", self.pod, self.port);
        let mut forwarder = self
            .pods
            .portforward(&self.pod, &[self.port])
            .await
            .map_err(|e| api_error(&self.server, &what, &self.namespace, e))?;
        if let Some(error) = forwarder.take_error(self.port) {
            let failure = self.failure.clone();
            tokio::spawn(async move {
                if let Some(message) = error.await {
                    *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(message);
                }
            });
        }
        forwarder.take_stream(self.port).ok_or_else(|| self.failed("the forwarder gave no stream".into()))
    }

    fn failed(&self, message: String) -> Error {
        Error::PortForward {
            namespace: self.namespace.clone(),
            pod: self.pod.clone(),
            port: self.port,
            message,
        }
    }

    fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A channel to the console in `pod` (port `port`) through the API server, with TLS (`tls`: the
/// console's certificate checked against its CA for `server_name`, and the client certificate
/// when there is one).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn channel(
    client: kube::Client,
    server: &str,
    namespace: &str,
    pod: &str,
    port: u16,
    tls: &Tls,
    server_name: &str,
    timeout: Duration,
) -> Result<Channel, Error> {
    let forward = Forward {
        pods: Api::namespaced(client, namespace),
        server: server.to_owned(),
        namespace: namespace.to_owned(),
        pod: pod.to_owned(),
        port,
        failure: Failure::default(),
    };
    // The first forward here, so that a refusal (forbidden, no such pod) is this module's own
    // line rather than a transport error.
    let first = Arc::new(Mutex::new(Some(forward.open().await?)));
    let connector = {
        let forward = forward.clone();
        tower::service_fn(move |_: Uri| {
            let (forward, first) = (forward.clone(), first.clone());
            async move {
                let ready = first.lock().unwrap_or_else(|p| p.into_inner()).take();
                let stream = match ready {
                    Some(s) => s,
                    None => forward.open().await?,
                };
                Ok::<_, Error>(TokioIo::new(stream))
            }
        })
    };
    let connect_error =
        |message: String| Error::Connect { namespace: namespace.to_owned(), pod: pod.to_owned(), message };
    let mut config =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca)).domain_name(server_name);
    if let Some((cert, key)) = &tls.identity {
        config = config.identity(Identity::from_pem(cert, key));
    }
    let endpoint = Endpoint::from_shared(format!("https://{server_name}"))
        .map_err(|e| connect_error(format!("'{server_name}' is not a server name: {e}")))?
        .connect_timeout(timeout)
        .tls_config(config)
        .map_err(|e| connect_error(blockjanitor_rpc::client::error_chain(&e)))?;
    match endpoint.connect_with_connector(connector).await {
        Ok(channel) => Ok(channel),
        Err(e) => {
            // The error channel's reason may trail the stream's end by a moment.
            for _ in 0..50 {
                if let Some(message) = forward.failure() {
                    return Err(forward.failed(message.trim().to_owned()));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let message = blockjanitor_rpc::client::error_chain(&e);
            let hint = if message.contains("certificate") || message.contains("tls") || tls.identity.is_none()
            {
                ""
            } else {
                " (a console that refuses the client certificate closes the connection: is it signed by \
                 the console's client CA?)"
            };
            Err(connect_error(format!("{message}{hint}")))
        }
    }
}
