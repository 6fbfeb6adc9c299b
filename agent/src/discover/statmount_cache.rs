//! What `statmount` said about each mount, remembered by the mount's unique 64-bit ID, so that
//! a rescan of a namespace whose mounts did not change costs one `listmount` and no `statmount`;
//! and, for the scans that only show (never those behind an action), the wanted lines of a
//! namespace's mountinfo text, reused while its set of mount IDs is the same ([`text_for`]).
//!
//! This is sound without any invalidation: a mount's superblock device and filesystem magic
//! never change, and the kernel never hands out a unique mount ID twice in one boot (the IDs
//! `listmount` returns). A mount that is gone simply stops being listed; its entry is dropped the
//! next time its namespace is listed, and a namespace a whole scan did not list is forgotten
//! ([`forget_unlisted`]). At about 24 bytes a mount, the 200,000 mounts of the busy-node scene
//! take under 5 MiB.
//!
//! With no text remembered, a scan that only shows builds a namespace's kept lines from
//! `statmount` ([`text_built`]) once a text this process read was equal to the lines built for
//! it ([`calibrate`]): a new pod's namespace costs a few `statmount` calls, not its thousand
//! lines of text.
//!
//! A report-only one-shot run (`holders`, `scan`) starts from what an earlier one of the same
//! boot remembered: [`export`] and [`import`] are what [`super::statmount_cache_file`] keeps between
//! runs, and [`changes`] says whether there is anything new to keep.

use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::discover::mountinfo::MountEntry;
use crate::host::sys::mount_api;
use crate::model::DevNum;

/// One remembered mount: `(unique mount ID, superblock device, filesystem magic, mountinfo ID)`.
pub type Entry = (u64, DevNum, u64, u32);

#[derive(Default)]
struct Memo {
    /// Per namespace (64-bit namespace ID): its mounts sorted by ID, and the scan epoch that
    /// last listed it.
    namespaces: HashMap<u64, NsMemo>,
    /// Per namespace: its mountinfo text as last read, parsed.
    texts: HashMap<u64, Arc<TextMemo>>,
    epoch: u64,
    /// Full scans that asked to reuse text (every [`DEEP_EVERY`]th reads it all again).
    shallow: u64,
    /// How many times a namespace's remembered mounts changed or a namespace was forgotten.
    changes: u64,
}

/// What is remembered of one namespace.
#[derive(Default)]
struct NsMemo {
    /// Its mounts as last listed, sorted by ID.
    mounts: Arc<Vec<Entry>>,
    /// The scan epoch that last listed it (or reused that listing).
    seen: u64,
    /// The epoch at which the kernel's mount events for it began to be watched.
    watched_since: Option<u64>,
    /// Its last listing was found whole by a `listmount` made after the watch began
    /// ([`confirm_watched`]): as good as a listing made under the watch.
    confirmed_under_watch: bool,
    /// A mount event for it came since it was last listed.
    changed: bool,
}

/// A namespace's mountinfo as last read: the lines any scan may want (every mount of a block
/// device, btrfs and nsfs), and what the text held, for one set of mount IDs and one reader.
#[derive(Debug)]
pub struct TextMemo {
    /// [`ids_key`] of the namespace's mount IDs when the text was read.
    pub ids_key: u64,
    /// The task the text was read through (paths are relative to its root).
    pub via: (u32, u32),
    pub lines: usize,
    pub bytes: usize,
    pub mounts: Vec<MountEntry>,
    /// The namespace's listing these lines were checked against ([`consistent_listing`]):
    /// what [`text_delta`] starts from. `None`: the text and the listing disagreed (a mount
    /// came or went between the two reads), so the next change reads the text again.
    pub listing: Option<Arc<Vec<Entry>>>,
}

/// One full scan in this many reads every namespace's text again, even where the mount IDs are
/// the same (a remount or a propagation change keeps the IDs).
pub const DEEP_EVERY: u64 = 10;

/// A confirmed turn (every [`DEEP_EVERY`]th full scan) lists again one watched, quiet namespace
/// in this many, each in its turn ([`relist_due`]), and takes the others as their mount events
/// say they are, as the other full scans do: the kernel reports every attach and detach (and a
/// lost event as an overflow, which marks every namespace changed), so listing them all again
/// (400,000 mounts, ~40 ms at 400 namespaces) only re-checks the watch. Each namespace is listed
/// again at least every `DEEP_EVERY * RELIST_SHARE` full scans (100 minutes at the default 60 s).
pub const RELIST_SHARE: u64 = 10;

/// Whether confirmed turn number `round` lists namespace `ns_id` again although no mount event
/// came for it: one turn in [`RELIST_SHARE`] for each namespace, spread over the namespaces by a
/// hash of the ID.
pub fn relist_due(ns_id: u64, round: u64) -> bool {
    mix(0, ns_id) % RELIST_SHARE == round % RELIST_SHARE
}

/// Whether a full scan may reuse text now: not the first, and not every [`DEEP_EVERY`]th.
pub fn shallow_turn() -> bool {
    let mut m = memo();
    m.shallow += 1;
    m.shallow % DEEP_EVERY != 1
}

/// A key for a set of mount IDs (a multiply-xorshift hash over them, in `listmount`'s order,
/// with their count): a change of any ID changes it, short of a 64-bit collision.
pub fn ids_key(ids: &[u64]) -> u64 {
    key_over(ids.len(), ids.iter().copied())
}

/// [`ids_key`] of a listing's mount IDs (in its order, which is `listmount`'s: by ID).
pub fn ids_key_of(listing: &[Entry]) -> u64 {
    key_over(listing.len(), listing.iter().map(|e| e.0))
}

fn key_over(count: usize, ids: impl Iterator<Item = u64>) -> u64 {
    ids.fold(0x9e37_79b9_7f4a_7c15 ^ count as u64, mix)
}

/// One step of the multiply-xorshift hash every key and checksum of the memo uses ([`ids_key`],
/// the memo file's checksum and table): a bijection of the state for each word, so a change
/// confined to one word always changes the result.
pub fn mix(h: u64, w: u64) -> u64 {
    let h = (h ^ w).wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// The text of namespace `ns_id` as last read through `via`, if its mount IDs are still those
/// of `ids_key`.
pub fn text_for(ns_id: u64, ids_key: u64, via: (u32, u32)) -> Option<Arc<TextMemo>> {
    memo().texts.get(&ns_id).filter(|t| t.ids_key == ids_key && t.via == via).cloned()
}

/// Remembers the text of namespace `ns_id`.
pub fn remember_text(ns_id: u64, text: TextMemo) {
    memo().texts.insert(ns_id, Arc::new(text));
}

fn memo() -> MutexGuard<'static, Memo> {
    static MEMO: OnceLock<Mutex<Memo>> = OnceLock::new();
    MEMO.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

/// The superblock device and filesystem magic of each of `ids` (mounts of namespace `ns_id`, as
/// `listmount` just listed them), asking the kernel only about IDs not seen before. `None` for a
/// mount unmounted in between.
pub fn sb_devs(ns_id: u64, ids: &[u64]) -> io::Result<Vec<Option<(DevNum, u64)>>> {
    LISTED.fetch_add(ids.len() as u64, Ordering::Relaxed);
    let known = {
        let mut m = memo();
        let epoch = m.epoch;
        let slot = m.namespaces.entry(ns_id).or_default();
        slot.seen = epoch;
        slot.changed = false;
        Arc::clone(&slot.mounts)
    };
    // Nothing mounted or unmounted since (the common case on an idle node): the answers as
    // they are, without a lookup.
    if known.len() == ids.len() && known.iter().zip(ids).all(|(e, id)| e.0 == *id) {
        return Ok(known.iter().map(|e| Some((e.1, e.2))).collect());
    }
    let mut out = Vec::with_capacity(ids.len());
    let mut next: Vec<Entry> = Vec::with_capacity(ids.len());
    for &id in ids {
        let found = match known.binary_search_by_key(&id, |e| e.0) {
            Ok(i) => Some((known[i].1, known[i].2, known[i].3)),
            Err(_) => {
                ASKED.fetch_add(1, Ordering::Relaxed);
                match mount_api::sb_dev_with_old_id(ns_id, id) {
                    Ok(v) => Some(v),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
                    Err(e) => return Err(e),
                }
            }
        };
        if let Some((dev, magic, old)) = found {
            next.push((id, dev, magic, old));
        }
        out.push(found.map(|(dev, magic, _)| (dev, magic)));
    }
    next.sort_unstable_by_key(|e| e.0);
    let mut m = memo();
    if next != *known {
        m.changes += 1;
    }
    if let Some(slot) = m.namespaces.get_mut(&ns_id) {
        slot.mounts = Arc::new(next);
    }
    Ok(out)
}

/// Namespace `ns_id`'s listing as [`sb_devs`] last stored it, if it is exactly the mount IDs
/// whose [`ids_key`] is `key` (none unmounted between `listmount` and `statmount`).
pub fn listing(ns_id: u64, key: u64) -> Option<Arc<Vec<Entry>>> {
    let m = memo();
    let l = &m.namespaces.get(&ns_id)?.mounts;
    let ids: Vec<u64> = l.iter().map(|e| e.0).collect();
    (ids_key(&ids) == key).then(|| Arc::clone(l))
}

/// Namespace `ns_id`'s mounts as last listed (sorted by unique ID), without marking anything:
/// what the latest scan found or took as quiet (for a pin risk's reader, `super::pin_read`).
pub fn last_listing(ns_id: u64) -> Option<Arc<Vec<Entry>>> {
    memo().namespaces.get(&ns_id).map(|n| Arc::clone(&n.mounts))
}

/// Whether mountinfo text and a listing describe the same mounts, as far as the kept lines
/// go: every kept line is a listed mount, and every listed mount of a kind the text keeps
/// (`kept(device, magic)`) has its line. A mount that came or went between the two reads
/// breaks it.
pub fn consistent_listing(
    listing: &[Entry],
    lines: &[MountEntry],
    kept: impl Fn(DevNum, u64) -> bool,
) -> bool {
    let listed: HashSet<u32> = listing.iter().map(|e| e.3).collect();
    let shown: HashSet<u32> = lines.iter().map(|m| m.mount_id).collect();
    lines.iter().all(|m| listed.contains(&m.mount_id))
        && listing.iter().filter(|e| kept(e.1, e.2)).all(|e| shown.contains(&e.3))
}

static DELTAS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a namespace's text was brought up to date by [`text_delta`] (for tests and
/// debugging).
pub fn deltas() -> u64 {
    DELTAS.load(std::sync::atomic::Ordering::Relaxed)
}

/// How many mounts a namespace may gain or lose for [`text_delta`] to follow them with
/// `statmount` instead of reading the text again.
pub const DELTA_MAX: usize = 64;

/// The text of namespace `ns_id` brought up to date without reading it: the lines remembered
/// for an earlier listing read through `via`, less the mounts gone since (by their mountinfo
/// ID), plus a line built from `statmount` for each mount added since that the text keeps
/// (`kept(device, magic)`). `None` (read the text) when nothing is remembered, the change is
/// larger than [`DELTA_MAX`], an added mount is btrfs (whose mounts are joined by their
/// source text) or not reachable from the namespace's root, or `statmount` cannot say
/// everything a line says (kernels before 6.13).
pub fn text_delta(
    ns_id: u64,
    key: u64,
    via: (u32, u32),
    kept: impl Fn(DevNum, u64) -> bool,
) -> Option<Arc<TextMemo>> {
    let old = memo().texts.get(&ns_id).filter(|t| t.via == via).cloned()?;
    let before = old.listing.clone()?;
    let now = listing(ns_id, key)?;
    let was: HashSet<u64> = before.iter().map(|e| e.0).collect();
    let is: HashSet<u64> = now.iter().map(|e| e.0).collect();
    let gone: HashSet<u32> = before.iter().filter(|e| !is.contains(&e.0)).map(|e| e.3).collect();
    let added: Vec<&Entry> = now.iter().filter(|e| !was.contains(&e.0)).collect();
    if gone.len() + added.len() > DELTA_MAX {
        return None;
    }
    let mut mounts: Vec<_> = old.mounts.iter().filter(|m| !gone.contains(&m.mount_id)).cloned().collect();
    for e in added.iter().filter(|e| kept(e.1, e.2)) {
        mounts.push(line_of(ns_id, e)?);
    }
    DELTAS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let text = Arc::new(TextMemo {
        ids_key: key,
        via,
        lines: (old.lines + added.len()).saturating_sub(gone.len()),
        bytes: old.bytes,
        mounts,
        listing: Some(now),
    });
    memo().texts.insert(ns_id, Arc::clone(&text));
    Some(text)
}

/// The mountinfo line of one listed mount, built from `statmount` alone. `None` when it cannot
/// be: a btrfs mount (joined to its devices by its source text), a mount gone or not reachable
/// from the namespace's root, or a kernel whose `statmount` cannot say everything a line says
/// (before 6.13).
fn line_of(ns_id: u64, e: &Entry) -> Option<MountEntry> {
    if e.2 == mount_api::BTRFS_SUPER_MAGIC {
        return None;
    }
    let stat = mount_api::stat_full(ns_id, e.0).ok()?;
    crate::discover::mountinfo::entry_from_stat(&stat)
}

/// The kept lines of a listing (`kept(device, magic)`), in its order, built from `statmount`.
fn lines_of(ns_id: u64, listing: &[Entry], kept: impl Fn(DevNum, u64) -> bool) -> Option<Vec<MountEntry>> {
    listing.iter().filter(|e| kept(e.1, e.2)).map(|e| line_of(ns_id, e)).collect()
}

/// What the texts read in this process said of lines built from `statmount` ([`calibrate`]):
/// nothing yet, each was equal, or one was not (which stops [`text_built`] for good).
static BUILT_LINES: AtomicU8 = AtomicU8::new(UNTRIED);
const UNTRIED: u8 = 0;
const EQUAL: u8 = 1;
const DIFFERENT: u8 = 2;

static BUILT: AtomicU64 = AtomicU64::new(0);

/// How many namespaces' texts [`text_built`] built (for tests and debugging).
pub fn built() -> u64 {
    BUILT.load(Ordering::Relaxed)
}

/// Whether [`text_built`] builds: a text read in this process was equal to the lines
/// `statmount` built for it, and none was different.
pub fn builds_lines() -> bool {
    BUILT_LINES.load(Ordering::Relaxed) == EQUAL
}

/// Compares a text just read from the kernel with the lines `statmount` builds for the same
/// listing: equal, in order, or [`text_built`] builds nothing more in this process. A text not
/// checked against its listing, or one with a line `statmount` cannot build (btrfs, a mount
/// gone meanwhile), says nothing either way.
pub fn calibrate(ns_id: u64, text: &TextMemo, kept: impl Fn(DevNum, u64) -> bool) {
    if BUILT_LINES.load(Ordering::Relaxed) == DIFFERENT {
        return;
    }
    let Some(listing) = text.listing.as_ref() else { return };
    match lines_of(ns_id, listing, kept) {
        Some(lines) if lines == text.mounts => {
            let _ = BUILT_LINES.compare_exchange(UNTRIED, EQUAL, Ordering::Relaxed, Ordering::Relaxed);
        }
        Some(lines) => {
            let differ = lines.iter().zip(&text.mounts).find(|(a, b)| a != b);
            tracing::debug!(
                ns_id,
                built = lines.len(),
                read = text.mounts.len(),
                ?differ,
                "lines built from statmount differ from the mountinfo text: every text is read from now on"
            );
            BUILT_LINES.store(DIFFERENT, Ordering::Relaxed);
        }
        None => {}
    }
}

/// A namespace's text without reading it, for a scan that only shows: its listing's kept lines
/// (`kept(device, magic)`) built from `statmount`, about 2 us each, where the text costs about
/// 1 us for each of its thousand lines. Only once a text read in this process was equal to the
/// lines built for it ([`calibrate`]), and never after one was not. `None` (read the text) when
/// not calibrated, the listing is not the one stored for `key`, or a line cannot be built.
pub fn text_built(
    ns_id: u64,
    key: u64,
    via: (u32, u32),
    kept: impl Fn(DevNum, u64) -> bool,
) -> Option<Arc<TextMemo>> {
    if BUILT_LINES.load(Ordering::Relaxed) != EQUAL {
        return None;
    }
    let now = listing(ns_id, key)?;
    let mounts = lines_of(ns_id, &now, kept)?;
    BUILT.fetch_add(1, Ordering::Relaxed);
    let text =
        Arc::new(TextMemo { ids_key: key, via, lines: now.len(), bytes: 0, mounts, listing: Some(now) });
    memo().texts.insert(ns_id, Arc::clone(&text));
    Some(text)
}

static CONFIRMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many times a namespace's remembered text was confirmed by [`still_true`] (for tests and
/// debugging).
pub fn confirmed() -> u64 {
    CONFIRMED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether every line of a remembered text of namespace `ns_id` still says what the kernel says
/// of that mount: `statmount` is asked again, in full, about each mount of a kind the text keeps
/// (`kept(device, magic)`), and the line it builds must equal the remembered one (options,
/// propagation, root, mount point, source). A remount, a propagation change or a renamed mount
/// point keeps the mount ID, so only this (or reading the text) sees it. `false` (read the text)
/// when the text was not checked against its listing, a line is missing or different, or
/// `statmount` cannot say everything a line says. About 2 us a line instead of about 1 us for
/// every line of the namespace's text: the text keeps a few lines of a thousand mounts.
pub fn still_true(ns_id: u64, text: &TextMemo, kept: impl Fn(DevNum, u64) -> bool) -> bool {
    let Some(listing) = text.listing.as_ref() else { return false };
    let mut checked = 0;
    for e in listing.iter().filter(|e| kept(e.1, e.2)) {
        let Some(line) = text.mounts.iter().find(|m| m.mount_id == e.3) else { return false };
        if line_of(ns_id, e).as_ref() != Some(line) {
            return false;
        }
        checked += 1;
    }
    let all = checked == text.mounts.len();
    if all {
        CONFIRMED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    all
}

/// Starts a scan that lists every namespace: namespaces it does not list are forgotten by
/// [`forget_unlisted`] with the returned epoch.
pub fn begin_full_listing() -> u64 {
    let mut m = memo();
    m.epoch += 1;
    m.epoch
}

/// Forgets the namespaces not listed since `epoch` began (they are gone, or out of reach).
pub fn forget_unlisted(epoch: u64) {
    let mut m = memo();
    let before = m.namespaces.len();
    m.namespaces.retain(|_, n| n.seen >= epoch);
    if m.namespaces.len() != before {
        m.changes += 1;
    }
    let Memo { namespaces, texts, .. } = &mut *m;
    texts.retain(|ns, _| namespaces.contains_key(ns));
}

/// The namespace whose last listing had mount `mnt_id`, asking namespace `hint` first (a
/// namespace whose last process exits has its thousand mounts detached one event each: the
/// one before's namespace has the next one too, so a batch costs a search per mount, not a
/// search of every namespace per mount).
pub fn namespace_of(mnt_id: u64, hint: Option<u64>) -> Option<u64> {
    let m = memo();
    let has = |n: &NsMemo| n.mounts.binary_search_by_key(&mnt_id, |e| e.0).is_ok();
    if let Some(h) = hint.filter(|h| m.namespaces.get(h).is_some_and(has)) {
        return Some(h);
    }
    m.namespaces.iter().find(|(_, n)| has(n)).map(|(ns, _)| *ns)
}

/// The kernel's mount events for namespace `ns_id` are watched from now on (a listing made
/// before this moment may have missed a change, so it is not trusted as quiet).
pub fn note_watched(ns_id: u64) {
    let mut m = memo();
    let epoch = m.epoch;
    if let Some(n) = m.namespaces.get_mut(&ns_id) {
        n.watched_since.get_or_insert(epoch);
    }
}

/// The mount IDs of namespace `ns_id`, listed after its mount events began to be watched
/// ([`note_watched`]), are `ids`: when they are those of its last listing and no event came
/// since, that listing is taken as made under the watch, so the next light scan may answer the
/// namespace as quiet instead of listing it again (the daemon's first timer scan listed all
/// 400,000 mounts of a 400-namespace node again for this alone). A mount ID is never reused
/// in a boot, so the same IDs are the same mounts; a change after the watch began is an event
/// (it sets `changed`, whichever comes first). Returns whether the listing was confirmed.
pub fn confirm_watched(ns_id: u64, ids: &[u64]) -> bool {
    let mut m = memo();
    let Some(n) = m.namespaces.get_mut(&ns_id) else { return false };
    let same = n.mounts.len() == ids.len() && n.mounts.iter().zip(ids).all(|(e, id)| e.0 == *id);
    if n.watched_since.is_none() || n.changed || !same {
        return false;
    }
    n.confirmed_under_watch = true;
    true
}

/// The kernel reported a mount change in namespace `ns_id`.
pub fn note_changed(ns_id: u64) {
    if let Some(n) = memo().namespaces.get_mut(&ns_id) {
        n.changed = true;
    }
}

/// Mount events were lost: no namespace's last listing is trusted as quiet.
pub fn note_all_changed() {
    memo().namespaces.values_mut().for_each(|n| n.changed = true);
}

/// The mounts of namespace `ns_id` as last listed (what [`sb_devs`] would answer for them),
/// when nothing can have changed since: its mount events were watched before that listing (or a
/// listing after the watch began found the same mounts: [`confirm_watched`]) and none came. `None`: list it again; in a confirmed turn (`confirming`), also when its turn to
/// be listed again has come ([`relist_due`]).
pub fn quiet_listing(ns_id: u64, confirming: bool) -> Option<Arc<Vec<Entry>>> {
    let mut m = memo();
    let epoch = m.epoch;
    let round = m.shallow / DEEP_EVERY;
    if confirming && relist_due(ns_id, round) {
        return None;
    }
    let n = m.namespaces.get_mut(&ns_id)?;
    let under_watch = n.confirmed_under_watch || n.watched_since.is_some_and(|w| w < n.seen);
    if n.changed || !under_watch {
        return None;
    }
    n.seen = epoch;
    LISTED.fetch_add(n.mounts.len() as u64, Ordering::Relaxed);
    Some(Arc::clone(&n.mounts))
}

/// The text remembered for namespace `ns_id`, through whichever task it was read, when the
/// namespace is quiet ([`quiet_listing`], outside a confirmed turn) and the text was read for
/// exactly that listing.
pub fn quiet_text(ns_id: u64) -> Option<Arc<TextMemo>> {
    let listing = quiet_listing(ns_id, false)?;
    let key = ids_key_of(&listing);
    memo().texts.get(&ns_id).filter(|t| t.ids_key == key).cloned()
}

/// How many mounts are remembered (for tests and debugging).
pub fn remembered() -> usize {
    memo().namespaces.values().map(|n| n.mounts.len()).sum()
}

static LISTED: AtomicU64 = AtomicU64::new(0);
static ASKED: AtomicU64 = AtomicU64::new(0);

/// How many listed mounts [`sb_devs`] answered in this process, and how many of them it asked
/// the kernel about (`statmount`): the rest came from memory.
pub fn lookups() -> (u64, u64) {
    (LISTED.load(Ordering::Relaxed), ASKED.load(Ordering::Relaxed))
}

/// How many times the remembered mounts changed: a namespace's mounts learned or dropped, a
/// namespace forgotten. A copy taken when this was `n` is still current while it is `n`.
pub fn changes() -> u64 {
    memo().changes
}

/// Each remembered namespace's ID and its mounts (sorted by unique mount ID), by namespace ID.
pub fn export() -> Vec<(u64, Arc<Vec<Entry>>)> {
    let m = memo();
    let mut all: Vec<_> = m.namespaces.iter().map(|(id, n)| (*id, Arc::clone(&n.mounts))).collect();
    all.sort_unstable_by_key(|(id, _)| *id);
    all
}

/// Takes `namespaces` (each one's mounts sorted by unique mount ID, as [`export`] gives them)
/// as remembered from an earlier listing: for a one-shot run that trusts what an earlier run
/// of this boot kept. A namespace this process already knows keeps what it has. Not a change.
pub fn import(namespaces: Vec<(u64, Vec<Entry>)>) {
    let mut m = memo();
    for (id, mounts) in namespaces {
        m.namespaces.entry(id).or_insert_with(|| NsMemo { mounts: Arc::new(mounts), ..NsMemo::default() });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the live kernel: a namespace listed twice is answered from memory the second time,
    /// with the same answers, and a mount that was never there is `None`.
    /// Every namespace is listed again in exactly one confirmed turn of each [`RELIST_SHARE`],
    /// whatever its ID, and the turns share the namespaces out.
    #[test]
    fn each_namespace_is_listed_again_once_in_every_relist_share_of_turns() {
        let mut per_round = [0usize; RELIST_SHARE as usize];
        let base = 0x3000_0000_0000_0000u64; // the kernel's IDs are sequential from a base
        for ns_id in (base..base + 400).chain([1, 2, u64::MAX]) {
            let due: Vec<u64> = (0..RELIST_SHARE * 3).filter(|&r| relist_due(ns_id, r)).collect();
            assert_eq!(due.len(), 3, "namespace {ns_id:#x} due in rounds {due:?}");
            assert!(due.windows(2).all(|w| w[1] - w[0] == RELIST_SHARE), "{due:?}");
            per_round[(due[0] % RELIST_SHARE) as usize] += 1;
        }
        assert!(per_round.iter().all(|&n| (20..=70).contains(&n)), "spread over the turns: {per_round:?}");
    }

    #[test]
    fn remembers_what_statmount_said() {
        use std::os::fd::AsFd;
        let Ok(ns) = std::fs::File::open("/proc/self/ns/mnt") else { return };
        let Ok(id) = mount_api::mntns_id(ns.as_fd()) else {
            eprintln!("skipped: NS_GET_MNTNS_ID unavailable on this kernel");
            return;
        };
        let Ok(ids) = mount_api::list(id) else {
            eprintln!(
                "skipped: listmount unavailable (needs Linux 6.8 and CAP_SYS_ADMIN for other namespaces)"
            );
            return;
        };
        let first = sb_devs(id, &ids).expect("statmount");
        let second = sb_devs(id, &ids).expect("from memory");
        assert_eq!(first, second);
        assert!(first.iter().all(Option::is_some), "every listed mount exists: {first:?}");
        let direct: Vec<_> = ids.iter().map(|m| mount_api::sb_dev(id, *m).ok()).collect();
        assert_eq!(second, direct, "the memory says what the kernel says");
        let mut with_bogus = ids.clone();
        with_bogus.push(u64::MAX - 1);
        let r = sb_devs(id, &with_bogus).expect("a missing mount is not an error");
        assert_eq!(r.last(), Some(&None));
        assert!(remembered() >= ids.len());
    }
}
