//! WhoWatches, answered from evidence about the right node (design.md, "Answers that lead a
//! person to act"): the mappings that belong to the client (found through the index's keys: the
//! client's IP or id, not a walk over the fleet; as last seen too, on a node whose agent does not
//! answer or went away), and the node the client belongs to ([`Owner`]: the node reporting it,
//! the node this console saw it on, the Node whose address it is, a deleted Node), with what
//! that node can vouch for now. Only that node's current answer matters: a node missing
//! elsewhere is named in `missing_nodes` and changes nothing here.
//!
//! A paste is bounded and answered in parts (issue 36): at most [`MAX_TEXT`] bytes and
//! [`MAX_CLIENTS`] clients, at most [`MAX_RANGES`] IP ranges (each looks at every rbd mapping,
//! having no key), and each answer or part holds at most [`PART`] watchers; a longer paste goes
//! through WhoWatchesStream (agentctl uses it), which sends one part after another, each computed
//! under its own short hold of the index.

use std::collections::BTreeSet;
use std::net::IpAddr;

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view::time::now_secs;

use crate::ceph_addr::{self, AddrSpec, Query};
use crate::cluster::Cluster;
use crate::index::{Inner, Key};
use crate::service::{AnswerStream, FleetService};
use crate::watchers::{self, Owner};

/// The index keys a query's mappings are found by, and whether it needs every rbd mapping (a
/// range has no key).
fn keys(q: &Query) -> (Vec<Key>, bool) {
    let mut keys = Vec::new();
    let mut all = false;
    for a in &q.addrs {
        match a {
            AddrSpec::Exact { ip, .. } | AddrSpec::Ip(ip) => {
                keys.push(Key::ClientIp(ip.to_canonical().to_string()))
            }
            AddrSpec::Range { .. } => all = true,
        }
    }
    if let Some(n) = q.client {
        keys.push(Key::ClientId(format!("client.{n}")));
    }
    (keys, all)
}

/// The rbd mappings (current, as last seen on a node that does not answer, and gone nodes' last
/// views) whose client is the query's: parsed values compared, never raw text.
fn mappings(ix: &Inner, q: &Query) -> Vec<pb::FleetDevice> {
    let (keys, all) = keys(q);
    let mut candidates: Vec<pb::FleetDevice> = if all {
        ix.nodes
            .values()
            .flat_map(|n| n.devices.values().filter(|d| d.rbd.is_some()).map(move |d| (n, d)))
            .map(|(n, d)| pb::FleetDevice { node: n.name.clone(), device: Some(pb::Device::clone(d)) })
            .collect()
    } else {
        keys.iter().flat_map(|k| ix.lookup(k)).collect()
    };
    let gone: Vec<pb::FleetDevice> = if all {
        ix.gone
            .values()
            .flat_map(|g| g.entry.devices.values().map(move |d| (g, d)))
            .map(|(g, d)| pb::FleetDevice { node: g.entry.name.clone(), device: Some(pb::Device::clone(d)) })
            .collect()
    } else {
        ix.lookup_gone(&keys).into_iter().map(|(f, _)| f).collect()
    };
    candidates.extend(gone);
    let mut seen = BTreeSet::new();
    candidates
        .into_iter()
        .filter(|f| {
            let Some(r) = f.device.as_ref().and_then(|d| d.rbd.as_ref()) else { return false };
            q.matches(&r.client_addr, &r.client_id)
        })
        .filter(|f| seen.insert((f.node.clone(), f.device.as_ref().map(|d| d.name.clone()))))
        .collect()
}

/// How long ago `t` was, for a sentence.
fn ago(t: f64) -> String {
    blockjanitor_rpc::view::time::ago(t, now_secs())
}

/// What a node's agent cannot see: its rbd-nbd devices (whose client addresses no agent reports)
/// and librbd clients (never visible to an agent).
pub fn blind_spots(ix: &Inner, node: &str) -> String {
    let nbd: Vec<String> = ix
        .nodes
        .get(node)
        .map(|n| {
            n.devices
                .values()
                .filter(|d| d.kind == pb::DeviceKind::Nbd as i32)
                .filter(|d| {
                    let comm = d.nbd.as_ref().map(|c| c.server_comm.as_str()).unwrap_or("");
                    comm.contains("rbd-nbd") || !d.nbd_backend.is_empty()
                })
                .map(|d| {
                    format!(
                        "{} ({})",
                        d.name,
                        if d.nbd_backend.is_empty() { "rbd-nbd" } else { &d.nbd_backend }
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let base = "its agent sees only kernel rbd clients, never an rbd-nbd or librbd client's address";
    if nbd.is_empty() {
        base.to_owned()
    } else {
        format!("{base} (and it has rbd-nbd devices: {})", nbd.join(", "))
    }
}

/// Why node `node` cannot vouch now (`None`: its agent answers now).
fn cannot_vouch(ix: &Inner, cluster: Option<&Cluster>, node: &str, ip: Option<IpAddr>) -> Option<String> {
    if let Some(c) = cluster {
        if c.nodes.get(node).is_none() {
            if let Some((when, _)) = c.nodes.deleted(node) {
                return Some(format!(
                    "its Node was deleted {}; the machine may still run and its client still watch",
                    ago(when)
                ));
            }
        }
        if let Some(by_address) = ip.and_then(|ip| c.node_with_address(&ip.to_string())) {
            if by_address != node {
                return Some(format!("its IP is now node {by_address}'s"));
            }
        }
    }
    match (ix.nodes.get(node), ix.gone.get(node)) {
        (Some(n), _) => n.missing_reason(),
        (None, Some(g)) => Some(format!("its agent pod went away {}", ago(g.since))),
        (None, None) => Some("no blockjanitor agent is known on it".into()),
    }
}

/// The node `q`'s client belongs to, and what it can vouch for (see [`Owner`]).
pub fn owner(ix: &Inner, cluster: Option<&Cluster>, q: &Query, mappings: &[pb::FleetDevice]) -> Owner {
    let ip = q.ip().or_else(|| watchers::ip_of_mappings(mappings)).map(|i| i.to_canonical());
    let instance = q.instances().into_iter().find_map(|(ip, nonce)| ix.seen.instance(ip, nonce).cloned());
    let by_id = q.client.and_then(|n| ix.seen.client(n).map(|(_, s)| s.clone()));
    let history = instance.or(by_id);
    let mut o = Owner { blind: String::new(), ..Owner::default() };
    if let Some(m) = mappings.first() {
        (o.node, o.how) = (m.node.clone(), "its agent reports a mapping for this client".into());
    } else if let Some(s) = &history {
        (o.node, o.how) = (s.node.clone(), "this console saw its agent report this client".into());
    } else if let Some(n) = ip.and_then(|ip| cluster.and_then(|c| c.node_with_address(&ip.to_string()))) {
        (o.node, o.how) = (n, "the client's IP is its Node's address".into());
    } else if let Some(f) = ip.and_then(|ip| ix.lookup(&Key::ClientIp(ip.to_string())).into_iter().next()) {
        (o.node, o.how) = (f.node, "its agent reports other clients from that IP".into());
    } else if let Some((n, when)) =
        ip.and_then(|ip| cluster.and_then(|c| c.deleted_node_with_address(&ip.to_string())))
    {
        o.how = "the client's IP was the address of its Node, since deleted".into();
        o.cannot_vouch = Some(format!(
            "its Node was deleted {}; the machine may still run and its client still watch",
            ago(when)
        ));
        o.node = n;
    }
    if o.node.is_empty() {
        return o;
    }
    if o.cannot_vouch.is_none() {
        o.cannot_vouch = cannot_vouch(ix, cluster, &o.node, ip);
    }
    o.seen = history
        .filter(|s| s.node == o.node)
        .map(|s| format!("{} ({}), last reported {}", s.device, s.image, ago(s.last)));
    o.unreadable = ix
        .nodes
        .get(&o.node)
        .map(|n| {
            n.devices
                .values()
                .filter_map(|d| d.rbd.as_ref().map(|r| (d, r)))
                .filter(|(_, r)| !ceph_addr::readable(&r.client_addr, &r.client_id))
                .map(|(d, _)| format!("{}/{}", n.name, d.name))
                .collect()
        })
        .unwrap_or_default();
    o.blind = blind_spots(ix, &o.node);
    o
}

/// The most bytes of pasted text.
pub const MAX_TEXT: usize = 4 << 20;
/// The most clients one request asks about.
pub const MAX_CLIENTS: usize = 20_000;
/// The most IP ranges one request asks about.
pub const MAX_RANGES: usize = 16;
/// The most watchers in one answer (WhoWatches) or one part (WhoWatchesStream).
pub const PART: usize = 256;

/// What a WhoWatches request asks about: `text` (any form [`ceph_addr::parse_query`] reads), or
/// `client_addr` and/or `client_id`. Anything not understood is an error, never an answer; so is
/// a paste over the bounds (see the module docs).
pub fn parse_request(r: &pb::WhoWatchesRequest) -> Result<Vec<Query>, String> {
    if r.text.len() > MAX_TEXT {
        return Err(format!(
            "the pasted text is {} bytes, more than the {} MiB one question takes: split it",
            r.text.len(),
            MAX_TEXT >> 20
        ));
    }
    let queries = if !r.text.trim().is_empty() {
        ceph_addr::parse_query(&r.text).map_err(|e| e.to_string())?
    } else {
        let (addr, id) = (r.client_addr.trim(), r.client_id.trim());
        if addr.is_empty() && id.is_empty() {
            return Err(format!("give client_addr, client_id or text: {}", ceph_addr::EXPECTED));
        }
        let mut q = Query::default();
        if !addr.is_empty() {
            q.addrs = ceph_addr::parse_client_addr(addr).map_err(|e| e.to_string())?;
            q.addr_text = addr.to_owned();
        }
        if !id.is_empty() {
            q.client = Some(ceph_addr::parse_client(id).map_err(|e| e.to_string())?);
        }
        vec![q]
    };
    if queries.len() > MAX_CLIENTS {
        return Err(format!(
            "{} clients in one question: at most {MAX_CLIENTS}; split the paste",
            queries.len()
        ));
    }
    let ranges = queries.iter().filter(|q| keys(q).1).count();
    if ranges > MAX_RANGES {
        return Err(format!(
            "{ranges} IP ranges in one question: at most {MAX_RANGES} (each looks at every rbd mapping of the fleet); \
             ask about addresses or split the paste"
        ));
    }
    Ok(queries)
}

impl FleetService {
    /// The queries of `r`, understood and within the bounds, after a fresh fan-out when asked.
    async fn asked(
        &self,
        person: &crate::person::Person,
        r: &pb::WhoWatchesRequest,
    ) -> Result<Vec<Query>, tonic::Status> {
        let asked = parse_request(r).map_err(|e| {
            tracing::info!(error = %e, "WhoWatches: query not understood");
            crate::service::uninterpretable(&e)
        })?;
        let _fresh = self.admit_fresh(person, r.fresh)?;
        if r.fresh {
            self.links.refresh_all(None).await;
        }
        Ok(asked)
    }

    /// WhoWatches: every answer in one message (at most [`PART`] watchers).
    pub(crate) async fn who_watches_now(
        &self,
        person: &crate::person::Person,
        r: pb::WhoWatchesRequest,
    ) -> Result<pb::WhoWatchesResponse, tonic::Status> {
        let asked = self.asked(person, &r).await?;
        if asked.len() > PART {
            return Err(tonic::Status::failed_precondition(format!(
                "{} clients: more than the {PART} one answer holds; ask WhoWatchesStream, which answers in parts \
                 (agentctl fleet who-watches does)",
                asked.len()
            )));
        }
        // Each answer rests on its client's own node; the nodes missing elsewhere are named.
        let watchers: Vec<pb::WatcherMatch> = asked.iter().map(|w| self.watcher(w)).collect();
        let missing_nodes = self.missing_of(&self.index.read());
        Ok(pb::WhoWatchesResponse { watchers, missing_nodes })
    }

    /// WhoWatchesStream: the answers in parts of at most [`PART`], the last with the missing
    /// nodes; the runtime is yielded between parts.
    pub(crate) async fn who_watches_stream_now(
        &self,
        person: &crate::person::Person,
        r: pb::WhoWatchesRequest,
    ) -> Result<AnswerStream, tonic::Status> {
        let asked = self.asked(person, &r).await?;
        let mut parts = Vec::with_capacity(asked.len().div_ceil(PART));
        for chunk in asked.chunks(PART) {
            let watchers: Vec<pb::WatcherMatch> = chunk.iter().map(|w| self.watcher(w)).collect();
            parts.push(Ok(pb::WhoWatchesResponse { watchers, missing_nodes: Vec::new() }));
            tokio::task::yield_now().await;
        }
        let missing_nodes = self.missing_of(&self.index.read());
        match parts.last_mut() {
            Some(Ok(last)) => last.missing_nodes = missing_nodes,
            _ => parts.push(Ok(pb::WhoWatchesResponse { watchers: Vec::new(), missing_nodes })),
        }
        Ok(Box::pin(tokio_stream::iter(parts)))
    }

    /// One watcher's answer (see the module docs).
    pub(crate) fn watcher(&self, q: &Query) -> pb::WatcherMatch {
        let ix = self.index.read();
        let found = mappings(&ix, q);
        let owner = owner(&ix, self.cluster.as_ref(), q, &found);
        let ip = q.ip().or_else(|| watchers::ip_of_mappings(&found)).map(|i| i.to_canonical().to_string());
        let node_by_address = match (&self.cluster, ip) {
            (Some(c), Some(ip)) => c.node_with_address(&ip).unwrap_or_default(),
            _ => String::new(),
        };
        watchers::answer(q, found, &owner, node_by_address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockjanitor_rpc::view::time::now_secs;
    use k8s_openapi::api::core::v1::Node;

    fn node(name: &str, ip: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name}, "status": {"addresses": [{"type": "InternalIP", "address": ip}]}
        }))
        .expect("node")
    }

    fn krbd(addr: &str) -> pb::Device {
        pb::Device {
            name: "rbd0".into(),
            kind: pb::DeviceKind::Rbd as i32,
            rbd: Some(pb::RbdMapping {
                pool: "k8s".into(),
                image: "vol".into(),
                client_addr: addr.into(),
                client_id: "client4151".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn rbd_nbd() -> pb::Device {
        pb::Device {
            name: "nbd0".into(),
            kind: pb::DeviceKind::Nbd as i32,
            nbd_backend: "k8s/vol2".into(),
            nbd: Some(pb::NbdConnection { server_comm: "rbd-nbd".into(), ..Default::default() }),
            ..Default::default()
        }
    }

    /// node-a (10.0.0.5) reported the kernel client 10.0.0.5:0/77, then unmapped it; node-b
    /// (10.0.0.6) has an rbd-nbd device; node-c (10.0.0.7) was deleted.
    fn scene() -> (crate::index::Index, Cluster) {
        let ix = crate::index::Index::new();
        for (n, devs) in [("node-a", vec![krbd("10.0.0.5:0/77")]), ("node-b", vec![rbd_nbd()])] {
            let mut w = ix.write();
            w.upsert_node(n, "127.0.0.2:1", "static", None);
            w.replace_devices(n, devs);
            drop(w);
            ix.with_node(n, |e| e.mark_up(now_secs()));
        }
        ix.write().replace_devices("node-a", vec![]);
        let c = Cluster::default();
        c.nodes.replace(vec![
            node("node-a", "10.0.0.5"),
            node("node-b", "10.0.0.6"),
            node("node-c", "10.0.0.7"),
        ]);
        c.nodes.replace(vec![node("node-a", "10.0.0.5"), node("node-b", "10.0.0.6")]);
        (ix, c)
    }

    fn ask(ix: &crate::index::Index, c: &Cluster, text: &str) -> pb::WatcherMatch {
        let q = ceph_addr::parse_query(text).expect("parses").remove(0);
        let ix = ix.read();
        let found = mappings(&ix, &q);
        let o = owner(&ix, Some(c), &q, &found);
        watchers::answer(&q, found, &o, String::new())
    }

    #[test]
    fn safe_only_for_an_instance_seen_on_its_node_which_answers_and_reports_it_no_more() {
        let (ix, c) = scene();
        let a = ask(&ix, &c, "10.0.0.5:0/77");
        assert_eq!((a.answer.as_str(), a.unfence_safe), (watchers::YES, true), "{a:?}");
        assert_eq!(ask(&ix, &c, "client.4151").answer, watchers::YES, "by its id too");
        for (text, why) in [
            ("10.0.0.5:0/0", "covers every client of that IP"),
            ("10.0.0.6:0/99", "it has rbd-nbd devices: nbd0 (k8s/vol2)"),
            ("10.0.0.7:0/1", "its Node was deleted"),
            ("10.0.0.9:0/1", "belongs to no node this console knows"),
        ] {
            let a = ask(&ix, &c, text);
            assert_eq!((a.answer.as_str(), a.unfence_safe), (watchers::UNKNOWN, false), "{text}: {a:?}");
            assert!(a.detail.contains(why), "{text}: {}", a.detail);
        }
        ix.with_node("node-a", |e| e.mark_down("keep-alive timed out".into()));
        let a = ask(&ix, &c, "10.0.0.5:0/77");
        assert!(a.answer == watchers::UNKNOWN && a.detail.contains("cannot vouch now"), "{a:?}");
        ix.with_node("node-a", |e| e.mark_up(now_secs()));
        assert_eq!(ask(&ix, &c, "10.0.0.5:0/77").answer, watchers::YES, "answers again");
        // Connected but not refreshed (a fresh read missed its deadline): its cached view is no
        // fresh evidence, so never "safe".
        ix.with_node("node-a", |e| e.mark_not_refreshed("a fresh read did not complete: deadline".into()));
        let a = ask(&ix, &c, "10.0.0.5:0/77");
        assert!(!a.unfence_safe && a.answer == watchers::UNKNOWN, "{a:?}");
        assert!(a.detail.contains("not refreshed"), "{}", a.detail);
        ix.with_node("node-a", |e| e.mark_up(now_secs()));
        ix.write().replace_devices("node-a", vec![krbd("10.0.0.5:0/77")]);
        let a = ask(&ix, &c, "10.0.0.5:0/77");
        assert_eq!(
            (a.answer.as_str(), a.nodes.as_slice()),
            (watchers::NO, &["node-a".to_owned()][..]),
            "{a:?}"
        );
    }
}
