//! The stand-in API server's reads that Explain makes on demand, in the real API's shapes: one
//! pod by name (`GET /api/v1/namespaces/NS/pods/NAME`, 404 when there is none), a namespace's
//! pods (`/api/v1/namespaces/NS/pods`, from the cluster-wide list unless the test serves that
//! collection itself), and Events through both APIs from one store, as the API server keeps them:
//! core/v1 `Event`s put in [`EVENTS`] are served by `/api/v1/namespaces/NS/events` (selected by
//! `involvedObject.*`) and converted to events.k8s.io/v1 (`regarding`, `note`, `deprecated*`) by
//! `/apis/events.k8s.io/v1/namespaces/NS/events` (selected by `regarding.*`). Field selectors are
//! equality terms on the served object's JSON paths (`spec.nodeName=node-a`,
//! `involvedObject.kind=Pod,involvedObject.name=db-0`), as the API server evaluates them.

use std::collections::HashMap;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use crate::kube_mock::{parse_query, reply, ApiServer, Body, Recorded};

/// Where the test puts core/v1 Events (every namespace's).
pub const EVENTS: &str = "/api/v1/events";
/// The cluster-wide pods.
pub const PODS: &str = "/api/v1/pods";

/// `path` in `object` (`a.b.c`), when present.
fn at<'a>(object: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(object, |v, k| &v[k])
}

/// Whether `object` matches every `path=value` term of a field selector (an absent field is "").
pub fn selected(object: &Value, selector: &str) -> bool {
    selector.split(',').filter(|t| !t.is_empty()).all(|term| {
        let (path, want) = term.split_once('=').unwrap_or((term, ""));
        let path = path.trim_end_matches('=');
        let have = at(object, path);
        have.as_str().unwrap_or(if have.is_null() { "" } else { "\u{0}" }) == want
    })
}

/// A core/v1 Event as events.k8s.io/v1 serves it.
pub fn as_events_v1(e: &Value) -> Value {
    let or_null = |k: &str| e.get(k).cloned().unwrap_or(Value::Null);
    let reporting = e["reportingComponent"].as_str().filter(|s| !s.is_empty()).map(Value::from);
    json!({
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": e["metadata"],
        "eventTime": or_null("eventTime"), "series": or_null("series"),
        "reportingController": reporting.unwrap_or_else(|| e["source"]["component"].clone()),
        "reportingInstance": e.get("reportingInstance").cloned().unwrap_or_else(|| e["source"]["host"].clone()),
        "action": or_null("action"), "reason": or_null("reason"), "regarding": or_null("involvedObject"),
        "related": or_null("related"), "note": or_null("message"), "type": or_null("type"),
        "deprecatedSource": or_null("source"), "deprecatedFirstTimestamp": or_null("firstTimestamp"),
        "deprecatedLastTimestamp": or_null("lastTimestamp"), "deprecatedCount": or_null("count"),
    })
}

fn list(api_version: &str, kind: &str, rv: u64, items: Vec<Value>) -> Response<Body> {
    reply(
        StatusCode::OK,
        &json!({"apiVersion": api_version, "kind": kind, "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

fn not_found(what: &str, name: &str) -> Response<Body> {
    reply(
        StatusCode::NOT_FOUND,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": format!("{what} \"{name}\" not found"), "reason": "NotFound",
                "details": {"name": name, "kind": what}, "code": 404}),
    )
}

/// What a read path asks for.
enum Read {
    Pod { ns: String, name: String },
    Pods { ns: String },
    CoreEvents { ns: String },
    NewEvents { ns: String },
}

fn read_of(path: &str, lists: &HashMap<&'static str, Vec<Value>>) -> Option<Read> {
    if lists.contains_key(path) {
        return None; // the test serves it as a collection of its own
    }
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", name] => {
            Some(Read::Pod { ns: (*ns).into(), name: (*name).into() })
        }
        ["api", "v1", "namespaces", ns, "pods"] => Some(Read::Pods { ns: (*ns).into() }),
        ["api", "v1", "namespaces", ns, "events"] => Some(Read::CoreEvents { ns: (*ns).into() }),
        ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"] => {
            Some(Read::NewEvents { ns: (*ns).into() })
        }
        _ => None,
    }
}

/// Serves Explain's reads (see the module docs); anything else goes back to the caller.
pub async fn route(server: &ApiServer, req: Request<Incoming>) -> Result<Response<Body>, Request<Incoming>> {
    let path = req.uri().path().to_owned();
    let read = {
        let st = server.state.lock().expect("state");
        if req.method() != Method::GET || crate::kube_mock::is_watch_query(req.uri().query()) {
            None
        } else {
            read_of(&path, &st.lists)
        }
    };
    let Some(read) = read else { return Err(req) };
    let query = parse_query(req.uri().query().unwrap_or(""));
    let accept =
        req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let _ = req.into_body().collect().await;
    let selector = query.get("fieldSelector").cloned().unwrap_or_default();
    let rec = Recorded {
        method: Method::GET,
        path,
        query,
        content_type: String::new(),
        authorization,
        accept,
        body: Value::Null,
    };
    let mut st = server.state.lock().expect("state");
    st.requests.push(rec);
    let rv = st.rv;
    let in_ns = |o: &&Value, ns: &str| o["metadata"]["namespace"] == json!(ns);
    let response = match read {
        Read::Pod { ns, name } => {
            let found =
                st.lists.get(PODS).into_iter().flatten().find(|p| {
                    p["metadata"]["namespace"] == json!(ns) && p["metadata"]["name"] == json!(name)
                });
            match found {
                Some(p) => reply(StatusCode::OK, p),
                None => not_found("pods", &name),
            }
        }
        Read::Pods { ns } => {
            let items = st
                .lists
                .get(PODS)
                .into_iter()
                .flatten()
                .filter(|p| in_ns(p, &ns))
                .filter(|p| selected(p, &selector));
            list("v1", "PodList", rv, items.cloned().collect())
        }
        Read::CoreEvents { ns } => {
            let items = st
                .lists
                .get(EVENTS)
                .into_iter()
                .flatten()
                .filter(|e| in_ns(e, &ns))
                .filter(|e| selected(e, &selector));
            list("v1", "EventList", rv, items.cloned().collect())
        }
        Read::NewEvents { ns } => {
            let items =
                st.lists.get(EVENTS).into_iter().flatten().filter(|e| in_ns(e, &ns)).map(as_events_v1);
            list("events.k8s.io/v1", "EventList", rv, items.filter(|e| selected(e, &selector)).collect())
        }
    };
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_selectors_and_the_events_v1_shape() {
        let e = json!({"metadata": {"name": "db-0.1", "namespace": "shop", "uid": "u1"},
                       "involvedObject": {"kind": "Pod", "name": "db-0", "namespace": "shop"},
                       "reason": "FailedAttachVolume", "message": "Multi-Attach error", "type": "Warning",
                       "source": {"component": "attachdetach-controller"}, "count": 3,
                       "lastTimestamp": "2026-01-01T00:00:00Z"});
        assert!(selected(&e, "involvedObject.kind=Pod,involvedObject.name=db-0"));
        assert!(!selected(&e, "involvedObject.kind=Pod,involvedObject.name=db-1"));
        let v1 = as_events_v1(&e);
        assert!(selected(&v1, "regarding.kind=Pod,regarding.name=db-0"));
        assert_eq!(
            (v1["note"].as_str(), v1["reportingController"].as_str()),
            (Some("Multi-Attach error"), Some("attachdetach-controller"))
        );
        let typed: k8s_openapi::api::events::v1::Event = serde_json::from_value(v1).expect("the real shape");
        assert_eq!(typed.deprecated_count, Some(3));
    }
}
