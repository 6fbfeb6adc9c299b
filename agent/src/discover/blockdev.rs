//! Block devices from sysfs (`/sys/class/block/*`, Documentation/ABI/stable/sysfs-block):
//! disks and partitions, loop, device-mapper and the rest, with the holders/slaves stack.
//!
//! ```text
//! /sys/class/block/loop0 -> ../../devices/virtual/block/loop0
//!   dev        "7:0"          size "131072" (512-byte sectors)   ro "0"
//!   loop/      backing_file offset sizelimit autoclear partscan dio
//!   dm/        name uuid suspended
//!   holders/   dm-0 -> ../../dm-0        slaves/   sda -> ...
//! /sys/class/block/sda1 -> ../../devices/.../block/sda/sda1     partition "1"
//! ```

use std::collections::HashMap;
use std::path::Path;

use super::{list_dir, names_in, r#loop, read_attr, read_attr_opt, read_bool, read_u64, DiscoverError};
use crate::host::HostRoot;
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName, DmInfo};

/// Every block device and partition sysfs lists, sorted by name. A device whose directory
/// cannot be read or makes no sense is left out (see [`scan_all`] for what was left out).
pub fn scan(host: &HostRoot) -> Result<Vec<BlockDevice>, DiscoverError> {
    scan_all(host).map(|s| s.devices)
}

/// What sysfs shows: the devices that could be read, and those that could not.
#[derive(Debug, Default)]
pub struct SysfsDevices {
    pub devices: Vec<BlockDevice>,
    /// A device whose directory could not be read or makes no sense: its name, and the error
    /// naming the file.
    pub unreadable: Vec<(String, DiscoverError)>,
}

/// Every block device sysfs lists, and the devices that could not be read: one garbage
/// attribute never blinds the scan to the other devices. Only a missing or unreadable
/// `/sys/class/block` is an error.
pub fn scan_all(host: &HostRoot) -> Result<SysfsDevices, DiscoverError> {
    let class = host.sys_class_block();
    if let Err(e) = std::fs::metadata(&class) {
        return Err(DiscoverError::read(&class, e));
    }
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for name in list_dir(&class)? {
        let dir = class.join(&name);
        match read_device(host, &dir, &name) {
            Ok(Some(d)) => out.push(d),
            Ok(None) => {}                 // removed while we looked
            Err(_) if vanished(&dir) => {} // removed while we read it: nothing left to hold
            Err(e) => unreadable.push((name, e)),
        }
    }
    Ok(SysfsDevices { devices: out, unreadable })
}

/// Whether the device whose sysfs directory is `dir` is gone (its `dev` attribute with it): a
/// read that failed on a device being deleted (a SCSI disk, a dm map) says nothing about the
/// devices that remain, so it is no blind spot.
pub fn vanished(dir: &Path) -> bool {
    matches!(std::fs::symlink_metadata(dir.join("dev")), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

/// Reads one device directory. `Ok(None)` when it vanished under us.
pub fn read_device(host: &HostRoot, dir: &Path, name: &str) -> Result<Option<BlockDevice>, DiscoverError> {
    let name = DeviceName::new(name)
        .map_err(|_| DiscoverError::attr(dir, name, "not a kernel block device name"))?;
    let dev_path = dir.join("dev");
    let Some(dev_text) = read_attr_opt(&dev_path)? else {
        return Ok(None);
    };
    let devnum: DevNum =
        dev_text.parse().map_err(|_| DiscoverError::attr(&dev_path, &dev_text, "expected MAJ:MIN"))?;
    let size_bytes = read_u64(&dir.join("size"))?.saturating_mul(512);
    let read_only = read_bool(&dir.join("ro"))?;
    let is_partition = dir.join("partition").exists();
    let parent = if is_partition {
        let real = std::fs::canonicalize(dir).map_err(|e| DiscoverError::read(dir, e))?;
        real.parent().and_then(|p| p.file_name()).and_then(|n| DeviceName::new(&n.to_string_lossy()).ok())
    } else {
        None
    };
    let holders = names_in(&dir.join("holders"))?;
    let slaves = names_in(&dir.join("slaves"))?;
    let dm = read_dm(&dir.join("dm"))?;
    let diskseq = match read_attr_opt(&dir.join("diskseq"))? {
        Some(t) => Some(
            t.trim()
                .parse::<u64>()
                .map_err(|_| DiscoverError::attr(&dir.join("diskseq"), &t, "expected a decimal number"))?,
        ),
        None => None,
    };
    let loop_info = if dir.join("loop").is_dir() {
        r#loop::read(host, &dir.join("loop"), &name, devnum, diskseq)?
    } else {
        None
    };
    let kind = classify(name.as_str(), is_partition, dm.is_some(), dir);
    Ok(Some(BlockDevice {
        name,
        devnum,
        kind,
        size_bytes,
        read_only,
        parent,
        holders,
        slaves,
        loop_info,
        dm,
        diskseq,
    }))
}

fn read_dm(dir: &Path) -> Result<Option<DmInfo>, DiscoverError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    Ok(Some(DmInfo {
        name: read_attr(&dir.join("name"))?,
        uuid: read_attr_opt(&dir.join("uuid"))?.unwrap_or_default(),
        suspended: read_attr_opt(&dir.join("suspended"))?.is_some_and(|s| s.trim() == "1"),
    }))
}

fn classify(name: &str, is_partition: bool, is_dm: bool, dir: &Path) -> DeviceKind {
    let prefix_num = |p: &str| {
        name.strip_prefix(p).is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
    };
    if is_partition {
        DeviceKind::Partition
    } else if is_dm {
        DeviceKind::Dm
    } else if dir.join("loop").is_dir() || prefix_num("loop") {
        DeviceKind::Loop
    } else if dir.join("md").is_dir() {
        DeviceKind::Md
    } else if prefix_num("rbd") {
        DeviceKind::Rbd
    } else if prefix_num("nbd") {
        DeviceKind::Nbd
    } else if super::nvme::NsName::parse(name).is_some() {
        DeviceKind::NvmeNamespace
    } else if prefix_num("zram") {
        DeviceKind::Zram
    } else if dir.join("device").exists() {
        DeviceKind::Disk
    } else {
        DeviceKind::Other
    }
}

/// The device and everything stacked on it, transitively: its partitions and its sysfs holders.
pub fn with_descendants(devices: &[BlockDevice], root: DevNum) -> Vec<DevNum> {
    let by_name: HashMap<&DeviceName, &BlockDevice> = devices.iter().map(|d| (&d.name, d)).collect();
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        i += 1;
        let Some(dev) = devices.iter().find(|d| d.devnum == cur) else { continue };
        let children = devices
            .iter()
            .filter(|d| d.parent.as_ref() == Some(&dev.name))
            .map(|d| d.devnum)
            .chain(dev.holders.iter().filter_map(|h| by_name.get(h).map(|d| d.devnum)));
        for c in children.collect::<Vec<_>>() {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gone is told by the `dev` attribute: a device without one was deleted (no blind spot),
    /// one whose `dev` is still there but an attribute is garbage is a blind spot.
    #[test]
    fn gone_is_told_by_dev_and_a_garbage_device_still_there_is_unreadable() {
        let root = tempfile::tempdir().expect("tempdir");
        let class = root.path().join("sys/class/block");
        for (name, dev) in [("sdx", None), ("sdy", Some("8:16\n"))] {
            let d = class.join(name);
            std::fs::create_dir_all(&d).expect("mkdir");
            // `size` garbage in both: the read fails on it.
            std::fs::write(d.join("size"), "not a number\n").expect("size");
            if let Some(dev) = dev {
                std::fs::write(d.join("dev"), dev).expect("dev");
            }
        }
        assert!(vanished(&class.join("sdx")));
        assert!(!vanished(&class.join("sdy")));
        let host = HostRoot::new(root.path());
        let seen = scan_all(&host).expect("scan");
        let names: Vec<&str> = seen.unreadable.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["sdy"], "only the device still there is a blind spot");
        assert!(seen.devices.is_empty());
    }
}
