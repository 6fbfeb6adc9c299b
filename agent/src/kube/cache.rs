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

use ::kube::{Api, Client};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::cluster::ClusterView;
use super::follow::*;
use super::options::WatchOptions;
use super::reduce::{pod_info, pv_info, va_info};
use super::table::*;
use crate::host::clock::BootTime;

/// Starts watching pods on `node_name`, VolumeAttachments and PersistentVolumes, and looking up
/// the Node `node_name`. The receiver starts with an empty, unsynced view naming the node. The
/// task (all four loops run in it) ends when every receiver is gone; abort the handle to stop it
/// sooner.
pub fn spawn_watch(
    client: Client,
    node_name: &str,
    options: WatchOptions,
) -> (watch::Receiver<ClusterView>, JoinHandle<()>) {
    let (tx, rx) = watch::channel(State::new(options.silence_bound).view(node_name));
    (rx, watch_into(client, node_name, options, tx))
}

/// Like [`spawn_watch`], publishing into a channel the caller already hands out (what
/// [`super::source`] does once a connection that failed comes up): its view is replaced at once
/// by an empty, unsynced one naming the node.
pub fn watch_into(
    client: Client,
    node_name: &str,
    options: WatchOptions,
    tx: watch::Sender<ClusterView>,
) -> JoinHandle<()> {
    let node = node_name.to_string();
    let state = State::new(options.silence_bound);
    tx.send_replace(state.view(&node));
    tokio::spawn(run(client, node, options, state, tx))
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

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
