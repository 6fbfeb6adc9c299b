//! Tests of the plain types.

use super::*;
use std::borrow::Cow;

#[test]
fn devnum_parses_and_rejects() {
    assert_eq!("250:0".parse::<DevNum>(), Ok(DevNum::new(250, 0)));
    assert_eq!("7:12".parse::<DevNum>().map(|d| d.to_string()).as_deref(), Ok("7:12"));
    for bad in ["", "7", "7:", ":1", "a:b", "7:1:2", "-1:0", "99999999999:0", " 7:0"] {
        assert!(bad.parse::<DevNum>().is_err(), "{bad:?} accepted");
    }
}

#[test]
fn devnum_from_dev_t_round_trips() {
    let d = libc::makedev(259, 300);
    assert_eq!(DevNum::from_dev_t(d), DevNum::new(259, 300));
}

#[test]
fn device_names() {
    assert!(DeviceName::new("cciss!c0d0").is_ok());
    for bad in ["", "a/b", "..", "a b", "x\0"] {
        assert!(DeviceName::new(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn kernel_text_escapes() {
    let t = KernelText::from_bytes(b"d\xff".to_vec());
    assert_eq!(t.escaped(), r"d\xff");
    assert_eq!(t.to_string(), r"d\xff");
    assert_eq!(t.to_str(), None);
    assert_eq!(KernelText::from("a\tb").escaped(), r"a\x09b");
    assert_eq!(KernelText::from(r"back\slash").escaped(), r"back\\slash");
    assert_eq!(KernelText::from("\u{7f}\u{85}").escaped(), r"\x7f\xc2\x85");
    assert_eq!(KernelText::from("plain ü/€ ok").escaped(), "plain ü/€ ok");
    assert!(matches!(KernelText::from("/mnt/x").escaped(), Cow::Borrowed(_)));
    // A truncated multi-byte sequence: each byte on its own.
    assert_eq!(KernelText::from_bytes(vec![b'a', 0xe2, 0x82]).escaped(), r"a\xe2\x82");
    assert_eq!(KernelText::unescape(r"d\xff"), KernelText::from_bytes(b"d\xff".to_vec()));
    assert_eq!(KernelText::unescape(r"d\xFF"), KernelText::from_bytes(b"d\xff".to_vec()));
    // Not an escape: kept as it is.
    assert_eq!(KernelText::unescape(r"a\b\x1\"), r"a\b\x1\");
    assert_eq!(t, KernelText::from_bytes(vec![b'd', 0xff]));
    let x = KernelText::from("x");
    assert!(x == "x" && x == *"x");
    assert_eq!(lossless_string(b"ok\\".to_vec()), "ok\\");
    assert_eq!(lossless_string(vec![b'i', 0xff]), r"i\xff");
}

#[test]
fn kernel_text_round_trips_random_bytes() {
    // xorshift: deterministic, no extra crate. Bytes weighted towards the interesting ones.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let pool: &[&[u8]] = &[
        b"\\",
        b"\\x",
        b"x",
        b"ff",
        b"\t",
        b"\n",
        b" ",
        "é".as_bytes(),
        "€".as_bytes(),
        b"\xc2",
        b"\x85",
        b"\xff",
        b"\x7f",
        b"/",
        b"a",
    ];
    for _ in 0..20_000 {
        let len = (next() % 24) as usize;
        let mut bytes = Vec::new();
        for _ in 0..len {
            let r = next();
            if r % 3 == 0 {
                bytes.push((r >> 8) as u8);
            } else {
                bytes.extend_from_slice(pool[(r >> 8) as usize % pool.len()]);
            }
        }
        let t = KernelText::from_bytes(bytes.clone());
        let e = t.escaped();
        assert!(!e.chars().any(char::is_control), "{e:?}");
        assert_eq!(KernelText::unescape(&e).as_bytes(), bytes.as_slice(), "{e:?}");
        let json = serde_json::to_string(&t).expect("serialize");
        assert_eq!(json, serde_json::to_string(e.as_ref()).expect("serialize str"));
        let back: KernelText = serde_json::from_str(&json).expect("deserialize");
        assert_eq!(back, t);
    }
}

#[test]
fn ns_links() {
    assert_eq!(MountNsId::from_link("mnt:[4026531841]"), Some(MountNsId(4026531841)));
    assert_eq!(MountNsId::from_link("net:[4026531841]"), None);
    assert_eq!(MountNsId::from_link("mnt:[x]"), None);
}
