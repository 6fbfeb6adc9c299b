//! Mount changes in every mount namespace, as the kernel reports them ([`crate::discover::mount_events`]),
//! turned into "re-read these namespaces" requests for the scanner, so that one mount in one of
//! hundreds of namespaces costs a re-read of that namespace alone.
//!
//! The namespaces of each full scan are marked (a namespace is told apart by its 64-bit ID,
//! which the kernel never reuses, not by its inode number, which it does). An event names a
//! mount; a detached one is looked up in what the last listing remembered
//! ([`crate::discover::statmount_cache`]); an attached one is asked first of the namespace of the
//! task that attached it (the kernel names the task; a container runtime, a CSI plugin, or
//! `mount(8)` run through `nsenter` mounts from inside the namespace), and only when that task
//! is gone or elsewhere of each other watched namespace with `statmount` (measured: about
//! 0.26 µs per namespace asked that lacks the mount, so 0.1 ms for 400 namespaces at worst). Whatever cannot be placed (a lost event, a namespace not
//! watched) asks for a full scan instead: the watch may only ever make the agent look more.
//! Where the kernel cannot report mount events (before 6.15), the host's mountinfo `POLLPRI`
//! watch and the timer do the work, as before.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::sync::watch;

use super::state::{AgentState, NamespaceWatch};
use crate::discover::mount_events::{MountEvent, MountEvents};
use crate::discover::statmount_cache;
use crate::host::sys::mount_api;
use crate::model::MountNsId;

/// The kernel's mount events and the namespaces they are asked for.
#[derive(Debug)]
pub struct MountWatch {
    events: MountEvents,
    /// Watched namespaces: 64-bit namespace ID to the ID the scan knows it by (its inode).
    watched: Mutex<HashMap<u64, MountNsId>>,
    /// Where the host's `/proc` is (to find the namespace of the task that made a change).
    proc: std::sync::OnceLock<PathBuf>,
    /// Watched namespaces marked by [`MountWatch::watch_new`] that no full scan has read yet
    /// (64-bit IDs). Lock order: `watched`, then this.
    new_ones: Mutex<HashSet<u64>>,
    /// The namespace the last mount placed by asking was found in (0: none): a pod's setup
    /// mounts a few times in its new namespace, each from a process gone by the time the
    /// event is read, so that namespace is asked first.
    last_asked_found: std::sync::atomic::AtomicU64,
}

/// What a batch of events asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Request {
    /// Re-read the namespaces `changed`, and forget those `gone` (none: nothing the agent knows
    /// of changed).
    Namespaces { changed: HashSet<MountNsId>, gone: HashSet<MountNsId> },
    /// Only a full scan will do, and why.
    Full(String),
}

impl MountWatch {
    /// Opens the kernel's mount events; an error means they are not available here.
    pub fn open() -> io::Result<Self> {
        Ok(Self {
            events: MountEvents::new()?,
            watched: Mutex::new(HashMap::new()),
            proc: Default::default(),
            new_ones: Mutex::new(HashSet::new()),
            last_asked_found: Default::default(),
        })
    }

    fn watched(&self) -> std::sync::MutexGuard<'_, HashMap<u64, MountNsId>> {
        self.watched.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many namespaces are watched.
    pub fn watching(&self) -> usize {
        self.watched().len()
    }

    /// Which namespaces a batch of events is about.
    pub fn request_for(&self, events: &[MountEvent]) -> Request {
        let watched = self.watched();
        let proc = self.proc.get().map_or(Path::new("/proc"), PathBuf::as_path);
        let mut out = HashSet::new();
        let mut gone = HashSet::new();
        // Within a batch: the namespace of the event before (asked first), and the namespaces
        // found gone (a dying namespace's thousand detaches come in one batch; gone is final).
        let mut last = None;
        let mut dead: HashSet<u64> = HashSet::new();
        for e in events {
            let ns_id = match *e {
                MountEvent::Overflow => {
                    statmount_cache::note_all_changed();
                    return Request::Full("the kernel's mount event queue overflowed".into());
                }
                // A detached mount is in no namespace any more, so asking the namespaces finds
                // none (a mount moved is reported attached too, and placed as that): only the
                // listings remember where it was. Asking all 400 of a node's namespaces while a
                // dying pod's namespace is torn down cost milliseconds a batch.
                MountEvent::Detached(mnt) => statmount_cache::namespace_of(mnt, last),
                MountEvent::Attached(mnt, by) => self
                    .place_attached(&watched, mnt, namespace_of_task(proc, by))
                    .or_else(|| statmount_cache::namespace_of(mnt, last)),
            };
            // Neither listed nor mounted anywhere now: attached and detached again in between,
            // which leaves every table as it was.
            let Some(ns_id) = ns_id else { continue };
            if last != Some(ns_id) {
                statmount_cache::note_changed(ns_id);
                last = Some(ns_id);
            }
            match watched.get(&ns_id) {
                // A namespace's last process exited: the kernel detached every mount (one event
                // each) and the namespace is gone, which `listmount` tells in one call.
                Some(id)
                    if matches!(e, MountEvent::Detached(_))
                        && (dead.contains(&ns_id) || !mount_api::ns_exists(ns_id)) =>
                {
                    dead.insert(ns_id);
                    gone.insert(*id);
                }
                Some(id) => {
                    out.insert(*id);
                }
                None => {
                    return Request::Full(format!("a mount changed in unwatched mount namespace #{ns_id}"))
                }
            }
        }
        out.retain(|id| !gone.contains(id));
        Request::Namespaces { changed: out, gone }
    }
}

/// What [`MountWatch::watch_new`] found of the namespace of a process that started a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    /// In a namespace the last full scan read (or the process is gone): nothing to do.
    Known,
    /// In a namespace new since the last full scan, watched from now on (`fresh`: marked just
    /// now), known by the inode of its `ns/mnt` file (`id`) and its 64-bit ID (`ns_id`): to be
    /// read in full, processes and all.
    New { id: MountNsId, ns_id: u64, fresh: bool },
    /// In a namespace new since the last full scan that could not be marked: only a full scan
    /// reads it, and only the next one marks it.
    Unwatchable,
}

impl MountWatch {
    /// Watches the mount namespace process `pid` is in, if it is not watched yet. A namespace
    /// marked here is "new" until a full scan reads it ([`NamespaceWatch::sync`]): every program
    /// started in it until then has it read again (what the new program holds).
    pub fn watch_new(&self, pid: u32) -> Started {
        let proc = self.proc.get().map_or(Path::new("/proc"), PathBuf::as_path);
        let Ok(ns) = std::fs::File::open(proc.join(format!("{pid}/ns/mnt"))) else { return Started::Known };
        let Ok(ns_id) = mount_api::mntns_id(ns.as_fd()) else { return Started::Known };
        let mut watched = self.watched();
        if let Some(id) = watched.get(&ns_id) {
            return match self.new_ones().contains(&ns_id) {
                true => Started::New { id: *id, ns_id, fresh: false },
                false => Started::Known,
            };
        }
        let Ok(meta) = ns.metadata() else { return Started::Known };
        match self.events.watch_fd(ns.as_fd()) {
            Ok(()) => {
                use std::os::unix::fs::MetadataExt;
                statmount_cache::note_watched(ns_id);
                let id = MountNsId(meta.ino());
                watched.insert(ns_id, id);
                self.new_ones().insert(ns_id);
                Started::New { id, ns_id, fresh: true }
            }
            Err(e) => {
                tracing::debug!(pid, "cannot watch a new mount namespace: {e}");
                Started::Unwatchable
            }
        }
    }

    fn new_ones(&self) -> std::sync::MutexGuard<'_, HashSet<u64>> {
        self.new_ones.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The watched namespace that has attached mount `mnt` now ([`holder_of`]): asked first the
    /// namespace of the task that made it (`hint`), then the one the last mount placed by
    /// asking was in, then those new since the last full scan (a pod starting), then the rest.
    fn place_attached(&self, watched: &HashMap<u64, MountNsId>, mnt: u64, hint: Option<u64>) -> Option<u64> {
        use std::sync::atomic::Ordering;
        let mut likely: Vec<u64> = hint.into_iter().collect();
        likely.push(self.last_asked_found.load(Ordering::Relaxed));
        likely.extend(self.new_ones().iter().copied());
        let found = holder_of(watched, mnt, &likely);
        if let Some(ns) = found.filter(|&ns| Some(ns) != hint) {
            self.last_asked_found.store(ns, Ordering::Relaxed);
        }
        found
    }
}

impl NamespaceWatch for MountWatch {
    /// Watches the namespaces of the latest full scan (each given with the 64-bit ID the scan
    /// read from the namespace's own file, if it did, and a file naming it) that are not
    /// watched yet, and forgets those no longer there. A namespace whose ID is watched already
    /// is not opened again.
    fn sync(&self, namespaces: &[(MountNsId, Option<u64>, PathBuf)]) -> usize {
        let mut seen = HashSet::new();
        let mut added = 0;
        let mut watched = self.watched();
        for (id, kernel_id, file) in namespaces {
            if let Some(k) = kernel_id.filter(|k| watched.get(k) == Some(id)) {
                seen.insert(k);
                continue;
            }
            // The file is closed again right away: a mark does not pin the namespace.
            // Its task just exited: skipped. A task taken as the last scan read it may be
            // elsewhere now (`snapshot::task_namespace_cache`): its namespace is then not marked through it
            // (the next full read finds it again).
            let Ok(ns) = std::fs::File::open(file) else { continue };
            if nix::sys::stat::fstat(&ns).map(|st| st.st_ino) != Ok(id.0) {
                continue;
            }
            let Ok(ns_id) = mount_api::mntns_id(ns.as_fd()) else { continue };
            seen.insert(ns_id);
            if watched.contains_key(&ns_id) {
                continue;
            }
            match self.events.watch_fd(ns.as_fd()) {
                Ok(()) => {
                    statmount_cache::note_watched(ns_id);
                    confirm_listing(ns_id);
                    watched.insert(ns_id, *id);
                    added += 1;
                }
                Err(e) => tracing::debug!("cannot watch mount namespace {id} ({}): {e}", file.display()),
            }
        }
        // A namespace marked since the scan read the processes (a program started in it
        // meanwhile) is kept while it exists: its re-read is pending, and only the next full
        // scan would mark it again.
        let mut new_ones = self.new_ones();
        new_ones.retain(|k| !seen.contains(k) && mount_api::ns_exists(*k));
        watched.retain(|k, _| seen.contains(k) || new_ones.contains(k));
        added
    }

    fn use_host(&self, host: &crate::host::HostRoot) {
        let _ = self.proc.set(host.proc().to_owned());
    }
}

/// Lists namespace `ns_id` once more, now that its mount events are watched, so that the scan
/// that just listed it need not be repeated by the next one ([`statmount_cache::confirm_watched`]).
/// The scan listed every namespace before any was marked: without this, the daemon's first
/// timer scan listed every mount of the node again. Any error: the next scan lists it.
fn confirm_listing(ns_id: u64) {
    if let Ok(ids) = mount_api::list(ns_id) {
        statmount_cache::confirm_watched(ns_id, &ids);
    }
}

/// The watched namespace that has mount `mnt` now: each of `likely` that is watched, in turn
/// (the first is the namespace of the task that made the change, when known), then every other
/// watched namespace. A
/// mount's unique ID is never reused, so a namespace that has it is the namespace it was
/// attached to (or, if it moved since, the one it is in now, which is the one that needs
/// reading).
fn holder_of(watched: &HashMap<u64, MountNsId>, mnt: u64, likely: &[u64]) -> Option<u64> {
    let has = |ns: u64| watched.contains_key(&ns) && mount_api::sb_dev(ns, mnt).is_ok();
    let mut asked = HashSet::new();
    for &ns in likely {
        if asked.insert(ns) && has(ns) {
            return Some(ns);
        }
    }
    let found = watched.keys().copied().filter(|ns| !asked.contains(ns)).find(|&ns| has(ns));
    tracing::debug!(mnt, likely = likely.len(), "mount placed by asking every watched namespace");
    found
}

/// The 64-bit ID of the mount namespace task `tid` is in now (`None`: not known, or gone).
fn namespace_of_task(proc: &Path, tid: u32) -> Option<u64> {
    if tid == 0 {
        return None;
    }
    let ns = std::fs::File::open(proc.join(format!("{tid}/ns/mnt"))).ok()?;
    mount_api::mntns_id(ns.as_fd()).ok()
}

/// A filesystem outlives its last mount by a moment (the kernel reports the detach inside
/// `umount2`, and releases the superblock, its sysfs directory and its journal thread on the way
/// out): the namespaces are read again shortly after, so the view does not keep a filesystem
/// that is gone until the next full scan.
fn follow_up(state: &Arc<AgentState>, changed: &HashSet<MountNsId>, gone: &HashSet<MountNsId>) {
    for delay in FOLLOW_UPS {
        let state = Arc::clone(state);
        let (changed, gone) = (changed.clone(), gone.clone());
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            // A namespace that is gone is forgotten again (nothing left to read), which reads
            // the filesystems the kernel keeps alive.
            state.request_namespaces_gone(gone);
            state.request_namespace_rescan(changed);
        });
    }
}

/// When a namespace is read again after an unmount.
const FOLLOW_UPS: [std::time::Duration; 2] =
    [std::time::Duration::from_millis(100), std::time::Duration::from_millis(1000)];

/// The fanotify fd, borrowed by the runtime for as long as [`run`] runs.
struct Fd(RawFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Reads the kernel's mount events and asks the scanner to re-read the namespaces they are
/// about (or to scan in full). `on_watching` runs once the events are polled (never when they
/// cannot be).
pub async fn run(
    state: Arc<AgentState>,
    watch: Arc<MountWatch>,
    mut shutdown: watch::Receiver<bool>,
    on_watching: impl FnOnce(),
) {
    // `watch` (which owns the descriptor) is held until this function returns, after `fd`.
    let fd: AsyncFd<Fd> = match super::triggers::register(Fd(watch.events.as_raw_fd()), Interest::READABLE) {
        Ok(fd) => fd,
        Err(e) => {
            tracing::warn!("cannot poll mount events ({e}); mount changes are seen by the timer");
            return;
        }
    };
    tracing::info!(namespaces = watch.watching(), "watching every mount namespace's mount table (fanotify)");
    on_watching();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            ready = fd.readable() => {
                let Ok(mut guard) = ready else { return };
                let mut events = Vec::new();
                loop {
                    match watch.events.read(&mut buf) {
                        Ok(batch) => events.extend(batch),
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => {
                            tracing::warn!("reading mount events failed: {e}");
                            events.push(MountEvent::Overflow);
                            break;
                        }
                    }
                }
                guard.clear_ready();
                let detached = events.iter().any(|e| matches!(e, MountEvent::Detached(_)));
                let placing = std::time::Instant::now();
                let request = watch.request_for(&events);
                tracing::debug!(
                    events = events.len(),
                    place_us = placing.elapsed().as_micros() as u64,
                    "mount events read and placed"
                );
                match request {
                    Request::Namespaces { changed, gone } if changed.is_empty() && gone.is_empty() => {}
                    Request::Namespaces { changed, gone } => {
                        if detached {
                            follow_up(&state, &changed, &gone);
                        }
                        state.request_namespaces_gone(gone);
                        state.request_namespace_rescan(changed);
                    }
                    Request::Full(why) => {
                        tracing::debug!("mount change: {why}; scanning in full");
                        state.request_rescan("mount");
                    }
                }
            }
        }
    }
}
