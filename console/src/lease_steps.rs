//! Each node's step of an Apply, written into the apply Lease before it is sent (issue 36): the
//! holder re-checks the Lease before every node's step with a conditional write (the write
//! succeeds only on the Lease as read, held by this replica, so the API server itself says it
//! still holds it), and the write names the node and until when its step may run
//! (`blockjanitor.io/applying`). A replica that takes the Lease over reads those entries and does
//! not send a step to a node whose step from the old holder may still be running (the agent goes
//! on with a step whose caller vanished), until that time has passed: a per-node Apply lock
//! across replicas, kept where Kubernetes arbitrates (`lease::write_step` writes them). The holder also writes where it can be
//! reached (`blockjanitor.io/holder-address`), so the other replicas can forward an Apply to it.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::Lease;
use serde::{Deserialize, Serialize};

/// The annotation naming the nodes whose step is in flight.
pub const APPLYING: &str = "blockjanitor.io/applying";
/// The annotation with the holder's address (`HOST:PORT` of its gRPC listener).
pub const HOLDER_ADDRESS: &str = "blockjanitor.io/holder-address";

/// One node's step in flight: which replica sent it, and until when it may run (seconds since
/// the epoch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    pub by: String,
    pub until: f64,
}

/// The steps in flight, by node.
pub type Applying = BTreeMap<String, InFlight>;

/// What the last read of the Lease showed, besides who holds it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    /// The holder's address ("" when it wrote none).
    pub holder_address: String,
    pub applying: Applying,
}

/// The steps in flight a Lease names (an annotation that does not parse names none, and says so).
pub fn applying(l: &Lease) -> Applying {
    let Some(text) = l.metadata.annotations.as_ref().and_then(|a| a.get(APPLYING)) else {
        return Applying::new();
    };
    serde_json::from_str(text).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "the apply Lease's {APPLYING} annotation does not parse: taken as none");
        Applying::new()
    })
}

/// What the Lease shows besides its holder.
pub fn seen(l: Option<&Lease>) -> Seen {
    let Some(l) = l else { return Seen::default() };
    let holder_address =
        l.metadata.annotations.as_ref().and_then(|a| a.get(HOLDER_ADDRESS)).cloned().unwrap_or_default();
    Seen { holder_address, applying: applying(l) }
}

/// Writes `applying` (pruned of what ended before `now`) and this replica's address into `l`.
pub fn annotate(l: &mut Lease, applying: &Applying, address: &str, now: f64) {
    let live: Applying =
        applying.iter().filter(|(_, s)| s.until > now).map(|(n, s)| (n.clone(), s.clone())).collect();
    let a = l.metadata.annotations.get_or_insert_with(BTreeMap::new);
    if live.is_empty() {
        a.remove(APPLYING);
    } else {
        a.insert(APPLYING.into(), serde_json::to_string(&live).unwrap_or_default());
    }
    if !address.is_empty() {
        a.insert(HOLDER_ADDRESS.into(), address.to_owned());
    }
}

/// Why this replica (`me`) may not send `node` a step at `now` (another replica's step there may
/// still run), or `None`.
pub fn blocked(applying: &Applying, node: &str, me: &str, now: f64) -> Option<String> {
    let s = applying.get(node).filter(|s| s.by != me && s.until > now)?;
    Some(format!(
        "replica {} sent node {node} a step that may still run for {:.0} s (its Apply was cut off when it lost the \
         apply Lease, and the agent finishes a step it has started): nothing is sent to {node} before then",
        s.by,
        s.until - now
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_in_flight_blocks_other_replicas_until_it_ends_and_expired_ones_are_dropped() {
        let mut l = Lease::default();
        let mut a = Applying::new();
        a.insert("node-a".into(), InFlight { by: "replica-0".into(), until: 1_000.0 });
        a.insert("node-b".into(), InFlight { by: "replica-0".into(), until: 500.0 });
        annotate(&mut l, &a, "10.0.0.5:9444", 600.0);
        let s = seen(Some(&l));
        assert_eq!(s.holder_address, "10.0.0.5:9444");
        assert_eq!(s.applying.keys().collect::<Vec<_>>(), ["node-a"], "node-b's step ended at 500");
        let why = blocked(&s.applying, "node-a", "replica-1", 900.0).expect("blocked");
        assert!(why.contains("replica-0") && why.contains("100 s"), "{why}");
        assert!(blocked(&s.applying, "node-a", "replica-0", 900.0).is_none(), "its own step");
        assert!(blocked(&s.applying, "node-a", "replica-1", 1_001.0).is_none(), "over");
        assert!(blocked(&s.applying, "node-c", "replica-1", 900.0).is_none());
        annotate(&mut l, &Applying::new(), "", 600.0);
        assert!(applying(&l).is_empty());
    }
}
