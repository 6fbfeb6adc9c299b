//! The fleet index: every node's agent (address, reachability, freshness, last error) and its
//! devices, with lookups by Ceph image, PV, rbd client address (and its IP), rbd client id, WWID
//! and nbd backend.
//!
//! Links write it (a full device list replaces a node's devices; an event upserts or removes
//! one); queries read it. Lookups go through key tables kept beside the devices, so an answer
//! costs the matches, not the fleet. A node that is not reachable or not synced keeps its last
//! devices (marked as such by its status) and is named in every answer's `missing_nodes`.
//!
//! A node whose agent pod went away (the Node deleted, its pods collected) leaves the fleet but
//! not the console's memory: its last view moves to [`Inner::gone`] with when it went, out of
//! the key tables and of `missing_nodes`, so that Explain can still say what it last mapped and
//! held ("as last seen N s ago"). The kernel rbd clients agents report are remembered too
//! ([`crate::client_history`]), for who-watches.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view::time::now_secs;

use crate::ceph_addr;
use crate::client_history::ClientHistory;
use crate::watchers::{addr_ip, normalize_client};

/// How many gone nodes' last views are kept (the oldest go first).
pub const GONE_KEPT: usize = 256;

/// What a device can be looked up by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// `pool/image` or `pool/namespace/image`.
    Image(String),
    /// A PV name (from the kubelet directory, per the agent).
    Pv(String),
    /// An rbd client address `IP:0/NONCE`.
    ClientAddr(String),
    /// The IP of an rbd client address.
    ClientIp(String),
    /// An rbd client id `client.N`.
    ClientId(String),
    /// A SCSI or multipath WWID.
    Wwid(String),
    /// An nbd backend.
    NbdBackend(String),
    /// An iSCSI target IQN a disk is reached through (lower case).
    Iqn(String),
    /// An NVMe subsystem NQN a namespace is served by (lower case).
    Nqn(String),
}

pub use crate::volume_key::image_key;

/// Every key a device can be found by.
pub fn keys_of(d: &pb::Device) -> Vec<Key> {
    let mut k = Vec::new();
    if let Some(r) = &d.rbd {
        k.push(Key::Image(image_key(&r.pool, &r.pool_namespace, &r.image)));
        if !r.client_addr.is_empty() {
            k.push(Key::ClientAddr(r.client_addr.clone()));
            // The IP as parsed (canonical), so a question's IP finds it whatever the form.
            let ip = ceph_addr::client_instance(&r.client_addr)
                .map(|(ip, _)| ip.to_string())
                .unwrap_or_else(|| addr_ip(&r.client_addr).to_owned());
            k.push(Key::ClientIp(ip));
        }
        if let Some(c) = normalize_client(&r.client_id) {
            k.push(Key::ClientId(c));
        }
    }
    for pv in &d.pv_names {
        k.push(Key::Pv(pv.clone()));
    }
    if !d.wwid.is_empty() {
        k.push(Key::Wwid(d.wwid.to_ascii_lowercase()));
    }
    if !d.nbd_backend.is_empty() {
        k.push(Key::NbdBackend(d.nbd_backend.clone()));
    }
    if let Some(s) = d.iscsi_session.as_ref().filter(|s| !s.target.is_empty()) {
        k.push(Key::Iqn(s.target.to_ascii_lowercase()));
    }
    if let Some(n) = &d.nvme {
        let nqns = std::iter::once(&n.subsysnqn).chain(n.controllers.iter().map(|c| &c.subsysnqn));
        for nqn in nqns.filter(|q| !q.is_empty()) {
            let key = Key::Nqn(nqn.to_ascii_lowercase());
            if !k.contains(&key) {
                k.push(key);
            }
        }
    }
    k
}

/// One node's agent.
#[derive(Debug, Clone, Default)]
pub struct NodeEntry {
    pub name: String,
    /// `HOST:PORT` ("" when the agent's pod has no IP yet).
    pub address: String,
    /// `kubernetes` or `static`.
    pub source: String,
    /// The agent's pod, `NAMESPACE/NAME` ("" for a static agent).
    pub agent_pod: String,
    /// A live connection and a device list read in full since it was made.
    pub reachable: bool,
    /// The device list was read in full at least once.
    pub synced: bool,
    /// When the agent last answered (seconds since the epoch).
    pub last_seen: f64,
    /// When the device list was last read in full.
    pub last_sync: f64,
    /// The last error, "" after a success.
    pub error: String,
    /// When the link was last found dead (seconds since the epoch; 0 while it is up).
    pub down_since: f64,
    pub failures: u32,
    /// When the agent's latest scan finished, as far as this console knows (its device list's
    /// `scan_unix_seconds`, moved on by events from later scans; the agent's clock).
    pub scan_unix_seconds: f64,
    /// What that scan could not see, as the agent says (its device list's `blind_spots`).
    pub blind_spots: Vec<String>,
    /// "INCOMPLETE VIEW: ..." when a blind spot could hide a holder; "" when its view is complete.
    pub incomplete_view: String,
    /// An answering agent whose latest scan is older than this (seconds) is stale: answers
    /// cannot speak for its node ([`DEFAULT_STALE_AFTER`]).
    pub stale_after: f64,
    pub agent: Option<pb::Node>,
    /// Boxed: a `pb::Device` is over a kilobyte inline (every optional sub-message), and a
    /// B-tree node holds 11 slots whether used or not; boxed, the index costs what the devices
    /// hold (BENCHMARKS.md, "index memory per device").
    pub devices: BTreeMap<String, Box<pb::Device>>,
    /// Its pin risks as the agent last reported them (ListDevices, PIN_RISKS_CHANGED), by mount
    /// namespace.
    pub pin_risks: Vec<pb::PinRisk>,
    /// Whether the agent reported a pin-risk check, and why it could judge no namespace.
    pub pin_risks_checked: bool,
    pub pin_risks_unknown: String,
    /// Why the latest read of its full device list failed although its link is up (a fresh
    /// fan-out's deadline missed, a resync failed): not down, but its answers come from its
    /// cached view (`last_sync` old), which is no fresh evidence. "" once a full read succeeds.
    pub not_refreshed: String,
}

/// An answering agent whose latest scan finished longer ago than this is stale (the agents scan
/// every 60 s by default and the console reads each list again every 60 s).
pub const DEFAULT_STALE_AFTER: f64 = 300.0;

impl NodeEntry {
    /// Why answers cannot speak for this node now (`None`: they can): not reachable or not
    /// synced, or stale (it answers, but its latest scan is older than [`NodeEntry::stale_after`]).
    pub fn missing_reason(&self) -> Option<String> {
        if self.reachable && self.synced {
            let now = now_secs();
            return self.not_refreshed_reason(now).or_else(|| self.stale_reason(now));
        }
        if self.address.is_empty() {
            return Some(if self.error.is_empty() { "no agent address".into() } else { self.error.clone() });
        }
        let since = if self.down_since > 0.0 {
            format!(" for {:.1} s", (now_secs() - self.down_since).max(0.0))
        } else {
            String::new()
        };
        Some(match (self.error.is_empty(), self.synced) {
            (false, _) => format!("unreachable{since}: {}", self.error),
            (true, false) => "not synced yet".into(),
            (true, true) => format!("connection lost{since}"),
        })
    }

    /// Why an answering agent's view is not fresh at `now`: the latest read of its list failed
    /// (see [`NodeEntry::not_refreshed`]); says how old the cached view is and that it is not down.
    pub fn not_refreshed_reason(&self, now: f64) -> Option<String> {
        (!self.not_refreshed.is_empty()).then(|| {
            format!(
                "not refreshed: {}; answered from its cached view, {:.0} s old (its agent is connected: not down)",
                self.not_refreshed,
                self.cached_age(now)
            )
        })
    }

    /// How old its cached view is at `now`: seconds since its last full read.
    pub fn cached_age(&self, now: f64) -> f64 {
        if self.last_sync > 0.0 {
            (now - self.last_sync).max(0.0)
        } else {
            0.0
        }
    }

    /// The node as a missing node, when answers cannot speak for it ([`NodeEntry::missing_reason`]),
    /// a not-refreshed one marked so, with its cached view's age.
    pub fn missing_node(&self) -> Option<pb::MissingNode> {
        let reason = self.missing_reason()?;
        let not_refreshed = self.reachable && self.synced && !self.not_refreshed.is_empty();
        Some(pb::MissingNode {
            node: self.name.clone(),
            reason,
            not_refreshed,
            answer_age_seconds: if not_refreshed { self.cached_age(now_secs()) } else { 0.0 },
        })
    }

    /// Why an answering agent's view is stale at `now`: its latest scan is too old.
    pub fn stale_reason(&self, now: f64) -> Option<String> {
        let age = now - self.scan_unix_seconds;
        (self.stale_after > 0.0 && self.scan_unix_seconds > 0.0 && age > self.stale_after).then(|| {
            format!(
                "stale: its agent answers, but its latest scan finished {age:.0} s ago (more than {:.0} s)",
                self.stale_after
            )
        })
    }

    /// [`NodeEntry::missing_reason`] without what changes by itself with time (how long it has
    /// been down, how old the scan is): what the sweep's findings rest on, compared to notice
    /// a change.
    pub fn missing_cause(&self) -> Option<String> {
        if self.reachable && self.synced && !self.not_refreshed.is_empty() {
            return Some(format!("not refreshed: {}", self.not_refreshed));
        }
        if self.reachable && self.synced {
            return self
                .stale_reason(now_secs())
                .map(|_| format!("stale: its latest scan is older than {:.0} s", self.stale_after));
        }
        if self.address.is_empty() {
            return Some(if self.error.is_empty() { "no agent address".into() } else { self.error.clone() });
        }
        Some(match (self.error.is_empty(), self.synced) {
            (false, _) => format!("unreachable: {}", self.error),
            (true, false) => "not synced yet".into(),
            (true, true) => "connection lost".into(),
        })
    }

    /// Whether its link has had its first try: synced once, or failed at least once (or it has
    /// no address to try): what a replica waits for before it says it is ready.
    pub fn tried(&self) -> bool {
        self.synced || self.failures > 0 || self.address.is_empty() || !self.error.is_empty()
    }

    /// Marks the link dead: not reachable, why, and since when (the first time only, so that
    /// "since" counts from when it went silent, not from the latest failed retry).
    pub fn mark_down(&mut self, why: String) {
        if self.reachable || self.down_since <= 0.0 {
            self.down_since = now_secs();
        }
        self.reachable = false;
        self.error = why;
    }

    /// Marks the link live: the agent answered a full read at `now`.
    pub fn mark_up(&mut self, now: f64) {
        self.reachable = true;
        self.synced = true;
        self.down_since = 0.0;
        self.last_seen = now;
        self.error.clear();
        self.not_refreshed.clear();
        self.failures = 0;
    }

    /// Marks its cached view not refreshed (`why`) while its link stays up: see
    /// [`NodeEntry::not_refreshed`].
    pub fn mark_not_refreshed(&mut self, why: String) {
        self.not_refreshed = why;
    }

    /// The node as a message.
    pub fn to_message(&self) -> pb::FleetNode {
        pb::FleetNode {
            name: self.name.clone(),
            address: self.address.clone(),
            source: self.source.clone(),
            reachable: self.reachable && self.synced,
            last_seen_unix_seconds: self.last_seen,
            last_sync_unix_seconds: self.last_sync,
            error: self.error.clone(),
            devices: self.devices.len() as u32,
            agent: self.agent.clone(),
            failures: self.failures,
            scan_unix_seconds: self.scan_unix_seconds,
            blind_spots: self.blind_spots.clone(),
            incomplete_view: self.incomplete_view.clone(),
            stale: if self.reachable && self.synced {
                self.stale_reason(now_secs()).unwrap_or_default()
            } else {
                String::new()
            },
            not_refreshed: if self.reachable && self.synced {
                self.not_refreshed.clone()
            } else {
                String::new()
            },
        }
    }
}

/// A node that left the fleet (its agent pod went away), as last seen.
#[derive(Debug, Clone)]
pub struct GoneNode {
    /// Its entry when it went: devices, last contact, last error.
    pub entry: NodeEntry,
    /// When it went (seconds since the epoch).
    pub since: f64,
}

/// The index's contents.
#[derive(Debug, Default)]
pub struct Inner {
    pub nodes: BTreeMap<String, NodeEntry>,
    keys: HashMap<Key, BTreeSet<(String, String)>>,
    /// Nodes whose agent pod went away, by name: their last view.
    pub gone: BTreeMap<String, GoneNode>,
    /// The kernel rbd clients agents have reported.
    pub seen: ClientHistory,
    /// What changed since the sweep last looked ([`crate::sweeper`]).
    pub dirty: Dirt,
    /// [`NodeEntry::stale_after`] for every node.
    pub stale_after: f64,
}

/// The volumes (sweep keys, [`crate::volume_key::volume_of`]) and PVs whose devices changed.
#[derive(Debug, Default)]
pub struct Dirt {
    pub volumes: std::collections::HashSet<String>,
    pub pvs: std::collections::HashSet<String>,
}

impl Dirt {
    fn mark(&mut self, d: &pb::Device) {
        if let Some((v, _)) = crate::volume_key::volume_of(d) {
            self.volumes.insert(v);
        }
        self.pvs.extend(d.pv_names.iter().cloned());
    }
}

impl Inner {
    fn unkey(&mut self, node: &str, d: &pb::Device) {
        self.dirty.mark(d);
        for k in keys_of(d) {
            if let Some(set) = self.keys.get_mut(&k) {
                set.remove(&(node.to_owned(), d.name.clone()));
                if set.is_empty() {
                    self.keys.remove(&k);
                }
            }
        }
    }

    fn key(&mut self, node: &str, d: &pb::Device) {
        self.dirty.mark(d);
        for k in keys_of(d) {
            self.keys.entry(k).or_default().insert((node.to_owned(), d.name.clone()));
        }
        self.seen.record(node, d, now_secs());
    }

    /// The `(node, device)` names found by `key`, in order (nothing copied).
    pub fn keyed(&self, key: &Key) -> impl Iterator<Item = (&str, &str)> {
        self.keys.get(key).into_iter().flatten().map(|(n, d)| (n.as_str(), d.as_str()))
    }

    /// Devices found by `key`, with their nodes.
    pub fn lookup(&self, key: &Key) -> Vec<pb::FleetDevice> {
        let Some(set) = self.keys.get(key) else { return Vec::new() };
        set.iter()
            .filter_map(|(n, d)| {
                let dev = self.nodes.get(n)?.devices.get(d)?;
                Some(pb::FleetDevice { node: n.clone(), device: Some(pb::Device::clone(dev)) })
            })
            .collect()
    }

    /// Devices of gone nodes found by any of `keys` (their last view), with each node's gone
    /// record. Costs the gone nodes' devices (at most [`GONE_KEPT`] nodes).
    pub fn lookup_gone(&self, keys: &[Key]) -> Vec<(pb::FleetDevice, &GoneNode)> {
        let mut out = Vec::new();
        for g in self.gone.values() {
            for d in g.entry.devices.values() {
                if keys_of(d).iter().any(|k| keys.contains(k)) {
                    let f =
                        pb::FleetDevice { node: g.entry.name.clone(), device: Some(pb::Device::clone(d)) };
                    out.push((f, g));
                }
            }
        }
        out
    }

    /// Every node answers cannot speak for, with why.
    pub fn missing(&self) -> Vec<pb::MissingNode> {
        self.nodes.values().filter_map(NodeEntry::missing_node).collect()
    }

    /// Number of devices over all nodes.
    pub fn device_count(&self) -> usize {
        self.nodes.values().map(|n| n.devices.len()).sum()
    }

    /// Replaces a node's devices (a full list).
    pub fn replace_devices(&mut self, node: &str, devices: Vec<pb::Device>) {
        let old = match self.nodes.get_mut(node) {
            Some(n) => std::mem::take(&mut n.devices),
            None => return,
        };
        for d in old.values() {
            self.unkey(node, d);
        }
        let mut map = BTreeMap::new();
        for d in devices {
            self.key(node, &d);
            map.insert(d.name.clone(), Box::new(d));
        }
        if let Some(n) = self.nodes.get_mut(node) {
            n.devices = map;
        }
    }

    /// Replaces a node's pin risks (kept sorted by mount namespace: `ListPinRisks` pages by it).
    pub fn set_pin_risks(&mut self, node: &str, mut risks: Vec<pb::PinRisk>, checked: bool, unknown: String) {
        risks.sort_by_key(|r| r.mount_namespace);
        if let Some(n) = self.nodes.get_mut(node) {
            n.pin_risks = risks;
            n.pin_risks_checked = checked;
            n.pin_risks_unknown = unknown;
        }
    }

    /// Adds or replaces one device.
    pub fn upsert_device(&mut self, node: &str, d: pb::Device) {
        let old = self.nodes.get_mut(node).and_then(|n| n.devices.remove(&d.name));
        if let Some(o) = old {
            self.unkey(node, &o);
        }
        if self.nodes.contains_key(node) {
            self.key(node, &d);
            if let Some(n) = self.nodes.get_mut(node) {
                n.devices.insert(d.name.clone(), Box::new(d));
            }
        }
    }

    /// Removes one device.
    pub fn remove_device(&mut self, node: &str, name: &str) {
        if let Some(o) = self.nodes.get_mut(node).and_then(|n| n.devices.remove(name)) {
            self.unkey(node, &o);
        }
    }

    /// Adds a node (or updates its address and source), keeping what is known about it.
    pub fn upsert_node(&mut self, name: &str, address: &str, source: &str, error: Option<&str>) {
        self.gone.remove(name);
        let n = self
            .nodes
            .entry(name.to_owned())
            .or_insert_with(|| NodeEntry { name: name.to_owned(), ..Default::default() });
        n.stale_after = self.stale_after;
        if n.address != address && n.reachable {
            n.mark_down(format!("the agent's address changed to {address}"));
        }
        n.address = address.to_owned();
        n.source = source.to_owned();
        if let Some(e) = error {
            n.mark_down(e.to_owned());
        }
    }

    /// Takes a node out of the fleet (its agent pod went away), keeping its last view in
    /// [`Inner::gone`].
    pub fn remove_node(&mut self, name: &str) {
        let Some(mut entry) = self.nodes.remove(name) else { return };
        for d in entry.devices.values() {
            self.unkey(name, d);
        }
        let now = now_secs();
        if entry.reachable || entry.down_since <= 0.0 {
            entry.down_since = now;
        }
        entry.reachable = false;
        entry.error = "its agent pod went away".into();
        self.gone.insert(name.to_owned(), GoneNode { entry, since: now });
        while self.gone.len() > GONE_KEPT {
            let oldest =
                self.gone.iter().min_by(|a, b| a.1.since.total_cmp(&b.1.since)).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => self.gone.remove(&k),
                None => break,
            };
        }
    }
}

/// The shared index.
#[derive(Debug, Clone)]
pub struct Index(Arc<RwLock<Inner>>);

impl Default for Index {
    fn default() -> Self {
        Self::with_stale_after(DEFAULT_STALE_AFTER)
    }
}

impl Index {
    pub fn new() -> Self {
        Self::default()
    }

    /// An index whose nodes are stale when their latest scan is older than `secs` (0: never).
    pub fn with_stale_after(secs: f64) -> Self {
        Index(Arc::new(RwLock::new(Inner { stale_after: secs, ..Inner::default() })))
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Inner> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Inner> {
        self.0.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on one node's entry, when it exists.
    pub fn with_node(&self, name: &str, f: impl FnOnce(&mut NodeEntry)) {
        if let Some(n) = self.write().nodes.get_mut(name) {
            f(n);
        }
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
