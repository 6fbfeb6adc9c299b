//! The kernel log (`/dev/kmsg`), read without blocking, for what no sysfs attribute shows:
//! that a krbd client has been fenced. After `ceph osd blocklist add`, krbd logs
//! `rbd: rbd0: encountered watch error: -107` and then
//! `rbd: rbd0: failed to reregister watch: -108` (-108 = EBLOCKLISTED), and keeps the mapping.
//!
//! Records are `PRIORITY,SEQ,TIMESTAMP,FLAGS;MESSAGE` (Documentation/ABI/testing/dev-kmsg);
//! continuation lines (starting with a space) are skipped.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use crate::host::HostRoot;

/// What the kernel log says about each rbd device (by kernel name).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RbdLog {
    /// Devices whose client was blocklisted (fenced), with the log line that says so.
    pub fenced: HashMap<String, String>,
}

/// Reads the whole ring buffer once, without blocking. Absent or unreadable: empty.
pub fn read_rbd(host: &HostRoot) -> RbdLog {
    let mut out = RbdLog::default();
    for_each_record(host, |record| {
        if let Some((dev, line)) = fenced_record(record) {
            out.fenced.insert(dev, line);
        }
    });
    out
}

/// Hands each record of the ring buffer to `f`, oldest first, read once without blocking.
/// Absent or unreadable: none. (A regular file, as in a fixture tree, is split into lines.)
pub fn for_each_record(host: &HostRoot, mut f: impl FnMut(&str)) {
    let path = host.dev_node("kmsg");
    let Ok(mut file) = std::fs::File::options().read(true).custom_flags(libc::O_NONBLOCK).open(&path) else {
        return;
    };
    // One record per read(2); EAGAIN at the end of the buffer, EPIPE when a record was
    // overwritten while we read (skip it and go on).
    let mut buf = vec![0u8; 8192];
    for _ in 0..100_000 {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                for record in String::from_utf8_lossy(&buf[..n]).lines().filter(|l| !l.starts_with(' ')) {
                    f(record);
                }
            }
            Err(e) if e.raw_os_error() == Some(libc::EPIPE) => continue,
            Err(_) => break,
        }
    }
}

/// `Some((device, message))` when a kmsg record says an rbd client was blocklisted.
pub fn fenced_record(record: &str) -> Option<(String, String)> {
    let msg = record.split_once(';')?.1.lines().next()?.trim();
    let rest = msg.strip_prefix("rbd: ")?;
    let (dev, what) = rest.split_once(": ")?;
    let fenced = what.contains("failed to reregister watch: -108")
        || what.contains("blocklisted")
        || what.contains("blacklisted");
    fenced.then(|| (dev.to_owned(), msg.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmsg_records() {
        let r = "4,1234,98765432,-;rbd: rbd0: failed to reregister watch: -108\n";
        assert_eq!(
            fenced_record(r),
            Some(("rbd0".into(), "rbd: rbd0: failed to reregister watch: -108".into()))
        );
        assert_eq!(fenced_record("4,1,2,-;rbd: rbd0: encountered watch error: -107\n"), None);
        assert_eq!(fenced_record("6,1,2,-;libceph: mon0 (1)10.0.0.1:6789 session established\n"), None);
        assert_eq!(fenced_record("garbage"), None);
        let empty = read_rbd(&HostRoot::new("/nonexistent"));
        assert!(empty.fenced.is_empty());
    }
}
