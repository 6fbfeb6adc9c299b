//! What `statmount` said about each mount ([`crate::discover::statmount_cache`]), kept in a file between
//! report-only one-shot runs (`holders`, and `scan`, which only shows), so that a run asks the
//! kernel only about the mounts made since the last one: on a node with 200 namespaces of 1,000
//! mounts, about 200,000 `statmount` calls (most of a one-shot `holders`' CPU) become one read
//! of a few MiB.
//!
//! **Why it is sound.** An entry says, for one unique 64-bit mount ID, the mount's superblock
//! device, its filesystem magic and its old (mountinfo) ID. None of these ever changes for a
//! live mount, and the kernel never hands out a unique mount ID twice in one boot; the file is
//! stamped with the boot ID (`/proc/sys/kernel/random/boot_id`) and is ignored in any other
//! boot (it lives under `/run`, a tmpfs, anyway). An entry is used only for a mount ID that
//! `listmount` lists right now, so a mount that is gone is never shown from the file, and a
//! mount made since is asked about as before. The file holds no holder, no process, no verdict.
//!
//! **What it trusts.** The file is read only on the live host (never a fixture tree), only
//! when it is a regular file (opened `O_NOFOLLOW`), owned by this process's effective user and
//! writable by nobody else, in a directory owned by that user and writable by nobody else (both
//! checked on the open descriptors, so nothing can be swapped in between), no larger than
//! [`MAX_BYTES`]; its header must name this format and this boot, its size must be what its
//! counts make, and its 64-bit checksum must match. Any doubt and the file is ignored (one debug
//! line with the reason): the run asks the kernel about every mount, as without a file. Nothing
//! about the file is ever an error for the user.
//!
//! **Who uses it.** Only the report-only one-shot requests load it, `holders` and `scan` in
//! `engine/requests/show.rs`: never a scan behind an action (`plan`, `clean`, `release`,
//! `apply`, the re-check before each step in `engine/recheck.rs`, which run in processes that
//! never load it), never the daemon (whose memory is its own). They save it after the run, and the daemon
//! after each full scan ([`Kept::written_only`]: it writes, never reads), only when the memo
//! learned or dropped something (a steady node writes nothing), to a temporary file in the same
//! directory renamed over the old one: two writers at once leave one or the other, whole. So on
//! a node where the daemon runs (its `/run/blockjanitor` is the host's), a one-shot `holders`
//! asks the kernel only about the mounts made since the daemon's last full scan, even the first
//! time. The memo forgets every namespace a full scan did not list, so the file holds the
//! node's current mounts only.
//!
//! **Why in the engine.** The memo itself is a scanner's ([`crate::discover::statmount_cache`]);
//! its file is state the fronts' runs keep, like the grace clocks, and `discover/` reads the
//! kernel and writes nothing: the one-shot requests (`engine/requests/`) load and save it, the
//! daemon (above the engine) saves it.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::fcntl::{openat, renameat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

use crate::discover::statmount_cache::{self, Entry};
use crate::host::HostRoot;
use crate::model::DevNum;

/// Where the one-shot commands keep the memo unless told otherwise (`--statmount-memo`).
pub const DEFAULT_PATH: &str = "/run/blockjanitor/statmount-memo";

/// The largest file read: 4 million mounts (the kernel's default `fs.mount-max` is 100,000 per
/// namespace; a node has a few hundred namespaces of a few hundred to a thousand mounts).
pub const MAX_BYTES: u64 = 64 << 20;

const MAGIC: [u8; 8] = *b"BJSTMEMO";
const VERSION: u32 = 1;
/// magic, version, flags (0), boot ID, namespace, pair and entry counts, checksum.
const HEADER: usize = 8 + 4 + 4 + 16 + 8 + 8 + 8 + 8;
/// Every record of the payload: a (device, magic) pair, a namespace's head, a mount.
const RECORD: usize = 16;

/// Why a memo file was not used.
#[derive(Debug, thiserror::Error)]
pub enum CacheFileError {
    #[error("no file yet")]
    Missing,
    #[error("cannot open or read it: {0}")]
    Io(#[from] io::Error),
    #[error("cannot open {what}: {source}")]
    Open { what: &'static str, source: nix::Error },
    #[error("not a regular file")]
    NotRegular,
    #[error("its {what} is owned by uid {uid}, not by this process's effective uid {euid}")]
    Owner { what: &'static str, uid: u32, euid: u32 },
    #[error("its {what} is writable by its group or others (mode {mode:o})")]
    Writable { what: &'static str, mode: u32 },
    #[error("{size} bytes, over the cap of {MAX_BYTES}")]
    TooLarge { size: u64 },
    #[error("not a statmount memo (magic {0:02x?})")]
    Magic([u8; 8]),
    #[error("format version {version} flags {flags:#x}, this agent reads version {VERSION} flags 0")]
    Version { version: u32, flags: u32 },
    #[error("written in another boot ({found}; this boot is {now})")]
    OtherBoot { found: String, now: String },
    #[error("{size} bytes where its header's counts make {expected}")]
    Size { size: u64, expected: u64 },
    #[error("checksum {found:#018x} does not match its payload's {computed:#018x}")]
    Checksum { found: u64, computed: u64 },
    #[error("malformed payload: {0}")]
    Payload(&'static str),
    #[error("not the live host (a fixture tree keeps none)")]
    NotLive,
    #[error("the boot id cannot be read")]
    NoBootId,
}

/// A boot ID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`) as its 16 bytes.
pub fn parse_boot_id(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|&b| b != b'-').collect();
    if text.len() != 36 || hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        out[i] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(out)
}

fn show_boot(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// A 64-bit checksum over 8-byte words ([`statmount_cache::mix`]): a change confined to one word
/// always changes it.
struct Sum(u64);

impl Sum {
    fn new() -> Self {
        Self(0x243f_6a88_85a3_08d3)
    }

    fn record(&mut self, r: &[u8; RECORD]) {
        for w in r.chunks_exact(8) {
            let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
            self.0 = statmount_cache::mix(self.0, w);
        }
    }
}

fn record(a: u64, b: u64) -> [u8; RECORD] {
    let mut r = [0u8; RECORD];
    r[..8].copy_from_slice(&a.to_le_bytes());
    r[8..].copy_from_slice(&b.to_le_bytes());
    r
}

fn halves(r: &[u8; RECORD]) -> (u64, u64) {
    let word = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap_or_default());
    (word(&r[..8]), word(&r[8..]))
}

fn dev_word(d: DevNum) -> u64 {
    (u64::from(d.major) << 32) | u64::from(d.minor)
}

/// A multiply-xorshift hasher for the (device, magic) table: one cheap hash per mount (a first
/// version hashed each mount twice with `SipHash`), so that writing a changed memo of 200,000
/// mounts costs a few ms (a cold run's CPU is 0.99-1.04x a run without the memo's).
#[derive(Default)]
struct WordHasher(u64);

impl std::hash::Hasher for WordHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|b| self.write_u64(u64::from(*b)));
    }

    fn write_u32(&mut self, w: u32) {
        self.write_u64(u64::from(w));
    }

    fn write_u64(&mut self, w: u64) {
        self.0 = statmount_cache::mix(self.0, w);
    }
}

/// The distinct (device, magic) pairs of `namespaces`' mounts, and each mount's index in them
/// (in the order of the mounts).
type PairTable = (Vec<(DevNum, u64)>, Vec<u32>);

fn pair_table(namespaces: &[(u64, Arc<Vec<Entry>>)]) -> PairTable {
    let mut index: HashMap<(DevNum, u64), u32, std::hash::BuildHasherDefault<WordHasher>> =
        HashMap::default();
    let mut pairs = Vec::new();
    let mut of = Vec::new();
    for e in namespaces.iter().flat_map(|(_, m)| m.iter()) {
        of.push(*index.entry((e.1, e.2)).or_insert_with(|| {
            pairs.push((e.1, e.2));
            (pairs.len() - 1) as u32
        }));
    }
    (pairs, of)
}

/// The payload's records in order: the distinct (device, magic) pairs, then per namespace its
/// head (ID, mount count) and its mounts (unique ID; old ID and pair index).
fn records(
    namespaces: &[(u64, Arc<Vec<Entry>>)],
    (pairs, of): &PairTable,
    mut out: impl FnMut(&[u8; RECORD]) -> io::Result<()>,
) -> io::Result<()> {
    for (d, magic) in pairs {
        out(&record(dev_word(*d), *magic))?;
    }
    let mut of = of.iter();
    for (id, mounts) in namespaces {
        out(&record(*id, mounts.len() as u64))?;
        for (e, pair) in mounts.iter().zip(of.by_ref()) {
            out(&record(e.0, u64::from(e.3) | (u64::from(*pair) << 32)))?;
        }
    }
    Ok(())
}

/// Writes `namespaces` (by ID, each one's mounts sorted by unique ID: [`statmount_cache::export`])
/// as a memo file of boot `boot`.
pub fn encode(w: &mut impl Write, boot: &[u8; 16], namespaces: &[(u64, Arc<Vec<Entry>>)]) -> io::Result<()> {
    let table = pair_table(namespaces);
    let mut sum = Sum::new();
    records(namespaces, &table, |r| {
        sum.record(r);
        Ok(())
    })?;
    let (ns, pairs, entries) = (namespaces.len() as u64, table.0.len() as u64, table.1.len() as u64);
    w.write_all(&MAGIC)?;
    w.write_all(&VERSION.to_le_bytes())?;
    w.write_all(&0u32.to_le_bytes())?;
    w.write_all(boot)?;
    for v in [ns, pairs, entries, sum.0] {
        w.write_all(&v.to_le_bytes())?;
    }
    records(namespaces, &table, |r| w.write_all(r))
}

/// Reads a memo file of `size` bytes, checking it as the module doc says, for boot `boot`.
pub fn decode(
    r: &mut impl Read,
    size: u64,
    boot: &[u8; 16],
) -> Result<Vec<(u64, Vec<Entry>)>, CacheFileError> {
    if size > MAX_BYTES {
        return Err(CacheFileError::TooLarge { size });
    }
    let mut h = [0u8; HEADER];
    r.read_exact(&mut h)?;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap_or_default());
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
    let magic: [u8; 8] = h[..8].try_into().unwrap_or_default();
    if magic != MAGIC {
        return Err(CacheFileError::Magic(magic));
    }
    let (version, flags) = (u32_at(8), u32_at(12));
    if (version, flags) != (VERSION, 0) {
        return Err(CacheFileError::Version { version, flags });
    }
    let found: [u8; 16] = h[16..32].try_into().unwrap_or_default();
    if found != *boot {
        return Err(CacheFileError::OtherBoot { found: show_boot(&found), now: show_boot(boot) });
    }
    let (ns, pairs, entries, checksum) = (u64_at(32), u64_at(40), u64_at(48), u64_at(56));
    let expected = ns
        .checked_add(pairs)
        .and_then(|n| n.checked_add(entries))
        .and_then(|n| n.checked_mul(RECORD as u64))
        .and_then(|n| n.checked_add(HEADER as u64));
    if expected != Some(size) {
        return Err(CacheFileError::Size { size, expected: expected.unwrap_or(u64::MAX) });
    }
    let mut sum = Sum::new();
    let mut next = |r: &mut dyn Read| -> Result<(u64, u64), CacheFileError> {
        let mut rec = [0u8; RECORD];
        r.read_exact(&mut rec)?;
        sum.record(&rec);
        Ok(halves(&rec))
    };
    let mut table = Vec::with_capacity(pairs as usize);
    for _ in 0..pairs {
        let (d, magic) = next(r)?;
        table.push((DevNum::new((d >> 32) as u32, d as u32), magic));
    }
    let mut out: Vec<(u64, Vec<Entry>)> = Vec::with_capacity(ns as usize);
    let mut left = entries;
    for _ in 0..ns {
        let (id, count) = next(r)?;
        if out.last().is_some_and(|(prev, _)| *prev >= id) {
            return Err(CacheFileError::Payload("namespaces not in ascending order"));
        }
        left =
            left.checked_sub(count).ok_or(CacheFileError::Payload("more mounts than the header counts"))?;
        let mut mounts: Vec<Entry> = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let (mnt, rest) = next(r)?;
            let &(dev, magic) = table
                .get((rest >> 32) as usize)
                .ok_or(CacheFileError::Payload("a mount names a (device, magic) pair beyond the table"))?;
            if mounts.last().is_some_and(|e| e.0 >= mnt) {
                return Err(CacheFileError::Payload("mounts not in ascending order of ID"));
            }
            mounts.push((mnt, dev, magic, rest as u32));
        }
        out.push((id, mounts));
    }
    if left != 0 {
        return Err(CacheFileError::Payload("fewer mounts than the header counts"));
    }
    if sum.0 != checksum {
        return Err(CacheFileError::Checksum { found: checksum, computed: sum.0 });
    }
    Ok(out)
}

/// Checks an open directory or file is `euid`'s and writable by nobody else; returns its stat.
fn trusted(fd: impl AsFd, what: &'static str, euid: u32) -> Result<nix::sys::stat::FileStat, CacheFileError> {
    let st = fstat(fd).map_err(|e| CacheFileError::Open { what, source: e })?;
    if st.st_uid != euid {
        return Err(CacheFileError::Owner { what, uid: st.st_uid, euid });
    }
    if st.st_mode & 0o022 != 0 {
        return Err(CacheFileError::Writable { what, mode: st.st_mode & 0o7777 });
    }
    Ok(st)
}

/// The directory of `path`, opened without following a symbolic link, checked [`trusted`].
fn open_dir(path: &Path) -> Result<OwnedFd, CacheFileError> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(AT_FDCWD, dir, flags, Mode::empty()).map_err(|e| match e {
        nix::Error::ENOENT => CacheFileError::Missing,
        e => CacheFileError::Open { what: "directory", source: e },
    })?;
    trusted(&fd, "directory", nix::unistd::geteuid().as_raw())?;
    Ok(fd)
}

fn file_name(path: &Path) -> Result<&OsStr, CacheFileError> {
    path.file_name().ok_or(CacheFileError::Payload("the path names no file"))
}

/// Reads the memo file at `path` for boot `boot`, trusting it only as the module doc says.
pub fn read(path: &Path, boot: &[u8; 16]) -> Result<Vec<(u64, Vec<Entry>)>, CacheFileError> {
    let dir = open_dir(path)?;
    let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC;
    let fd = openat(&dir, file_name(path)?, flags, Mode::empty()).map_err(|e| match e {
        nix::Error::ENOENT => CacheFileError::Missing,
        e => CacheFileError::Open { what: "file", source: e },
    })?;
    let st = fstat(&fd).map_err(|e| CacheFileError::Open { what: "file", source: e })?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(CacheFileError::NotRegular);
    }
    trusted(&fd, "file", nix::unistd::geteuid().as_raw())?;
    let size = u64::try_from(st.st_size).unwrap_or(u64::MAX);
    if size > MAX_BYTES {
        return Err(CacheFileError::TooLarge { size });
    }
    decode(&mut BufReader::with_capacity(1 << 16, File::from(fd)), size, boot)
}

/// Writes `namespaces` to `path` for boot `boot`: a temporary file in the same (trusted)
/// directory, renamed over `path`. Creates the directory (mode 0700) when it is missing.
pub fn write(
    path: &Path,
    boot: &[u8; 16],
    namespaces: &[(u64, Arc<Vec<Entry>>)],
) -> Result<(), CacheFileError> {
    let dir = match open_dir(path) {
        Err(CacheFileError::Missing) => {
            let d = path.parent().ok_or(CacheFileError::Missing)?;
            std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700).create(d)?;
            open_dir(path)?
        }
        r => r?,
    };
    let name = file_name(path)?;
    let mut tmp = std::ffi::OsString::from(".");
    tmp.push(name);
    tmp.push(format!(".{}.tmp", std::process::id()));
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let create = || openat(&dir, tmp.as_os_str(), flags, Mode::from_bits_truncate(0o600));
    let fd = match create() {
        // Left by an earlier run with this pid that was killed mid-write.
        Err(nix::Error::EEXIST) => {
            let _ = unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            create()
        }
        r => r,
    }
    .map_err(|e| CacheFileError::Open { what: "temporary file", source: e })?;
    let written = (|| {
        let mut w = BufWriter::with_capacity(1 << 16, File::from(fd));
        encode(&mut w, boot, namespaces)?;
        w.into_inner().map_err(io::IntoInnerError::into_error)?;
        renameat(&dir, tmp.as_os_str(), &dir, name).map_err(io::Error::from)
    })();
    if written.is_err() {
        let _ = unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
    }
    Ok(written?)
}

/// The memo of a report-only one-shot run: loaded from the file when it is trusted, and saved
/// back after the run when the run changed it ([`Kept::save`]).
pub struct Kept {
    path: PathBuf,
    boot: [u8; 16],
    changes: u64,
}

impl Kept {
    /// Loads the memo file at `path` into this process's memo (when it is trusted: else one
    /// debug line says why, and the run asks the kernel about every mount). `None` when there
    /// is nothing to keep: not the live host, or no boot ID.
    pub fn load(host: &HostRoot, path: &Path) -> Option<Self> {
        let kept = Self::at(host, path)?;
        match read(path, &kept.boot) {
            Ok(namespaces) => {
                let mounts: usize = namespaces.iter().map(|(_, m)| m.len()).sum();
                let count = namespaces.len();
                statmount_cache::import(namespaces);
                tracing::debug!(path = %path.display(), namespaces = count, mounts, "statmount memo loaded");
            }
            Err(e) => tracing::debug!(path = %path.display(), reason = %e, "statmount memo ignored"),
        }
        Some(Self { changes: statmount_cache::changes(), ..kept })
    }

    /// The file at `path`, written from this process's memo and never read: the daemon's
    /// ([`Kept::save`] after each full scan), so that a one-shot run on its node starts warm.
    /// The first save writes whatever the memo holds. `None` as for [`Kept::load`].
    pub fn written_only(host: &HostRoot, path: &Path) -> Option<Self> {
        Self::at(host, path)
    }

    /// The file at `path` for this boot, nothing loaded, counted as never saved.
    fn at(host: &HostRoot, path: &Path) -> Option<Self> {
        let boot = if !host.is_live() {
            Err(CacheFileError::NotLive)
        } else {
            crate::host::clock::boot_id(host)
                .as_deref()
                .and_then(parse_boot_id)
                .ok_or(CacheFileError::NoBootId)
        };
        match boot {
            Ok(boot) => Some(Self { path: path.to_owned(), boot, changes: u64::MAX }),
            Err(e) => {
                tracing::debug!(path = %path.display(), reason = %e, "statmount memo not used");
                None
            }
        }
    }

    /// Whether the memo learned or dropped something since it was loaded or last saved.
    pub fn unsaved(&self) -> bool {
        statmount_cache::changes() != self.changes
    }

    /// Writes the memo when it learned or dropped something since it was loaded or last saved
    /// (never an error: a file that cannot be written is one debug line, and the next run asks
    /// the kernel again).
    pub fn save(&mut self) {
        let (listed, asked) = statmount_cache::lookups();
        let changes = statmount_cache::changes();
        if changes == self.changes {
            tracing::debug!(path = %self.path.display(), listed, asked, "statmount memo unchanged: not written");
            return;
        }
        self.changes = changes;
        let namespaces = statmount_cache::export();
        let mounts: usize = namespaces.iter().map(|(_, m)| m.len()).sum();
        match write(&self.path, &self.boot, &namespaces) {
            Ok(()) => tracing::debug!(
                path = %self.path.display(),
                listed,
                asked,
                namespaces = namespaces.len(),
                mounts,
                "statmount memo saved"
            ),
            Err(e) => tracing::debug!(path = %self.path.display(), reason = %e, "statmount memo not saved"),
        }
    }
}

#[cfg(test)]
#[path = "statmount_cache_file_tests.rs"]
mod tests;
