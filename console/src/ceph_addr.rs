//! Parsing every identifier a user pastes from Ceph to ask who watches (and whether unfencing is
//! safe), and matching it against what the agents report. Pure: text in, no I/O.
//!
//! Forms, as the Ceph tools print them:
//! - an entity address `IP:PORT/NONCE` (`entity_addr_t`), with or without its type prefix
//!   `v1:`, `v2:` or `any:`; IPv6 in brackets: `[fd00::5]:0/123`, `v2:[fd00::5]:3300/0`;
//! - an address vector (`entity_addrvec_t`): `[v2:10.0.0.5:3300/0,v1:10.0.0.5:6789/0]`;
//! - a bare IP (every client from it) and a range: `10.0.0.0/24`, or `cidr:10.0.0.0:0/24` as
//!   `ceph osd blocklist range add` and `ceph osd blocklist ls` print it;
//! - a client id `client.4122`, `client4122` (sysfs) or `4122`;
//! - whole lines of `rbd status` / `rados listwatchers`
//!   (`watcher=10.0.0.5:0/123 client.4235 cookie=18446462598732840961`) and of
//!   `ceph osd blocklist ls` (`10.0.0.5:0/3710147553 2026-11-27T03:00:00.000000+0000`).
//!
//! Anything else is an error naming what was expected with an example: a query that was not
//! understood must never be answered (an empty answer reads as "nobody maps it: unfence safe").
//! Matching compares parsed values (IP, nonce, port when both sides have one), never raw text.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What is expected, with examples (ends every error).
pub const EXPECTED: &str =
    "expected a Ceph client address (10.0.0.5:0/3710147553, v1:10.0.0.5:0/3710147553, \
     [v2:10.0.0.5:3300/0,v1:10.0.0.5:6789/0], [fd00::5]:0/123), an IP or range (10.0.0.5, 10.0.0.0/24), \
     a client id (client.4235 or 4235), or lines of `rbd status`, `rados listwatchers` \
     (watcher=10.0.0.5:0/123 client.4235 cookie=18446462598732840961) or `ceph osd blocklist ls`";

/// Why a query was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("empty query: {EXPECTED}")]
    Empty,
    #[error("'{0}' is not a Ceph address: {EXPECTED}")]
    Addr(String),
    #[error("'{0}' is not a client id: {EXPECTED}")]
    Client(String),
    #[error("line {line} ('{text}') is not understood: {why}")]
    Line { line: usize, text: String, why: String },
    #[error("the text lists no watcher (`Watchers: none`?): {EXPECTED}")]
    NoWatcher,
}

/// An address as asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddrSpec {
    /// One client instance: `IP:PORT/NONCE`.
    Exact { ip: IpAddr, port: u16, nonce: u32 },
    /// Every client from this IP.
    Ip(IpAddr),
    /// Every client from this network.
    Range { net: IpAddr, bits: u8 },
}

/// One thing asked about: addresses (several for a vector), a client id, a cookie.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    /// The address text as given ("" when none).
    pub addr_text: String,
    pub addrs: Vec<AddrSpec>,
    /// `N` of `client.N`.
    pub client: Option<u64>,
    /// The watch cookie ("" when none).
    pub cookie: String,
}

impl Query {
    /// `client.N` ("" when no client id was given).
    pub fn client_text(&self) -> String {
        self.client.map(|n| format!("client.{n}")).unwrap_or_default()
    }

    /// The first IP the query names (for finding the node by address).
    pub fn ip(&self) -> Option<IpAddr> {
        self.addrs.iter().find_map(|a| match a {
            AddrSpec::Exact { ip, .. } | AddrSpec::Ip(ip) => Some(*ip),
            AddrSpec::Range { .. } => None,
        })
    }

    /// Whether an agent's rbd mapping (`client_addr` like `10.254.0.1:0/1532017994`, `client_id`
    /// like `client4122`) belongs to this query. A reported value that does not parse matches
    /// nothing here; the caller decides what an unreadable report means.
    pub fn matches(&self, client_addr: &str, client_id: &str) -> bool {
        if let (Some(want), Ok(have)) = (self.client, parse_client(client_id)) {
            if want == have {
                return true;
            }
        }
        let Ok(have) = parse_single(client_addr.trim()) else { return false };
        let AddrSpec::Exact { ip, port, nonce } = have else { return false };
        self.addrs.iter().any(|a| a.matches(ip, port, nonce))
    }
}

impl AddrSpec {
    /// Whether a reported client address falls under this one. Ports are compared only when
    /// both are non-zero (a kernel client's is 0; a vector lists one port per protocol).
    pub fn matches(&self, ip: IpAddr, port: u16, nonce: u32) -> bool {
        let ip = ip.to_canonical();
        match *self {
            AddrSpec::Exact { ip: i, port: p, nonce: n } => {
                i.to_canonical() == ip && n == nonce && (p == 0 || port == 0 || p == port)
            }
            AddrSpec::Ip(i) => i.to_canonical() == ip,
            AddrSpec::Range { net, bits } => in_range(net.to_canonical(), bits, ip),
        }
    }
}

fn in_range(net: IpAddr, bits: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let mask = if bits == 0 { 0 } else { u32::MAX << (32 - u32::from(bits)) };
            u32::from(n) & mask == u32::from(i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let mask = if bits == 0 { 0 } else { u128::MAX << (128 - u32::from(bits)) };
            u128::from(n) & mask == u128::from(i) & mask
        }
        _ => false,
    }
}

/// Whether an agent's report names its client at all (an address or a client id that parses):
/// a mapping that does not may belong to any client.
pub fn readable(client_addr: &str, client_id: &str) -> bool {
    parse_client(client_id).is_ok() || matches!(parse_single(client_addr.trim()), Ok(AddrSpec::Exact { .. }))
}

/// A client id: `client.N`, `clientN` or `N`.
pub fn parse_client(s: &str) -> Result<u64, ParseError> {
    let t = s.trim();
    let digits = t.strip_prefix("client.").or_else(|| t.strip_prefix("client")).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Client(s.trim().to_owned()));
    }
    digits.parse().map_err(|_| ParseError::Client(s.trim().to_owned()))
}

/// An address, an address vector, an IP or a range.
pub fn parse_addr(s: &str) -> Result<Vec<AddrSpec>, ParseError> {
    let t = s.trim();
    let err = || ParseError::Addr(t.to_owned());
    if let Some(inner) = t.strip_prefix('[').and_then(|r| r.strip_suffix(']')) {
        let is_vec = inner.contains(',') || ["v1:", "v2:", "any:"].iter().any(|p| inner.starts_with(p));
        if is_vec {
            let mut out = Vec::new();
            for part in inner.split(',') {
                match parse_single(part.trim()) {
                    Ok(a @ AddrSpec::Exact { .. }) => out.push(a),
                    _ => return Err(err()),
                }
            }
            return Ok(out);
        }
        // `[fd00::5]`: a bracketed IPv6 address.
        return inner.parse::<Ipv6Addr>().map(|ip| vec![AddrSpec::Ip(IpAddr::V6(ip))]).map_err(|_| err());
    }
    parse_single(t).map(|a| vec![a]).map_err(|_| err())
}

/// One `entity_addr_t` (with its type prefix or not), an IP, or a range.
fn parse_single(s: &str) -> Result<AddrSpec, ()> {
    if s.is_empty() || s.contains(char::is_whitespace) {
        return Err(());
    }
    if let Some(rest) = s.strip_prefix("cidr:") {
        // `cidr:10.0.0.0:0/24`: entity_addr_t of type CIDR, the nonce is the prefix length.
        let (ip, _port, bits) = ip_port_nonce(rest)?;
        return range(ip, bits);
    }
    let (typed, rest) = match ["v1:", "v2:", "any:"].iter().find_map(|p| s.strip_prefix(p)) {
        Some(r) => (true, r),
        None => (false, s),
    };
    if !rest.contains('/') {
        // An IP alone: `10.0.0.5`, `fd00::5`.
        if typed {
            return Err(());
        }
        return rest.parse::<IpAddr>().map(AddrSpec::Ip).map_err(|_| ());
    }
    if let Ok((ip, port, nonce)) = ip_port_nonce(rest) {
        return Ok(AddrSpec::Exact { ip, port, nonce });
    }
    // `10.0.0.0/24`, `fd00::/64`: a range, never with a type prefix.
    let (net, bits) = rest.split_once('/').ok_or(())?;
    if typed {
        return Err(());
    }
    let ip: IpAddr = net.parse().map_err(|_| ())?;
    range(ip, decimal(bits)?)
}

fn range(net: IpAddr, bits: u32) -> Result<AddrSpec, ()> {
    let max = if net.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err(());
    }
    Ok(AddrSpec::Range { net, bits: bits as u8 })
}

fn decimal(s: &str) -> Result<u32, ()> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(());
    }
    s.parse().map_err(|_| ())
}

/// `IP:PORT/NONCE` or `[IPv6]:PORT/NONCE`.
fn ip_port_nonce(s: &str) -> Result<(IpAddr, u16, u32), ()> {
    let (host_port, nonce) = s.rsplit_once('/').ok_or(())?;
    let nonce = decimal(nonce)?;
    let (ip, port) = if let Some(r) = host_port.strip_prefix('[') {
        let (ip, port) = r.split_once("]:").ok_or(())?;
        (IpAddr::V6(ip.parse::<Ipv6Addr>().map_err(|_| ())?), port)
    } else {
        let (ip, port) = host_port.rsplit_once(':').ok_or(())?;
        (IpAddr::V4(ip.parse::<Ipv4Addr>().map_err(|_| ())?), port)
    };
    let port = decimal(port)?;
    Ok((ip, u16::try_from(port).map_err(|_| ())?, nonce))
}

/// A `watcher=ADDR client.N cookie=N` line (leading whitespace allowed).
fn parse_watcher_line(line: &str) -> Result<Query, String> {
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or("");
    let addr = first.strip_prefix("watcher=").ok_or("no watcher=")?;
    let addrs = parse_addr(addr).map_err(|_| format!("'{addr}' is not a Ceph address"))?;
    let mut q = Query { addr_text: addr.to_owned(), addrs, ..Default::default() };
    for w in words {
        if let Some(c) = w.strip_prefix("cookie=") {
            if c.is_empty() || !c.bytes().all(|b| b.is_ascii_digit()) {
                return Err(format!("'{w}' is not a cookie"));
            }
            q.cookie = c.to_owned();
        } else if w.starts_with("client") {
            q.client = Some(parse_client(w).map_err(|_| format!("'{w}' is not a client id"))?);
        } else {
            return Err(format!("unexpected '{w}'"));
        }
    }
    Ok(q)
}

/// Whether a word is (part of) a timestamp as `ceph osd blocklist ls` prints an expiry:
/// `2026-11-27T03:00:00.000000+0000`, or older `2026-11-27 03:00:00.000000`.
fn timestamp_word(w: &str) -> bool {
    w.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && w.bytes().all(|b| b.is_ascii_digit() || b"-:.+T".contains(&b))
        && (w.contains('-') || w.contains(':'))
}

/// One identifier on a line of its own, or a `ceph osd blocklist ls` line.
fn parse_plain_line(line: &str) -> Result<Query, String> {
    let mut words = line.split_whitespace();
    let first = words.next().unwrap_or("");
    let rest: Vec<&str> = words.collect();
    if let Ok(n) = parse_client(first) {
        if !rest.is_empty() {
            return Err(format!("unexpected '{}' after the client id", rest.join(" ")));
        }
        return Ok(Query { client: Some(n), ..Default::default() });
    }
    let addrs = parse_addr(first).map_err(|e| e.to_string())?;
    if rest.len() > 2 || !rest.iter().all(|w| timestamp_word(w)) {
        return Err(format!("unexpected '{}' after the address (a blocklist expiry?)", rest.join(" ")));
    }
    Ok(Query { addr_text: first.to_owned(), addrs, ..Default::default() })
}

/// Everything asked about in `text`: the `watcher=` lines when there is one (other lines, such as
/// a prompt or `Watchers:`, are ignored), else one query per line (an identifier alone, or a
/// `ceph osd blocklist ls` line; a `listed N entries` line is ignored). Every line that is not
/// understood is an error: a partial answer could read as "safe".
pub fn parse_query(text: &str) -> Result<Vec<Query>, ParseError> {
    let lines: Vec<(usize, &str)> =
        text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())).filter(|(_, l)| !l.is_empty()).collect();
    if lines.is_empty() {
        return Err(ParseError::Empty);
    }
    let line_err = |line: usize, text: &str, why: String| ParseError::Line {
        line,
        text: text.to_owned(),
        why: format!("{why}; {EXPECTED}"),
    };
    let mut out: Vec<Query> = Vec::new();
    let push = |out: &mut Vec<Query>, q: Query| {
        if !out.iter().any(|o| o.addrs == q.addrs && o.client == q.client) {
            out.push(q);
        }
    };
    if lines.iter().any(|(_, l)| l.starts_with("watcher=")) {
        for (n, l) in lines.iter().filter(|(_, l)| l.starts_with("watcher=")) {
            push(&mut out, parse_watcher_line(l).map_err(|why| line_err(*n, l, why))?);
        }
        return Ok(out);
    }
    if lines.iter().any(|(_, l)| l.starts_with("Watchers:")) {
        return Err(ParseError::NoWatcher);
    }
    for (n, l) in &lines {
        if is_listed_line(l) {
            continue;
        }
        let q = parse_plain_line(l).map_err(|why| {
            if lines.len() == 1 {
                match parse_addr(l) {
                    Err(e) => e,
                    Ok(_) => line_err(*n, l, why.clone()),
                }
            } else {
                line_err(*n, l, why)
            }
        })?;
        push(&mut out, q);
    }
    if out.is_empty() {
        return Err(ParseError::Empty);
    }
    Ok(out)
}

/// `listed 2 entries` (what `ceph osd blocklist ls` ends with).
fn is_listed_line(l: &str) -> bool {
    let w: Vec<&str> = l.split_whitespace().collect();
    w.len() == 3 && w[0] == "listed" && w[1].bytes().all(|b| b.is_ascii_digit()) && w[2] == "entries"
}

#[cfg(test)]
mod tests {
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
}
