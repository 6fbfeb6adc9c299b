//! What a plan's steps remove besides their own device (an NVMe controller's other namespaces,
//! the partitions of a disk, an iSCSI session's disks): [`removed_by`] and [`plan_scope`] say
//! what, so the engine can widen the scan to all of it and hold every device a step removes to
//! the same gates.

use crate::graph::DeviceGraph;
use crate::model::DevNum;
use crate::plan::{Action, Plan, Step};

/// Every device `step` removes, as `graph` shows the host: its own device and, besides it, every
/// namespace device of the NVMe controller it deletes (heads, namespaces without multipath,
/// hidden paths), every disk of the iSCSI session it logs out; then, transitively, the
/// partitions and stacked devices of each (what a removal takes along or what stopping a map's
/// queueing fails the I/O of). A mount release removes no device.
pub fn removed_by(step: &Step, graph: &DeviceGraph) -> Vec<DevNum> {
    let mut out = Vec::new();
    match &step.action {
        Action::DetachMount { .. } => return out,
        Action::NvmeDeleteController { controller, .. } => {
            out.push(step.devnum);
            out.extend(
                graph
                    .devices
                    .iter()
                    .filter(|e| {
                        e.nvme.as_ref().is_some_and(|v| v.controllers.iter().any(|c| &c.name == controller))
                    })
                    .map(|e| e.device.devnum),
            );
        }
        Action::IscsiLogout { sid, .. } => {
            out.push(step.devnum);
            let session = format!("session{sid}");
            out.extend(
                graph
                    .devices
                    .iter()
                    .filter(|e| crate::plan::iscsi::session_of(e) == Some(session.as_str()))
                    .map(|e| e.device.devnum),
            );
        }
        _ => out.push(step.devnum),
    }
    with_stacked(graph, out)
}

/// The scope a plan's scan must cover: its device and everything its steps remove
/// ([`removed_by`]), each with what is stacked on it. Sorted, without duplicates.
pub fn plan_scope(plan: &Plan, graph: &DeviceGraph) -> Vec<DevNum> {
    let mut out = with_stacked(graph, vec![plan.devnum]);
    for s in &plan.steps {
        out.extend(removed_by(s, graph));
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// What a plan's steps remove that no step of its own acts on: an NVMe controller's other
/// namespaces, the partitions of a disk, a session's other disks. Each must be seen, unheld and
/// pass the gates, since nothing else in the plan looks at it. With the step that removes it.
pub fn side_effects<'p>(plan: &'p Plan, graph: &DeviceGraph) -> Vec<(DevNum, &'p Step)> {
    let mut out: Vec<(DevNum, &Step)> = Vec::new();
    for s in &plan.steps {
        for d in removed_by(s, graph) {
            if d != plan.devnum
                && !plan.steps.iter().any(|o| o.devnum == d)
                && !out.iter().any(|(x, _)| *x == d)
            {
                out.push((d, s));
            }
        }
    }
    out
}

/// `roots` and, transitively, every device stacked on one of them (partitions, sysfs holders).
fn with_stacked(graph: &DeviceGraph, roots: Vec<DevNum>) -> Vec<DevNum> {
    let mut out: Vec<DevNum> = Vec::new();
    for r in roots {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    let mut i = 0;
    while i < out.len() {
        let cur = out[i];
        i += 1;
        let Some(dev) = graph.get(cur).map(|e| &e.device) else { continue };
        let children: Vec<DevNum> = graph
            .devices
            .iter()
            .filter(|c| c.device.parent.as_ref() == Some(&dev.name) || dev.holders.contains(&c.device.name))
            .map(|c| c.device.devnum)
            .collect();
        for c in children {
            if !out.contains(&c) {
                out.push(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::nvme::CtrlState;
    use crate::graph::nvme::test_support::{ctrl, entries};
    use crate::graph::scan::Scan;
    use crate::graph::DeviceEntry;
    use crate::host::clock::BootTime;
    use crate::model::MountNsId;

    const NQN: &str = "nqn.2026-11.io.blockjanitor:two";

    fn graph(devices: Vec<DeviceEntry>) -> DeviceGraph {
        DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices }
    }

    /// Deleting the controller of one namespace removes the subsystem's other namespace too: it
    /// is in the plan's scope, and a side effect of that step (no step of its own).
    #[test]
    fn the_scope_of_a_controller_deletion_is_every_namespace_it_serves() {
        let e = entries(
            &["nvme0n1", "nvme0n2"],
            vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)],
            Vec::new(),
        );
        let g = graph(e.clone());
        let p = crate::plan::nvme::plan_clean(&e[0], &g);
        assert!(p.refusal.is_none() && p.steps.len() == 1, "{p:?}");
        let (n1, n2) = (e[0].device.devnum, e[1].device.devnum);
        assert_eq!(removed_by(&p.steps[0], &g), vec![n1, n2]);
        let mut want = vec![n1, n2];
        want.sort_unstable();
        assert_eq!(plan_scope(&p, &g), want);
        let side = side_effects(&p, &g);
        assert_eq!(side.len(), 1, "{side:?}");
        assert_eq!(side[0].0, n2);
        assert_eq!(side[0].1, &p.steps[0]);
        // A scan of nvme0n1 alone does not cover it.
        let targeted = Scan {
            scope: Some(vec![n1]),
            ..Scan::complete(g.clone(), BootTime::from_since_boot(std::time::Duration::ZERO))
        };
        assert!(!plan_scope(&p, &g).iter().all(|d| targeted.covers(*d)));
        // A refused plan removes nothing: its scope is its device.
        let mut refused = p.clone();
        refused.refuse("held".into());
        assert_eq!(plan_scope(&refused, &g), vec![n1]);
    }

    /// A release removes no device; partitions and stacked devices go with what they sit on;
    /// a device with a step of its own is not a side effect.
    #[test]
    fn partitions_and_stacked_devices_are_in_the_scope_and_steps_of_their_own_are_not_side_effects() {
        use crate::model::{BlockDevice, DeviceKind, DeviceName};
        let name = |n: &str| DeviceName::new(n).expect("name");
        let disk = BlockDevice {
            holders: vec![name("dm-0")],
            ..BlockDevice::new(name("sda"), DevNum::new(8, 0), DeviceKind::Disk, 1 << 20)
        };
        let part = BlockDevice {
            parent: Some(name("sda")),
            ..BlockDevice::new(name("sda1"), DevNum::new(8, 1), DeviceKind::Partition, 1 << 19)
        };
        let map = BlockDevice::new(name("dm-0"), DevNum::new(254, 0), DeviceKind::Dm, 1 << 20);
        let g = graph(vec![
            DeviceEntry::new(disk, Vec::new()),
            DeviceEntry::new(part, Vec::new()),
            DeviceEntry::new(map, Vec::new()),
        ]);
        let mut p = Plan::new("delete", &g.devices[0]);
        p.steps.push(Step::on(
            &g.devices[0],
            Action::ScsiDelete { wwid: "w".into(), address: "0:0:0:0".into() },
        ));
        assert_eq!(
            removed_by(&p.steps[0], &g),
            vec![DevNum::new(8, 0), DevNum::new(8, 1), DevNum::new(254, 0)]
        );
        let side: Vec<DevNum> = side_effects(&p, &g).into_iter().map(|(d, _)| d).collect();
        assert_eq!(side, vec![DevNum::new(8, 1), DevNum::new(254, 0)]);
        p.steps.insert(0, Step::on(&g.devices[2], Action::DmRemove { uuid: "u".into(), deferred: false }));
        let side: Vec<DevNum> = side_effects(&p, &g).into_iter().map(|(d, _)| d).collect();
        assert_eq!(side, vec![DevNum::new(8, 1)], "the map has its own step");
        let release = Step::on(
            &g.devices[0],
            Action::DetachMount {
                namespace: MountNsId(9),
                via: crate::discover::namespaces::NsEntry::Task { pid: 1, tid: 1 },
                mount_id: 1,
                mount_dev: DevNum::new(8, 0),
                mount_point: "/mnt".into(),
                fstype: "ext4".into(),
            },
        );
        assert!(removed_by(&release, &g).is_empty());
    }
}
