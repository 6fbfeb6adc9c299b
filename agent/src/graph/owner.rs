//! Which Kubernetes volume each device is, from the kubelet directory: joined by mount point
//! (a device mounted at a kubelet path, in the host's namespace or seen from another root like
//! node_exporter's `/host/...`), by device number (raw block device files), by loop backing file
//! (kubelet pins raw block volumes with a loop device) and by rbd pool/image (in-tree rbd).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::discover::kubelet::{KubeletScan, KubeletVolume};
use crate::discover::namespaces::NsMount;
use crate::discover::rbd::RbdMapping;
use crate::model::{BlockDevice, MountNsId};

/// What the kubelet directory says a device is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct KubeOwner {
    pub pv_names: Vec<String>,
    pub volume_handles: Vec<String>,
    pub drivers: Vec<String>,
    /// Pods with a mount or device of it, per kubelet (running or not: the API says which).
    pub pod_uids: Vec<String>,
    /// The kubelet paths that matched.
    pub paths: Vec<String>,
}

impl KubeOwner {
    fn add(&mut self, v: &KubeletVolume, scan: &KubeletScan) {
        let push = |list: &mut Vec<String>, s: Option<&str>| {
            if let Some(s) = s.filter(|s| !s.is_empty()) {
                if !list.iter().any(|x| x == s) {
                    list.push(s.to_owned());
                }
            }
        };
        push(&mut self.pv_names, v.pv_name.as_deref());
        push(&mut self.volume_handles, v.volume_handle.as_deref());
        push(&mut self.drivers, v.driver.as_deref());
        push(&mut self.pod_uids, v.pod_uid.as_deref());
        push(&mut self.paths, v.path.to_str());
        if let Some(pv) = v.pv_name.as_deref() {
            for pod in scan.pods_using(pv) {
                push(&mut self.pod_uids, Some(pod));
            }
        }
    }
}

/// The owner of `device`, if kubelet knows it.
pub fn owner_of(
    device: &BlockDevice,
    mounts: &[NsMount],
    host_ns: MountNsId,
    rbd: Option<&RbdMapping>,
    scan: &KubeletScan,
) -> Option<KubeOwner> {
    let mut matched: Vec<&KubeletVolume> = Vec::new();
    for m in mounts.iter().filter(|m| m.device() == device.devnum) {
        // kubelet's paths are UTF-8: a mount point that is not matches no volume.
        let Some(mount_point) = m.mount.mount_point.to_str() else { continue };
        let hit = if m.ns == host_ns {
            scan.find_by_mount_point(mount_point)
        } else {
            scan.find_by_foreign_path(mount_point)
        };
        matched.extend(hit);
    }
    matched.extend(scan.find_by_devnum(device.devnum));
    if let Some(l) = &device.loop_info {
        matched.extend(l.backing_file.to_str().and_then(|f| scan.find_by_backing_file(f)));
    }
    if let Some(r) = rbd {
        matched.extend(scan.volumes.iter().filter(|v| v.names_rbd_image(&r.pool, &r.image)));
    }
    if matched.is_empty() {
        return None;
    }
    let mut seen = BTreeSet::new();
    let mut owner = KubeOwner::default();
    for v in matched {
        if seen.insert(v.path.clone()) {
            owner.add(v, scan);
        }
    }
    Some(owner)
}
