//! Mount propagation, as the kernel does it (`fs/pnode.c`): how the mounts of a device are tied
//! to the host's by peer groups ([`HostChain`]), and what unmounting one mount takes with it
//! ([`umount_reach`]).
//!
//! An unmount propagates through the **parent's** peer group, not the mount's own: when the
//! parent of the unmounted mount is shared (`shared:N`), the kernel's `propagate_umount` visits
//! every mount that receives propagation from the parent (its peers in group N, their slaves,
//! and transitively the peers and slaves of those) and unmounts the child each of them has
//! mounted at the same place (the same dentry: the parent's root plus the mount point below the
//! parent). So detaching a private copy in a pod's namespace whose parent is a peer of a shared
//! host directory (a Bidirectional `/var/lib/kubelet`) also unmounts the host's own mount at that
//! place, whatever the copy's own `shared:`/`master:` fields say (gotcha 29). Such a taken mount
//! may be of the same device or of another one mounted at that place on a peer.
//!
//! Pure: over whole mount tables parsed from mountinfo (`discover::mount_tables` reads them).

use std::collections::BTreeSet;

use serde::Serialize;

use super::Holder;
use crate::discover::mountinfo::MountEntry;
use crate::model::{DevNum, HolderKind, KernelText, MountNsId};

/// How the mounts of one superblock are tied to the mounts live in the host's namespace by
/// mount propagation, through any chain of peer groups.
///
/// Peer group numbers are kernel-wide, and every mount of a peer group (and every slave of one)
/// is a mount of the same superblock: the mounts of the device in every namespace (btrfs mounts
/// joined to each member) are the whole chain. A host mount `shared:5`, a copy in namespace A
/// `shared:7 master:5` and a copy of that in B `master:7`: groups 5 and 7 both carry the host's
/// mount, and B's copy is a copy of a live host mount as much as A's is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostChain {
    /// Groups with a host mount in them, and (recursively) every group a mount of which is a
    /// slave of such a group: a mount in one, or a slave of one, is a copy of a live host mount.
    pub downstream: BTreeSet<u32>,
    /// Groups a host mount receives propagation from, recursively: detaching a mount of one
    /// could propagate the unmount down to the host's copy.
    pub upstream: BTreeSet<u32>,
    /// Every group some mount of the superblock is in (`shared:N`), in any namespace the scan
    /// read: a slave of a group not among them cannot be traced to its source.
    pub known: BTreeSet<u32>,
}

impl HostChain {
    /// The closure over `mounts` (the mount holders of one device, every namespace).
    pub fn of<'a>(mounts: impl IntoIterator<Item = &'a Holder>) -> Self {
        let mounts: Vec<&Holder> = mounts.into_iter().filter(|h| h.kind == HolderKind::Mount).collect();
        let host = |h: &&&Holder| h.in_host_namespace == Some(true);
        let mut c = Self {
            downstream: mounts.iter().filter(host).filter_map(|h| h.shared_group).collect(),
            upstream: mounts.iter().filter(host).flat_map(|h| h.upstream()).collect(),
            known: mounts.iter().filter_map(|h| h.shared_group).collect(),
        };
        // Fixpoints: each turn adds at least one group or stops, so at most one turn per mount.
        loop {
            let before = (c.downstream.len(), c.upstream.len());
            for h in &mounts {
                let Some(g) = h.shared_group else { continue };
                if h.upstream().any(|u| c.downstream.contains(&u)) {
                    c.downstream.insert(g);
                }
                if c.upstream.contains(&g) {
                    c.upstream.extend(h.upstream());
                }
            }
            if (c.downstream.len(), c.upstream.len()) == before {
                break;
            }
        }
        c
    }

    /// Why detaching mount `h` would touch a mount live in the host's namespace (`None`: it is
    /// not tied to one).
    pub fn ties(&self, h: &Holder) -> Option<String> {
        if let Some(g) = h.upstream().find(|g| self.downstream.contains(g)) {
            return Some(format!(
                "it is a slave copy (master:{g}) of a mount live in the host's namespace, directly or through a chain of copies (as every systemd unit with PrivateTmp has): detaching it would break that process's view while the host's mount lives on"
            ));
        }
        if let Some(g) = h.shared_group.filter(|g| self.downstream.contains(g)) {
            return Some(format!(
                "it is a shared peer (shared:{g}) of a mount that carries the host's mount, so detaching it would unmount the host's copy (or a copy of it) too"
            ));
        }
        if let Some(g) = h.shared_group.filter(|g| self.upstream.contains(g)) {
            return Some(format!(
                "the host's mount is a slave of its peer group (shared:{g}), directly or through a chain: detaching it could propagate the unmount to the host's copy"
            ));
        }
        if let Some(g) = h.upstream().find(|g| !self.known.contains(g)) {
            return Some(format!(
                "it is a slave of peer group {g}, of which the scan sees no mount: whether it is a copy of a mount live on the host cannot be told"
            ));
        }
        None
    }
}

/// One namespace's whole mount table, as read for the propagation question: its lines, or
/// why it could not be read.
pub type NsTable = (MountNsId, Result<Vec<MountEntry>, String>);

/// A mount another mount's unmount takes with it through propagation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Taken {
    pub ns: MountNsId,
    pub mount_id: u32,
    /// Its superblock device as mountinfo shows it.
    pub devnum: DevNum,
    pub mount_point: KernelText,
    pub fstype: KernelText,
    pub source: KernelText,
    /// The parent's peer group the unmount propagates through.
    pub through_group: u32,
    /// The parent of the unmounted mount (its mount point in its namespace): what would have to
    /// stop propagating for the unmount to stay where it is.
    pub through_parent: KernelText,
}

/// What unmounting one mount takes with it (`Err`: why that cannot be told, which refuses).
pub type Reach = Result<Vec<Taken>, String>;

/// Where a mount (`ns`, `mount_id`) stands for the propagation question, from its own
/// namespace's table: `Ok(None)` when it is gone or its unmount cannot propagate (its parent is
/// not shared), `Ok(Some(group))` when it propagates through the parent's peer group `group`.
pub fn parent_group(table: &[MountEntry], ns: MountNsId, mount_id: u32) -> Result<Option<u32>, String> {
    let Some(m) = table.iter().find(|m| m.mount_id == mount_id) else { return Ok(None) };
    let Some(parent) = table.iter().find(|p| p.mount_id == m.parent_id && p.mount_id != m.mount_id) else {
        return Err(format!(
            "the parent (mount {}) of mount {mount_id} at {} is not in mount namespace {}'s table",
            m.parent_id, m.mount_point, ns.0
        ));
    };
    Ok(group(parent, "shared:"))
}

/// Every mount that unmounting `mount_id` in namespace `ns` takes with it, from the whole
/// tables of every namespace (`tables`; one that could not be read makes the answer an error
/// naming it, since a receiver could hide there). Empty when the mount is gone or its parent is
/// not shared. A child at the same place that has children of its own is counted too (the
/// kernel leaves it, but which kernel does what is not worth a guess: over-refusing is safe).
pub fn umount_reach(ns: MountNsId, mount_id: u32, tables: &[NsTable]) -> Reach {
    let own = tables
        .iter()
        .find(|(n, _)| *n == ns)
        .ok_or_else(|| format!("mount namespace {} was not read", ns.0))?;
    let own = own.1.as_ref().map_err(|e| format!("mount namespace {}: {e}", ns.0))?;
    let Some(g) = parent_group(own, ns, mount_id)? else { return Ok(Vec::new()) };
    if let Some((n, Err(e))) = tables.iter().find(|(_, t)| t.is_err()) {
        return Err(format!(
            "mount namespace {} could not be read ({e}), so whether it receives propagation from peer group {g} cannot be told",
            n.0
        ));
    }
    let all: Vec<(MountNsId, &MountEntry)> = tables
        .iter()
        .filter_map(|(n, t)| Some((*n, t.as_ref().ok()?)))
        .flat_map(|(n, t)| t.iter().map(move |m| (n, m)))
        .collect();
    let m = own.iter().find(|x| x.mount_id == mount_id).expect("found by parent_group");
    let parent = own.iter().find(|p| p.mount_id == m.parent_id).expect("found by parent_group");
    let Some(at) = place(parent, m) else {
        return Err(format!(
            "mount {mount_id} at {} does not lie below its parent's mount point {}",
            m.mount_point, parent.mount_point
        ));
    };
    // The groups that receive from `g`: g itself, and each group a slave of one of them is a
    // peer in (a slave that is also shared passes the propagation on to its own peers).
    let mut groups = BTreeSet::from([g]);
    loop {
        let before = groups.len();
        for (_, x) in &all {
            if let (Some(s), Some(master)) = (group(x, "shared:"), group(x, "master:")) {
                if groups.contains(&master) {
                    groups.insert(s);
                }
            }
        }
        if groups.len() == before {
            break;
        }
    }
    let receives = |x: &MountEntry| {
        group(x, "shared:").is_some_and(|s| groups.contains(&s))
            || group(x, "master:").is_some_and(|s| groups.contains(&s))
    };
    let mut taken = Vec::new();
    for (rns, r) in all.iter().filter(|(n, x)| receives(x) && !(*n == ns && x.mount_id == parent.mount_id)) {
        for (_, c) in
            all.iter().filter(|(n, c)| n == rns && c.parent_id == r.mount_id && c.mount_id != r.mount_id)
        {
            if place(r, c).as_deref() == Some(at.as_slice()) {
                taken.push(Taken {
                    ns: *rns,
                    mount_id: c.mount_id,
                    devnum: c.devnum,
                    mount_point: c.mount_point.clone(),
                    fstype: c.fstype.clone(),
                    source: c.source.clone(),
                    through_group: g,
                    through_parent: parent.mount_point.clone(),
                });
            }
        }
    }
    Ok(taken)
}

/// The peer group an optional field names (`shared:N`, `master:N`).
fn group(m: &MountEntry, prefix: &str) -> Option<u32> {
    m.optional.iter().find_map(|f| f.strip_prefix(prefix)?.parse().ok())
}

/// Where `child` is mounted in its parent's filesystem: the parent's root, then the child's
/// mount point below the parent's (`None`: it does not lie below it).
fn place(parent: &MountEntry, child: &MountEntry) -> Option<Vec<u8>> {
    let (pm, cm) = (parent.mount_point.as_bytes(), child.mount_point.as_bytes());
    let below: &[u8] = if pm == b"/" {
        cm
    } else if cm == pm {
        b""
    } else {
        let rest = cm.strip_prefix(pm)?;
        rest.starts_with(b"/").then_some(rest)?
    };
    let root = parent.root.as_bytes();
    let mut out = if root == b"/" { Vec::new() } else { root.to_vec() };
    out.extend_from_slice(below);
    if out.is_empty() {
        out.push(b'/');
    }
    Some(out)
}

#[cfg(test)]
#[path = "propagation_tests.rs"]
mod tests;
