//! Reading what a pin risk is judged by ([`super::pin_risk`]), cheaply enough for every scan.
//!
//! The host's whole table is read once (text, through a task at its root: its mount points are
//! the host's paths) and gives the sources. A namespace is then judged from the listing the scan
//! just made of it ([`super::statmount_cache::last_listing`]: unique mount ID, superblock device),
//! asking `statmount` only about the few mounts that could be copies:
//!
//! 1. a mount on no source's device is passed over (most of a node's mounts: tmpfs, proc,
//!    overlay roots);
//! 2. the root of each remaining one (`STATMOUNT_MNT_ROOT`, remembered by unique mount ID: a
//!    mount's root never changes) must be a source's root on that device (a container's
//!    `/etc/hosts` is on the host's root disk, but not at its root);
//! 3. its propagation is asked on every pass (`STATMOUNT_MNT_BASIC`, 96 bytes, no strings: the
//!    kernel reports no event when a mount is made private or a slave), and only a private one
//!    goes on;
//! 4. its mount point, and its parent's root and mount point when the parent is on a source's
//!    parent device, decide the place rule.
//!
//! A namespace the scan did not list (no `statmount` on this kernel, `--mount-reader
//! mountinfo`, one kept alive only by a pin) is judged from its whole mountinfo text
//! ([`super::mount_tables::read_table`]). A namespace that cannot be read is reported as
//! unknown, never as "no risk"; when the host's table cannot be read, every namespace is.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use super::cgroup;
use super::mount_namespace::MountNamespace;
use super::mount_tables::read_table;
use super::pin_risk::{classify, classify_table, Finding, Mount, Sources};
use super::statmount_cache;
use crate::host::sys::mount_api;
use crate::host::{parallel, HostRoot};
use crate::model::{DevNum, KernelText, MountNsId};

/// Processes named per namespace.
pub const MAX_PIDS: usize = 8;

/// One namespace found to be a pin risk, or that could not be judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsFinding {
    pub ns: MountNsId,
    /// Its processes (at most [`MAX_PIDS`]) and how many there are.
    pub pids: Vec<u32>,
    pub pid_count: usize,
    /// The first process's name.
    pub comm: Option<KernelText>,
    /// From its processes' cgroups (the first that names one).
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
    /// The copies; `Err`: why whether it is a pin risk is not known.
    pub outcome: Result<Finding, String>,
}

/// What the last pass found, for the next one to start from: the daemon judges again only the
/// namespaces whose mounts changed (their listing is another), but for every
/// [`statmount_cache::DEEP_EVERY`]th full pass, which judges every one (a mount made private or a slave
/// keeps its ID and sends no event).
#[derive(Debug, Default)]
pub struct PinMemo {
    /// The host's sources, or why its table could not be read.
    pub sources: Option<Result<std::sync::Arc<Sources>, String>>,
    /// The namespaces found to be pin risks or unknown, by ID.
    pub findings: std::collections::BTreeMap<MountNsId, NsFinding>,
    /// The listing each namespace was last judged from (the scan's, [`statmount_cache::last_listing`]:
    /// the memo replaces it when a mount comes or goes, so the same allocation is the same mounts).
    pub judged_from: HashMap<MountNsId, std::sync::Weak<Vec<statmount_cache::Entry>>>,
    /// Full passes made.
    pub passes: u64,
}

impl PinMemo {
    /// Whether `ns` is listed now exactly as when it was last judged.
    pub fn same_listing(&self, ns: &MountNamespace) -> bool {
        let now = ns.kernel_id.and_then(statmount_cache::last_listing);
        match (now, self.judged_from.get(&ns.id)) {
            (Some(now), Some(then)) => then.upgrade().is_some_and(|then| std::sync::Arc::ptr_eq(&now, &then)),
            _ => false,
        }
    }

    /// Notes the listings `judged` were judged from now.
    pub fn judged(&mut self, judged: &[&MountNamespace]) {
        for ns in judged {
            match ns.kernel_id.and_then(statmount_cache::last_listing) {
                Some(l) => self.judged_from.insert(ns.id, std::sync::Arc::downgrade(&l)),
                None => self.judged_from.remove(&ns.id),
            };
        }
    }
}

/// The host's sources, from its whole table (read through a task at its root).
pub fn host_sources(host: &HostRoot, host_ns: &MountNamespace, dirs: &[&Path]) -> Result<Sources, String> {
    read_table(host, host_ns).map(|t| Sources::of(&t, dirs)).map_err(|e| {
        format!("the host's mount table cannot be read ({e}): no namespace can be told a pin risk")
    })
}

/// Every namespace of `namespaces` but the host's that is a pin risk or cannot be judged, each
/// judged once (in parallel). `text` asks the whole mountinfo text of each (`--mount-reader
/// mountinfo`). A namespace `known` has a finding for, with the same first process (a process
/// stays in its pod and container), keeps the names read for it (process, pod, container)
/// instead of reading them again; one whose first process had no name read is named again.
pub fn check_all(
    host: &HostRoot,
    namespaces: &[&MountNamespace],
    host_ns: MountNsId,
    sources: &Sources,
    text: bool,
    known: &std::collections::BTreeMap<MountNsId, NsFinding>,
) -> Vec<NsFinding> {
    let list: Vec<&&MountNamespace> = namespaces.iter().filter(|n| n.id != host_ns).collect();
    let found = parallel::map(&list, |ns| {
        let outcome = judge(host, ns, sources, text);
        let interesting = outcome.as_ref().map_or(true, Finding::is_risk);
        interesting.then(|| {
            match known.get(&ns.id).filter(|k| k.comm.is_some() && k.pids.first() == ns.pids.first()) {
                Some(k) => NsFinding {
                    pids: ns.pids.iter().copied().take(MAX_PIDS).collect(),
                    pid_count: ns.pids.len(),
                    outcome,
                    ..k.clone()
                },
                None => labelled(host, ns, outcome),
            }
        })
    });
    found.into_iter().flatten().collect()
}

/// Forgets the roots remembered for namespaces other than `namespaces` (after a pass over
/// every namespace: the others are gone).
pub fn forget_other_namespaces(namespaces: &[&MountNamespace]) {
    let keep: HashSet<u64> = namespaces.iter().filter_map(|n| n.kernel_id).collect();
    roots().retain(|ns, _| keep.contains(ns));
}

/// One namespace's copies: by `statmount` from the scan's listing, else from its text.
fn judge(host: &HostRoot, ns: &MountNamespace, sources: &Sources, text: bool) -> Result<Finding, String> {
    if sources.is_empty() {
        return Ok(Finding::default());
    }
    let listing = (!text && host.is_live() && ns.pinned_by.is_none())
        .then_some(ns.kernel_id)
        .flatten()
        .and_then(|id| statmount_cache::last_listing(id).map(|l| (id, l)));
    match listing {
        Some((id, l)) => judge_listed(id, &l, sources)
            .map_err(|e| format!("mount namespace {} cannot be read with statmount: {e}", ns.id.0)),
        None => read_table(host, ns)
            .map(|t| classify_table(sources, &t))
            .map_err(|e| format!("the mount table of mount namespace {} cannot be read: {e}", ns.id.0)),
    }
}

/// Per namespace (64-bit ID), the roots of its mounts on a source's device, by unique mount ID
/// (a mount's root never changes, and an ID is never reused in a boot). A namespace's are
/// pruned to its listing each time it is judged.
type Roots = HashMap<u64, KernelText>;

fn roots() -> std::sync::MutexGuard<'static, HashMap<u64, Roots>> {
    static ROOTS: OnceLock<Mutex<HashMap<u64, Roots>>> = OnceLock::new();
    ROOTS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// A mount gone between the listing and the question: not an error.
fn gone(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(libc::ENOENT)
}

/// What `statmount` says of one mount: its root, point, parent and propagation.
fn paths(ns_id: u64, id: u64, dev: DevNum) -> std::io::Result<Option<Mount>> {
    match mount_api::stat_paths(ns_id, id) {
        Ok(p) => {
            let root = KernelText::from_bytes(p.root);
            Ok(Some(Mount {
                id,
                parent: p.parent,
                dev,
                root,
                point: KernelText::from_bytes(p.point),
                private: p.peer_group == 0 && p.master == 0,
            }))
        }
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`judge`] from a listing (sorted by unique ID): steps 1-4 of the module's doc.
fn judge_listed(
    ns_id: u64,
    listing: &[statmount_cache::Entry],
    sources: &Sources,
) -> std::io::Result<Finding> {
    let dev_of = |id: u64| listing.binary_search_by_key(&id, |e| e.0).ok().map(|i| listing[i].1);
    let mut known = roots().remove(&ns_id).unwrap_or_default();
    known.retain(|id, _| dev_of(*id).is_some());
    let found = judge_with(ns_id, listing, sources, &mut known, dev_of);
    roots().insert(ns_id, known);
    found
}

/// [`judge_listed`] with the namespace's remembered roots.
fn judge_with(
    ns_id: u64,
    listing: &[statmount_cache::Entry],
    sources: &Sources,
    known: &mut Roots,
    dev_of: impl Fn(u64) -> Option<DevNum>,
) -> std::io::Result<Finding> {
    let mut candidates: Vec<Mount> = Vec::new();
    let mut parents: HashMap<u64, Mount> = HashMap::new();
    for e in listing.iter().filter(|e| sources.has_dev(e.1)) {
        let (id, dev) = (e.0, e.1);
        let (root, fresh) = match known.get(&id) {
            Some(r) => (r.clone(), None),
            None => match paths(ns_id, id, dev)? {
                Some(m) => {
                    known.insert(id, m.root.clone());
                    (m.root.clone(), Some(m))
                }
                None => continue,
            },
        };
        if sources.keyed(dev, &root).next().is_none() {
            continue;
        }
        let private = match &fresh {
            Some(m) => m.private,
            None => match mount_api::propagation(ns_id, id) {
                Ok((_, peer, master)) => peer == 0 && master == 0,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(e),
            },
        };
        if !private {
            continue;
        }
        let Some(m) = (match fresh {
            Some(m) => Some(m),
            None => paths(ns_id, id, dev)?,
        }) else {
            continue;
        };
        let parent_devs = sources.parent_devs(dev, &root);
        if m.parent != m.id
            && !parents.contains_key(&m.parent)
            && dev_of(m.parent).is_some_and(|d| parent_devs.contains(&d))
        {
            if let Some(p) = paths(ns_id, m.parent, dev_of(m.parent).unwrap_or(dev))? {
                parents.insert(p.id, p);
            }
        }
        candidates.push(m);
    }
    Ok(classify(sources, &candidates, |id| parents.get(&id)))
}

/// A finding with its namespace's processes named: the first process's name, and the first
/// container ID and pod UID their cgroups give.
fn labelled(host: &HostRoot, ns: &MountNamespace, outcome: Result<Finding, String>) -> NsFinding {
    let mut f = NsFinding {
        ns: ns.id,
        pids: ns.pids.iter().copied().take(MAX_PIDS).collect(),
        pid_count: ns.pids.len(),
        comm: None,
        container_id: None,
        pod_uid: None,
        outcome,
    };
    for &pid in ns.pids.iter().take(MAX_PIDS) {
        let dir = host.proc_pid(pid);
        if f.comm.is_none() {
            f.comm = std::fs::read(dir.join("comm")).ok().map(|mut b| {
                while b.last() == Some(&b'\n') {
                    b.pop();
                }
                KernelText::from_bytes(b)
            });
        }
        if let Ok(b) = std::fs::read(dir.join("cgroup")) {
            let id = cgroup::identify(&String::from_utf8_lossy(&b));
            f.container_id = f.container_id.or(id.container_id);
            f.pod_uid = f.pod_uid.or(id.pod_uid);
        }
        if f.pod_uid.is_some() && f.container_id.is_some() {
            break;
        }
    }
    f
}
