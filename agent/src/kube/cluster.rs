//! What the cluster says about this node's volumes, as plain data: the pods scheduled here, the
//! VolumeAttachments for this node and every PersistentVolume, with the questions the cleaner
//! asks of them, and whether the view may be taken as evidence at all ([`ClusterView::vouch`]:
//! every watch listed since it last broke, each watch and the Node lookup heard from the API
//! server within the silence bound, and this node's Node exists). Built from API objects by pure functions; [`super::cache`] keeps it current.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::host::clock::{human, BootTime};

/// One pod scheduled on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// `status.phase` (`Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`); empty if unset.
    pub phase: String,
    /// Claims the pod mounts, in its namespace: `persistentVolumeClaim.claimName`, and
    /// `<pod>-<volume>` for generic ephemeral volumes.
    pub pvc_names: Vec<String>,
    /// The PVs bound to those claims (by the PVs' `claimRef`), where known.
    pub pv_names: Vec<String>,
    /// A mirror pod's static pod: the UID kubelet knows it by on this node (its directory
    /// `pods/<hash>`), from the annotation `kubernetes.io/config.mirror`.
    pub mirror_of: Option<String>,
    /// Its containers (init containers too), with their runtime IDs and volume mounts: what
    /// names a pin risk's container and its fix.
    pub containers: Vec<ContainerInfo>,
    /// Its `hostPath` volumes: `(volume name, host path)`.
    pub host_paths: Vec<(String, String)>,
}

/// One container of a pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerInfo {
    pub name: String,
    /// The runtime's ID from `status.containerStatuses[].containerID`, without its scheme
    /// (`containerd://`), as the cgroup shows it; empty until it runs.
    pub id: String,
    pub mounts: Vec<VolumeMountInfo>,
}

/// One `volumeMounts` entry.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VolumeMountInfo {
    pub volume: String,
    pub mount_path: String,
    /// `mountPropagation` (`None` when unset: the API's default, None).
    pub propagation: Option<String>,
}

impl PodInfo {
    /// A pod that has not finished (any phase but `Succeeded` or `Failed`): it uses its volumes,
    /// or is about to. An unknown phase counts as active: when in doubt, in use.
    pub fn is_active(&self) -> bool {
        !matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// A CSI volume source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsiVolume {
    pub driver: String,
    pub volume_handle: String,
    /// `volumeAttributes` (ceph-csi puts `pool` and `imageName` there).
    pub attributes: BTreeMap<String, String>,
}

/// An rbd image, as the kernel's `/sys/bus/rbd/devices/<id>/{pool,name}` show it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RbdImage {
    pub pool: String,
    pub image: String,
}

/// One PersistentVolume.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PvInfo {
    pub name: String,
    /// `metadata.uid` (what an Event's `involvedObject` names it by).
    pub uid: String,
    /// `status.phase` (`Bound`, `Released`, ...); empty if unset.
    pub phase: String,
    /// `spec.claimRef` namespace and name.
    pub claim: Option<(String, String)>,
    /// `spec.claimRef.uid`: the bound claim's UID.
    pub claim_uid: Option<String>,
    pub csi: Option<CsiVolume>,
    /// The rbd image behind the volume: the in-tree `rbd` source (pool defaults to `rbd`), or a
    /// ceph-csi rbd volume's `pool`/`imageName` attributes.
    pub rbd: Option<RbdImage>,
}

/// One VolumeAttachment for this node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VaInfo {
    pub name: String,
    /// The CSI driver that attaches (`rbd.csi.ceph.com`).
    pub attacher: String,
    pub node: String,
    /// `spec.source.persistentVolumeName`; `None` for inline (migrated) volumes.
    pub pv: Option<String>,
    /// `status.attached`; false until the attacher reports it.
    pub attached: bool,
}

/// How long one watch (or the Node lookup) may go without hearing from the API server before the
/// view stops vouching, unless told otherwise.
///
/// Why 90 s: the API server's watch cache sends every watch that asked for them
/// (`allowWatchBookmarks=true`) a bookmark about once a minute (its `bookmarkFrequency`, and
/// once more ~2 s before the watch's own timeout), so a watch that is quiet but live hears
/// something at least every ~60 s, plus the cache's dispatch lag. 90 s leaves it 30 s of slack:
/// a quiet watch does not flap, and a stream stalled without an error (a half-open connection, a
/// proxy that stopped forwarding) is noticed within 90 s instead of at the watch's 290 s timeout
/// or the client's read timeout. The Node lookup answers every 20 s, so 90 s is four missed
/// lookups. A watch silent past the bound is dropped and relisted ([`super::cache`]): it vouches
/// again only once that relist is complete. (An API server with its watch cache disabled sends no
/// bookmarks: there, a watch with no events relists every 90 s, which is wasteful but safe.)
pub const DEFAULT_SILENCE_BOUND: Duration = Duration::from_secs(90);

/// The health of one of the three watches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchHealth {
    /// The watched resource: `pods`, `volumeattachments` or `persistentvolumes`.
    pub resource: &'static str,
    /// True once its list has arrived whole, and again only after a relist that followed a break.
    pub synced: bool,
    /// Why the watch broke, kept until the relist that follows commits.
    pub error: Option<String>,
    /// When this watch last heard from the API server: a listed or watched object, a completed
    /// list, an answered watch request or a bookmark, on the clock that cannot jump. `None`: never.
    pub heard: Option<BootTime>,
}

impl WatchHealth {
    /// Equal but for [`heard`](Self::heard).
    fn same_state(&self, other: &WatchHealth) -> bool {
        self.resource == other.resource && self.synced == other.synced && self.error == other.error
    }
}

/// The cluster's state as far as this node is concerned; republished on every change (readers
/// are woken only when something but the contact times changed, or the verdict of
/// [`vouch`](Self::vouch) did: see [`super::cache`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    pub node_name: String,
    /// Pods scheduled on this node, by namespace and name.
    pub pods_on_node: Vec<PodInfo>,
    /// VolumeAttachments whose `spec.nodeName` is this node, by name.
    pub volume_attachments: Vec<VaInfo>,
    /// Every PersistentVolume, by name.
    pub pvs: Vec<PvInfo>,
    /// True while every watch has listed since it last broke. Until then the view says nothing:
    /// an absent pod may just not be listed (or relisted) yet. The lists stay as last seen.
    pub synced: bool,
    /// The pods, VolumeAttachments and PersistentVolumes watches, in that order (empty in a view
    /// made by hand).
    pub watches: Vec<WatchHealth>,
    /// The failure that matters most now: a broken watch's (`pods: ...`), kept until that watch
    /// has relisted; else the last Node probe's, kept until a probe is answered.
    pub last_error: Option<String>,
    /// Whether a Node named [`node_name`](Self::node_name) exists: `None` until a lookup is
    /// answered, then as of the last answer (a failed lookup keeps it).
    pub node_found: Option<bool>,
    /// When a lookup of this node's Node was last answered (found or not), on the clock that
    /// cannot jump: the Node's sign of life. Each watch's own is [`WatchHealth::heard`].
    pub last_contact: Option<BootTime>,
    /// Longer than this without hearing from the API server, on any one watch or the Node
    /// lookup, and the view stops vouching ([`DEFAULT_SILENCE_BOUND`] says why 90 s).
    pub silence_bound: Duration,
    /// Why no client for the API could be made (a kubeconfig that cannot be read, no token, an
    /// in-cluster service account missing, no API configured at all): the view says nothing
    /// until a connection comes up ([`super::source`] retries with backoff).
    pub connect_error: Option<String>,
}

impl Default for ClusterView {
    fn default() -> Self {
        ClusterView {
            node_name: String::new(),
            pods_on_node: Vec::new(),
            volume_attachments: Vec::new(),
            pvs: Vec::new(),
            synced: false,
            watches: Vec::new(),
            last_error: None,
            node_found: None,
            last_contact: None,
            silence_bound: DEFAULT_SILENCE_BOUND,
            connect_error: None,
        }
    }
}

impl ClusterView {
    /// Whether the view may be taken as evidence at `now` ("no pod on this node uses this PV"):
    /// every watch has listed since it last broke, every watch and the Node lookup heard from
    /// the API server within [`silence_bound`](Self::silence_bound) (one silent watch is enough
    /// to refuse, and is named), and a Node named [`node_name`](Self::node_name) exists.
    /// Otherwise the one reason why not, as a sentence without its period. A pure function of
    /// the view and `now`: it never waits on the API.
    pub fn vouch(&self, now: BootTime) -> Result<(), String> {
        if let Some(why) = &self.connect_error {
            return Err(format!("no connection to the Kubernetes API: {why}"));
        }
        if let Some(why) = self.unsynced() {
            return Err(why);
        }
        if let Some(why) = self.silent(now) {
            return Err(why);
        }
        match self.node_found {
            Some(true) => Ok(()),
            Some(false) => Err(format!(
                "no Node named '{}' in the cluster: its pods and attachments cannot be told from none",
                self.node_name
            )),
            // Every watch is synced here, so any error left is the lookup's.
            None => Err(match &self.last_error {
                Some(e) => format!("the Node '{}' has not been looked up yet ({e})", self.node_name),
                None => format!("the Node '{}' has not been looked up yet", self.node_name),
            }),
        }
    }

    /// Which source has not heard from the API server within the bound, if any: when every one
    /// is silent, the API as a whole (for the shortest silence); else the first silent watch,
    /// else the Node lookup.
    fn silent(&self, now: BootTime) -> Option<String> {
        let bound = self.silence_bound;
        // `None`: never heard. A contact after `now` is no silence.
        let silence = |at: Option<BootTime>| at.map(|at| now.since(at));
        let too_long = |s: Option<Duration>| s.is_none_or(|s| s > bound);
        let node = silence(self.last_contact);
        let watches: Vec<(&str, Option<Duration>)> =
            self.watches.iter().map(|w| (w.resource, silence(w.heard))).collect();
        if too_long(node) && watches.iter().all(|(_, s)| too_long(*s)) {
            let shortest = watches.iter().map(|(_, s)| *s).chain([node]).flatten().min();
            return Some(match shortest {
                None => "the Kubernetes API has not answered yet".to_string(),
                Some(s) => {
                    format!("the Kubernetes API has not answered for {} (bound {})", human(s), human(bound))
                }
            });
        }
        if let Some((resource, s)) = watches.iter().find(|(_, s)| too_long(*s)) {
            return Some(match s {
                None => format!("the {resource} watch has not heard from the API server yet"),
                Some(s) => format!(
                    "the {resource} watch has not heard from the API server for {} (bound {}): \
                     no event, no bookmark",
                    human(*s),
                    human(bound)
                ),
            });
        }
        match node {
            Some(s) if s > bound => Some(format!(
                "the Node lookup has not been answered for {} (bound {})",
                human(s),
                human(bound)
            )),
            Some(_) => None,
            None => Some("the Node lookup has not been answered yet".to_string()),
        }
    }

    /// Why the lists are not evidence, if they are not: the first broken watch, else the first
    /// that has not listed yet.
    fn unsynced(&self) -> Option<String> {
        if let Some(w) = self.watches.iter().find(|w| !w.synced && w.error.is_some()) {
            let error = w.error.as_deref().unwrap_or_default();
            return Some(format!("the {} watch broke ({error}): relisting", w.resource));
        }
        if let Some(w) = self.watches.iter().find(|w| !w.synced) {
            return Some(format!("the {} watch is not synced yet", w.resource));
        }
        (!self.synced).then(|| "the Kubernetes view is not synced yet".to_string())
    }

    /// Equal but for the contact times ([`last_contact`](Self::last_contact),
    /// [`WatchHealth::heard`]): nothing a reader would act on differs, though whether the view
    /// vouches at a given time may.
    pub(crate) fn same_evidence(&self, other: &ClusterView) -> bool {
        // Destructured, so that a new field cannot be forgotten here.
        let ClusterView {
            node_name,
            pods_on_node,
            volume_attachments,
            pvs,
            synced,
            watches,
            last_error,
            node_found,
            last_contact: _,
            silence_bound,
            connect_error,
        } = self;
        *node_name == other.node_name
            && *pods_on_node == other.pods_on_node
            && *volume_attachments == other.volume_attachments
            && *pvs == other.pvs
            && *synced == other.synced
            && watches.len() == other.watches.len()
            && watches.iter().zip(&other.watches).all(|(a, b)| a.same_state(b))
            && *last_error == other.last_error
            && *node_found == other.node_found
            && *silence_bound == other.silence_bound
            && *connect_error == other.connect_error
    }

    /// Whether an attached VolumeAttachment on this node names the PV.
    pub fn pv_attached_to_node(&self, pv: &str) -> bool {
        self.volume_attachments.iter().any(|va| va.attached && va.pv.as_deref() == Some(pv))
    }

    /// Active pods on this node ([`PodInfo::is_active`]) with a claim bound to the PV.
    pub fn running_pods_using_pv(&self, pv: &str) -> Vec<&PodInfo> {
        self.pods_on_node.iter().filter(|p| p.is_active() && p.pv_names.iter().any(|n| n == pv)).collect()
    }

    /// Every PV the API says is in use on this node: bound to an active pod's claim, or named by
    /// an attached VolumeAttachment; each with why (one reason per user).
    pub fn pvs_in_use(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for pod in self.pods_on_node.iter().filter(|p| p.is_active()) {
            for pv in &pod.pv_names {
                out.push((pv.clone(), format!("pod {}/{} ({}) uses it", pod.namespace, pod.name, pod.phase)));
            }
        }
        for va in self.volume_attachments.iter().filter(|va| va.attached) {
            if let Some(pv) = &va.pv {
                out.push((pv.clone(), format!("VolumeAttachment {} attaches it to this node", va.name)));
            }
        }
        out
    }

    /// The pod on this node kubelet knows by `uid` (its directory `pods/<uid>`): the pod with
    /// that UID, or the mirror pod of the static pod with that config hash.
    pub fn pod_by_uid(&self, uid: &str) -> Option<&PodInfo> {
        self.pods_on_node.iter().find(|p| p.uid == uid || p.mirror_of.as_deref() == Some(uid))
    }

    /// The PV by name.
    pub fn pv(&self, name: &str) -> Option<&PvInfo> {
        self.pvs.iter().find(|pv| pv.name == name)
    }

    /// The PV backed by an rbd image (a mapped `/dev/rbdN`'s pool and image).
    pub fn pv_for_rbd(&self, pool: &str, image: &str) -> Option<&PvInfo> {
        self.pvs.iter().find(|pv| pv.rbd.as_ref().is_some_and(|r| r.pool == pool && r.image == image))
    }

    /// Fills each pod's `pv_names` from the PVs' claim references.
    pub(crate) fn resolve_claims(&mut self) {
        let by_claim: HashMap<(&str, &str), &str> = self
            .pvs
            .iter()
            .filter_map(|pv| pv.claim.as_ref().map(|(ns, n)| ((ns.as_str(), n.as_str()), pv.name.as_str())))
            .collect();
        for pod in &mut self.pods_on_node {
            pod.pv_names = pod
                .pvc_names
                .iter()
                .filter_map(|c| by_claim.get(&(pod.namespace.as_str(), c.as_str())).map(|s| s.to_string()))
                .collect();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kube::reduce::{pod_info, pv_info};
    use k8s_openapi::api::core::v1::{PersistentVolume, Pod};

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).expect("pod json")
    }

    #[test]
    fn pod_claims_and_ephemeral_volumes() {
        let p = pod(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "u1"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "cfg", "configMap": {"name": "x"}}
            ]},
            "status": {"phase": "Running"}
        }));
        let info = pod_info(&p);
        assert_eq!(info.pvc_names, ["data-web-0", "web-0-scratch"]);
        assert_eq!(info.phase, "Running");
        assert!(info.is_active());
    }

    #[test]
    fn pv_rbd_image_from_in_tree_and_ceph_csi() {
        let in_tree: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "old"},
            "spec": {"rbd": {"image": "img1", "monitors": ["10.0.0.1:6789"]}}
        }))
        .expect("pv json");
        assert_eq!(pv_info(&in_tree).rbd, Some(RbdImage { pool: "rbd".into(), image: "img1".into() }));
        let csi: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "new"},
            "spec": {"csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "h",
                "volumeAttributes": {"pool": "replicapool", "imageName": "csi-vol-1"}}}
        }))
        .expect("pv json");
        assert_eq!(
            pv_info(&csi).rbd,
            Some(RbdImage { pool: "replicapool".into(), image: "csi-vol-1".into() })
        );
    }

    fn at(secs: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(secs))
    }

    /// Synced, the Node found, the API heard from at 100 s.
    fn vouching() -> ClusterView {
        ClusterView {
            node_name: "node-a".into(),
            synced: true,
            watches: ["pods", "volumeattachments", "persistentvolumes"]
                .into_iter()
                .map(|resource| WatchHealth { resource, synced: true, error: None, heard: Some(at(100)) })
                .collect(),
            node_found: Some(true),
            last_contact: Some(at(100)),
            ..Default::default()
        }
    }

    #[test]
    fn vouches_only_synced_fresh_and_for_an_existing_node() {
        let view = vouching();
        assert_eq!(view.silence_bound, DEFAULT_SILENCE_BOUND);
        assert_eq!(view.vouch(at(100)), Ok(()));
        assert_eq!(view.vouch(at(190)), Ok(()), "at the bound");
        assert_eq!(view.vouch(at(50)), Ok(()), "a contact after `now` is no silence");
        assert_eq!(
            view.vouch(at(230)),
            Err("the Kubernetes API has not answered for 2m10s (bound 1m30s)".to_string())
        );
        let short = ClusterView { silence_bound: Duration::from_secs(5), ..vouching() };
        assert_eq!(short.vouch(at(106)), Err("the Kubernetes API has not answered for 6s (bound 5s)".into()));

        // One watch silent, the others and the Node heard from: that watch is named.
        let mut one = vouching();
        for w in &mut one.watches {
            w.heard = Some(at(200));
        }
        one.last_contact = Some(at(200));
        one.watches[1].heard = Some(at(105));
        assert_eq!(one.vouch(at(195)), Ok(()), "within the bound");
        assert_eq!(
            one.vouch(at(200)),
            Err("the volumeattachments watch has not heard from the API server for 1m35s (bound 1m30s): \
                 no event, no bookmark"
                .into())
        );
        one.watches[1].heard = None;
        assert_eq!(
            one.vouch(at(200)),
            Err("the volumeattachments watch has not heard from the API server yet".into())
        );
        one.watches[1].heard = Some(at(200));
        assert_eq!(one.vouch(at(200)), Ok(()), "it answered again");
        // The Node lookup alone silent.
        one.last_contact = Some(at(100));
        assert_eq!(
            one.vouch(at(200)),
            Err("the Node lookup has not been answered for 1m40s (bound 1m30s)".into())
        );
        one.last_contact = None;
        assert_eq!(one.vouch(at(200)), Err("the Node lookup has not been answered yet".into()));

        let mut broke = vouching();
        broke.synced = false;
        broke.watches[0] = WatchHealth {
            resource: "pods",
            synced: false,
            error: Some("watch stream failed: EOF".into()),
            heard: Some(at(100)),
        };
        broke.watches[2].synced = false;
        assert_eq!(
            broke.vouch(at(100)),
            Err("the pods watch broke (watch stream failed: EOF): relisting".into()),
            "a broken watch before one that has not listed"
        );
        broke.watches[0] = WatchHealth { resource: "pods", synced: true, error: None, heard: Some(at(100)) };
        assert_eq!(broke.vouch(at(100)), Err("the persistentvolumes watch is not synced yet".into()));
        let unsynced = ClusterView { synced: false, watches: Vec::new(), ..vouching() };
        assert_eq!(unsynced.vouch(at(100)), Err("the Kubernetes view is not synced yet".into()));
        let inconsistent = ClusterView { synced: true, ..broke };
        assert!(inconsistent.vouch(at(100)).is_err(), "any unsynced watch is enough");

        let gone = ClusterView { node_found: Some(false), ..vouching() };
        assert_eq!(
            gone.vouch(at(100)),
            Err("no Node named 'node-a' in the cluster: its pods and attachments cannot be told from none"
                .into())
        );
        let unknown = ClusterView { node_found: None, ..vouching() };
        assert_eq!(unknown.vouch(at(100)), Err("the Node 'node-a' has not been looked up yet".into()));
        let failing = ClusterView {
            node_found: None,
            last_error: Some("get node node-a: forbidden".into()),
            ..vouching()
        };
        assert_eq!(
            failing.vouch(at(100)),
            Err("the Node 'node-a' has not been looked up yet (get node node-a: forbidden)".into())
        );
        let never = ClusterView { last_contact: None, ..vouching() };
        assert_eq!(never.vouch(at(100)), Err("the Node lookup has not been answered yet".into()));
        let mut nothing = ClusterView { last_contact: None, ..vouching() };
        for w in &mut nothing.watches {
            w.heard = None;
        }
        assert_eq!(nothing.vouch(at(100)), Err("the Kubernetes API has not answered yet".into()));
        assert!(ClusterView::default().vouch(at(0)).is_err(), "a default view vouches for nothing");
    }

    #[test]
    fn same_evidence_ignores_only_the_contact_time() {
        let a = vouching();
        let mut b = ClusterView { last_contact: Some(at(500)), ..vouching() };
        b.watches[2].heard = Some(at(400));
        assert!(a.same_evidence(&b) && a != b);
        let mut c = vouching();
        c.watches[2].error = Some("x".into());
        assert!(!a.same_evidence(&c));
        assert!(!a.same_evidence(&ClusterView { node_found: Some(false), ..vouching() }));
        assert!(!a.same_evidence(&ClusterView { synced: false, ..vouching() }));
    }

    #[test]
    fn finished_pods_do_not_use_volumes() {
        let mut view = ClusterView {
            pods_on_node: vec![
                PodInfo {
                    name: "a".into(),
                    namespace: "ns".into(),
                    phase: "Succeeded".into(),
                    pvc_names: vec!["c".into()],
                    ..Default::default()
                },
                PodInfo {
                    name: "b".into(),
                    namespace: "ns".into(),
                    phase: "Pending".into(),
                    pvc_names: vec!["c".into()],
                    ..Default::default()
                },
                PodInfo {
                    name: "d".into(),
                    namespace: "other".into(),
                    phase: "Running".into(),
                    pvc_names: vec!["c".into()],
                    ..Default::default()
                },
            ],
            pvs: vec![PvInfo {
                name: "pv1".into(),
                claim: Some(("ns".into(), "c".into())),
                ..Default::default()
            }],
            ..Default::default()
        };
        view.resolve_claims();
        let users: Vec<&str> = view.running_pods_using_pv("pv1").iter().map(|p| p.name.as_str()).collect();
        assert_eq!(users, ["b"]);
    }
}
