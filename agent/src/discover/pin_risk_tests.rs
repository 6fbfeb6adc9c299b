//! The pin-risk rules on the mount tables of a kubelet node, written as the kernel prints them
//! (shapes from a containerd node: the host root shared, kubelet's volumes under
//! `/var/lib/kubelet`, containers with their overlay root and binds of their volumes).

use super::*;
use crate::discover::mountinfo;
use std::path::PathBuf;

/// The host: `/` on vda1 (shared, as systemd makes it), an rbd volume staged under kubelet's
/// plugins directory and bound into a pod's volume directory, that pod's secret (tmpfs), and a
/// container's rootfs under `/run/containerd` (not a directory the agent protects).
const HOST: &str = "\
24 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw
25 24 0:22 / /proc rw,nosuid,nodev,noexec,relatime shared:5 - proc proc rw
26 24 0:23 / /run rw,nosuid,nodev shared:6 - tmpfs tmpfs rw,mode=755
610 24 251:48 / /var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime shared:301 - ext4 /dev/rbd3 rw
615 24 251:48 / /var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~rbd/pvc-c838 rw,relatime shared:301 - ext4 /dev/rbd3 rw
620 24 0:61 / /var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~secret/token rw,relatime shared:305 - tmpfs tmpfs rw,size=65536k
700 26 0:70 / /run/containerd/io.containerd.runtime.v2.task/k8s.io/3f1c/rootfs rw,relatime shared:320 - overlay overlay rw,lowerdir=/l
";

fn table(text: &str) -> Vec<MountEntry> {
    mountinfo::parse(text.as_bytes()).expect("mountinfo")
}

fn sources() -> Sources {
    let dirs = [PathBuf::from("/var/lib/kubelet"), PathBuf::from("/var/lib/containerd")];
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    Sources::of(&table(HOST), &dirs)
}

fn points(f: &Finding) -> Vec<(&str, &str)> {
    f.copies
        .iter()
        .map(|c| (c.mount_point.to_str().expect("utf8"), c.source.point.to_str().expect("utf8")))
        .collect()
}

/// The host's sources: its root and the three mounts under the kubelet directory; the
/// container's rootfs under /run/containerd is no source (not a directory the agent protects).
#[test]
fn the_host_root_and_the_mounts_under_the_kubelet_directory_are_the_sources() {
    let s = sources();
    let pts: Vec<&str> = s.list.iter().map(|x| x.point.to_str().expect("utf8")).collect();
    assert_eq!(pts.len(), 4, "{pts:?}");
    assert!(s.list[0].host_root && s.list[0].place.is_none());
    assert_eq!(
        s.list[1].place,
        Some((
            DevNum::new(253, 1),
            b"/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838"
                .to_vec()
        ))
    );
    assert!(!pts.iter().any(|p| p.starts_with("/run/")), "{pts:?}");
    assert!(s.has_dev(DevNum::new(251, 48)) && !s.has_dev(DevNum::new(0, 70)));
}

/// Incident 5: node_exporter mounts `/` at `/host` with propagation None. Its namespace holds a
/// private copy of the host root and of every volume mount under the kubelet directory that
/// existed when it started (rbd3 twice: staged and bound into the pod, and the secret).
#[test]
fn node_exporter_with_the_host_root_and_no_propagation_is_a_pin_risk() {
    let ns = "\
1200 1150 0:90 / / rw,relatime - overlay overlay rw,lowerdir=/l
1201 1200 253:1 / /host ro,relatime - ext4 /dev/vda1 rw
1202 1201 0:22 / /host/proc rw,relatime - proc proc rw
1203 1201 0:23 / /host/run rw,nosuid,nodev - tmpfs tmpfs rw,mode=755
1204 1201 251:48 / /host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime - ext4 /dev/rbd3 rw
1205 1201 251:48 / /host/var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~rbd/pvc-c838 rw,relatime - ext4 /dev/rbd3 rw
1206 1201 0:61 / /host/var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~secret/token rw,relatime - tmpfs tmpfs rw
1207 1203 0:70 / /host/run/containerd/io.containerd.runtime.v2.task/k8s.io/3f1c/rootfs rw,relatime - overlay overlay rw
1208 1200 253:1 /var/lib/kubelet/pods/9a9a/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
";
    let f = classify_table(&sources(), &table(ns));
    assert!(f.is_risk());
    assert_eq!(f.host_root.as_ref().and_then(|p| p.to_str()), Some("/host"));
    let copies = points(&f);
    assert_eq!(copies.len(), 3, "{copies:?}");
    assert_eq!(
        copies[0],
        (
            "/host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838",
            "/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838"
        )
    );
    assert!(copies[1].1.ends_with("kubernetes.io~rbd/pvc-c838") && copies[2].1.ends_with("secret/token"));
}

/// The same pod with `mountPropagation: HostToContainer` (rslave): every copy is `master:N`, and
/// a shared (Bidirectional) one is a peer: neither is a pin risk.
#[test]
fn slave_and_shared_copies_are_no_pin_risk() {
    let slave = "\
1300 1250 0:91 / / rw,relatime - overlay overlay rw
1301 1300 253:1 / /host ro,relatime master:1 - ext4 /dev/vda1 rw
1304 1301 251:48 / /host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime master:301 - ext4 /dev/rbd3 rw
1306 1301 0:61 / /host/var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~secret/token rw,relatime master:305 propagate_from:305 - tmpfs tmpfs rw
";
    assert_eq!(classify_table(&sources(), &table(slave)), Finding::default());
    let shared = "\
1400 1350 0:92 / / rw,relatime - overlay overlay rw
1401 1400 253:1 /var/lib/kubelet /var/lib/kubelet rw,relatime shared:1 - ext4 /dev/vda1 rw
1404 1401 251:48 / /var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime shared:301 - ext4 /dev/rbd3 rw
";
    assert_eq!(classify_table(&sources(), &table(shared)), Finding::default());
}

/// A pod's own volumes are binds of the host's volume mounts (same device, same root) at the
/// container's paths on its overlay root: not copies, whatever their propagation. Nor is
/// `/etc/hosts` (a file of the host's root filesystem, not its root), nor the container's root.
#[test]
fn a_pods_own_volumes_and_files_are_no_pin_risk() {
    let pod = "\
1500 1450 0:93 / / rw,relatime - overlay overlay rw
1501 1500 251:48 / /data rw,relatime - ext4 /dev/rbd3 rw
1502 1500 0:61 / /var/run/secrets/kubernetes.io/serviceaccount ro,relatime - tmpfs tmpfs rw
1503 1500 253:1 /var/lib/kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda1 rw
1504 1501 0:61 / /data/token ro,relatime - tmpfs tmpfs rw
";
    assert_eq!(classify_table(&sources(), &table(pod)), Finding::default());
}

/// `hostPath: /var/lib/kubelet` at `/kubelet` without propagation: no copy of the host root,
/// but private copies of the volumes under it (the place rule through a bind of a directory).
/// And `unshare -m` (util-linux's default propagation is private): its own `/` is a private
/// copy of the host root, with every mount below.
#[test]
fn a_kubelet_directory_bind_and_an_unshared_shell_are_pin_risks() {
    let kubelet = "\
1600 1550 0:94 / / rw,relatime - overlay overlay rw
1601 1600 253:1 /var/lib/kubelet /kubelet rw,relatime - ext4 /dev/vda1 rw
1604 1601 251:48 / /kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime - ext4 /dev/rbd3 rw
";
    let f = classify_table(&sources(), &table(kubelet));
    assert_eq!(f.host_root, None);
    assert_eq!(points(&f).len(), 1);
    let shell = "\
1700 1650 253:1 / / rw,relatime - ext4 /dev/vda1 rw
1704 1700 251:48 / /var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime - ext4 /dev/rbd3 rw
";
    let f = classify_table(&sources(), &table(shell));
    assert_eq!(f.host_root.as_ref().and_then(|p| p.to_str()), Some("/"));
    assert_eq!(points(&f).len(), 1);
}

#[test]
fn places_and_directories_on_whole_components() {
    assert_eq!(place(b"/host/var/x", b"/", b"/host"), Some(b"/var/x".to_vec()));
    assert_eq!(place(b"/var/x", b"/", b"/"), Some(b"/var/x".to_vec()));
    assert_eq!(place(b"/k/pods", b"/var/lib/kubelet", b"/k"), Some(b"/var/lib/kubelet/pods".to_vec()));
    assert_eq!(place(b"/hostile/x", b"/", b"/host"), None, "not below /host");
    assert_eq!(place(b"", b"/", b"/"), None, "unreachable");
    assert!(at_or_under(b"/var/lib/kubelet/pods", Path::new("/var/lib/kubelet/")));
    assert!(at_or_under(b"/var/lib/kubelet", Path::new("/var/lib/kubelet")));
    assert!(!at_or_under(b"/var/lib/kubelet2", Path::new("/var/lib/kubelet")));
    assert!(!at_or_under(b"/anything", Path::new("/")), "the root is a rule of its own");
}

/// The host's sources change as kubelet unmounts and mounts volumes: only the devices whose
/// sources changed are named, and a namespace with no mount on them is judged the same against
/// the new sources. A namespace that kept a copy of a volume the host unmounted is no pin risk
/// then, and is one again when the host mounts the volume again at the same place (the same
/// superblock): a finding kept from before the mount would hide that.
#[test]
fn only_namespaces_with_a_mount_on_a_device_whose_sources_changed_can_be_judged_otherwise() {
    let dirs = [Path::new("/var/lib/kubelet")];
    let of = |host: &str| Sources::of(&table(host), &dirs);
    let without = |ids: &[&str]| -> String {
        HOST.lines()
            .filter(|l| !ids.iter().any(|id| l.starts_with(&format!("{id} "))))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    let (all, unmounted) = (of(HOST), of(&without(&["610", "615"])));
    let rbd = DevNum::new(251, 48);
    assert_eq!(changed_devs(&all, &unmounted), HashSet::from([rbd]));
    assert_eq!(changed_devs(&unmounted, &all), HashSet::from([rbd]), "mounted again");
    assert_eq!(changed_devs(&all, &of(HOST)), HashSet::new());
    let left_behind = "\
1700 1650 0:95 / / rw,relatime - overlay overlay rw
1701 1700 253:1 /var/lib/kubelet /kubelet rw,relatime - ext4 /dev/vda1 rw
1704 1701 251:48 / /kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime - ext4 /dev/rbd3 rw
";
    assert!(classify_table(&all, &table(left_behind)).is_risk());
    assert!(!classify_table(&unmounted, &table(left_behind)).is_risk(), "a leak, no copy of a live mount");
    assert!(classify_table(&of(HOST), &table(left_behind)).is_risk(), "the volume is live again");
    // The secret's namespace has no mount on the rbd device: the same either way.
    let secret_only = "\
1800 1750 0:96 / / rw,relatime - overlay overlay rw
1801 1800 253:1 /var/lib/kubelet /kubelet rw,relatime - ext4 /dev/vda1 rw
1806 1801 0:61 / /kubelet/pods/6f0e4c1a-2b3d-4e5f-8a9b-0c1d2e3f4a5b/volumes/kubernetes.io~secret/token rw,relatime - tmpfs tmpfs rw
";
    let f = classify_table(&all, &table(secret_only));
    assert!(f.is_risk());
    assert_eq!(classify_table(&unmounted, &table(secret_only)), f);
    // A source made private on the host keeps its ID: its device is named all the same.
    let private_secret = HOST.replace("shared:305 - tmpfs", "- tmpfs");
    assert_eq!(changed_devs(&all, &of(&private_secret)), HashSet::from([DevNum::new(0, 61)]));
}
