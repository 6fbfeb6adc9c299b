//! Which devices are protected: those behind the host root and the kubelet and container
//! runtime directories (and everything they are stacked on), plus any the config names.

use std::collections::HashSet;
use std::path::PathBuf;

use crate::graph::DeviceGraph;
use crate::host::HostRoot;
use crate::model::DevNum;
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
        if let Ok(id) = sys::stat_cached(&host.host_path(p)) {
            out.insert(id.dev);
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
