//! What a pod's volumes are, down to what a node shows for each: the claim (a PVC, or the one an
//! ephemeral volume makes), its PV, and from the PV (or an inline volume) the node-side identity:
//! a ceph-csi or in-tree rbd image (and rbd-nbd when ceph-csi maps with it), an iSCSI target
//! and LUN, FC target WWNs and LUN or WWIDs, an NVMe subsystem, a multipath WWID; and the index
//! keys that find the devices (the PV's name too: kubelet's directory ties devices to it on every
//! node). Pure: objects in, [`Volume`]s out.

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec, Pod, Volume as PodVolume,
};

use crate::index::{image_key, Key};
use crate::multiattach::{volume_id, VolumeId};

/// One volume of the pod, as far as it could be followed.
#[derive(Debug, Clone, Default)]
pub struct Volume {
    /// The pod's name for it ("" when a PVC or PV was asked about directly).
    pub name: String,
    /// The claim, `NAMESPACE/NAME` ("" for an inline volume).
    pub pvc: String,
    /// The claim's phase ("" when the claim is not known).
    pub pvc_phase: String,
    /// Why it could not be followed further ("" when it was).
    pub unresolved: String,
    /// The PV ("" when none).
    pub pv: String,
    /// The CSI driver or in-tree plugin.
    pub driver: String,
    /// The CSI volume handle.
    pub handle: String,
    /// Ceph's cluster id for ceph-csi (`clusterID`), for a NetworkFence.
    pub cluster_id: String,
    /// What a node shows for it, in words.
    pub identity: Vec<String>,
    /// The index keys of its devices.
    pub keys: Vec<Key>,
    /// For iSCSI: the LUN a device must be (`None`: any).
    pub lun: Option<i32>,
    /// Names Kubernetes' lists use for it (Node status), and its images and WWIDs.
    pub id: VolumeId,
}

/// The volumes of `pod` that may be block devices (claims, ephemeral claims, inline rbd, iSCSI,
/// FC and CSI volumes); configMaps, secrets, emptyDirs and the like are none.
pub fn of_pod(pod: &Pod) -> Vec<(String, Result<String, PodVolume>)> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let mut out = Vec::new();
    for v in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if let Some(c) = &v.persistent_volume_claim {
            out.push((v.name.clone(), Ok(format!("{ns}/{}", c.claim_name))));
        } else if v.ephemeral.is_some() {
            // The claim an ephemeral volume makes is named POD-VOLUME.
            out.push((v.name.clone(), Ok(format!("{ns}/{name}-{}", v.name))));
        } else if v.rbd.is_some() || v.iscsi.is_some() || v.fc.is_some() || v.csi.is_some() {
            out.push((v.name.clone(), Err(v.clone())));
        }
    }
    out
}

/// A volume from its claim: the PVC (when known) and its PV (when bound and known).
pub fn from_claim(
    name: &str,
    pvc_key: &str,
    pvc: Option<&PersistentVolumeClaim>,
    pv: impl Fn(&str) -> Option<std::sync::Arc<PersistentVolume>>,
) -> Volume {
    let mut v = Volume { name: name.to_owned(), pvc: pvc_key.to_owned(), ..Default::default() };
    let Some(c) = pvc else {
        v.unresolved = format!("no PersistentVolumeClaim {pvc_key} (deleted, or not created yet)");
        return v;
    };
    v.pvc_phase = c.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    let Some(pv_name) = c.spec.as_ref().and_then(|s| s.volume_name.clone()).filter(|n| !n.is_empty()) else {
        v.unresolved = format!("PersistentVolumeClaim {pvc_key} is not bound to a volume ({})", v.pvc_phase);
        return v;
    };
    match pv(&pv_name) {
        Some(obj) => {
            let mut out = from_pv(&obj);
            out.name = v.name;
            out.pvc = v.pvc;
            out.pvc_phase = v.pvc_phase;
            out
        }
        None => {
            v.pv = pv_name.clone();
            v.keys.push(Key::Pv(pv_name.clone()));
            v.unresolved = format!("no PersistentVolume {pv_name}");
            v
        }
    }
}

/// A volume from its PV.
pub fn from_pv(pv: &PersistentVolume) -> Volume {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let mut v = Volume { pv: name.clone(), id: volume_id(pv), ..Default::default() };
    v.keys.push(Key::Pv(name));
    if let Some(spec) = &pv.spec {
        identify(&mut v, spec);
    }
    v
}

/// An inline volume of the pod (no claim, no PV).
pub fn from_inline(name: &str, pv_like: &PodVolume) -> Volume {
    let spec = PersistentVolumeSpec {
        rbd: pv_like.rbd.as_ref().map(|r| k8s_openapi::api::core::v1::RBDPersistentVolumeSource {
            image: r.image.clone(),
            pool: r.pool.clone(),
            monitors: r.monitors.clone(),
            ..Default::default()
        }),
        iscsi: pv_like.iscsi.as_ref().map(|i| k8s_openapi::api::core::v1::ISCSIPersistentVolumeSource {
            iqn: i.iqn.clone(),
            lun: i.lun,
            target_portal: i.target_portal.clone(),
            ..Default::default()
        }),
        fc: pv_like.fc.clone(),
        ..Default::default()
    };
    let obj = PersistentVolume { spec: Some(spec.clone()), ..Default::default() };
    let mut v = Volume { name: name.to_owned(), id: volume_id(&obj), ..Default::default() };
    identify(&mut v, &spec);
    if let Some(csi) = &pv_like.csi {
        v.driver = csi.driver.clone();
        v.identity.push(format!(
            "an inline CSI volume of {} (the node shows it by kubelet's directory)",
            csi.driver
        ));
    }
    v
}

fn push_key(v: &mut Volume, k: Key) {
    if !v.keys.contains(&k) {
        v.keys.push(k);
    }
}

/// The node-side identity of a PV's source.
fn identify(v: &mut Volume, spec: &PersistentVolumeSpec) {
    if let Some(rbd) = &spec.rbd {
        let pool = rbd.pool.clone().unwrap_or_else(|| "rbd".into());
        v.driver = "kubernetes.io/rbd".into();
        v.identity.push(format!("rbd image {}", image_key(&pool, "", &rbd.image)));
        push_key(v, Key::Image(image_key(&pool, "", &rbd.image)));
    }
    if let Some(csi) = &spec.csi {
        v.driver = csi.driver.clone();
        v.handle = csi.volume_handle.clone();
        let attrs = csi.volume_attributes.clone().unwrap_or_default();
        v.cluster_id = attrs.get("clusterID").cloned().unwrap_or_default();
        if let (Some(pool), Some(image)) = (attrs.get("pool"), attrs.get("imageName")) {
            let ns = attrs.get("radosNamespace").map(String::as_str).unwrap_or("");
            let key = image_key(pool, ns, image);
            if attrs.get("mounter").is_some_and(|m| m == "rbd-nbd") {
                v.identity.push(format!("rbd-nbd {key} (an nbd device served by rbd-nbd)"));
                push_key(v, Key::NbdBackend(key.clone()));
            } else {
                v.identity.push(format!("rbd image {key}"));
            }
            push_key(v, Key::Image(key));
        }
        let attr = |names: &[&str]| {
            attrs
                .iter()
                .find(|(k, _)| names.iter().any(|n| k.eq_ignore_ascii_case(n)))
                .map(|(_, v)| v.clone())
        };
        if let Some(iqn) = attr(&["iqn", "targetIQN"]) {
            let lun = attr(&["lun"]).and_then(|l| l.parse().ok());
            iscsi(v, &iqn, lun);
        }
        if let Some(nqn) = attr(&["nqn", "subsysnqn", "subsystemNQN", "targetNQN"]) {
            v.identity.push(format!("NVMe subsystem {nqn}"));
            push_key(v, Key::Nqn(nqn.to_ascii_lowercase()));
        }
        if let Some(w) = attr(&["wwid"]) {
            v.identity.push(format!("WWID {w}"));
            push_key(v, Key::Wwid(w.to_ascii_lowercase()));
        }
        if v.identity.is_empty() {
            v.identity.push(format!(
                "CSI volume {} of {} (the node shows it by kubelet's directory)",
                csi.volume_handle, csi.driver
            ));
        }
    }
    if let Some(i) = &spec.iscsi {
        v.driver = "kubernetes.io/iscsi".into();
        iscsi(v, &i.iqn, Some(i.lun));
    }
    if let Some(fc) = &spec.fc {
        v.driver = "kubernetes.io/fc".into();
        for w in fc.target_wwns.iter().flatten() {
            v.identity
                .push(format!("FC target WWN {w} LUN {}", fc.lun.map_or("?".into(), |l| l.to_string())));
        }
        for w in fc.wwids.iter().flatten() {
            v.identity.push(format!("WWID {w}"));
            push_key(v, Key::Wwid(w.to_ascii_lowercase()));
        }
    }
}

fn iscsi(v: &mut Volume, iqn: &str, lun: Option<i32>) {
    v.identity.push(format!("iSCSI target {iqn} LUN {}", lun.map_or("?".into(), |l| l.to_string())));
    v.lun = lun;
    push_key(v, Key::Iqn(iqn.to_ascii_lowercase()));
}

/// Whether a device found by `v`'s keys is this volume: an iSCSI disk must be the volume's LUN
/// (a target serves several).
pub fn is_volume(v: &Volume, d: &blockjanitor_proto::v1::Device) -> bool {
    match (v.lun, d.iscsi_session.is_some(), d.scsi.as_ref()) {
        (Some(lun), true, Some(s)) => {
            s.address.rsplit(':').next() == Some(lun.to_string().as_str()) || d.pv_names.contains(&v.pv)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pv(spec: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "pv-1"}, "spec": spec})).expect("pv")
    }

    #[test]
    fn every_kind_of_volume_has_its_node_side_identity() {
        let v = from_pv(&pv(serde_json::json!({"csi": {"driver": "rbd.csi.ceph.com", "volumeHandle": "h",
            "volumeAttributes": {"pool": "k8s", "imageName": "csi-vol-1", "clusterID": "c1", "mounter": "rbd-nbd"}}})));
        assert_eq!(v.identity, ["rbd-nbd k8s/csi-vol-1 (an nbd device served by rbd-nbd)"]);
        assert!(
            v.keys.contains(&Key::NbdBackend("k8s/csi-vol-1".into()))
                && v.keys.contains(&Key::Image("k8s/csi-vol-1".into()))
        );
        assert_eq!(
            (v.driver.as_str(), v.cluster_id.as_str(), v.keys[0].clone()),
            ("rbd.csi.ceph.com", "c1", Key::Pv("pv-1".into()))
        );
        let v = from_pv(&pv(serde_json::json!({"rbd": {"monitors": ["m"], "image": "img"}})));
        assert_eq!(v.identity, ["rbd image rbd/img"], "the in-tree default pool");
        let v = from_pv(&pv(
            serde_json::json!({"iscsi": {"targetPortal": "10.0.0.1:3260", "iqn": "IQN.2004-10.com.example:d", "lun": 2}}),
        ));
        assert_eq!(v.identity, ["iSCSI target IQN.2004-10.com.example:d LUN 2"]);
        assert!(v.keys.contains(&Key::Iqn("iqn.2004-10.com.example:d".into())) && v.lun == Some(2));
        let v = from_pv(&pv(
            serde_json::json!({"fc": {"targetWWNs": ["500a0981891b8dc5"], "lun": 1, "wwids": ["3600A0B8"]}}),
        ));
        assert_eq!(v.identity, ["FC target WWN 500a0981891b8dc5 LUN 1", "WWID 3600A0B8"]);
        assert!(v.keys.contains(&Key::Wwid("3600a0b8".into())));
        let v = from_pv(&pv(serde_json::json!({"csi": {"driver": "nvme.example.com", "volumeHandle": "h",
            "volumeAttributes": {"subsysNQN": "nqn.2019-08.org.qemu:t"}}})));
        assert_eq!(v.identity, ["NVMe subsystem nqn.2019-08.org.qemu:t"]);
    }

    #[test]
    fn claims_ephemeral_claims_and_inline_volumes_of_a_pod() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web-0", "namespace": "shop"},
            "spec": {"containers": [], "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}},
                {"name": "old", "rbd": {"monitors": ["m"], "image": "img", "pool": "k8s"}},
                {"name": "cfg", "configMap": {"name": "c"}}
            ]}
        }))
        .expect("pod");
        let vols = of_pod(&pod);
        assert_eq!(vols.len(), 3, "the configMap is no block volume");
        assert_eq!(vols[0].1.as_ref().ok().map(String::as_str), Some("shop/data-web-0"));
        assert_eq!(vols[1].1.as_ref().ok().map(String::as_str), Some("shop/web-0-scratch"));
        let inline = from_inline("old", vols[2].1.as_ref().expect_err("inline"));
        assert_eq!(inline.identity, ["rbd image k8s/img"]);
        let unbound = from_claim("data", "shop/data-web-0", None, |_| None);
        assert!(unbound.unresolved.starts_with("no PersistentVolumeClaim shop/data-web-0"));
    }
}
