//! Following one kind of object: list, then watch from the list's version, relisting after a
//! jittered backoff when the watch breaks; and the periodic lookup of this node's Node.

use super::options::WatchOptions;
use super::report::request;
use super::table::*;
use crate::host::clock::human;
use ::kube::api::{ListParams, WatchEvent, WatchParams};
use ::kube::runtime::watcher::Event;
use ::kube::{Api, Resource};
use k8s_openapi::api::core::v1::Node;
use serde::de::DeserializeOwned;
use std::fmt::Debug;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::StreamExt;

/// Objects a page of a whole collection's list holds.
pub(super) const LIST_PAGE: u32 = 500;

/// The server-side timeout asked of each watch request, as kube-runtime's watcher asks: the API
/// server ends the watch after about this long (jittered), and it is resumed.
pub(super) const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// Follows one collection for as long as anyone listens: list, then watch from the list's
/// resource version, resuming each watch the server ends; after any failure (a list or watch
/// request refused or unanswered within the silence bound, an error in the stream, `410 Gone`,
/// or a stream that hears nothing, not even a bookmark, for the silence bound) the failure is
/// reported first, so that the table stops vouching at once, and the collection is listed again
/// after a backoff.
pub(super) async fn follow<K>(
    kind: Kind,
    api: Api<K>,
    field_selector: Option<String>,
    to_change: impl Fn(Event<K>) -> Change,
    out: mpsc::Sender<Change>,
    options: WatchOptions,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let mut wp = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
    wp.bookmarks = true;
    let lp = match &field_selector {
        // This node's share (its pods): `resourceVersion=0`, from the watch cache, which indexes
        // the field; one small answer.
        Some(f) => {
            wp = wp.fields(f);
            ListParams::default().match_any().fields(f)
        }
        // A whole collection (every PV, every VolumeAttachment: 50,000 each in a large cluster):
        // in pages at the most recent version, the only list the API server pages. From the
        // watch cache it is one answer of about 100 MB, decoded whole, and the agent's memory
        // limit is 128 MiB.
        None => ListParams::default().limit(LIST_PAGE),
    };
    let follower = Follower { kind, api, lp, wp, to_change, out: &out, bound: options.silence_bound };
    let mut delay = options.backoff_initial;
    loop {
        let mut listed_at = None;
        let error = match follower.round(&mut listed_at).await {
            Ended::Broke(error) => error,
            Ended::Closed => return,
        };
        if out.send(Change::Broke(kind, error)).await.is_err() {
            return;
        }
        // Only a watch that held for a while starts the backoff over: one that breaks right
        // after every list must not make every node relist every second.
        if listed_at.is_some_and(|at: tokio::time::Instant| at.elapsed() >= options.backoff_max) {
            delay = options.backoff_initial;
        }
        tokio::time::sleep(jittered(delay)).await;
        delay = delay.saturating_mul(2).min(options.backoff_max).max(options.backoff_initial);
    }
}

/// One collection followed by [`follow`]: how to ask for it and where its changes go.
struct Follower<'a, K, F> {
    kind: Kind,
    api: Api<K>,
    lp: ListParams,
    wp: WatchParams,
    to_change: F,
    out: &'a mpsc::Sender<Change>,
    /// The silence bound: the longest wait for an answer or an event.
    bound: Duration,
}

/// Why a round of listing and watching ended.
enum Ended {
    /// It broke: the failure, reported before the collection is listed again.
    Broke(String),
    /// Nobody listens any more: following ends.
    Closed,
}

impl<K, F> Follower<'_, K, F>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    F: Fn(Event<K>) -> Change,
{
    /// Lists the collection (`listed_at` set once it is), then watches it from the list's
    /// version, resuming from the last one seen each time the server ends the watch at its
    /// timeout, until it breaks.
    async fn round(&self, listed_at: &mut Option<tokio::time::Instant>) -> Ended {
        let mut version = match self.list().await {
            Ok(version) => version,
            Err(ended) => return ended,
        };
        *listed_at = Some(tokio::time::Instant::now());
        loop {
            if let Err(ended) = self.watch(&mut version).await {
                return ended;
            }
        }
    }

    /// Lists the collection, page by page when it is asked in pages, every object sent between
    /// `Init` and `InitDone`: the list's resource version (every page of one list has the
    /// first page's).
    async fn list(&self) -> Result<String, Ended> {
        let (bound, out) = (self.bound, self.out);
        if out.send((self.to_change)(Event::Init)).await.is_err() {
            return Err(Ended::Closed);
        }
        let mut lp = self.lp.clone();
        let version = loop {
            let list = match tokio::time::timeout(bound, self.api.list(&lp)).await {
                Err(_) => {
                    let error =
                        format!("failed to perform initial object list: no answer within {}", human(bound));
                    return Err(Ended::Broke(error));
                }
                Ok(Err(e)) => {
                    return Err(Ended::Broke(format!("failed to perform initial object list: {e}")))
                }
                Ok(Ok(list)) => list,
            };
            let version = list.metadata.resource_version.clone().unwrap_or_default();
            let next = list.metadata.continue_.clone().filter(|c| !c.is_empty());
            for object in list.items {
                if out.send((self.to_change)(Event::InitApply(object))).await.is_err() {
                    return Err(Ended::Closed);
                }
            }
            match next {
                Some(token) => lp.continue_token = Some(token),
                None => break version,
            }
        };
        if out.send((self.to_change)(Event::InitDone)).await.is_err() {
            return Err(Ended::Closed);
        }
        Ok(version)
    }

    /// One watch request from `version` (kept up to date with every event): `Ok` when the
    /// server ends it (its timeout, or a connection closed between events), to be resumed.
    async fn watch(&self, version: &mut String) -> Result<(), Ended> {
        let (kind, bound, out) = (self.kind, self.bound, self.out);
        let stream = match tokio::time::timeout(bound, self.api.watch(&self.wp, version)).await {
            Err(_) => {
                let error = format!("failed to start watching object: no answer within {}", human(bound));
                return Err(Ended::Broke(error));
            }
            Ok(Err(e)) => return Err(Ended::Broke(format!("failed to start watching object: {e}"))),
            Ok(Ok(stream)) => stream,
        };
        if out.send(Change::Heard(kind)).await.is_err() {
            return Err(Ended::Closed);
        }
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = match tokio::time::timeout(bound, stream.next()).await {
                Err(_) => {
                    tracing::warn!(
                        resource = kind.as_str(),
                        silence_bound = %human(bound),
                        "Kubernetes watch heard nothing, not even a bookmark: dropping it and \
                         relisting"
                    );
                    return Err(Ended::Broke(format!(
                        "it heard nothing from the API server for {}, not even a bookmark",
                        human(bound)
                    )));
                }
                // Ended by the server (its timeout, or a connection closed between
                // events): resumed from `version`.
                Ok(None) => return Ok(()),
                Ok(Some(Err(e))) => return Err(Ended::Broke(format!("watch stream failed: {e}"))),
                Ok(Some(Ok(event))) => event,
            };
            let change = self.change(event, version).map_err(Ended::Broke)?;
            if out.send(change).await.is_err() {
                return Err(Ended::Closed);
            }
        }
    }

    /// The change a watch event makes, `version` moved on to the event's; `Err` for an error
    /// event.
    fn change(&self, event: WatchEvent<K>, version: &mut String) -> Result<Change, String> {
        Ok(match event {
            WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                if let Some(v) = o.meta().resource_version.clone() {
                    *version = v;
                }
                (self.to_change)(Event::Apply(o))
            }
            WatchEvent::Deleted(o) => {
                if let Some(v) = o.meta().resource_version.clone() {
                    *version = v;
                }
                (self.to_change)(Event::Delete(o))
            }
            WatchEvent::Bookmark(b) => {
                *version = b.metadata.resource_version;
                Change::Heard(self.kind)
            }
            // 410 Gone (the version is too old) among them: only a relist recovers.
            WatchEvent::Error(status) => {
                return Err(format!(
                    "error returned by apiserver during watch: {} {}: {}",
                    status.code, status.reason, status.message
                ))
            }
        })
    }
}

/// Between half of `d` and all of it.
pub(super) fn jittered(d: Duration) -> Duration {
    use ring::rand::SecureRandom;
    let mut byte = [0u8; 1];
    let fraction = match ring::rand::SystemRandom::new().fill(&mut byte) {
        Ok(()) => f64::from(byte[0]) / 255.0,
        Err(_) => 1.0,
    };
    d.mul_f64(0.5 + fraction / 2.0)
}

/// Looks up the Node every `interval` (the first at once), with the reporter's request timeout.
pub(super) async fn probe_node(api: Api<Node>, node: String, interval: Duration, out: mpsc::Sender<Change>) {
    let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(10)));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let action = format!("get node {node}");
    loop {
        ticks.tick().await;
        let answer = request(&action, api.get_metadata_opt(&node))
            .await
            .map(|found| found.is_some())
            .map_err(|e| e.to_string());
        if out.send(Change::Probe(answer)).await.is_err() {
            return;
        }
    }
}

/// `namespace/name`, or the name of a cluster-scoped object.
pub(super) fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => String::new(),
    }
}

/// Reduces a watcher event to a table operation. An object the filter rejects is removed when
/// applied (harmless if it was never kept) and skipped in a list.
pub(super) fn reduce<K, T>(ev: Event<K>, f: impl Fn(&K) -> Option<T>) -> Op<T>
where
    K: ::kube::Resource,
{
    match ev {
        Event::Apply(o) => match f(&o) {
            Some(info) => Op::Upsert(key(o.meta()), info),
            None => Op::Remove(key(o.meta())),
        },
        Event::Delete(o) => Op::Remove(key(o.meta())),
        Event::InitApply(o) => match f(&o) {
            Some(info) => Op::Listed(key(o.meta()), info),
            None => Op::Skip,
        },
        Event::Init => Op::Begin,
        Event::InitDone => Op::Commit,
    }
}
