//! What Explain reads from the Kubernetes API on demand (the console watches Nodes, PVs, PVCs,
//! VolumeAttachments and the pods with a volume that may be a block device, not events or other
//! pods): a pod it does not keep; its events from both APIs (core/v1 by `involvedObject`,
//! events.k8s.io/v1 by `regarding`; the API server keeps one Event and serves it through both, so
//! each is kept once, by uid); the pods on a node (a holder's pod, by field selector
//! `spec.nodeName`); the pods of a namespace that claim a PVC while the pods' table is not synced.
//! Every read has a deadline and runs on the runtime as the client's own I/O (nothing blocks a
//! worker); a read that fails is said, never taken for "none".

use std::collections::HashSet;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::{Event as CoreEvent, Pod};
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::api::{Api, ListParams};
use kube::Client;

/// A read bounded by `timeout`, its error in words.
async fn bounded<T>(
    timeout: Duration,
    what: &str,
    f: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("cannot {what}: {}", blockjanitor_rpc::client::error_chain(&e))),
        Err(_) => Err(format!("cannot {what}: no answer within {timeout:?}")),
    }
}

/// The pod (`None`: it does not exist).
pub async fn pod(client: &Client, timeout: Duration, ns: &str, name: &str) -> Result<Option<Pod>, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    bounded(timeout, &format!("read pod {ns}/{name}"), api.get_opt(name)).await
}

/// The pods on `node`.
pub async fn pods_on(client: &Client, timeout: Duration, node: &str) -> Result<Vec<Pod>, String> {
    let api: Api<Pod> = Api::all(client.clone());
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    bounded(timeout, &format!("list the pods on node {node}"), api.list(&lp)).await.map(|l| l.items)
}

/// The pods of `ns` that use claim `claim`.
pub async fn pods_claiming(
    client: &Client,
    timeout: Duration,
    ns: &str,
    claim: &str,
) -> Result<Vec<Pod>, String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list =
        bounded(timeout, &format!("list the pods of namespace {ns}"), api.list(&ListParams::default()))
            .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            p.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                v.persistent_volume_claim.as_ref().is_some_and(|c| c.claim_name == claim)
                    || (v.ephemeral.is_some() && format!("{name}-{}", v.name) == claim)
            })
        })
        .collect())
}

fn micro(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

fn time(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

fn from_core(e: CoreEvent) -> pb::ExplainEvent {
    let last = e
        .series
        .as_ref()
        .and_then(|s| s.last_observed_time.as_ref().map(micro))
        .or(e.last_timestamp.as_ref().map(time))
        .or(e.event_time.as_ref().map(micro))
        .unwrap_or(0.0);
    pb::ExplainEvent {
        api: "core/v1".into(),
        r#type: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        message: e.message.unwrap_or_default(),
        count: e.series.as_ref().and_then(|s| s.count).or(e.count).unwrap_or(1),
        last_unix_seconds: last,
        reporter: e
            .reporting_component
            .filter(|r| !r.is_empty())
            .or(e.source.and_then(|s| s.component))
            .unwrap_or_default(),
    }
}

fn from_new(e: NewEvent) -> pb::ExplainEvent {
    let last = e
        .series
        .as_ref()
        .map(|s| micro(&s.last_observed_time))
        .or(e.deprecated_last_timestamp.as_ref().map(time))
        .or(e.event_time.as_ref().map(micro))
        .unwrap_or(0.0);
    pb::ExplainEvent {
        api: "events.k8s.io/v1".into(),
        r#type: e.type_.unwrap_or_default(),
        reason: e.reason.unwrap_or_default(),
        message: e.note.unwrap_or_default(),
        count: e.series.as_ref().map(|s| s.count).or(e.deprecated_count).unwrap_or(1),
        last_unix_seconds: last,
        reporter: e.reporting_controller.unwrap_or_default(),
    }
}

/// The events about object `kind`/`name` in `ns` (cluster-scoped objects' events are in
/// `default`), newest first, each once; and what could not be read ("" when both were).
pub async fn events(
    client: &Client,
    timeout: Duration,
    ns: &str,
    kind: &str,
    name: &str,
) -> (Vec<pb::ExplainEvent>, String) {
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), ns);
    let new: Api<NewEvent> = Api::namespaced(client.clone(), ns);
    let core_lp =
        ListParams::default().fields(&format!("involvedObject.kind={kind},involvedObject.name={name}"));
    let new_lp = ListParams::default().fields(&format!("regarding.kind={kind},regarding.name={name}"));
    let (a, b) = tokio::join!(
        bounded(timeout, "list core/v1 events", core.list(&core_lp)),
        bounded(timeout, "list events.k8s.io/v1 events", new.list(&new_lp)),
    );
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut errors = Vec::new();
    match a {
        Ok(l) => {
            for e in l.items {
                if seen.insert(e.metadata.uid.clone().unwrap_or_default()) {
                    out.push(from_core(e));
                }
            }
        }
        Err(e) => errors.push(e),
    }
    match b {
        Ok(l) => {
            for e in l.items {
                let uid = e.metadata.uid.clone().unwrap_or_default();
                if uid.is_empty() || seen.insert(uid) {
                    out.push(from_new(e));
                }
            }
        }
        Err(e) => errors.push(e),
    }
    out.sort_by(|x, y| y.last_unix_seconds.total_cmp(&x.last_unix_seconds));
    (out, errors.join("; "))
}
