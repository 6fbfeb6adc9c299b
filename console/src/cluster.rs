//! What Kubernetes believes about volumes, kept current with watches: Nodes (their
//! `status.volumesAttached` and `volumesInUse`), PersistentVolumes, PersistentVolumeClaims,
//! VolumeAttachments, and the pods Explain needs (those with a volume that may be a block device,
//! found by the claims they use). Read-only (get/list/watch). Each table says whether it is
//! synced (listed in full since it started or since its watch last failed); answers that need a
//! table that is not synced say so instead of guessing. What is kept of each object:
//! [`crate::kube_keep`].

use std::fmt::Debug;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_stream::StreamExt;

use crate::kube_keep;
pub use crate::kube_table::Table;

/// Objects a list page holds: a 100,000-pod collection is read in 200 answers of a few MB each.
pub const LIST_PAGE: u32 = 500;

/// How the console lists and then watches a collection: pages of [`LIST_PAGE`] objects, read
/// at the most recent resource version. The API server honours `limit` only there: a list at
/// resource version 0 is answered from its watch cache in one piece whatever the limit, and one
/// answer of 100,000 pods takes a replica to 3.2 GiB while it is decoded (measured with the
/// stand-in API server, BENCHMARKS.md) and starves its agent links. kube's `any_semantic` asks
/// version 0, but kube-core leaves the version out of a list that has a limit, so the wire was
/// the same; this says it where it is decided (`tests/console.rs` checks the requests).
pub fn paged_watch() -> watcher::Config {
    watcher::Config::default().list_semantic(watcher::ListSemantic::MostRecent).page_size(LIST_PAGE)
}

/// Follows one collection into `table` until the task is aborted. A watch that fails in any way
/// is not resumed: the table is marked unsynced at once, the watcher dropped and, after a backoff
/// (1 s doubling to 30 s, reset by a complete list), a fresh one lists again; only a complete
/// list marks the table synced (as the agent's `kube/cache.rs` does: a resumed watch could have
/// missed changes). The list is read in pages ([`paged_watch`]) and applied in place as each
/// page arrives: neither the whole answer nor a second copy of the collection is ever held.
async fn follow<K>(api: Api<K>, table: Table<K>)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug + Send + Sync + 'static,
{
    let mut backoff = std::time::Duration::from_secs(1);
    loop {
        let mut stream = std::pin::pin!(watcher::watcher(api.clone(), paged_watch()));
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => table.begin_relist(),
                Ok(Event::InitApply(o)) => table.relisted(o),
                Ok(Event::InitDone) => {
                    table.end_relist();
                    backoff = std::time::Duration::from_secs(1);
                }
                Ok(Event::Apply(o)) => table.applied(o),
                Ok(Event::Delete(o)) => table.removed(&o),
                Err(e) => {
                    table.unsynced();
                    tracing::warn!(kind = %K::kind(&()), error = %e, retry_in = ?backoff, "watch failed; relisting");
                    break;
                }
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
    }
}

/// A Node's addresses (its secondary keys): a client's IP names its node.
pub fn node_addresses(n: &Node) -> Vec<String> {
    n.status.iter().flat_map(|s| s.addresses.iter().flatten()).map(|a| a.address.clone()).collect()
}

/// A Node's secondary keys: its addresses, and `volume:NAME` for each volume its status lists
/// attached or in use (the unique names kubelet and the attach/detach controller use).
fn node_keys(n: &Node) -> Vec<String> {
    let mut keys = node_addresses(n);
    if let Some(s) = &n.status {
        let attached = s.volumes_attached.iter().flatten().map(|a| a.name.as_str());
        let in_use = s.volumes_in_use.iter().flatten().map(String::as_str);
        for name in attached.chain(in_use) {
            let k = format!("volume:{name}");
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    keys
}

/// A VolumeAttachment's secondary keys: its PV, and `node:NAME`.
fn va_keys(va: &VolumeAttachment) -> Vec<String> {
    let mut keys: Vec<String> = va.spec.source.persistent_volume_name.iter().cloned().collect();
    keys.push(format!("node:{}", va.spec.node_name));
    keys
}

/// The cluster's view of volumes; and the client that reads what it does not watch (a pod and
/// its events, for Explain).
#[derive(Clone)]
pub struct Cluster {
    pub nodes: Table<Node>,
    pub pvs: Table<PersistentVolume>,
    pub pvcs: Table<PersistentVolumeClaim>,
    pub vas: Table<VolumeAttachment>,
    /// The pods Explain needs (a volume that may be a block device), found by `claim:NS/NAME`.
    pub pods: Table<Pod>,
    /// The API client (`None` in tests that fill the tables by hand).
    pub client: Option<Client>,
}

impl Default for Cluster {
    fn default() -> Self {
        Cluster {
            nodes: Table::indexed(node_keys).keeping(kube_keep::node),
            pvs: Table::default().keeping(kube_keep::pv),
            pvcs: Table::default().keeping(kube_keep::pvc),
            vas: Table::indexed(va_keys).keeping(kube_keep::va),
            pods: Table::indexed(kube_keep::pod_claims).keeping(kube_keep::pod),
            client: None,
        }
    }
}

impl Cluster {
    /// The view of `client`'s cluster, not yet followed ([`Cluster::follow`] starts the watches:
    /// whoever listens to the tables' changes registers first).
    pub fn new(client: Client) -> Self {
        Cluster { client: Some(client), ..Cluster::default() }
    }

    /// Starts the five watches; they stop when the handles are aborted.
    pub fn follow(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let Some(client) = self.client.clone() else { return Vec::new() };
        vec![
            tokio::spawn(follow(Api::<Node>::all(client.clone()), self.nodes.clone())),
            tokio::spawn(follow(Api::<PersistentVolume>::all(client.clone()), self.pvs.clone())),
            tokio::spawn(follow(Api::<PersistentVolumeClaim>::all(client.clone()), self.pvcs.clone())),
            tokio::spawn(follow(Api::<VolumeAttachment>::all(client.clone()), self.vas.clone())),
            tokio::spawn(follow(Api::<Pod>::all(client), self.pods.clone())),
        ]
    }

    /// Every table listed in full (the pods too): what a replica needs before it is ready.
    pub fn all_synced(&self) -> bool {
        self.not_synced().is_none() && self.pods.synced()
    }

    /// Objects kept and their bytes, by kind (for metrics and BENCHMARKS.md).
    pub fn sizes(&self) -> [(&'static str, (usize, usize)); 5] {
        [
            ("nodes", self.nodes.size()),
            ("persistentvolumes", self.pvs.size()),
            ("persistentvolumeclaims", self.pvcs.size()),
            ("volumeattachments", self.vas.size()),
            ("pods", self.pods.size()),
        ]
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

    /// VolumeAttachments of a PV (indexed: its matches, not every attachment).
    pub fn vas_of(&self, pv: &str) -> Vec<Arc<VolumeAttachment>> {
        self.vas.by(pv)
    }

    /// The Node whose `status.addresses` include `ip` (indexed).
    pub fn node_with_address(&self, ip: &str) -> Option<String> {
        self.nodes.keys_by(ip).into_iter().next()
    }

    /// The pods (kept: those with a volume that may be a block device) that use claim
    /// `NAMESPACE/NAME`.
    pub fn pods_claiming(&self, claim: &str) -> Vec<Arc<Pod>> {
        self.pods.by(&format!("claim:{claim}"))
    }

    /// The Nodes whose status lists a volume by its unique name (attached or in use; indexed).
    pub fn nodes_listing(&self, unique_name: &str) -> Vec<Arc<Node>> {
        self.nodes.by(&format!("volume:{unique_name}"))
    }

    /// A Node deleted (as this console saw it) whose addresses included `ip`: its name and when.
    pub fn deleted_node_with_address(&self, ip: &str) -> Option<(String, f64)> {
        self.nodes
            .deleted_by(ip)
            .into_iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(when, n)| (n.metadata.name.clone().unwrap_or_default(), when))
    }

    /// The name of an object.
    pub fn name_of<K: Resource>(o: &K) -> String {
        o.name_any()
    }
}
