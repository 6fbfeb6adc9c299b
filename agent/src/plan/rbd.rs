//! Unmapping an rbd image or disconnecting an nbd device (the `unmap` of `clean`): its foreign
//! mounts released first; anything else that holds it refuses the plan.

use super::release::release_then;
use crate::graph::DeviceEntry;
use crate::plan::step::{Action, Plan};

/// Unmapping an rbd image or disconnecting an nbd device: its mounts in other namespaces are
/// released first; anything else that holds it refuses the plan.
pub fn unmap(entry: &DeviceEntry, force: bool) -> Plan {
    let d = &entry.device;
    if let Some(r) = &entry.rbd {
        let last = Action::RbdUnmap {
            id: r.id,
            pool: r.pool.clone(),
            image: r.image.clone(),
            image_id: r.image_id.clone(),
            force,
        };
        return release_then(entry, "unmap", last);
    }
    if let Some(n) = &entry.nbd {
        return release_then(
            entry,
            "unmap",
            Action::NbdDisconnect { server_pid: n.pid, backend: n.backend.clone() },
        );
    }
    let mut p = Plan::new("unmap", entry);
    p.unsupported(format!("{} is neither an rbd nor a connected nbd device", d.name));
    p
}
