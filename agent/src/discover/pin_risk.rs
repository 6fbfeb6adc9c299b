//! Pin risks (issue 35; field-notes incident 5 before it happens): which mounts of a mount
//! namespace are PRIVATE copies (neither `shared:` nor `master:`) of a live host mount under the
//! kubelet's or a container runtime's directory, or of the host root. Such a copy receives no
//! unmount from the host: when kubelet unmounts the volume, the copy keeps the filesystem, and
//! the device under it, alive (node_exporter with `/` mounted at `/host` and propagation None
//! kept `rbd3` busy; `rbd unmap` said EBUSY). A `master:N` copy (HostToContainer, `rslave`)
//! follows the host's unmount, and a `shared:N` one (Bidirectional) is a peer: neither is a risk.
//!
//! Pure: the host's table and a namespace's mounts in, the copies out. Reading them is
//! [`super::pin_read`].
//!
//! **What makes a mount a copy of a host mount.** The same superblock (`MAJ:MIN`) and the same
//! root within it is not enough: a pod's own volume is a bind of the host's volume mount (same
//! device, same root) at the container's path, and kubelet unmounts the host's only once the
//! pod's containers are gone. A copy made by copying a mount tree (a new mount namespace, an
//! `rbind` of `/` or of the kubelet directory) sits at the same place in the same parent
//! filesystem as the mount it copies: its parent is on the device the host mount's parent is
//! on, and its place in that filesystem (the parent's root joined with the mount point below the
//! parent's) is the host mount's. That is the test for mounts under the kubelet's and the
//! runtime's directories. The host root is matched by device and root alone: a mount of the
//! host's root filesystem at its root is a copy of it wherever it sits (`/host`, or a
//! namespace's own `/` as `unshare -m` leaves it).

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::mountinfo::MountEntry;
use crate::model::{DevNum, KernelText};

/// One mount of a namespace, as far as a pin risk is concerned. IDs are of one kind within a
/// namespace: mountinfo's (text) or the kernel's unique 64-bit ones (`statmount`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub id: u64,
    /// Its parent's ID (its own for a namespace's root).
    pub parent: u64,
    pub dev: DevNum,
    pub root: KernelText,
    /// Relative to the namespace's root; empty when not reachable from it.
    pub point: KernelText,
    /// Neither shared nor a slave: it receives nothing from any peer group.
    pub private: bool,
}

impl Mount {
    /// A mountinfo line as a [`Mount`].
    pub fn of_line(m: &MountEntry) -> Self {
        Self {
            id: u64::from(m.mount_id),
            parent: u64::from(m.parent_id),
            dev: m.devnum,
            root: m.root.clone(),
            point: m.mount_point.clone(),
            private: m.shared_group().is_none() && m.upstream_groups().is_empty(),
        }
    }
}

/// A live host mount whose private copy is a pin risk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub dev: DevNum,
    pub root: KernelText,
    /// Its mount point on the host.
    pub point: KernelText,
    pub fstype: KernelText,
    /// The host's root mount (`/`).
    pub host_root: bool,
    /// Shared on the host (`shared:N`): a slave copy follows it. A private host mount sends
    /// nothing even to a slave (HostToContainer cannot help until the host shares it).
    pub shared: bool,
    /// Where it sits: its parent's device and its place in the parent's filesystem (`None` for
    /// the root, or a parent the table does not show).
    pub place: Option<(DevNum, Vec<u8>)>,
}

/// The host mounts a private copy of which is a pin risk: the root, and every mount at or
/// under the kubelet's or a runtime's directory, indexed by device and root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sources {
    pub list: Vec<Source>,
    devs: HashSet<DevNum>,
    by_key: HashMap<(DevNum, KernelText), Vec<usize>>,
}

/// Whether host path `point` is `dir` or below it (on whole path components).
pub fn at_or_under(point: &[u8], dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let mut d = dir.as_os_str().as_bytes();
    while d.len() > 1 && d.ends_with(b"/") {
        d = &d[..d.len() - 1];
    }
    if d == b"/" || d.is_empty() {
        return false; // the root is a rule of its own
    }
    point == d || (point.starts_with(d) && point.get(d.len()) == Some(&b'/'))
}

/// A mount's place in its parent's filesystem: the parent's root joined with the mount point
/// below the parent's mount point. `None` when the child is not below the parent (a view from
/// another root) or either is unreachable.
pub fn place(child_point: &[u8], parent_root: &[u8], parent_point: &[u8]) -> Option<Vec<u8>> {
    if child_point.is_empty() || parent_point.is_empty() {
        return None;
    }
    let rel: &[u8] = if parent_point == b"/" {
        child_point.strip_prefix(b"/")?
    } else if child_point == parent_point {
        b""
    } else {
        child_point.strip_prefix(parent_point)?.strip_prefix(b"/")?
    };
    let mut out = parent_root.to_vec();
    if !rel.is_empty() {
        if !out.ends_with(b"/") {
            out.push(b'/');
        }
        out.extend_from_slice(rel);
    }
    Some(out)
}

impl Sources {
    /// The sources in the host's whole mount table (read through a task at the host's root):
    /// its root mount, and each mount at or under one of `dirs` (the kubelet's and the
    /// runtimes' directories, as the host names them).
    pub fn of(host: &[MountEntry], dirs: &[&Path]) -> Self {
        let by_id: HashMap<u32, &MountEntry> = host.iter().map(|m| (m.mount_id, m)).collect();
        // The root: the last mount at `/` (a mount over the first hides it).
        let root_id = host.iter().rev().find(|m| m.mount_point.as_bytes() == b"/").map(|m| m.mount_id);
        let mut s = Sources::default();
        for m in host {
            let host_root = Some(m.mount_id) == root_id;
            let point = m.mount_point.as_bytes();
            if !host_root && !dirs.iter().any(|d| at_or_under(point, d)) {
                continue;
            }
            let place = by_id.get(&m.parent_id).filter(|p| p.mount_id != m.mount_id).and_then(|p| {
                place(point, p.root.as_bytes(), p.mount_point.as_bytes()).map(|at| (p.devnum, at))
            });
            s.push(Source {
                dev: m.devnum,
                root: m.root.clone(),
                point: m.mount_point.clone(),
                fstype: m.fstype.clone(),
                host_root,
                shared: m.shared_group().is_some(),
                place: if host_root { None } else { place },
            });
        }
        s
    }

    fn push(&mut self, source: Source) {
        self.devs.insert(source.dev);
        self.by_key.entry((source.dev, source.root.clone())).or_default().push(self.list.len());
        self.list.push(source);
    }

    /// Whether any source is on `dev` (the cheap first filter: most mounts of a namespace are
    /// on devices no source is on).
    pub fn has_dev(&self, dev: DevNum) -> bool {
        self.devs.contains(&dev)
    }

    /// The sources with this device and root.
    pub fn keyed(&self, dev: DevNum, root: &KernelText) -> impl Iterator<Item = &Source> {
        self.by_key.get(&(dev, root.clone())).into_iter().flatten().map(|&i| &self.list[i])
    }

    /// The devices the sources' parents are on (a candidate whose parent is on none of them
    /// can only be a copy of the host root).
    pub fn parent_devs(&self, dev: DevNum, root: &KernelText) -> Vec<DevNum> {
        self.keyed(dev, root).filter_map(|s| s.place.as_ref().map(|p| p.0)).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// A private copy a namespace holds, and the host mount it copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    /// Where the copy is in the namespace.
    pub mount_point: KernelText,
    pub mount_id: u64,
    pub source: Source,
}

/// What one namespace holds: where it has a private copy of the host root, and its private
/// copies of mounts under the kubelet's and runtimes' directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Finding {
    pub host_root: Option<KernelText>,
    pub copies: Vec<Copy>,
}

impl Finding {
    pub fn is_risk(&self) -> bool {
        self.host_root.is_some() || !self.copies.is_empty()
    }
}

/// The devices whose sources differ between `old` and `new`: a source on it came, went or
/// changed (its propagation, its place), or their order did. A namespace's finding depends on
/// the sources only through those on the devices its mounts are on ([`classify`] asks
/// [`Sources::keyed`] by a mount's own device), so a namespace with no mount on one of these
/// devices is judged against `new` exactly as it was against `old`; one that has such a mount
/// may gain a copy (kubelet mounting again a volume a namespace kept a copy of) or lose one.
pub fn changed_devs(old: &Sources, new: &Sources) -> HashSet<DevNum> {
    fn by_dev(s: &Sources) -> HashMap<DevNum, Vec<&Source>> {
        let mut m: HashMap<DevNum, Vec<&Source>> = HashMap::new();
        for x in &s.list {
            m.entry(x.dev).or_default().push(x);
        }
        m
    }
    let (o, n) = (by_dev(old), by_dev(new));
    o.keys().chain(n.keys()).filter(|d| o.get(d) != n.get(d)).copied().collect()
}

/// The private copies among `candidates` (mounts of one namespace whose device and root some
/// source has), with `parent` giving any mount of that namespace by ID (at least the
/// candidates' parents).
pub fn classify<'a>(
    sources: &Sources,
    candidates: impl IntoIterator<Item = &'a Mount>,
    parent: impl Fn(u64) -> Option<&'a Mount>,
) -> Finding {
    let mut f = Finding::default();
    for c in candidates.into_iter().filter(|c| c.private) {
        for s in sources.keyed(c.dev, &c.root) {
            if s.host_root {
                if f.host_root.is_none() && !c.point.as_bytes().is_empty() {
                    f.host_root = Some(c.point.clone());
                }
                continue;
            }
            let Some((pdev, at)) = &s.place else { continue };
            let Some(p) = parent(c.parent).filter(|p| p.id != c.id) else { continue };
            if p.dev == *pdev
                && place(c.point.as_bytes(), p.root.as_bytes(), p.point.as_bytes()).as_deref()
                    == Some(&at[..])
            {
                f.copies.push(Copy { mount_point: c.point.clone(), mount_id: c.id, source: s.clone() });
                break;
            }
        }
    }
    f
}

/// [`classify`] over a namespace's whole table (mountinfo text, read through a task at its
/// root).
pub fn classify_table(sources: &Sources, table: &[MountEntry]) -> Finding {
    let mounts: Vec<Mount> = table.iter().map(Mount::of_line).collect();
    let by_id: HashMap<u64, &Mount> = mounts.iter().map(|m| (m.id, m)).collect();
    let candidates = mounts.iter().filter(|m| sources.keyed(m.dev, &m.root).next().is_some());
    classify(sources, candidates, |id| by_id.get(&id).copied())
}

#[cfg(test)]
#[path = "pin_risk_tests.rs"]
mod tests;
