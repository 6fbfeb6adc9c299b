//! Tests of what an unmount takes with it, on mountinfo lines read from this machine's kernel
//! (Linux 6.18), each scene checked there: the kernel did take what the test says is taken.

use super::*;
use crate::discover::mountinfo::parse;

const HOST_NS: MountNsId = MountNsId(4026531832);
const POD_NS: MountNsId = MountNsId(4026532183);
const NS2: MountNsId = MountNsId(4026532184);

// The host: a tmpfs made shared, a loop device's ext4 mounted below it, and a bind of its
// subdirectory `sub` (a peer with another root).
const HOST: &str = "45 27 0:40 / /var/tmp/bjp/x rw,relatime shared:1 - tmpfs tmpfs rw
46 45 7:0 / /var/tmp/bjp/x/a rw,relatime shared:2 - ext4 /dev/loop0 rw
47 27 0:40 /sub /var/tmp/bjp/y rw,relatime shared:1 - tmpfs tmpfs rw
";
// `unshare -m --propagation unchanged`, then `mount --make-private` of the ext4 copy only: the
// parent stays a peer of the host's (shared:1), as under a Bidirectional kubelet directory.
const POD: &str = "69 49 0:40 / /var/tmp/bjp/x rw,relatime shared:1 - tmpfs tmpfs rw
70 69 7:0 / /var/tmp/bjp/x/a rw,relatime - ext4 /dev/loop0 rw
71 49 0:40 /sub /var/tmp/bjp/y rw,relatime shared:1 - tmpfs tmpfs rw
";
// Another namespace made from the host's: its tmpfs made a slave (master:1), its copy of the
// ext4 unmounted there, and another device (loop1) mounted at the same place.
const SLAVE_NS: &str = "93 73 0:40 / /var/tmp/bjp/x rw,relatime master:1 - tmpfs tmpfs rw
95 73 0:40 /sub /var/tmp/bjp/y rw,relatime shared:1 - tmpfs tmpfs rw
94 93 7:1 / /var/tmp/bjp/x/a rw,relatime - ext4 /dev/loop1 rw
";

fn table(ns: MountNsId, text: &str) -> NsTable {
    (ns, Ok(parse(text.as_bytes()).expect("mountinfo")))
}

fn taken_ids(r: &Reach) -> Vec<(MountNsId, u32)> {
    let mut v: Vec<_> = r.as_ref().expect("told").iter().map(|t| (t.ns, t.mount_id)).collect();
    v.sort_unstable();
    v
}

#[test]
fn a_private_copy_under_a_shared_parent_takes_the_hosts_mount_and_a_slaves_child() {
    // Unmounting the pod's private copy (70) took the host's mount (46) and, in the slave
    // namespace, loop1's mount at the same place (94): `umount -l` in the pod showed both gone.
    let tables = [table(HOST_NS, HOST), table(POD_NS, POD), table(NS2, SLAVE_NS)];
    let r = umount_reach(POD_NS, 70, &tables);
    assert_eq!(taken_ids(&r), [(HOST_NS, 46), (NS2, 94)]);
    let t = r.expect("told");
    assert!(t.iter().all(|t| t.through_group == 1), "{t:?}");
    let other = t.iter().find(|t| t.mount_id == 94).expect("loop1's");
    assert_eq!((other.devnum, other.fstype.as_bytes()), (DevNum::new(7, 1), &b"ext4"[..]));
    // The host's own mount is a child of a shared parent too: its unmount would take the pod's.
    assert_eq!(taken_ids(&umount_reach(HOST_NS, 46, &tables)), [(POD_NS, 70), (NS2, 94)]);
}

#[test]
fn a_private_parent_takes_nothing_and_a_gone_mount_takes_nothing() {
    // The same pod with its tmpfs made private: no propagation, whatever the other tables say.
    let private =
        POD.replace("rw,relatime shared:1 - tmpfs tmpfs rw\n70", "rw,relatime - tmpfs tmpfs rw\n70");
    let tables = [table(HOST_NS, HOST), table(POD_NS, &private), (NS2, Err("gone".to_owned()))];
    assert_eq!(umount_reach(POD_NS, 70, &tables), Ok(Vec::new()));
    assert_eq!(umount_reach(POD_NS, 999, &[table(POD_NS, POD)]), Ok(Vec::new()), "gone: nothing to take");
    // A slave-only parent does not propagate an unmount either (fs/pnode.c propagation_next).
    let slave =
        POD.replace("rw,relatime shared:1 - tmpfs tmpfs rw\n70", "rw,relatime master:1 - tmpfs tmpfs rw\n70");
    assert_eq!(umount_reach(POD_NS, 70, &[table(POD_NS, &slave), table(HOST_NS, HOST)]), Ok(Vec::new()));
}

#[test]
fn an_unreadable_namespace_or_a_missing_parent_is_never_fine() {
    let tables = [table(HOST_NS, HOST), table(POD_NS, POD), (NS2, Err("cannot read mountinfo".to_owned()))];
    let why = umount_reach(POD_NS, 70, &tables).expect_err("a receiver could hide there");
    assert!(why.contains("4026532184") && why.contains("peer group 1"), "{why}");
    let orphan = "70 69 7:0 / /var/tmp/bjp/x/a rw,relatime - ext4 /dev/loop0 rw\n";
    let why = umount_reach(POD_NS, 70, &[table(POD_NS, orphan)]).expect_err("no parent line");
    assert!(why.contains("parent (mount 69)"), "{why}");
    assert!(umount_reach(POD_NS, 70, &[table(HOST_NS, HOST)]).is_err(), "its own namespace not read");
}

#[test]
fn a_peer_with_another_root_and_a_chain_of_slaves_receive_at_the_same_dentry() {
    // The pod's copy is mounted at x/sub/a: on the host's bind of `sub` (root /sub, at y) the
    // same dentry is y/a. A third namespace's tmpfs is `shared:5 master:1` (a slave passing it
    // on to its own peers) and a fourth's `master:5`: both receive, through the chain.
    let pod = "69 49 0:40 / /var/tmp/bjp/x rw,relatime shared:1 - tmpfs tmpfs rw
72 69 7:0 / /var/tmp/bjp/x/sub/a rw,relatime - ext4 /dev/loop0 rw
";
    let host = "47 27 0:40 /sub /var/tmp/bjp/y rw,relatime shared:1 - tmpfs tmpfs rw
48 47 7:0 / /var/tmp/bjp/y/a rw,relatime shared:2 - ext4 /dev/loop0 rw
49 47 7:0 / /var/tmp/bjp/y/b rw,relatime shared:2 - ext4 /dev/loop0 rw
";
    let third = "80 10 0:40 / /x rw,relatime shared:5 master:1 - tmpfs tmpfs rw
81 80 7:2 / /x/sub/a rw,relatime - ext4 /dev/loop2 rw
";
    let fourth = "90 11 0:40 /sub /srv rw,relatime master:5 - tmpfs tmpfs rw
91 90 7:3 / /srv/a rw,relatime - ext4 /dev/loop3 rw
92 90 7:3 / /srv/a/deeper rw,relatime - ext4 /dev/loop3 rw
";
    let (t3, t4) = (MountNsId(3), MountNsId(4));
    let tables = [table(POD_NS, pod), table(HOST_NS, host), table(t3, third), table(t4, fourth)];
    assert_eq!(
        taken_ids(&umount_reach(POD_NS, 72, &tables)),
        [(MountNsId(3), 81), (MountNsId(4), 91), (HOST_NS, 48)]
    );
}

#[test]
fn the_place_is_the_parents_root_plus_the_mount_point_below_it() {
    let e = |line: &str| crate::discover::mountinfo::parse_line(line.as_bytes(), 1).expect("line");
    let root = e("1 0 0:1 / / rw - tmpfs t rw");
    let sub = e("2 1 0:2 /d /mnt rw - tmpfs t rw");
    assert_eq!(place(&root, &e("3 1 7:0 / /a rw - ext4 s rw")), Some(b"/a".to_vec()));
    assert_eq!(place(&sub, &e("3 2 7:0 / /mnt/a/b rw - ext4 s rw")), Some(b"/d/a/b".to_vec()));
    assert_eq!(place(&sub, &e("3 2 7:0 / /mnt rw - ext4 s rw")), Some(b"/d".to_vec()), "on its root");
    assert_eq!(place(&sub, &e("3 2 7:0 / /mntx rw - ext4 s rw")), None, "not below it");
}
