//! Whether anything in any mount namespace is mounted on a pod volume directory, told by where
//! the directory is on its filesystem rather than by the path text a namespace shows.
//!
//! A namespace may see the kubelet directory at another path (`/host/var/lib/kubelet` in
//! node_exporter's, `/rootfs/...` in cadvisor's, a bind of `pods/` somewhere else), so a path
//! compared as text can miss a mount. Every mount, though, sits on a directory of its parent's
//! filesystem: its mount point, seen from the parent, is the parent's root plus the mount point
//! below the parent's own. That place, a [`Location`] (the filesystem's device as mountinfo has
//! it, and the path within that filesystem), is the same in every namespace. The directory's
//! own location comes from the host's table, through the mount that a stat of the directory
//! on the host was reached through ([`locate`]).
//!
//! [`pins`] then names, in one namespace's whole table, every mount that
//! - sits at the directory or below it (its mount point's location is there, or it sits on a
//!   mount that does: one stacked on it, or mounted inside it), or
//! - is rooted at the directory or below it (a bind mount of it, or of something in it).
//!
//! Pure: whole tables in, mounts out (btrfs included: its mounts share the superblock's
//! anonymous device and tell subvolumes apart by their root).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::discover::mountinfo::MountEntry;
use crate::model::{DevNum, KernelText, MountNsId};

/// A place on a filesystem: its device as mountinfo shows it, and the path within it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct Location {
    pub dev: DevNum,
    pub path: PathBuf,
}

impl Location {
    /// `self` is `other` or below it.
    pub fn within(&self, other: &Location) -> bool {
        self.dev == other.dev && self.path.starts_with(&other.path)
    }

    /// The place `rel` below this one.
    pub fn join(&self, rel: &Path) -> Location {
        Location { dev: self.dev, path: self.path.join(rel) }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} on the filesystem of device {}", self.path.display(), self.dev)
    }
}

/// How a mount reaches the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Mounted at the directory or below it.
    At,
    /// Its root is the directory or something in it (a bind mount of it).
    Rooted,
}

/// A mount that reaches a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Pin {
    pub namespace: MountNsId,
    pub mount_id: u32,
    /// As that namespace shows it.
    pub mount_point: KernelText,
    pub root: KernelText,
    pub devnum: DevNum,
    pub fstype: KernelText,
    pub source: KernelText,
    pub reach: Reach,
}

impl Pin {
    /// One line: `mount 812 of ext4 /dev/loop3 (7:3) at /host/var/lib/kubelet/... in mount
    /// namespace 4026532841`.
    pub fn describe(&self) -> String {
        let how = match self.reach {
            Reach::At => format!("at {}", self.mount_point),
            Reach::Rooted => format!("of {} at {}", self.root, self.mount_point),
        };
        format!(
            "mount {} of {} {} ({}) {how} in mount namespace {}",
            self.mount_id, self.fstype, self.source, self.devnum, self.namespace.0
        )
    }
}

/// Where `host_path` is, from the host's own table: `mnt_id` is the mount a stat of it on the
/// host was reached through (`STATX_MNT_ID`; `None` on a kernel without it: the deepest mount
/// on the way). `Err` when something is mounted on the path itself in the host's namespace
/// (then the stat reached the mounted filesystem), or the mount is not in the table.
pub fn locate(host_table: &[MountEntry], host_path: &Path, mnt_id: Option<u64>) -> Result<Location, String> {
    let m = match mnt_id {
        Some(id) => host_table.iter().find(|m| u64::from(m.mount_id) == id).ok_or_else(|| {
            format!(
                "the host's mount table has no mount {id}, which {} was reached through",
                host_path.display()
            )
        })?,
        None => host_table
            .iter()
            .filter(|m| host_path.starts_with(m.mount_point.as_path()))
            .max_by_key(|m| m.mount_point.as_path().components().count())
            .ok_or_else(|| format!("no mount of the host's table holds {}", host_path.display()))?,
    };
    let mp = m.mount_point.as_path();
    if mp.starts_with(host_path) {
        return Err(format!(
            "something is mounted on it in the host's mount namespace: mount {} of {} {} at {}",
            m.mount_id, m.fstype, m.source, m.mount_point
        ));
    }
    let rel = host_path.strip_prefix(mp).map_err(|_| {
        format!(
            "{} was reached through mount {} at {}, which is not on its path",
            host_path.display(),
            m.mount_id,
            m.mount_point
        )
    })?;
    Ok(Location { dev: m.devnum, path: m.root.as_path().join(rel) })
}

/// Every mount of namespace `ns`'s whole `table` that reaches `dir` (see the module docs).
pub fn pins(ns: MountNsId, table: &[MountEntry], dir: &Location) -> Vec<Pin> {
    Near::index(ns, table, dir).pins(dir)
}

/// The mounts of one namespace's table that reach a place or below it (the kubelet directory's
/// `pods/`, say), found in one pass over the table; every question about a directory below that
/// place is then answered from them alone ([`Near::pins`]). A namespace of 1,000 mounts has at
/// most a few such mounts, so a node's hundreds of namespaces are walked once per look, however
/// many directories are asked about.
#[derive(Debug, Clone, Default)]
pub struct Near {
    mounts: Vec<NearMount>,
}

#[derive(Debug, Clone)]
struct NearMount {
    pin: Pin,
    /// Where it, or a mount it sits on, is mounted within the place.
    at: Vec<Location>,
    /// Where its root is, when within the place.
    rooted: Option<Location>,
}

impl Near {
    /// The mounts of `table` (namespace `ns`) that reach `place` or below it.
    pub fn index(ns: MountNsId, table: &[MountEntry], place: &Location) -> Self {
        let by_id: HashMap<u32, &MountEntry> = table.iter().map(|m| (m.mount_id, m)).collect();
        let mut memo: HashMap<u32, Vec<Location>> = HashMap::new();
        let mounts = table
            .iter()
            .filter_map(|m| {
                let at = anchors(m, &by_id, place, &mut memo, 0);
                let root = Location { dev: m.devnum, path: m.root.as_path().to_owned() };
                let rooted = root.within(place).then_some(root);
                if at.is_empty() && rooted.is_none() {
                    return None;
                }
                let pin = Pin {
                    namespace: ns,
                    mount_id: m.mount_id,
                    mount_point: m.mount_point.clone(),
                    root: m.root.clone(),
                    devnum: m.devnum,
                    fstype: m.fstype.clone(),
                    source: m.source.clone(),
                    reach: Reach::At,
                };
                Some(NearMount { pin, at, rooted })
            })
            .collect();
        Self { mounts }
    }

    /// The mounts that reach `dir` (at or below the place indexed).
    pub fn pins(&self, dir: &Location) -> Vec<Pin> {
        self.mounts
            .iter()
            .filter_map(|m| {
                let reach = if m.at.iter().any(|l| l.within(dir)) {
                    Reach::At
                } else if m.rooted.as_ref().is_some_and(|r| r.within(dir)) {
                    Reach::Rooted
                } else {
                    return None;
                };
                Some(Pin { reach, ..m.pin.clone() })
            })
            .collect()
    }
}

/// Where `m`'s mount point is on its parent's filesystem (`None`: the parent is not in the
/// table, as for the namespace's root, or does not hold the mount point), and the parent.
fn mount_point_location<'a>(
    m: &MountEntry,
    by_id: &HashMap<u32, &'a MountEntry>,
) -> Option<(Location, &'a MountEntry)> {
    let parent = *by_id.get(&m.parent_id).filter(|p| p.mount_id != m.mount_id)?;
    let rel = m.mount_point.as_path().strip_prefix(parent.mount_point.as_path()).ok()?;
    Some((Location { dev: parent.devnum, path: parent.root.as_path().join(rel) }, parent))
}

/// The places within `place` where `m` is mounted: its mount point's, and those of every mount
/// it sits on (a mount on a mount on the directory, one inside it). Bounded against a malformed
/// table whose parents form a cycle.
fn anchors(
    m: &MountEntry,
    by_id: &HashMap<u32, &MountEntry>,
    place: &Location,
    memo: &mut HashMap<u32, Vec<Location>>,
    depth: usize,
) -> Vec<Location> {
    if let Some(known) = memo.get(&m.mount_id) {
        return known.clone();
    }
    let mut found = Vec::new();
    if let Some((at, parent)) = mount_point_location(m, by_id) {
        if depth < 64 {
            found = anchors(parent, by_id, place, memo, depth + 1);
        }
        if at.within(place) {
            found.push(at);
        }
    }
    memo.insert(m.mount_id, found.clone());
    found
}

#[cfg(test)]
#[path = "pod_volumes_tests.rs"]
mod tests;
