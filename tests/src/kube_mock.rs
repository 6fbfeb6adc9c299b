//! A local stand-in for kube-apiserver on 127.0.0.1 (a real one cannot run on these machines):
//! lists with resource versions, chunked watch streams that close after a while and resume from
//! the last resource version, Node lookups (full or metadata-only, 404 for a name with no Node),
//! Event creation and Node status patches, serving the real API's JSON shapes. Every request is
//! recorded for the assertions. Used by `tests/kube_api.rs`, the daemon's end-to-end tests and the
//! console's (which replaces the collections in [`State::lists`]: agent pods by label, Nodes,
//! PVCs).
//!
//! Faults, for the tests of a view that must stop vouching: lists or watches of a collection
//! answered with HTTP 500 ([`ApiServer::fail_lists`], [`ApiServer::fail_watches`]), open watch
//! responses of a collection cut off mid-stream ([`ApiServer::cut_watches`]), the Node deleted
//! ([`ApiServer::remove_node`]), a server that goes silent: every request and every open
//! watch left hanging, unanswered ([`ApiServer::go_silent`]), and one collection stalled while
//! the rest answer: its open watches stay open and say nothing, not even a bookmark, and its new
//! lists and watches are left hanging ([`ApiServer::stall`]).
//!
//! The kubectl plugin's side (pods/portforward, Secrets, ConfigMaps, RBAC refusals) is in
//! [`crate::kube_portforward`]; TokenReviews and SubjectAccessReviews (what the console asks about
//! its callers) in [`crate::kube_review`]; the objects served, as the API server returns them, in
//! [`crate::kube_objects`].
//!
//! Watches that ask for bookmarks (`allowWatchBookmarks=true`) get one every [`BOOKMARK_EVERY`]
//! while nothing else happens, as the API server's watch cache sends them (about once a
//! minute there).

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{broadcast, watch};
use tokio_stream::wrappers::ReceiverStream;

pub use crate::kube_objects::{node_object, pod, pv, ready_only, volume_attachment};
use crate::kube_reads::PODS;

/// A response body's error: a watch cut off mid-stream.
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;
/// Every response body.
pub type Body = BoxBody<Bytes, BodyError>;

pub const NODE: &str = "node-a";
pub const PV: &str = "pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10";
pub const OTHER_PV: &str = "pvc-77b1d2e3-6c4f-4a5b-8d9e-0f1a2b3c4d5e";
pub const VA: &str = "csi-1f0c7a4e9b2d3c5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d";
pub const OTHER_VA: &str = "csi-9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d";
/// How long a watch response stays open before the server ends it (the API server's
/// `timeoutSeconds`, shortened).
pub const WATCH_HOLD: Duration = Duration::from_millis(1500);
/// How often a quiet watch that asked for bookmarks gets one (the API server: about once a
/// minute).
pub const BOOKMARK_EVERY: Duration = Duration::from_millis(300);
/// Bound on every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(20);

/// One request the server received.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: Method,
    pub path: String,
    pub query: HashMap<String, String>,
    pub content_type: String,
    pub authorization: String,
    pub accept: String,
    pub body: Value,
}

impl Recorded {
    pub fn is_watch(&self) -> bool {
        matches!(self.query.get("watch").map(String::as_str), Some("true" | "1"))
    }
}

/// Server state: the objects per collection, the watch event log and the request log.
pub struct State {
    /// Collection path -> list items.
    pub lists: HashMap<&'static str, Vec<Value>>,
    /// (collection path, resource version, watch event line).
    pub log: Vec<(String, u64, String)>,
    pub rv: u64,
    pub requests: Vec<Recorded>,
    /// The Node object served for `GET .../nodes/<its name>` and `.../status` (`null`: none).
    pub node: Value,
    /// Collections whose lists are answered with HTTP 500.
    pub failing_lists: HashSet<String>,
    /// Collections whose watch requests are answered with HTTP 500.
    pub failing_watches: HashSet<String>,
    /// Collections stalled ([`ApiServer::stall`]).
    pub stalled: HashSet<String>,
    /// The kubectl plugin's side: port-forwards, Secrets, refusals ([`crate::kube_portforward`]).
    pub forwards: crate::kube_portforward::Forwards,
    /// Tokens, users and RBAC for reviews ([`crate::kube_review`]).
    pub reviews: crate::kube_review::Reviews,
    /// The pods' places in `lists["/api/v1/pods"]` by `spec.nodeName`, for a list of the pods on
    /// a node (the API server's watch cache indexes that field): set by whoever fills a large
    /// collection ([`State::index_pods_by_node`]); dropped by a publish that adds or deletes a
    /// pod or moves it to another node, after which such lists scan every pod again.
    pub pods_by_node: Option<HashMap<String, Vec<usize>>>,
}

impl State {
    /// Indexes the pods by node (see [`State::pods_by_node`]).
    pub fn index_pods_by_node(&mut self) {
        let mut by: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, p) in self.lists.get(PODS).into_iter().flatten().enumerate() {
            by.entry(p["spec"]["nodeName"].as_str().unwrap_or("").to_owned()).or_default().push(i);
        }
        self.pods_by_node = Some(by);
    }
}

#[derive(Clone)]
pub struct ApiServer {
    pub addr: SocketAddr,
    pub state: Arc<Mutex<State>>,
    /// Bumped on every new watch event, waking the open watches.
    pub bump: watch::Sender<u64>,
    /// A collection whose open watch responses are to be cut off mid-stream.
    pub cut: broadcast::Sender<String>,
    /// True once the server stops answering.
    pub silent: watch::Sender<bool>,
    pub https: bool,
}

impl ApiServer {
    pub async fn start(node: Value) -> ApiServer {
        Self::start_with(node, None).await
    }

    /// The server behind TLS with this certificate and key (PEM).
    pub async fn start_tls(node: Value, cert: &str, key: &str) -> ApiServer {
        use tokio_rustls::rustls::pki_types::pem::PemObject;
        use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs =
            CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>().expect("cert");
        let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocols")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("server config");
        Self::start_with(node, Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    pub async fn start_with(node: Value, tls: Option<tokio_rustls::TlsAcceptor>) -> ApiServer {
        let mut lists = HashMap::new();
        lists.insert(
            "/api/v1/pods",
            vec![pod("web-0", "Running", "data"), pod("batch-7", "Succeeded", "scratch")],
        );
        lists.insert(
            "/api/v1/persistentvolumes",
            vec![pv(PV, "shop", "data", "csi-vol-5f3c"), pv(OTHER_PV, "logs", "ingest", "csi-vol-9d21")],
        );
        lists.insert(
            "/apis/storage.k8s.io/v1/volumeattachments",
            vec![
                volume_attachment(VA, NODE, PV, true, 90),
                volume_attachment(OTHER_VA, "node-b", OTHER_PV, true, 91),
            ],
        );
        let state = Arc::new(Mutex::new(State {
            lists,
            log: Vec::new(),
            rv: 100,
            requests: Vec::new(),
            node,
            failing_lists: HashSet::new(),
            failing_watches: HashSet::new(),
            stalled: HashSet::new(),
            forwards: Default::default(),
            reviews: Default::default(),
            pods_by_node: None,
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (bump, _) = watch::channel(0);
        let (cut, _) = broadcast::channel(16);
        let (silent, _) = watch::channel(false);
        let server = ApiServer { addr, state, bump, cut, silent, https: false };
        let s = server.clone();
        let https = tls.is_some();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let s = s.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            if let Ok(stream) = acceptor.accept(stream).await {
                                s.serve(stream).await;
                            }
                        }
                        None => s.serve(stream).await,
                    }
                });
            }
        });
        ApiServer { https, ..server }
    }

    pub async fn serve<IO>(self, io: IO)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let svc = hyper::service::service_fn(move |req| {
            let s = self.clone();
            async move { Ok::<_, Infallible>(s.handle(req).await) }
        });
        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), svc);
        let _ = conn.with_upgrades().await;
    }

    pub fn url(&self) -> String {
        format!("{}://{}", if self.https { "https" } else { "http" }, self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").requests.clone()
    }

    /// The core/v1 Events posted so far, each with the namespace of the path it was posted to,
    /// as k8s-openapi's type (a body the real API would not take as an Event panics here).
    pub fn events(&self) -> Vec<(String, k8s_openapi::api::core::v1::Event)> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == Method::POST && r.path.ends_with("/events"))
            .map(|r| {
                let ns =
                    r.path.trim_start_matches("/api/v1/namespaces/").trim_end_matches("/events").to_owned();
                let event: k8s_openapi::api::core::v1::Event = serde_json::from_value(r.body.clone())
                    .unwrap_or_else(|e| panic!("not a core/v1 Event ({e}): {}", r.body));
                (ns, event)
            })
            .collect()
    }

    /// The Node status conditions of type `type_` the patches sent so far set, in order.
    pub fn condition_patches(&self, type_: &str) -> Vec<Value> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == Method::PATCH && r.path.ends_with("/status"))
            .filter_map(|r| {
                r.body["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_).cloned()
            })
            .collect()
    }

    /// Lists of `collection` answer HTTP 500 (`on`) or are served again.
    pub fn fail_lists(&self, collection: &str, on: bool) {
        let mut st = self.state.lock().expect("state");
        if on {
            st.failing_lists.insert(collection.to_string());
        } else {
            st.failing_lists.remove(collection);
        }
    }

    /// Watch requests on `collection` answer HTTP 500 (`on`) or are served again. Open watches
    /// are not affected.
    pub fn fail_watches(&self, collection: &str, on: bool) {
        let mut st = self.state.lock().expect("state");
        if on {
            st.failing_watches.insert(collection.to_string());
        } else {
            st.failing_watches.remove(collection);
        }
    }

    /// Cuts every open watch response on `collection` off mid-stream: the connection closes
    /// without the chunked body's end, as when the API server or a proxy in between dies. (kube
    /// takes that for a watch that ended, and resumes it from its resource version.)
    pub fn cut_watches(&self, collection: &str) {
        let _ = self.cut.send(collection.to_string());
    }

    /// Stalls `collection` (`on`) or lets it answer again: while stalled, its open watches stay
    /// open past their timeout and send nothing, not even a bookmark (as a half-open connection
    /// or a stuck proxy would), and its new lists and watches are left hanging; every other
    /// collection and the Node answer as usual. Once it answers again, open watches go on.
    pub fn stall(&self, collection: &str, on: bool) {
        let mut st = self.state.lock().expect("state");
        if on {
            st.stalled.insert(collection.to_string());
        } else {
            st.stalled.remove(collection);
        }
    }

    fn is_stalled(state: &Mutex<State>, collection: &str) -> bool {
        state.lock().expect("state").stalled.contains(collection)
    }

    /// Deletes the Node: looking it up answers 404 from now on.
    pub fn remove_node(&self) {
        self.state.lock().expect("state").node = Value::Null;
    }

    /// From now on nothing is answered: requests are recorded and left hanging, open watches
    /// send nothing more and stay open, as behind a network partition.
    pub fn go_silent(&self) {
        self.silent.send_replace(true);
    }

    /// Appends a watch event (`ADDED`, `MODIFIED`, `DELETED`) for a collection, stamping the
    /// object with the next resource version, and applies it to what lists of the collection
    /// return from now on (a changed object keeps its place in the list, as in the API server's
    /// key order; a new one comes last).
    pub fn publish(&self, collection: &str, kind: &str, mut object: Value) {
        let mut st = self.state.lock().expect("state");
        st.rv += 1;
        let rv = st.rv;
        object["metadata"]["resourceVersion"] = json!(rv.to_string());
        let same = |o: &Value| {
            o["metadata"]["name"] == object["metadata"]["name"]
                && o["metadata"]["namespace"] == object["metadata"]["namespace"]
        };
        let mut index_holds = true;
        if let Some(items) = st.lists.get_mut(collection) {
            match (items.iter().position(same), kind) {
                (Some(i), "DELETED") => {
                    items.remove(i);
                    index_holds = false;
                }
                (Some(i), _) => {
                    index_holds = items[i]["spec"]["nodeName"] == object["spec"]["nodeName"];
                    items[i] = object.clone();
                }
                (None, "DELETED") => {}
                (None, _) => {
                    items.push(object.clone());
                    index_holds = false;
                }
            }
        }
        if collection == PODS && !index_holds {
            st.pods_by_node = None;
        }
        let line = json!({"type": kind, "object": object}).to_string();
        st.log.push((collection.to_string(), rv, line));
        drop(st);
        self.bump.send_replace(rv);
    }

    pub async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        let req = match crate::kube_review::route(self, req).await {
            Ok(served) => return served,
            Err(req) => req,
        };
        let req = match crate::kube_portforward::route(self, req).await {
            Ok(served) => return served,
            Err(req) => req,
        };
        let req = match crate::kube_reads::route(self, req).await {
            Ok(served) => return served,
            Err(req) => req,
        };
        let method = req.method().clone();
        let path = req.uri().path().to_string();
        let query = parse_query(req.uri().query().unwrap_or(""));
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let authorization = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let accept =
            req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
        let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let rec = Recorded {
            method: method.clone(),
            path: path.clone(),
            query,
            content_type,
            authorization,
            accept,
            body,
        };
        self.state.lock().expect("state").requests.push(rec.clone());
        if *self.silent.borrow() {
            std::future::pending::<()>().await;
        }

        let node_status = format!("/api/v1/nodes/{NODE}/status");
        match (&method, path.as_str()) {
            (&Method::GET, p) if self.state.lock().expect("state").lists.contains_key(p) => {
                while Self::is_stalled(&self.state, p) {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                let st = self.state.lock().expect("state");
                let failing = if rec.is_watch() { &st.failing_watches } else { &st.failing_lists };
                if failing.contains(p) {
                    drop(st);
                    return internal_error(&format!("etcdserver: request timed out ({p})"));
                }
                drop(st);
                if rec.is_watch() {
                    self.watch(p, &rec)
                } else {
                    self.list(p, &rec)
                }
            }
            (&Method::GET, p) if p.strip_prefix("/api/v1/nodes/").is_some_and(|n| !n.contains('/')) => {
                let name = &p["/api/v1/nodes/".len()..];
                let node = self.state.lock().expect("state").node.clone();
                if node["metadata"]["name"] != json!(name) {
                    return reply(
                        StatusCode::NOT_FOUND,
                        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                                "message": format!("nodes \"{name}\" not found"), "reason": "NotFound",
                                "details": {"name": name, "kind": "nodes"}, "code": 404}),
                    );
                }
                if rec.accept.contains("as=PartialObjectMetadata") {
                    let meta = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                      "metadata": node["metadata"]});
                    reply(StatusCode::OK, &meta)
                } else {
                    reply(StatusCode::OK, &node)
                }
            }
            // Events in any namespace (a Node's and a PV's in `default`, a PVC's or a pod's in its
            // own), as the API server takes them: in the namespace of the path.
            (&Method::POST, p)
                if p.strip_prefix("/api/v1/namespaces/")
                    .and_then(|r| r.strip_suffix("/events"))
                    .is_some_and(|ns| !ns.is_empty() && !ns.contains('/')) =>
            {
                let mut created = rec.body.clone();
                created["metadata"]["uid"] = json!("0c6b1f0e-event");
                created["metadata"]["resourceVersion"] = json!("555");
                reply(StatusCode::CREATED, &created)
            }
            (&Method::GET, p) if p == node_status => {
                let node = self.state.lock().expect("state").node.clone();
                reply(StatusCode::OK, &node)
            }
            (&Method::PATCH, p) if p == node_status => {
                let node = self.state.lock().expect("state").node.clone();
                reply(StatusCode::OK, &node)
            }
            _ => reply(
                StatusCode::NOT_FOUND,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": format!("the server could not find the requested resource ({path})"),
                        "reason": "NotFound", "code": 404}),
            ),
        }
    }

    /// A list of `collection`, filtered by the request's field (`spec.nodeName=`) and label
    /// selectors, paged as the API server pages it: a list at the most recent version (no
    /// `resourceVersion`, or an empty one) honours `limit` with a `continue` token (here an
    /// offset into the collection); a list at a given version (`resourceVersion=0`, what
    /// informers ask) is answered from the watch cache in one piece, `limit` ignored. Serialized
    /// from the kept objects without copying the collection (100,000 pods are hundreds of MB).
    pub fn list(&self, collection: &str, rec: &Recorded) -> Response<Body> {
        let st = self.state.lock().expect("state");
        let node = rec.query.get("fieldSelector").map(|sel| {
            // The only field selector the agent and the console use here.
            json!(sel.strip_prefix("spec.nodeName=").expect("spec.nodeName selector"))
        });
        let labels: Vec<(&str, Value)> = rec
            .query
            .get("labelSelector")
            .into_iter()
            .flat_map(|sel| sel.split(',').filter(|t| !t.is_empty()))
            .map(|term| {
                // Equality selectors (`a=b,c=d`), what the console uses.
                let (k, v) = term.split_once('=').expect("equality label selector");
                (k, json!(v))
            })
            .collect();
        let kind = match collection.rsplit('/').next().unwrap_or("") {
            "pods" => ("v1", "PodList"),
            "persistentvolumes" => ("v1", "PersistentVolumeList"),
            "persistentvolumeclaims" => ("v1", "PersistentVolumeClaimList"),
            "nodes" => ("v1", "NodeList"),
            _ => ("storage.k8s.io/v1", "VolumeAttachmentList"),
        };
        let from: usize = rec.query.get("continue").and_then(|c| c.parse().ok()).unwrap_or(0);
        let from_cache = rec.query.get("resourceVersion").is_some_and(|v| !v.is_empty());
        let limit = rec.query.get("limit").and_then(|l| l.parse().ok()).filter(|_| !from_cache);
        let all = st.lists.get(collection).map_or(0, Vec::len);
        let to = limit.map_or(all, |l: usize| (from + l).min(all));
        let mut meta = json!({"resourceVersion": st.rv.to_string()});
        if to < all {
            meta["continue"] = json!(to.to_string());
        }
        let head = json!({"apiVersion": kind.0, "kind": kind.1, "metadata": meta});
        let mut text = head.to_string();
        text.pop(); // the closing brace
        text.push_str(",\"items\":[");
        let page = st.lists.get(collection).map_or(&[][..], |l| &l[from.min(all)..to]);
        let indexed: Option<Vec<&Value>> = match (&node, &st.pods_by_node) {
            (Some(n), Some(by)) if collection == PODS && limit.is_none() => Some(
                by.get(n.as_str().unwrap_or("")).into_iter().flatten().filter_map(|i| page.get(*i)).collect(),
            ),
            _ => None,
        };
        let candidates: Box<dyn Iterator<Item = &Value>> = match indexed {
            Some(v) => Box::new(v.into_iter()),
            None => Box::new(page.iter()),
        };
        let selected = candidates.filter(|i| {
            node.as_ref().is_none_or(|n| &i["spec"]["nodeName"] == n)
                && labels.iter().all(|(k, v)| &i["metadata"]["labels"][k] == v)
        });
        for (n, item) in selected.enumerate() {
            if n > 0 {
                text.push(',');
            }
            text.push_str(&item.to_string());
        }
        text.push_str("]}");
        drop(st);
        Response::builder()
            .status(StatusCode::OK)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(text)).map_err(|never: Infallible| match never {}).boxed())
            .expect("response")
    }

    /// A chunked stream of watch events newer than the request's resource version, open for
    /// [`WATCH_HOLD`], then closed as the API server closes a watch at its timeout; with a
    /// bookmark every [`BOOKMARK_EVERY`] when the request asked for them; cut off mid-stream by
    /// [`Self::cut_watches`], left hanging by [`Self::go_silent`], quiet while
    /// [`Self::stall`]ed.
    pub fn watch(&self, collection: &str, rec: &Recorded) -> Response<Body> {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BodyError>>(16);
        let mut from: u64 = rec.query.get("resourceVersion").and_then(|v| v.parse().ok()).unwrap_or(0);
        let bookmarks = rec.query.get("allowWatchBookmarks").is_some_and(|v| v == "true");
        let collection = collection.to_string();
        let state = self.state.clone();
        let mut bumped = self.bump.subscribe();
        let mut cut = self.cut.subscribe();
        let mut silent = self.silent.subscribe();
        tokio::spawn(async move {
            let mut deadline = tokio::time::Instant::now() + WATCH_HOLD;
            let mut next_bookmark = tokio::time::Instant::now() + BOOKMARK_EVERY;
            loop {
                if *silent.borrow_and_update() {
                    std::future::pending::<()>().await;
                }
                if Self::is_stalled(&state, &collection) {
                    // Open, and saying nothing, for as long as the stall lasts.
                    while Self::is_stalled(&state, &collection) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    deadline = tokio::time::Instant::now() + WATCH_HOLD;
                    next_bookmark = tokio::time::Instant::now() + BOOKMARK_EVERY;
                }
                let lines: Vec<(u64, String)> = state
                    .lock()
                    .expect("state")
                    .log
                    .iter()
                    .filter(|(c, rv, _)| *c == collection && *rv > from)
                    .map(|(_, rv, l)| (*rv, format!("{l}\n")))
                    .collect();
                for (rv, line) in lines {
                    from = rv;
                    if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                        return;
                    }
                }
                if bookmarks && tokio::time::Instant::now() >= next_bookmark {
                    next_bookmark = tokio::time::Instant::now() + BOOKMARK_EVERY;
                    let line = format!("{}\n", bookmark(&collection, from));
                    if tx.send(Ok(Frame::data(Bytes::from(line)))).await.is_err() {
                        return;
                    }
                }
                let wake = if bookmarks { deadline.min(next_bookmark) } else { deadline };
                tokio::select! {
                    bump = tokio::time::timeout_at(wake, bumped.changed()) => match bump {
                        Ok(Ok(())) => continue,
                        Ok(Err(_)) => return, // server gone
                        Err(_) if tokio::time::Instant::now() >= deadline
                            && !Self::is_stalled(&state, &collection) => return, // hold over
                        Err(_) => continue, // a bookmark is due, or stalled past the hold
                    },
                    which = cut.recv() => {
                        if which.is_ok_and(|c| c == collection) {
                            let _ = tx.send(Err(format!("watch on {collection} cut off").into())).await;
                            return;
                        }
                    }
                    _ = silent.changed() => {}
                }
            }
        });
        let body = StreamBody::new(ReceiverStream::new(rx)).boxed();
        Response::builder()
            .status(StatusCode::OK)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(body)
            .expect("response")
    }
}

/// A watch bookmark for `collection` at resource version `rv`, as the API server sends it.
pub fn bookmark(collection: &str, rv: u64) -> Value {
    let (api_version, kind) = match collection.rsplit('/').next().unwrap_or("") {
        "pods" => ("v1", "Pod"),
        "persistentvolumes" => ("v1", "PersistentVolume"),
        "persistentvolumeclaims" => ("v1", "PersistentVolumeClaim"),
        "nodes" => ("v1", "Node"),
        _ => ("storage.k8s.io/v1", "VolumeAttachment"),
    };
    json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version,
           "metadata": {"resourceVersion": rv.to_string(),
                        "annotations": {"k8s.io/initial-events-end": "false"}}}})
}

pub fn reply(status: StatusCode, body: &Value) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())).map_err(|never: Infallible| match never {}).boxed())
        .expect("response")
}

/// HTTP 500 with the API server's Status body.
pub fn internal_error(message: &str) -> Response<Body> {
    reply(
        StatusCode::INTERNAL_SERVER_ERROR,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": "InternalError", "code": 500}),
    )
}

/// Whether a request's query asks for a watch (`watch=1` or `watch=true`).
pub fn is_watch_query(query: Option<&str>) -> bool {
    matches!(parse_query(query.unwrap_or("")).get("watch").map(String::as_str), Some("true" | "1"))
}

/// `a=b&c=d%3De` into a map, percent-decoded (`+` as space).
pub fn parse_query(q: &str) -> HashMap<String, String> {
    pub fn decode(s: &str) -> String {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            match b[i] {
                b'%' if i + 2 < b.len() => {
                    let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                    match u8::from_str_radix(hex, 16) {
                        Ok(v) => {
                            out.push(v);
                            i += 3;
                            continue;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b'+' => out.push(b' '),
                c => out.push(c),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (decode(k), decode(v))
        })
        .collect()
}
