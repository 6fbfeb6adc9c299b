//! Whether a node is believed dead, and why (issue 35, item 2): its agent's link (keepalives,
//! last contact, since when it is down), its Node (Ready condition, the kubelet's last heartbeat,
//! deleted while this console watched), and what of it still answers. A node is believed dead
//! only when its agent does not answer AND its Node is NotReady (False or Unknown) or deleted;
//! while its agent answers it never is, whatever its Node says (the machine runs).

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view::time::now_secs;
use k8s_openapi::api::core::v1::Node;

use crate::cluster::{node_addresses, Cluster};
use crate::index::Inner;

/// `t` (seconds since the epoch) as `4s ago`, `3m ago` (as the CLIs print times).
pub fn ago(t: f64, now: f64) -> String {
    blockjanitor_rpc::view::time::ago(t, now)
}

fn secs(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

/// The agent's part: answers now, last contact, down since, why not, and how old its view is.
fn agent(l: &mut pb::NodeLiveness, ix: &Inner, node: &str, now: f64) {
    if let Some(n) = ix.nodes.get(node) {
        let why = n.missing_reason();
        l.agent_answers = why.is_none();
        l.agent_last_contact_unix_seconds = n.last_seen.max(n.last_sync);
        l.agent_down_since_unix_seconds = if l.agent_answers { 0.0 } else { n.down_since };
        l.agent_error = why.unwrap_or_default();
        // A link that is up streams every change: its view is current. A dead one's view is as
        // of when it went silent (keepalives notice within seconds).
        let as_of = if n.down_since > 0.0 { n.down_since } else { l.agent_last_contact_unix_seconds };
        l.view_age_seconds = if l.agent_answers || as_of <= 0.0 { 0.0 } else { (now - as_of).max(0.0) };
    } else if let Some(g) = ix.gone.get(node) {
        l.agent_last_contact_unix_seconds = g.entry.last_seen.max(g.entry.last_sync);
        l.agent_down_since_unix_seconds = if g.entry.down_since > 0.0 { g.entry.down_since } else { g.since };
        l.agent_error = format!("its agent pod went away {}", ago(g.since, now));
        l.view_age_seconds = (now - l.agent_down_since_unix_seconds).max(0.0);
    } else {
        l.agent_error = "no blockjanitor agent is known on this node".into();
    }
}

/// The Node's part: its Ready condition and heartbeat, or when it was deleted.
fn node_object(l: &mut pb::NodeLiveness, cluster: Option<&Cluster>, node: &str) {
    let Some(c) = cluster else {
        l.node_ready = "absent".into();
        return;
    };
    let (obj, deleted): (Option<std::sync::Arc<Node>>, f64) = match c.nodes.get(node) {
        Some(n) => (Some(n), 0.0),
        None => match c.nodes.deleted(node) {
            Some((when, n)) => (Some(n), when),
            None => (None, 0.0),
        },
    };
    let Some(n) = obj else {
        l.node_ready = "absent".into();
        return;
    };
    l.addresses = node_addresses(&n);
    if deleted > 0.0 {
        l.node_ready = "deleted".into();
        l.node_deleted_unix_seconds = deleted;
        return;
    }
    let ready = n.status.iter().flat_map(|s| s.conditions.iter().flatten()).find(|c| c.type_ == "Ready");
    match ready {
        Some(r) => {
            l.node_ready = r.status.clone();
            l.node_ready_reason = [r.reason.as_deref(), r.message.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(": ");
            l.node_ready_since_unix_seconds = r.last_transition_time.as_ref().map(secs).unwrap_or(0.0);
            l.kubelet_heartbeat_unix_seconds = r.last_heartbeat_time.as_ref().map(secs).unwrap_or(0.0);
        }
        None => l.node_ready = "Unknown".into(),
    }
}

/// Why the node is (or is not) believed dead, one sentence each.
fn reasons(l: &pb::NodeLiveness, now: f64) -> Vec<String> {
    let mut why = Vec::new();
    if l.agent_answers {
        why.push(format!(
            "its blockjanitor agent answers (keepalives on its link; last contact {}): the machine runs",
            ago(l.agent_last_contact_unix_seconds, now)
        ));
    } else if l.agent_down_since_unix_seconds > 0.0 {
        why.push(format!(
            "its blockjanitor agent has not answered since {} ({}); last contact {}",
            ago(l.agent_down_since_unix_seconds, now),
            l.agent_error,
            if l.agent_last_contact_unix_seconds > 0.0 {
                ago(l.agent_last_contact_unix_seconds, now)
            } else {
                "never".into()
            }
        ));
    } else {
        why.push(format!("its blockjanitor agent cannot be asked: {}", l.agent_error));
    }
    let heartbeat = if l.kubelet_heartbeat_unix_seconds > 0.0 {
        format!("the kubelet's last heartbeat {}", ago(l.kubelet_heartbeat_unix_seconds, now))
    } else {
        "no kubelet heartbeat known".into()
    };
    let since = |t: f64| if t > 0.0 { format!(" since {}", ago(t, now)) } else { String::new() };
    match l.node_ready.as_str() {
        "True" => why.push(format!("its Node is Ready ({heartbeat}): the kubelet runs")),
        "False" | "Unknown" => why.push(format!(
            "its Node is NotReady (Ready={}){} ({}); {heartbeat}",
            l.node_ready,
            since(l.node_ready_since_unix_seconds),
            if l.node_ready_reason.is_empty() { "no reason given" } else { &l.node_ready_reason }
        )),
        "deleted" => why.push(format!(
            "its Node was deleted {}: the machine may still run",
            ago(l.node_deleted_unix_seconds, now)
        )),
        _ => why.push("no Node object is known for it".into()),
    }
    if l.believed_dead {
        why.push("nothing of it answers: neither its agent nor its kubelet".into());
    }
    why
}

/// The node's liveness as the console knows it now.
pub fn of(ix: &Inner, cluster: Option<&Cluster>, node: &str) -> pb::NodeLiveness {
    let now = now_secs();
    let mut l = pb::NodeLiveness { node: node.to_owned(), ..Default::default() };
    agent(&mut l, ix, node, now);
    node_object(&mut l, cluster, node);
    let node_down = matches!(l.node_ready.as_str(), "False" | "Unknown" | "deleted");
    // A node whose cached view is only not refreshed has an agent that is connected and heard
    // from: the machine runs, whatever its Node says.
    let connected =
        ix.nodes.get(node).is_some_and(|n| n.reachable && n.synced && !n.not_refreshed.is_empty());
    l.believed_dead = !l.agent_answers && node_down && !connected;
    l.why = reasons(&l, now);
    l
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-old"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.0.2.15"}],
                       "conditions": [{"type": "Ready", "status": ready, "reason": "NodeStatusUnknown",
                                       "message": "Kubelet stopped posting node status.",
                                       "lastHeartbeatTime": "2026-01-01T00:00:00Z",
                                       "lastTransitionTime": "2026-01-01T00:00:40Z"}]}
        }))
        .expect("node")
    }

    fn cluster(n: Node) -> Cluster {
        let c = Cluster::default();
        c.nodes.replace(vec![n]);
        c
    }

    #[test]
    fn believed_dead_only_when_the_agent_is_silent_and_the_node_not_ready_or_deleted() {
        let ix = crate::index::Index::new();
        ix.write().upsert_node("node-old", "127.0.0.2:1", "static", None);
        ix.with_node("node-old", |n| n.mark_up(now_secs()));
        let c = cluster(node("Unknown"));
        let l = of(&ix.read(), Some(&c), "node-old");
        assert!(l.agent_answers && !l.believed_dead, "its agent answers: never dead, whatever the Node says");
        assert!(l.why[0].contains("the machine runs"), "{:?}", l.why);
        ix.with_node("node-old", |n| n.mark_down("WatchEvents: keep-alive timed out".into()));
        let l = of(&ix.read(), Some(&c), "node-old");
        assert!(l.believed_dead && l.view_age_seconds >= 0.0, "{l:?}");
        assert!(l.why[1].starts_with("its Node is NotReady (Ready=Unknown) since"), "{:?}", l.why);
        assert!(l.why[1].contains("Kubelet stopped posting node status."), "{:?}", l.why);
        assert_eq!(l.addresses, ["10.0.2.15"]);
        let ready = cluster(node("True"));
        let l = of(&ix.read(), Some(&ready), "node-old");
        assert!(!l.believed_dead, "a Ready Node's kubelet answers: not dead");
        // Deleted while the console watched.
        ready.nodes.replace(vec![]);
        let l = of(&ix.read(), Some(&ready), "node-old");
        assert_eq!(l.node_ready, "deleted");
        assert!(
            l.believed_dead && l.node_deleted_unix_seconds > 0.0 && l.addresses == ["10.0.2.15"],
            "{l:?}"
        );
        assert!(l.why.iter().any(|w| w.contains("the machine may still run")), "{:?}", l.why);
    }
}
