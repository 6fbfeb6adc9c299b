//! One Kubernetes collection as the console keeps it: its objects by key (`namespace/name`, or
//! `name` for cluster-scoped objects), whether it is synced, a secondary index kept beside them
//! (a Node's addresses, a VolumeAttachment's PV: a question costs its matches, not the
//! collection), and the objects seen deleted, with when (a deleted Node's machine may still run:
//! its addresses must still name it). Written by the watch in [`crate::cluster`]; read by every
//! answer.
//!
//! Memory (issue 36: 50,000 PVs, PVCs and VolumeAttachments and 100,000 pods): a
//! `PersistentVolume` or a `VolumeAttachment` is 3.5 KB inline before any of its strings (every
//! volume source is an inline `Option`), so objects are not kept as Rust values. Each is kept
//! once, as the compact JSON of the object with what no answer reads stripped (a [`Keep`]
//! function: managed fields, annotations, a Node's image list; a pod reduced to what Explain
//! reads, or dropped when it has no volume that may be a block device), and read back when a
//! question needs it (a few objects per answer). A relist is applied in place (every object
//! listed replaces its entry, then what was not listed is deleted), so it never holds a second
//! copy of the collection. A hook ([`Table::on_change`]) tells one listener (the sweep) what
//! changed, with the object as it was stored.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use blockjanitor_rpc::view::time::now_secs;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// How many deleted objects a table remembers (the oldest go first).
pub const DELETED_KEPT: usize = 1024;

/// The secondary keys of an object (e.g. a Node's addresses).
pub type Indexer<K> = fn(&K) -> Vec<String>;

/// Strips an object to what answers read; `false`: the table does not keep it at all.
pub type Keep<K> = fn(&mut K) -> bool;

/// Told of every change: the object's key and the object as stored (`None`: deleted, or no
/// longer kept).
pub type Hook<K> = Arc<dyn Fn(&str, Option<&K>) + Send + Sync>;

/// One object as kept: its stripped JSON and its secondary keys.
struct Entry {
    json: Box<[u8]>,
    keys: Box<[String]>,
}

impl Entry {
    fn size(&self) -> usize {
        self.json.len() + self.keys.iter().map(|k| k.len() + std::mem::size_of::<String>()).sum::<usize>()
    }
}

/// A table's contents.
#[derive(Default)]
pub struct Contents {
    /// Listed in full and not failed since.
    pub synced: bool,
    objects: BTreeMap<String, Entry>,
    by: HashMap<String, BTreeSet<String>>,
    /// Deleted objects: key -> (when it was seen deleted, seconds since the epoch; the object).
    deleted: BTreeMap<String, (f64, Entry)>,
    /// The keys listed so far while a relist is under way.
    relisting: Option<HashSet<String>>,
    /// Bytes of the kept objects (JSON and secondary keys).
    bytes: usize,
}

/// One collection (see the module docs).
pub struct Table<K> {
    inner: Arc<RwLock<Contents>>,
    indexer: Option<Indexer<K>>,
    keep: Option<Keep<K>>,
    hook: Arc<RwLock<Option<Hook<K>>>>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Table<K> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            indexer: self.indexer,
            keep: self.keep,
            hook: Arc::clone(&self.hook),
            kind: PhantomData,
        }
    }
}

impl<K> Default for Table<K> {
    fn default() -> Self {
        Self {
            inner: Arc::new(RwLock::new(Contents::default())),
            indexer: None,
            keep: None,
            hook: Arc::new(RwLock::new(None)),
            kind: PhantomData,
        }
    }
}

/// What a change did, for the hook (called once the table's lock is released).
type Told<K> = Vec<(String, Option<K>)>;

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Table<K> {
    /// A table whose objects are also found by `indexer`'s keys.
    pub fn indexed(indexer: Indexer<K>) -> Self {
        Self { indexer: Some(indexer), ..Self::default() }
    }

    /// The same table, each object stripped (or dropped) by `keep` before it is kept.
    pub fn keeping(mut self, keep: Keep<K>) -> Self {
        self.keep = Some(keep);
        self
    }

    /// Tells `hook` of every change from now on (one listener; a second replaces the first).
    pub fn on_change(&self, hook: Hook<K>) {
        *self.hook.write().unwrap_or_else(|p| p.into_inner()) = Some(hook);
    }

    /// An object's key.
    pub fn key(o: &K) -> String {
        match o.meta().namespace.as_deref() {
            Some(ns) => format!("{ns}/{}", o.meta().name.clone().unwrap_or_default()),
            None => o.meta().name.clone().unwrap_or_default(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Contents> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Contents> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn decode(key: &str, e: &Entry) -> Option<Arc<K>> {
        match serde_json::from_slice::<K>(&e.json) {
            Ok(o) => Some(Arc::new(o)),
            Err(err) => {
                tracing::error!(kind = %K::kind(&()), key = %key, error = %err,
                    "a kept object cannot be read back (a bug)");
                None
            }
        }
    }

    /// Whether the table was listed in full and its watch has not failed since.
    pub fn synced(&self) -> bool {
        self.read().synced
    }

    /// Marks the table not synced (its watch failed; answers needing it say so).
    pub fn unsynced(&self) {
        self.write().synced = false;
    }

    /// One object by key.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.read().objects.get(key).and_then(|e| Self::decode(key, e))
    }

    /// Whether an object with this key is kept.
    pub fn contains(&self, key: &str) -> bool {
        self.read().objects.contains_key(key)
    }

    /// Every key, in order.
    pub fn keys(&self) -> Vec<String> {
        self.read().objects.keys().cloned().collect()
    }

    /// How many objects are kept, and their bytes (JSON and secondary keys).
    pub fn size(&self) -> (usize, usize) {
        let c = self.read();
        (c.objects.len(), c.bytes)
    }

    /// Every object, read back: costs the whole collection (tests, small tables).
    pub fn all(&self) -> Vec<Arc<K>> {
        self.read().objects.iter().filter_map(|(k, e)| Self::decode(k, e)).collect()
    }

    /// The objects a secondary key names.
    pub fn by(&self, secondary: &str) -> Vec<Arc<K>> {
        let c = self.read();
        c.by.get(secondary)
            .map(|keys| {
                keys.iter().filter_map(|k| c.objects.get(k).and_then(|e| Self::decode(k, e))).collect()
            })
            .unwrap_or_default()
    }

    /// The keys of the objects a secondary key names (nothing read back).
    pub fn keys_by(&self, secondary: &str) -> Vec<String> {
        self.read().by.get(secondary).map(|keys| keys.iter().cloned().collect()).unwrap_or_default()
    }

    /// A deleted object by key: when this console saw it deleted, and the object as last seen
    /// (`None`: not seen deleted, or forgotten).
    pub fn deleted(&self, key: &str) -> Option<(f64, Arc<K>)> {
        let c = self.read();
        let (when, e) = c.deleted.get(key)?;
        Some((*when, Self::decode(key, e)?))
    }

    /// Deleted objects a secondary key names (e.g. the deleted Node that had an address).
    pub fn deleted_by(&self, secondary: &str) -> Vec<(f64, Arc<K>)> {
        let c = self.read();
        c.deleted
            .iter()
            .filter(|(_, (_, e))| e.keys.iter().any(|k| k == secondary))
            .filter_map(|(k, (when, e))| Some((*when, Self::decode(k, e)?)))
            .collect()
    }

    /// Replaces the contents (tests, and a complete list at once): objects that were there and
    /// are not any more count as deleted now.
    pub fn replace(&self, objects: Vec<K>) {
        self.begin_relist();
        for o in objects {
            self.relisted(o);
        }
        self.end_relist();
    }

    /// A relist starts: the table is not synced until it ends (a relist means the watch broke,
    /// and changes may have been missed).
    pub fn begin_relist(&self) {
        let mut c = self.write();
        c.synced = false;
        c.relisting = Some(HashSet::new());
    }

    /// One object of the relist under way, applied in place.
    pub fn relisted(&self, o: K) {
        let key = Self::key(&o);
        let told = {
            let mut c = self.write();
            if let Some(seen) = c.relisting.as_mut() {
                seen.insert(key.clone());
            }
            self.put(&mut c, key, o)
        };
        self.tell(told);
    }

    /// The relist is complete: what it did not list is deleted now; the table is synced.
    pub fn end_relist(&self) {
        let told = {
            let mut c = self.write();
            let seen = c.relisting.take().unwrap_or_default();
            let gone: Vec<String> = c.objects.keys().filter(|k| !seen.contains(*k)).cloned().collect();
            let now = now_secs();
            let mut told = Told::new();
            for k in gone {
                if let Some(e) = self.take(&mut c, &k) {
                    Self::remember_deleted(&mut c, k.clone(), e, now);
                    told.push((k, None));
                }
            }
            c.synced = true;
            told
        };
        self.tell(told);
    }

    /// One object added or changed.
    pub fn applied(&self, o: K) {
        let key = Self::key(&o);
        let told = {
            let mut c = self.write();
            self.put(&mut c, key, o)
        };
        self.tell(told);
    }

    /// One object deleted.
    pub fn removed(&self, o: &K) {
        let key = Self::key(o);
        let told = {
            let mut c = self.write();
            match self.take(&mut c, &key) {
                Some(e) => {
                    Self::remember_deleted(&mut c, key.clone(), e, now_secs());
                    vec![(key, None)]
                }
                None => Vec::new(),
            }
        };
        self.tell(told);
    }

    /// Keeps `o` (stripped) under `key`, or drops what was kept when `keep` refuses it.
    fn put(&self, c: &mut Contents, key: String, mut o: K) -> Told<K> {
        let kept = self.keep.is_none_or(|keep| keep(&mut o));
        let old = self.take(c, &key);
        c.deleted.remove(&key);
        if !kept {
            return if old.is_some() { vec![(key, None)] } else { Vec::new() };
        }
        let json = match serde_json::to_vec(&o) {
            Ok(j) => j.into_boxed_slice(),
            Err(e) => {
                tracing::error!(key = %key, error = %e, "an object cannot be kept (a bug)");
                return Vec::new();
            }
        };
        let keys: Box<[String]> = self.indexer.map(|f| f(&o)).unwrap_or_default().into_boxed_slice();
        for s in keys.iter() {
            c.by.entry(s.clone()).or_default().insert(key.clone());
        }
        let e = Entry { json, keys };
        c.bytes += e.size();
        c.objects.insert(key.clone(), e);
        vec![(key, Some(o))]
    }

    /// Takes an object out of the objects and the secondary index.
    fn take(&self, c: &mut Contents, key: &str) -> Option<Entry> {
        let e = c.objects.remove(key)?;
        c.bytes = c.bytes.saturating_sub(e.size());
        for s in e.keys.iter() {
            if let Some(set) = c.by.get_mut(s) {
                set.remove(key);
                if set.is_empty() {
                    c.by.remove(s);
                }
            }
        }
        Some(e)
    }

    fn remember_deleted(c: &mut Contents, key: String, e: Entry, now: f64) {
        c.deleted.insert(key, (now, e));
        while c.deleted.len() > DELETED_KEPT {
            let oldest = c.deleted.iter().min_by(|a, b| a.1 .0.total_cmp(&b.1 .0)).map(|(k, _)| k.clone());
            match oldest {
                Some(k) => c.deleted.remove(&k),
                None => break,
            };
        }
    }

    fn tell(&self, told: Told<K>) {
        if told.is_empty() {
            return;
        }
        let hook = self.hook.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(h) = hook {
            for (k, o) in &told {
                h(k, o.as_ref());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use std::sync::Mutex;

    fn node(name: &str, ip: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "images": [{"names": ["registry.example/a:1"], "sizeBytes": 1000}]}
        }))
        .expect("node")
    }

    fn addresses(n: &Node) -> Vec<String> {
        n.status.iter().flat_map(|s| s.addresses.iter().flatten()).map(|a| a.address.clone()).collect()
    }

    fn strip(n: &mut Node) -> bool {
        n.metadata.managed_fields = None;
        if let Some(s) = n.status.as_mut() {
            s.images = None;
        }
        !n.metadata.name.as_deref().unwrap_or("").starts_with("drop")
    }

    #[test]
    fn the_index_follows_changes_and_deleted_objects_are_remembered() {
        let t: Table<Node> = Table::indexed(addresses);
        t.replace(vec![node("a", "10.0.0.1"), node("b", "10.0.0.2")]);
        assert_eq!(t.by("10.0.0.1").len(), 1);
        t.applied(node("a", "10.0.0.9"));
        assert!(t.by("10.0.0.1").is_empty(), "the old address no longer names a");
        assert_eq!(t.by("10.0.0.9")[0].metadata.name.as_deref(), Some("a"));
        assert_eq!(t.keys_by("10.0.0.9"), vec!["a".to_owned()]);
        t.removed(&node("b", "10.0.0.2"));
        assert!(t.get("b").is_none() && t.by("10.0.0.2").is_empty());
        let (when, old) = t.deleted("b").expect("b remembered");
        assert!(when > 0.0 && old.metadata.name.as_deref() == Some("b"));
        assert_eq!(t.deleted_by("10.0.0.2").len(), 1, "a deleted Node's address still names it");
        // A relist without a: deleted too; b back: no longer deleted.
        t.replace(vec![node("b", "10.0.0.2")]);
        assert!(t.deleted("a").is_some() && t.deleted("b").is_none());
        assert_eq!(t.keys(), vec!["b".to_owned()]);
    }

    #[test]
    fn objects_are_kept_stripped_and_a_relist_is_applied_in_place_and_told() {
        let told: Arc<Mutex<Vec<(String, bool)>>> = Arc::default();
        let t: Table<Node> = Table::indexed(addresses).keeping(strip);
        let log = Arc::clone(&told);
        t.on_change(Arc::new(move |k, o| log.lock().expect("log").push((k.to_owned(), o.is_some()))));
        t.replace(vec![node("a", "10.0.0.1"), node("b", "10.0.0.2"), node("drop-me", "10.0.0.3")]);
        let a = t.get("a").expect("a");
        assert!(a.metadata.managed_fields.is_none(), "stripped");
        assert!(a.status.as_ref().expect("status").images.is_none(), "stripped");
        assert!(!t.contains("drop-me"), "not kept at all");
        let (n, bytes) = t.size();
        assert!(n == 2 && bytes > 0 && bytes < 400, "{n} objects in {bytes} bytes");

        // A relist in progress: not synced, the old objects still there until it ends.
        t.begin_relist();
        assert!(!t.synced());
        t.relisted(node("b", "10.0.0.7"));
        assert!(t.contains("a"), "a is deleted only when the relist ends");
        t.end_relist();
        assert!(t.synced() && !t.contains("a") && t.deleted("a").is_some());
        assert_eq!(t.keys_by("10.0.0.7"), vec!["b".to_owned()]);
        let log = told.lock().expect("log").clone();
        assert_eq!(
            log,
            vec![("a".into(), true), ("b".into(), true), ("b".into(), true), ("a".into(), false)],
            "every change told, with the object; a drop that was never kept is not"
        );
        let (_, after) = t.size();
        assert!(after < bytes, "the table's bytes follow what it keeps: {after} < {bytes}");
    }
}
