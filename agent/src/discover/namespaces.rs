//! Mount namespaces: which tasks live in which namespace, and each namespace's mounts of the
//! devices we care about, reading one mountinfo per namespace (not one per task: on a busy node
//! that is hundreds of times less text).
//!
//! A namespace can outlive its processes, pinned by an nsfs bind mount (fstype `nsfs`, root
//! `mnt:[INODE]`) or an open fd whose link reads `mnt:[INODE]`. Those are read by entering them
//! through that file (live hosts only).
//!
//! A task's mountinfo shows only the mounts reachable from its root: a chrooted task hides the
//! rest. The table is therefore read through a task whose root is its namespace's root, or, when
//! every task is chrooted, by entering the namespace (whose root `setns` gives). Mounts
//! `statmount` sees that the text still lacks are reported ([`MountScan::hidden`]), never
//! dropped silently.
//!
//! Wanted are the mounts of the devices in scope and every btrfs mount: btrfs shows an
//! anonymous `0:NN` superblock device, never its block devices, so its mounts are joined to their
//! devices later through `/sys/fs/btrfs`.
//!
//! Every task's namespace is its own `ns/mnt` link, never its leader's: a thread that shares its
//! leader's fs_struct (`kcmp(KCMP_FS)`) can still join another mount namespace through
//! `setns(pidfd, CLONE_NEWNS | CLONE_NEWUTS)` (see the tests). A scan behind an action (a plan, the
//! re-check before a step: `engine/recheck.rs`) lists every namespace and asks `statmount` about
//! every mount not asked about before ([`super::statmount_cache`]); what makes it cheaper (a short `statmount` buffer, the devices in scope compared
//! as a list) gives the same answers, and nothing is skipped.
//!
//! A scan that only shows may answer a namespace's table without reading its text: the lines
//! remembered for the same mount IDs, the remembered ones followed through a small change, or,
//! with nothing remembered, every kept line built from `statmount` once this process saw such
//! lines equal to a text it read ([`super::statmount_cache::text_built`]).

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::Serialize;

pub use super::mount_namespace::{group, MountNamespace, NsEntry};
use super::mount_wanted::kept_kind;
pub use super::mount_wanted::{TextReuse, Wanted};
use super::mountinfo::{self, MountEntry};
use super::{is_gone, DiscoverError};
use crate::host::sys::mount_api;
use crate::host::HostRoot;
use crate::model::{DevNum, MountNsId};
use crate::{host::nsenter, host::parallel};

/// How mount tables are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MountReader {
    /// `listmount`/`statmount` to find the namespaces that mount a wanted device, then
    /// mountinfo text for those only; mountinfo everywhere when the kernel lacks the calls.
    #[default]
    Auto,
    /// mountinfo text for every namespace.
    MountInfo,
}

/// Set once the kernel has refused `listmount`/`statmount`/`NS_GET_MNTNS_ID`.
static MOUNT_API_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// A mount of a wanted device in one namespace.
#[derive(Debug, Clone, Serialize)]
pub struct NsMount {
    pub ns: MountNsId,
    /// How the namespace was read; `mount.mount_point` is relative to this entry's root.
    pub via: NsEntry,
    pub mount: MountEntry,
    /// The block device this mount holds, when it is not `mount.devnum` (a btrfs mount's
    /// anonymous device joined to a member device); set by the snapshot's join.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<DevNum>,
}

impl NsMount {
    /// The block device this mount holds.
    pub fn device(&self) -> DevNum {
        self.block.unwrap_or(self.mount.devnum)
    }
}

/// Result of reading the namespaces' mount tables.
#[derive(Debug, Default)]
pub struct MountScan {
    pub mounts: Vec<NsMount>,
    /// Namespaces found pinned by nsfs bind mounts, not yet known.
    pub nsfs_pins: Vec<(MountNsId, NsEntry)>,
    /// Namespaces checked with `statmount` alone (no mountinfo text needed).
    pub via_statmount: usize,
    /// Wanted mounts `statmount` saw that no mountinfo text showed: `(namespace, device, why)`.
    pub hidden: Vec<(MountNsId, DevNum, String)>,
    /// Namespaces whose table could not be read or made no sense (the error names the file and
    /// line): their mounts are not seen.
    pub unreadable: Vec<(MountNsId, DiscoverError)>,
}

/// Reads one mountinfo per namespace (in parallel) and keeps the mounts `wanted` asks for. A
/// namespace whose table cannot be read is reported in [`MountScan::unreadable`]; the others
/// are still read. `namespaces` is every namespace of the host: what `statmount` said of the
/// mounts of any other is forgotten.
pub fn read_mounts(
    host: &HostRoot,
    namespaces: &mut BTreeMap<MountNsId, MountNamespace>,
    wanted: Wanted<'_>,
    reader: MountReader,
) -> MountScan {
    let epoch = super::statmount_cache::begin_full_listing();
    let scan = read_some(host, namespaces, wanted, reader);
    super::statmount_cache::forget_unlisted(epoch);
    scan
}

/// [`read_mounts`] for some of the host's namespaces (those whose mounts changed).
pub fn read_some(
    host: &HostRoot,
    namespaces: &mut BTreeMap<MountNsId, MountNamespace>,
    wanted: Wanted<'_>,
    reader: MountReader,
) -> MountScan {
    let list: Vec<&MountNamespace> = namespaces.values().filter(|n| !n.tasks.is_empty()).collect();
    let live = host.is_live();
    let use_api = reader == MountReader::Auto && live;
    let results = parallel::map(&list, |ns| read_task_ns(host, ns, wanted, use_api, live));
    let known: HashSet<MountNsId> = namespaces.keys().copied().collect();
    let mut scan = MountScan::default();
    let mut seen_pins = HashSet::new();
    let ids: Vec<MountNsId> = list.iter().map(|n| n.id).collect();
    for (ns, r) in ids.into_iter().zip(results) {
        let one = match r {
            Ok(Some(one)) => one,
            Ok(None) => continue,
            Err(e) => {
                scan.unreadable.push((ns, e));
                continue;
            }
        };
        if one.bytes == 0 {
            scan.via_statmount += 1;
        }
        for d in one.api_hits.iter().filter(|d| !one.mounts.iter().any(|m| m.devnum == **d)) {
            scan.hidden.push((
                one.ns,
                *d,
                format!(
                    "statmount sees a mount of {d} in mount namespace {} that its mountinfo (read via {}) does not show",
                    one.ns,
                    one.via.describe()
                ),
            ));
        }
        if let Some(ns) = namespaces.get_mut(&one.ns) {
            ns.read_via = Some(one.via.clone());
            ns.kernel_id = one.kernel_id;
            ns.mount_count = one.lines;
            ns.mountinfo_bytes = one.bytes;
        }
        for m in one.mounts {
            if let Some(pin) = nsfs_pin(host, &one.via, &m) {
                if !known.contains(&pin.0) && seen_pins.insert(pin.0) {
                    scan.nsfs_pins.push(pin);
                }
            }
            if wanted.keeps(&m) {
                scan.mounts.push(NsMount { ns: one.ns, via: one.via.clone(), mount: m, block: None });
            }
        }
    }
    scan
}

struct OneNs {
    ns: MountNsId,
    via: NsEntry,
    lines: usize,
    bytes: usize,
    mounts: Vec<MountEntry>,
    /// Devices of the wanted mounts `statmount` counted (empty when it was not used).
    api_hits: Vec<DevNum>,
    /// The namespace's 64-bit ID, when it was listed.
    kernel_id: Option<u64>,
}

thread_local! {
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Whether a task's root is its namespace's root (its `root` link reads `/`), so its
/// mountinfo shows every mount of the namespace. Unknown (a fixture tree) counts as yes.
fn at_namespace_root(host: &HostRoot, pid: u32, tid: u32) -> bool {
    match std::fs::read_link(host.proc_task(pid, tid).join("root")) {
        Ok(p) => p.as_os_str() == "/",
        Err(_) => true,
    }
}

/// Reads the mount table of namespace `ns` through the first of its tasks still in it: as the
/// kernel lists it, as remembered, or from its mountinfo text. `Ok(None)`: no task of it is left.
fn read_task_ns(
    host: &HostRoot,
    ns: &MountNamespace,
    wanted: Wanted<'_>,
    use_api: bool,
    live: bool,
) -> Result<Option<OneNs>, DiscoverError> {
    if use_api && !MOUNT_API_UNSUPPORTED.load(Ordering::Relaxed) {
        if let Some(one) = quiet_without_a_task(ns, wanted) {
            return Ok(Some(one));
        }
    }
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
        for (i, &(pid, tid)) in ns.tasks.iter().enumerate() {
            // `checked`: whether (pid, tid) was seen in this namespace just now: a task's
            // namespace may be as an earlier scan read it (`snapshot::task_namespace_cache`), so every task
            // a table is read through is checked first, and one elsewhere is passed over.
            let (api_hits, listing, checked) = match ask_api(host, ns, (pid, tid), wanted, use_api) {
                ApiAnswer::Elsewhere => continue,
                ApiAnswer::Answered(one) => return Ok(Some(one)),
                ApiAnswer::Listed(l) => (l.hits, Some((l.ns_id, l.ids_key)), true),
                ApiAnswer::Unasked => (Vec::new(), None, false),
            };
            let here = |p: u32, t: u32| {
                !live
                    || (checked && (p, t) == (pid, tid))
                    || super::processes::task_mount_ns(&host.proc_task(p, t)) == Some(ns.id)
            };
            if !here(pid, tid) {
                continue;
            }
            // The text is read through a task at the namespace's root (its mountinfo shows every
            // mount); when every task is chrooted, by entering the namespace.
            let rooted =
                ns.tasks[i..].iter().copied().find(|&(p, t)| at_namespace_root(host, p, t) && here(p, t));
            if let Some((ns_id, task, t)) = remembered_text(wanted, listing, rooted) {
                let mounts = wanted.lines_of(&t.mounts);
                let via = NsEntry::Task { pid: task.0, tid: task.1 };
                return Ok(Some(OneNs {
                    ns: ns.id,
                    via,
                    lines: t.lines,
                    bytes: 0,
                    mounts,
                    api_hits,
                    kernel_id: Some(ns_id),
                }));
            }
            let Some((via, path)) = read_text(host, &mut buf, rooted, live, (pid, tid))? else { continue };
            let text = Text { buf: &buf, path, via, listing, api_hits };
            return parse_text(ns, wanted, text).map(Some);
        }
        Ok(None)
    })
}

/// What `listmount`/`statmount` said of a task's namespace, for [`read_task_ns`].
enum ApiAnswer {
    /// The task is gone or in another namespace now: the next task is tried.
    Elsewhere,
    /// No wanted mount in it: the namespace is answered without its text.
    Answered(OneNs),
    /// Its wanted mounts, ID and mount IDs: the text is read (or remembered) for them.
    Listed(Listing),
    /// Not asked (the calls are not to be used, are unsupported, or failed): the text is read.
    Unasked,
}

/// Asks `listmount`/`statmount` of the namespace of `task` (when `use_api` and the kernel has
/// the calls); a kernel without them is remembered, and the text is read from then on.
fn ask_api(
    host: &HostRoot,
    ns: &MountNamespace,
    (pid, tid): (u32, u32),
    wanted: Wanted<'_>,
    use_api: bool,
) -> ApiAnswer {
    if !use_api || MOUNT_API_UNSUPPORTED.load(Ordering::Relaxed) {
        return ApiAnswer::Unasked;
    }
    match hits_with_api(host, pid, tid, ns.id, wanted) {
        Ok(None) => ApiAnswer::Elsewhere,
        Ok(Some(Listing { total, hits, ns_id, .. })) if hits.is_empty() => ApiAnswer::Answered(OneNs {
            ns: ns.id,
            via: NsEntry::Task { pid, tid },
            lines: total,
            bytes: 0,
            mounts: Vec::new(),
            api_hits: hits,
            kernel_id: Some(ns_id),
        }),
        Ok(Some(l)) => ApiAnswer::Listed(l),
        Err(e) if mount_api::is_unsupported(&e) => {
            tracing::debug!("listmount/statmount unavailable ({e}); reading mountinfo text");
            MOUNT_API_UNSUPPORTED.store(true, Ordering::Relaxed);
            ApiAnswer::Unasked
        }
        Err(e) => {
            tracing::debug!(pid, tid, "statmount failed ({e}); reading mountinfo text");
            ApiAnswer::Unasked
        }
    }
}

/// The same mount IDs read through the same task: the lines as read last time, with the
/// namespace's ID and the task (when text may be reused, the namespace was listed and a task at
/// its root is in it).
fn remembered_text(
    wanted: Wanted<'_>,
    listing: Option<(u64, u64)>,
    rooted: Option<(u32, u32)>,
) -> Option<(u64, (u32, u32), Arc<super::statmount_cache::TextMemo>)> {
    let (Some((ns_id, key)), Some(task), true) = (listing, rooted, wanted.reuse_text != TextReuse::Never)
    else {
        return None;
    };
    let kept = |d, m| kept_kind(wanted, d, m);
    // Else the same lines less the mounts gone, plus the added ones from statmount;
    // with nothing remembered, every kept line from statmount (once this process
    // saw such lines equal to a text it read).
    let memo = match super::statmount_cache::text_for(ns_id, key, task)
        .or_else(|| super::statmount_cache::text_delta(ns_id, key, task, kept))
    {
        Some(t) => Some(t).filter(|t| {
            wanted.reuse_text != TextReuse::Confirmed || super::statmount_cache::still_true(ns_id, t, kept)
        }),
        None => super::statmount_cache::text_built(ns_id, key, task, kept),
    };
    memo.map(|t| (ns_id, task, t))
}

/// Reads the namespace's mountinfo text into `buf`: through `rooted`, the task at its root, or
/// (every task chrooted) by entering the namespace through `task`. A fixture tree cannot be
/// entered: its tasks are taken as they are. `Ok(None)`: the task is gone (or exited between
/// open and read).
fn read_text(
    host: &HostRoot,
    buf: &mut Vec<u8>,
    rooted: Option<(u32, u32)>,
    live: bool,
    (pid, tid): (u32, u32),
) -> Result<Option<(NsEntry, PathBuf)>, DiscoverError> {
    let (via, path) = match rooted.or((!live).then_some((pid, tid))) {
        Some((pid, tid)) => {
            buf.clear();
            let path = host.proc_task(pid, tid).join("mountinfo");
            match std::fs::File::open(&path).and_then(|mut f| f.read_to_end(buf)) {
                Ok(_) => {}
                Err(e) if is_gone(&e) => return Ok(None),
                Err(e) => return Err(DiscoverError::read(&path, e)),
            }
            (NsEntry::Task { pid, tid }, path)
        }
        _ => {
            let via = NsEntry::TaskNamespace { pid, tid };
            let file = via.ns_file(host);
            match nsenter::read_mountinfo(&file, host.proc()) {
                Ok(text) => *buf = text,
                Err(e) if is_gone(&e) => return Ok(None),
                Err(e) => return Err(DiscoverError::read(&file, e)),
            }
            (via, file)
        }
    };
    if buf.is_empty() {
        return Ok(None); // the task exited between open and read
    }
    Ok(Some((via, path)))
}

/// A namespace's mountinfo text as read, and what the kernel listed of it.
struct Text<'a> {
    buf: &'a [u8],
    /// The file it was read from.
    path: PathBuf,
    via: NsEntry,
    /// The namespace's ID and [`super::statmount_cache::ids_key`], when it was listed.
    listing: Option<(u64, u64)>,
    api_hits: Vec<DevNum>,
}

/// The wanted mounts of a namespace's text. A listed namespace's text read through a task is
/// remembered whole (every line a later scan of the same mount IDs may want).
fn parse_text(ns: &MountNamespace, wanted: Wanted<'_>, text: Text<'_>) -> Result<OneNs, DiscoverError> {
    let Text { buf, path, via, listing, api_hits } = text;
    let mut mounts = Vec::new();
    if let (Some((ns_id, ids_key)), NsEntry::Task { pid, tid }) = (listing, &via) {
        // Listed: keep every line a later scan of the same mount IDs may want.
        let any = |d: DevNum, t: &[u8]| d.major != 0 || t == b"btrfs" || t == b"nsfs" || wanted.text(d, t);
        let lines = mountinfo::scan(buf, any, |m| mounts.push(m))
            .map_err(|source| DiscoverError::MountInfo { path: path.clone(), source })?;
        let bytes = buf.len();
        let all = std::mem::take(&mut mounts);
        mounts = wanted.lines_of(&all);
        // Checked against the listing, so that a later change can be followed from it.
        let listing = super::statmount_cache::listing(ns_id, ids_key)
            .filter(|l| super::statmount_cache::consistent_listing(l, &all, |d, m| kept_kind(wanted, d, m)));
        let text = super::statmount_cache::TextMemo {
            ids_key,
            via: (*pid, *tid),
            lines,
            bytes,
            mounts: all,
            listing,
        };
        if wanted.reuse_text != TextReuse::Never {
            super::statmount_cache::calibrate(ns_id, &text, |d, m| kept_kind(wanted, d, m));
        }
        super::statmount_cache::remember_text(ns_id, text);
        return Ok(OneNs { ns: ns.id, via, lines, bytes, mounts, api_hits, kernel_id: Some(ns_id) });
    }
    let lines = mountinfo::scan(buf, |d, t| wanted.text(d, t), |m| mounts.push(m))
        .map_err(|source| DiscoverError::MountInfo { path: path.clone(), source })?;
    Ok(OneNs {
        ns: ns.id,
        via,
        lines,
        bytes: buf.len(),
        mounts,
        api_hits,
        kernel_id: listing.map(|(id, _)| id),
    })
}

/// A quiet namespace answered as it was last read, without opening anything of its tasks: in
/// a scan that reuses text while the mount IDs are the same (the daemon's light scans), for a
/// namespace the kernel listed for this scan (`kernel_names`: its 64-bit ID by its inode), whose
/// mount events are watched and none came since its last listing, with a remembered text read
/// through a task the scan still counts among the namespace's tasks and holding no namespace pin
/// (a pin is followed through that task's root, which must be checked). `None`: the usual way,
/// through a task checked to be in the namespace now. It saves, per namespace, the `ns/mnt`
/// open, `fstat` and `NS_GET_MNTNS_ID` and the `root` link: a fifth of a light scan at 400
/// namespaces.
fn quiet_without_a_task(ns: &MountNamespace, wanted: Wanted<'_>) -> Option<OneNs> {
    if wanted.reuse_text != TextReuse::WhileSameIds {
        return None;
    }
    let ns_id = *wanted.kernel_names?.get(&ns.id.0)?;
    let text = super::statmount_cache::quiet_text(ns_id)?;
    if !ns.tasks.contains(&text.via) || text.mounts.iter().any(|m| m.fstype.as_bytes() == b"nsfs") {
        return None;
    }
    let listing = text.listing.as_ref()?;
    let wants = wanted.magic_matcher();
    let api_hits = listing.iter().filter(|e| wants(e.1, e.2)).map(|e| e.1).collect();
    let mounts = wanted.lines_of(&text.mounts);
    QUIET_WITHOUT_A_TASK.fetch_add(1, Ordering::Relaxed);
    Some(OneNs {
        ns: ns.id,
        via: NsEntry::Task { pid: text.via.0, tid: text.via.1 },
        lines: text.lines,
        bytes: 0,
        mounts,
        api_hits,
        kernel_id: Some(ns_id),
    })
}

static QUIET_WITHOUT_A_TASK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many namespaces [`quiet_without_a_task`] answered (for tests and debugging).
pub fn answered_without_a_task() -> u64 {
    QUIET_WITHOUT_A_TASK.load(Ordering::Relaxed)
}

/// What `listmount` and `statmount` say of a task's namespace.
struct Listing {
    /// Its mount count.
    total: usize,
    /// The devices of the mounts `wanted` asks for.
    hits: Vec<DevNum>,
    ns_id: u64,
    /// [`super::statmount_cache::ids_key`] of its mount IDs.
    ids_key: u64,
}

/// What `listmount` and `statmount` say of a task's namespace, `expected`. `Ok(None)` when
/// the task is gone or in another namespace now.
fn hits_with_api(
    host: &HostRoot,
    pid: u32,
    tid: u32,
    expected: MountNsId,
    wanted: Wanted<'_>,
) -> std::io::Result<Option<Listing>> {
    use std::os::fd::AsFd;
    let task = host.proc_task(pid, tid);
    let ns_file = match std::fs::File::open(task.join("ns/mnt")) {
        Ok(f) => f,
        Err(e) if is_gone(&e) || super::processes::reaped(&e, &task) => return Ok(None),
        Err(e) => return Err(e),
    };
    if nix::sys::stat::fstat(&ns_file).map_err(std::io::Error::from)?.st_ino != expected.0 {
        return Ok(None); // the task is in another namespace now
    }
    let id = mount_api::mntns_id(ns_file.as_fd())?;
    // A scan that only shows may take a watched namespace with no mount event since its last
    // listing as it was listed (every scan behind an action lists; every tenth full scan lists a
    // tenth of them again, each in its turn: `statmount_cache::RELIST_SHARE`).
    let wants = wanted.magic_matcher();
    if wanted.reuse_text != TextReuse::Never {
        if let Some(l) = super::statmount_cache::quiet_listing(id, wanted.reuse_text == TextReuse::Confirmed)
        {
            let hits = l.iter().filter(|e| wants(e.1, e.2)).map(|e| e.1).collect();
            let ids_key = super::statmount_cache::ids_key_of(&l);
            return Ok(Some(Listing { total: l.len(), hits, ns_id: id, ids_key }));
        }
    }
    let ids = mount_api::list(id)?;
    let hits = super::statmount_cache::sb_devs(id, &ids)?
        .into_iter()
        .flatten() // `None`: unmounted meanwhile
        .filter(|&(d, magic)| wants(d, magic))
        .map(|(d, _)| d)
        .collect();
    Ok(Some(Listing { total: ids.len(), hits, ns_id: id, ids_key: super::statmount_cache::ids_key(&ids) }))
}

/// An nsfs bind mount of a mount namespace, and how to reach it from here.
fn nsfs_pin(host: &HostRoot, via: &NsEntry, m: &MountEntry) -> Option<(MountNsId, NsEntry)> {
    if m.fstype != "nsfs" {
        return None;
    }
    let id = MountNsId::from_link(m.root.to_str()?)?;
    // Through the task's own root: only a task at its namespace's root resolves the mount
    // point right (a namespace read by entering it has its pins found through their fds).
    let NsEntry::Task { pid, .. } = via else { return None };
    let bytes = m.mount_point.as_bytes();
    let rel = Path::new(OsStr::from_bytes(&bytes[bytes.iter().take_while(|&&b| b == b'/').count()..]));
    Some((id, NsEntry::Nsfs { path: host.proc_pid(*pid).join("root").join(rel) }))
}

/// Reads a namespace no task lives in by entering it through `entry` (live host only).
pub fn read_pinned(
    host: &HostRoot,
    id: MountNsId,
    entry: NsEntry,
    targets: &HashSet<DevNum>,
) -> Result<(MountNamespace, Vec<NsMount>), DiscoverError> {
    let file = entry.ns_file(host);
    let text = nsenter::read_mountinfo(&file, host.proc()).map_err(|e| DiscoverError::read(&file, e))?;
    let mut mounts = Vec::new();
    let wanted = Wanted {
        targets,
        nsfs_dev: Some(DevNum::new(u32::MAX, u32::MAX)),
        reuse_text: TextReuse::Never,
        kernel_names: None,
    };
    let lines = mountinfo::scan(
        &text,
        |d, t| wanted.text(d, t),
        |m| mounts.push(NsMount { ns: id, via: entry.clone(), mount: m, block: None }),
    )
    .map_err(|source| DiscoverError::MountInfo { path: file.clone(), source })?;
    let ns = MountNamespace {
        id,
        pids: Vec::new(),
        tasks: Vec::new(),
        pinned_by: Some(entry.clone()),
        read_via: Some(entry),
        mount_count: lines,
        mountinfo_bytes: text.len(),
        kernel_id: None,
    };
    Ok((ns, mounts))
}

#[cfg(test)]
#[path = "namespaces_tests.rs"]
mod tests;
