//! The sweep kept current as events arrive (issue 36), off the request path: a thread of its
//! own keeps every part of the sweep ([`crate::sweep::volume_part`] per volume,
//! [`crate::sweep::pv_part`] per PV) and recomputes only the parts something changed under:
//!
//! - a device added, changed or removed (the index marks its volume and PVs: [`Dirt`]);
//! - a PV, VolumeAttachment or Node changed (the tables tell it: [`crate::kube_table::Hook`]);
//! - a node's standing changed: it stopped answering, answers again, went stale, left the fleet
//!   (every node's cause, [`NodeEntry::missing_cause`], compared at each step: a few thousand
//!   string comparisons).
//!
//! It steps every [`STEP`] (and at once when woken), in chunks of [`CHUNK`] parts, each chunk
//! under the index's read lock for a few milliseconds, so writers (links applying events) are
//! never held up for long, and nothing here runs on a runtime worker. Scrapes read the counts it
//! publishes ([`Published`]) and never sweep; a Sweep call first catches up ([`Sweeper::flush`],
//! on a blocking thread) and then puts the kept parts together, as [`crate::sweep::sweep`] would
//! from scratch (a property test checks they agree).
//!
//! [`NodeEntry::missing_cause`]: crate::index::NodeEntry::missing_cause

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::Duration;

use blockjanitor_proto::v1 as pb;

use crate::cluster::Cluster;
use crate::index::{Dirt, Index, Inner};
use crate::multiattach::{volume_id, VolumeId};
use crate::sweep::{self, Missing, Part, KINDS, NO_AGENT};
use crate::sweep_attach::{in_use, Attachment, KubeView};

/// Between two steps when nothing wakes the thread (how soon a node that turned stale with time
/// is counted).
pub const STEP: Duration = Duration::from_millis(250);

/// Parts recomputed under one hold of the index's read lock.
pub const CHUNK: usize = 256;

/// How long a node must have been missing before it counts as uncovered with volumes at stake
/// ([`Published::uncovered_with_volumes`]): an agent restarting in a rollout, or a node
/// rebooting, is back well within it; a node gone this long with volumes is where an incident
/// could hide.
pub const SETTLE: Duration = Duration::from_secs(300);

/// A change a table told.
enum Change {
    Pv(String, Option<VolumeId>),
    Va(String, Option<Attachment>),
    Node(String, Option<Vec<String>>),
}

/// The kept parts and what they rest on.
#[derive(Default)]
struct State {
    kube: KubeView,
    /// Nodes answers cannot speak for (agents, and Nodes with no agent), with a cause that does
    /// not change by itself with time.
    causes: Missing,
    /// Every node's standing: its cause, "" for an agent that answers; a Node with no agent is
    /// [`NO_AGENT`]. A change here (a node leaving the index counts) marks its parts.
    standing: BTreeMap<String, String>,
    /// Since when each missing node has been missing (as this sweep saw it).
    since: std::collections::HashMap<String, std::time::Instant>,
    volumes: BTreeMap<String, Part>,
    pvs: BTreeMap<String, Part>,
    dirty_volumes: BTreeSet<String>,
    dirty_pvs: BTreeSet<String>,
    /// Findings per kind over every part ([`KINDS`] order).
    counts: [u32; 3],
    /// Volumes with at least one device in the index.
    present: HashSet<String>,
}

impl State {
    fn count(&mut self, part: &Part, sign: i64) {
        for f in &part.findings {
            if let Some(i) = KINDS.iter().position(|k| *k as i32 == f.kind) {
                self.counts[i] = (i64::from(self.counts[i]) + sign).max(0) as u32;
            }
        }
    }

    fn store(map: &mut BTreeMap<String, Part>, key: String, part: Part) -> Option<Part> {
        let empty = part.findings.is_empty() && part.unvouched.is_empty() && part.unagented.is_empty();
        if empty {
            map.remove(&key)
        } else {
            map.insert(key, part)
        }
    }
}

/// What the latest step found, for `/metrics` and readiness (read without touching the index).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Published {
    /// Findings per kind, by kind name.
    pub counts: Vec<(&'static str, u32)>,
    /// Nodes answers cannot speak for, and those of them missing for [`SETTLE`] or longer with
    /// a volume at stake (attached by a VolumeAttachment, or mapped as last seen).
    pub missing: usize,
    pub uncovered_with_volumes: usize,
    /// Agents whose node answers now (fresh), those connected but not refreshed (a read missed
    /// its deadline: not down), and the others.
    pub agents_up: usize,
    pub agents_not_refreshed: usize,
    pub agents_down: usize,
    /// Nodes and devices in the index.
    pub nodes: usize,
    pub devices: usize,
    /// Volumes with devices.
    pub volumes: usize,
    /// Every node answered, the Kubernetes view is synced and no part has a gap.
    pub complete: bool,
    /// The Kubernetes view is synced (true without one).
    pub kube_synced: bool,
    /// At least one full step has run since the console started.
    pub stepped: bool,
}

/// The sweep kept current (see the module docs).
pub struct Sweeper {
    index: Index,
    cluster: Option<Cluster>,
    inbox: Mutex<Vec<Change>>,
    state: Mutex<State>,
    /// One step at a time (the thread's, or a caller's flush).
    stepping: Mutex<()>,
    wake: (Mutex<bool>, Condvar),
    published: Mutex<Published>,
    stepped: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sweeper {
    /// A sweeper of `index` and `cluster`'s tables (it registers as their listener: make it
    /// before the watches start). Call [`Sweeper::spawn`] to keep it current on its own thread.
    pub fn new(index: Index, cluster: Option<Cluster>) -> Arc<Self> {
        let s = Arc::new(Sweeper {
            index,
            cluster: cluster.clone(),
            inbox: Mutex::new(Vec::new()),
            state: Mutex::new(State::default()),
            stepping: Mutex::new(()),
            wake: (Mutex::new(false), Condvar::new()),
            published: Mutex::new(Published::default()),
            stepped: AtomicBool::new(false),
        });
        if let Some(c) = &cluster {
            let tell = |s: &Arc<Sweeper>| {
                let weak = Arc::downgrade(s);
                move |change: Change| {
                    if let Some(s) = weak.upgrade() {
                        lock(&s.inbox).push(change);
                        s.poke();
                    }
                }
            };
            let t = tell(&s);
            c.pvs.on_change(Arc::new(move |k, o| t(Change::Pv(k.to_owned(), o.map(volume_id)))));
            let t = tell(&s);
            c.vas.on_change(Arc::new(move |k, o| t(Change::Va(k.to_owned(), o.map(Attachment::of)))));
            let t = tell(&s);
            c.nodes.on_change(Arc::new(move |k, o| t(Change::Node(k.to_owned(), o.map(in_use)))));
        }
        s
    }

    /// Keeps it current on a thread of its own until the sweeper is dropped.
    pub fn spawn(self: &Arc<Self>) {
        let weak: Weak<Sweeper> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("sweeper".into()).spawn(move || loop {
            let Some(s) = weak.upgrade() else { return };
            s.step();
            let (woken, cv) = &s.wake;
            let mut w = lock(woken);
            if !*w {
                w = cv.wait_timeout(w, STEP).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
            }
            *w = false;
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the sweeper's thread: the sweep is computed on each Sweep call only");
        }
    }

    fn poke(&self) {
        let (woken, cv) = &self.wake;
        *lock(woken) = true;
        cv.notify_one();
    }

    /// Catches up with every change so far (what a Sweep call does before it answers).
    pub fn flush(&self) {
        self.step();
    }

    /// The PVs whose volume has this image or WWID (the sweep's view of Kubernetes, no object
    /// read back).
    pub fn pvs_of(&self, volume: &str) -> Vec<String> {
        lock(&self.state).kube.pvs_of(volume)
    }

    /// What the latest step found.
    pub fn published(&self) -> Published {
        lock(&self.published).clone()
    }

    /// One step: take what changed, recompute the parts under it, publish.
    pub fn step(&self) {
        let _one = lock(&self.stepping);
        let changes = std::mem::take(&mut *lock(&self.inbox));
        let dirt = std::mem::take(&mut self.index.write().dirty);
        {
            // The index before the state, as everywhere else here: a reader that took the state
            // first would wait for the index behind a queued writer (a link applying an event)
            // that waits for a reader holding the index and waiting for the state.
            let ix = self.index.read();
            let mut st = lock(&self.state);
            mark_dirt(&mut st, dirt);
            for c in changes {
                apply_change(&mut st, c);
            }
            st.kube.not_synced = self.cluster.as_ref().and_then(Cluster::not_synced);
            self.scan_causes(&ix, &mut st);
        }
        self.recompute();
        self.publish();
        self.stepped.store(true, Ordering::Release);
    }

    /// Every node's cause compared with the one its parts rest on; a change marks its volumes and
    /// its attachments.
    fn scan_causes(&self, ix: &Inner, st: &mut State) {
        let mut standing: BTreeMap<String, String> =
            ix.nodes.values().map(|n| (n.name.clone(), n.missing_cause().unwrap_or_default())).collect();
        if self.cluster.is_some() {
            for n in st.kube.nodes.keys().filter(|n| !ix.nodes.contains_key(*n)) {
                standing.insert(n.clone(), NO_AGENT.to_owned());
            }
        }
        let now: Missing =
            standing.iter().filter(|(_, c)| !c.is_empty()).map(|(n, c)| (n.clone(), c.clone())).collect();
        let t = std::time::Instant::now();
        st.since.retain(|n, _| now.contains_key(n));
        for n in now.keys() {
            st.since.entry(n.clone()).or_insert(t);
        }
        let names: BTreeSet<&String> = standing.keys().chain(st.standing.keys()).collect();
        let changed: Vec<String> =
            names.into_iter().filter(|n| standing.get(*n) != st.standing.get(*n)).cloned().collect();
        for n in &changed {
            if let Some(e) = ix.nodes.get(n) {
                st.dirty_volumes
                    .extend(e.devices.values().filter_map(|d| sweep::volume_of(d).map(|(k, _)| k)));
            }
            let pvs = st.kube.pvs_on(n);
            st.dirty_pvs.extend(pvs);
        }
        st.causes = now;
        st.standing = standing;
    }

    /// Recomputes the dirty parts, a chunk at a time.
    fn recompute(&self) {
        loop {
            let ix = self.index.read();
            let mut st = lock(&self.state);
            let volumes: Vec<String> = take_some(&mut st.dirty_volumes);
            let pvs: Vec<String> = if volumes.is_empty() { take_some(&mut st.dirty_pvs) } else { Vec::new() };
            if volumes.is_empty() && pvs.is_empty() {
                return;
            }
            for key in volumes {
                let part = {
                    let kube = &st.kube;
                    let pv_of = |v: &str| kube.pv_of(v).unwrap_or_default();
                    let v = sweep::gather(&ix, &key, &pv_of);
                    let present = !v.by_node.is_empty();
                    (sweep::volume_part(&key, &v, &st.causes), present)
                };
                let (part, present) = part;
                if present {
                    st.present.insert(key.clone());
                } else {
                    st.present.remove(&key);
                }
                st.count(&part, 1);
                if let Some(old) = State::store(&mut st.volumes, key, part) {
                    st.count(&old, -1);
                }
            }
            for pv in pvs {
                let part = sweep::pv_part(&ix, &st.kube, &pv, &st.causes);
                st.count(&part, 1);
                if let Some(old) = State::store(&mut st.pvs, pv, part) {
                    st.count(&old, -1);
                }
            }
        }
    }

    fn publish(&self) {
        let ix = self.index.read();
        let st = lock(&self.state);
        let at_stake = |n: &str| {
            st.kube.attached_on(n)
                || ix.nodes.get(n).is_some_and(|e| e.devices.values().any(|d| sweep::volume_of(d).is_some()))
        };
        let up = ix.nodes.keys().filter(|n| !st.causes.contains_key(*n)).count();
        let not_refreshed = st.causes.values().filter(|c| c.starts_with("not refreshed")).count();
        let gaps = st.kube.not_synced.is_some()
            || st
                .volumes
                .values()
                .chain(st.pvs.values())
                .any(|p| !p.unvouched.is_empty() || !p.unagented.is_empty());
        let p = Published {
            counts: KINDS.iter().zip(st.counts).map(|(k, n)| (sweep::kind_name(*k), n)).collect(),
            missing: st.causes.len(),
            uncovered_with_volumes: st
                .causes
                .keys()
                .filter(|n| st.since.get(*n).is_some_and(|t| t.elapsed() >= SETTLE) && at_stake(n))
                .count(),
            agents_up: up,
            agents_not_refreshed: not_refreshed,
            agents_down: ix.nodes.len().saturating_sub(up + not_refreshed),
            nodes: ix.nodes.len(),
            devices: ix.device_count(),
            volumes: st.present.len(),
            complete: st.causes.is_empty() && !gaps,
            kube_synced: st.kube.not_synced.is_none(),
            stepped: true,
        };
        *lock(&self.published) = p;
    }

    /// The sweep now, from the kept parts (after catching up): findings of `kinds` (empty: all),
    /// what was covered and what not, node by node; at most [`crate::sweep_bound::SWEEP_BYTES`]
    /// encoded (what was left out is said in the summary).
    pub fn answer(&self, kinds: &[pb::FindingKind]) -> pb::SweepResponse {
        self.flush();
        let ix = self.index.read();
        let missing = sweep::missing_nodes(&ix, self.cluster.as_ref());
        let st = lock(&self.state);
        let volumes = st.present.len();
        let not_synced = st.kube.not_synced.clone();
        let parts = st.volumes.values().chain(st.pvs.values());
        let mut r =
            sweep::assemble(parts, volumes as u32, missing, not_synced, self.cluster.is_none(), kinds);
        coverage(&mut r, &ix, &st.kube);
        crate::sweep_bound::bound(&mut r, crate::sweep_bound::SWEEP_BYTES);
        r
    }
}

/// Adds what the sweep covered and what not to an answer: nodes, covered nodes, nodes answering
/// with an incomplete view, missing nodes with a volume at stake.
pub fn coverage(r: &mut pb::SweepResponse, ix: &Inner, kube: &KubeView) {
    let missing: BTreeSet<&str> = r.missing_nodes.iter().map(|m| m.node.as_str()).collect();
    let all: BTreeSet<&str> =
        ix.nodes.keys().map(String::as_str).chain(kube.nodes.keys().map(String::as_str)).collect();
    r.nodes = all.len() as u32;
    r.covered_nodes = all.iter().filter(|n| !missing.contains(*n)).count() as u32;
    r.partial_nodes = ix
        .nodes
        .values()
        .filter(|n| !missing.contains(n.name.as_str()) && !n.incomplete_view.is_empty())
        .map(|n| pb::MissingNode {
            node: n.name.clone(),
            reason: n.incomplete_view.clone(),
            ..Default::default()
        })
        .collect();
    r.uncovered_with_volumes = missing
        .iter()
        .filter(|n| {
            kube.attached_on(n)
                || ix
                    .nodes
                    .get(**n)
                    .is_some_and(|e| e.devices.values().any(|d| sweep::volume_of(d).is_some()))
        })
        .map(|n| (*n).to_owned())
        .collect();
    let covered = format!("covered {} of {} node(s)", r.covered_nodes, r.nodes);
    r.summary = format!("{}; {covered}", r.summary);
    if !r.partial_nodes.is_empty() {
        let names: Vec<&str> = r.partial_nodes.iter().take(20).map(|m| m.node.as_str()).collect();
        r.summary.push_str(&format!(
            "; {} answer with an incomplete view (their devices within reach of a blind spot are unknown): {}",
            r.partial_nodes.len(),
            names.join(", ")
        ));
    }
}

fn take_some(set: &mut BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::with_capacity(CHUNK.min(set.len()));
    while out.len() < CHUNK {
        match set.pop_first() {
            Some(k) => out.push(k),
            None => break,
        }
    }
    out
}

/// The index's dirt: its volumes, and the PVs those volumes are (their attachments' findings
/// read the devices).
fn mark_dirt(st: &mut State, dirt: Dirt) {
    for v in &dirt.volumes {
        let pvs = st.kube.pvs_of(v);
        st.dirty_pvs.extend(pvs);
    }
    st.dirty_volumes.extend(dirt.volumes);
    st.dirty_pvs.extend(dirt.pvs);
}

/// A table's change: the digest replaced, and the parts resting on it marked.
fn apply_change(st: &mut State, c: Change) {
    match c {
        Change::Pv(name, v) => {
            let images = |v: &VolumeId| v.images.iter().chain(&v.wwids).cloned().collect::<Vec<_>>();
            let new = v.as_ref().map(images).unwrap_or_default();
            let old = st.kube.set_pv(&name, v).map(|o| images(&o)).unwrap_or_default();
            st.dirty_volumes.extend(old.into_iter().chain(new));
            st.dirty_pvs.insert(name);
        }
        Change::Va(key, a) => {
            if let Some(a) = &a {
                st.dirty_pvs.insert(a.pv.clone());
            }
            if let Some(old) = st.kube.set_va(&key, a) {
                st.dirty_pvs.insert(old.pv);
            }
        }
        Change::Node(name, in_use) => {
            st.kube.set_node(&name, in_use);
            let pvs = st.kube.pvs_on(&name);
            st.dirty_pvs.extend(pvs);
        }
    }
}

#[cfg(test)]
#[path = "sweeper_tests.rs"]
mod tests;
