//! Tests of reading multipath maps.

use super::*;
use crate::model::DevNum;

/// Measured in the qemu guest (real-kernel-harness.md): a fresh map, one path offlined and
/// read from, both paths failed.
const STATUS_START: &str = "2 1 0 0 1 1 E 0 2 0 8:0 A 0 8:16 A 0";
const STATUS_ONE_FAILED: &str = "2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 1";
const STATUS_ALL_FAILED: &str = "2 0 0 0 1 1 A 0 2 0 8:0 F 1 8:16 F 2";
/// The harness's `dmsetup create` table without its `0 SECTORS multipath` prefix.
const TABLE_MEASURED: &str = "1 queue_if_no_path 0 1 1 round-robin 0 2 1 8:0 1 8:16 1";

#[test]
fn measured_table() {
    for line in [
        TABLE_MEASURED.to_owned(),
        format!("0 32768 multipath {TABLE_MEASURED}"),
        format!("  0 32768   multipath\t{TABLE_MEASURED}\n"),
    ] {
        let t = parse_table(&line).expect("parses");
        assert!(t.features.queue_if_no_path);
        assert_eq!(t.hw_handler, None);
        assert_eq!(t.initial_group, 1);
        assert_eq!(t.groups.len(), 1);
        assert_eq!(t.groups[0].selector, "round-robin");
        assert!(t.groups[0].selector_args.is_empty());
        let devs: Vec<DevNum> = t.groups[0].paths.iter().map(|p| p.dev).collect();
        assert_eq!(devs, [DevNum::new(8, 0), DevNum::new(8, 16)]);
        assert_eq!(t.groups[0].paths[1].args, ["1"]);
    }
    // The start sector without the rest of the prefix is not a table: 0 features, then a
    // one-word hardware handler "queue_if_no_path", then "0" groups with initial group 1.
    assert!(parse_table("0 1 queue_if_no_path 0 1 1 round-robin 0 2 1 8:0 1 8:16 1").is_err());
}

#[test]
fn measured_status_lines() {
    let s = parse_status(STATUS_START).expect("start");
    assert_eq!((s.queue_io, s.pg_init_count), (Some(1), Some(0)));
    assert_eq!(s.next_group, 1);
    assert_eq!(s.groups[0].state, GroupState::Enabled);
    assert_eq!(s.active_paths(), 2);

    let s = parse_status(STATUS_ONE_FAILED).expect("one failed");
    assert_eq!(s.queue_io, Some(0));
    assert_eq!(s.groups[0].state, GroupState::Active);
    let p: Vec<(DevNum, PathState, u32)> = s.paths().map(|p| (p.dev, p.state, p.fail_count)).collect();
    assert_eq!(p, [(DevNum::new(8, 0), PathState::Active, 0), (DevNum::new(8, 16), PathState::Failed, 1)]);

    let s = parse_status(&format!("0 32768 multipath {STATUS_ALL_FAILED}")).expect("all failed");
    assert_eq!(s.active_paths(), 0);
    assert_eq!(s.paths().map(|p| p.fail_count).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn io_hangs_only_when_queueing_with_no_active_path() {
    assert!(!Multipath::parse(TABLE_MEASURED, STATUS_ONE_FAILED).expect("join").io_would_hang());
    assert!(Multipath::parse(TABLE_MEASURED, STATUS_ALL_FAILED).expect("join").io_would_hang());
    let no_queue = "0 0 1 1 round-robin 0 2 1 8:0 1 8:16 1";
    assert!(!Multipath::parse(no_queue, STATUS_ALL_FAILED).expect("join").io_would_hang());
}

#[test]
fn features_and_hardware_handlers() {
    let t = parse_table("2 pg_init_retries 50 1 alua 1 1 service-time 0 1 2 8:32 1 1").expect("2");
    assert!(!t.features.queue_if_no_path);
    assert_eq!(t.features.pg_init_retries, Some(50));
    assert_eq!(t.hw_handler, Some(HwHandler { name: "alua".into(), args: vec![] }));
    assert_eq!(t.groups[0].paths[0].args, ["1", "1"]);

    let t = parse_table(
        "3 queue_if_no_path pg_init_retries 50 1 alua 2 1 service-time 0 1 2 8:32 1 1 \
         service-time 0 1 2 8:48 1 1",
    )
    .expect("3");
    assert!(t.features.queue_if_no_path);
    assert_eq!(t.features.pg_init_retries, Some(50));
    assert_eq!(t.groups.len(), 2);
    assert_eq!(t.groups[1].paths[0].dev, DevNum::new(8, 48));

    let t = parse_table(
        "6 queue_if_no_path pg_init_delay_msecs 2500 queue_mode bio retain_attached_hw_handler \
         2 rdac x 0 0",
    )
    .expect("all features");
    assert_eq!(t.features.pg_init_delay_msecs, Some(2500));
    assert_eq!(t.features.queue_mode.as_deref(), Some("bio"));
    assert!(t.features.retain_attached_hw_handler);
    assert_eq!(t.hw_handler, Some(HwHandler { name: "rdac".into(), args: vec!["x".into()] }));
    assert_eq!(parse_table("1 no_partitions 0 0 0").expect("unknown").features.other, ["no_partitions"]);
}

#[test]
fn map_without_paths() {
    // multipathd leaves `0 0 0 0` behind when every path was removed.
    let m = Multipath::parse("0 0 0 0", "2 0 0 0 0 0").expect("empty map");
    assert!(m.table.groups.is_empty());
    assert_eq!(m.status.next_group, 0);
    assert_eq!(m.status.active_paths(), 0);
    assert!(!m.io_would_hang());
    assert!(Multipath::parse("1 queue_if_no_path 0 0 0", "2 1 0 0 0 0").expect("q").io_would_hang());
}

#[test]
fn service_time_status_with_selector_words() {
    let s = parse_status("2 0 0 0 2 2 A 0 1 2 8:128 A 0 0 1 E 0 1 2 8:144 F 3 0 1").expect("st");
    assert_eq!(s.groups.len(), 2);
    assert_eq!(s.groups[1].state, GroupState::Enabled);
    assert_eq!(s.groups[0].paths[0].selector_status, ["0", "1"]);
    assert_eq!(s.groups[1].paths[0].fail_count, 3);
    assert_eq!(s.next_group, 2);
}

#[test]
fn table_and_status_must_agree() {
    let e = Multipath::parse(TABLE_MEASURED, "2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:32 A 0").expect_err("paths");
    assert!(e.to_string().contains("8:0 8:16"), "{e}");
    assert!(matches!(Multipath::parse(TABLE_MEASURED, "2 0 0 0 0 0"), Err(ParseError::Mismatch(_))));
}

#[test]
fn errors_name_the_word() {
    assert_eq!(
        parse_status("2 0 0 0 1 1 X 0 2 0 8:0 A 0 8:16 A 0"),
        Err(ParseError::Invalid { word: 7, found: "X".into(), expected: "path group state A, E or D" })
    );
    assert_eq!(
        parse_status("2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 B 0"),
        Err(ParseError::Invalid { word: 15, found: "B".into(), expected: "path state A or F" })
    );
    assert_eq!(
        parse_table("0 0 1 1 round-robin 0 1 1 sda 1"),
        Err(ParseError::Invalid { word: 9, found: "sda".into(), expected: "path device MAJ:MIN" })
    );
    assert!(matches!(parse_table(&format!("{TABLE_MEASURED} 8:32")), Err(ParseError::Trailing { .. })));
    assert!(matches!(parse_table("0 0 2 3 round-robin 0 0 0"), Err(ParseError::Invalid { .. })));
    assert!(matches!(parse_table("1 pg_init_retries 0 0 0"), Err(ParseError::Truncated { .. })));
    assert!(matches!(parse_table("2 pg_init_retries x 0 0 0"), Err(ParseError::Invalid { word: 3, .. })));
    let e = parse_table("0 0 4294967295 1").expect_err("huge count");
    assert!(e.to_string().contains("path group count"), "{e}");
}

#[test]
fn every_prefix_and_garbage_is_an_error_never_a_panic() {
    let full = [
        TABLE_MEASURED,
        "3 queue_if_no_path pg_init_retries 50 1 alua 2 1 service-time 0 1 2 8:32 1 1 \
         service-time 0 1 2 8:48 1 1",
    ];
    for line in full {
        let words: Vec<&str> = line.split(' ').collect();
        for n in 0..words.len() {
            let prefix = words[..n].join(" ");
            assert!(parse_table(&prefix).is_err(), "table prefix {prefix:?} accepted");
        }
        assert!(parse_table(line).is_ok());
    }
    for line in [STATUS_START, STATUS_ONE_FAILED, "2 0 0 0 2 2 A 0 1 2 8:128 A 0 0 1 E 0 1 2 8:144 F 3 0 1"] {
        let words: Vec<&str> = line.split(' ').collect();
        for n in 0..words.len() {
            let prefix = words[..n].join(" ");
            assert!(parse_status(&prefix).is_err(), "status prefix {prefix:?} accepted");
        }
        assert!(parse_status(line).is_ok());
    }
    let garbage = [
        "",
        " ",
        "multipath",
        "0 0 multipath",
        "-1 0 0 0",
        "18446744073709551616 0 0 0",
        "0 0 1 1 rr 99999999999999999999 1",
        "0 0 1 1 rr 0 1 1 8:",
        "0 0 1 1 rr 0 1 1 :0 1",
        "2 0 0 0 1 1 A 0 2 0 8:0 A x",
        "2 0 0 0 1 1 A 0 3 0 8:0 A 0 8:16 F 1",
        "\u{0} \u{fffd} 1 2 3 é ü",
        "0 0 1 1 round-robin 0 1 0 8:0 extra",
    ];
    for g in garbage {
        assert!(parse_table(g).is_err(), "table {g:?} accepted");
        assert!(parse_status(g).is_err(), "status {g:?} accepted");
    }
    // Unknown table features are kept; status features must be numbers.
    assert_eq!(parse_table("2 a b 0 0 0").expect("unknown features").features.other, ["a", "b"]);
    assert!(parse_status("2 a b 0 0 0").is_err());
    // Deterministic pseudo-random word soup from the valid vocabulary.
    let vocab = ["0", "1", "2", "3", "A", "F", "E", "8:0", "round-robin", "queue_if_no_path", "x"];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    for _ in 0..2000 {
        let mut words = Vec::new();
        for _ in 0..(seed % 24) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            words.push(vocab[(seed % vocab.len() as u64) as usize]);
        }
        let line = words.join(" ");
        let _ = parse_table(&line);
        let _ = parse_status(&line);
    }
}
