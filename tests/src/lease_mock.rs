//! A stand-in for the API server's `coordination.k8s.io/v1` Leases on 127.0.0.1 (plain HTTP):
//! get, create (409 AlreadyExists when it exists) and replace (409 Conflict unless the body
//! carries the stored `resourceVersion`), as the real API server arbitrates between writers.
//! Everything else answers 404, so a console pointed at it sees no Kubernetes view of volumes,
//! only the Lease. For the tests of the console's apply Lease.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};

/// The Leases by `namespace/name`, each with its resource version.
#[derive(Clone, Default)]
pub struct LeaseServer {
    pub addr: Option<SocketAddr>,
    leases: Arc<Mutex<HashMap<String, Value>>>,
    rv: Arc<Mutex<u64>>,
}

fn reply(status: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("response")
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Full<Bytes>> {
    let body = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
        "reason": reason, "code": code.as_u16()});
    reply(code, body)
}

impl LeaseServer {
    /// Serves on a free loopback port (a task on the current runtime).
    pub async fn start() -> LeaseServer {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let s = LeaseServer { addr: Some(l.local_addr().expect("addr")), ..Default::default() };
        let s2 = s.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = l.accept().await {
                let s = s2.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let s = s.clone();
                        async move { Ok::<_, Infallible>(s.handle(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        s
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr.expect("started"))
    }

    /// The Lease `namespace/name`, as stored.
    pub fn lease(&self, key: &str) -> Option<Value> {
        self.leases.lock().expect("leases").get(key).cloned()
    }

    /// Its `spec.holderIdentity`.
    pub fn holder(&self, key: &str) -> Option<String> {
        self.lease(key).and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_owned();
        let method = req.method().clone();
        let Some(rest) = path.strip_prefix("/apis/coordination.k8s.io/v1/namespaces/") else {
            return status(StatusCode::NOT_FOUND, "NotFound", &format!("{path}: not served here"));
        };
        let body: Value = match req.into_body().collect().await {
            Ok(b) => serde_json::from_slice(&b.to_bytes()).unwrap_or(Value::Null),
            Err(_) => Value::Null,
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let mut leases = self.leases.lock().expect("leases");
        let mut rv = self.rv.lock().expect("rv");
        match (method, parts.as_slice()) {
            (Method::GET, [ns, "leases", name]) => match leases.get(&format!("{ns}/{name}")) {
                Some(l) => reply(StatusCode::OK, l.clone()),
                None => status(StatusCode::NOT_FOUND, "NotFound", &format!("leases \"{name}\" not found")),
            },
            (Method::POST, [ns, "leases"]) => {
                let name = body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let key = format!("{ns}/{name}");
                if leases.contains_key(&key) {
                    return status(
                        StatusCode::CONFLICT,
                        "AlreadyExists",
                        &format!("leases \"{name}\" already exists"),
                    );
                }
                *rv += 1;
                let mut l = body;
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                leases.insert(key, l.clone());
                reply(StatusCode::CREATED, l)
            }
            (Method::PUT, [ns, "leases", name]) => {
                let key = format!("{ns}/{name}");
                let Some(old) = leases.get(&key) else {
                    return status(
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        &format!("leases \"{name}\" not found"),
                    );
                };
                if body["metadata"]["resourceVersion"] != old["metadata"]["resourceVersion"] {
                    return status(
                        StatusCode::CONFLICT,
                        "Conflict",
                        "the object has been modified; please apply your changes to the latest version and try again",
                    );
                }
                *rv += 1;
                let mut l = body;
                l["metadata"]["resourceVersion"] = json!(rv.to_string());
                leases.insert(key, l.clone());
                reply(StatusCode::OK, l)
            }
            _ => status(StatusCode::NOT_FOUND, "NotFound", &format!("{path}: not served here")),
        }
    }
}
