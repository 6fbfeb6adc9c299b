//! Parsing what Ceph prints about an image's watchers: `rbd status POOL/IMAGE`
//!
//! `Watchers:` then, after a tab, one line per watcher:
//! `watcher=10.254.0.1:0/904239915 client.4122 cookie=18446462598732840961`
//! (`Watchers: none` when there is none) and `rados -p POOL listwatchers rbd_header.<id>`, which
//! prints the same line without the tab. Each watcher is an address `IP:PORT/NONCE` (port 0 for a
//! kernel client), a client id `client.N` and a cookie. Any other line is ignored, so a whole
//! terminal paste (prompt, `rbd info` around it) parses too. I/O-free.

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
}
