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

use std::collections::{BTreeMap, HashSet};

use serde::Serialize;

use super::{list_dir, DiscoverError};
use crate::host::sys::FileId;
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName};

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

/// Which block devices a btrfs filesystem's anonymous numbers stand for (gotchas 16 and 23):
/// the superblock's (mountinfo's `MAJ:MIN`, `/proc/PID/maps`), each subvolume's (`st_dev` of its
/// files, a loop device's `lo_device`), and the kernel's IDs of its mounts (`STATX_MNT_ID` of a
/// file reached through one). Built from mounts tied to their filesystem by its fsid, never by
/// a mount's source text.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize)]
pub struct AnonIndex {
    /// Anonymous device number (superblock or subvolume) → the filesystem's member devices.
    pub by_dev: BTreeMap<DevNum, Vec<DevNum>>,
    /// Mount ID → the member devices of the filesystem mounted there.
    pub by_mount: BTreeMap<u64, Vec<DevNum>>,
}

impl AnonIndex {
    pub fn is_empty(&self) -> bool {
        self.by_dev.is_empty() && self.by_mount.is_empty()
    }

    /// Forgets every entry whose members `keep` rejects (a filesystem gone since: its anonymous
    /// numbers may be handed to another one).
    pub fn retain(&mut self, keep: impl Fn(&[DevNum]) -> bool) {
        self.by_dev.retain(|_, m| keep(m));
        self.by_mount.retain(|_, m| keep(m));
    }

    /// Records a tied mount: its ID, its superblock's number and the devices under it.
    pub fn add_mount(&mut self, mount_id: u64, superblock: DevNum, members: &[DevNum]) {
        self.by_mount.insert(mount_id, members.to_vec());
        self.by_dev.insert(superblock, members.to_vec());
    }

    /// Records a subvolume's anonymous number (seen on a file reached through a tied mount).
    pub fn add_dev(&mut self, dev: DevNum, members: &[DevNum]) {
        if dev.major == 0 {
            self.by_dev.entry(dev).or_insert_with(|| members.to_vec());
        }
    }

    /// The member devices behind an anonymous device number (empty: none known).
    pub fn members_of_dev(&self, dev: DevNum) -> &[DevNum] {
        if dev.major != 0 {
            return &[];
        }
        self.by_dev.get(&dev).map_or(&[], Vec::as_slice)
    }

    /// The member devices a file lives on, when its `st_dev` is anonymous: by that number, else
    /// by the mount it was reached through.
    pub fn members_of(&self, id: &FileId) -> &[DevNum] {
        if id.dev.major != 0 {
            return &[];
        }
        let by_dev = self.members_of_dev(id.dev);
        if !by_dev.is_empty() {
            return by_dev;
        }
        id.mnt_id.and_then(|m| self.by_mount.get(&m)).map_or(&[], Vec::as_slice)
    }
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

    #[test]
    fn anonymous_numbers_lead_to_members() {
        let (sb, sub, loop0) = (DevNum::new(0, 39), DevNum::new(0, 40), DevNum::new(7, 0));
        let mut ix = AnonIndex::default();
        assert!(ix.is_empty());
        ix.add_mount(812, sb, &[loop0]);
        let file = |dev, mnt_id| FileId { dev, rdev: DevNum::new(0, 0), ino: 256, mode: 0, mnt_id };
        assert_eq!(ix.members_of_dev(sb), [loop0], "maps show the superblock's number");
        assert_eq!(ix.members_of(&file(sub, Some(812))), [loop0], "a subvolume's file, by its mount");
        assert!(ix.members_of(&file(sub, Some(813))).is_empty(), "another mount");
        assert!(ix.members_of(&file(sub, None)).is_empty());
        ix.add_dev(sub, &[loop0]);
        assert_eq!(ix.members_of(&file(sub, None)), [loop0], "the subvolume's number, learned");
        assert!(ix.members_of(&file(DevNum::new(8, 0), Some(812))).is_empty(), "a block device's own number");
        ix.add_dev(DevNum::new(8, 1), &[loop0]);
        assert!(ix.members_of_dev(DevNum::new(8, 1)).is_empty(), "only anonymous numbers");
    }
}
