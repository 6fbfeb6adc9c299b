//! Parser for `/proc/swaps`.
//!
//! ```text
//! Filename                                Type            Size            Used            Priority
//! /dev/loop3                              partition       65532           0               -2
//! /swap\040file                           file            1048572         0               -3
//! ```
//! Filenames are escaped like mountinfo paths (`\040` for space).

use super::mountinfo::unescape;

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
    pub filename: String,
    pub swap_type: SwapType,
    pub size_kib: u64,
    pub used_kib: u64,
}

/// Parses `/proc/swaps`; `Err((line, reason))` for a line that is not a swap area.
pub fn parse(text: &str) -> Result<Vec<SwapArea>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if i == 0 && line.starts_with("Filename") || line.trim().is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            return Err((i + 1, "expected filename, type, size and used".into()));
        }
        let swap_type = match f[1] {
            "partition" => SwapType::Partition,
            "file" => SwapType::File,
            other => return Err((i + 1, format!("unknown swap type '{other}'"))),
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| (i + 1, format!("'{s}' is not a number")));
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
        let s = parse(t).expect("parses");
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].filename, "/dev/loop3");
        assert_eq!(s[0].swap_type, SwapType::Partition);
        assert_eq!(s[1].filename, "/swap file");
        assert_eq!(s[1].size_kib, 1048572);
        assert!(parse("Filename Type Size Used Priority\n").expect("empty").is_empty());
        assert_eq!(parse("Filename\n/x zram 1 2 3\n").expect_err("bad type").0, 2);
    }
}
