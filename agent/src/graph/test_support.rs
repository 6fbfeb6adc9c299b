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
