//! The watch cache's data: the changes the watches report, and the tables they are applied to
//! until the view is rebuilt from them.

use super::cluster::{ClusterView, PodInfo, PvInfo, VaInfo, WatchHealth};
use crate::host::clock::BootTime;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

/// One thing one of the four loops saw, reduced to plain data.
pub(super) enum Change {
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
    pub(super) fn heard_on(&self) -> Option<Kind> {
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
pub(super) enum Op<T> {
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
    pub(super) fn is_answer(&self) -> bool {
        !matches!(self, Op::Begin)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Pods,
    VolumeAttachments,
    PersistentVolumes,
}

impl Kind {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Kind::Pods => "pods",
            Kind::VolumeAttachments => "volumeattachments",
            Kind::PersistentVolumes => "persistentvolumes",
        }
    }
}

/// One watched collection: what is shown, the list being received, and the watch's health.
pub(super) struct Table<T> {
    pub(super) kind: Kind,
    pub(super) live: BTreeMap<String, T>,
    pub(super) pending: Option<BTreeMap<String, T>>,
    pub(super) synced: bool,
    pub(super) error: Option<String>,
    /// When the watch last heard from the API server.
    pub(super) heard: Option<BootTime>,
}

impl<T> Table<T> {
    pub(super) fn new(kind: Kind) -> Self {
        Table { kind, live: BTreeMap::new(), pending: None, synced: false, error: None, heard: None }
    }

    /// Applies an operation; true when what is shown may have changed. Only a complete list
    /// makes the table synced and clears its error.
    pub(super) fn apply(&mut self, op: Op<T>) -> bool {
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
    pub(super) fn fail(&mut self, error: String) -> bool {
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

    pub(super) fn health(&self) -> WatchHealth {
        WatchHealth {
            resource: self.kind.as_str(),
            synced: self.synced,
            error: self.error.clone(),
            heard: self.heard,
        }
    }
}

/// The three tables, and what the Node lookups found.
pub(super) struct State {
    pub(super) pods: Table<PodInfo>,
    pub(super) vas: Table<VaInfo>,
    pub(super) pvs: Table<PvInfo>,
    pub(super) node_found: Option<bool>,
    /// The last lookup's failure, until one is answered.
    pub(super) probe_error: Option<String>,
    /// When a Node lookup was last answered.
    pub(super) last_contact: Option<BootTime>,
    pub(super) silence_bound: Duration,
}

impl State {
    pub(super) fn new(silence_bound: Duration) -> Self {
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
    pub(super) fn apply(&mut self, change: Change, now: BootTime) -> bool {
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
    pub(super) fn stamp_contact(&self, view: &mut ClusterView) {
        view.last_contact = self.last_contact;
        for (w, heard) in view.watches.iter_mut().zip([self.pods.heard, self.vas.heard, self.pvs.heard]) {
            w.heard = heard;
        }
    }

    pub(super) fn view(&self, node: &str) -> ClusterView {
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
            connect_error: None,
        };
        view.resolve_claims();
        view
    }
}
