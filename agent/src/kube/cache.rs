//! Keeping the [`ClusterView`] current, and knowing when it cannot be trusted.
//!
//! One list-then-watch loop each for this node's pods (field selector `spec.nodeName`),
//! VolumeAttachments (filtered to this node here: the API has no such selector for them) and
//! PersistentVolumes. Lists are served from the API server's watch cache (`resourceVersion=0`,
//! unpaginated), as the kubelet's are: one agent per node must not make every node's relist a
//! quorum read of etcd. Watches ask for bookmarks (`allowWatchBookmarks=true`) and end at the
//! server's timeout (`timeoutSeconds=290`, as kube-runtime's watcher asks).
//!
//! Each watch has its own sign of life: every listed or watched object, completed list, answered
//! watch request and bookmark refreshes that watch's `heard` on `CLOCK_BOOTTIME`, and
//! [`ClusterView::vouch`] refuses as soon as any one watch (or the Node lookup) has not heard from
//! the server within the silence bound, naming it. (One timestamp for the whole API would let a
//! pods watch that stalled without an error ride on the Node lookup's answers for minutes.)
//!
//! A watch that fails in any way is not resumed: its table is marked unsynced at once, the watch
//! is dropped and, after a backoff (doubling, jittered, up to a bound), it lists again. A watch
//! that hears nothing at all (no event, no bookmark) for the silence bound counts as failed: the
//! API server sends bookmarks about once a minute, so its stream is stalled. The table is
//! synced, and its error cleared, only when the relist is complete; no later event can do it. A
//! watch the server simply ends at its timeout is resumed from its resource version, as the API
//! intends; one answered `410 Gone` relists.
//!
//! A fourth task looks up this node's Node every probe interval: whether it exists (a name that
//! matches no Node selects no pods, which must not read as "no pod uses it"), and the Node's own
//! sign of life (`last_contact`).
//!
//! Objects are reduced to their plain data as they arrive. A relist is buffered and swapped in
//! whole when it completes, so the view never shows half a list. Receivers are notified when
//! anything but the contact times changed, or when whether the view vouches did; a bare sign of
//! life is published without notifying.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use ::kube::api::{ListParams, WatchEvent, WatchParams};
use ::kube::runtime::watcher::Event;
use ::kube::{Api, Client, Resource};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use super::cluster::{
    pod_info, pv_info, va_info, ClusterView, PodInfo, PvInfo, VaInfo, WatchHealth, DEFAULT_SILENCE_BOUND,
};
use super::report::request;
use crate::host::clock::{human, BootTime};

/// How often the Node is looked up, how long the API may stay silent, and how watches back off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchOptions {
    /// Between two lookups of this node's Node (each answer is the Node's sign of life).
    /// Default 20 s.
    pub probe_interval: Duration,
    /// The view stops vouching when one watch, or the Node lookup, has not heard from the API
    /// server for longer than this; such a watch is dropped and relisted, and a list or a watch
    /// request not answered within it fails. Default 90 s ([`DEFAULT_SILENCE_BOUND`] says why).
    pub silence_bound: Duration,
    /// The wait before the first relist after a watch breaks. Default 1 s, doubled after every
    /// failed attempt up to [`backoff_max`](Self::backoff_max), and started over once a watch
    /// has held for `backoff_max` after its list; each wait is jittered down by up to half, so
    /// that every node's agent does not relist at the same moment.
    pub backoff_initial: Duration,
    /// The longest wait between two relists. Default 30 s.
    pub backoff_max: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            probe_interval: Duration::from_secs(20),
            silence_bound: DEFAULT_SILENCE_BOUND,
            backoff_initial: Duration::from_secs(1),
            backoff_max: Duration::from_secs(30),
        }
    }
}

impl WatchOptions {
    /// The defaults with another silence bound, the intervals scaled to it: a Node lookup every
    /// quarter of the bound (at most 20 s), relists backing off from an eighth of it (at most
    /// 1 s) up to the bound (at most 30 s).
    pub fn with_silence_bound(bound: Duration) -> Self {
        let d = WatchOptions::default();
        WatchOptions {
            probe_interval: d.probe_interval.min(bound / 4),
            silence_bound: bound,
            backoff_initial: d.backoff_initial.min(bound / 8),
            backoff_max: d.backoff_max.min(bound),
        }
    }
}

/// Starts watching pods on `node_name`, VolumeAttachments and PersistentVolumes, and looking up
/// the Node `node_name`. The receiver starts with an empty, unsynced view naming the node. The
/// task (all four loops run in it) ends when every receiver is gone; abort the handle to stop it
/// sooner.
pub fn spawn_watch(
    client: Client,
    node_name: &str,
    options: WatchOptions,
) -> (watch::Receiver<ClusterView>, JoinHandle<()>) {
    let node = node_name.to_string();
    let state = State::new(options.silence_bound);
    let (tx, rx) = watch::channel(state.view(&node));
    let handle = tokio::spawn(run(client, node, options, state, tx));
    (rx, handle)
}

/// One thing one of the four loops saw, reduced to plain data.
enum Change {
    Pod(Op<PodInfo>),
    Va(Op<VaInfo>),
    Pv(Op<PvInfo>),
    /// A watch failed (and is being dropped); its error.
    Broke(Kind, String),
    /// A watch heard from the API server without a change: its watch request was answered, or
    /// a bookmark arrived.
    Heard(Kind),
    /// A Node lookup: answered (whether the Node exists), or failed (why).
    Probe(Result<bool, String>),
}

impl Change {
    /// The watch this is an answer on, if it is one. `Begin` is not: it is announced before the
    /// list is asked for; nor is a failure.
    fn heard_on(&self) -> Option<Kind> {
        match self {
            Change::Pod(op) => op.is_answer().then_some(Kind::Pods),
            Change::Va(op) => op.is_answer().then_some(Kind::VolumeAttachments),
            Change::Pv(op) => op.is_answer().then_some(Kind::PersistentVolumes),
            Change::Heard(kind) => Some(*kind),
            Change::Broke(..) | Change::Probe(_) => None,
        }
    }
}

/// A watcher event on a table keyed by `namespace/name`.
enum Op<T> {
    /// Added or modified.
    Upsert(String, T),
    /// Deleted, or no longer wanted.
    Remove(String),
    /// A (re)list starts.
    Begin,
    /// One listed object.
    Listed(String, T),
    /// The list is complete.
    Commit,
    /// A listed object that is not wanted.
    Skip,
}

impl<T> Op<T> {
    fn is_answer(&self) -> bool {
        !matches!(self, Op::Begin)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Pods,
    VolumeAttachments,
    PersistentVolumes,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::VolumeAttachments => "volumeattachments",
            Kind::PersistentVolumes => "persistentvolumes",
        }
    }
}

async fn run(
    client: Client,
    node: String,
    options: WatchOptions,
    mut state: State,
    tx: watch::Sender<ClusterView>,
) {
    let node_field = format!("spec.nodeName={node}");
    let (out, mut changes) = mpsc::channel(256);
    let pods = follow(
        Kind::Pods,
        Api::<Pod>::all(client.clone()),
        Some(node_field),
        |ev| Change::Pod(reduce(ev, |p: &Pod| Some(pod_info(p)))),
        out.clone(),
        options,
    );
    let this_node = node.clone();
    let vas = follow(
        Kind::VolumeAttachments,
        Api::<VolumeAttachment>::all(client.clone()),
        None,
        move |ev| {
            Change::Va(reduce(ev, |va: &VolumeAttachment| {
                (va.spec.node_name == this_node).then(|| va_info(va))
            }))
        },
        out.clone(),
        options,
    );
    let pvs = follow(
        Kind::PersistentVolumes,
        Api::<PersistentVolume>::all(client.clone()),
        None,
        |ev| Change::Pv(reduce(ev, |pv: &PersistentVolume| Some(pv_info(pv)))),
        out.clone(),
        options,
    );
    let probe = probe_node(Api::<Node>::all(client), node.clone(), options.probe_interval, out);
    let loops = async {
        tokio::join!(pods, vas, pvs, probe);
    };

    let publish = async {
        while let Some(change) = changes.recv().await {
            let now = BootTime::now();
            if !state.apply(change, now) {
                // Only contact times changed (a bookmark, a lookup's answer, an object of a list
                // still arriving): refreshed in place, without rebuilding the view; readers are
                // woken only when that makes the view vouch again (or stop).
                tx.send_if_modified(|current| {
                    let before = current.vouch(now).is_ok();
                    state.stamp_contact(current);
                    before != current.vouch(now).is_ok()
                });
                continue;
            }
            let view = state.view(&node);
            if view.synced && !tx.borrow().synced {
                tracing::info!(
                    node = %node,
                    pods = view.pods_on_node.len(),
                    volume_attachments = view.volume_attachments.len(),
                    pvs = view.pvs.len(),
                    "Kubernetes view synced"
                );
            }
            tx.send_if_modified(|current| {
                // A bare sign of life wakes nobody, unless it makes the view vouch again.
                let notify =
                    !current.same_evidence(&view) || current.vouch(now).is_ok() != view.vouch(now).is_ok();
                *current = view;
                notify
            });
        }
    };

    tokio::select! {
        () = loops => {}
        () = publish => {}
        () = tx.closed() => {
            tracing::debug!(node = %node, "no reader of the Kubernetes view left; watches and Node lookups stop");
        }
    }
}

/// The server-side timeout asked of each watch request, as kube-runtime's watcher asks: the API
/// server ends the watch after about this long (jittered), and it is resumed.
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// Follows one collection for as long as anyone listens: list, then watch from the list's
/// resource version, resuming each watch the server ends; after any failure (a list or watch
/// request refused or unanswered within the silence bound, an error in the stream, `410 Gone`,
/// or a stream that hears nothing, not even a bookmark, for the silence bound) the failure is
/// reported first, so that the table stops vouching at once, and the collection is listed again
/// after a backoff.
async fn follow<K>(
    kind: Kind,
    api: Api<K>,
    field_selector: Option<String>,
    to_change: impl Fn(Event<K>) -> Change,
    out: mpsc::Sender<Change>,
    options: WatchOptions,
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    // `resourceVersion=0` lists come from the watch cache; unpaginated (a limit would make it a
    // quorum read).
    let mut lp = ListParams::default().match_any();
    let mut wp = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
    wp.bookmarks = true;
    if let Some(f) = &field_selector {
        lp = lp.fields(f);
        wp = wp.fields(f);
    }
    let bound = options.silence_bound;
    let mut delay = options.backoff_initial;
    loop {
        let mut listed_at = None;
        let error = 'watch: {
            if out.send(to_change(Event::Init)).await.is_err() {
                return;
            }
            let list = match tokio::time::timeout(bound, api.list(&lp)).await {
                Err(_) => {
                    break 'watch format!(
                        "failed to perform initial object list: no answer within {}",
                        human(bound)
                    )
                }
                Ok(Err(e)) => break 'watch format!("failed to perform initial object list: {e}"),
                Ok(Ok(list)) => list,
            };
            let mut version = list.metadata.resource_version.clone().unwrap_or_default();
            for object in list.items {
                if out.send(to_change(Event::InitApply(object))).await.is_err() {
                    return;
                }
            }
            if out.send(to_change(Event::InitDone)).await.is_err() {
                return;
            }
            listed_at = Some(tokio::time::Instant::now());
            // Watch from the list's version; resume from the last one seen when the server ends
            // the watch at its timeout.
            loop {
                let stream = match tokio::time::timeout(bound, api.watch(&wp, &version)).await {
                    Err(_) => {
                        break 'watch format!(
                            "failed to start watching object: no answer within {}",
                            human(bound)
                        )
                    }
                    Ok(Err(e)) => break 'watch format!("failed to start watching object: {e}"),
                    Ok(Ok(stream)) => stream,
                };
                if out.send(Change::Heard(kind)).await.is_err() {
                    return;
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
                            break 'watch format!(
                                "it heard nothing from the API server for {}, not even a bookmark",
                                human(bound)
                            );
                        }
                        // Ended by the server (its timeout, or a connection closed between
                        // events): resumed from `version`.
                        Ok(None) => break,
                        Ok(Some(Err(e))) => break 'watch format!("watch stream failed: {e}"),
                        Ok(Some(Ok(event))) => event,
                    };
                    let change = match event {
                        WatchEvent::Added(o) | WatchEvent::Modified(o) => {
                            version = o.meta().resource_version.clone().unwrap_or(version);
                            to_change(Event::Apply(o))
                        }
                        WatchEvent::Deleted(o) => {
                            version = o.meta().resource_version.clone().unwrap_or(version);
                            to_change(Event::Delete(o))
                        }
                        WatchEvent::Bookmark(b) => {
                            version = b.metadata.resource_version;
                            Change::Heard(kind)
                        }
                        // 410 Gone (the version is too old) among them: only a relist recovers.
                        WatchEvent::Error(status) => {
                            break 'watch format!(
                                "error returned by apiserver during watch: {} {}: {}",
                                status.code, status.reason, status.message
                            )
                        }
                    };
                    if out.send(change).await.is_err() {
                        return;
                    }
                }
            }
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

/// Between half of `d` and all of it.
fn jittered(d: Duration) -> Duration {
    use ring::rand::SecureRandom;
    let mut byte = [0u8; 1];
    let fraction = match ring::rand::SystemRandom::new().fill(&mut byte) {
        Ok(()) => f64::from(byte[0]) / 255.0,
        Err(_) => 1.0,
    };
    d.mul_f64(0.5 + fraction / 2.0)
}

/// Looks up the Node every `interval` (the first at once), with the reporter's request timeout.
async fn probe_node(api: Api<Node>, node: String, interval: Duration, out: mpsc::Sender<Change>) {
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
fn key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    match (&meta.namespace, &meta.name) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.clone(),
        _ => String::new(),
    }
}

/// Reduces a watcher event to a table operation. An object the filter rejects is removed when
/// applied (harmless if it was never kept) and skipped in a list.
fn reduce<K, T>(ev: Event<K>, f: impl Fn(&K) -> Option<T>) -> Op<T>
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

/// One watched collection: what is shown, the list being received, and the watch's health.
struct Table<T> {
    kind: Kind,
    live: BTreeMap<String, T>,
    pending: Option<BTreeMap<String, T>>,
    synced: bool,
    error: Option<String>,
    /// When the watch last heard from the API server.
    heard: Option<BootTime>,
}

impl<T> Table<T> {
    fn new(kind: Kind) -> Self {
        Table { kind, live: BTreeMap::new(), pending: None, synced: false, error: None, heard: None }
    }

    /// Applies an operation; true when what is shown may have changed. Only a complete list
    /// makes the table synced and clears its error.
    fn apply(&mut self, op: Op<T>) -> bool {
        match op {
            Op::Upsert(k, v) => {
                self.live.insert(k, v);
                true
            }
            Op::Remove(k) => self.live.remove(&k).is_some(),
            Op::Begin => {
                self.pending = Some(BTreeMap::new());
                false
            }
            Op::Listed(k, v) => {
                self.pending.get_or_insert_with(BTreeMap::new).insert(k, v);
                false
            }
            Op::Commit => {
                self.live = self.pending.take().unwrap_or_default();
                if let Some(error) = self.error.take() {
                    tracing::info!(
                        resource = self.kind.as_str(),
                        after = %error,
                        "Kubernetes watch relisted; its table vouches again"
                    );
                }
                self.synced = true;
                true
            }
            Op::Skip => false,
        }
    }

    /// The watch broke: the table stops vouching (its objects stay, as last seen) and any list
    /// being received is dropped. True when what is shown changed.
    fn fail(&mut self, error: String) -> bool {
        tracing::warn!(
            resource = self.kind.as_str(),
            error = %error,
            "Kubernetes watch failed; its table cannot vouch until it has relisted"
        );
        let changed = self.synced || self.error.as_deref() != Some(error.as_str());
        self.synced = false;
        self.pending = None;
        self.error = Some(error);
        changed
    }

    fn health(&self) -> WatchHealth {
        WatchHealth {
            resource: self.kind.as_str(),
            synced: self.synced,
            error: self.error.clone(),
            heard: self.heard,
        }
    }
}

/// The three tables, and what the Node lookups found.
struct State {
    pods: Table<PodInfo>,
    vas: Table<VaInfo>,
    pvs: Table<PvInfo>,
    node_found: Option<bool>,
    /// The last lookup's failure, until one is answered.
    probe_error: Option<String>,
    /// When a Node lookup was last answered.
    last_contact: Option<BootTime>,
    silence_bound: Duration,
}

impl State {
    fn new(silence_bound: Duration) -> Self {
        State {
            pods: Table::new(Kind::Pods),
            vas: Table::new(Kind::VolumeAttachments),
            pvs: Table::new(Kind::PersistentVolumes),
            node_found: None,
            probe_error: None,
            last_contact: None,
            silence_bound,
        }
    }

    /// Applies a change seen at `now`; true when the view, the contact times aside, may have
    /// changed.
    fn apply(&mut self, change: Change, now: BootTime) -> bool {
        match change.heard_on() {
            Some(Kind::Pods) => self.pods.heard = Some(now),
            Some(Kind::VolumeAttachments) => self.vas.heard = Some(now),
            Some(Kind::PersistentVolumes) => self.pvs.heard = Some(now),
            None => {}
        }
        match change {
            Change::Heard(_) => false,
            Change::Pod(op) => self.pods.apply(op),
            Change::Va(op) => self.vas.apply(op),
            Change::Pv(op) => self.pvs.apply(op),
            Change::Broke(Kind::Pods, e) => self.pods.fail(e),
            Change::Broke(Kind::VolumeAttachments, e) => self.vas.fail(e),
            Change::Broke(Kind::PersistentVolumes, e) => self.pvs.fail(e),
            Change::Probe(Ok(found)) => {
                self.last_contact = Some(now);
                if self.node_found != Some(found) {
                    if found {
                        tracing::info!("this node's Node object exists");
                    } else {
                        tracing::warn!(
                            "no Node object by this node's name: the Kubernetes view cannot vouch for \
                             this node's devices"
                        );
                    }
                }
                let changed = self.node_found != Some(found) || self.probe_error.is_some();
                self.node_found = Some(found);
                self.probe_error = None;
                changed
            }
            Change::Probe(Err(e)) => {
                let changed = self.probe_error.as_deref() != Some(e.as_str());
                if changed {
                    tracing::warn!(error = %e, "Node lookup failed; keeping what the last one found");
                }
                self.probe_error = Some(e);
                changed
            }
        }
    }

    /// Copies the contact times into a view this state made.
    fn stamp_contact(&self, view: &mut ClusterView) {
        view.last_contact = self.last_contact;
        for (w, heard) in view.watches.iter_mut().zip([self.pods.heard, self.vas.heard, self.pvs.heard]) {
            w.heard = heard;
        }
    }

    fn view(&self, node: &str) -> ClusterView {
        let watches = vec![self.pods.health(), self.vas.health(), self.pvs.health()];
        let last_error = watches
            .iter()
            .find_map(|w| w.error.as_ref().map(|e| format!("{}: {e}", w.resource)))
            .or_else(|| self.probe_error.clone());
        let mut view = ClusterView {
            node_name: node.to_string(),
            pods_on_node: self.pods.live.values().cloned().collect(),
            volume_attachments: self.vas.live.values().cloned().collect(),
            pvs: self.pvs.live.values().cloned().collect(),
            synced: watches.iter().all(|w| w.synced),
            watches,
            last_error,
            node_found: self.node_found,
            last_contact: self.last_contact,
            silence_bound: self.silence_bound,
        };
        view.resolve_claims();
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str) -> PodInfo {
        PodInfo { name: name.into(), namespace: "shop".into(), ..Default::default() }
    }

    fn names(t: &Table<PodInfo>) -> Vec<&str> {
        t.live.values().map(|p| p.name.as_str()).collect()
    }

    #[test]
    fn a_table_vouches_only_after_a_complete_list() {
        let mut t = Table::new(Kind::Pods);
        assert!(!t.apply(Op::Begin));
        assert!(!t.apply(Op::Listed("shop/a".into(), pod("a"))));
        assert!(!t.apply(Op::Skip));
        assert!(!t.synced && t.live.is_empty(), "half a list is not shown");
        assert!(t.apply(Op::Commit));
        assert!(t.synced && t.error.is_none());
        assert_eq!(names(&t), ["a"]);
        assert!(t.apply(Op::Upsert("shop/b".into(), pod("b"))));
        assert!(t.apply(Op::Remove("shop/a".into())));
        assert!(!t.apply(Op::Remove("shop/a".into())), "removing what is not there changes nothing");

        // The watch breaks mid-relist: unsynced at once, the objects kept as last seen, the
        // partial list dropped.
        assert!(!t.apply(Op::Begin));
        assert!(!t.apply(Op::Listed("shop/c".into(), pod("c"))));
        assert!(t.fail("watch stream failed: EOF".into()));
        assert!(!t.synced);
        assert_eq!(t.error.as_deref(), Some("watch stream failed: EOF"));
        assert_eq!(names(&t), ["b"]);
        assert!(t.pending.is_none());
        assert!(!t.fail("watch stream failed: EOF".into()), "the same failure again changes nothing");
        assert!(t.fail("failed to perform initial object list: 500".into()), "a new error is shown");

        // A plain event (from anywhere) does not make it vouch again, nor clear the error.
        assert!(t.apply(Op::Upsert("shop/d".into(), pod("d"))));
        assert!(t.apply(Op::Remove("shop/d".into())));
        assert!(!t.synced);
        assert!(t.error.is_some());

        // Only a relist that completes does, and it replaces the table whole.
        t.apply(Op::Begin);
        t.apply(Op::Listed("shop/e".into(), pod("e")));
        assert!(!t.synced && t.error.is_some(), "not before the list is complete");
        assert_eq!(names(&t), ["b"]);
        assert!(t.apply(Op::Commit));
        assert!(t.synced && t.error.is_none());
        assert_eq!(names(&t), ["e"]);
        assert_eq!(t.health(), WatchHealth { resource: "pods", synced: true, error: None, heard: None });
    }

    #[test]
    fn state_view_names_the_broken_watch_and_tracks_contact() {
        let t = |s: u64| BootTime::from_since_boot(Duration::from_secs(s));
        let mut state = State::new(Duration::from_secs(60));
        let view = state.view("node-a");
        assert!(!view.synced && view.watches.len() == 3 && view.last_contact.is_none());
        assert_eq!(view.vouch(t(0)), Err("the pods watch is not synced yet".into()));

        assert!(!state.apply(Change::Pod(Op::Begin), t(1)));
        assert_eq!(state.pods.heard, None, "announcing a list is not an answer");
        for (i, change) in
            [Change::Pod(Op::Commit), Change::Va(Op::Commit), Change::Pv(Op::Commit)].into_iter().enumerate()
        {
            assert!(state.apply(change, t(2 + i as u64)));
        }
        let heard: Vec<_> = state.view("node-a").watches.iter().map(|w| w.heard).collect();
        assert_eq!(heard, [Some(t(2)), Some(t(3)), Some(t(4))], "each watch its own");
        assert_eq!(state.last_contact, None, "a watch's answer is not the Node's");
        assert_eq!(state.view("node-a").vouch(t(4)), Err("the Node lookup has not been answered yet".into()));

        // A failed lookup is recorded but neither desyncs nor counts as contact.
        assert!(state.apply(Change::Probe(Err("get node node-a: timed out".into())), t(5)));
        let view = state.view("node-a");
        assert!(view.synced);
        assert_eq!(view.last_error.as_deref(), Some("get node node-a: timed out"));
        assert_eq!(view.last_contact, None);

        assert!(state.apply(Change::Probe(Ok(false)), t(6)));
        assert_eq!(state.last_contact, Some(t(6)), "a 404 is an answer");
        let view = state.view("node-a");
        assert_eq!((view.node_found, view.last_error.as_deref()), (Some(false), None));
        assert!(view.vouch(t(6)).is_err_and(|e| e.starts_with("no Node named 'node-a'")));
        assert!(state.apply(Change::Probe(Ok(true)), t(7)));
        assert!(!state.apply(Change::Probe(Ok(true)), t(8)), "only the contact time changed");
        assert_eq!(state.last_contact, Some(t(8)));
        assert_eq!(state.view("node-a").vouch(t(62)), Ok(()));
        // The pods watch heard last at 2 s: the first to go silent, and named.
        assert_eq!(
            state.view("node-a").vouch(t(63)),
            Err("the pods watch has not heard from the API server for 1m01s (bound 1m00s): no event, \
                 no bookmark"
                .into())
        );
        // A bookmark (or an answered watch request) is a sign of life, and changes nothing else.
        assert!(!state.apply(Change::Heard(Kind::Pods), t(63)));
        assert_eq!(state.view("node-a").vouch(t(63)), Ok(()));
        assert!(state
            .view("node-a")
            .vouch(t(64))
            .is_err_and(|e| e.starts_with("the volumeattachments watch")));
        for kind in [Kind::VolumeAttachments, Kind::PersistentVolumes] {
            state.apply(Change::Heard(kind), t(64));
        }
        assert!(state
            .view("node-a")
            .vouch(t(69))
            .is_err_and(|e| e.starts_with("the Node lookup has not been answered for 1m01s")));
        assert!(state
            .view("node-a")
            .vouch(t(125))
            .is_err_and(|e| e.starts_with("the Kubernetes API has not answered for 1m01s")));
        state.apply(Change::Probe(Ok(true)), t(9));

        // A broken watch: unsynced, named, and its error wins over a lookup's.
        state.apply(Change::Probe(Err("get node node-a: refused".into())), t(9));
        assert!(state.apply(Change::Broke(Kind::VolumeAttachments, "watch stream failed: EOF".into()), t(9)));
        let view = state.view("node-a");
        assert!(!view.synced);
        assert_eq!(view.last_error.as_deref(), Some("volumeattachments: watch stream failed: EOF"));
        assert_eq!(
            view.vouch(t(9)),
            Err("the volumeattachments watch broke (watch stream failed: EOF): relisting".into())
        );
        state.apply(Change::Va(Op::Upsert("x".into(), VaInfo::default())), t(10));
        assert!(!state.view("node-a").synced, "an event is no relist");
        state.apply(Change::Heard(Kind::VolumeAttachments), t(10));
        assert!(!state.view("node-a").synced, "nor is a bookmark");
        state.apply(Change::Va(Op::Begin), t(11));
        state.apply(Change::Va(Op::Commit), t(12));
        let view = state.view("node-a");
        assert!(view.synced);
        assert_eq!(view.last_error.as_deref(), Some("get node node-a: refused"));
    }
}
