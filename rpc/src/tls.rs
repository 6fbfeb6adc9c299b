//! The TCP listener's mutual TLS, terminated here rather than inside tonic so that the decrypted
//! HTTP/2 stream passes through [`super::authority::AuthorityFix`] like the unix socket's does.
//!
//! The same policy tonic's `ServerTlsConfig` applied: the server certificate and key, client
//! certificates required and verified against the configured CA (webpki), ALPN `h2`. Handshakes
//! run concurrently (at most [`MAX_HANDSHAKES`] at once, each within [`HANDSHAKE_TIMEOUT`]), so
//! a slow or silent client never holds up the accept loop; a failed handshake is logged and
//! dropped. Requests see the peer's certificates as tonic's `TlsConnectInfo`, so
//! `Request::peer_certs()` (and with it `auth.rs`) works as before.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

use super::authority::AuthorityFix;

/// TLS handshakes in progress at once, at most.
pub const MAX_HANDSHAKES: usize = 256;
/// How long a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A served TLS connection.
pub type Conn = AuthorityFix<TlsStream<TcpStream>>;

/// What is wrong with the certificate, key or client CA the TCP listener was given, naming
/// the setting (`tcp.cert`, `tcp.key`, `tcp.client_ca`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TlsSetupError(pub String);

/// The server's TLS configuration from PEM files' contents.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let tls = |what: &str, e: &dyn std::fmt::Display| TlsSetupError(format!("{what}: {e}"));
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls("tcp.cert", &e))?;
    if chain.is_empty() {
        return Err(TlsSetupError("tcp.cert: no certificate in the file".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| tls("tcp.key", &e))?;
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(ca.map_err(|e| tls("tcp.client_ca", &e))?).map_err(|e| tls("tcp.client_ca", &e))?;
    }
    if roots.is_empty() {
        return Err(TlsSetupError("tcp.client_ca: no certificate in the file".into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
        .build()
        .map_err(|e| tls("tcp.client_ca", &e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls("protocol versions", &e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| tls("tcp.cert and tcp.key", &e))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// Accepts on `listener` until `shutdown` (or until the server stops taking connections);
/// yields each connection whose handshake succeeded.
pub fn incoming(
    listener: TcpListener,
    config: Arc<ServerConfig>,
    mut shutdown: watch::Receiver<bool>,
) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let acceptor = TlsAcceptor::from(config);
        let limit = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        loop {
            let accepted = tokio::select! {
                r = listener.accept() => r,
                () = tx.closed() => return,
                _ = shutdown.wait_for(|stop| *stop) => return,
            };
            let tcp = match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // EMFILE and the like: pause rather than spin.
                    tracing::warn!(listener = "tcp", error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Nagle off: small answers go out at once, not after the peer's delayed ACK.
            let _ = tcp.set_nodelay(true);
            let Ok(permit) = Arc::clone(&limit).acquire_owned().await else { return };
            let (tx, acceptor) = (tx.clone(), acceptor.clone());
            tokio::spawn(async move {
                let _permit = permit;
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(AuthorityFix::new(tls))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(listener = "tcp", error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(listener = "tcp", "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}
