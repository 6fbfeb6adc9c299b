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

use crate::graph::{DeviceEntry, Holder};
use crate::model::DeviceName;

use crate::graph::nvme::NvmeRole;

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

/// The NVMe rules' assessment in the terms of every transport's, `None` when they do not judge
/// the device (not an NVMe-oF namespace).
pub(super) fn judge(e: &DeviceEntry) -> Option<super::Assessment> {
    let a = assess(e)?;
    Some(match a {
        Assessment::PathOf(head) => super::Assessment::PathOf(head),
        Assessment::Candidate(text) => super::Assessment::Candidate(text),
        Assessment::Final { in_use, unknown, reasons } => super::fin(
            if in_use {
                super::Verdict::InUse
            } else if unknown && e.nvme.as_ref().is_some_and(|n| n.outage.is_some()) {
                // Every controller to its target is down at once: the transports' outage guard.
                super::Verdict::Outage
            } else if unknown {
                super::Verdict::Unknown
            } else {
                super::Verdict::Unused
            },
            reasons,
        ),
    })
}

#[cfg(test)]
#[path = "nvme_tests.rs"]
mod tests;
