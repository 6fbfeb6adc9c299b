//! The fleet's pin risks (`ListPinRisks`): every node's, as its agent last reported them, by
//! node and mount namespace, a page at a time. Pure over the index.
//!
//! A page token is the last entry's `node/mount namespace`: the next page starts after it, so
//! pages stay in step while risks come and go between calls (none is listed twice; one that
//! appears before the token is seen on a later listing). The answer names the nodes it cannot
//! speak for (their last-known risks are listed) and the nodes that report no check (older
//! agents) or could judge no namespace: "no pin risk" is not known there.

use blockjanitor_proto::v1 as pb;
use tonic::Status;

use crate::index::Inner;

/// The page size when the request names none, and the largest one.
pub const PAGE_DEFAULT: usize = 100;
pub const PAGE_MAX: usize = 1000;

/// One page of `ListPinRisks` from the index (`missing`: the nodes answers cannot speak for).
pub fn page(
    ix: &Inner,
    r: &pb::ListPinRisksRequest,
    missing: Vec<pb::MissingNode>,
) -> Result<pb::ListPinRisksResponse, Status> {
    if !r.node.is_empty() && !ix.nodes.contains_key(&r.node) {
        return Err(Status::not_found(format!("no agent is known on node {}", r.node)));
    }
    let after = match r.page_token.as_str() {
        "" => None,
        t => {
            let (node, ns) = t
                .rsplit_once('/')
                .and_then(|(n, ns)| Some((n.to_owned(), ns.parse::<u64>().ok()?)))
                .ok_or_else(|| {
                    Status::invalid_argument(format!("page_token {t:?} is not one this console gave"))
                })?;
            Some((node, ns))
        }
    };
    let size = match r.page_size as usize {
        0 => PAGE_DEFAULT,
        n => n.min(PAGE_MAX),
    };
    let nodes = ix.nodes.values().filter(|n| r.node.is_empty() || n.name == r.node);
    let all: Vec<(&str, &pb::PinRisk)> =
        nodes.clone().flat_map(|n| n.pin_risks.iter().map(move |p| (n.name.as_str(), p))).collect();
    let start = match &after {
        None => 0,
        Some((node, ns)) => all.partition_point(|(n, p)| (*n, p.mount_namespace) <= (node.as_str(), *ns)),
    };
    let chosen = &all[start.min(all.len())..];
    let take = chosen.len().min(size);
    let next = if take < chosen.len() {
        chosen
            .get(take.saturating_sub(1))
            .map(|(n, p)| format!("{n}/{}", p.mount_namespace))
            .unwrap_or_default()
    } else {
        String::new()
    };
    let unchecked = nodes
        .filter(|n| n.synced)
        .filter_map(|n| {
            let reason = if !n.pin_risks_checked {
                "its agent reports no pin-risk check (older than this console)".to_owned()
            } else if !n.pin_risks_unknown.is_empty() {
                n.pin_risks_unknown.clone()
            } else {
                return None;
            };
            Some(pb::MissingNode { node: n.name.clone(), reason, ..Default::default() })
        })
        .collect();
    Ok(pb::ListPinRisksResponse {
        pin_risks: chosen[..take]
            .iter()
            .map(|(n, p)| pb::FleetPinRisk { node: (*n).to_owned(), risk: Some((*p).clone()) })
            .collect(),
        next_page_token: next,
        total: all.len() as u32,
        missing_nodes: missing.into_iter().filter(|m| r.node.is_empty() || m.node == r.node).collect(),
        unchecked_nodes: unchecked,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Index;

    fn risk(ns: u64) -> pb::PinRisk {
        pb::PinRisk { mount_namespace: ns, host_root_copy: "/host".into(), ..Default::default() }
    }

    /// Three nodes, five risks, pages of two: every risk once, in order, the last page without a
    /// token; an older agent and a node that could judge nothing are named unchecked.
    #[test]
    fn pages_walk_every_risk_once_by_node_and_namespace() {
        let index = Index::default();
        {
            let mut w = index.write();
            for n in ["a", "b", "c", "old"] {
                w.upsert_node(n, "10.0.0.1:9443", "static", None);
                w.nodes.get_mut(n).expect("node").mark_up(1.0);
            }
            w.set_pin_risks("b", vec![risk(9), risk(3)], true, String::new());
            w.set_pin_risks("a", vec![risk(5), risk(4), risk(7)], true, String::new());
            w.set_pin_risks("c", vec![], true, "the host's mount table cannot be read".into());
        }
        let ix = index.read();
        let mut seen = Vec::new();
        let mut token = String::new();
        for _ in 0..5 {
            let r = pb::ListPinRisksRequest { page_size: 2, page_token: token.clone(), ..Default::default() };
            let p = page(&ix, &r, Vec::new()).expect("page");
            assert_eq!(p.total, 5);
            seen.extend(
                p.pin_risks
                    .iter()
                    .map(|f| format!("{}/{}", f.node, f.risk.as_ref().expect("risk").mount_namespace)),
            );
            assert_eq!(p.unchecked_nodes.iter().map(|m| m.node.as_str()).collect::<Vec<_>>(), ["c", "old"]);
            token = p.next_page_token;
            if token.is_empty() {
                break;
            }
        }
        assert_eq!(seen, ["a/4", "a/5", "a/7", "b/3", "b/9"]);
        let one = page(&ix, &pb::ListPinRisksRequest { node: "b".into(), ..Default::default() }, Vec::new())
            .expect("node b");
        assert_eq!(one.total, 2);
        assert!(page(
            &ix,
            &pb::ListPinRisksRequest { page_token: "nonsense".into(), ..Default::default() },
            Vec::new()
        )
        .is_err());
        assert!(page(&ix, &pb::ListPinRisksRequest { node: "zz".into(), ..Default::default() }, Vec::new())
            .is_err());
    }
}
