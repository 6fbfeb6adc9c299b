//! Container ID and pod UID from `/proc/PID/cgroup` paths.
//!
//! The shapes seen in the field (cgroup v1 and v2, cgroupfs and systemd drivers):
//! ```text
//! 0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0a5eb91b_7c1e_4f0e_9d3b_2b1f0e0c1d2e.slice/cri-containerd-<64 hex>.scope
//! 0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod<uid_>.slice/crio-<64 hex>.scope
//! 11:memory:/kubepods/burstable/pod0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e/<64 hex>
//! 0::/system.slice/docker-<64 hex>.scope        1:name=systemd:/docker/<64 hex>
//! ```
//! `crio-conmon-<id>.scope` is CRI-O's monitor process, not the container.

use serde::Serialize;

/// Who a process belongs to, as far as its cgroup tells.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct CgroupIdentity {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// Reads the identity from the text of `/proc/PID/cgroup`. Lines that do not parse are ignored:
/// the cgroup is only a label, never a safety input.
pub fn identify(text: &str) -> CgroupIdentity {
    let mut id = CgroupIdentity::default();
    for line in text.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else { continue };
        for segment in path.split('/').rev() {
            if id.container_id.is_none() {
                id.container_id = container_id(segment);
            }
            if id.pod_uid.is_none() {
                id.pod_uid = pod_uid(segment);
            }
        }
        if id.container_id.is_some() && id.pod_uid.is_some() {
            break;
        }
    }
    id
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn container_id(segment: &str) -> Option<String> {
    let s = segment.strip_suffix(".scope").unwrap_or(segment);
    if s.starts_with("crio-conmon-") {
        return None;
    }
    let s = ["cri-containerd-", "crio-", "docker-", "containerd-", "libpod-"]
        .iter()
        .find_map(|p| s.strip_prefix(p))
        .unwrap_or(s);
    is_hex64(s).then(|| s.to_owned())
}

/// The pod UID a segment names: a UUID (a pod from the API), or 32 lowercase hex digits (a
/// static pod: kubelet names it by its config hash, the mirror pod's `kubernetes.io/config.mirror`).
fn pod_uid(segment: &str) -> Option<String> {
    let s = segment.strip_suffix(".slice").unwrap_or(segment);
    let at = s.rfind("pod")?;
    let uid = s[at + 3..].replace('_', "-");
    (is_uuid(&uid) || is_config_hash(&uid)).then_some(uid)
}

fn is_config_hash(s: &str) -> bool {
    s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CID: &str = "3f1c2b9a8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a";
    const UID: &str = "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e";

    #[test]
    fn systemd_driver_containerd_v2() {
        let t = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope\n", UID.replace('-', "_"));
        let id = identify(&t);
        assert_eq!(id.container_id.as_deref(), Some(CID));
        assert_eq!(id.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn cgroupfs_driver_v1() {
        let t = format!("12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n");
        let id = identify(&t);
        assert_eq!(id.container_id.as_deref(), Some(CID));
        assert_eq!(id.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn crio_besteffort_and_conmon() {
        let uid_ = UID.replace('-', "_");
        let t = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-{CID}.scope\n");
        assert_eq!(identify(&t).container_id.as_deref(), Some(CID));
        let t = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/crio-conmon-{CID}.scope\n");
        let id = identify(&t);
        assert_eq!(id.container_id, None);
        assert_eq!(id.pod_uid.as_deref(), Some(UID));
    }

    #[test]
    fn static_pods_are_named_by_their_config_hash() {
        let hash = "6b1d8f2e9c4a7b3e5d0f1a2c3b4d5e6f";
        let t = format!("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{hash}.slice/cri-containerd-{CID}.scope\n");
        assert_eq!(identify(&t).pod_uid.as_deref(), Some(hash));
        assert_eq!(identify(&format!("0::/kubepods/pod{}/x\n", hash.to_uppercase())).pod_uid, None);
    }

    #[test]
    fn docker_and_plain_host() {
        assert_eq!(
            identify(&format!("0::/system.slice/docker-{CID}.scope\n")).container_id.as_deref(),
            Some(CID)
        );
        assert_eq!(identify(&format!("1:name=systemd:/docker/{CID}\n")).container_id.as_deref(), Some(CID));
        assert_eq!(identify("0::/init.scope\n"), CgroupIdentity::default());
        assert_eq!(identify("0::/system.slice/podman.service\ngarbage\n"), CgroupIdentity::default());
    }
}
