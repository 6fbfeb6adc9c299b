//! What the cluster says about this node's volumes, as plain data: the pods scheduled here, the
//! VolumeAttachments for this node and every PersistentVolume, with the questions the cleaner
//! asks of them. Built from API objects by pure functions; [`super::cache`] keeps it current.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;

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
    /// `status.phase` (`Bound`, `Released`, ...); empty if unset.
    pub phase: String,
    /// `spec.claimRef` namespace and name.
    pub claim: Option<(String, String)>,
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

/// The cluster's state as far as this node is concerned; replaced whole on every change.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub node_name: String,
    /// Pods scheduled on this node, by namespace and name.
    pub pods_on_node: Vec<PodInfo>,
    /// VolumeAttachments whose `spec.nodeName` is this node, by name.
    pub volume_attachments: Vec<VaInfo>,
    /// Every PersistentVolume, by name.
    pub pvs: Vec<PvInfo>,
    /// True once the initial lists of pods, VolumeAttachments and PVs have all arrived. Until then
    /// the view says nothing: an absent pod may just not be listed yet.
    pub synced: bool,
    /// The latest failure of any watch (`pods: ...`), cleared by the next event from that watch
    /// (a watch that recovers into a quiet stream keeps it until something changes).
    pub last_error: Option<String>,
}

impl ClusterView {
    /// Whether an attached VolumeAttachment on this node names the PV.
    pub fn pv_attached_to_node(&self, pv: &str) -> bool {
        self.volume_attachments.iter().any(|va| va.attached && va.pv.as_deref() == Some(pv))
    }

    /// Active pods on this node ([`PodInfo::is_active`]) with a claim bound to the PV.
    pub fn running_pods_using_pv(&self, pv: &str) -> Vec<&PodInfo> {
        self.pods_on_node.iter().filter(|p| p.is_active() && p.pv_names.iter().any(|n| n == pv)).collect()
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

/// A pod's plain data; `pv_names` is left empty for [`ClusterView::resolve_claims`].
pub fn pod_info(pod: &Pod) -> PodInfo {
    let meta = &pod.metadata;
    let name = meta.name.clone().unwrap_or_default();
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    let pvc_names = volumes
        .iter()
        .filter_map(|v| {
            if let Some(pvc) = &v.persistent_volume_claim {
                Some(pvc.claim_name.clone())
            } else {
                v.ephemeral.as_ref().map(|_| format!("{name}-{}", v.name))
            }
        })
        .collect();
    PodInfo {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        name,
        pvc_names,
        pv_names: Vec::new(),
    }
}

/// A PersistentVolume's plain data.
pub fn pv_info(pv: &PersistentVolume) -> PvInfo {
    let spec = pv.spec.as_ref();
    let claim = spec.and_then(|s| s.claim_ref.as_ref()).and_then(|c| match (&c.namespace, &c.name) {
        (Some(ns), Some(n)) => Some((ns.clone(), n.clone())),
        _ => None,
    });
    let csi = spec.and_then(|s| s.csi.as_ref()).map(|c| CsiVolume {
        driver: c.driver.clone(),
        volume_handle: c.volume_handle.clone(),
        attributes: c.volume_attributes.clone().unwrap_or_default(),
    });
    let in_tree = spec.and_then(|s| s.rbd.as_ref()).map(|r| RbdImage {
        pool: r.pool.clone().unwrap_or_else(|| "rbd".to_string()),
        image: r.image.clone(),
    });
    let rbd = in_tree.or_else(|| csi.as_ref().and_then(ceph_csi_rbd_image));
    PvInfo {
        name: pv.metadata.name.clone().unwrap_or_default(),
        phase: pv.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        claim,
        csi,
        rbd,
    }
}

/// A ceph-csi rbd volume's image, from the attributes its provisioner sets.
fn ceph_csi_rbd_image(csi: &CsiVolume) -> Option<RbdImage> {
    if !csi.driver.ends_with("rbd.csi.ceph.com") {
        return None;
    }
    let pool = csi.attributes.get("pool")?;
    let image = csi.attributes.get("imageName")?;
    Some(RbdImage { pool: pool.clone(), image: image.clone() })
}

/// A VolumeAttachment's plain data.
pub fn va_info(va: &VolumeAttachment) -> VaInfo {
    VaInfo {
        name: va.metadata.name.clone().unwrap_or_default(),
        attacher: va.spec.attacher.clone(),
        node: va.spec.node_name.clone(),
        pv: va.spec.source.persistent_volume_name.clone(),
        attached: va.status.as_ref().is_some_and(|s| s.attached),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
