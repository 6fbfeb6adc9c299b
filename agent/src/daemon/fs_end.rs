//! Following a live filesystem to its end: the kernel reports no event when a superblock dies.
//!
//! A filesystem can outlive its last mount (the `filesystem` holder: a live superblock with no
//! mount in any namespace, `/sys/fs/ext4/<dev>` still there, its journal thread still running):
//! for a moment after an unmount (the kernel reports the detach inside `umount2`, and releases the
//! superblock on the way out), or for as long as something the re-reads do not look at keeps it
//! (a lazily detached mount with a working directory or an open file on it: processes' files are
//! carried over from the last full scan). Its end is no mount event and no uevent, so without a
//! follow-up the daemon's view would show the device held until some later change or the timer's
//! full scan.
//!
//! So while a device's only holders are live filesystems, it is read again alone
//! ([`AgentState::request_device_rescan`]: the re-read reads the live filesystems and their
//! kernel threads again, `Snapshot::refresh_filesystems`), [`FIRST`] after the view that showed it
//! so, then at gaps doubling up to [`LONGEST_GAP`], at most [`TRIES`] times and for at most
//! [`FOR`]: an ext4 unmount's end is seen within milliseconds, one kept alive a while within half
//! a second of its end. A device whose live filesystem is held, with no mount, by processes too
//! (a lazily detached mount with a working directory, an open file or a mapping on it) is
//! followed the same way, but its processes are what is looked at (is each still there, more
//! than a zombie: a device re-read carries processes over from the last full scan, so it could
//! not see them go); once all are gone, a full scan is asked for (trigger `filesystem`), whose
//! view shows the filesystem alone (followed again, afresh) or ended. A holder listing only some
//! of its processes (over `graph::MAX_PIDS`) cannot be followed so and is left to the timer. A
//! filesystem that lives on longer (an overlay's upper directory, gotcha 17) is left to the
//! timer's full scan, the safety net, after that: the follow-up costs one device re-read (or one look at a few
//! `/proc` entries) per try, never more than [`TRIES`] for one episode. An episode ends when the
//! device is no longer so held (freed, mounted again, or gone), and a new one starts when what
//! holds it changes. The follower sleeps while no device is followed; it never reads a device.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};

use crate::discover::processes;
use crate::engine::view::View;
use crate::host::HostRoot;
use crate::model::HolderKind;

/// The first re-read, after the view that showed a device held by filesystems alone.
pub const FIRST: Duration = Duration::from_millis(10);
/// The longest gap between two re-reads of one device.
pub const LONGEST_GAP: Duration = Duration::from_millis(500);
/// At most this many re-reads a device for one episode...
pub const TRIES: u32 = 24;
/// ...and none later than this after it started.
pub const FOR: Duration = Duration::from_secs(10);

/// One device followed: what holds it, when its episode started and how many tries it had.
#[derive(Debug)]
struct Follow {
    /// The processes holding its filesystem (none: the filesystem alone).
    pids: Vec<u32>,
    since: Instant,
    tries: u32,
    /// When it is read next (`None`: the episode used its tries or its time).
    next: Option<Instant>,
}

impl Follow {
    /// The gap before try `tries + 1`.
    fn gap(tries: u32) -> Duration {
        FIRST.saturating_mul(1 << tries.min(16)).min(LONGEST_GAP)
    }
}

/// The devices held by live filesystems alone, each with its follow-up.
#[derive(Debug, Default)]
pub struct FsEnds {
    follows: Mutex<HashMap<String, Follow>>,
    /// Told when a device starts being followed: the follower, asleep, looks again.
    started: Notify,
}

/// The devices of `view` held by a live filesystem with no mount (kernel names), each with the
/// processes that hold it too (none: the filesystem alone). A device with any other holder, or a
/// holder whose processes are not all listed, is not among them.
pub fn ending_filesystems(view: &View) -> HashMap<String, Vec<u32>> {
    let mut out = HashMap::new();
    for d in &view.devices {
        let hs = &d.entry.holders;
        if !hs.iter().any(|h| h.kind == HolderKind::Filesystem) {
            continue;
        }
        let followable = |h: &&crate::graph::Holder| match h.kind {
            HolderKind::Filesystem => true,
            HolderKind::Cwd | HolderKind::Root | HolderKind::OpenFile | HolderKind::Mmap => {
                !h.pids.is_empty() && h.pid_count == h.pids.len()
            }
            _ => false,
        };
        if !hs.iter().all(|h| followable(&h)) {
            continue;
        }
        let mut pids: Vec<u32> = hs.iter().flat_map(|h| h.pids.iter().copied()).collect();
        pids.sort_unstable();
        pids.dedup();
        out.insert(d.entry.device.name.to_string(), pids);
    }
    out
}

impl FsEnds {
    fn follows(&self) -> std::sync::MutexGuard<'_, HashMap<String, Follow>> {
        self.follows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Told after each view is published, at `now`, which devices it shows held by live
    /// filesystems with no mount ([`ending_filesystems`]): a new one, or one whose processes
    /// changed, starts an episode; one no longer so held is forgotten.
    pub fn saw(&self, ending: HashMap<String, Vec<u32>>, now: Instant) {
        let mut follows = self.follows();
        follows.retain(|name, _| ending.contains_key(name));
        let mut started = false;
        for (name, pids) in ending {
            if follows.get(&name).is_some_and(|f| f.pids == pids) {
                continue;
            }
            started = true;
            follows.insert(name, Follow { pids, since: now, tries: 0, next: Some(now + FIRST) });
        }
        if started {
            self.started.notify_one();
        }
    }

    /// The devices whose try is due at `now` (with the processes holding each), each counted as
    /// tried and given its next time.
    pub fn due(&self, now: Instant) -> Vec<(String, Vec<u32>)> {
        let mut out = Vec::new();
        for (name, f) in self.follows().iter_mut() {
            if f.next.is_none_or(|t| t > now) {
                continue;
            }
            f.tries += 1;
            let next = now + Follow::gap(f.tries);
            f.next = (f.tries < TRIES && next <= f.since + FOR).then_some(next);
            out.push((name.clone(), f.pids.clone()));
        }
        out
    }

    /// When the earliest re-read is due (`None`: none).
    pub fn next_due(&self) -> Option<Instant> {
        self.follows().values().filter_map(|f| f.next).min()
    }

    /// Makes each due try through `try_one` (a device's name and the processes holding its
    /// filesystem), until `shutdown` changes (or its sender is gone). Sleeps while no device is
    /// followed.
    pub async fn follow(
        &self,
        mut try_one: impl FnMut(String, Vec<u32>),
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            // A permit stored by a start since the last look wakes this at once: none is lost.
            let started = self.started.notified();
            let until = self.next_due().map(tokio::time::Instant::from_std);
            tokio::select! {
                _ = started => {}
                _ = sleep_until(until) => {}
                _ = shutdown.changed() => return,
            }
            for (name, pids) in self.due(Instant::now()) {
                tracing::debug!(device = %name, ?pids, "a live filesystem with no mount: looked at for its end");
                try_one(name, pids);
            }
        }
    }
}

/// Whether process `pid` is gone: exited, or a zombie with no live thread (it holds no working
/// directory, root, file or mapping any more; its parent may reap it late). A process that cannot
/// be read is not taken as gone (its holder stays until a full scan says otherwise).
pub fn process_gone(host: &HostRoot, pid: u32) -> bool {
    match processes::read_entry(host, pid) {
        Ok(None) => true,
        Ok(Some(e)) => matches!(e.state, 'Z' | 'X') && e.tasks.is_empty(),
        Err(_) => false,
    }
}

/// Sleeps until `until`, or for ever if there is none.
async fn sleep_until(until: Option<tokio::time::Instant>) {
    match until {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[path = "fs_end_tests.rs"]
mod tests;
