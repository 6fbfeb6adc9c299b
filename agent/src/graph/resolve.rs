//! Turning what an operator types (`/dev/loop3`, `loop3`, `7:3`, a dm name, a `/dev/rbd/...`
//! symlink) into one block device.

use std::path::Path;

use crate::host::sys;
use crate::host::HostRoot;
use crate::model::{BlockDevice, DevNum};

/// The argument names no block device here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device '{arg}': {reason}")]
pub struct ResolveError {
    pub arg: String,
    pub reason: String,
}

/// Finds the device `arg` names among `devices` (from sysfs, or a daemon's latest scan: borrowed,
/// so a request does not copy the device list).
pub fn device<'a>(
    host: &HostRoot,
    devices: impl IntoIterator<Item = &'a BlockDevice>,
    arg: &str,
) -> Result<&'a BlockDevice, ResolveError> {
    let devices: Vec<&'a BlockDevice> = devices.into_iter().collect();
    let fail = |reason: String| ResolveError { arg: arg.chars().take(200).collect(), reason };
    let by_num = |d: DevNum| devices.iter().copied().find(|x| x.devnum == d);
    if arg.is_empty() {
        return Err(fail("empty device argument".into()));
    }
    if arg.bytes().next().is_some_and(|b| b.is_ascii_digit()) && arg.contains(':') {
        let d: DevNum = arg.parse().map_err(|e| fail(format!("{e}")))?;
        return by_num(d)
            .ok_or_else(|| fail(format!("no block device {d} in {}", host.sys_class_block().display())));
    }
    if arg.starts_with('/') {
        let node = host.host_path(Path::new(arg));
        match sys::stat_cached(&node) {
            Ok(id) if id.is_block_device() => {
                return by_num(id.rdev).ok_or_else(|| {
                    fail(format!("{} is device {} which sysfs does not list", node.display(), id.rdev))
                });
            }
            Ok(_) => return Err(fail(format!("{} is not a block device node", node.display()))),
            Err(e) => {
                // /dev/rbd/POOL[/NS]/IMAGE[@SNAP] is a udev symlink, missing without udevd: the
                // kernel's own inventory knows the mapping.
                if let Some(spec) = arg.strip_prefix("/dev/rbd/") {
                    let mappings = crate::discover::rbd::scan(host).unwrap_or_default();
                    if let Some(m) = mappings.iter().find(|m| m.dev_paths.iter().any(|p| p == arg)) {
                        if let Some(d) = devices.iter().copied().find(|d| d.devnum == m.devnum) {
                            return Ok(d);
                        }
                    }
                    return Err(fail(format!(
                        "no rbd mapping of {spec} in {}",
                        host.sys().join("bus/rbd/devices").display()
                    )));
                }
                // Fixture trees have no device nodes: fall back to the name under /dev.
                if let Some(name) = arg.strip_prefix("/dev/").filter(|n| !n.contains('/')) {
                    if let Some(d) = devices.iter().copied().find(|d| d.name.as_str() == name) {
                        return Ok(d);
                    }
                }
                return Err(fail(format!("cannot stat {}: {e}", node.display())));
            }
        }
    }
    devices
        .iter()
        .copied()
        .find(|d| d.name.as_str() == arg)
        .or_else(|| devices.iter().copied().find(|d| d.dm.as_ref().is_some_and(|dm| dm.name == arg)))
        .ok_or_else(|| {
            fail(format!("no such kernel name or dm name in {}", host.sys_class_block().display()))
        })
}
