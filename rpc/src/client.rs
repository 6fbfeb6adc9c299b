//! The caller's side of the agent API (agentctl, the fleet console): where the agent is
//! ([`Target`]), connecting over the unix socket (with one clear line when that fails) or over TCP
//! with mutual TLS, one unary call bounded by a timeout, and a gRPC status as one line.

use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use blockjanitor_proto::v1::agent_client::AgentClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};
use tonic::{Request, Status};

/// Where the agent listens on its node unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/blockjanitor/agent.sock";

/// Responses larger than this are refused (a busy node's device list is far smaller).
const MAX_MESSAGE: usize = 64 << 20;

/// Where the agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The agent's unix socket on this node.
    Unix(PathBuf),
    /// An agent on TCP with mutual TLS.
    Tcp(TcpTarget),
}

/// An agent on TCP with mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget {
    /// HOST:PORT.
    pub addr: String,
    /// Client certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// CA that signed the agent's certificate (PEM).
    pub ca: PathBuf,
    /// The name the agent's certificate must carry.
    pub server_name: String,
}

impl Target {
    /// For messages: the socket path or `HOST:PORT`.
    pub fn describe(&self) -> String {
        match self {
            Self::Unix(p) => p.display().to_string(),
            Self::Tcp(t) => t.addr.clone(),
        }
    }
}

/// Why there is no connection, in one line.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {}: no such socket (is blockjanitor-agent serve running?)", path.display())]
    NoSocket { path: PathBuf },
    #[error("cannot connect to {}: permission denied (run as root or as a member of {})", path.display(),
        group.as_deref().map_or_else(|| "the socket's group".to_owned(), |g| format!("group {g}")))]
    PermissionDenied { path: PathBuf, group: Option<String> },
    #[error("cannot connect to {}: connection refused (stale socket?)", path.display())]
    Refused { path: PathBuf },
    #[error("cannot connect to {}: not a socket", path.display())]
    NotSocket { path: PathBuf },
    #[error("cannot connect to {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot read {flag} {}: {source}", path.display())]
    ReadFile { flag: &'static str, path: PathBuf, source: io::Error },
    #[error("cannot connect to {target}: {message}")]
    Transport { target: String, message: String },
    #[error("cannot connect to {target}: no connection within {seconds}s")]
    Timeout { target: String, seconds: u64 },
}

/// Splits `HOST:PORT` (`[v6]:PORT` for IPv6 addresses); `None` when it is not that shape.
pub fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?,
        None => {
            let (h, p) = addr.rsplit_once(':')?;
            if h.contains(':') {
                return None;
            }
            (h, p)
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// The name of the group that owns `path`, or its number; `None` when it cannot be read.
fn socket_group(path: &Path) -> Option<String> {
    let gid = std::fs::metadata(path).ok()?.gid();
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(g)) => Some(g.name),
        _ => Some(gid.to_string()),
    }
}

/// Turns a failed connect(2) on the socket into one clear error.
pub fn explain_socket_error(path: &Path, e: io::Error) -> ConnectError {
    let path = path.to_owned();
    match e.kind() {
        io::ErrorKind::NotFound => ConnectError::NoSocket { path },
        io::ErrorKind::PermissionDenied => {
            let group = socket_group(&path);
            ConnectError::PermissionDenied { path, group }
        }
        io::ErrorKind::ConnectionRefused => match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.file_type().is_socket() => ConnectError::NotSocket { path },
            _ => ConnectError::Refused { path },
        },
        _ => ConnectError::Io { path, source: e },
    }
}

/// Tries the socket once with a plain connect(2), so that the usual failures (no agent, no
/// permission, stale socket) come out as one clear line rather than a transport error.
pub fn probe_socket(path: &Path) -> Result<(), ConnectError> {
    std::os::unix::net::UnixStream::connect(path).map(drop).map_err(|e| explain_socket_error(path, e))
}

/// An error and its causes on one line, each cause once, runs of white space as one space.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    one_line(&crate::errors::one_line(e))
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::ReadFile { flag, path: path.to_owned(), source })
}

/// Connects to the agent; the whole attempt is bounded by `timeout`.
pub async fn connect(target: &Target, timeout: Duration) -> Result<AgentClient<Channel>, ConnectError> {
    connect_tuned(target, timeout, |e| e).await
}

/// Like [`connect`], with `tune` applied to the endpoint (keepalives, for a long-lived link).
pub async fn connect_tuned(
    target: &Target,
    timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<AgentClient<Channel>, ConnectError> {
    Ok(AgentClient::new(connect_channel_tuned(target, timeout, tune).await?)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// A channel to the agent (or, over TCP, to the fleet console, which speaks the same mutual
/// TLS); the whole attempt is bounded by `timeout`.
pub async fn connect_channel(target: &Target, timeout: Duration) -> Result<Channel, ConnectError> {
    connect_channel_tuned(target, timeout, |e| e).await
}

/// Like [`connect_channel`], with `tune` applied to the endpoint.
pub async fn connect_channel_tuned(
    target: &Target,
    timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, ConnectError> {
    let transport = |e: &(dyn std::error::Error + 'static)| ConnectError::Transport {
        target: target.describe(),
        message: error_chain(e),
    };
    let attempt = async {
        let channel = match target {
            Target::Unix(path) => {
                probe_socket(path)?;
                let path = path.clone();
                // The URI is required by the API but unused: the connector ignores it.
                tune(Endpoint::from_static("http://[::]:50051"))
                    .connect_timeout(timeout)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                        }
                    }))
                    .await
                    .map_err(|e| transport(&e))?
            }
            Target::Tcp(t) => {
                let cert = read_file("--cert", &t.cert)?;
                let key = read_file("--key", &t.key)?;
                let ca = read_file("--ca", &t.ca)?;
                let tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .identity(Identity::from_pem(cert, key))
                    .domain_name(t.server_name.clone());
                tune(Endpoint::from_shared(format!("https://{}", t.addr)).map_err(|e| transport(&e))?)
                    .connect_timeout(timeout)
                    .tls_config(tls)
                    .map_err(|e| transport(&e))?
                    .connect()
                    .await
                    .map_err(|e| transport(&e))?
            }
        };
        Ok(channel)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout { target: target.describe(), seconds: timeout.as_secs() }),
    }
}

/// A request that tells the agent how long the caller waits.
pub fn request<T>(message: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(message);
    r.set_timeout(timeout);
    r
}

/// Runs one unary call, giving up after `timeout`.
pub async fn call<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer from the agent within {}s (see --timeout)",
            timeout.as_secs()
        ))),
    }
}

/// `Code: message` on one line, e.g. `NotFound: unknown device 'sdz'`.
pub fn status_line(s: &Status) -> String {
    let mut msg = one_line(s.message());
    if msg.is_empty() {
        msg = s.code().description().to_owned();
    }
    if let Some(src) = std::error::Error::source(s) {
        let detail = error_chain(src);
        if detail.contains(&msg) {
            msg = detail;
        } else if !msg.contains(&detail) {
            msg = format!("{msg}: {detail}");
        }
    }
    // Transport errors often repeat a cause ("a: b: b"): say each once.
    let mut parts: Vec<&str> = Vec::new();
    for p in msg.split(": ") {
        if parts.last() != Some(&p) {
            parts.push(p);
        }
    }
    format!("{:?}: {}", s.code(), parts.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(split_host_port("node1:9443"), Some(("node1", 9443)));
        assert_eq!(split_host_port("[fd00::1]:9443"), Some(("fd00::1", 9443)));
        assert_eq!(split_host_port("fd00::1:9443"), None);
        assert_eq!(split_host_port("node1"), None);
        assert_eq!(split_host_port(":9443"), None);
        assert_eq!(split_host_port("node1:99999"), None);
    }

    #[test]
    fn status_is_one_line() {
        let s = Status::not_found("unknown device 'sdz':\n no such device");
        assert_eq!(status_line(&s), "NotFound: unknown device 'sdz': no such device");
        assert_eq!(status_line(&Status::internal("")), "Internal: Internal error");
        let s = Status::unknown("h2 protocol error: error reading a body: error reading a body: broken pipe");
        assert_eq!(status_line(&s), "Unknown: h2 protocol error: error reading a body: broken pipe");
        let s = Status::failed_precondition(
            "loop3: the device changed since it was planned: planned for [loop3@7:3#12;loop=8:1/77+0], now [loop3@7:3#13;loop=8:1/78+0]; plan again",
        );
        assert_eq!(
            status_line(&s),
            "FailedPrecondition: loop3: the device changed since it was planned: planned for [loop3@7:3#12;loop=8:1/77+0], now [loop3@7:3#13;loop=8:1/78+0]; plan again"
        );
    }

    #[test]
    fn socket_errors_are_one_clear_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("agent.sock");
        let e = probe_socket(&missing).expect_err("no socket");
        assert_eq!(
            e.to_string(),
            format!(
                "cannot connect to {}: no such socket (is blockjanitor-agent serve running?)",
                missing.display()
            )
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"").expect("write");
        let e = probe_socket(&file).expect_err("not a socket");
        assert!(e.to_string().ends_with(": not a socket"), "{e}");
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let e = probe_socket(&stale).expect_err("stale");
        assert!(e.to_string().ends_with("connection refused (stale socket?)"), "{e}");
        let denied = explain_socket_error(&stale, io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            denied.to_string().contains("permission denied (run as root or as a member of group "),
            "{denied}"
        );
    }
}
