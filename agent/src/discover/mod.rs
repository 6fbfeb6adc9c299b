//! Read-only scanners, one per source. Each takes a [`HostRoot`](crate::host::HostRoot) and
//! returns plain data; none writes to the kernel.
//!
//! A task or process that exits while it is being read (`NotFound`, `ESRCH`) is normal on a live
//! host and is skipped, not reported as an error.

pub mod blockdev;
pub mod cgroup;
pub mod control_socket;
pub mod dm;
pub mod fds;
pub mod iostat;
pub mod iscsi;
pub mod kmsg;
pub mod kubelet;
pub mod livefs;
pub mod r#loop;
pub mod maps;
pub mod mount_events;
pub mod mount_namespace;
pub mod mount_tables;
pub mod mount_wanted;
pub mod mountinfo;
pub mod multipath;
pub mod namespaces;
pub mod nbd;
pub mod nvme;
pub mod open_files;
pub mod pin_read;
pub mod pin_risk;
pub mod pod_processes;
pub mod probe;
pub mod process_identity;
pub mod processes;
pub mod rbd;
pub mod scsi;
pub mod sight;
pub mod statmount_cache;
pub mod swaps;

use crate::model::{lossless_string, DevNum, DeviceName, KernelText};
use std::io;
use std::path::{Path, PathBuf};

/// What a scanner could not read or understand, always naming the file.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("malformed {}: {source}", path.display())]
    MountInfo { path: PathBuf, source: mountinfo::ParseError },
    #[error("malformed {}: line {line}: {reason}", path.display())]
    Line { path: PathBuf, line: usize, reason: String },
    #[error("invalid value in {}: '{value}' ({expected})", path.display())]
    Attr { path: PathBuf, value: String, expected: &'static str },
    /// The read stopped when asked to ([`crate::host::parallel::Stop`]): the daemon's timer
    /// scan, for a change that is waiting. Nothing it read was kept as the host's snapshot.
    #[error("the scan stopped for a change that is waiting")]
    Stopped,
}

impl DiscoverError {
    pub(crate) fn read(path: &Path, source: io::Error) -> Self {
        Self::Read { path: path.to_owned(), source }
    }

    pub(crate) fn attr(path: &Path, value: &str, expected: &'static str) -> Self {
        Self::Attr { path: path.to_owned(), value: value.chars().take(64).collect(), expected }
    }
}

/// A block device's kernel name (`name`, checked) and its device number (`dir/dev`, `MAJ:MIN`);
/// `Ok(None)` when the device vanished while we looked.
pub(crate) fn read_name_and_dev(
    dir: &Path,
    name: &str,
) -> Result<Option<(DeviceName, DevNum)>, DiscoverError> {
    let name = DeviceName::new(name)
        .map_err(|_| DiscoverError::attr(dir, name, "not a kernel block device name"))?;
    let dev_path = dir.join("dev");
    let Some(dev_text) = read_attr_opt(&dev_path)? else { return Ok(None) };
    let devnum: DevNum =
        dev_text.parse().map_err(|_| DiscoverError::attr(&dev_path, &dev_text, "expected MAJ:MIN"))?;
    Ok(Some((name, devnum)))
}

/// True for errors that mean "the process or task went away while we looked".
pub fn is_gone(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::NotFound) || e.raw_os_error() == Some(libc::ESRCH)
}

/// Reads a small text attribute, trimmed of its trailing newline. Text that is not UTF-8 (an
/// rbd image name, a loop backing file can be any bytes) is escaped as
/// [`KernelText::escaped`], never an error.
pub(crate) fn read_attr(path: &Path) -> Result<String, DiscoverError> {
    read_attr_bytes(path).map(|b| lossless_string(b.into_bytes()))
}

/// Reads an optional attribute: `None` when the file does not exist.
pub(crate) fn read_attr_opt(path: &Path) -> Result<Option<String>, DiscoverError> {
    Ok(read_attr_bytes_opt(path)?.map(|b| lossless_string(b.into_bytes())))
}

/// Reads an attribute as bytes, trimmed of its trailing newlines.
pub(crate) fn read_attr_bytes(path: &Path) -> Result<KernelText, DiscoverError> {
    std::fs::read(path).map(trim_newlines).map_err(|e| DiscoverError::read(path, e))
}

/// Reads an optional attribute as bytes: `None` when the file does not exist.
pub(crate) fn read_attr_bytes_opt(path: &Path) -> Result<Option<KernelText>, DiscoverError> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(trim_newlines(b))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(DiscoverError::read(path, e)),
    }
}

fn trim_newlines(mut b: Vec<u8>) -> KernelText {
    while b.last() == Some(&b'\n') {
        b.pop();
    }
    KernelText::from_bytes(b)
}

/// Reads an attribute holding an unsigned decimal number.
pub(crate) fn read_u64(path: &Path) -> Result<u64, DiscoverError> {
    let s = read_attr(path)?;
    s.trim().parse().map_err(|_| DiscoverError::attr(path, &s, "expected a decimal number"))
}

/// Reads an attribute holding `0` or `1`.
pub(crate) fn read_bool(path: &Path) -> Result<bool, DiscoverError> {
    match read_attr(path)?.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        other => Err(DiscoverError::attr(path, other, "expected 0 or 1")),
    }
}

/// The block devices named in a sysfs `holders/` or `slaves/` directory, sorted; an absent
/// directory is empty, a name that is not a kernel block device name is an error.
pub(crate) fn names_in(dir: &Path) -> Result<Vec<DeviceName>, DiscoverError> {
    list_dir(dir)?
        .into_iter()
        .map(|n| {
            DeviceName::new(&n).map_err(|_| DiscoverError::attr(dir, &n, "not a kernel block device name"))
        })
        .collect()
}

/// Names in a directory, sorted; an absent directory is empty.
pub(crate) fn list_dir(path: &Path) -> Result<Vec<String>, DiscoverError> {
    let rd = match std::fs::read_dir(path) {
        Ok(rd) => rd,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(DiscoverError::read(path, e)),
    };
    let mut out = Vec::new();
    for entry in rd {
        let entry = entry.map_err(|e| DiscoverError::read(path, e))?;
        out.push(entry.file_name().to_string_lossy().into_owned());
    }
    out.sort();
    Ok(out)
}

/// Numeric entries of a `/proc`-style directory (PIDs, TIDs, fds), ascending.
pub(crate) fn numeric_entries(path: &Path) -> io::Result<Vec<u32>> {
    let mut out: Vec<u32> =
        std::fs::read_dir(path)?.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    out.sort_unstable();
    Ok(out)
}
