//! The outage guard, for any storage transport (iSCSI sessions, NVMe-oF controllers): when
//! every transport object to one target, or to one portal (address), is down at the same
//! time, that is an array or network outage, not staleness. Devices behind such a group are
//! reported (verdict `outage`, a metric) and never cleaned; their grace clocks stop.
//!
//! Pure: the caller hands in each object with its target, its address and whether the kernel
//! says it is live; the groups that are wholly down come out. A group is formed per target and
//! per address; an object whose address is unknown is grouped by its target only.

use std::collections::BTreeMap;

use serde::Serialize;

/// One transport object (an iSCSI session, an NVMe-oF controller) as the guard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportObject {
    /// Its kernel name (`session3`, `nvme2`).
    pub id: String,
    /// What it is connected to (target IQN, subsystem NQN).
    pub target: String,
    /// Where (`ADDRESS:PORT`); `None` when unknown.
    pub address: Option<String>,
    /// The kernel says it works (logged in, connections up, disks not blocked).
    pub live: bool,
}

/// How objects are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// Every object to one target is down.
    Target,
    /// Every object to one portal (address) is down.
    Portal,
}

impl Scope {
    pub const ALL: [Scope; 2] = [Scope::Target, Scope::Portal];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Target => "target",
            Self::Portal => "portal",
        }
    }
}

/// A group wholly down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Outage {
    pub scope: Scope,
    /// The target name or the address.
    pub key: String,
    /// The objects of the group, sorted.
    pub members: Vec<String>,
}

impl Outage {
    /// One line for a verdict: `outage: every iSCSI session to portal 10.0.0.1:3260 is down
    /// (session1, session2): an array or network outage, not staleness; nothing is cleaned`.
    pub fn describe(&self, noun: &str) -> String {
        let every =
            if self.members.len() == 1 { format!("the only {noun}") } else { format!("every {noun}") };
        format!(
            "outage: {every} to {} {} is down ({}): an array or network outage, not staleness; nothing is cleaned",
            self.scope.as_str(),
            self.key,
            self.members.join(", ")
        )
    }

    pub fn contains(&self, id: &str) -> bool {
        self.members.iter().any(|m| m == id)
    }
}

/// The groups (by target, then by portal) in which no object is live, sorted by scope and key.
pub fn find(objects: &[TransportObject]) -> Vec<Outage> {
    let mut groups: BTreeMap<(Scope, String), (Vec<String>, bool)> = BTreeMap::new();
    for o in objects {
        let mut keys = vec![(Scope::Target, o.target.clone())];
        if let Some(a) = &o.address {
            keys.push((Scope::Portal, a.clone()));
        }
        for k in keys {
            let g = groups.entry(k).or_insert_with(|| (Vec::new(), false));
            g.0.push(o.id.clone());
            g.1 |= o.live;
        }
    }
    groups
        .into_iter()
        .filter(|(_, (members, any_live))| !members.is_empty() && !any_live)
        .map(|((scope, key), (mut members, _))| {
            members.sort();
            members.dedup();
            Outage { scope, key, members }
        })
        .collect()
}

/// The widest outage `id` is part of: the group with the most members, a portal before a
/// target on a tie (a portal down takes every target behind it).
pub fn of<'a>(outages: &'a [Outage], id: &str) -> Option<&'a Outage> {
    outages.iter().filter(|o| o.contains(id)).max_by_key(|o| (o.members.len(), o.scope == Scope::Portal))
}

/// How many groups of each scope are down, every scope present (for the metric).
pub fn count_by_scope(outages: &[Outage]) -> [(Scope, usize); 2] {
    Scope::ALL.map(|s| (s, outages.iter().filter(|o| o.scope == s).count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn o(id: &str, target: &str, address: Option<&str>, live: bool) -> TransportObject {
        TransportObject { id: id.into(), target: target.into(), address: address.map(Into::into), live }
    }

    #[test]
    fn a_live_member_keeps_a_group_up() {
        let objs = [
            o("session1", "iqn.a", Some("10.0.0.1:3260"), false),
            o("session2", "iqn.a", Some("10.0.0.2:3260"), true),
            o("session3", "iqn.b", Some("10.0.0.1:3260"), true),
        ];
        assert!(find(&objs).is_empty(), "iqn.a has a live path, the portal a live session");
    }

    #[test]
    fn a_portal_down_is_an_outage_of_each_target_behind_it() {
        let objs = [
            o("session1", "iqn.a", Some("10.0.0.1:3260"), false),
            o("session2", "iqn.b", Some("10.0.0.1:3260"), false),
            o("session3", "iqn.c", Some("10.0.0.2:3260"), true),
        ];
        let out = find(&objs);
        let keys: Vec<(Scope, &str)> = out.iter().map(|x| (x.scope, x.key.as_str())).collect();
        assert_eq!(
            keys,
            [(Scope::Target, "iqn.a"), (Scope::Target, "iqn.b"), (Scope::Portal, "10.0.0.1:3260")]
        );
        assert_eq!(out[2].members, ["session1", "session2"]);
        assert_eq!(of(&out, "session2").map(|o| o.scope), Some(Scope::Portal), "the widest group");
        assert!(of(&out, "session3").is_none());
        assert_eq!(count_by_scope(&out), [(Scope::Target, 2), (Scope::Portal, 1)]);
        let line = out[2].describe("iSCSI session");
        assert!(
            line.starts_with(
                "outage: every iSCSI session to portal 10.0.0.1:3260 is down (session1, session2)"
            ),
            "{line}"
        );
        assert!(out[0].describe("iSCSI session").contains("the only iSCSI session to target iqn.a"));
    }

    #[test]
    fn an_unknown_address_groups_by_target_only() {
        let objs = [o("nvme1", "nqn.x", None, false), o("nvme2", "nqn.x", None, true)];
        assert!(find(&objs).is_empty());
        let out = find(&[o("nvme1", "nqn.x", None, false)]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].scope, Scope::Target);
        let one = find(&[o("session1", "iqn.a", Some("10.0.0.1:3260"), false)]);
        assert_eq!(of(&one, "session1").map(|o| o.scope), Some(Scope::Portal), "a tie goes to the portal");
        assert!(find(&[]).is_empty());
    }
}
