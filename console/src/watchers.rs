//! Parsing what Ceph prints about an image's watchers: `rbd status POOL/IMAGE`
//!
//! `Watchers:` then, after a tab, one line per watcher:
//! `watcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961`
//! (`Watchers: none` when there is none) and `rados -p POOL listwatchers rbd_header.<id>`, which
//! prints the same line without the tab. Each watcher is an address `IP:PORT/NONCE` (port 0 for a
//! kernel client), a client id `client.N` and a cookie. Any other line is ignored, so a whole
//! terminal paste (prompt, `rbd info` around it) parses too. Also the answer to one watcher
//! ([`answer`]): the nodes its client is on (by the agents' reports of client id and address) and
//! whether unfencing it is safe. I/O-free.

use blockjanitor_proto::v1 as pb;

use crate::ceph_addr;

/// One watcher line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watcher {
    /// `IP:PORT/NONCE` as Ceph prints it.
    pub addr: String,
    /// `client.N` ("" when the line has none).
    pub client: String,
    /// The watch cookie ("" when the line has none).
    pub cookie: String,
}

/// Every `watcher=` line in `text`, in order, each address once.
pub fn parse(text: &str) -> Vec<Watcher> {
    let mut out: Vec<Watcher> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        let Some(addr) = first.strip_prefix("watcher=") else { continue };
        if addr.is_empty() {
            continue;
        }
        let mut w = Watcher { addr: addr.to_owned(), client: String::new(), cookie: String::new() };
        for word in words {
            if let Some(c) = word.strip_prefix("cookie=") {
                w.cookie = c.to_owned();
            } else if word.starts_with("client.") {
                w.client = word.to_owned();
            }
        }
        if !out.iter().any(|o| o.addr == w.addr && o.client == w.client) {
            out.push(w);
        }
    }
    out
}

/// A client id in the form watcher lists print it (`client.4122`), from `client.4122`,
/// `client4122` (as sysfs prints it) or `4122`; `None` when it is none of those.
pub fn normalize_client(id: &str) -> Option<String> {
    let id = id.trim();
    let digits = id.strip_prefix("client.").or_else(|| id.strip_prefix("client")).unwrap_or(id);
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then(|| format!("client.{digits}"))
}

/// The IP part of `IP:PORT/NONCE` (`[v6]:PORT/NONCE` for IPv6), or the whole text when it has no
/// port.
pub fn addr_ip(addr: &str) -> &str {
    let no_nonce = addr.split('/').next().unwrap_or(addr);
    if let Some(rest) = no_nonce.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match no_nonce.rsplit_once(':') {
        Some((ip, _)) if !ip.contains(':') => ip,
        _ => no_nonce,
    }
}

/// The IP of the first mapping whose client address parses (a query by client id alone names its
/// node by address this way too).
pub fn ip_of_mappings(mappings: &[pb::FleetDevice]) -> Option<std::net::IpAddr> {
    mappings
        .iter()
        .filter_map(|m| m.device.as_ref()?.rbd.as_ref())
        .find_map(|r| addr_ip(&r.client_addr).parse().ok())
}

/// The nodes a client is on: those mapping something for it, then the node its address belongs
/// to, each once.
pub fn nodes_of(mappings: &[pb::FleetDevice], node_by_address: &str) -> Vec<String> {
    let mut nodes: Vec<String> = Vec::new();
    for n in mappings.iter().map(|m| m.node.as_str()).chain([node_by_address]) {
        if !n.is_empty() && !nodes.iter().any(|x| x == n) {
            nodes.push(n.to_owned());
        }
    }
    nodes
}

/// The node a client belongs to, and what the console knows of it now: the evidence an unfence
/// answer must rest on (design.md: "evidence about the right node").
#[derive(Debug, Clone, Default)]
pub struct Owner {
    /// The node ("" when none is known).
    pub node: String,
    /// How it is known to be the client's node, one phrase.
    pub how: String,
    /// Why that node cannot vouch now (`None`: its agent answers now): not answering, no agent,
    /// its Node deleted (the machine may still run), its IP now another node's.
    pub cannot_vouch: Option<String>,
    /// Its rbd mappings whose client cannot be read (they may be this client's).
    pub unreadable: Vec<String>,
    /// This exact kernel client instance as the console saw that node's agent report it
    /// (`rbd4 (k8s/img), last reported N s ago`); `None`: never seen.
    pub seen: Option<String>,
    /// What its agent cannot see (rbd-nbd devices on it; librbd clients, which no agent sees).
    pub blind: String,
}

/// The words of an answer: `yes`, `no`, `unknown`.
pub const YES: &str = "yes";
pub const NO: &str = "no";
pub const UNKNOWN: &str = "unknown";

/// Why lifting the fence of `who` is not known to be safe, or `None` when it is.
fn not_known_safe(q: &ceph_addr::Query, who: &str, owner: &Owner) -> Option<String> {
    if owner.node.is_empty() {
        return Some(format!(
            "{who} belongs to no node this console knows (no Node lists its IP, no agent reports it, and this console \
             never saw it): it may be a machine outside the cluster or a node with no agent"
        ));
    }
    let node = &owner.node;
    if let Some(why) = &owner.cannot_vouch {
        return Some(format!("{who} is node {node}'s ({}), and {node} cannot vouch now: {why}", owner.how));
    }
    if !owner.unreadable.is_empty() {
        return Some(format!(
            "these rbd mappings on node {node} report no readable client address or id, so they may be this \
             client's: {}",
            owner.unreadable.join(", ")
        ));
    }
    if q.whole_ip() {
        return Some(format!(
            "{who} covers every client of that IP on node {node} ({}), and {}: only a single kernel client instance \
             (IP:0/NONCE) can be vouched for",
            owner.how, owner.blind
        ));
    }
    if owner.seen.is_none() {
        return Some(format!(
            "no mapping on node {node} ({}) is {who} now, but this console never saw it there as a kernel rbd client, \
             and {}: it may be one of those",
            owner.how, owner.blind
        ));
    }
    None
}

/// One watcher's answer: its mappings and nodes, and whether unfencing it is safe: "yes" only
/// from evidence about the client's own node ([`Owner`]), "no" while any node maps it (as last
/// seen counts), "unknown" otherwise.
pub fn answer(
    q: &ceph_addr::Query,
    mappings: Vec<pb::FleetDevice>,
    owner: &Owner,
    node_by_address: String,
) -> pb::WatcherMatch {
    let who = match (q.client_text(), q.addr_text.as_str()) {
        (c, "") if !c.is_empty() => c,
        (_, a) if !a.is_empty() => a.to_owned(),
        _ => "this client".to_owned(),
    };
    let nodes = nodes_of(&mappings, &owner.node);
    let (word, mut detail) = if !mappings.is_empty() {
        let on = mappings
            .iter()
            .map(|d| format!("{}/{}", d.node, d.device.as_ref().map(|x| x.name.as_str()).unwrap_or("")))
            .collect::<Vec<_>>()
            .join(", ");
        (NO, format!("{who} is on {}: still mapped on {on}: unmap there first", nodes.join(", ")))
    } else {
        match not_known_safe(q, &who, owner) {
            Some(why) => (UNKNOWN, format!("unknown, never safe: {why}")),
            None => (
                YES,
                format!(
                    "no node maps anything for {who}: node {} ({}) answers now and no longer reports it (it was {})",
                    owner.node,
                    owner.how,
                    owner.seen.as_deref().unwrap_or("")
                ),
            ),
        }
    };
    if !node_by_address.is_empty() {
        detail.push_str(&format!("; the client's address is node {node_by_address}'s"));
    }
    pb::WatcherMatch {
        node_by_address,
        client_addr: q.addr_text.clone(),
        client_id: q.client_text(),
        cookie: q.cookie.clone(),
        mappings,
        unfence_safe: word == YES,
        detail,
        nodes,
        answer: word.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from `rbd status k8s/smoke` in the Ceph guest (tests/ceph/README.md).
    const RBD_STATUS: &str =
        "Watchers:\n\twatcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961\n";
    /// The same image from `rados -p k8s listwatchers rbd_header.10152ed9df86`.
    const LISTWATCHERS: &str = "watcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961\n";

    #[test]
    fn rbd_status_and_listwatchers_give_the_same_watcher() {
        let want = vec![Watcher {
            addr: "10.254.0.1:0/904239915".into(),
            client: "client.4122".into(),
            cookie: "18446462598732840961".into(),
        }];
        assert_eq!(parse(RBD_STATUS), want);
        assert_eq!(parse(LISTWATCHERS), want);
    }

    #[test]
    fn none_and_noise_give_nothing() {
        assert!(parse("Watchers: none\n").is_empty());
        assert!(parse("rbd image 'x':\n\tsize 10 GiB\nwatcher=\n").is_empty());
    }

    #[test]
    fn incident_text_with_prompt_and_two_watchers() {
        let text = "$ rbd status mec-ecs-pool/csi-vol-10ff5cc1\nWatchers:\n\twatcher=192.168.73.52:0/319745466 client.2474196 cookie=18446462598732841025\n\twatcher=192.168.73.51:0/11223344 client.2474500 cookie=18446462598732841030\n";
        let w = parse(text);
        assert_eq!(w.len(), 2);
        assert_eq!(w[0].addr, "192.168.73.52:0/319745466");
        assert_eq!(w[0].client, "client.2474196");
        assert_eq!(w[1].client, "client.2474500");
    }

    #[test]
    fn client_ids_and_ips() {
        assert_eq!(normalize_client("client4122").as_deref(), Some("client.4122"));
        assert_eq!(normalize_client("client.4122").as_deref(), Some("client.4122"));
        assert_eq!(normalize_client("4122").as_deref(), Some("client.4122"));
        assert_eq!(normalize_client("osd.3"), None);
        assert_eq!(addr_ip("10.125.53.47:0/3423687629"), "10.125.53.47");
        assert_eq!(addr_ip("10.125.53.47"), "10.125.53.47");
        assert_eq!(addr_ip("[fd00::5]:0/77"), "fd00::5");
    }

    fn mapping(node: &str, client: &str, addr: &str) -> pb::FleetDevice {
        pb::FleetDevice {
            node: node.into(),
            device: Some(pb::Device {
                name: "rbd0".into(),
                rbd: Some(pb::RbdMapping {
                    client_id: client.into(),
                    client_addr: addr.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    fn owner(node: &str) -> Owner {
        Owner {
            node: node.into(),
            how: "its agent reported the client".into(),
            blind: "its agent sees no rbd-nbd or librbd client".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_client_id_alone_names_its_node_and_safe_needs_the_instance_seen_on_a_node_that_answers() {
        let q = ceph_addr::parse_query("client.4151").expect("parse").remove(0);
        let m = vec![mapping("node-a", "client.4151", "10.0.0.5:0/77")];
        assert_eq!(ip_of_mappings(&m), Some("10.0.0.5".parse().expect("ip")));
        let a = answer(&q, m, &owner("node-a"), "node-a".into());
        assert_eq!(
            (a.nodes.as_slice(), a.answer.as_str(), a.unfence_safe),
            (&["node-a".to_owned()][..], NO, false)
        );
        assert!(
            a.detail.starts_with("client.4151 is on node-a: still mapped on node-a/rbd0"),
            "{}",
            a.detail
        );

        // Nothing maps it: safe only when the instance was seen on a node that answers now.
        let seen = Owner { seen: Some("rbd0 (k8s/vol), last reported 3 s ago".into()), ..owner("node-a") };
        let a = answer(&q, vec![], &seen, String::new());
        assert!(a.unfence_safe && a.answer == YES, "{a:?}");
        for (o, why) in [
            (Owner::default(), "belongs to no node this console knows"),
            (owner("node-a"), "never saw it there"),
            (
                Owner { cannot_vouch: Some("unreachable for 9.0 s".into()), ..seen.clone() },
                "cannot vouch now",
            ),
            (Owner { unreadable: vec!["node-a/rbd1".into()], ..seen.clone() }, "may be this client's"),
        ] {
            let a = answer(&q, vec![], &o, String::new());
            assert!(!a.unfence_safe && a.answer == UNKNOWN, "{o:?}: {a:?}");
            assert!(a.detail.contains(why), "{why}: {}", a.detail);
        }
        // A whole IP is never safe, seen or not.
        let ip = ceph_addr::parse_query("10.0.0.5:0/0").expect("parse").remove(0);
        assert!(ip.whole_ip());
        let a = answer(&ip, vec![], &seen, String::new());
        assert_eq!(a.answer, UNKNOWN, "{a:?}");
        assert!(a.detail.contains("covers every client of that IP"), "{}", a.detail);
    }
}
