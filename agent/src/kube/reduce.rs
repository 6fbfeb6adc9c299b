//! API objects reduced to the plain data the cluster view keeps ([`super::cluster`]): a pod's
//! claims, a PV's claim, CSI source and rbd image, a VolumeAttachment's node and PV. Pure.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::cluster::{ContainerInfo, CsiVolume, PodInfo, PvInfo, RbdImage, VaInfo, VolumeMountInfo};

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
    let host_paths =
        volumes.iter().filter_map(|v| Some((v.name.clone(), v.host_path.as_ref()?.path.clone()))).collect();
    PodInfo {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        phase: pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default(),
        name,
        pvc_names,
        pv_names: Vec::new(),
        mirror_of: meta.annotations.as_ref().and_then(|a| a.get("kubernetes.io/config.mirror")).cloned(),
        containers: containers(pod),
        host_paths,
    }
}

/// A pod's containers (init containers too) with their runtime IDs and volume mounts.
fn containers(pod: &Pod) -> Vec<ContainerInfo> {
    let spec = pod.spec.as_ref();
    let all = spec.map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    let status = pod.status.as_ref();
    let statuses: Vec<_> = status
        .map(|s| s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten()))
        .into_iter()
        .flatten()
        .collect();
    all.into_iter()
        .flatten()
        .map(|c| ContainerInfo {
            name: c.name.clone(),
            id: statuses
                .iter()
                .find(|s| s.name == c.name)
                .and_then(|s| s.container_id.as_deref())
                .map(|id| id.rsplit_once("://").map_or(id, |(_, id)| id).to_owned())
                .unwrap_or_default(),
            mounts: c
                .volume_mounts
                .iter()
                .flatten()
                .map(|m| VolumeMountInfo {
                    volume: m.name.clone(),
                    mount_path: m.mount_path.clone(),
                    propagation: m.mount_propagation.clone(),
                })
                .collect(),
        })
        .collect()
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
        uid: pv.metadata.uid.clone().unwrap_or_default(),
        claim_uid: spec.and_then(|s| s.claim_ref.as_ref()).and_then(|c| c.uid.clone()),
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
