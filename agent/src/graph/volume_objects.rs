//! Which Kubernetes objects a device is about (issue 35 item 6: Events where people look): the
//! PVs it is a view of (kubelet's word, a CSI volume handle, an rbd image), each PV's claim
//! (from its `claimRef`, UID included: no PVC is read), and the pods on this node that use or
//! wait for it (not finished, with a claim bound to the PV: `Pending` ones wait for it), plus
//! the pods kubelet's directory names for it that the API knows; and which of its holders hold
//! it for none of those pods ([`held_elsewhere`]: incident 5 seen from the volume). Pure.

use crate::graph::{DeviceEntry, Holder};
use crate::kube::report::Involved;
use crate::kube::ClusterView;
use crate::model::HolderKind;

/// The PVs the API knows for a device: those kubelet's directory names, those whose CSI volume
/// handle kubelet's directory has, and the one backed by the device's rbd image.
pub fn pv_names(entry: &DeviceEntry, view: &ClusterView) -> Vec<String> {
    let mut pvs: Vec<String> = entry.kubernetes.as_ref().map(|k| k.pv_names.clone()).unwrap_or_default();
    if let Some(k) = &entry.kubernetes {
        for pv in &view.pvs {
            if pv.csi.as_ref().is_some_and(|c| k.volume_handles.contains(&c.volume_handle))
                && !pvs.contains(&pv.name)
            {
                pvs.push(pv.name.clone());
            }
        }
    }
    if let Some(pv) = entry.rbd.as_ref().and_then(|r| view.pv_for_rbd(&r.pool, &r.image)) {
        if !pvs.contains(&pv.name) {
            pvs.push(pv.name.clone());
        }
    }
    pvs
}

/// The objects an Event about `entry` goes on besides the Node: each PV the API knows (by its
/// UID), its bound claim, and the pods on this node that use or wait for it; each once. A PV
/// the API does not list (kubelet's word alone) has no UID to name it by and gets no Event.
pub fn objects(entry: &DeviceEntry, view: &ClusterView) -> Vec<Involved> {
    let mut out: Vec<Involved> = Vec::new();
    let mut push = |o: Involved| {
        if !out.contains(&o) {
            out.push(o);
        }
    };
    for name in pv_names(entry, view) {
        let Some(pv) = view.pv(&name).filter(|pv| !pv.uid.is_empty()) else { continue };
        push(Involved {
            kind: "PersistentVolume",
            name: pv.name.clone(),
            namespace: None,
            uid: pv.uid.clone(),
        });
        if let (Some((ns, claim)), Some(uid)) = (&pv.claim, &pv.claim_uid) {
            push(Involved {
                kind: "PersistentVolumeClaim",
                name: claim.clone(),
                namespace: Some(ns.clone()),
                uid: uid.clone(),
            });
        }
        for pod in view.running_pods_using_pv(&pv.name) {
            push(pod_object(pod));
        }
    }
    let kubelet_pods = entry.kubernetes.as_ref().map(|k| k.pod_uids.as_slice()).unwrap_or_default();
    for pod in view.pods_on_node.iter().filter(|p| p.is_active() && kubelet_pods.contains(&p.uid)) {
        push(pod_object(pod));
    }
    out
}

/// The mounts that hold a volume for none of its pods: a private copy (neither shared nor a
/// slave: nothing the host unmounts reaches it) in a mount namespace that is not the host's and
/// whose processes belong to no pod on this node that uses or waits for the volume (per the API
/// or kubelet). Such a copy keeps the device busy after the volume's pods stop (incident 5).
pub fn held_elsewhere<'a>(entry: &'a DeviceEntry, view: &ClusterView) -> Vec<&'a Holder> {
    let mut users: Vec<&str> =
        entry.kubernetes.iter().flat_map(|k| k.pod_uids.iter().map(String::as_str)).collect();
    for pv in pv_names(entry, view) {
        users.extend(view.running_pods_using_pv(&pv).iter().map(|p| p.uid.as_str()));
    }
    entry
        .holders
        .iter()
        .filter(|h| {
            h.kind == HolderKind::Mount
                && h.in_host_namespace == Some(false)
                && h.shared_group.is_none()
                && h.upstream_groups.is_empty()
                && h.pod_uid.as_deref().is_none_or(|uid| !users.contains(&uid))
        })
        .collect()
}

/// A pod as an Event names it.
pub fn pod_object(pod: &crate::kube::PodInfo) -> Involved {
    Involved {
        kind: "Pod",
        name: pod.name.clone(),
        namespace: Some(pod.namespace.clone()),
        uid: pod.uid.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::owner::KubeOwner;
    use crate::graph::test_support::loop3;
    use crate::kube::{PodInfo, PvInfo};

    fn view() -> ClusterView {
        let pod = |name: &str, phase: &str| PodInfo {
            uid: format!("uid-{name}"),
            namespace: "shop".into(),
            name: name.into(),
            phase: phase.into(),
            pvc_names: vec!["data".into()],
            ..Default::default()
        };
        let mut v = ClusterView {
            pods_on_node: vec![pod("web-0", "Pending"), pod("old-1", "Succeeded"), pod("web-1", "Running")],
            pvs: vec![PvInfo {
                name: "pvc-1".into(),
                uid: "uid-pv-1".into(),
                claim: Some(("shop".into(), "data".into())),
                claim_uid: Some("uid-claim-data".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        v.resolve_claims();
        v
    }

    /// The PV (by UID), its claim (from the claimRef, UID included) and the pods on this node
    /// that use (Running) or wait for (Pending) it; a finished pod is not one of them.
    #[test]
    fn a_volume_is_its_pv_its_claim_and_the_pods_that_use_or_wait_for_it() {
        let mut e = loop3(Vec::new());
        e.kubernetes = Some(KubeOwner { pv_names: vec!["pvc-1".into()], ..Default::default() });
        let got: Vec<(&str, String)> = objects(&e, &view())
            .iter()
            .map(|o| (o.kind, format!("{}/{}/{}", o.namespace.as_deref().unwrap_or("-"), o.name, o.uid)))
            .collect();
        assert_eq!(
            got,
            [
                ("PersistentVolume", "-/pvc-1/uid-pv-1".to_owned()),
                ("PersistentVolumeClaim", "shop/data/uid-claim-data".to_owned()),
                ("Pod", "shop/web-0/uid-web-0".to_owned()),
                ("Pod", "shop/web-1/uid-web-1".to_owned()),
            ]
        );
        e.kubernetes = Some(KubeOwner { pv_names: vec!["pvc-gone".into()], ..Default::default() });
        assert!(objects(&e, &view()).is_empty(), "a PV the API does not list has no UID");
        assert!(objects(&loop3(Vec::new()), &view()).is_empty());
    }

    /// A private copy in another pod's namespace holds the volume for none of its pods; the
    /// pod's own mount, the host's, a slave copy and a shared one do not.
    #[test]
    fn only_private_copies_outside_the_volumes_pods_hold_it_elsewhere() {
        let mount = |ns: u64, host: bool, pod: Option<&str>| Holder {
            mount_namespace: Some(crate::model::MountNsId(ns)),
            in_host_namespace: Some(host),
            pod_uid: pod.map(str::to_owned),
            ..Holder::bare(HolderKind::Mount)
        };
        let slave = Holder { master_group: Some(7), upstream_groups: vec![7], ..mount(4, false, None) };
        let shared = Holder { shared_group: Some(9), ..mount(5, false, Some("uid-csi")) };
        let mut e = loop3(vec![
            mount(1, true, None),
            mount(2, false, Some("uid-web-1")),
            mount(3, false, Some("uid-node-exporter")),
            slave,
            shared,
            mount(6, false, None),
        ]);
        e.kubernetes = Some(KubeOwner { pv_names: vec!["pvc-1".into()], ..Default::default() });
        let got: Vec<u64> =
            held_elsewhere(&e, &view()).iter().filter_map(|h| h.mount_namespace.map(|n| n.0)).collect();
        assert_eq!(got, [3, 6]);
    }
}
