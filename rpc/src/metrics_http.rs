//! `/metrics` over plain HTTP/1 on its own address (Prometheus scrapes it; nothing else is served).
//! Shared by the agent and the fleet console: each hands in what renders its exposition.

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
}

async fn handle<M: Exposition>(
    req: Request<Incoming>,
    metrics: Arc<M>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let resp = if req.uri().path() == "/metrics" {
        Response::builder()
            .header("content-type", "text/plain; version=0.0.4; charset=utf-8")
            .body(Full::new(Bytes::from(metrics.render())))
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(b"only /metrics is served here\n")))
    };
    Ok(resp.unwrap_or_else(|_| Response::new(Full::new(Bytes::new()))))
}

/// Serves `/metrics` until `shutdown` fires.
pub async fn serve<M: Exposition>(
    listener: TcpListener,
    metrics: Arc<M>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let m = Arc::clone(&metrics);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(req, Arc::clone(&m)));
                    if let Err(e) = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await {
                        tracing::debug!("metrics connection: {e}");
                    }
                });
            }
        }
    }
}
