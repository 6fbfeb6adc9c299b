//! The memo file's format (round trip, each rejection) and its trust checks on real files.

use super::*;
use std::os::unix::fs::{symlink, PermissionsExt};

const BOOT: [u8; 16] = [0x11; 16];

fn sample() -> Vec<(u64, Arc<Vec<Entry>>)> {
    let image = DevNum::new(7, 0);
    let proc = DevNum::new(0, 22);
    vec![
        (3, Arc::new(vec![(10, image, 0xef53, 21), (11, proc, 0x9fa0, 22), (40, image, 0xef53, 99)])),
        (9, Arc::new(vec![])),
        (0x1_0000_0001, Arc::new(vec![(u64::MAX - 1, DevNum::new(259, 1 << 20), 0x9123_683e, u32::MAX)])),
    ]
}

fn bytes(namespaces: &[(u64, Arc<Vec<Entry>>)]) -> Vec<u8> {
    let mut out = Vec::new();
    encode(&mut out, &BOOT, namespaces).expect("encode");
    out
}

fn decoded(b: &[u8]) -> Result<Vec<(u64, Vec<Entry>)>, CacheFileError> {
    decode(&mut &b[..], b.len() as u64, &BOOT)
}

/// Recomputes the checksum of a changed payload, so that a test reaches the check after it.
fn resum(b: &mut [u8]) {
    let mut sum = Sum::new();
    for r in b[HEADER..].chunks_exact(RECORD) {
        sum.record(r.try_into().expect("record"));
    }
    b[56..64].copy_from_slice(&sum.0.to_le_bytes());
}

fn owned(n: &[(u64, Arc<Vec<Entry>>)]) -> Vec<(u64, Vec<Entry>)> {
    n.iter().map(|(id, m)| (*id, m.to_vec())).collect()
}

#[test]
fn round_trips_every_field() {
    let n = sample();
    let b = bytes(&n);
    // 3 distinct (device, magic) pairs, 3 namespace heads, 4 mounts.
    assert_eq!(b.len(), HEADER + RECORD * (3 + 3 + 4));
    assert_eq!(decoded(&b).expect("decode"), owned(&n));
    assert_eq!(decoded(&bytes(&[])).expect("empty"), vec![]);
}

#[test]
fn a_flipped_byte_anywhere_in_the_payload_fails_the_checksum_or_a_check() {
    let b = bytes(&sample());
    for i in HEADER..b.len() {
        let mut t = b.clone();
        t[i] ^= 0x40;
        assert!(decoded(&t).is_err(), "byte {i} flipped was accepted");
    }
    let mut t = b.clone();
    let old_id = t.len() - 8;
    t[old_id] ^= 1; // the last mount's old ID: still well-formed, caught by the checksum
    assert!(matches!(decoded(&t), Err(CacheFileError::Checksum { .. })), "{:?}", decoded(&t));
}

#[test]
fn each_header_field_is_checked() {
    let b = bytes(&sample());
    let mut t = b.clone();
    t[0] = b'X';
    assert!(matches!(decoded(&t), Err(CacheFileError::Magic(_))));
    let mut t = b.clone();
    t[8] = 2;
    assert!(matches!(decoded(&t), Err(CacheFileError::Version { version: 2, flags: 0 })));
    let mut t = b.clone();
    t[12] = 1;
    assert!(matches!(decoded(&t), Err(CacheFileError::Version { version: 1, flags: 1 })));
    let e = decode(&mut &b[..], b.len() as u64, &[0x22; 16]).expect_err("another boot");
    assert!(matches!(e, CacheFileError::OtherBoot { .. }), "{e}");
    assert!(e.to_string().contains("11111111-1111-1111-1111-111111111111"), "{e}");
    // Counts that do not make the file's size, truncated or grown files.
    let mut t = b.clone();
    t[48] += 1;
    assert!(matches!(decoded(&t), Err(CacheFileError::Size { .. })));
    let mut t = b.clone();
    t[32..40].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(decoded(&t), Err(CacheFileError::Size { .. })));
    assert!(matches!(decoded(&b[..b.len() - RECORD]), Err(CacheFileError::Size { .. })));
    assert!(matches!(decoded(&b[..HEADER - 1]), Err(CacheFileError::Io(_))));
    let e = decode(&mut &b[..], MAX_BYTES + 1, &BOOT).expect_err("too large");
    assert!(matches!(e, CacheFileError::TooLarge { .. }), "{e}");
}

#[test]
fn a_payload_out_of_order_or_out_of_range_is_refused_even_with_its_checksum() {
    let mut n = sample();
    n.swap(0, 1);
    let e = decoded(&bytes(&n)).expect_err("namespaces out of order");
    assert!(e.to_string().contains("namespaces not in ascending order"), "{e}");
    let mut n = sample();
    let image = DevNum::new(7, 0);
    n[0].1 = Arc::new(vec![(10, image, 0xef53, 1), (10, image, 0xef53, 2)]);
    let e = decoded(&bytes(&n)).expect_err("a mount twice");
    assert!(e.to_string().contains("mounts not in ascending order"), "{e}");
    // A pair index beyond the table (the first mount's record, bytes 12..16 of it).
    let mut b = bytes(&sample());
    let first_mount = HEADER + RECORD * (3 + 1);
    b[first_mount + 12..first_mount + 16].copy_from_slice(&7u32.to_le_bytes());
    resum(&mut b);
    let e = decoded(&b).expect_err("pair out of range");
    assert!(e.to_string().contains("beyond the table"), "{e}");
    // A namespace head claiming more mounts than the header counts.
    let mut b = bytes(&sample());
    let head = HEADER + RECORD * 3;
    b[head + 8..head + 16].copy_from_slice(&5u64.to_le_bytes());
    resum(&mut b);
    let e = decoded(&b).expect_err("counts disagree");
    assert!(e.to_string().contains("more mounts than the header counts"), "{e}");
}

#[test]
fn boot_ids_parse_and_show() {
    let id = parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0").expect("valid");
    assert_eq!(id[0], 0x0f);
    assert_eq!(id[15], 0xf0);
    assert_eq!(show_boot(&id), "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
    assert_eq!(parse_boot_id("0f1e2d3c4b5a69788796a5b4c3d2e1f0"), None);
    assert_eq!(parse_boot_id("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1fx"), None);
}

fn dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    d
}

#[test]
fn a_file_written_is_read_back_and_replaced_whole() {
    let d = dir();
    let path = d.path().join("sub/statmount-memo");
    assert!(matches!(read(&path, &BOOT), Err(CacheFileError::Missing)));
    write(&path, &BOOT, &sample()).expect("write, making the directory");
    let sub = std::fs::metadata(d.path().join("sub")).expect("dir");
    assert_eq!(sub.permissions().mode() & 0o777, 0o700);
    let meta = std::fs::metadata(&path).expect("file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{meta:?}");
    assert_eq!(read(&path, &BOOT).expect("read"), owned(&sample()));
    write(&path, &BOOT, &sample()[1..]).expect("rewrite");
    assert_eq!(read(&path, &BOOT).expect("read"), owned(&sample()[1..]));
    let names: Vec<_> =
        std::fs::read_dir(d.path().join("sub")).expect("ls").flatten().map(|e| e.file_name()).collect();
    assert_eq!(names, ["statmount-memo"], "no temporary file left");
}

#[test]
fn a_file_or_directory_others_could_write_is_ignored() {
    let d = dir();
    let path = d.path().join("statmount-memo");
    write(&path, &BOOT, &sample()).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o620)).expect("chmod");
    let e = read(&path, &BOOT).expect_err("group-writable file");
    assert!(matches!(e, CacheFileError::Writable { what: "file", mode: 0o620 }), "{e}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o602)).expect("chmod");
    assert!(matches!(read(&path, &BOOT), Err(CacheFileError::Writable { what: "file", .. })));
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(read(&path, &BOOT).is_ok(), "readable by others is fine");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o770)).expect("chmod");
    let e = read(&path, &BOOT).expect_err("group-writable directory");
    assert!(matches!(e, CacheFileError::Writable { what: "directory", .. }), "{e}");
    assert!(write(&path, &BOOT, &sample()).is_err(), "nor written there");
}

#[test]
fn a_symlink_a_fifo_or_another_owners_file_is_ignored() {
    let d = dir();
    let real = d.path().join("real");
    write(&real, &BOOT, &sample()).expect("write");
    let link = d.path().join("link");
    symlink(&real, &link).expect("symlink");
    let e = read(&link, &BOOT).expect_err("a symlink");
    assert!(matches!(e, CacheFileError::Open { what: "file", source: nix::Error::ELOOP }), "{e}");
    let dlink = d.path().join("dlink");
    symlink(d.path(), &dlink).expect("symlink");
    let e = read(&dlink.join("real"), &BOOT).expect_err("a symlinked directory");
    assert!(matches!(e, CacheFileError::Open { what: "directory", .. }), "{e}");
    let fifo = d.path().join("fifo");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o600)).expect("mkfifo");
    assert!(matches!(read(&fifo, &BOOT), Err(CacheFileError::NotRegular)), "and does not block");
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&real, Some(65534), None).expect("chown");
        let e = read(&real, &BOOT).expect_err("another owner");
        assert!(matches!(e, CacheFileError::Owner { what: "file", uid: 65534, euid: 0 }), "{e}");
    }
}

#[test]
fn a_fixture_tree_keeps_no_memo() {
    let d = dir();
    let host = HostRoot::new(d.path());
    assert!(Kept::load(&host, &d.path().join("statmount-memo")).is_none());
}

/// Structural: only the report-only commands' entry loads the memo (no scan behind an action,
/// no daemon code, no other engine code names it).
#[test]
fn only_the_report_only_commands_load_the_memo() {
    fn walk(dir: &Path, found: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).expect("src").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, found);
            } else if p.extension().is_some_and(|x| x == "rs")
                && std::fs::read_to_string(&p).expect("source").contains(concat!("Kept::", "load("))
            {
                found.push(
                    p.strip_prefix(env!("CARGO_MANIFEST_DIR")).expect("in crate").display().to_string(),
                );
            }
        }
    }
    let mut found = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &mut found);
    found.sort();
    assert_eq!(
        found,
        ["src/engine/requests/show.rs", "src/engine/statmount_cache_file_tests.rs"],
        "the memo file is loaded only by `holders` and `scan`"
    );
    let show =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/engine/requests/show.rs"))
            .expect("show.rs");
    assert_eq!(show.matches("self.load_report_only_memo();").count(), 2, "holders and scan");
}
