//! Tests of the device graph joins.

use super::propagation::HostChain;
use super::*;
use crate::discover::mountinfo::parse_line;
use crate::model::{HolderKind, MountNsId};

/// A mount holder from a real mountinfo line, as [`DeviceGraph::build`] fills it in.
fn mount(ns: u64, host: bool, line: &str) -> Holder {
    let m = parse_line(line.as_bytes(), 1).expect("a mountinfo line");
    let mut h = Holder::bare(HolderKind::Mount);
    h.mount_namespace = Some(MountNsId(ns));
    h.in_host_namespace = Some(host);
    h.mount_id = Some(m.mount_id);
    h.mount_point = Some(m.mount_point.clone());
    h.shared_group = m.shared_group();
    h.master_group = m.master_group();
    h.upstream_groups = m.upstream_groups();
    h.mount_dev = Some(m.devnum);
    h
}

// Taken from this machine's kernel: `mount --make-shared` on the host, then `unshare -m
// --propagation unchanged` (A: `--make-slave`, `--make-shared`), then another namespace from
// A's (B: `--make-slave`).
const HOST: &str = "42 27 7:0 / /var/tmp/relchain/m rw,relatime shared:1 - ext4 /dev/loop0 rw";
const A: &str = "64 44 7:0 / /var/tmp/relchain/m rw,relatime shared:2 master:1 - ext4 /dev/loop0 rw";
const B: &str = "86 66 7:0 / /var/tmp/relchain/m rw,relatime master:2 - ext4 /dev/loop0 rw";

#[test]
fn a_slave_of_a_slave_of_the_host_is_a_host_copy() {
    let (host, a, b) = (mount(1, true, HOST), mount(2, false, A), mount(3, false, B));
    let chain = HostChain::of([&host, &a, &b]);
    assert_eq!(chain.downstream.iter().copied().collect::<Vec<_>>(), [1, 2]);
    assert!(chain.ties(&a).is_some_and(|w| w.contains("master:1")), "{chain:?}");
    let why = chain.ties(&b).expect("B copies A, which copies the host");
    assert!(why.contains("slave copy (master:2)") && why.contains("chain"), "{why}");
    // The order the mounts come in does not matter.
    assert_eq!(HostChain::of([&b, &a, &host]), chain);
}

#[test]
fn a_chain_whose_host_mount_is_gone_is_released() {
    // The host let go: A and B are copies of nothing live on the host.
    let (a, b) = (mount(2, false, A), mount(3, false, B));
    let mut a_private = a.clone();
    a_private.upstream_groups.clear();
    a_private.master_group = None;
    let chain = HostChain::of([&a_private, &b]);
    assert!(chain.downstream.is_empty(), "{chain:?}");
    assert_eq!(chain.ties(&a_private), None);
    assert_eq!(chain.ties(&b), None, "a slave of a foreign group is not a host copy");
    // A still claims to be a slave of group 1, which no mount the scan read is in: the chain
    // cannot be followed, so neither is released.
    let chain = HostChain::of([&a, &b]);
    assert!(
        chain.ties(&a).is_some_and(|w| w.contains("peer group 1") && w.contains("no mount")),
        "{chain:?}"
    );
}

#[test]
fn propagate_from_is_followed_as_well_as_master() {
    // B's master group 9 is out of B's sight; mountinfo names the dominant group instead.
    let host = mount(1, true, HOST);
    let b = mount(3, false, "86 66 7:0 / /m rw,relatime master:9 propagate_from:1 - ext4 /dev/loop0 rw");
    assert_eq!(b.upstream().collect::<Vec<_>>(), [1, 1, 9]);
    assert!(HostChain::of([&host, &b]).ties(&b).is_some());
}

#[test]
fn a_master_of_the_hosts_mount_is_never_released() {
    // The host's mount is a slave of a group whose only other mount is foreign.
    let host = mount(1, true, "42 27 7:0 / /m rw,relatime master:4 - ext4 /dev/loop0 rw");
    let master = mount(2, false, "64 44 7:0 / /m rw,relatime shared:4 - ext4 /dev/loop0 rw");
    let sibling = mount(3, false, "86 66 7:0 / /m rw,relatime master:4 - ext4 /dev/loop0 rw");
    let chain = HostChain::of([&host, &master, &sibling]);
    assert!(chain.ties(&master).is_some_and(|w| w.contains("propagate the unmount")), "{chain:?}");
    assert_eq!(chain.ties(&sibling), None, "a sibling copy is not the host's");
}

#[test]
fn a_private_copy_is_not_tied() {
    let host = mount(1, true, HOST);
    let private = mount(2, false, "64 44 7:0 / /var/tmp/relchain/m rw,relatime - ext4 /dev/loop0 rw");
    assert_eq!(HostChain::of([&host, &private]).ties(&private), None);
}

/// Issue 34, item 7: an rbd image unmapped and mapped again at the same id by the same client is
/// the same in every sysfs attribute; its attach stamp tells the two apart: the device's
/// `diskseq`, or on a kernel without it the kernel's attach record. A plan, a grace clock and an
/// interrupted unmap of the first are not the second's.
#[test]
fn an_rbd_image_mapped_again_at_the_same_id_is_another_identity() {
    use crate::act::journal::Resolution;
    use crate::discover::rbd::RbdMapping;
    use crate::engine::recover::{resolve, Interrupted};
    use crate::graph::identity::Identity;
    use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName};
    use crate::plan::{Action, Step};
    let rbd0 = DeviceName::new("rbd0").expect("name");
    let entry = |diskseq: Option<u64>, attach_record: Option<u64>| {
        let mut e = DeviceEntry::new(
            BlockDevice {
                diskseq,
                ..BlockDevice::new(rbd0.clone(), DevNum::new(252, 0), DeviceKind::Rbd, 1 << 30)
            },
            Vec::new(),
        );
        e.rbd = Some(RbdMapping {
            id: 0,
            device: rbd0.clone(),
            devnum: DevNum::new(252, 0),
            pool: "k8s".into(),
            pool_ns: String::new(),
            image: "csi-vol-1".into(),
            image_id: "115f79643c9869".into(),
            snap: "-".into(),
            client_id: "client4122".into(),
            watcher_client: "client.4122".into(),
            client_addr: "10.0.0.1:0/1".into(),
            cluster_fsid: "f".into(),
            dev_paths: Vec::new(),
            fenced: None,
            attach_record,
        });
        e
    };
    // A kernel with diskseq (5.15+): the stamp is the disk's.
    let (first, again) = (entry(Some(7), None), entry(Some(8), None));
    assert_ne!(Identity::of(&first), Identity::of(&again));
    assert!(
        Identity::of(&first).token().starts_with("rbd0@252:0#7;rbd="),
        "{}",
        Identity::of(&first).token()
    );
    // An older kernel: the sequence number of the kernel's `capacity ... features ...` record.
    let (old, old_again) = (entry(None, Some(1200)), entry(None, Some(3400)));
    assert_ne!(Identity::of(&old), Identity::of(&old_again));
    assert!(Identity::of(&old).token().ends_with(":client4122:kmsg1200"), "{}", Identity::of(&old).token());
    assert!(
        Identity::of(&old).to_string().contains("attached at kernel record #1200"),
        "{}",
        Identity::of(&old)
    );

    // Crash recovery: an unmap interrupted for the first mapping finds the second at the
    // number: another device, never unmapped for that step.
    for (planned, now) in [(&first, &again), (&old, &old_again)] {
        let step = Step::on(
            planned,
            Action::RbdUnmap {
                id: 0,
                pool: "k8s".into(),
                image: "csi-vol-1".into(),
                image_id: "115f79643c9869".into(),
                force: false,
            },
        );
        let record = serde_json::json!({"id": "1-4242-0", "phase": "intent", "step": step});
        let i = Interrupted::from_record(&record).expect("an intent");
        assert_eq!(
            resolve(&i, Some(now)).word,
            Resolution::IdentityChanged,
            "{}",
            resolve(&i, Some(now)).detail
        );
        assert_eq!(resolve(&i, Some(planned)).word, Resolution::Replan);
        assert_eq!(resolve(&i, None).word, Resolution::Gone);
    }
    // A journal written before the stamp (no attach_record in identity_parts) still reads.
    let mut parts = serde_json::to_value(Identity::of(&first)).expect("json");
    parts["backing"].as_object_mut().expect("backing").remove("attach_record");
    let back: Identity = serde_json::from_value(parts).expect("an older record");
    assert_eq!(back, Identity::of(&first));
}
