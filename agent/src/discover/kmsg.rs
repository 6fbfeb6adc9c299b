//! The kernel log (`/dev/kmsg`), read without blocking, for what no sysfs attribute shows:
//! that a krbd client has been fenced. After `ceph osd blocklist add`, krbd logs
//! `rbd: rbd0: encountered watch error: -107` and then
//! `rbd: rbd0: failed to reregister watch: -108` (-108 = EBLOCKLISTED), and keeps the mapping.
//!
//! Records are `PRIORITY,SEQ,TIMESTAMP,FLAGS;MESSAGE` (Documentation/ABI/testing/dev-kmsg);
//! continuation lines (starting with a space) are skipped. `PRIORITY` is `facility * 8 + level`.
//! `/dev/kmsg` accepts writes from user space, and the kernel gives every such record a facility
//! of at least 1 (`user`; a `<N>` prefix cannot ask for 0): only facility 0 (`kern`) is the
//! kernel's word, and only those records count as evidence ([`KernelRecord::parse`]).
//!
//! Device names are reused (`rbd0` unmapped, the next map is `rbd0` again): a fenced line belongs
//! to the mapping the kernel announced last under that name (`rbd: rbd0: capacity N features
//! 0xF`, logged once per map when the disk is added) and only when it follows that announcement.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;

use crate::host::HostRoot;

/// One record of the kernel log that the kernel itself wrote (facility 0, `kern`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelRecord<'a> {
    /// The log level (0 emergency .. 7 debug).
    pub level: u8,
    /// The record's sequence number: strictly increasing over the boot, never reused.
    pub seq: u64,
    /// Microseconds since boot when the kernel logged it.
    pub usec: u64,
    /// The message (its first line, trailing white space removed).
    pub message: &'a str,
}

impl<'a> KernelRecord<'a> {
    /// The record when it is well formed and the kernel's own (facility 0). A record written from
    /// user space (facility >= 1), or one that does not parse, is `None`: it is no evidence.
    pub fn parse(record: &'a str) -> Option<Self> {
        let (prefix, message) = record.split_once(';')?;
        let mut fields = prefix.split(',');
        let priority: u32 = fields.next()?.trim().parse().ok()?;
        let seq: u64 = fields.next()?.parse().ok()?;
        let usec: u64 = fields.next()?.parse().ok()?;
        if priority >> 3 != 0 {
            return None;
        }
        let message = message.lines().next().unwrap_or("").trim_end();
        Some(Self { level: (priority & 7) as u8, seq, usec, message })
    }

    /// How a verdict names this record: the kernel wrote it, where it sits in the log, and what
    /// it says.
    pub fn evidence(&self) -> String {
        format!(
            "kernel record #{} at {}.{:06} s, facility kern: {}",
            self.seq,
            self.usec / 1_000_000,
            self.usec % 1_000_000,
            self.message
        )
    }
}

/// What the kernel log says about each rbd device (by kernel name, for the mapping the kernel
/// announced last under that name).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RbdLog {
    /// The announcement of each device's current mapping: the sequence number of the kernel's
    /// `rbd: rbdN: capacity ...` record (the mapping's attach, a token the kernel never reuses).
    pub attached: HashMap<String, u64>,
    /// Devices whose client was blocklisted (fenced) since that announcement, with the kernel
    /// record that says so ([`KernelRecord::evidence`]).
    pub fenced: HashMap<String, String>,
}

impl RbdLog {
    /// Builds the log from records, oldest first. Only the kernel's own records count; a fenced
    /// record counts only for the mapping announced last before it (a later announcement of the
    /// same name is another mapping, which inherits nothing), and a fenced record with no
    /// announcement before it in the buffer is tied to no mapping and ignored.
    pub fn from_records<'a>(records: impl IntoIterator<Item = &'a str>) -> Self {
        let mut out = Self::default();
        for r in records {
            let Some(k) = KernelRecord::parse(r) else { continue };
            match rbd_event(k.message) {
                Some((dev, RbdEvent::Attached)) => {
                    out.attached.insert(dev.to_owned(), k.seq);
                    out.fenced.remove(dev);
                }
                Some((dev, RbdEvent::Fenced)) if out.attached.contains_key(dev) => {
                    out.fenced.insert(dev.to_owned(), k.evidence());
                }
                _ => {}
            }
        }
        out
    }
}

/// Reads the whole ring buffer once, without blocking. Absent or unreadable: empty.
pub fn read_rbd(host: &HostRoot) -> RbdLog {
    let mut records = Vec::new();
    for_each_record(host, |record| {
        if record.contains(";rbd: ") {
            records.push(record.to_owned());
        }
    });
    RbdLog::from_records(records.iter().map(String::as_str))
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

/// What one krbd record says of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RbdEvent {
    /// `rbd: rbdN: capacity N features 0xF`: a new mapping got this name.
    Attached,
    /// The client was blocklisted (`failed to reregister watch: -108`, `blocklisted`).
    Fenced,
}

/// `(device, event)` of a krbd message (the text after the record's `;`).
fn rbd_event(message: &str) -> Option<(&str, RbdEvent)> {
    let rest = message.trim().strip_prefix("rbd: ")?;
    let (dev, what) = rest.split_once(": ")?;
    if what.starts_with("capacity ") && what.contains(" features ") {
        return Some((dev, RbdEvent::Attached));
    }
    let fenced = what.contains("failed to reregister watch: -108")
        || what.contains("blocklisted")
        || what.contains("blacklisted");
    fenced.then_some((dev, RbdEvent::Fenced))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_kernels_records_are_evidence() {
        let k = KernelRecord::parse("4,1234,98765432,-;rbd: rbd0: failed to reregister watch: -108\n")
            .expect("facility 0");
        assert_eq!((k.level, k.seq, k.usec), (4, 1234, 98_765_432));
        assert_eq!(k.message, "rbd: rbd0: failed to reregister watch: -108");
        assert_eq!(
            k.evidence(),
            "kernel record #1234 at 98.765432 s, facility kern: rbd: rbd0: failed to reregister watch: -108"
        );
        // Written from user space: facility 1 (user, PRIORITY 8..15) or any other.
        assert_eq!(
            KernelRecord::parse("12,1235,98765433,-;rbd: rbd0: failed to reregister watch: -108"),
            None
        );
        assert_eq!(KernelRecord::parse("8,1,2,-;x"), None);
        assert_eq!(KernelRecord::parse("30,1,2,-;x"), None);
        assert!(KernelRecord::parse("7,1,2,-;x").is_some(), "facility 0, level 7");
        for bad in ["garbage", "x,1,2,-;m", "4,x,2,-;m", "4,1;m", "4,1,2,-"] {
            assert_eq!(KernelRecord::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_fence_belongs_to_the_mapping_announced_before_it() {
        let log = [
            // rbd0, first mapping: announced, then fenced.
            "6,10,1000,-;rbd: rbd0: capacity 1073741824 features 0x3d",
            "4,11,2000,-;rbd: rbd0: encountered watch error: -107",
            "4,12,3000,-;rbd: rbd0: failed to reregister watch: -108",
            // rbd1: fenced with no announcement left in the buffer: tied to no mapping.
            "4,13,3500,-;rbd: rbd1: failed to reregister watch: -108",
            // rbd0 unmapped and mapped again: the new mapping inherits nothing.
            "6,20,9000,-;rbd: rbd0: capacity 2147483648 features 0x3d",
            // rbd2: announced; a forged fence from user space (facility 1) does not count.
            "6,30,9500,-;rbd: rbd2: capacity 1073741824 features 0x1",
            "12,31,9600,-;rbd: rbd2: failed to reregister watch: -108",
            // rbd3: announced and fenced by the kernel.
            "6,40,9700,-;rbd: rbd3: capacity 1073741824 features 0x1",
            "4,41,9800,-;rbd: rbd3: client is blocklisted",
            "6,42,9900,-;libceph: mon0 (1)10.0.0.1:6789 session established",
        ];
        let l = RbdLog::from_records(log);
        assert_eq!(l.attached.get("rbd0"), Some(&20), "the latest announcement");
        assert_eq!(l.attached.get("rbd2"), Some(&30));
        assert!(!l.fenced.contains_key("rbd0"), "a reused name inherits no fence: {l:?}");
        assert!(!l.fenced.contains_key("rbd1"), "no announcement: no mapping to tie it to");
        assert!(!l.fenced.contains_key("rbd2"), "a user-space record is not the kernel's word");
        assert_eq!(
            l.fenced.get("rbd3").map(String::as_str),
            Some("kernel record #41 at 0.009800 s, facility kern: rbd: rbd3: client is blocklisted")
        );
        // Without the reuse, the first mapping's fence stands.
        let l = RbdLog::from_records(log[..3].iter().copied());
        assert!(l.fenced.get("rbd0").is_some_and(|e| e.contains("#12") && e.contains("-108")));
        let empty = read_rbd(&HostRoot::new("/nonexistent"));
        assert!(empty.fenced.is_empty());
    }
}
