//! Planning the deletion of an NVMe-oF controller whose namespaces are stale (its verdict is
//! [`crate::judge::nvme`]'s); refused, never guessed, when anything could still need it.

use crate::graph::identity::Identity;
use crate::graph::nvme::NvmeRole;
use crate::graph::{DeviceEntry, DeviceGraph};
use crate::model::{DeviceName, HolderKind};
use crate::plan::step::{Action, LeftAlone, Plan, Step};

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
