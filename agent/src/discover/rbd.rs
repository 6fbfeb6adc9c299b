//! krbd mappings from `/sys/bus/rbd/devices/<id>/` (Documentation/ABI/testing/sysfs-bus-rbd):
//! pool, pool namespace, image, image id, snapshot, the client's id and address (what a cluster's
//! watcher list shows, e.g. `watcher=10.125.53.47:0/3423687629 client.1138525`; sysfs prints the
//! id as `client1138525`), cluster fsid and device number.
//!
//! `config_info` is never read: it holds the string written to `add`, which can carry the cephx
//! secret.

use std::path::Path;

use serde::Serialize;

use super::{list_dir, read_attr, read_attr_opt, DiscoverError};
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName};

/// One krbd mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RbdMapping {
    /// The id under `/sys/bus/rbd/devices/`, what `rbd unmap` writes to `remove`.
    pub id: u32,
    pub device: DeviceName,
    pub devnum: DevNum,
    pub pool: String,
    /// Pool namespace (empty for the default).
    pub pool_ns: String,
    pub image: String,
    pub image_id: String,
    /// `current_snap`: `-` for the image head.
    pub snap: String,
    /// `client_id` as sysfs prints it: `client4122`.
    pub client_id: String,
    /// The same as the cluster writes it in an image's watcher list: `client.4122`.
    pub watcher_client: String,
    /// `IP:PORT/NONCE`, the watcher address (what `ceph osd blocklist add` takes).
    pub client_addr: String,
    pub cluster_fsid: String,
    /// The names a node has for it: `/dev/rbdN`, `/dev/rbd/<pool>[/<ns>]/<image>[@<snap>]`.
    pub dev_paths: Vec<String>,
    /// The cluster fenced this client (blocklisted it); the kernel log line that says so. The
    /// mapping is dead, but it still has to be unmounted and unmapped here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fenced: Option<String>,
    /// The attach stamp on a kernel without `diskseq` (before 5.15): the sequence number of the
    /// kernel's record announcing this mapping (`rbd: rbdN: capacity ... features ...`, logged
    /// once per map, never reused within a boot; [`crate::discover::kmsg::RbdLog::attached`]).
    /// `None` where the device has a `diskseq` (that is its stamp) or the record is no longer
    /// in the kernel's buffer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attach_record: Option<u64>,
}

/// Every krbd mapping; none when the rbd module is not loaded.
pub fn scan(host: &HostRoot) -> Result<Vec<RbdMapping>, DiscoverError> {
    let bus = host.sys().join("bus/rbd/devices");
    let mut out = Vec::new();
    for id_text in list_dir(&bus)? {
        let Ok(id) = id_text.parse::<u32>() else { continue };
        if let Some(m) = read_one(&bus.join(&id_text), id)? {
            out.push(m);
        }
    }
    Ok(out)
}

fn read_one(dir: &Path, id: u32) -> Result<Option<RbdMapping>, DiscoverError> {
    let Some(major) = read_attr_opt(&dir.join("major"))? else { return Ok(None) };
    let number = |p: &Path, v: &str| {
        v.trim().parse::<u32>().map_err(|_| DiscoverError::attr(p, v, "expected a number"))
    };
    let major = number(&dir.join("major"), &major)?;
    let minor_path = dir.join("minor");
    let minor = number(&minor_path, &read_attr(&minor_path)?)?;
    let device = list_dir(&dir.join("block"))?
        .into_iter()
        .next()
        .map(|n| {
            DeviceName::new(&n)
                .map_err(|_| DiscoverError::attr(&dir.join("block"), &n, "not a kernel block device name"))
        })
        .transpose()?
        .unwrap_or(DeviceName::new(&format!("rbd{id}")).map_err(|_| DiscoverError::attr(dir, "", "bad id"))?);
    let opt = |name: &str| -> Result<String, DiscoverError> {
        Ok(read_attr_opt(&dir.join(name))?.map(|s| s.trim().to_owned()).unwrap_or_default())
    };
    let pool = read_attr(&dir.join("pool"))?.trim().to_owned();
    let pool_ns = opt("pool_ns")?;
    let image = read_attr(&dir.join("name"))?.trim().to_owned();
    let snap = opt("current_snap")?;
    let mut spec =
        if pool_ns.is_empty() { format!("{pool}/{image}") } else { format!("{pool}/{pool_ns}/{image}") };
    if !snap.is_empty() && snap != "-" {
        spec = format!("{spec}@{snap}");
    }
    Ok(Some(RbdMapping {
        id,
        dev_paths: vec![format!("/dev/{device}"), format!("/dev/rbd/{spec}")],
        device,
        devnum: DevNum::new(major, minor),
        pool,
        pool_ns,
        image,
        image_id: opt("image_id")?,
        snap,
        watcher_client: opt("client_id")?
            .strip_prefix("client")
            .map(|n| format!("client.{}", n.trim_start_matches('.')))
            .unwrap_or_default(),
        client_id: opt("client_id")?,
        client_addr: opt("client_addr")?,
        cluster_fsid: opt("cluster_fsid")?,
        fenced: None,
        attach_record: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incident5_fixture_mapping() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/incident5");
        let maps = scan(&HostRoot::new(root)).expect("scan");
        assert_eq!(maps.len(), 1);
        let m = &maps[0];
        assert_eq!((m.id, m.device.as_str(), m.devnum), (3, "rbd3", DevNum::new(250, 0)));
        assert_eq!(m.pool, "k8s");
        assert_eq!(m.client_id, "client1138525");
        assert_eq!(m.watcher_client, "client.1138525");
        assert_eq!(m.client_addr, "10.125.53.47:0/3423687629");
        assert_eq!(m.dev_paths[1], format!("/dev/rbd/k8s/{}", m.image));
        assert!(scan(&HostRoot::new("/nonexistent")).expect("no rbd bus").is_empty());
    }
}
