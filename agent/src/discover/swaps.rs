//! Parser for `/proc/swaps`.
//!
//! ```text
//! Filename                                Type            Size            Used            Priority
//! /dev/loop3                              partition       65532           0               -2
//! /swap\040file                           file            1048572         0               -3
//! ```
//! Filenames are escaped like mountinfo paths (`\040` for space); any other byte, UTF-8 or not,
//! is printed as it is, so the text is parsed as bytes.

use super::mountinfo::unescape;
use crate::model::{escape_bytes, KernelText};

/// Whether swap sits on a whole block device or on a file of a filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SwapType {
    Partition,
    File,
}

/// One active swap area.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SwapArea {
    pub filename: KernelText,
    pub swap_type: SwapType,
    pub size_kib: u64,
    pub used_kib: u64,
}

/// Parses `/proc/swaps`; `Err((line, reason))` for a line that is not a swap area.
pub fn parse(text: &[u8]) -> Result<Vec<SwapArea>, (usize, String)> {
    let mut out = Vec::new();
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        if i == 0 && line.starts_with(b"Filename") || line.trim_ascii().is_empty() {
            continue;
        }
        let f: Vec<&[u8]> = line.split(u8::is_ascii_whitespace).filter(|w| !w.is_empty()).collect();
        if f.len() < 4 {
            return Err((i + 1, "expected filename, type, size and used".into()));
        }
        let swap_type = match f[1] {
            b"partition" => SwapType::Partition,
            b"file" => SwapType::File,
            other => return Err((i + 1, format!("unknown swap type '{}'", escape_bytes(other)))),
        };
        let num = |s: &[u8]| {
            std::str::from_utf8(s)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| (i + 1, format!("'{}' is not a number", escape_bytes(s))))
        };
        out.push(SwapArea {
            filename: unescape(f[0]),
            swap_type,
            size_kib: num(f[2])?,
            used_kib: num(f[3])?,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_text() {
        let t = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/loop3                              partition\t65532\t\t0\t\t-2\n/swap\\040file                           file\t\t1048572\t\t0\t\t-3\n";
        let s = parse(t.as_bytes()).expect("parses");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].filename, "/dev/loop3");
        assert_eq!(s[0].swap_type, SwapType::Partition);
        assert_eq!(s[1].filename, "/swap file");
        assert_eq!(s[1].size_kib, 1048572);
        assert!(parse(b"Filename Type Size Used Priority\n").expect("empty").is_empty());
        assert_eq!(parse(b"Filename\n/x zram 1 2 3\n").expect_err("bad type").0, 2);
    }

    #[test]
    fn non_utf8_swap_file() {
        let t = b"Filename\tType\tSize\tUsed\tPriority\n/var/tmp/s\xff\\134x                 file\t\t1020\t\t0\t\t-2\n";
        let s = parse(t).expect("parses");
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].filename.as_bytes(), b"/var/tmp/s\xff\\x");
        assert_eq!(s[0].filename.escaped(), r"/var/tmp/s\xff\\x");
        assert_eq!(s[0].swap_type, SwapType::File);
    }
}
