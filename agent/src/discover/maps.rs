//! Parser for `/proc/PID/maps`: which files a process has mapped, by device and inode.
//!
//! ```text
//! 7f3a2c000000-7f3a2c021000 rw-p 00000000 07:03 12          /mnt/data/lib.so
//! ```
//! The device field is `MAJOR:MINOR` in hexadecimal; inode 0 means an anonymous mapping. The text
//! is bytes: the kernel escapes only newlines in the path (as `\012`), so a file name can hold
//! any other byte, UTF-8 or not.

use crate::model::DevNum;

/// One file-backed mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping<'a> {
    pub devnum: DevNum,
    pub inode: u64,
    /// The path as printed (only a newline is escaped, and ` (deleted)` may be appended).
    pub path: &'a [u8],
}

/// File-backed mappings of a maps text; lines that do not parse are skipped (the text is a
/// label source, and a process can change its maps while we read).
pub fn file_mappings(text: &[u8]) -> impl Iterator<Item = Mapping<'_>> {
    text.split(|&b| b == b'\n').filter_map(|line| {
        let mut f = line.splitn(6, |&b| b == b' ');
        let _range = f.next()?;
        let _perms = f.next()?;
        let _offset = f.next()?;
        let dev = std::str::from_utf8(f.next()?).ok()?;
        let inode: u64 = std::str::from_utf8(f.next()?).ok()?.parse().ok()?;
        if inode == 0 {
            return None;
        }
        let (maj, min) = dev.split_once(':')?;
        let devnum = DevNum::new(u32::from_str_radix(maj, 16).ok()?, u32::from_str_radix(min, 16).ok()?);
        let path = f.next().map_or(&b""[..], |p| p.trim_ascii_start());
        Some(Mapping { devnum, inode, path })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_lines() {
        let text =
            "55d4c0a00000-55d4c0a02000 r--p 00000000 fd:01 1835033                    /usr/bin/sleep\n\
7f3a2c000000-7f3a2c021000 rw-p 00000000 00:00 0 \n\
7f3a2d000000-7f3a2d001000 r--s 00000000 07:03 12                         /mnt/data/file (deleted)\n\
7ffd5e9f0000-7ffd5ea11000 rw-p 00000000 00:00 0                          [stack]\n\
7f00-7f01 r--p 00000000 103:1a0 99 /nvme/lib\n";
        let m: Vec<_> = file_mappings(text.as_bytes()).collect();
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].devnum, DevNum::new(253, 1));
        assert_eq!(m[0].path, b"/usr/bin/sleep");
        assert_eq!(m[1].devnum, DevNum::new(7, 3));
        assert_eq!(m[1].path, b"/mnt/data/file (deleted)");
        assert_eq!(m[2].devnum, DevNum::new(259, 416));
        assert_eq!(file_mappings(b"garbage\n1 2 3 zz:1 5 x\n").count(), 0);
    }

    /// A mapped file whose name is not UTF-8 is still a mapping (reading maps as a string made
    /// the whole process's mappings disappear).
    #[test]
    fn non_utf8_file_name() {
        let text = b"7f3a2d000000-7f3a2d001000 r--s 00000000 07:05 13                         /var/tmp/d\xff/lib.so\n\
7f3a2d001000-7f3a2d002000 r--p 00000000 07:05 14 /x\n";
        let m: Vec<_> = file_mappings(text).collect();
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].devnum, DevNum::new(7, 5));
        assert_eq!(m[0].inode, 13);
        assert_eq!(m[0].path, b"/var/tmp/d\xff/lib.so");
        assert_eq!(m[1].path, b"/x");
    }
}
