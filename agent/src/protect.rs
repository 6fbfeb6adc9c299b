//! Which devices are protected: those behind the host root and the kubelet and container
//! runtime directories (and everything they are stacked on), plus any the config names.
//!
//! A protected path on a filesystem with an anonymous device number (btrfs: `/` stats as `0:NN`)
//! is followed to its block devices through the host's mounts of that filesystem, which the scan
//! joined to their member devices.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::graph::DeviceGraph;
use crate::host::HostRoot;
use crate::model::{DevNum, HolderKind};
use crate::sys;

/// Device numbers never to be touched.
pub fn protected_devices(
    host: &HostRoot,
    graph: &DeviceGraph,
    paths: &[PathBuf],
    names: &[String],
) -> HashSet<DevNum> {
    let mut out: HashSet<DevNum> = HashSet::new();
    for p in paths {
        let Ok(id) = sys::stat_cached(&host.host_path(p)) else { continue };
        if graph.get(id.dev).is_some() {
            out.insert(id.dev);
            continue;
        }
        // An anonymous device (btrfs and the like): the block devices whose host-namespace
        // mounts carry that superblock device.
        for e in &graph.devices {
            let mounted_here = e.holders.iter().any(|h| {
                h.kind == HolderKind::Mount
                    && h.in_host_namespace == Some(true)
                    && h.mount_dev == Some(id.dev)
            });
            if mounted_here {
                out.insert(e.device.devnum);
            }
        }
    }
    for e in &graph.devices {
        let d = &e.device;
        if names.iter().any(|n| n == d.name.as_str() || d.dm.as_ref().is_some_and(|dm| &dm.name == n)) {
            out.insert(d.devnum);
        }
    }
    // Everything a protected device sits on is protected too: the disk under a partition, the
    // paths under a dm map.
    let mut frontier: Vec<DevNum> = out.iter().copied().collect();
    while let Some(dn) = frontier.pop() {
        let Some(e) = graph.get(dn) else { continue };
        let below = e.device.parent.iter().chain(e.device.slaves.iter());
        for name in below {
            if let Some(b) = graph.devices.iter().find(|x| &x.device.name == name) {
                if out.insert(b.device.devnum) {
                    frontier.push(b.device.devnum);
                }
            }
        }
    }
    out
}
