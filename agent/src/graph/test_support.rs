//! Builders shared by the unit tests of the stages above the graph.

use super::{DeviceEntry, Holder};
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName};

/// A loop device's binding to `/img` on 254:0, its backing inode `inode`.
pub(crate) fn loop_info(inode: u64) -> crate::model::LoopInfo {
    crate::model::LoopInfo {
        backing_file: "/img".into(),
        backing_deleted: false,
        offset: 0,
        sizelimit: 0,
        autoclear: false,
        read_only: false,
        backing_dev: Some(DevNum::new(254, 0)),
        backing_inode: Some(inode),
        backing_rdev: None,
        status_blocked: None,
    }
}

/// `loop3` (7:3, diskseq 1, 1 MiB) with these holders.
pub(crate) fn loop3(holders: Vec<Holder>) -> DeviceEntry {
    DeviceEntry::new(
        BlockDevice {
            diskseq: Some(1),
            ..BlockDevice::new(
                DeviceName::new("loop3").expect("name"),
                DevNum::new(7, 3),
                DeviceKind::Loop,
                1 << 20,
            )
        },
        holders,
    )
}

/// The mount tables a world with these devices shows: in each namespace one of them mounts in,
/// a private root tmpfs with every mount of the devices below it (so no unmount propagates),
/// as mountinfo lines; those of the namespaces `wanted` accepts.
pub(crate) fn private_tables(
    devices: &[DeviceEntry],
    wanted: &dyn Fn(crate::model::MountNsId) -> bool,
) -> Vec<super::propagation::NsTable> {
    let mut by_ns: std::collections::BTreeMap<crate::model::MountNsId, String> = Default::default();
    for h in devices.iter().flat_map(|e| &e.holders).filter(|h| h.kind == crate::model::HolderKind::Mount) {
        let (Some(ns), Some(id)) = (h.mount_namespace, h.mount_id) else { continue };
        let text = by_ns.entry(ns).or_insert_with(|| "4000000000 0 0:1 / / rw - tmpfs tmpfs rw\n".to_owned());
        let dev = h.mount_dev.unwrap_or(DevNum::new(7, 3));
        let at = h.mount_point.as_ref().map_or_else(|| "/mnt".to_owned(), |m| m.escaped().into_owned());
        text.push_str(&format!("{id} 4000000000 {dev} / {at} rw - ext4 /dev/x rw\n"));
    }
    by_ns
        .into_iter()
        .filter(|(ns, _)| wanted(*ns))
        .map(|(ns, text)| (ns, crate::discover::mountinfo::parse(text.as_bytes()).map_err(|e| e.to_string())))
        .collect()
}
