//! A block device's I/O counters, from `/sys/class/block/<name>/stat`
//! (Documentation/block/stat.rst): whether I/O is in flight, and how many I/Os ever completed.
//!
//! ```text
//!     9772       21  4068148      986     1094      242    21616      665        1     3324     2272        2        0   131074        0      873      620
//! ```
//! Fields, in order: reads completed, merged, sectors, ms; writes completed, merged, sectors, ms;
//! I/Os in flight; ms doing I/O; weighted ms; discards completed, merged, sectors, ms (since 4.18);
//! flushes completed, ms (since 5.5). Older kernels print 11 or 15 fields.
//!
//! The counters are the kernel's own accounting, kept in memory: reading them never touches the
//! device, so they can be read on a device whose I/O hangs. An I/O is counted as completed when
//! it ends, failed or not; so I/O in flight while the completed count stands still means the
//! device (or whatever serves it: a loop device's backing file, a dead multipath map's queue)
//! does not answer. The judging of that over time is [`crate::judge::stall`]'s.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex, MutexGuard};

use serde::Serialize;

use super::DiscoverError;

/// What one read of `stat` says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct IoStat {
    /// I/Os completed so far: reads, writes, discards and flushes.
    pub completed: u64,
    /// I/Os issued to the driver and not yet completed.
    pub in_flight: u64,
}

/// Why a `stat` text makes no sense.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("{0} fields, expected 11, 15 or 17")]
    FieldCount(usize),
    #[error("field {field} is {value:?}, not a decimal number")]
    NotANumber { field: usize, value: String },
}

/// Parses the text of a `stat` file.
pub fn parse(text: &str) -> Result<IoStat, ParseError> {
    let fields: Vec<&str> = text.split_ascii_whitespace().collect();
    if !matches!(fields.len(), 11 | 15 | 17) {
        return Err(ParseError::FieldCount(fields.len()));
    }
    let mut n = [0u64; 17];
    for (i, f) in fields.iter().enumerate() {
        n[i] = f
            .parse()
            .map_err(|_| ParseError::NotANumber { field: i + 1, value: f.chars().take(32).collect() })?;
    }
    // Fields 1, 5, 12 and 16 (1-based); absent ones are zero on older kernels.
    let completed = n[0].wrapping_add(n[4]).wrapping_add(n[11]).wrapping_add(n[15]);
    Ok(IoStat { completed, in_flight: n[8] })
}

/// Reads `stat` in a device's sysfs directory: `None` when the device has none (a fixture tree,
/// a device removed while we looked).
pub fn read(dir: &Path) -> Result<Option<IoStat>, DiscoverError> {
    let path = dir.join("stat");
    let Some(text) = super::read_attr_opt(&path)? else {
        return Ok(None);
    };
    parse(&text).map(Some).map_err(|e| DiscoverError::Line { path, line: 1, reason: e.to_string() })
}

/// The `stat` files of the live host's block devices, kept open between reads: a read is then
/// one `pread` at offset 0 (sysfs makes the text afresh there), not an open, a read and a close,
/// which were about a tenth of a mount event's re-read on a node of ten devices. A kept file
/// that fails or says nonsense (its device removed, the name reused) is dropped and the device
/// read by its path, as [`read`] does; files of devices the latest pass did not read are closed.
/// An open sysfs attribute pins no mount and no device.
#[derive(Debug, Default)]
pub struct StatFiles(HashMap<PathBuf, File>);

impl StatFiles {
    /// The one set of kept files of this process (its scans take turns).
    pub fn shared() -> MutexGuard<'static, StatFiles> {
        static FILES: LazyLock<Mutex<StatFiles>> = LazyLock::new(Mutex::default);
        FILES.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads `stat` in a device's sysfs directory, as [`read`] does, through the kept file.
    pub fn read(&mut self, dir: &Path) -> Result<Option<IoStat>, DiscoverError> {
        let path = dir.join("stat");
        if let Some(stat) = self.0.get(&path).and_then(read_at_start) {
            return Ok(Some(stat));
        }
        self.0.remove(&path);
        let stat = read(dir)?;
        if stat.is_some() {
            if let Ok(f) = File::open(&path) {
                self.0.insert(path, f);
            }
        }
        Ok(stat)
    }

    /// Closes the files of devices not in `dirs` (each a device's sysfs directory).
    pub fn keep_only(&mut self, dirs: &HashSet<PathBuf>) {
        self.0.retain(|path, _| path.parent().is_some_and(|d| dirs.contains(d)));
    }
}

/// The counters in an open `stat` file, read from its start; `None` for any failure.
fn read_at_start(f: &File) -> Option<IoStat> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 512];
    let n = f.read_at(&mut buf, 0).ok().filter(|n| (1..buf.len()).contains(n))?;
    parse(std::str::from_utf8(&buf[..n]).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A loop device on this kernel (6.18) while a reader's I/O hangs on its backing file.
    const LOOP_HUNG: &str = "    9772       21  4068148      986     1094      242    21616      665        1     3324     2272        2        0   131074        0      873      620\n";

    #[test]
    fn real_kernel_lines() {
        assert_eq!(parse(LOOP_HUNG), Ok(IoStat { completed: 9772 + 1094 + 2 + 873, in_flight: 1 }));
        // An idle loop device on the same kernel (17 fields).
        let idle = "     207        5     3444       36       30        0       20       50        0       64      132        0        0        0        0       30       45\n";
        assert_eq!(parse(idle), Ok(IoStat { completed: 207 + 30 + 30, in_flight: 0 }));
        // The shapes of older kernels: 11 fields (before 4.18), 15 (before 5.5).
        let v11 = "     129        0     5258       67        0        0        0        0        3       80       67\n";
        assert_eq!(parse(v11), Ok(IoStat { completed: 129, in_flight: 3 }));
        let v15 = "1 0 8 0 2 0 16 0 0 4 4 5 0 40 1\n";
        assert_eq!(parse(v15), Ok(IoStat { completed: 8, in_flight: 0 }));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert_eq!(parse(""), Err(ParseError::FieldCount(0)));
        assert_eq!(parse("1 2 3"), Err(ParseError::FieldCount(3)));
        assert!(matches!(parse("1 2 3 4 5 6 7 8 x 10 11"), Err(ParseError::NotANumber { field: 9, .. })));
        assert!(parse("1 2 3 4 5 6 7 8 -1 10 11").is_err());
        let max = "18446744073709551615 0 0 0 18446744073709551615 0 0 0 0 0 0";
        assert_eq!(parse(max).map(|s| s.completed), Ok(u64::MAX.wrapping_add(u64::MAX)));
    }

    #[test]
    fn reads_this_hosts_devices() {
        let host = crate::host::HostRoot::default();
        let class = host.sys_class_block();
        let mut read_one = false;
        for name in super::super::list_dir(&class).expect("sysfs") {
            if let Some(s) = read(&class.join(&name)).expect("every stat parses") {
                read_one = true;
                assert!(s.in_flight < 1 << 32, "{name}: {s:?}");
            }
        }
        assert!(read_one || class.read_dir().map(|mut d| d.next().is_none()).unwrap_or(true));
        assert_eq!(read(Path::new("/nonexistent")).expect("absent"), None);
    }

    /// A kept `stat` file is read again from its start and shows the counters as they are now:
    /// an I/O completed on the device between two reads is counted by the second, through the
    /// same descriptor; a directory with no `stat` keeps nothing; `keep_only` closes the rest.
    /// On a loop device of its own (the machine's disks may not be open to reads).
    #[test]
    fn a_kept_stat_file_shows_the_counters_as_they_are_now() {
        use std::os::unix::fs::OpenOptionsExt;
        use std::process::Command;
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: needs root (binds a loop device)");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("disk.img");
        std::fs::write(&image, vec![0u8; 1 << 20]).expect("image file");
        let out = Command::new("losetup").arg("-f").arg("--show").arg(&image).output().expect("run losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        let node = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        struct Detach(String);
        impl Drop for Detach {
            fn drop(&mut self) {
                let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
            }
        }
        let _detach = Detach(node.clone());
        let name = node.trim_start_matches("/dev/");
        let sysfs = crate::host::HostRoot::default().sys_class_block().join(name);
        let mut files = StatFiles::default();
        let first = files.read(&sysfs).expect("read").expect("counters");
        assert_eq!(files.0.len(), 1, "the file is kept");
        let mut dev = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&node)
            .expect("open the device");
        let mut buf = vec![0u8; 2 * 4096];
        let at = buf.as_ptr().align_offset(4096);
        std::io::Read::read_exact(&mut dev, &mut buf[at..at + 4096]).expect("direct read");
        let kept = files.0.get(&sysfs.join("stat")).expect("kept");
        let again = read_at_start(kept).expect("read through the kept file");
        assert!(again.completed > first.completed, "{name}: {first:?} then {again:?}");
        assert_eq!(files.read(&sysfs).expect("read").map(|s| s.completed >= again.completed), Some(true));
        assert_eq!(StatFiles::default().read(Path::new("/nonexistent")).expect("absent"), None);
        files.keep_only(&HashSet::new());
        assert!(files.0.is_empty(), "closed");
    }
}
