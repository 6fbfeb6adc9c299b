//! NVMe over Fabrics in the graph, the verdicts and the plans: what a namespace block device is
//! (a native-multipath head, one of its hidden per-path devices, or a namespace without
//! multipath), the controllers serving it, and what the agent may do about a controller stuck
//! reconnecting. Pure: from the graph's [`NvmeView`]s, without further I/O.
//!
//! A controller is addressed through the plan of its namespace's block device: the plan of a
//! head (or of a namespace without multipath) ends with one `nvme_delete_controller` step per
//! controller serving it, each carrying the controller's identity (name, subsystem NQN,
//! transport, target address, cntlid). Never while any controller of the subsystem is live,
//! while any namespace going with those controllers is held, or while the outage guard says the
//! whole target is down. A mount of a namespace with no live path is never released by the
//! agent: unmounting flushes to a device whose I/O queues until a path comes back (with
//! `ctrl_loss_tmo` off, forever), so the plan is refused instead (fail closed).

use crate::graph::identity::Identity;
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::{DeviceName, HolderKind};
use crate::plan::step::{Action, LeftAlone, Plan, Step};

pub use crate::graph::nvme::{view, NvmeRole, NvmeView};

/// The verdict's ingredients for an NVMe namespace, for `policy`.
pub enum Assessment {
    /// A final verdict: in use (`true`) or not a candidate (`false`: unused, or unknown when
    /// `unknown` is set), with reasons.
    Final { in_use: bool, unknown: bool, reasons: Vec<String> },
    /// A cleanup candidate, with `{age}` where the time goes.
    Candidate(String),
    /// A hidden path: follows its head.
    PathOf(DeviceName),
}

/// Judges an NVMe namespace (`None`: not a fabrics namespace; the generic rules apply).
pub fn assess(e: &DeviceEntry) -> Option<Assessment> {
    let v = e.nvme.as_ref()?;
    let d = &e.device;
    if v.role == NvmeRole::Path {
        return v.head.clone().map(Assessment::PathOf);
    }
    if !v.fabrics() {
        return None;
    }
    let holders: Vec<String> = e.holders.iter().map(Holder::describe).collect();
    let what = format!("{} (NVMe subsystem {})", d.name, v.subsysnqn);
    if v.live > 0 {
        let mut reasons = holders;
        reasons.push(format!(
            "{what}: {} of {} controller(s) live ({}): a namespace with a live path is never stale",
            v.live,
            v.controllers.len(),
            v.describe_controllers()
        ));
        return Some(Assessment::Final { in_use: !e.holders.is_empty(), unknown: false, reasons });
    }
    if v.controllers.is_empty() {
        return Some(Assessment::Final {
            in_use: !e.holders.is_empty(),
            unknown: false,
            reasons: vec![format!("{what}: no controller left; nothing for the agent to delete")],
        });
    }
    if let Some(o) = &v.outage {
        let mut reasons = vec![format!(
            "outage: every controller to {} is down at once ({}): an array or network outage, not a stale controller; nothing behind it is cleaned",
            o.target,
            o.controllers.join(", ")
        )];
        reasons.extend(holders);
        return Some(Assessment::Final {
            in_use: !e.holders.is_empty(),
            unknown: e.holders.is_empty(),
            reasons,
        });
    }
    if v.controllers.iter().any(|c| {
        matches!(
            c.state,
            crate::discover::nvme::CtrlState::Deleting | crate::discover::nvme::CtrlState::DeletingNoio
        )
    }) {
        return Some(Assessment::Final {
            in_use: !e.holders.is_empty(),
            unknown: false,
            reasons: vec![format!(
                "{what}: the kernel is deleting its controller(s) ({})",
                v.describe_controllers()
            )],
        });
    }
    if !e.holders.is_empty() {
        let mut reasons = holders;
        let foreign = e.holders.iter().any(Holder::is_foreign_mount);
        reasons.push(format!(
            "{what}: no live controller ({}), but it is still in use{}",
            v.describe_controllers(),
            if foreign {
                "; a mount of it is not released by the agent: unmounting flushes to a namespace with no live path, whose I/O queues until a path returns, so the release could hang: refused (fail closed)"
            } else {
                ""
            }
        ));
        return Some(Assessment::Final { in_use: true, unknown: false, reasons });
    }
    if !v.siblings_held.is_empty() {
        let mut reasons = v.siblings_held.clone();
        reasons.push(format!(
            "{what}: no live controller ({}), but deleting its controller(s) would remove a namespace in use",
            v.describe_controllers()
        ));
        return Some(Assessment::Final { in_use: true, unknown: false, reasons });
    }
    Some(Assessment::Candidate(format!(
        "{what}: no live controller ({}) and nothing holds it for {{age}}",
        v.describe_controllers()
    )))
}

/// Why `release` must not detach a foreign mount of this device: it is an NVMe-oF namespace
/// with no live controller, and unmounting flushes to it (the I/O queues until a path returns).
pub fn release_refusal(entry: &DeviceEntry) -> Option<String> {
    let v = entry.nvme.as_ref()?;
    if !v.fabrics() || v.live > 0 || !entry.holders.iter().any(Holder::is_foreign_mount) {
        return None;
    }
    Some(format!(
        "{}: no live controller ({}): unmounting would flush to a namespace whose I/O queues until a path returns, so the release could hang: refused (fail closed)",
        entry.device.name,
        v.describe_controllers()
    ))
}

fn refused(mut p: Plan, why: String) -> Plan {
    p.refuse(why);
    p
}

/// The plan of an NVMe namespace: delete every controller serving it (its namespaces go with
/// them). Refused while any controller is live, during an outage, while it or a namespace going
/// with it is held (a mount included: see the module docs), and for PCIe controllers.
pub fn plan_clean(entry: &DeviceEntry, _graph: &DeviceGraph) -> Plan {
    let d = &entry.device;
    let mut p = Plan::new("clean", entry);
    let Some(v) = &entry.nvme else {
        p.refuse(format!("{} is not an NVMe namespace", d.name));
        p.unsupported = true;
        return p;
    };
    if v.role == NvmeRole::Path {
        let head = v.head.as_ref().map_or("?", |h| h.as_str());
        return refused(
            p,
            format!(
                "{} is a hidden path of {head}: clean the head, whose plan deletes its controllers",
                d.name
            ),
        );
    }
    if !v.fabrics() {
        p.refuse(format!("{}: its controller is not over a fabric (PCIe): never deleted", d.name));
        p.unsupported = true;
        return p;
    }
    if v.live > 0 {
        return refused(p, format!(
            "{}: {} controller(s) live ({}): a controller is never deleted while any path of its subsystem is live",
            d.name, v.live, v.describe_controllers()
        ));
    }
    if let Some(o) = &v.outage {
        return refused(
            p,
            format!(
            "{}: outage: every controller to {} is down at once ({}): nothing is cleaned during an outage",
            d.name, o.target, o.controllers.join(", ")
        ),
        );
    }
    if !entry.holders.is_empty() {
        p.left_alone = entry
            .holders
            .iter()
            .map(|h| {
                let why = if h.kind == HolderKind::Mount && h.is_foreign_mount() {
                    format!("{}: not released: unmounting flushes to a namespace with no live path, which could hang", h.describe())
                } else {
                    h.describe()
                };
                LeftAlone { holder: h.clone(), reason: why }
            })
            .collect();
        let n = entry.holders.len();
        return refused(
            p,
            format!(
                "{} is still held by {n} holder(s): its controller(s) are never deleted under it",
                d.name
            ),
        );
    }
    if !v.siblings_held.is_empty() {
        return refused(p, format!("{}: {}", d.name, v.siblings_held.join("; ")));
    }
    for c in &v.controllers {
        p.steps.push(Step {
            device: d.name.clone(),
            devnum: d.devnum,
            identity: Identity::of(entry),
            action: Action::NvmeDeleteController {
                controller: c.name.clone(),
                subsysnqn: c.subsysnqn.clone(),
                transport: c.transport.clone(),
                address: c.address.target(),
                cntlid: c.cntlid,
            },
        });
    }
    if !v.siblings.is_empty() {
        p.notes.push(format!(
            "deleting the controller(s) also removes {}",
            v.siblings.iter().map(DeviceName::as_str).collect::<Vec<_>>().join(", ")
        ));
    }
    p
}

/// Entries and controllers for tests here and in other modules (metrics).
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::discover::nvme::{CtrlState, NvmeAddress, NvmeController, NvmeScan, NvmeSubsystem, Timeout};
    use crate::model::{BlockDevice, DevNum, DeviceKind};

    pub(crate) fn ctrl(name: &str, nqn: &str, port: &str, state: CtrlState, fabrics: bool) -> NvmeController {
        NvmeController {
            name: name.into(),
            transport: if fabrics { "tcp" } else { "pcie" }.into(),
            subsysnqn: nqn.into(),
            address: NvmeAddress::parse(&format!("traddr=127.0.0.1,trsvcid={port}")),
            state,
            ctrl_loss_tmo: fabrics.then_some(Timeout::Off),
            reconnect_delay: fabrics.then_some(Timeout::Seconds(1)),
            cntlid: Some(1),
            hostnqn: None,
            subsystem: Some("nvme-subsys0".into()),
            namespaces: Vec::new(),
            fabrics,
        }
    }

    pub(crate) fn name(n: &str) -> DeviceName {
        DeviceName::new(n).expect("name")
    }

    /// The graph's entries for the heads of one subsystem served by `ctrls`.
    pub(crate) fn entries(
        heads: &[&str],
        ctrls: Vec<NvmeController>,
        extra: Vec<NvmeController>,
    ) -> Vec<DeviceEntry> {
        let subsys = NvmeSubsystem {
            name: "nvme-subsys0".into(),
            subsysnqn: ctrls[0].subsysnqn.clone(),
            iopolicy: Some("numa".into()),
            controllers: ctrls.iter().map(|c| c.name.clone()).collect(),
            heads: heads.iter().map(|h| name(h)).collect(),
        };
        let scan =
            NvmeScan { controllers: ctrls.into_iter().chain(extra).collect(), subsystems: vec![subsys] };
        let outages = crate::discover::nvme::outages(&scan);
        let mut out: Vec<DeviceEntry> = heads
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let devnum = DevNum::new(259, i as u32 * 2 + 1);
                let device = BlockDevice {
                    diskseq: Some(14 + i as u64),
                    ..BlockDevice::new(name(h), devnum, DeviceKind::NvmeNamespace, 16 << 20)
                };
                let nvme = view(&scan, &outages, &device);
                DeviceEntry { nvme, ..DeviceEntry::new(device, Vec::new()) }
            })
            .collect();
        crate::graph::mark_held_siblings(&mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{ctrl, entries};
    use super::*;
    use crate::discover::nvme::CtrlState;
    use crate::model::{KernelText, MountNsId};

    fn graph(devices: Vec<DeviceEntry>) -> DeviceGraph {
        DeviceGraph { host_ns: MountNsId(1), host_ns_unsure: None, devices }
    }

    fn foreign_mount() -> Holder {
        let mut h = Holder::bare(HolderKind::Mount);
        h.mount_namespace = Some(MountNsId(7));
        h.in_host_namespace = Some(false);
        h.mount_point = Some(KernelText::from("/mnt/b"));
        h.mount_id = Some(40);
        h
    }

    const NQN: &str = "nqn.2026-11.io.blockjanitor:a";

    #[test]
    fn a_controller_reconnecting_for_ever_with_nothing_on_it_is_a_candidate_and_planned_for_deletion() {
        let e =
            entries(&["nvme0n1"], vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)], Vec::new());
        let Some(Assessment::Candidate(text)) = assess(&e[0]) else { panic!("not a candidate") };
        assert!(
            text.contains("no live controller (nvme0 connecting to traddr=127.0.0.1,trsvcid=4420"),
            "{text}"
        );
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.refusal.is_none(), "{p:?}");
        assert_eq!(p.steps.len(), 1);
        assert_eq!(
            p.steps[0].action,
            Action::NvmeDeleteController {
                controller: "nvme0".into(),
                subsysnqn: NQN.into(),
                transport: "tcp".into(),
                address: "traddr=127.0.0.1,trsvcid=4420".into(),
                cntlid: Some(1),
            }
        );
        assert_eq!(p.steps[0].identity, Identity::of(&e[0]));
    }

    #[test]
    fn any_live_path_makes_it_never_stale_and_refuses_the_plan() {
        let e = entries(
            &["nvme0n1"],
            vec![
                ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true),
                ctrl("nvme1", NQN, "4421", CtrlState::Live, true),
            ],
            Vec::new(),
        );
        assert!(matches!(assess(&e[0]), Some(Assessment::Final { in_use: false, unknown: false, .. })));
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.steps.is_empty() && p.refusal.as_deref().is_some_and(|r| r.contains("live")), "{p:?}");
    }

    #[test]
    fn a_foreign_mount_is_never_released_nor_deleted_under() {
        let mut e =
            entries(&["nvme0n1"], vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)], Vec::new());
        e[0].holders.push(foreign_mount());
        let Some(Assessment::Final { in_use: true, reasons, .. }) = assess(&e[0]) else {
            panic!("not in use")
        };
        assert!(reasons.last().is_some_and(|r| r.contains("not released by the agent")), "{reasons:?}");
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.steps.is_empty() && p.refusal.is_some(), "{p:?}");
        assert!(p.left_alone[0].reason.contains("not released"), "{p:?}");
        assert!(release_refusal(&e[0]).is_some_and(|r| r.contains("could hang")));
    }

    #[test]
    fn a_held_namespace_of_the_same_subsystem_keeps_the_other_in_use() {
        let mut e = entries(
            &["nvme0n1", "nvme0n2"],
            vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)],
            Vec::new(),
        );
        e[1].holders.push(foreign_mount());
        crate::graph::mark_held_siblings(&mut e);
        let Some(Assessment::Final { in_use: true, reasons, .. }) = assess(&e[0]) else {
            panic!("not in use")
        };
        assert!(reasons[0].starts_with("nvme0n2, which goes with the same controller(s)"), "{reasons:?}");
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.steps.is_empty() && p.refusal.is_some(), "{p:?}");
    }

    #[test]
    fn every_controller_to_the_array_down_is_an_outage_and_nothing_is_cleaned() {
        // Another subsystem behind the same address is down too.
        let e = entries(
            &["nvme0n1"],
            vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)],
            vec![ctrl("nvme1", "nqn.2026-11.io.blockjanitor:c", "4421", CtrlState::Connecting, true)],
        );
        let Some(Assessment::Final { unknown: true, reasons, .. }) = assess(&e[0]) else {
            panic!("not unknown")
        };
        assert!(
            reasons[0].starts_with("outage: every controller to traddr=127.0.0.1 (tcp) is down"),
            "{reasons:?}"
        );
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.steps.is_empty() && p.refusal.as_deref().is_some_and(|r| r.contains("outage")), "{p:?}");
    }

    #[test]
    fn pcie_controllers_are_never_touched() {
        let e = entries(&["nvme0n1"], vec![ctrl("nvme0", NQN, "x", CtrlState::Dead, false)], Vec::new());
        assert!(assess(&e[0]).is_none(), "the generic rules judge it");
        let p = plan_clean(&e[0], &graph(e.clone()));
        assert!(p.unsupported && p.steps.is_empty(), "{p:?}");
    }
}
