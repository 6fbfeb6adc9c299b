//! Grace clocks: since when each cleanup candidate has been seen unheld, continuously.
//!
//! "Unhealthy is not stale" (gotcha 13): a device becomes stale only after it has been observed
//! unheld, by complete scans, for the whole grace period. So a clock
//! - is bound to the device's [`Identity`], never to its number: a reused number starts afresh;
//! - runs on [`BootTime`] (`CLOCK_BOOTTIME`), which NTP and `date` cannot step;
//! - restarts when the device was not observed for longer than the largest gap allowed between
//!   scans (twice the rescan interval): what happened in between is unknown;
//! - restarts when an observation was incomplete (a blind spot reached the device: the caller
//!   forgets the clock), and when the device was held;
//! - when saved between runs of the one-shot CLI, is stamped with the kernel's boot id: a file
//!   from another boot (or with no boot id) restarts every clock.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::graph::identity::Identity;
use crate::host::clock::{human, BootTime};

/// One candidate's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    /// When it was first seen unheld, in this run of continuous observation.
    pub since: BootTime,
    /// The latest complete observation of it unheld.
    pub last_seen: BootTime,
}

/// Every candidate's clock, for one boot.
#[derive(Debug, Clone, Default)]
pub struct Clocks {
    boot_id: Option<String>,
    clocks: HashMap<Identity, Clock>,
    /// Why the clocks loaded from a file were dropped, said once in the next restart reason.
    load_note: Option<String>,
    /// The pod volume directories' clocks, by the directory's token (its path below the kubelet
    /// directory, device and inode: [`crate::judge::orphans`]).
    dirs: HashMap<String, Clock>,
    /// The file the clocks were loaded from, and what it held: saving them unchanged to it is a
    /// no-op.
    on_disk: Option<OnDisk>,
    /// A state file that could not be parsed (damaged, or another version's): kept aside, never
    /// overwritten, by the next save to it.
    damaged: Option<PathBuf>,
}

/// The file clocks were loaded from, and the devices' and directories' clocks it held.
type OnDisk = (PathBuf, HashMap<Identity, Clock>, HashMap<String, Clock>);

/// The saved form.
#[derive(Serialize, Deserialize)]
struct Saved {
    boot_id: Option<String>,
    clocks: Vec<SavedClock>,
    #[serde(default)]
    dirs: Vec<SavedDirClock>,
}

#[derive(Serialize, Deserialize)]
struct SavedDirClock {
    dir: String,
    #[serde(flatten)]
    clock: Clock,
}

#[derive(Serialize, Deserialize)]
struct SavedClock {
    identity: Identity,
    #[serde(flatten)]
    clock: Clock,
}

impl Clocks {
    /// No clocks yet, for the boot `boot_id` (`None`: unknown, so nothing saved is ever trusted).
    pub fn new(boot_id: Option<String>) -> Self {
        Self {
            boot_id,
            clocks: HashMap::new(),
            dirs: HashMap::new(),
            load_note: None,
            on_disk: None,
            damaged: None,
        }
    }

    /// The clocks a previous run saved, if they belong to this boot. A missing file starts
    /// afresh; a file from another boot, without a boot id, or unreadable starts afresh and says
    /// why in the next restart reason (the grace period only ever gets longer).
    pub fn load(path: &Path, boot_id: Option<String>) -> Self {
        let mut me = Self::new(boot_id);
        let text = match crate::host::durable::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return me,
            Err(e) => {
                me.load_note = Some(format!("the state file {} cannot be read ({e})", path.display()));
                return me;
            }
        };
        let saved = match serde_json::from_slice::<Saved>(&text) {
            Ok(s) => s,
            Err(e) => {
                let why = format!(
                    "the state file {} is damaged or another version's ({e}): it is kept aside as {} when the clocks are next saved, and every grace clock restarts",
                    path.display(),
                    aside(path).display()
                );
                tracing::warn!("{why}");
                me.load_note = Some(why);
                me.damaged = Some(path.to_owned());
                return me;
            }
        };
        match (&saved.boot_id, &me.boot_id) {
            (Some(then), Some(now)) if then == now => {
                me.clocks = saved.clocks.into_iter().map(|c| (c.identity, c.clock)).collect();
                me.dirs = saved.dirs.into_iter().map(|c| (c.dir, c.clock)).collect();
                me.on_disk = Some((path.to_owned(), me.clocks.clone(), me.dirs.clone()));
            }
            (then, now) => {
                me.load_note = Some(format!(
                    "the state file {} is from another boot (boot id {} now {}): every clock restarts",
                    path.display(),
                    then.as_deref().unwrap_or("unknown"),
                    now.as_deref().unwrap_or("unknown")
                ));
            }
        }
        me
    }

    /// Saves the clocks: a temporary file written and fsync'd, renamed over the old one, and the
    /// directory fsync'd, so a crash leaves the old file or the new one, never half of one; a
    /// symlink in the file's place is refused, never followed ([`crate::host::durable`]).
    /// Clocks unchanged since they were loaded from `path` are not written again.
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        // A run that changed no clock (`holders` of a held device, say) leaves the file as it
        // is: rewriting it costs two fsyncs, tens of milliseconds on a busy disk, for nothing.
        if self.on_disk.as_ref().is_some_and(|(p, c, d)| p == path && *c == self.clocks && *d == self.dirs) {
            return Ok(());
        }
        if self.damaged.as_deref() == Some(path) {
            match std::fs::rename(path, aside(path)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let saved = Saved {
            boot_id: self.boot_id.clone(),
            clocks: self
                .clocks
                .iter()
                .map(|(identity, clock)| SavedClock { identity: identity.clone(), clock: *clock })
                .collect(),
            dirs: self
                .dirs
                .iter()
                .map(|(dir, clock)| SavedDirClock { dir: dir.clone(), clock: *clock })
                .collect(),
        };
        crate::host::durable::write_atomically(
            path,
            &serde_json::to_vec(&saved).map_err(std::io::Error::other)?,
        )
    }

    /// Records a complete observation of `id` unheld at `now`. Returns when its clock started
    /// and, when it started just now, why (first seen, not observed for too long, new boot).
    pub fn observe(&mut self, id: &Identity, now: BootTime, max_gap: Duration) -> (BootTime, Option<String>) {
        observe_in(&mut self.clocks, id, now, max_gap, &mut self.load_note, "unheld")
    }

    /// [`Clocks::observe`] for a pod volume directory (by its token), proven orphaned and empty.
    pub fn observe_dir(&mut self, dir: &str, now: BootTime, max_gap: Duration) -> (BootTime, Option<String>) {
        observe_in(&mut self.dirs, &dir.to_owned(), now, max_gap, &mut self.load_note, "orphaned and empty")
    }

    /// Forgets a directory's clock: it was not seen orphaned and empty, or is gone.
    pub fn forget_dir(&mut self, dir: &str) {
        self.dirs.remove(dir);
    }

    /// Keeps only the directories' clocks `keep` accepts (the others were not seen orphaned).
    pub fn retain_dirs(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.dirs.retain(|d, _| keep(d));
    }

    /// Forgets a clock: the device was held, is gone, or was observed incompletely.
    pub fn forget(&mut self, id: &Identity) {
        self.clocks.remove(id);
    }

    /// Keeps only the clocks `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&Identity) -> bool) {
        self.clocks.retain(|id, _| keep(id));
    }

    /// The clock of `id`, if it runs.
    pub fn get(&self, id: &Identity) -> Option<Clock> {
        self.clocks.get(id).copied()
    }
}

/// Records an observation of `key` at `now` in `clocks` (see [`Clocks::observe`]); `seen` says
/// as what it was first seen.
fn observe_in<K: std::hash::Hash + Eq + Clone>(
    clocks: &mut HashMap<K, Clock>,
    key: &K,
    now: BootTime,
    max_gap: Duration,
    load_note: &mut Option<String>,
    seen: &str,
) -> (BootTime, Option<String>) {
    if let Some(c) = clocks.get_mut(key) {
        let gap = now.since(c.last_seen);
        if gap <= max_gap && now >= c.last_seen {
            c.last_seen = now;
            return (c.since, None);
        }
        let why = format!(
            "grace clock restarted: not observed for {} (more than the {} allowed between scans)",
            human(gap),
            human(max_gap)
        );
        *c = Clock { since: now, last_seen: now };
        return (now, Some(why));
    }
    clocks.insert(key.clone(), Clock { since: now, last_seen: now });
    let why = match load_note.take() {
        Some(note) => format!("grace clock started now: {note}"),
        None => format!("grace clock started now: first seen {seen}"),
    };
    (now, Some(why))
}

/// Where a damaged state file is kept: beside it, `NAME.damaged`.
fn aside(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".damaged");
    path.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::identity::Backing;
    use crate::model::{DevNum, DeviceName};

    fn id(seq: u64) -> Identity {
        Identity {
            name: DeviceName::new("loop3").expect("name"),
            devnum: DevNum::new(7, 3),
            diskseq: Some(seq),
            backing: Backing::Loop { dev: Some(DevNum::new(254, 1)), inode: Some(12), rdev: None, offset: 0 },
        }
    }

    fn at(s: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(s))
    }

    #[test]
    fn continuous_observation_keeps_the_clock_a_gap_restarts_it() {
        let mut c = Clocks::new(Some("b".into()));
        let gap = Duration::from_secs(120);
        assert_eq!(c.observe(&id(1), at(100), gap).0, at(100));
        assert_eq!(c.observe(&id(1), at(200), gap), (at(100), None));
        let (since, why) = c.observe(&id(1), at(400), gap);
        assert_eq!(since, at(400), "a 200 s gap restarts the clock");
        assert!(why.expect("reason").contains("not observed for 3m20s"));
        assert_eq!(c.observe(&id(2), at(401), gap).0, at(401), "another identity has its own clock");
    }

    #[test]
    fn saved_clocks_belong_to_their_boot() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        let mut c = Clocks::new(Some("boot-a".into()));
        c.observe(&id(1), at(100), Duration::from_secs(120));
        c.save(&path).expect("save");
        let same = Clocks::load(&path, Some("boot-a".into()));
        assert_eq!(same.get(&id(1)).map(|k| k.since), Some(at(100)));
        let mut other = Clocks::load(&path, Some("boot-b".into()));
        assert_eq!(other.get(&id(1)), None, "another boot's clocks are dropped");
        let (_, why) = other.observe(&id(1), at(5), Duration::from_secs(120));
        assert!(why.expect("why").contains("from another boot"));
        assert_eq!(Clocks::load(&path, None).get(&id(1)), None, "no boot id: nothing is trusted");
        // Unchanged clocks are not written again; changed ones are.
        // (a save renames a new file over the old one: a new inode)
        let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).expect("stat"));
        let before = inode();
        same.save(&path).expect("save unchanged");
        assert_eq!(inode(), before, "not rewritten");
        let mut changed = Clocks::load(&path, Some("boot-a".into()));
        changed.forget(&id(1));
        changed.save(&path).expect("save changed");
        assert_eq!(Clocks::load(&path, Some("boot-a".into())).get(&id(1)), None, "the change was saved");
        c.save(&path).expect("save again");
        // A directory's clock is kept as a device's is.
        let mut d = Clocks::load(&path, Some("boot-a".into()));
        d.observe_dir("pods/u/volumes/p/n@8:1/12", at(100), Duration::from_secs(120));
        d.save(&path).expect("save dirs");
        let mut again = Clocks::load(&path, Some("boot-a".into()));
        assert_eq!(
            again.observe_dir("pods/u/volumes/p/n@8:1/12", at(150), Duration::from_secs(120)).0,
            at(100)
        );
        std::fs::write(&path, "[]").expect("old format");
        assert_eq!(Clocks::load(&path, Some("boot-a".into())).get(&id(1)), None);
    }

    /// A state file that does not parse is never overwritten: the next save keeps it aside as
    /// `NAME.damaged` (what a person may want to look at), says so, and writes a fresh one.
    #[test]
    fn a_damaged_state_file_is_kept_aside_not_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"{\"boot_id\": \"boot-a\", \"clo").expect("write");
        let mut c = Clocks::load(&path, Some("boot-a".into()));
        let (_, why) = c.observe(&id(1), at(5), Duration::from_secs(120));
        let why = why.expect("why the clock restarts");
        assert!(why.contains("damaged") && why.contains("state.json.damaged"), "{why}");
        assert_eq!(std::fs::read(&path).expect("untouched until saved"), b"{\"boot_id\": \"boot-a\", \"clo");
        c.save(&path).expect("save");
        let kept = dir.path().join("state.json.damaged");
        assert_eq!(std::fs::read(&kept).expect("kept aside"), b"{\"boot_id\": \"boot-a\", \"clo");
        assert_eq!(Clocks::load(&path, Some("boot-a".into())).get(&id(1)).map(|k| k.since), Some(at(5)));
    }
}
