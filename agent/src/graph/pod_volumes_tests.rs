//! Tables as the kernel prints them (mountinfo lines of this machine's 6.18 kernel, the incident
//! 5 scene: node_exporter with the host's `/` at `/host`, a container with kubelet's bind mounts).

use super::*;
use crate::discover::mountinfo::parse;

const UID: &str = "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e";

fn table(text: &str) -> Vec<MountEntry> {
    parse(text.replace("{UID}", UID).as_bytes()).expect("mountinfo")
}

/// The host: `/` on vda1, kubelet's CSI mount of loop3 in the pod's volume directory.
fn host() -> Vec<MountEntry> {
    table(
        "22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
         23 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw\n\
         812 22 7:3 / /var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw,relatime shared:300 - ext4 /dev/loop3 rw\n",
    )
}

fn dir() -> PathBuf {
    PathBuf::from(format!("/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1"))
}

#[test]
fn the_host_table_locates_a_directory_or_says_it_is_mounted_on() {
    let t = host();
    let loc = locate(&t, &dir(), Some(22)).expect("located");
    assert_eq!(loc, Location { dev: DevNum::new(254, 1), path: dir() });
    let mount = dir().join("mount");
    let err = locate(&t, &mount, Some(812)).expect_err("mounted on in the host");
    assert!(err.contains("mount 812 of ext4 /dev/loop3"), "{err}");
    assert_eq!(locate(&t, &dir(), None).expect("without STATX_MNT_ID"), loc);
    assert!(locate(&t, &dir(), Some(9999)).expect_err("no such mount").contains("no mount 9999"));
}

#[test]
fn a_mount_below_the_directory_is_found_in_every_namespace_whatever_its_path() {
    let loc = locate(&host(), &dir(), Some(22)).expect("located");
    // The host's own.
    let found = pins(MountNsId(1), &host(), &loc);
    assert_eq!(found.iter().map(|p| (p.mount_id, p.reach)).collect::<Vec<_>>(), [(812, Reach::At)]);
    // node_exporter's private copy, under /host (incident 5): found by location, not text.
    let exporter = table(
        "1500 1400 0:60 / / rw - overlay overlay rw,lowerdir=/l\n\
         1501 1500 254:1 / /host rw,relatime - ext4 /dev/vda1 rw\n\
         1502 1501 7:3 / /host/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop3 rw\n",
    );
    let found = pins(MountNsId(2), &exporter, &loc);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].mount_id, found[0].namespace), (1502, MountNsId(2)));
    assert!(found[0].describe().contains("at /host/var/lib/kubelet/pods/"), "{}", found[0].describe());
    // A container whose own root filesystem happens to have the same path text: not a pin.
    let lookalike = table(
        "1600 1599 0:61 / / rw - overlay overlay rw\n\
         1601 1600 7:9 / /var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop9 rw\n",
    );
    assert!(pins(MountNsId(3), &lookalike, &loc).is_empty(), "the same text on another filesystem");
}

#[test]
fn stacked_nested_bound_and_rooted_mounts_count() {
    let loc = locate(&host(), &dir(), Some(22)).expect("located");
    let ns = table(
        "1700 1699 0:62 / / rw - overlay overlay rw\n\
         1701 1700 254:1 /var/lib/kubelet/pods / rw - ext4 /dev/vda1 rw\n\
         1702 1701 7:3 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop3 rw\n\
         1703 1702 7:4 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop4 rw\n\
         1704 1703 0:30 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount/tmp rw - tmpfs tmpfs rw\n\
         1705 1700 254:1 /var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1 /data rw - ext4 /dev/vda1 rw\n\
         1706 1700 254:1 /var/lib/kubelet/pods/{UID}/etc-hosts /etc/hosts rw - ext4 /dev/vda1 rw\n\
         1707 1700 254:1 /var/lib/kubelet /k rw - ext4 /dev/vda1 rw\n",
    );
    let found: Vec<(u32, Reach)> =
        pins(MountNsId(4), &ns, &loc).iter().map(|p| (p.mount_id, p.reach)).collect();
    // 1702 through a bind of pods/ at /, 1703 stacked on it, 1704 inside it, 1705 a bind of the
    // directory itself; not 1706 (another file of the pod) nor 1707 (above it).
    assert_eq!(found, [(1702, Reach::At), (1703, Reach::At), (1704, Reach::At), (1705, Reach::Rooted)]);
    // The pod's directory: the etc-hosts bind is rooted in it.
    let pod = Location { dev: loc.dev, path: PathBuf::from(format!("/var/lib/kubelet/pods/{UID}")) };
    let rooted: Vec<u32> = pins(MountNsId(4), &ns, &pod)
        .iter()
        .filter(|p| p.reach == Reach::Rooted)
        .map(|p| p.mount_id)
        .collect();
    assert_eq!(rooted, [1705, 1706]);
}

#[test]
fn a_kubelet_directory_on_a_filesystem_of_its_own_and_btrfs_subvolumes() {
    // /var/lib/kubelet is sdb1; a namespace sees it at /host/var/lib/kubelet through two mounts.
    let host = table(
        "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n\
         30 22 8:17 / /var/lib/kubelet rw - xfs /dev/sdb1 rw\n",
    );
    let loc = locate(&host, &dir(), Some(30)).expect("located");
    assert_eq!(loc.path, Path::new(&format!("/pods/{UID}/volumes/kubernetes.io~csi/pvc-1")));
    let ns = table(
        "1800 1799 0:63 / / rw - overlay overlay rw\n\
         1801 1800 254:1 / /host rw - ext4 /dev/vda1 rw\n\
         1802 1801 8:17 / /host/var/lib/kubelet rw - xfs /dev/sdb1 rw\n\
         1803 1802 7:3 / /host/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop3 rw\n",
    );
    assert_eq!(pins(MountNsId(5), &ns, &loc).iter().map(|p| p.mount_id).collect::<Vec<_>>(), [1803]);
    // btrfs: the root is subvolume @, every mount shows the superblock's 0:39.
    let host = table("22 1 0:39 /@ / rw - btrfs /dev/vda2 rw,subvol=/@\n");
    let loc = locate(&host, &dir(), Some(22)).expect("located");
    assert_eq!(loc.path, Path::new("/@").join(dir().strip_prefix("/").expect("abs")));
    let ns = table(
        "1900 1899 0:64 / / rw - overlay overlay rw\n\
         1901 1900 0:39 /@ /rootfs rw - btrfs /dev/vda2 rw,subvol=/@\n\
         1902 1900 0:39 /@home /home rw - btrfs /dev/vda2 rw,subvol=/@home\n\
         1903 1901 7:3 / /rootfs/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop3 rw\n\
         1904 1902 7:5 / /home/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop5 rw\n",
    );
    assert_eq!(
        pins(MountNsId(6), &ns, &loc).iter().map(|p| p.mount_id).collect::<Vec<_>>(),
        [1903],
        "another subvolume's same path is another place"
    );
}

#[test]
fn one_index_of_pods_answers_every_directory_below_it_as_the_whole_table_does() {
    let loc = locate(&host(), &dir(), Some(22)).expect("located");
    let pods = Location { dev: loc.dev, path: PathBuf::from("/var/lib/kubelet/pods") };
    let pod = Location { dev: loc.dev, path: PathBuf::from(format!("/var/lib/kubelet/pods/{UID}")) };
    let other = Location { dev: loc.dev, path: PathBuf::from("/var/lib/kubelet/pods/other/volumes/v") };
    // The stacked scene, a mount in another pod's directory (1708, and 1709 on top of it, seen
    // through the bind of pods/), and one on a mount of another pod's volume that sits inside
    // this directory (1710: a mount point outside `pods/`, on a parent mounted within it).
    let ns = table(
        "1700 1699 0:62 / / rw - overlay overlay rw\n\
         1701 1700 254:1 /var/lib/kubelet/pods / rw - ext4 /dev/vda1 rw\n\
         1702 1701 7:3 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop3 rw\n\
         1703 1702 7:4 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount rw - ext4 /dev/loop4 rw\n\
         1704 1703 0:30 / /{UID}/volumes/kubernetes.io~csi/pvc-1/mount/tmp rw - tmpfs tmpfs rw\n\
         1705 1700 254:1 /var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/pvc-1 /data rw - ext4 /dev/vda1 rw\n\
         1706 1700 254:1 /var/lib/kubelet/pods/{UID}/etc-hosts /etc/hosts rw - ext4 /dev/vda1 rw\n\
         1707 1700 254:1 /var/lib/kubelet /k rw - ext4 /dev/vda1 rw\n\
         1708 1707 7:6 / /k/pods/other/volumes/v rw - ext4 /dev/loop6 rw\n\
         1709 1708 0:31 / /k/pods/other/volumes/v/run rw - tmpfs tmpfs rw\n\
         1710 1705 0:32 / /data/mount/cache rw - tmpfs tmpfs rw\n",
    );
    let near = Near::index(MountNsId(4), &ns, &pods);
    let ids = |p: Vec<Pin>| p.iter().map(|p| (p.mount_id, p.reach)).collect::<Vec<_>>();
    for place in [&loc, &pod, &other] {
        assert_eq!(ids(near.pins(place)), ids(pins(MountNsId(4), &ns, place)), "{place}");
    }
    assert_eq!(
        ids(near.pins(&loc)),
        [(1702, Reach::At), (1703, Reach::At), (1704, Reach::At), (1705, Reach::Rooted), (1710, Reach::At)]
    );
    assert_eq!(ids(near.pins(&other)), [(1708, Reach::At), (1709, Reach::At)]);
    // The host's own table: the same through the index.
    let host_near = Near::index(MountNsId(1), &host(), &pods);
    assert_eq!(ids(host_near.pins(&loc)), [(812, Reach::At)]);
    assert!(host_near.pins(&other).is_empty());
}
