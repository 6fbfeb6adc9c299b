//! The verdict of an rbd mapping: a candidate once nothing holds it; a mapping the cluster
//! fenced (blocklisted) is dead, and says so.

use super::Assessment;
use crate::discover::rbd::RbdMapping;
use crate::graph::DeviceEntry;

/// Why a held rbd mapping cannot simply be unmapped: the cluster fenced it.
pub(super) fn fenced_while_held(e: &DeviceEntry) -> Option<String> {
    let line = e.rbd.as_ref().and_then(|r| r.fenced.as_ref())?;
    Some(format!("fenced at the cluster ({line}): release its holders, then unmap it"))
}

/// An unheld rbd mapping's assessment.
pub(super) fn assess(e: &DeviceEntry, r: &RbdMapping) -> Assessment {
    let d = &e.device;
    let fenced = if r.fenced.is_some() {
        "; the cluster fenced this client (blocklisted): the mapping is dead"
    } else {
        ""
    };
    Assessment::Candidate(format!(
        "nothing holds {} (rbd {}/{}, {} at {}: no mount in any namespace, no open fd) for {{age}}{fenced}",
        d.name, r.pool, r.image, r.watcher_client, r.client_addr
    ))
}
