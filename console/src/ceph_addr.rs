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
//!
//! What an address means (gotcha 32): `IP:0/0` is what `ceph osd blocklist add IP` stores, and it
//! blocks every client of that IP: it is asked about as the whole IP, never as one instance
//! whose nonce happens to be 0. A daemon's address (a monitor's `:3300` or `:6789`, an OSD's,
//! MDS's or manager's `:6800-7300`, with nonce 0) is no client: asking who watches from it is
//! refused. A word after a blocklist line's address that is not its expiry timestamp is an
//! error, and so is a line naming a client among `watcher=` lines: neither is silently dropped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// What is expected, with examples (ends every error).
pub const EXPECTED: &str =
    "expected a Ceph client address (10.0.0.5:0/3710147553, v1:10.0.0.5:0/3710147553, \
     [v2:10.0.0.5:0/3710147553,v1:10.0.0.5:0/3710147553], [fd00::5]:0/123), an IP or range \
     (10.0.0.5, 10.0.0.5:0/0, 10.0.0.0/24), \
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
    #[error(
        "'{addr}' is {why}, not a client: a client's address is IP:0/NONCE (the kernel's) or \
             IP:PORT/NONCE with a nonce other than 0; asking who watches from a daemon is refused"
    )]
    NotAClient { addr: String, why: String },
}

/// The ports Ceph daemons listen on: the monitors' msgr2 and msgr1 ports, and the range OSDs,
/// MDSs and managers bind in (`ms_bind_port_min`..`ms_bind_port_max`).
pub const DAEMON_PORTS: &str = "3300 and 6789 (monitors), 6800-7300 (OSDs, MDSs, managers)";

fn daemon_port(port: u16) -> Option<&'static str> {
    match port {
        3300 => Some("a monitor's msgr2 address (port 3300"),
        6789 => Some("a monitor's msgr1 address (port 6789"),
        6800..=7300 => Some("an OSD's, MDS's or manager's address (port 6800-7300"),
        _ => None,
    }
}

/// `addrs` (parsed from `text`) as a question about clients: `IP:0/0` becomes the whole IP (what
/// the blocklist means by it); a daemon's address, or any other address with nonce 0 and a port,
/// is refused.
pub fn as_client(text: &str, addrs: Vec<AddrSpec>) -> Result<Vec<AddrSpec>, ParseError> {
    addrs
        .into_iter()
        .map(|a| match a {
            AddrSpec::Exact { ip, port: 0, nonce: 0 } => Ok(AddrSpec::Ip(ip)),
            AddrSpec::Exact { port, nonce: 0, .. } => Err(ParseError::NotAClient {
                addr: text.trim().to_owned(),
                why: match daemon_port(port) {
                    Some(d) => format!("{d}, nonce 0): a Ceph daemon"),
                    None => format!("an address with port {port} and nonce 0 (no client instance; daemons listen on {DAEMON_PORTS})"),
                },
            }),
            other => Ok(other),
        })
        .collect()
}

/// A client address as a question: [`parse_addr`], then [`as_client`].
pub fn parse_client_addr(s: &str) -> Result<Vec<AddrSpec>, ParseError> {
    as_client(s, parse_addr(s)?)
}

/// The instance a reported client address is (`IP:0/NONCE`: its IP and nonce), when it is one.
pub fn client_instance(addr: &str) -> Option<(IpAddr, u32)> {
    match parse_single(addr.trim()) {
        Ok(AddrSpec::Exact { ip, nonce, .. }) if nonce != 0 => Some((ip.to_canonical(), nonce)),
        _ => None,
    }
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

    /// Whether it covers every client of an IP or a range (`10.0.0.5`, `10.0.0.5:0/0`,
    /// `10.0.0.0/24`), not one instance.
    pub fn whole_ip(&self) -> bool {
        self.addrs.iter().any(|a| !matches!(a, AddrSpec::Exact { .. }))
    }

    /// The exact instances it names (`IP:PORT/NONCE`), canonical IP and nonce.
    pub fn instances(&self) -> Vec<(IpAddr, u32)> {
        self.addrs
            .iter()
            .filter_map(|a| match a {
                AddrSpec::Exact { ip, nonce, .. } => Some((ip.to_canonical(), *nonce)),
                _ => None,
            })
            .collect()
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
    let addrs = as_client(addr, addrs).map_err(|e| e.to_string())?;
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

fn digits(s: &str, n: usize) -> bool {
    s.len() == n && s.bytes().all(|b| b.is_ascii_digit())
}

/// `YYYY-MM-DD` with a month and a day that exist in a calendar.
fn date_word(w: &str) -> bool {
    let p: Vec<&str> = w.split('-').collect();
    let in_range = |s: &str, lo: u32, hi: u32| s.parse::<u32>().is_ok_and(|v| (lo..=hi).contains(&v));
    p.len() == 3
        && digits(p[0], 4)
        && digits(p[1], 2)
        && digits(p[2], 2)
        && in_range(p[1], 1, 12)
        && in_range(p[2], 1, 31)
}

/// `HH:MM:SS`, optionally `.FRACTION`, optionally a zone (`+0000`, `-0130`, `Z`).
fn time_word(w: &str) -> bool {
    let (clock, zone) = match w.find(['+', '-', 'Z']) {
        Some(at) => w.split_at(at),
        None => (w, ""),
    };
    let zone_ok = zone.is_empty() || zone == "Z" || (zone.len() == 5 && digits(&zone[1..], 4));
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, "0"));
    let p: Vec<&str> = hms.split(':').collect();
    let in_range = |s: &str, hi: u32| s.parse::<u32>().is_ok_and(|v| v <= hi);
    zone_ok
        && !frac.is_empty()
        && frac.len() <= 9
        && frac.bytes().all(|b| b.is_ascii_digit())
        && p.len() == 3
        && p.iter().all(|x| digits(x, 2))
        && in_range(p[0], 23)
        && in_range(p[1], 59)
        && in_range(p[2], 60)
}

/// Whether `words` (what follows the address on a `ceph osd blocklist ls` line) are exactly its
/// expiry: `2026-11-27T03:00:00.000000+0000` (Pacific and later) or `2026-11-27
/// 03:00:00.000000` (before). Anything else is not silently dropped: the caller refuses it.
fn expiry(words: &[&str]) -> bool {
    match words {
        [] => true,
        [one] => one.split_once('T').is_some_and(|(d, t)| date_word(d) && time_word(t)),
        [d, t] => date_word(d) && time_word(t),
        _ => false,
    }
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
    if !expiry(&rest) {
        return Err(format!(
            "'{}' after the address is not a blocklist expiry (2026-11-27T03:00:00.000000+0000 or \
             2026-11-27 03:00:00.000000): refused rather than dropped",
            rest.join(" ")
        ));
    }
    let addrs = as_client(first, addrs).map_err(|e| e.to_string())?;
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
    // Each client once, found by a set (a blocklist of thousands of lines, not a scan per line).
    let mut seen: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut push = |out: &mut Vec<Query>, q: Query| {
        if seen.insert(format!("{:?}|{:?}", q.addrs, q.client)) {
            out.push(q);
        }
    };
    if lines.iter().any(|(_, l)| l.starts_with("watcher=")) {
        for (n, l) in &lines {
            if l.starts_with("watcher=") {
                push(&mut out, parse_watcher_line(l).map_err(|why| line_err(*n, l, why))?);
            } else if names_a_client(l) {
                // A blocklist line or an address pasted among watcher lines: answering the
                // watchers alone would drop it without a word.
                return Err(line_err(
                    *n,
                    l,
                    "a client among `watcher=` lines: ask about it on its own".into(),
                ));
            }
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
                // One line: the address's own error when it is one word or no client.
                let first = l.split_whitespace().next().unwrap_or("");
                match parse_addr(first).and_then(|a| as_client(first, a)) {
                    Err(e) if first == *l || matches!(e, ParseError::NotAClient { .. }) => e,
                    _ => line_err(*n, l, why.clone()),
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

/// Whether a line's first word is a client address or id (a line a watcher paste must not drop).
fn names_a_client(l: &str) -> bool {
    let first = l.split_whitespace().next().unwrap_or("");
    parse_client(first).is_ok() || parse_addr(first).is_ok()
}

/// `listed 2 entries` (what `ceph osd blocklist ls` ends with).
fn is_listed_line(l: &str) -> bool {
    let w: Vec<&str> = l.split_whitespace().collect();
    w.len() == 3 && w[0] == "listed" && w[1].bytes().all(|b| b.is_ascii_digit()) && w[2] == "entries"
}

#[cfg(test)]
#[path = "ceph_addr_tests.rs"]
mod tests;
