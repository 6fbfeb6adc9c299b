//! The stand-in API server's side of `kubectl port-forward` and of what the kubectl plugin
//! reads through the API ([`crate::kube_mock`] routes to [`route`] first): the `pods/portforward`
//! subresource as kube-apiserver serves it (a WebSocket upgrade, subprotocol
//! `v4.channel.k8s.io`; per port a data channel and an error channel, the first frame of each
//! carrying the port as 2 little-endian bytes, then the data on the data channel and, when the
//! pod's port cannot be reached, the reason on the error channel), forwarding to a real process
//! listening on loopback; single Secrets by name; ConfigMaps by name (get, create, replace: the
//! console publishes its serving CA in one, the plugin reads it); and RBAC refusals (HTTP 403
//! with the API server's Status) for a bearer token on paths containing a string.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_tungstenite::tungstenite::{handshake::derive_accept_key, protocol::Role, Message};
use tokio_tungstenite::WebSocketStream;

use crate::kube_mock::{parse_query, reply, ApiServer, Body, Recorded};

/// The subprotocol served (what kube-rs and kubectl fall back to, with the port frames).
pub const PROTOCOL: &str = "v4.channel.k8s.io";

/// What the plugin's side of the API serves: port-forward targets, Secrets, refusals.
#[derive(Default)]
pub struct Forwards {
    /// (namespace, pod) -> the loopback address its forwarded ports reach.
    pub targets: HashMap<(String, String), SocketAddr>,
    /// (namespace, name) -> the Secret served for `GET .../secrets/NAME`.
    pub secrets: HashMap<(String, String), Value>,
    /// (bearer token, path part): requests with that token on a path containing that part are
    /// refused with 403 Forbidden.
    pub forbidden: Vec<(String, String)>,
    /// (namespace, name) -> the ConfigMap served for `GET .../configmaps/NAME`, created and
    /// replaced through the API.
    pub configmaps: HashMap<(String, String), Value>,
}

impl ApiServer {
    /// Forwards `namespace/pod`'s ports to `to` (a real process on loopback).
    pub fn forward(&self, namespace: &str, pod: &str, to: SocketAddr) {
        self.state.lock().expect("state").forwards.targets.insert((namespace.into(), pod.into()), to);
    }

    /// Serves a TLS Secret (`tls.crt`, `tls.key`, `ca.crt`, PEM) as `namespace/name`.
    pub fn tls_secret(&self, namespace: &str, name: &str, cert: &str, key: &str, ca: &str) {
        let b64 = |s: &str| base64(s.as_bytes());
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": name, "namespace": namespace, "resourceVersion": "31"},
            "data": {"tls.crt": b64(cert), "tls.key": b64(key), "ca.crt": b64(ca)}});
        self.state.lock().expect("state").forwards.secrets.insert((namespace.into(), name.into()), secret);
    }

    /// The ConfigMap `namespace/name` as last written (`None`: there is none).
    pub fn configmap(&self, namespace: &str, name: &str) -> Option<Value> {
        self.state.lock().expect("state").forwards.configmaps.get(&(namespace.into(), name.into())).cloned()
    }

    /// Requests with `Authorization: Bearer token` on a path containing `part` get 403.
    pub fn forbid(&self, token: &str, part: &str) {
        self.state.lock().expect("state").forwards.forbidden.push((token.into(), part.into()));
    }
}

/// Serves the request when it is the plugin's (a refusal, a Secret, a port-forward); gives it
/// back otherwise.
pub async fn route(server: &ApiServer, req: Request<Incoming>) -> Result<Response<Body>, Request<Incoming>> {
    let path = req.uri().path().to_owned();
    let header = |name: hyper::header::HeaderName| {
        req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    let authorization = header(hyper::header::AUTHORIZATION);
    let token = authorization.strip_prefix("Bearer ").unwrap_or("").to_owned();
    let secret = path.strip_prefix("/api/v1/namespaces/").and_then(|p| p.split_once("/secrets/"));
    let configmap = path.strip_prefix("/api/v1/namespaces/").and_then(|p| {
        let (ns, rest) = p.split_once("/configmaps")?;
        Some((ns.to_owned(), rest.strip_prefix('/').unwrap_or(rest).to_owned()))
    });
    let forward = path.strip_prefix("/api/v1/namespaces/").and_then(|p| {
        let (ns, rest) = p.split_once("/pods/")?;
        Some((ns.to_owned(), rest.strip_suffix("/portforward")?.to_owned()))
    });
    let refused = {
        let st = server.state.lock().expect("state");
        st.forwards.forbidden.iter().any(|(t, part)| *t == token && path.contains(part.as_str()))
    };
    if !refused && secret.is_none() && forward.is_none() && configmap.is_none() {
        return Err(req);
    }
    let mut rec = Recorded {
        method: req.method().clone(),
        path: path.clone(),
        query: parse_query(req.uri().query().unwrap_or("")),
        content_type: header(hyper::header::CONTENT_TYPE),
        authorization,
        accept: header(hyper::header::ACCEPT),
        body: Value::Null,
    };
    if let Some((ns, name)) = configmap.filter(|_| !refused) {
        let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        rec.body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        server.state.lock().expect("state").requests.push(rec.clone());
        return Ok(configmaps(server, &rec, &ns, &name));
    }
    server.state.lock().expect("state").requests.push(rec.clone());
    if refused {
        return Ok(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("{path} is forbidden: User \"{token}\" cannot access it"),
        ));
    }
    if let Some((ns, name)) = secret {
        let found =
            server.state.lock().expect("state").forwards.secrets.get(&(ns.into(), name.into())).cloned();
        return Ok(match found {
            Some(s) if rec.method == Method::GET => reply(StatusCode::OK, &s),
            _ => status(StatusCode::NOT_FOUND, "NotFound", &format!("secrets \"{name}\" not found")),
        });
    }
    let Some((ns, pod)) = forward else { return Err(req) };
    Ok(upgrade(server, req, &rec, &ns, &pod))
}

/// `GET .../configmaps/NAME`, `POST .../configmaps`, `PUT .../configmaps/NAME`, as the API
/// server answers them (404, 409 AlreadyExists, a new resourceVersion on every write).
fn configmaps(server: &ApiServer, rec: &Recorded, ns: &str, name: &str) -> Response<Body> {
    let mut st = server.state.lock().expect("state");
    st.rv += 1;
    let rv = st.rv.to_string();
    let maps = &mut st.forwards.configmaps;
    let not_found = || status(StatusCode::NOT_FOUND, "NotFound", &format!("configmaps \"{name}\" not found"));
    let stamped = |body: &Value| {
        let mut cm = body.clone();
        cm["metadata"]["namespace"] = json!(ns);
        cm["metadata"]["resourceVersion"] = json!(rv);
        cm
    };
    match (&rec.method, name) {
        (&Method::GET, n) if !n.is_empty() => match maps.get(&(ns.into(), n.into())) {
            Some(cm) => reply(StatusCode::OK, cm),
            None => not_found(),
        },
        (&Method::POST, "") => {
            let n = rec.body["metadata"]["name"].as_str().unwrap_or_default().to_owned();
            if maps.contains_key(&(ns.into(), n.clone())) {
                return status(
                    StatusCode::CONFLICT,
                    "AlreadyExists",
                    &format!("configmaps \"{n}\" already exists"),
                );
            }
            let cm = stamped(&rec.body);
            maps.insert((ns.into(), n), cm.clone());
            reply(StatusCode::CREATED, &cm)
        }
        (&Method::PUT, n) if !n.is_empty() => {
            if !maps.contains_key(&(ns.into(), n.into())) {
                return not_found();
            }
            let cm = stamped(&rec.body);
            maps.insert((ns.into(), n.into()), cm.clone());
            reply(StatusCode::OK, &cm)
        }
        _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "not served here"),
    }
}

/// The WebSocket upgrade of a port-forward, and the forwarding behind it.
fn upgrade(
    server: &ApiServer,
    req: Request<Incoming>,
    rec: &Recorded,
    ns: &str,
    pod: &str,
) -> Response<Body> {
    let target = server.state.lock().expect("state").forwards.targets.get(&(ns.into(), pod.into())).copied();
    let Some(target) = target else {
        return status(StatusCode::NOT_FOUND, "NotFound", &format!("pods \"{pod}\" not found"));
    };
    let ports: Vec<u16> = rec
        .query
        .get("ports")
        .map(|p| p.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_default();
    let key = req.headers().get(hyper::header::SEC_WEBSOCKET_KEY).map(|k| k.as_bytes().to_vec());
    let offered =
        req.headers().get(hyper::header::SEC_WEBSOCKET_PROTOCOL).and_then(|v| v.to_str().ok()).unwrap_or("");
    let (Some(key), [port]) = (key, ports.as_slice()) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "one port and a WebSocket upgrade are required",
        );
    };
    if !offered.split(',').any(|p| p.trim() == PROTOCOL) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            &format!("subprotocol {PROTOCOL} was not offered"),
        );
    }
    let (port, pod) = (*port, pod.to_owned());
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else { return };
        let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
        pump(ws, port, &pod, target).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(hyper::header::UPGRADE, "websocket")
        .header(hyper::header::CONNECTION, "Upgrade")
        .header(hyper::header::SEC_WEBSOCKET_ACCEPT, derive_accept_key(&key))
        .header(hyper::header::SEC_WEBSOCKET_PROTOCOL, PROTOCOL)
        .body(Full::new(Bytes::new()).map_err(|never: std::convert::Infallible| match never {}).boxed())
        .expect("response")
}

/// The port frames on both channels, then bytes both ways between the data channel and the
/// target; the reason on the error channel when the target cannot be reached.
async fn pump<S>(ws: WebSocketStream<S>, port: u16, pod: &str, target: SocketAddr)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut stream) = ws.split();
    let p = port.to_le_bytes();
    for channel in [0u8, 1] {
        if sink.send(Message::binary(vec![channel, p[0], p[1]])).await.is_err() {
            return;
        }
    }
    let tcp = match tokio::net::TcpStream::connect(target).await {
        Ok(t) => t,
        Err(e) => {
            let mut frame = vec![1u8];
            frame.extend(
                format!(
                    "error forwarding port {port} to pod {pod}: failed to connect to localhost:{port}: {e}"
                )
                .bytes(),
            );
            let _ = sink.send(Message::binary(frame)).await;
            let _ = sink.send(Message::Close(None)).await;
            // The closing handshake, as the API server completes it: the client reads every
            // frame before the connection goes.
            let _ = tokio::time::timeout(Duration::from_secs(5), async {
                while let Some(Ok(_)) = stream.next().await {}
            })
            .await;
            return;
        }
    };
    let (mut from_pod, mut to_pod) = tcp.into_split();
    let up = async {
        while let Some(Ok(msg)) = stream.next().await {
            let data = match &msg {
                Message::Binary(b) if b.len() > 1 && b[0] == 0 => &b[1..],
                Message::Close(_) => break,
                _ => continue,
            };
            if to_pod.write_all(data).await.is_err() {
                break;
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 32 * 1024];
        while let Ok(n) = from_pod.read(&mut buf[1..]).await {
            if n == 0 {
                break;
            }
            if sink.send(Message::binary(buf[..=n].to_vec())).await.is_err() {
                return;
            }
        }
        let _ = sink.send(Message::Close(None)).await;
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// An API server Status reply.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    reply(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

/// Standard base64 with padding (Secrets' `data`, a kubeconfig's `certificate-authority-data`).
pub fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn base64_pads() {
        assert_eq!(super::base64(b"ab"), "YWI=");
        assert_eq!(super::base64(b"abc"), "YWJj");
        assert_eq!(super::base64(b"a"), "YQ==");
        assert_eq!(super::base64(b""), "");
    }
}
