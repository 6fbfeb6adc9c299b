//! Keeping the [`ClusterView`] current: one `kube::runtime` watcher each for this node's pods
//! (field selector `spec.nodeName`), VolumeAttachments (filtered to this node here: the API has no
//! such selector for them) and PersistentVolumes, each with the default backoff. Lists are served
//! from the API server's watch cache (`resourceVersion=0`, unpaginated), as the kubelet's are: one
//! agent per node must not make every node's relist a quorum read of etcd.
//!
//! Objects are reduced to their plain data as they arrive. A relist is buffered and swapped in
//! whole when it completes, so the view never shows half a list; the view is published only when
//! it changed.

use std::collections::BTreeMap;

use ::kube::runtime::watcher::{self, Event};
use ::kube::runtime::WatchStreamExt;
use ::kube::{Api, Client};
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;

use super::view::{pod_info, pv_info, va_info, ClusterView, PodInfo, PvInfo, VaInfo};

/// Starts watching pods on `node_name`, VolumeAttachments and PersistentVolumes. The receiver
/// starts with an empty, unsynced view naming the node. The task ends when every receiver is gone
/// (checked as changes arrive); abort the handle to stop it sooner.
pub fn spawn_watch(client: Client, node_name: &str) -> (watch::Receiver<ClusterView>, JoinHandle<()>) {
    let node = node_name.to_string();
    let (tx, rx) = watch::channel(ClusterView { node_name: node.clone(), ..Default::default() });
    let handle = tokio::spawn(run(client, node, tx));
    (rx, handle)
}

/// One change from one of the three watches, reduced to plain data.
enum Change {
    Pod(Op<PodInfo>),
    Va(Op<VaInfo>),
    Pv(Op<PvInfo>),
    Failed(Kind, String),
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

#[derive(Clone, Copy, Debug)]
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

async fn run(client: Client, node: String, tx: watch::Sender<ClusterView>) {
    // `resourceVersion=0` lists come from the watch cache; kube drops it when a page size is set.
    let mut config = watcher::Config::default().any_semantic();
    config.page_size = None;
    let pods = watcher::watcher(
        Api::<Pod>::all(client.clone()),
        config.clone().fields(&format!("spec.nodeName={node}")),
    )
    .default_backoff()
    .map(|r| match r {
        Ok(ev) => Change::Pod(reduce(ev, |p: &Pod| Some(pod_info(p)))),
        Err(e) => Change::Failed(Kind::Pods, e.to_string()),
    });
    let this_node = node.clone();
    let vas = watcher::watcher(Api::<VolumeAttachment>::all(client.clone()), config.clone())
        .default_backoff()
        .map(move |r| match r {
            Ok(ev) => Change::Va(reduce(ev, |va: &VolumeAttachment| {
                (va.spec.node_name == this_node).then(|| va_info(va))
            })),
            Err(e) => Change::Failed(Kind::VolumeAttachments, e.to_string()),
        });
    let pvs =
        watcher::watcher(Api::<PersistentVolume>::all(client), config).default_backoff().map(|r| match r {
            Ok(ev) => Change::Pv(reduce(ev, |pv: &PersistentVolume| Some(pv_info(pv)))),
            Err(e) => Change::Failed(Kind::PersistentVolumes, e.to_string()),
        });
    let mut changes = std::pin::pin!(pods.merge(vas).merge(pvs));

    let mut state = State::default();
    while let Some(change) = changes.next().await {
        if !state.apply(change) {
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
            if *current == view {
                false
            } else {
                *current = view;
                true
            }
        });
        if tx.is_closed() {
            tracing::debug!(node = %node, "no reader of the Kubernetes view left; watches stop");
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
    live: BTreeMap<String, T>,
    pending: Option<BTreeMap<String, T>>,
    synced: bool,
    error: Option<String>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table { live: BTreeMap::new(), pending: None, synced: false, error: None }
    }
}

impl<T> Table<T> {
    /// Applies an operation; true when what is shown may have changed.
    fn apply(&mut self, op: Op<T>) -> bool {
        let recovered = self.error.take().is_some();
        let changed = match op {
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
                self.synced = true;
                true
            }
            Op::Skip => false,
        };
        changed || recovered
    }

    fn fail(&mut self, kind: Kind, error: String) -> bool {
        tracing::warn!(resource = kind.as_str(), error = %error, "Kubernetes watch failed; backing off");
        let error = Some(format!("{}: {error}", kind.as_str()));
        let changed = self.error != error;
        self.error = error;
        changed
    }
}

/// The three tables.
#[derive(Default)]
struct State {
    pods: Table<PodInfo>,
    vas: Table<VaInfo>,
    pvs: Table<PvInfo>,
}

impl State {
    /// Applies a change; true when the view may have changed.
    fn apply(&mut self, change: Change) -> bool {
        match change {
            Change::Pod(op) => self.pods.apply(op),
            Change::Va(op) => self.vas.apply(op),
            Change::Pv(op) => self.pvs.apply(op),
            Change::Failed(Kind::Pods, e) => self.pods.fail(Kind::Pods, e),
            Change::Failed(Kind::VolumeAttachments, e) => self.vas.fail(Kind::VolumeAttachments, e),
            Change::Failed(Kind::PersistentVolumes, e) => self.pvs.fail(Kind::PersistentVolumes, e),
        }
    }

    fn view(&self, node: &str) -> ClusterView {
        let mut view = ClusterView {
            node_name: node.to_string(),
            pods_on_node: self.pods.live.values().cloned().collect(),
            volume_attachments: self.vas.live.values().cloned().collect(),
            pvs: self.pvs.live.values().cloned().collect(),
            synced: self.pods.synced && self.vas.synced && self.pvs.synced,
            last_error: [&self.pods.error, &self.vas.error, &self.pvs.error]
                .into_iter()
                .flatten()
                .next()
                .cloned(),
        };
        view.resolve_claims();
        view
    }
}
