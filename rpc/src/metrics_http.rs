//! `/metrics` over plain HTTP/1 on its own address (Prometheus scrapes it; nothing else is served).
//! Shared by the agent and the fleet console: each hands in what renders its exposition, and
//! optionally a [`Gate`] every scrape must pass first (the console's: the scraper's bearer token
//! reviewed by the API server, and `get` on the path allowed, as kube-rbac-proxy does; off by
//! default, as node exporters serve their metrics).

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The process collector (CPU, memory, file descriptors, threads, start time of this process), in
/// a registry of its own so its series keep their conventional unprefixed names (`process_*`):
/// the agent's and the console's expositions each append it.
pub fn process_registry() -> prometheus::Result<prometheus::Registry> {
    let r = prometheus::Registry::new();
    r.register(Box::new(prometheus::process_collector::ProcessCollector::for_self()))?;
    Ok(r)
}

/// Whatever renders a Prometheus text exposition.
pub trait Exposition: Send + Sync + 'static {
    fn render(&self) -> String;

    /// What `/readyz` answers: `None` when it is not served (404), else ready (200, the line) or
    /// not yet, saying why (503). Never behind the [`Gate`]: kubelet probes without a token.
    fn ready(&self) -> Option<Result<String, String>> {
        None
    }
}

/// Why a scrape was turned away: the HTTP status (401, 403, 503) and a line saying why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
}

/// A future a [`Gate`] answers with.
pub type GateFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Refusal>> + Send>>;

/// What a scrape must pass before it is served: given the request's `authorization` header.
pub trait Gate: Send + Sync + 'static {
    fn admit(&self, path: &str, authorization: Option<String>) -> GateFuture;
}

async fn handle<M: Exposition>(
    req: Request<Incoming>,
    metrics: Arc<M>,
    gate: Option<Arc<dyn Gate>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    if let (Some(gate), "/metrics") = (&gate, req.uri().path()) {
        let authorization =
            req.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
        if let Err(r) = gate.admit("/metrics", authorization).await {
            let status = StatusCode::from_u16(r.status).unwrap_or(StatusCode::FORBIDDEN);
            let resp = Response::builder()
                .status(status)
                .header("content-type", "text/plain; charset=utf-8")
                .body(Full::new(Bytes::from(format!("{}\n", r.message))));
            return Ok(resp.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))));
        }
    }
    let text = |status: StatusCode, line: String| {
        Response::builder()
            .status(status)
            .header("content-type", "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from(format!("{line}\n"))))
    };
    let resp = if req.uri().path() == "/metrics" {
        Response::builder()
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(metrics.render())))
    } else if let (Some(ready), "/readyz") = (metrics.ready(), req.uri().path()) {
        match ready {
            Ok(line) => text(StatusCode::OK, line),
            Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
        }
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"only /metrics is served here\n")))
    };
    Ok(resp.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

/// Serves `/metrics` until `shutdown` fires.
pub async fn serve<M: Exposition>(listener: TcpListener, metrics: Arc<M>, shutdown: watch::Receiver<bool>) {
    serve_gated(listener, metrics, None, shutdown).await;
}

/// Serves `/metrics` to the scrapes `gate` admits (all, without one) until `shutdown` fires.
pub async fn serve_gated<M: Exposition>(
    listener: TcpListener,
    metrics: Arc<M>,
    gate: Option<Arc<dyn Gate>>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let m = Arc::clone(&metrics);
                let gate = gate.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(req, Arc::clone(&m), gate.clone()));
                    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                        tracing::debug!("metrics connection: {e}");
                    }
                });
            }
        }
    }
}
