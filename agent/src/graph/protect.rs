//! Which devices are protected: those behind the host root and the kubelet and container
//! runtime directories (and everything they are stacked on), plus any the config names.
//!
//! The paths are the HOST's: they are resolved through the host's root as PID 1 sees it
//! ([`HostRoot::stat_on_host`]: `/proc/1/root`, kthreadd's when PID 1 is shielded), never in this
//! process's own root, which in the DaemonSet's container is the image (its `/` an overlay). A
//! path that does not exist protects nothing; one that cannot be resolved is a blind spot over
//! every device (the device behind it is not known), never skipped.
//!
//! A protected path on a filesystem with an anonymous device number (btrfs: `/` stats as `0:NN`,
//! the subvolume's number, gotcha 23) is followed to its block devices through the mount it was
//! reached through (the kernel's mount ID), which the scan joined to its member devices.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::graph::DeviceGraph;
use crate::host::HostRoot;
use crate::model::blindspot::BlindSpot;
use crate::model::{DevNum, HolderKind};

/// The devices never to be touched, each with the rule that protects it, in words ("it backs
/// /var/lib/kubelet on the host", "it is listed in protected_devices", "vda1 is on it, and it
/// backs / on the host").
pub type Protected = HashMap<DevNum, String>;

/// Device numbers never to be touched, each with why. A protected path that cannot be resolved on
/// the host is pushed to `blind`.
pub fn protected_devices(
    host: &HostRoot,
    graph: &DeviceGraph,
    paths: &[PathBuf],
    names: &[String],
    blind: &mut Vec<BlindSpot>,
) -> Protected {
    let mut out = Protected::new();
    for p in paths {
        let id = match host.stat_on_host(p) {
            Ok(id) => id,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                blind.push(BlindSpot::any_device(format!(
                    "protected path {} cannot be resolved on the host ({e}): the device behind it is not known",
                    p.display()
                )));
                continue;
            }
        };
        let why = format!("it backs {} on the host (a protected path)", p.display());
        if graph.get(id.dev).is_some() {
            out.entry(id.dev).or_insert(why);
            continue;
        }
        // An anonymous device (btrfs and the like): the block devices whose host-namespace
        // mounts carry that superblock device, or the mount the path was reached through.
        for e in &graph.devices {
            let mounted_here = e.holders.iter().any(|h| {
                h.kind == HolderKind::Mount
                    && h.in_host_namespace == Some(true)
                    && (h.mount_dev == Some(id.dev)
                        || id.mnt_id.is_some_and(|m| h.mount_id.is_some_and(|hm| u64::from(hm) == m)))
            });
            if mounted_here {
                out.entry(e.device.devnum).or_insert_with(|| why.clone());
            }
        }
    }
    for e in &graph.devices {
        let d = &e.device;
        if names.iter().any(|n| n == d.name.as_str() || d.dm.as_ref().is_some_and(|dm| &dm.name == n)) {
            out.entry(d.devnum)
                .or_insert_with(|| "it is listed in protected_devices (the config)".to_owned());
        }
    }
    // Everything a protected device sits on is protected too: the disk under a partition, the
    // paths under a dm map.
    let mut frontier: Vec<DevNum> = out.keys().copied().collect();
    while let Some(dn) = frontier.pop() {
        let Some(e) = graph.get(dn) else { continue };
        let above = out.get(&dn).map(|w| w.strip_prefix("it ").unwrap_or(w).to_owned()).unwrap_or_default();
        let below = e.device.parent.iter().chain(e.device.slaves.iter());
        for name in below {
            if let Some(b) = graph.devices.iter().find(|x| &x.device.name == name) {
                if let std::collections::hash_map::Entry::Vacant(v) = out.entry(b.device.devnum) {
                    v.insert(format!("{} is on it, and {above}", e.device.name));
                    frontier.push(b.device.devnum);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MountNsId;

    /// On a tree (a fixture host): a protected path that does not exist protects nothing and
    /// blinds nothing; one that cannot be resolved (a file where a directory should be) is a
    /// blind spot over every device, never skipped.
    #[test]
    fn an_unresolvable_protected_path_is_a_blind_spot() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("file"), b"x").expect("write");
        let host = HostRoot::new(dir.path());
        let graph = DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices: Vec::new() };
        let mut blind = Vec::new();
        let paths = [PathBuf::from("/absent"), PathBuf::from("/file/below")];
        let out = protected_devices(&host, &graph, &paths[..1], &[], &mut blind);
        assert!(out.is_empty() && blind.is_empty(), "{blind:?}");
        protected_devices(&host, &graph, &paths, &[], &mut blind);
        assert_eq!(blind.len(), 1, "{blind:?}");
        assert!(
            blind[0].what.starts_with("protected path /file/below cannot be resolved on the host"),
            "{blind:?}"
        );
        assert_eq!(blind[0].reach, crate::model::blindspot::Reach::AnyDevice);
    }
}
