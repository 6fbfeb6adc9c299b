//! Planning iSCSI logouts: a session whose disks a plan deletes is logged out after them
//! (delete first, then log out: the other order leaves the kernel retrying I/O on a session that
//! is gone). Pure, like [`crate::plan`].
//!
//! Plans are made per block device, and a session may carry several disks, each deleted by its
//! own plan. The logout rides on the plan of the session's last disk (by name) among those that
//! go: a multipath teardown's paths, or, for a standalone disk, every disk of its session that is
//! offline with nothing holding it (each of those is deleted by its own plan, which runs only once
//! it is stale). The step carries the session's identity (SID, target, portal, iface); the
//! actuator refuses it unless, right before it runs, the session still exists with that target
//! and portal and no SCSI device is left on it (a sibling not deleted yet keeps it logged in,
//! and the next scan plans it again).

use crate::discover::scsi::Transport;
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::DeviceName;
use crate::plan::step::{Action, Step};

/// The iSCSI session a disk goes through (`session<SID>`).
pub(crate) fn session_of(e: &DeviceEntry) -> Option<&str> {
    match e.scsi.as_ref().map(|s| &s.disk.transport) {
        Some(Transport::Iscsi { session }) => Some(session),
        _ => None,
    }
}

/// The disks of `entry`'s session that go when it is deleted on its own: itself, and every
/// other disk of the session that is dead (offline, or its LUN reported gone) with nothing
/// holding it and no map on top.
pub fn going_with(entry: &DeviceEntry, graph: &DeviceGraph) -> Vec<DeviceName> {
    let mut out = vec![entry.device.name.clone()];
    let Some(session) = session_of(entry) else { return out };
    for e in &graph.devices {
        if e.device.name == entry.device.name || session_of(e) != Some(session) {
            continue;
        }
        let Some(s) = &e.scsi else { continue };
        if s.is_dead() && s.path_of.is_none() && e.holders.is_empty() {
            out.push(e.device.name.clone());
        }
    }
    out
}

/// Logout steps for the sessions of the `deleted` disks that have no disk left once every disk
/// in `gone` is deleted, each on the plan that deletes the session's last such disk; and notes
/// for those that cannot be logged out (identity unknown) or are left to another plan.
pub fn logouts(graph: &DeviceGraph, deleted: &[DeviceName], gone: &[DeviceName]) -> (Vec<Step>, Vec<String>) {
    let mut sessions: Vec<&str> =
        graph.devices.iter().filter(|e| deleted.contains(&e.device.name)).filter_map(session_of).collect();
    sessions.sort_unstable();
    sessions.dedup();
    let (mut steps, mut notes) = (Vec::new(), Vec::new());
    for name in sessions {
        let disks: Vec<&DeviceEntry> = graph.devices.iter().filter(|e| session_of(e) == Some(name)).collect();
        if !disks.iter().all(|e| gone.contains(&e.device.name)) {
            continue; // a disk stays: the session keeps serving it
        }
        // The carrier: the last disk of the session, by name, that this plan deletes.
        let Some(last) = disks.iter().map(|e| &e.device.name).max() else { continue };
        let Some(carrier) = disks.iter().find(|e| &e.device.name == last && deleted.contains(last)) else {
            notes.push(format!(
                "iSCSI {name} has no LUN left once its disks are deleted: the plan of {last} logs it out"
            ));
            continue;
        };
        let Some(session) = carrier.scsi.as_ref().and_then(|s| s.session.as_ref()) else {
            notes.push(format!("iSCSI {name} is not in sysfs any more: nothing to log out"));
            continue;
        };
        let Some(portal) = session.detail.portal() else {
            notes.push(format!(
                "iSCSI {name} has no LUN left after this, but its portal is unknown (no connection in sysfs): it is not logged out"
            ));
            continue;
        };
        steps.push(Step::on(
            carrier,
            Action::IscsiLogout {
                sid: session.detail.sid,
                target: session.targetname.clone(),
                portal,
                iface: session.detail.ifacename.clone().unwrap_or_else(|| "default".into()),
            },
        ));
    }
    (steps, notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::world::{LinuxWorld, World};
    use crate::graph::scan::Target;
    use crate::host::HostRoot;
    use crate::snapshot::ScanOptions;

    const ISCSI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/iscsi");

    fn graph() -> DeviceGraph {
        let world =
            LinuxWorld::new(HostRoot::new(ISCSI), ScanOptions::default(), std::time::Duration::from_secs(5));
        world.scan(Target::All).expect("scan").graph
    }

    fn name(n: &str) -> DeviceName {
        DeviceName::new(n).expect("name")
    }

    fn entry<'a>(g: &'a DeviceGraph, n: &str) -> &'a DeviceEntry {
        g.devices.iter().find(|e| e.device.name.as_str() == n).expect(n)
    }

    #[test]
    fn the_last_disk_of_a_session_carries_its_logout() {
        let g = graph();
        let sde = entry(&g, "sde");
        assert_eq!(going_with(sde, &g), [name("sde"), name("sdf")]);
        let (steps, notes) = logouts(&g, &[name("sde")], &going_with(sde, &g));
        assert!(steps.is_empty());
        assert_eq!(
            notes,
            ["iSCSI session4 has no LUN left once its disks are deleted: the plan of sdf logs it out"]
        );
        let sdf = entry(&g, "sdf");
        let (steps, notes) = logouts(&g, &[name("sdf")], &going_with(sdf, &g));
        assert!(notes.is_empty(), "{notes:?}");
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].device, name("sdf"));
        assert_eq!(
            steps[0].action,
            Action::IscsiLogout {
                sid: 4,
                target: "iqn.2003-01.org.linux-iscsi.store2.x8664:sn.a".into(),
                portal: "192.168.12.31:3260".into(),
                iface: "default".into(),
            }
        );
    }

    /// Issue 17: the logout's step concerns every disk of its session: they are all in the
    /// plan's scope (scanned, held to the gates), and the other disk, which no step of this
    /// plan deletes, is a side effect that must be unheld.
    #[test]
    fn a_logout_scopes_every_disk_of_its_session() {
        let g = graph();
        let sdf = entry(&g, "sdf");
        let (steps, _) = logouts(&g, &[name("sdf")], &going_with(sdf, &g));
        let devnum = |n: &str| entry(&g, n).device.devnum;
        let removed = crate::plan::scope::removed_by(&steps[0], &g);
        assert!(removed.contains(&devnum("sde")) && removed.contains(&devnum("sdf")), "{removed:?}");
        assert!(!removed.contains(&devnum("sdc")), "another session's disk: {removed:?}");
        let mut p = crate::plan::Plan::new("delete", sdf);
        p.steps = steps;
        let side: Vec<_> = crate::plan::scope::side_effects(&p, &g).into_iter().map(|(d, _)| d).collect();
        assert!(side.contains(&devnum("sde")), "{side:?}");
    }

    #[test]
    fn a_session_that_keeps_a_disk_or_is_down_is_not_logged_out() {
        let g = graph();
        // sdc is running: session1 keeps serving it.
        let sdc = entry(&g, "sdc");
        assert_eq!(going_with(sdc, &g), [name("sdc")]);
        assert_eq!(logouts(&g, &[name("sde")], &[name("sde")]), (Vec::new(), Vec::new()), "sdf stays");
        // sdd sits behind an outage: no sibling goes with anything there, and the policy
        // never makes it a candidate (tests/tests/fixtures.rs).
        let sdd = entry(&g, "sdd");
        assert!(sdd.scsi.as_ref().and_then(|s| s.outage.as_ref()).is_some());
    }
}
