//! Parser for `/proc/PID/mountinfo` (proc(5), Documentation/filesystems/proc.rst §3.5).
//!
//! ```text
//! 36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//! (1)(2)(3)   (4)   (5)         (6)      (7)      (8) (9)   (10)      (11)
//! ```
//! Fields are separated by single spaces; the kernel escapes space, tab, newline and backslash in
//! paths as `\040`, `\011`, `\012`, `\134`. Optional fields (7) run up to the `-` separator. A
//! source can be empty, so fields are split on every space, not on runs of white space.
//!
//! The parser never opens files: callers hand it text and get back entries or an error that names
//! the line. [`scan`] is the hot path: it parses field 3 of every line and fully parses only the
//! lines whose device the caller wants, but still rejects lines that are not mountinfo.

use crate::model::DevNum;
use serde::Serialize;

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountEntry {
    pub mount_id: u32,
    pub parent_id: u32,
    pub devnum: DevNum,
    /// Root of the mount within its filesystem (for nsfs: `mnt:[INODE]`).
    pub root: String,
    /// Mount point relative to the reading process's root.
    pub mount_point: String,
    pub mount_options: String,
    /// Optional fields: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional: Vec<String>,
    pub fstype: String,
    pub source: String,
    pub super_options: String,
}

impl MountEntry {
    /// Peer group when the mount is `shared:N`.
    pub fn shared_group(&self) -> Option<u32> {
        self.optional.iter().find_map(|f| f.strip_prefix("shared:")?.parse().ok())
    }
}

/// What was wrong with a mountinfo text, and on which line (1-based).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

fn err(line: usize, reason: impl Into<String>) -> ParseError {
    ParseError { line, reason: reason.into() }
}

/// Undoes the kernel's octal escaping (`\040` -> space). A backslash not followed by three octal
/// digits is kept as it is.
pub fn unescape(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_owned();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn number(field: Option<&str>, line: usize, what: &str) -> Result<u32, ParseError> {
    let f = field.ok_or_else(|| err(line, format!("truncated: no {what}")))?;
    f.parse().map_err(|_| err(line, format!("{what} '{}' is not a number", clip(f))))
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// Parses one line (without its newline). `line` is its 1-based number, for errors.
pub fn parse_line(text: &str, line: usize) -> Result<MountEntry, ParseError> {
    let mut f = text.split(' ');
    let mount_id = number(f.next(), line, "mount ID")?;
    let parent_id = number(f.next(), line, "parent ID")?;
    let devtext = f.next().ok_or_else(|| err(line, "truncated: no major:minor"))?;
    let devnum = devtext
        .parse::<DevNum>()
        .map_err(|_| err(line, format!("field 3 '{}' is not major:minor", clip(devtext))))?;
    let root = f.next().ok_or_else(|| err(line, "truncated: no root"))?;
    let mount_point = f.next().ok_or_else(|| err(line, "truncated: no mount point"))?;
    let mount_options = f.next().ok_or_else(|| err(line, "truncated: no mount options"))?;
    if !root.starts_with('/') && !root.contains(":[") {
        return Err(err(line, format!("root '{}' is not a path", clip(root))));
    }
    if !mount_point.starts_with('/') {
        return Err(err(line, format!("mount point '{}' is not a path", clip(mount_point))));
    }
    let mut optional = Vec::new();
    loop {
        match f.next() {
            Some("-") => break,
            Some(o) => optional.push(o.to_owned()),
            None => return Err(err(line, "truncated: no '-' separator before the filesystem type")),
        }
    }
    let fstype = f.next().ok_or_else(|| err(line, "truncated: no filesystem type"))?;
    let source = f.next().ok_or_else(|| err(line, "truncated: no mount source"))?;
    let super_options = f.next().ok_or_else(|| err(line, "truncated: no super options"))?;
    if fstype.is_empty() {
        return Err(err(line, "empty filesystem type"));
    }
    if let Some(extra) = f.next() {
        return Err(err(line, format!("unexpected field '{}' after super options", clip(extra))));
    }
    Ok(MountEntry {
        mount_id,
        parent_id,
        devnum,
        root: unescape(root),
        mount_point: unescape(mount_point),
        mount_options: mount_options.to_owned(),
        optional,
        fstype: unescape(fstype),
        source: unescape(source),
        super_options: super_options.to_owned(),
    })
}

/// Parses a whole mountinfo text.
pub fn parse(text: &str) -> Result<Vec<MountEntry>, ParseError> {
    let mut out = Vec::new();
    scan(text, |_| true, |e| out.push(e))?;
    Ok(out)
}

/// Walks a mountinfo text, fully parsing only lines whose device `want` accepts and handing them
/// to `found`. Returns the number of lines. Every line is still checked for the shape of
/// mountinfo (IDs, `MAJ:MIN`, the `-` separator and the fields after it), and a text that does not
/// end in a newline is truncated: both are errors.
pub fn scan(
    text: &str,
    mut want: impl FnMut(DevNum) -> bool,
    mut found: impl FnMut(MountEntry),
) -> Result<usize, ParseError> {
    let sep = memchr::memmem::Finder::new(" - ");
    let mut count = 0;
    let mut rest = text;
    while !rest.is_empty() {
        count += 1;
        let Some(nl) = memchr::memchr(b'\n', rest.as_bytes()) else {
            return Err(err(count, "truncated: the last line has no newline"));
        };
        let line = &rest[..nl];
        rest = &rest[nl + 1..];
        let devnum = quick_devnum(line).ok_or_else(|| {
            // Re-parse fully for a precise message.
            parse_line(line, count).err().unwrap_or_else(|| err(count, "not a mountinfo line"))
        })?;
        if want(devnum) {
            found(parse_line(line, count)?);
        } else {
            let tail = sep
                .find(line.as_bytes())
                .map(|p| &line[p + 3..])
                .ok_or_else(|| err(count, "truncated: no '-' separator before the filesystem type"))?;
            if tail.split(' ').count() != 3 {
                return Err(parse_line(line, count).err().unwrap_or_else(|| {
                    err(count, "expected filesystem type, source and super options after '-'")
                }));
            }
        }
    }
    Ok(count)
}

/// Field 3 of a line, parsed without allocating; `None` when the first three fields are not two
/// numbers and a `MAJ:MIN`.
fn quick_devnum(line: &str) -> Option<DevNum> {
    let mut f = line.splitn(4, ' ');
    let id = f.next()?;
    let parent = f.next()?;
    if id.is_empty() || parent.is_empty() || !id.bytes().chain(parent.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    let dev = f.next()?;
    f.next()?;
    dev.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Incident 5, as `grep rbd3 /proc/*/task/*/mountinfo` showed it (the super options were cut
    /// in the field notes; `rw,stripe=1024,data=ordered` is what ext4 prints there).
    const INCIDENT5: &str = "2892 2729 250:0 / /host/data/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838 rw,relatime - ext4 /dev/rbd3 rw,stripe=1024,data=ordered";

    #[test]
    fn incident5_line() {
        let e = parse_line(INCIDENT5, 1).expect("parses");
        assert_eq!(e.mount_id, 2892);
        assert_eq!(e.parent_id, 2729);
        assert_eq!(e.devnum, DevNum::new(250, 0));
        assert_eq!(
            e.mount_point,
            "/host/data/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838"
        );
        assert_eq!(e.fstype, "ext4");
        assert_eq!(e.source, "/dev/rbd3");
        assert!(e.optional.is_empty());
    }

    #[test]
    fn proc_rst_example_with_optional_field() {
        let e = parse_line(
            "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw,errors=continue",
            1,
        )
        .expect("parses");
        assert_eq!(e.root, "/mnt1");
        assert_eq!(e.optional, vec!["master:1"]);
        assert_eq!(e.super_options, "rw,errors=continue");
    }

    #[test]
    fn several_optional_fields_and_escapes() {
        // Real lines from a 6.x host: a shared+master mount and a path with spaces and a tab.
        let e = parse_line(r"612 29 7:3 /dir\040with\040space /mnt/a\011b rw,relatime shared:310 master:12 - ext4 /dev/loop3 rw", 4).expect("parses");
        assert_eq!(e.root, "/dir with space");
        assert_eq!(e.mount_point, "/mnt/a\tb");
        assert_eq!(e.shared_group(), Some(310));
        assert_eq!(e.optional.len(), 2);
        assert_eq!(unescape(r"back\134slash\012nl"), "back\\slash\nnl");
        assert_eq!(unescape(r"not\09escape\"), "not\\09escape\\");
    }

    #[test]
    fn nsfs_and_odd_sources() {
        let e =
            parse_line("740 29 0:4 mnt:[4026532481] /run/mntns/pinned rw - nsfs nsfs rw", 1).expect("parses");
        assert_eq!(e.fstype, "nsfs");
        assert_eq!(e.root, "mnt:[4026532481]");
        // An empty source (mount -t tmpfs "" /x) prints as two spaces.
        let e = parse_line("41 29 0:45 / /x rw,relatime -  tmpfs  rw", 1);
        assert!(e.is_err(), "extra empty fields are rejected");
        let e =
            parse_line("41 29 0:45 / /x rw,relatime - tmpfs  rw,size=1k", 1).expect("empty source parses");
        assert_eq!(e.source, "");
        let e = parse_line("98 29 0:52 / /run/user/1000/doc rw,nosuid,nodev,relatime - fuse.portal portal rw,user_id=1000,group_id=1000", 1).expect("fuse subtype parses");
        assert_eq!(e.fstype, "fuse.portal");
    }

    #[test]
    fn malformed_lines_name_the_line() {
        let text = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:1 / /x rw ext4 /dev/sda1 rw\n";
        let e = parse(text).expect_err("no separator");
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("separator"), "{e}");
        let e = parse("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n2 1 8:1 / /x r").expect_err("truncated");
        assert_eq!(e.line, 2);
        assert!(e.to_string().contains("truncated"), "{e}");
        let e = parse("x 0 8:1 / / rw - ext4 /dev/sda1 rw\n").expect_err("bad id");
        assert!(e.reason.contains("mount ID"), "{e}");
        let e = parse("1 0 8-1 / / rw - ext4 /dev/sda1 rw\n").expect_err("bad dev");
        assert!(e.reason.contains("major:minor"), "{e}");
        let e = parse("1 0 8:1 / relative rw - ext4 /dev/sda1 rw\n").expect_err("relative mount point");
        assert!(e.reason.contains("mount point"), "{e}");
    }

    #[test]
    fn scan_filters_but_still_validates() {
        let text =
            format!("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n{INCIDENT5}\n3 1 0:22 / /proc rw - proc proc rw\n");
        let mut got = Vec::new();
        let n = scan(&text, |d| d == DevNum::new(250, 0), |e| got.push(e.mount_id)).expect("scans");
        assert_eq!(n, 3);
        assert_eq!(got, vec![2892]);
        let broken = "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n3 1 0:22 / /proc rw - proc\n";
        let e = scan(broken, |_| false, |_| {}).expect_err("unwanted line is still checked");
        assert_eq!(e.line, 2);
        assert!(parse("").expect("empty").is_empty());
    }

    #[test]
    fn never_panics_on_garbage() {
        let samples = [
            "\n",
            " \n",
            "- - -\n",
            "1 2 3:4\n",
            "1 2 3:4 / / rw -\n",
            "\\\\\\\n",
            "1 2 3:4 \\0 / rw - a b c\n",
            "\u{feff}1 0 8:1 / / rw - ext4 /dev/sda1 rw\n",
        ];
        for s in samples {
            let _ = parse(s);
        }
        // Every prefix of a valid text either parses or errors, never panics.
        let text = format!("{INCIDENT5}\n");
        for i in 0..text.len() {
            if text.is_char_boundary(i) {
                let _ = parse(&text[..i]);
            }
        }
    }
}
