//! The fleet index: every node's agent (address, reachability, freshness, last error) and its
//! devices, with lookups by Ceph image, PV, rbd client address (and its IP), rbd client id, WWID
//! and nbd backend.
//!
//! Links write it (a full device list replaces a node's devices; an event upserts or removes
//! one); queries read it. Lookups go through key tables kept beside the devices, so an answer
//! costs the matches, not the fleet. A node that is not reachable or not synced keeps its last
//! devices (marked as such by its status) and is named in every answer's `missing_nodes`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use blockjanitor_ctl::time::now_secs;
use blockjanitor_proto::v1 as pb;

use crate::watchers::{addr_ip, normalize_client};

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
}

/// `pool/image` or `pool/namespace/image`.
pub fn image_key(pool: &str, namespace: &str, image: &str) -> String {
    if namespace.is_empty() {
        format!("{pool}/{image}")
    } else {
        format!("{pool}/{namespace}/{image}")
    }
}

/// Every key a device can be found by.
pub fn keys_of(d: &pb::Device) -> Vec<Key> {
    let mut k = Vec::new();
    if let Some(r) = &d.rbd {
        k.push(Key::Image(image_key(&r.pool, &r.pool_namespace, &r.image)));
        if !r.client_addr.is_empty() {
            k.push(Key::ClientAddr(r.client_addr.clone()));
            k.push(Key::ClientIp(addr_ip(&r.client_addr).to_owned()));
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
    pub agent: Option<pb::Node>,
    /// Boxed: a `pb::Device` is over a kilobyte inline (every optional sub-message), and a
    /// B-tree node holds 11 slots whether used or not; boxed, the index costs what the devices
    /// hold (BENCHMARKS.md, "index memory per device").
    pub devices: BTreeMap<String, Box<pb::Device>>,
}

impl NodeEntry {
    /// Why answers cannot speak for this node now (`None`: they can).
    pub fn missing_reason(&self) -> Option<String> {
        if self.reachable && self.synced {
            return None;
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
        self.failures = 0;
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
        }
    }
}

/// The index's contents.
#[derive(Debug, Default)]
pub struct Inner {
    pub nodes: BTreeMap<String, NodeEntry>,
    keys: HashMap<Key, BTreeSet<(String, String)>>,
}

impl Inner {
    fn unkey(&mut self, node: &str, d: &pb::Device) {
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
        for k in keys_of(d) {
            self.keys.entry(k).or_default().insert((node.to_owned(), d.name.clone()));
        }
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

    /// Every node answers cannot speak for, with why.
    pub fn missing(&self) -> Vec<pb::MissingNode> {
        self.nodes
            .values()
            .filter_map(|n| n.missing_reason().map(|reason| pb::MissingNode { node: n.name.clone(), reason }))
            .collect()
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
        let n = self
            .nodes
            .entry(name.to_owned())
            .or_insert_with(|| NodeEntry { name: name.to_owned(), ..Default::default() });
        if n.address != address && n.reachable {
            n.mark_down(format!("the agent's address changed to {address}"));
        }
        n.address = address.to_owned();
        n.source = source.to_owned();
        if let Some(e) = error {
            n.mark_down(e.to_owned());
        }
    }

    /// Forgets a node (its agent pod went away).
    pub fn remove_node(&mut self, name: &str) {
        self.replace_devices(name, Vec::new());
        self.nodes.remove(name);
    }
}

/// The shared index.
#[derive(Debug, Clone, Default)]
pub struct Index(Arc<RwLock<Inner>>);

impl Index {
    pub fn new() -> Self {
        Self::default()
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
mod tests {
    use super::*;

    fn rbd_dev(name: &str, image: &str, addr: &str, client: &str) -> pb::Device {
        pb::Device {
            name: name.into(),
            rbd: Some(pb::RbdMapping {
                pool: "k8s".into(),
                image: image.into(),
                client_addr: addr.into(),
                client_id: client.into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn lookups_follow_replacements_and_events() {
        let ix = Index::new();
        let mut w = ix.write();
        w.upsert_node("a", "127.0.0.2:1", "static", None);
        w.replace_devices("a", vec![rbd_dev("rbd4", "img", "10.0.0.5:0/1", "client.7")]);
        let found = w.lookup(&Key::Image("k8s/img".into()));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].node, "a");
        assert_eq!(w.lookup(&Key::ClientIp("10.0.0.5".into())).len(), 1);
        assert_eq!(w.lookup(&Key::ClientId("client.7".into())).len(), 1);
        // The device now maps another image: the old keys go.
        w.upsert_device("a", rbd_dev("rbd4", "other", "10.0.0.5:0/2", "client.8"));
        assert!(w.lookup(&Key::Image("k8s/img".into())).is_empty());
        assert!(w.lookup(&Key::ClientId("client.7".into())).is_empty());
        assert_eq!(w.lookup(&Key::Image("k8s/other".into())).len(), 1);
        w.remove_device("a", "rbd4");
        assert!(w.lookup(&Key::Image("k8s/other".into())).is_empty());
        assert_eq!(w.device_count(), 0);
    }

    #[test]
    fn unsynced_and_unreachable_nodes_are_missing() {
        let ix = Index::new();
        let mut w = ix.write();
        w.upsert_node("a", "127.0.0.2:1", "static", None);
        w.upsert_node("b", "", "kubernetes", Some("the agent pod has no IP yet"));
        let missing = w.missing();
        assert_eq!(missing.len(), 2);
        assert_eq!(missing[0].reason, "not synced yet");
        assert_eq!(missing[1].reason, "the agent pod has no IP yet");
        if let Some(n) = w.nodes.get_mut("a") {
            n.reachable = true;
            n.synced = true;
        }
        assert_eq!(w.missing().len(), 1);
    }

    #[test]
    fn a_down_mark_says_since_when_and_why_until_the_agent_answers_again() {
        let ix = Index::new();
        let mut w = ix.write();
        w.upsert_node("a", "127.0.0.2:1", "static", None);
        let n = w.nodes.get_mut("a").expect("node");
        n.mark_up(now_secs());
        assert!(n.missing_reason().is_none());
        n.mark_down("WatchEvents: Unavailable: keep-alive timed out".into());
        let since = n.down_since;
        assert!(since > 0.0);
        // A failed retry says why now, and keeps when the link went silent.
        n.mark_down("connect: timed out".into());
        assert_eq!(n.down_since, since);
        let reason = n.missing_reason().expect("missing");
        assert!(
            reason.starts_with("unreachable for ") && reason.ends_with(": connect: timed out"),
            "{reason}"
        );
        n.mark_up(now_secs());
        assert!(n.missing_reason().is_none());
        assert_eq!(n.down_since, 0.0);
        assert!(n.error.is_empty());
    }
}
