//! The report of a pin risk: the pod and container the API names, the device and PV of each
//! copy, and the fix naming the very volumeMount.

use super::*;
use crate::discover::pin_risk::{Finding, Source};
use crate::kube::{ContainerInfo, VolumeMountInfo};
use std::path::PathBuf;

const UID: &str = "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e";
const CID: &str = "3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";

fn source(point: &str, shared: bool) -> Source {
    Source {
        dev: DevNum::new(251, 48),
        root: "/".into(),
        point: point.into(),
        fstype: "ext4".into(),
        host_root: false,
        shared,
        place: None,
    }
}

fn finding(shared: bool) -> NsFinding {
    let point = "/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838";
    NsFinding {
        ns: MountNsId(4026532900),
        pids: vec![21839],
        pid_count: 1,
        comm: Some("node_exporter".into()),
        container_id: Some(CID.into()),
        pod_uid: Some(UID.into()),
        outcome: Ok(Finding {
            host_root: Some("/host".into()),
            copies: vec![Copy {
                mount_point: format!("/host{point}").into(),
                mount_id: 2892,
                source: source(point, shared),
            }],
        }),
    }
}

fn node_exporter() -> PodInfo {
    PodInfo {
        uid: UID.into(),
        namespace: "monitoring".into(),
        name: "node-exporter-x7k2p".into(),
        phase: "Running".into(),
        containers: vec![ContainerInfo {
            name: "node-exporter".into(),
            id: CID.into(),
            mounts: vec![
                VolumeMountInfo { volume: "root".into(), mount_path: "/host".into(), propagation: None },
                VolumeMountInfo {
                    volume: "sys".into(),
                    mount_path: "/host/sys".into(),
                    propagation: Some("HostToContainer".into()),
                },
            ],
        }],
        host_paths: vec![("root".into(), "/".into()), ("sys".into(), "/sys".into())],
        ..Default::default()
    }
}

fn report_with(api: Option<&ClusterView>, f: NsFinding) -> PinReport {
    let mut kubelet = KubeletScan::default();
    let mut v = crate::discover::kubelet::KubeletVolume::new(
        crate::discover::kubelet::VolumeKind::InTreeRbd,
        PathBuf::from(
            "/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838",
        ),
        "kubernetes.io/rbd",
    );
    v.pv_name = Some("pvc-c838".into());
    kubelet.volumes.push(v);
    let devices: HashMap<DevNum, DeviceName> =
        [(DevNum::new(251, 48), DeviceName::new("rbd3").expect("name"))].into_iter().collect();
    let dirs = [Path::new("/var/lib/kubelet"), Path::new("/var/lib/containerd")];
    report(&[f], None, &Context { api, kubelet: &kubelet, devices: &devices, dirs: &dirs })
}

#[test]
fn the_pod_container_device_pv_and_the_volume_mount_to_fix_are_named() {
    let api = ClusterView { pods_on_node: vec![node_exporter()], ..Default::default() };
    let r = report_with(Some(&api), finding(true));
    let risk = &r.risks[0];
    assert_eq!(risk.pod.as_ref().map(|p| p.name.as_str()), Some("node-exporter-x7k2p"));
    assert_eq!(risk.container.as_deref(), Some("node-exporter"));
    assert_eq!(risk.holder(), "pod monitoring/node-exporter-x7k2p container node-exporter");
    assert_eq!(risk.copies[0].device.as_ref().map(|d| d.as_str()), Some("rbd3"));
    assert_eq!(risk.copies[0].pv_name.as_deref(), Some("pvc-c838"));
    assert_eq!(
        risk.fix,
        "set mountPropagation: HostToContainer on volumeMount root (hostPath / at /host) of container \
         node-exporter in pod monitoring/node-exporter-x7k2p, or do not mount the host root"
    );
}

#[test]
fn without_the_api_the_cgroup_names_the_pod_and_a_private_host_mount_is_said() {
    let r = report_with(None, finding(false));
    let risk = &r.risks[0];
    assert_eq!(risk.pod, None);
    assert!(
        risk.holder().starts_with(&format!("pod uid {UID} container 3f1c2b9a8d7e6")),
        "{}",
        risk.holder()
    );
    assert!(risk.fix.starts_with("set mountPropagation: HostToContainer on the volumeMount"), "{}", risk.fix);
    assert!(risk.fix.contains("is itself private"), "{}", risk.fix);
    let mut shell = finding(true);
    shell.pod_uid = None;
    shell.container_id = None;
    shell.comm = Some("sleep".into());
    let r = report_with(None, shell);
    assert!(r.risks[0].fix.starts_with("pid 21839 (sleep) is not in a pod"), "{}", r.risks[0].fix);
}

#[test]
fn an_unreadable_namespace_is_unknown_and_listed_after_the_risks() {
    let mut unreadable = finding(true);
    unreadable.ns = MountNsId(4026532001);
    unreadable.outcome = Err("the mount table of mount namespace 4026532001 cannot be read: EACCES".into());
    let kubelet = KubeletScan::default();
    let devices = HashMap::new();
    let cx = Context { api: None, kubelet: &kubelet, devices: &devices, dirs: &[] };
    let r = report(&[unreadable, finding(true)], None, &cx);
    assert_eq!(r.risks.len(), 2);
    assert!(r.risks[0].unknown.is_none() && r.risks[1].unknown.is_some());
    assert_eq!(r.known().count(), 1);
    assert!(r.risks[1].fix.is_empty() && r.risks[1].copies.is_empty());
}
