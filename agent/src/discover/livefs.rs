//! Filesystems the kernel keeps alive on block devices, as sysfs shows them, whatever the mount
//! tables say.
//!
//! ```text
//! /sys/fs/ext4/loop0/               one directory per live ext4 superblock, named after its device
//! /sys/fs/xfs/dm-3/  /sys/fs/f2fs/sdb1/  /sys/fs/erofs/loop2/  /sys/fs/nilfs2/sdc/
//! /sys/fs/btrfs/<fsid>/devices/loop0 -> ../../../../devices/virtual/block/loop0
//! ```
//!
//! A directory exists from mount until the superblock dies, which can be long after the last
//! mount is gone from every namespace: an overlay whose upper directory lives on it, a lazily
//! detached mount with a file still open. btrfs mounts show an anonymous `0:NN` in mountinfo and
//! `st_dev`, never the device's number; its per-filesystem `devices/` directory is how its
//! member devices are known (gotchas 16 and 17). Reading these never touches the devices.

use std::collections::HashSet;

use serde::Serialize;

use super::{list_dir, DiscoverError};
use crate::host::HostRoot;
use crate::model::DeviceName;

/// Filesystem types that keep one sysfs directory per superblock, named after its device.
const PER_DEVICE: [&str; 5] = ["ext4", "xfs", "f2fs", "erofs", "nilfs2"];

/// A live filesystem and the block devices it sits on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LiveFs {
    pub fstype: String,
    /// The btrfs fsid, or the device name for the per-device types.
    pub id: String,
    pub members: Vec<DeviceName>,
}

impl LiveFs {
    /// Where sysfs shows it, for reasons.
    pub fn sysfs_path(&self) -> String {
        match self.fstype.as_str() {
            "btrfs" => format!("/sys/fs/btrfs/{}/devices", self.id),
            t => format!("/sys/fs/{t}/{}", self.id),
        }
    }
}

/// Every live filesystem on one of `devices` (names under `/sys/class/block`). A filesystem type
/// whose module is not loaded has no directory: none of it is alive.
pub fn scan(host: &HostRoot, devices: &HashSet<&str>) -> Result<Vec<LiveFs>, DiscoverError> {
    let fs = host.sys().join("fs");
    let mut out = Vec::new();
    for t in PER_DEVICE {
        for name in list_dir(&fs.join(t))? {
            // Other entries (`features`, `stats`, `debug`) are not device names.
            if devices.contains(name.as_str()) {
                if let Ok(dev) = DeviceName::new(&name) {
                    out.push(LiveFs { fstype: t.to_owned(), id: name, members: vec![dev] });
                }
            }
        }
    }
    let btrfs = fs.join("btrfs");
    for fsid in list_dir(&btrfs)? {
        let dir = btrfs.join(&fsid).join("devices");
        if !dir.is_dir() {
            continue; // `features`, or an fsid unmounted while we looked
        }
        let members: Vec<DeviceName> = list_dir(&dir)?
            .into_iter()
            .filter(|n| devices.contains(n.as_str()))
            .filter_map(|n| DeviceName::new(&n).ok())
            .collect();
        if !members.is_empty() {
            out.push(LiveFs { fstype: "btrfs".into(), id: fsid, members });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_hosts_live_filesystems_without_error() {
        let host = HostRoot::default();
        let devices: Vec<String> = list_dir(&host.sys_class_block()).expect("sysfs");
        let names: HashSet<&str> = devices.iter().map(String::as_str).collect();
        let live = scan(&host, &names).expect("scan");
        for fs in &live {
            assert!(!fs.members.is_empty());
            assert!(fs.members.iter().all(|m| names.contains(m.as_str())), "{fs:?}");
        }
        assert!(scan(&HostRoot::new("/nonexistent"), &names).expect("no sysfs: nothing live").is_empty());
    }
}
