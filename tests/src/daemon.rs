//! Running `blockjanitor-agent serve` in tests: the process (stopped with SIGTERM on drop), its
//! listeners' real addresses (read from its JSON log), its mutual-TLS flags, agents serving a
//! fixture root, test certificates, and gRPC clients over the unix socket and over TCP with
//! mutual TLS.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use blockjanitor_proto::v1::agent_client::AgentClient;
use hyper_util::rt::TokioIo;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::child_log::{self, Log};

/// The server files [`Pki::write_server`] writes: certificate, key, CA.
pub type ServerFiles = (PathBuf, PathBuf, PathBuf);

/// A running daemon.
pub struct Daemon {
    pub child: Child,
    pub socket: PathBuf,
    pub tcp: Option<SocketAddr>,
    pub metrics: Option<SocketAddr>,
    /// The plain-text health listener (`--health-listen`), if any.
    pub health: Option<SocketAddr>,
    /// Every log line so far is kept here by a reader thread.
    log: Log,
}

impl Daemon {
    /// Starts `serve` with `args` (plus `--socket`, `--journal`, `--log-format json` in `dir`)
    /// and waits until the unix listener is up (10 s at most).
    pub fn start(dir: &Path, args: &[&str]) -> Self {
        Self::start_with_global(dir, &[], args)
    }

    /// Like [`Daemon::start`], with global flags (`--root`...) placed before `serve`.
    /// [`crate::trust_init`] applies.
    pub fn start_with_global(dir: &Path, global: &[&str], args: &[&str]) -> Self {
        Self::start_configured(dir, global, args, |_| {})
    }

    /// Like [`Daemon::start_with_global`], serving mutual TLS on `listen` with the server files
    /// `tls` (the roles and any other flag in `args`).
    pub fn start_tls(dir: &Path, global: &[&str], listen: &str, tls: &ServerFiles, args: &[&str]) -> Self {
        Self::start_tls_configured(dir, global, listen, tls, args, |_| {})
    }

    /// Like [`Daemon::start_tls`], with `configure` as in [`Daemon::start_configured`].
    pub fn start_tls_configured(
        dir: &Path,
        global: &[&str],
        listen: &str,
        (cert, key, ca): &ServerFiles,
        args: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let utf8 = |p: &Path| p.to_str().expect("utf8 path").to_owned();
        let (cert, key, ca) = (utf8(cert), utf8(key), utf8(ca));
        let mut all =
            vec!["--listen", listen, "--tls-cert", &cert, "--tls-key", &key, "--tls-client-ca", &ca];
        all.extend_from_slice(args);
        Self::start_configured(dir, global, &all, configure)
    }

    /// Like [`Daemon::start_with_global`], with `configure` applied to the command after
    /// [`crate::trust_init`] (e.g. to remove [`crate::TRUST_INIT_ENV`] again).
    pub fn start_configured(
        dir: &Path,
        global: &[&str],
        args: &[&str],
        configure: impl FnOnce(&mut Command),
    ) -> Self {
        let socket = dir.join("agent.sock");
        let journal = dir.join("journal.jsonl");
        let mut command = Command::new(crate::agent_bin());
        crate::trust_init(&mut command);
        configure(&mut command);
        // A daemon with no API named runs without it by the test's word (the operator's): with
        // none configured and none found, it would vouch for nothing (issue 34).
        let api_named = [global, args]
            .concat()
            .iter()
            .any(|a| a.starts_with("--kube-url") || a.starts_with("--kubeconfig") || *a == "--config");
        if !api_named {
            command.arg("--no-kubernetes");
        }
        let mut child = command
            .args(global)
            .args(["--log-format", "json", "--journal"])
            .arg(&journal)
            .arg("serve")
            .arg("--socket")
            .arg(&socket)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn serve");
        let (log, rx) = child_log::follow(child.stderr.take().expect("stderr"), None);
        let mut d = Self { child, socket, tcp: None, metrics: None, health: None, log };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok((l, _)) if l == "unix" => break,
                Ok((l, a)) if l == "tcp" => d.tcp = a.parse().ok(),
                Ok((l, a)) if l == "metrics" => d.metrics = a.parse().ok(),
                Ok((l, a)) if l == "health" => d.health = a.parse().ok(),
                Ok(_) => {}
                Err(_) => panic!("the daemon did not start listening; its log:\n{}", d.log_text()),
            }
        }
        d
    }

    pub fn log_text(&self) -> String {
        self.log.text()
    }

    /// Waits (20 s at most) until the server's own health (`""`, the liveness probe's) is
    /// SERVING and the agent service's (the readiness probe's) is `want`; panics with the log
    /// otherwise.
    pub fn wait_health(
        &self,
        rt: &tokio::runtime::Runtime,
        want: tonic_health::pb::health_check_response::ServingStatus,
    ) {
        use tonic_health::pb::health_check_response::ServingStatus;
        rt.block_on(async {
            let ch = unix_channel(&self.socket).await.expect("connect");
            let mut h = tonic_health::pb::health_client::HealthClient::new(ch);
            let mut last = Vec::new();
            for _ in 0..200 {
                last.clear();
                for service in ["", "blockjanitor.v1.Agent"] {
                    let req = tonic_health::pb::HealthCheckRequest { service: service.into() };
                    last.push(h.check(req).await.expect("health").into_inner().status);
                }
                if last == [ServingStatus::Serving as i32, want as i32] {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!(
                "health never became [Serving, {want:?}] (last: {last:?}); log:
{}",
                self.log_text()
            );
        })
    }

    /// Sends SIGTERM and waits (5 s at most); returns the exit code.
    pub fn stop(&mut self) -> Option<i32> {
        child_log::stop(&mut self.child)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}

/// An agent serving `fixture` (a directory of [`crate::fixtures`]) as node `node` on `listen`
/// with mutual TLS, the certificate named `console` given the console role, then `args`;
/// `configure` is applied to the command (e.g. a network namespace).
pub fn fixture_agent(
    dir: &Path,
    fixture: &str,
    node: &str,
    listen: &str,
    tls: &ServerFiles,
    args: &[&str],
    configure: impl FnOnce(&mut Command),
) -> Daemon {
    let root = crate::fixtures().join(fixture).to_string_lossy().into_owned();
    let mut all = vec!["--tls-console", "console", "--node-name", node];
    all.extend_from_slice(args);
    Daemon::start_tls_configured(dir, &["--root", &root], listen, tls, &all, configure)
}

/// A fake API server (a task on `rt`) with Node [`crate::kube_mock::NODE`] Ready, and a daemon
/// with no grace period reporting to it as that node, then `args`.
pub fn reporting_daemon(
    s: &crate::Scratch,
    rt: &tokio::runtime::Runtime,
    args: &[&str],
) -> (crate::kube_mock::ApiServer, Daemon) {
    use crate::kube_mock::{node_object, ready_only, ApiServer, NODE};
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let url = server.url();
    let mut all = vec!["--grace-period", "0", "--kube-url", &url, "--node-name", NODE];
    all.extend_from_slice(args);
    let d = Daemon::start(s.dir.path(), &all);
    (server, d)
}

/// An agent serving the fixture tree `fixture` (of [`crate::fixtures`]) over mutual TLS on
/// loopback, with `config` (TOML) as its config file and the identity `console` in the console
/// role; and the PKI that issued its certificates. For the tests of the calls a console forwards
/// on behalf of a person ([`console_client`] is that console).
pub fn console_facing_agent(s: &crate::Scratch, fixture: &str, config: &str) -> (Daemon, Pki) {
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let root = crate::fixtures().join(fixture).to_string_lossy().into_owned();
    let file = s.path("agent.toml");
    std::fs::write(&file, config).expect("write the agent's config");
    let args = ["--config", file.to_str().expect("utf-8 path"), "--tls-console", "console"];
    let d = Daemon::start_tls(s.dir.path(), &["--root", &root], "127.0.0.1:0", &tls, &args);
    (d, pki)
}

/// An Agent client of `d` with the certificate of the identity `console`, issued by `pki`
/// ([`console_facing_agent`]).
pub async fn console_client(d: &Daemon, pki: &Pki) -> AgentClient<Channel> {
    let console = pki.issue("console", &["console"]);
    let addr = d.tcp.expect("the agent listens on TCP");
    let ch = tls_channel(addr, &pki.ca.cert, Some((&console.cert, &console.key))).await.expect("connect");
    AgentClient::new(ch)
}

/// A gRPC channel over a unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel, tonic::transport::Error> {
    let path = path.to_owned();
    Endpoint::try_from("http://[::]:50051")?
        .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
            let path = path.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
        }))
        .await
}

/// An Agent client over a unix socket.
pub async fn unix_client(path: &Path) -> AgentClient<Channel> {
    AgentClient::new(unix_channel(path).await.expect("connect unix socket"))
}

/// A channel over TCP with TLS; `identity` is the client certificate and key (PEM).
pub async fn tls_channel(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    let mut tls =
        ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca_pem)).domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Endpoint::from_shared(format!("https://{addr}"))?
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// A certificate and its key, PEM.
pub struct Pem {
    pub cert: String,
    pub key: String,
}

/// A test PKI: a CA, a server certificate for localhost/127.0.0.1, and client certificates.
pub struct Pki {
    pub ca: Pem,
    pub server: Pem,
    issuer_params: rcgen::CertificateParams,
    issuer_key: rcgen::KeyPair,
}

impl Pki {
    pub fn new(ca_name: &str) -> Self {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, ca_name);
        let key = KeyPair::generate().expect("ca key");
        let ca = params.self_signed(&key).expect("ca cert");
        let ca = Pem { cert: ca.pem(), key: key.serialize_pem() };
        let mut pki = Self {
            ca,
            server: Pem { cert: String::new(), key: String::new() },
            issuer_params: params,
            issuer_key: key,
        };
        pki.server = pki.issue("localhost", &["localhost", "127.0.0.1"]);
        pki
    }

    /// A certificate with common name `cn` and these SANs (IP addresses become IP SANs).
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Pem {
        use rcgen::{CertificateParams, DnType, Issuer, KeyPair};
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        let key = KeyPair::generate().expect("key");
        let issuer = Issuer::from_params(&self.issuer_params, &self.issuer_key);
        let cert = params.signed_by(&key, &issuer).expect("sign");
        Pem { cert: cert.pem(), key: key.serialize_pem() }
    }

    /// Writes the CA and server files into `dir`; returns (cert, key, ca) paths.
    pub fn write_server(&self, dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let (c, k, a) = (dir.join("server.crt"), dir.join("server.key"), dir.join("ca.crt"));
        std::fs::write(&c, &self.server.cert).expect("write cert");
        std::fs::write(&k, &self.server.key).expect("write key");
        std::fs::write(&a, &self.ca.cert).expect("write ca");
        (c, k, a)
    }
}

/// `async fn $name(channel) -> Vec<String>`: the services server reflection `$version` lists.
/// Both versions are served: `v1alpha` is what Python's `grpc_reflection`, `grpc_cli` and
/// older grpcurl speak.
macro_rules! reflected_services_fn {
    ($name:ident, $version:ident) => {
        pub async fn $name(ch: tonic::transport::Channel) -> Vec<String> {
            use tonic_reflection::pb::$version::server_reflection_client::ServerReflectionClient;
            use tonic_reflection::pb::$version::server_reflection_request::MessageRequest;
            use tonic_reflection::pb::$version::server_reflection_response::MessageResponse;
            use tonic_reflection::pb::$version::ServerReflectionRequest;
            let req = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut stream = ServerReflectionClient::new(ch)
                .server_reflection_info(tokio_stream::once(req))
                .await
                .expect(concat!("reflection ", stringify!($version)))
                .into_inner();
            let resp = tokio_stream::StreamExt::next(&mut stream).await.expect("one response").expect("ok");
            match resp.message_response {
                Some(MessageResponse::ListServicesResponse(l)) => {
                    l.service.into_iter().map(|s| s.name).collect()
                }
                other => panic!("unexpected reflection answer {other:?}"),
            }
        }
    };
}
reflected_services_fn!(reflected_services, v1);
reflected_services_fn!(reflected_services_v1alpha, v1alpha);

/// Asserts that a gRPC server on `ch` reports itself and `service` SERVING through
/// `grpc.health.v1`, and lists `service` through server reflection, v1 and v1alpha.
pub async fn assert_serving_and_reflected(ch: tonic::transport::Channel, service: &str) {
    let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
    for name in ["", service] {
        let r = h.check(tonic_health::pb::HealthCheckRequest { service: name.into() }).await.expect("health");
        assert_eq!(
            r.into_inner().status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "health of {name:?}"
        );
    }
    let services = reflected_services(ch.clone()).await;
    assert!(services.iter().any(|s| s == service), "reflection v1: {services:?}");
    assert!(services.iter().any(|s| s == "grpc.health.v1.Health"), "reflection v1: {services:?}");
    // Nothing it does not serve (the descriptor set also holds the other binary's service).
    let foreign: Vec<&String> =
        services.iter().filter(|s| s.starts_with("blockjanitor.") && s.as_str() != service).collect();
    assert!(foreign.is_empty(), "reflection v1 advertises services not served here: {foreign:?}");
    let services = reflected_services_v1alpha(ch).await;
    assert!(services.iter().any(|s| s == service), "reflection v1alpha: {services:?}");
    assert!(
        services.iter().all(|s| !s.starts_with("blockjanitor.") || s == service),
        "reflection v1alpha advertises services not served here: {services:?}"
    );
}
