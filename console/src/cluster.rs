//! What Kubernetes believes about volumes, kept current with watches: Nodes (their
//! `status.volumesAttached` and `volumesInUse`), PersistentVolumes, PersistentVolumeClaims and
//! VolumeAttachments. Read-only (get/list/watch). Each table says whether it is synced (listed
//! in full since it started or since its watch last failed); answers that need a table that is
//! not synced say so instead of guessing.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio_stream::StreamExt;

/// Whether a table is synced, and its objects by key.
type Contents<K> = (bool, BTreeMap<String, Arc<K>>);

/// One collection, keyed by `namespace/name` (`name` for cluster-scoped objects).
pub struct Table<K> {
    inner: Arc<RwLock<Contents<K>>>,
}

impl<K> Clone for Table<K> {
    fn clone(&self) -> Self {
        Self { inner: Arc::clone(&self.inner) }
    }
}

impl<K> Default for Table<K> {
    fn default() -> Self {
        Self { inner: Arc::new(RwLock::new((false, BTreeMap::new()))) }
    }
}

impl<K: Resource> Table<K> {
    fn key(o: &K) -> String {
        match o.meta().namespace.as_deref() {
            Some(ns) => format!("{ns}/{}", o.meta().name.clone().unwrap_or_default()),
            None => o.meta().name.clone().unwrap_or_default(),
        }
    }

    /// Whether the table was listed in full and its watch has not failed since.
    pub fn synced(&self) -> bool {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).0
    }

    /// One object by key.
    pub fn get(&self, key: &str) -> Option<Arc<K>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).1.get(key).cloned()
    }

    /// Every object.
    pub fn all(&self) -> Vec<Arc<K>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).1.values().cloned().collect()
    }

    /// Replaces the contents (tests, and a complete relist).
    pub fn replace(&self, objects: Vec<K>) {
        let map = objects.into_iter().map(|o| (Self::key(&o), Arc::new(o))).collect();
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = (true, map);
    }
}

/// Follows one collection into `table` until the task is aborted. A watch that fails in any way
/// is not resumed: the table is marked unsynced at once, the watcher dropped and, after a backoff
/// (1 s doubling to 30 s, reset by a complete list), a fresh one lists again; only a complete
/// list marks the table synced (as the agent's `kube/cache.rs` does: a resumed watch could have
/// missed changes).
async fn follow<K>(api: Api<K>, table: Table<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        let mut relist: Option<BTreeMap<String, Arc<K>>> = None;
        let mut stream =
            std::pin::pin!(watcher::watcher(api.clone(), watcher::Config::default().any_semantic()));
        while let Some(ev) = stream.next().await {
            let mut t = table.inner.write().unwrap_or_else(|p| p.into_inner());
            match ev {
                Ok(Event::Init) => relist = Some(BTreeMap::new()),
                Ok(Event::InitApply(o)) => {
                    if let Some(r) = relist.as_mut() {
                        r.insert(Table::key(&o), Arc::new(o));
                    }
                }
                Ok(Event::InitDone) => {
                    *t = (true, relist.take().unwrap_or_default());
                    backoff = std::time::Duration::from_secs(1);
                }
                Ok(Event::Apply(o)) => {
                    t.1.insert(Table::key(&o), Arc::new(o));
                }
                Ok(Event::Delete(o)) => {
                    t.1.remove(&Table::key(&o));
                }
                Err(e) => {
                    t.0 = false;
                    tracing::warn!(kind = %K::kind(&()), error = %e, retry_in = ?backoff, "watch failed; relisting");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
    }
}

/// The cluster's view of volumes.
#[derive(Clone, Default)]
pub struct Cluster {
    pub nodes: Table<Node>,
    pub pvs: Table<PersistentVolume>,
    pub pvcs: Table<PersistentVolumeClaim>,
    pub vas: Table<VolumeAttachment>,
}

impl Cluster {
    /// Starts the four watches; they stop when the handles are aborted.
    pub fn spawn(client: Client) -> (Self, Vec<tokio::task::JoinHandle<()>>) {
        let c = Cluster::default();
        let tasks = vec![
            tokio::spawn(follow(Api::<Node>::all(client.clone()), c.nodes.clone())),
            tokio::spawn(follow(Api::<PersistentVolume>::all(client.clone()), c.pvs.clone())),
            tokio::spawn(follow(Api::<PersistentVolumeClaim>::all(client.clone()), c.pvcs.clone())),
            tokio::spawn(follow(Api::<VolumeAttachment>::all(client), c.vas.clone())),
        ];
        (c, tasks)
    }

    /// Why answers about volumes cannot be trusted now (`None`: all four tables synced).
    pub fn not_synced(&self) -> Option<String> {
        let missing: Vec<&str> = [
            ("nodes", self.nodes.synced()),
            ("persistentvolumes", self.pvs.synced()),
            ("persistentvolumeclaims", self.pvcs.synced()),
            ("volumeattachments", self.vas.synced()),
        ]
        .into_iter()
        .filter(|(_, s)| !s)
        .map(|(n, _)| n)
        .collect();
        (!missing.is_empty()).then(|| format!("the Kubernetes view is not synced: {}", missing.join(", ")))
    }

    /// The PV a PVC (`namespace/name`) is bound to.
    pub fn pv_of_pvc(&self, pvc: &str) -> Result<String, String> {
        let Some(c) = self.pvcs.get(pvc) else { return Err(format!("no PersistentVolumeClaim {pvc}")) };
        c.spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .filter(|v| !v.is_empty())
            .ok_or_else(|| format!("PersistentVolumeClaim {pvc} is not bound to a volume"))
    }

    /// A PV by name.
    pub fn pv(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.pvs.get(name)
    }

    /// VolumeAttachments of a PV.
    pub fn vas_of(&self, pv: &str) -> Vec<Arc<VolumeAttachment>> {
        self.vas
            .all()
            .into_iter()
            .filter(|va| va.spec.source.persistent_volume_name.as_deref() == Some(pv))
            .collect()
    }

    /// The Node whose `status.addresses` include `ip`.
    pub fn node_with_address(&self, ip: &str) -> Option<String> {
        self.nodes.all().into_iter().find_map(|n| {
            let has = n.status.as_ref()?.addresses.as_ref()?.iter().any(|a| a.address == ip);
            has.then(|| n.metadata.name.clone().unwrap_or_default())
        })
    }

    /// The name of an object.
    pub fn name_of<K: Resource>(o: &K) -> String {
        o.name_any()
    }
}
