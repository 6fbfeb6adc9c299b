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

use std::path::Path;

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
}
