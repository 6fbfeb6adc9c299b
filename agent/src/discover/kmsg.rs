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
//!
//! A facility-0 record is not all the kernel's own words: some begin with a name a user chose. A
//! segfault line is `COMM[PID]: segfault at ... in EXE[...]`, where `COMM` is any task name (up
//! to 15 bytes, set with `prctl(PR_SET_NAME)`: `rbd: rbd0: x`) and `EXE` any file name
//! (`blocklisted`). So a record counts only where its subsystem's prefix starts the message
//! ([`KernelRecord::after`]: `rbd: `, `sd `), and the rest must be one of the exact forms the
//! subsystem prints (the device name in its kernel form, the event in its whole wording): a
//! task name cannot hold a whole such line, and the kernel's words that follow it never are one.

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

    /// The message after `prefix`, only when `prefix` starts it (no white space skipped): where a
    /// subsystem's own records begin.
    pub fn after(&self, prefix: &str) -> Option<&'a str> {
        self.message.strip_prefix(prefix)
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
            match rbd_event(&k) {
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

/// What krbd prints (`rbd_warn`: `rbd: rbdN: ...`) when its client was blocklisted: the watch
/// cannot be registered again, or the header lock taken, with `-EBLOCKLISTED` (`-108`). The
/// whole remainder of the message, word for word.
const FENCED: [&str; 3] =
    ["failed to reregister watch: -108", "encountered watch error: -108", "failed to lock header: -108"];

/// `(device, event)` of a krbd record: `rbd: ` starts its message, the device is a kernel rbd
/// name (`rbd` and digits), and the rest is exactly one of the forms krbd prints.
fn rbd_event<'a>(k: &KernelRecord<'a>) -> Option<(&'a str, RbdEvent)> {
    let (dev, what) = k.after("rbd: ")?.split_once(": ")?;
    if !dev.strip_prefix("rbd").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    if is_attach(what) {
        return Some((dev, RbdEvent::Attached));
    }
    FENCED.contains(&what).then_some((dev, RbdEvent::Fenced))
}

/// `capacity <bytes> features 0x<hex>`, whole: what krbd logs when it adds a mapping's disk.
fn is_attach(what: &str) -> bool {
    let Some((bytes, features)) = what.strip_prefix("capacity ").and_then(|r| r.split_once(" features 0x"))
    else {
        return false;
    };
    let digits = |s: &str, f: fn(&u8) -> bool| !s.is_empty() && s.as_bytes().iter().all(f);
    digits(bytes, u8::is_ascii_digit) && digits(features, u8::is_ascii_hexdigit)
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
            // rbd3: announced and fenced by the kernel (the header lock refused, -EBLOCKLISTED).
            "6,40,9700,-;rbd: rbd3: capacity 1073741824 features 0x1",
            "4,41,9800,-;rbd: rbd3: failed to lock header: -108",
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
            Some("kernel record #41 at 0.009800 s, facility kern: rbd: rbd3: failed to lock header: -108")
        );
        // Without the reuse, the first mapping's fence stands.
        let l = RbdLog::from_records(log[..3].iter().copied());
        assert!(l.fenced.get("rbd0").is_some_and(|e| e.contains("#12") && e.contains("-108")));
        let empty = read_rbd(&HostRoot::new("/nonexistent"));
        assert!(empty.fenced.is_empty());
    }

    /// Facility-0 records that begin with a name a user chose: a segfault line is
    /// `COMM[PID]: segfault at ... in EXE[...]`, with COMM any task name (15 bytes) and EXE any
    /// file name; a kernel message quoting such text after its own prefix. None is krbd's word.
    #[test]
    fn records_a_user_can_shape_are_not_rbd_evidence() {
        let attach = "6,10,1000,-;rbd: rbd0: capacity 1073741824 features 0x3d";
        let hostile = [
            // comm "rbd: rbd0: x", executable "blocklisted" (a real kernel line of this shape
            // is made by tests/tests/hidden_openers.rs).
            "6,11,2000,-;rbd: rbd0: x[4242]: segfault at 0 ip 000055d5c7a0d139 sp 00007ffd8f0bf2a0 error 6 in blocklisted[55d5c7a0d000+1000] likely on CPU 1 (core 1, socket 0)",
            "6,12,2001,-;rbd: rbd0: failed to reregister watch: -108[4243]: segfault at 0 ip 0 sp 0 error 6",
            "6,13,2002,-;rbd: rbd0: failed to reregister watch: -1080",
            "6,14,2003,-;rbd: rbd0: capacity 1073741824 features 0x3d in x[1+1]",
            " rbd: rbd0: failed to reregister watch: -108",
            "6,15,2004,-; rbd: rbd0: failed to reregister watch: -108",
            "6,16,2005,-;rbd: rbd0 : failed to reregister watch: -108",
            "6,17,2006,-;rbd: rbdx: failed to reregister watch: -108",
            "6,18,2007,-;audit: rbd: rbd0: failed to reregister watch: -108",
        ];
        let l = RbdLog::from_records(std::iter::once(attach).chain(hostile));
        assert_eq!(l.attached.get("rbd0"), Some(&10), "no hostile line is an announcement: {l:?}");
        assert!(l.fenced.is_empty(), "no hostile line is a fence: {l:?}");
        // The kernel's own line, after the same announcement, is.
        let l = RbdLog::from_records([attach, "4,19,3000,-;rbd: rbd0: failed to reregister watch: -108"]);
        assert!(l.fenced.get("rbd0").is_some_and(|e| e.contains("#19")), "{l:?}");
        let k = KernelRecord::parse("6,1,2,-;rbd: rbd0: x").expect("parse");
        assert_eq!(k.after("rbd: "), Some("rbd0: x"));
        assert_eq!(k.after("bd: "), None, "a prefix starts the message or it is not there");
    }
}
