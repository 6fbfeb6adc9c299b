//! The NVMe-oF transport's judging and planning, together.

use super::*;
use crate::discover::nvme::CtrlState;
use crate::graph::identity::Identity;
use crate::graph::nvme::test_support::{ctrl, entries};
use crate::graph::{DeviceEntry, DeviceGraph, Holder};
use crate::model::HolderKind;
use crate::model::{KernelText, MountNsId};
use crate::plan::nvme::plan_clean;
use crate::plan::step::Action;

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
    let e = entries(&["nvme0n1"], vec![ctrl("nvme0", NQN, "4420", CtrlState::Connecting, true)], Vec::new());
    let Some(Assessment::Candidate(text)) = assess(&e[0]) else { panic!("not a candidate") };
    assert!(text.contains("no live controller (nvme0 connecting to traddr=127.0.0.1,trsvcid=4420"), "{text}");
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
    let Some(Assessment::Final { in_use: true, reasons, .. }) = assess(&e[0]) else { panic!("not in use") };
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
    let Some(Assessment::Final { in_use: true, reasons, .. }) = assess(&e[0]) else { panic!("not in use") };
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
    let Some(Assessment::Final { unknown: true, reasons, .. }) = assess(&e[0]) else { panic!("not unknown") };
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
