//! Tests of [`super`]: every form Ceph prints, and what is refused.
use super::*;

fn v4(s: &str) -> IpAddr {
    s.parse().expect("parses")
}

fn exact(ip: &str, port: u16, nonce: u32) -> AddrSpec {
    AddrSpec::Exact { ip: v4(ip), port, nonce }
}

/// Every address form as Ceph prints it (entity_addr_t's operator<<: type prefix, then
/// `IP:PORT` or `[IPv6]:PORT`, then `/NONCE`; entity_addrvec_t in brackets).
#[test]
fn entity_addresses() {
    let a = exact("10.42.7.12", 0, 3094577161);
    for s in ["10.42.7.12:0/3094577161", "v1:10.42.7.12:0/3094577161", "any:10.42.7.12:0/3094577161"] {
        assert_eq!(parse_addr(s), Ok(vec![a]), "{s}");
    }
    assert_eq!(
        parse_addr("[v2:10.0.0.5:3300/0,v1:10.0.0.5:6789/0]"),
        Ok(vec![exact("10.0.0.5", 3300, 0), exact("10.0.0.5", 6789, 0)])
    );
    let v6 = AddrSpec::Exact { ip: v4("fd00::5"), port: 0, nonce: 123 };
    assert_eq!(parse_addr("[fd00::5]:0/123"), Ok(vec![v6]));
    assert_eq!(
        parse_addr("v2:[fd00::5]:3300/0").expect("parses")[0],
        AddrSpec::Exact { ip: v4("fd00::5"), port: 3300, nonce: 0 }
    );
    assert_eq!(parse_addr("[v2:[fd00::5]:3300/7]").expect("parses").len(), 1);
    assert_eq!(parse_addr("10.0.0.5"), Ok(vec![AddrSpec::Ip(v4("10.0.0.5"))]));
    assert_eq!(parse_addr("fd00::5"), Ok(vec![AddrSpec::Ip(v4("fd00::5"))]));
    assert_eq!(parse_addr("[fd00::5]"), Ok(vec![AddrSpec::Ip(v4("fd00::5"))]));
}

#[test]
fn ranges_from_newer_blocklists() {
    let r = AddrSpec::Range { net: v4("10.0.0.0"), bits: 24 };
    assert_eq!(parse_addr("10.0.0.0/24"), Ok(vec![r]));
    // `ceph osd blocklist range add` answers "blocklisting cidr:10.1.114.75:0/32 until ...".
    assert_eq!(parse_addr("cidr:10.0.0.0:0/24"), Ok(vec![r]));
    assert_eq!(parse_addr("fd00::/64"), Ok(vec![AddrSpec::Range { net: v4("fd00::"), bits: 64 }]));
    assert!(r.matches(v4("10.0.0.77"), 0, 5));
    assert!(!r.matches(v4("10.0.1.77"), 0, 5));
    assert!(AddrSpec::Range { net: v4("0.0.0.0"), bits: 0 }.matches(v4("1.2.3.4"), 0, 1));
    assert!(parse_addr("10.0.0.0/33").is_err());
    assert!(parse_addr("v1:10.0.0.0/24").is_err());
}

#[test]
fn malformed_addresses_are_errors() {
    for s in [
        "",
        "v1:",
        "v3:10.0.0.5:0/1",
        "10.0.0.5:0/",
        "10.0.0.5:/1",
        "10.0.0.5:70000/1",
        "10.0.0.5:0/99999999999",
        "10.0.0.256:0/1",
        "10.0.0.5:0:0/1",
        "fd00::5:0/1x",
        "[fd00::5:0/1",
        "[fd00::zz]:0/1",
        "[v2:10.0.0.5:3300/0,garbage]",
        "[]",
        "v1:10.0.0.5",
        "node-1",
        "10.0.0.5 :0/1",
        "-",
    ] {
        assert!(parse_addr(s).is_err(), "{s:?} parsed");
    }
    let e = parse_addr("garbage").expect_err("an error").to_string();
    assert!(e.contains("'garbage'") && e.contains("10.0.0.5:0/3710147553"), "{e}");
}

#[test]
fn client_ids() {
    assert_eq!(parse_client("client.4122"), Ok(4122));
    assert_eq!(parse_client("client4122"), Ok(4122));
    assert_eq!(parse_client(" 4122 "), Ok(4122));
    for s in ["osd.3", "client.", "client.x", "", "client.99999999999999999999999", "mon.a"] {
        assert!(parse_client(s).is_err(), "{s:?}");
    }
}

/// Captured from `rbd status k8s/smoke` in the Ceph guest (tests/ceph/README.md).
const RBD_STATUS: &str =
    "Watchers:\n\twatcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961\n";

#[test]
fn rbd_status_listwatchers_and_blocklist_lines() {
    let q = parse_query(RBD_STATUS).expect("parses");
    assert_eq!(
        q,
        vec![Query {
            addr_text: "10.254.0.1:0/904239915".into(),
            addrs: vec![exact("10.254.0.1", 0, 904239915)],
            client: Some(4122),
            cookie: "18446462598732840961".into(),
        }]
    );
    // `rados -p k8s listwatchers rbd_header.ID`: the same line without the tab.
    assert_eq!(
        parse_query("watcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961")
            .expect("parses"),
        q
    );
    // A terminal paste with prompt: the prompt is ignored once there are watcher lines.
    let paste = "$ rbd status k8s/x\nWatchers:\n\twatcher=v1:10.0.0.5:0/123 client.4235 cookie=1\n\twatcher=[fd00::5]:0/9 client.4236 cookie=2\n";
    let q = parse_query(paste).expect("parses");
    assert_eq!(q.len(), 2);
    assert_eq!(q[0].addrs, vec![exact("10.0.0.5", 0, 123)]);
    assert_eq!(q[1].client, Some(4236));
    // `ceph osd blocklist ls`.
    let bl = "10.0.0.5:0/3710147553 2026-11-27T03:00:00.000000+0000\nv1:10.0.0.6:0/11 2026-11-27 03:00:00.000000\ncidr:10.0.1.0:0/24 2026-11-27T03:00:00.000000+0000\nlisted 3 entries\n";
    let q = parse_query(bl).expect("parses");
    assert_eq!(q.len(), 3);
    assert_eq!(q[0].addrs, vec![exact("10.0.0.5", 0, 3710147553)]);
    assert_eq!(q[1].addrs, vec![exact("10.0.0.6", 0, 11)]);
    assert_eq!(q[2].addrs, vec![AddrSpec::Range { net: v4("10.0.1.0"), bits: 24 }]);
    // Single identifiers.
    assert_eq!(parse_query("client.4235").expect("parses")[0].client, Some(4235));
    assert_eq!(parse_query("4235\n").expect("parses")[0].client_text(), "client.4235");
    assert_eq!(
        parse_query(" v1:10.42.7.12:0/3094577161 ").expect("parses")[0].addrs,
        vec![exact("10.42.7.12", 0, 3094577161)]
    );
}

#[test]
fn malformed_lines_are_errors() {
    for s in [
        "",
        "  \n\n",
        "Watchers: none\n",
        "garbage",
        "watcher=garbage client.1 cookie=1",
        "watcher= client.1",
        "watcher=10.0.0.5:0/1 client.x cookie=1",
        "watcher=10.0.0.5:0/1 client.1 cookie=abc",
        "watcher=10.0.0.5:0/1 client.1 extra",
        "Watchers:\n\twatcher=10.0.0.5:0/1 client.1 cookie=1\n\twatcher=10.0.0.5:0/ client.2 cookie=2\n",
        "10.0.0.5:0/1 tomorrow",
        "10.0.0.5:0/1\ngarbage",
        "client.1 client.2",
        "listed 0 entries",
        "$ rbd status k8s/x",
    ] {
        assert!(parse_query(s).is_err(), "{s:?} parsed: {:?}", parse_query(s));
    }
    let e = parse_query("a\nb").expect_err("an error").to_string();
    assert!(e.starts_with("line 1 ('a')") && e.contains("watcher=10.0.0.5:0/123"), "{e}");
}

/// An agent's report that names no client (old kernels have no `client_addr`) may be anyone's.
#[test]
fn reports_that_name_no_client_are_unreadable() {
    assert!(readable("10.254.0.1:0/1532017994", ""));
    assert!(readable("", "client4122"));
    assert!(!readable("", ""));
    assert!(!readable("10.254.0.1", "garbage"));
}

#[test]
fn matching_compares_parsed_values() {
    let q = &parse_query("v1:10.42.7.12:0/3094577161").expect("parses")[0];
    assert!(q.matches("10.42.7.12:0/3094577161", ""));
    assert!(!q.matches("10.42.7.12:0/3094577162", ""));
    assert!(!q.matches("10.42.7.13:0/3094577161", ""));
    assert!(!q.matches("garbage", "client1"));
    let q = &parse_query("client.4122").expect("parses")[0];
    assert!(q.matches("", "client4122"));
    assert!(!q.matches("", "client41220"));
    let q = &parse_query("10.42.7.12").expect("parses")[0];
    assert!(q.matches("10.42.7.12:0/1", ""));
    // Ports only when both have one; IPv4-mapped IPv6 is the IPv4 address.
    let q = &parse_query("[v2:10.0.0.5:3300/7,v1:10.0.0.5:6789/7]").expect("parses")[0];
    assert!(q.matches("10.0.0.5:6789/7", "") && q.matches("10.0.0.5:0/7", ""));
    assert!(!q.matches("10.0.0.5:1234/7", ""));
    let q = &parse_query("[::ffff:10.0.0.5]:0/7").expect("parses")[0];
    assert!(q.matches("10.0.0.5:0/7", ""));
    assert!(q.matches("10.0.0.5:0/7", "") && q.ip() == Some(v4("::ffff:10.0.0.5")));
}

/// Gotcha 32: `IP:0/0` is what `ceph osd blocklist add IP` stores, and it blocks every client of
/// that IP: asked about, it is the whole IP, never an instance with nonce 0.
#[test]
fn ip_0_0_is_every_client_of_the_ip() {
    for text in ["10.0.0.5:0/0", "v1:10.0.0.5:0/0", "10.0.0.5:0/0 2026-11-27T03:00:00.000000+0000"] {
        let q = parse_query(text).expect("parses").remove(0);
        assert_eq!(q.addrs, vec![AddrSpec::Ip(v4("10.0.0.5"))], "{text}");
        assert!(q.whole_ip() && q.instances().is_empty(), "{text}");
        assert!(q.matches("10.0.0.5:0/3710147553", ""), "{text}: every client of the IP");
    }
    assert_eq!(parse_client_addr("10.0.0.5:0/0"), Ok(vec![AddrSpec::Ip(v4("10.0.0.5"))]));
    let one = parse_query("10.0.0.5:0/3710147553").expect("parses").remove(0);
    assert!(!one.whole_ip() && one.instances() == vec![(v4("10.0.0.5"), 3710147553)]);
}

/// A daemon's address (monitor 3300/6789, OSD/MDS/manager 6800-7300, nonce 0) is no client: the
/// question is refused, in every form it can be pasted.
#[test]
fn daemon_addresses_are_refused_as_a_question() {
    for text in [
        "10.0.0.5:6789/0",
        "v2:10.0.0.5:3300/0",
        "[v2:10.0.0.5:3300/0,v1:10.0.0.5:6789/0]",
        "10.0.0.5:6800/0",
        "10.0.0.5:7300/0",
        "10.0.0.5:1234/0",
        "watcher=10.0.0.5:6801/0 client.4 cookie=1",
        "10.0.0.5:6789/0 2026-11-27T03:00:00.000000+0000",
    ] {
        let e = parse_query(text).expect_err(text).to_string();
        assert!(e.contains("not a client"), "{text}: {e}");
    }
    let e = parse_client_addr("10.0.0.5:6789/0").expect_err("a monitor").to_string();
    assert!(e.contains("a monitor's msgr1 address (port 6789, nonce 0): a Ceph daemon"), "{e}");
    // An OSD instance with its nonce is an address Ceph prints for a daemon too, but matching it
    // against clients finds nothing: it is not refused (a blocklist paste lists old managers).
    assert!(parse_query("10.0.0.5:6801/12345").is_ok());
}

/// A word after a blocklist line's address that is not its expiry is refused, not dropped.
#[test]
fn a_trailing_token_that_is_not_a_timestamp_is_an_error() {
    for ok in [
        "10.0.0.5:0/1 2026-11-27T03:00:00.000000+0000",
        "10.0.0.5:0/1 2026-11-27 03:00:00.000000",
        "10.0.0.5:0/1 2026-11-27T03:00:00Z",
        "10.0.0.5:0/1 2026-11-27T03:00:00.123-0130",
    ] {
        assert!(parse_query(ok).is_ok(), "{ok}: {:?}", parse_query(ok));
    }
    for bad in [
        "10.0.0.5:0/1 1-1",
        "10.0.0.5:0/1 12:30",
        "10.0.0.5:0/1 2026-13-01T00:00:00",
        "10.0.0.5:0/1 2026-11-27T25:00:00",
        "10.0.0.5:0/1 2026-11-27T03:00:00.000000+0000 extra",
        "10.0.0.5:0/1 2026-11-27 03:00",
        "10.0.0.5:0/1 10.0.0.6:0/2",
        "10.0.0.5:0/1 2026-11-27T03:00:00+00",
    ] {
        let e = parse_query(bad).expect_err(bad).to_string();
        assert!(e.contains("not a blocklist expiry") || e.contains("is not a Ceph address"), "{bad}: {e}");
    }
    let e = parse_query("10.0.0.5:0/1 1-1\n10.0.0.6:0/2").expect_err("refused").to_string();
    assert!(e.starts_with("line 1 ('10.0.0.5:0/1 1-1')") && e.contains("refused rather than dropped"), "{e}");
}

/// A client pasted among `watcher=` lines is not dropped without a word.
#[test]
fn a_client_among_watcher_lines_is_an_error() {
    let text =
        "Watchers:\n\twatcher=10.0.0.5:0/1 client.1 cookie=1\n10.0.0.7:0/5 2026-11-27T03:00:00.000000+0000\n";
    let e = parse_query(text).expect_err("refused").to_string();
    assert!(e.starts_with("line 3 ('10.0.0.7:0/5") && e.contains("among `watcher=` lines"), "{e}");
    // A prompt and other text stay ignored.
    assert_eq!(
        parse_query("$ rbd status k8s/x\nWatchers:\n\twatcher=10.0.0.5:0/1 client.1 cookie=1\n")
            .map(|q| q.len()),
        Ok(1)
    );
}
