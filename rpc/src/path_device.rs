//! A path that is not a block device node, as `holders` takes it (`holders /mnt/data`), to the
//! block device its filesystem lives on, as `fuser -m` resolves it: the file's `st_dev`, or, for a
//! filesystem whose files carry an anonymous device number (btrfs, or one with no block device
//! at all), the mount holding it in the caller's mount table (`/proc/self/mountinfo`) and that
//! mount's source device node. Resolved on the caller's side: the path means what it means in
//! the caller's mount namespace, which an agent's daemon (in the host's) does not share. A
//! filesystem with no block device (tmpfs, proc, an overlay) is an error naming the path.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a path names no block device.
#[derive(Debug, thiserror::Error)]
pub enum PathDeviceError {
    #[error("cannot stat {}: {source}", path.display())]
    Stat { path: PathBuf, source: std::io::Error },
    #[error("cannot read {table} to find the mount holding {}: {source}", path.display())]
    MountTable { path: PathBuf, table: &'static str, source: std::io::Error },
    #[error(
        "{} is on a {fstype} filesystem (source {source_name}, mounted at {mount_point}), which has no block device",
        path.display()
    )]
    NoBlockDevice { path: PathBuf, fstype: String, source_name: String, mount_point: String },
    #[error("{} is on device {major}:{minor}, which no mount in {table} shows", path.display())]
    NoMount { path: PathBuf, major: u32, minor: u32, table: &'static str },
}

/// The caller's mount table.
const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// `MAJ:MIN` of the block device `path`'s filesystem lives on; `None` when `path` is itself a
/// block device node (resolved as a device, as before).
pub fn device_of_path(path: &Path) -> Result<Option<String>, PathDeviceError> {
    let meta =
        std::fs::metadata(path).map_err(|source| PathDeviceError::Stat { path: path.into(), source })?;
    if meta.file_type().is_block_device() {
        return Ok(None);
    }
    let (major, minor) = split(meta.dev());
    if major != 0 {
        return Ok(Some(format!("{major}:{minor}")));
    }
    let table = std::fs::read_to_string(MOUNT_TABLE).map_err(|source| PathDeviceError::MountTable {
        path: path.into(),
        table: MOUNT_TABLE,
        source,
    })?;
    let at = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mount = holding_mount(&table, (major, minor), &at).ok_or(PathDeviceError::NoMount {
        path: path.into(),
        major,
        minor,
        table: MOUNT_TABLE,
    })?;
    // An anonymous number: the mount's source, when it is a block device node (btrfs).
    match std::fs::metadata(&mount.source) {
        Ok(m) if mount.source.starts_with('/') && m.file_type().is_block_device() => {
            let (major, minor) = split(m.rdev());
            Ok(Some(format!("{major}:{minor}")))
        }
        _ => Err(PathDeviceError::NoBlockDevice {
            path: path.into(),
            fstype: mount.fstype,
            source_name: mount.source,
            mount_point: mount.mount_point,
        }),
    }
}

/// `st_dev` as (major, minor), as glibc's `major()`/`minor()` split it.
fn split(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

/// One mount of a mountinfo table.
#[derive(Debug, PartialEq)]
struct Mount {
    mount_point: String,
    fstype: String,
    source: String,
}

/// The mount holding `at`: the last (the one on top) among those with the device `dev` whose
/// mount point contains `at`; else (a btrfs subvolume's own number) the last whose mount point
/// contains it, longest first.
fn holding_mount(table: &str, dev: (u32, u32), at: &Path) -> Option<Mount> {
    let mounts: Vec<(String, Mount)> = table.lines().filter_map(parse_line).collect();
    let contains = |m: &Mount| at.starts_with(&m.mount_point);
    let best = |same_dev: bool| {
        mounts
            .iter()
            .filter(|(d, m)| contains(m) && (!same_dev || *d == format!("{}:{}", dev.0, dev.1)))
            .max_by_key(|(_, m)| m.mount_point.len())
    };
    best(true).or_else(|| best(false)).map(|(_, m)| Mount {
        mount_point: m.mount_point.clone(),
        fstype: m.fstype.clone(),
        source: m.source.clone(),
    })
}

/// A mountinfo line: `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SOURCE SUPEROPTS`.
fn parse_line(line: &str) -> Option<(String, Mount)> {
    let (left, right) = line.split_once(" - ")?;
    let f: Vec<&str> = left.split(' ').collect();
    let mut r = right.split(' ');
    let (dev, mount_point) = (f.get(2)?, f.get(4)?);
    Some((
        (*dev).to_owned(),
        Mount {
            mount_point: unescape(mount_point),
            fstype: r.next()?.to_owned(),
            source: unescape(r.next().unwrap_or("")),
        },
    ))
}

/// mountinfo's octal escapes (`\040` a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal =
            b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "22 1 253:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw\n\
        30 22 0:26 / /run rw shared:5 - tmpfs tmpfs rw\n\
        41 30 0:45 / /run/my\\040data rw - btrfs /dev/loop5 rw\n\
        42 22 7:3 / /mnt rw - ext4 /dev/loop3 rw\n";

    #[test]
    fn the_mount_on_top_holding_the_path() {
        let m = holding_mount(TABLE, (0, 26), Path::new("/run/x")).expect("tmpfs");
        assert_eq!((m.fstype.as_str(), m.source.as_str()), ("tmpfs", "tmpfs"));
        let m = holding_mount(TABLE, (0, 99), Path::new("/run/my data/sub")).expect("btrfs subvolume");
        assert_eq!((m.mount_point.as_str(), m.source.as_str()), ("/run/my data", "/dev/loop5"));
        assert_eq!(split(7 << 8 | 3), (7, 3));
        assert_eq!(split(259 << 8 | 5), (259, 5));
        assert_eq!(split((0x1000u64 << 32) | (0x100 << 12)), (0x1000, 0x100), "glibc's high bits");
    }
}
