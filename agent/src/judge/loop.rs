//! The verdict of a loop device (and of any other mapping the agent may clean, rbd and nbd
//! once they got here): a candidate once nothing holds it.

use super::{fin, Assessment, Verdict};
use crate::graph::DeviceEntry;
use crate::model::DeviceKind;

/// An unheld device's assessment when no transport claimed it. A loop device the kernel keeps
/// bound with autoclear set is open somewhere: the kernel detaches such a device at its last
/// close, so while it is bound an opener the scan does not see holds it (an fd in flight over
/// a unix socket, an io_uring fixed file; after a `LOOP_CLR_FD` the kernel deferred, gotcha 19).
pub(super) fn assess(e: &DeviceEntry) -> Assessment {
    let d = &e.device;
    if d.loop_info.as_ref().is_some_and(|l| l.autoclear) {
        return fin(
            Verdict::InUse,
            vec![format!(
                "the kernel keeps {} bound with autoclear set, so something has it open (it detaches at the last close), although the scan sees no holder: an fd in flight over a unix socket, an io_uring fixed file, or a detach already deferred; find the opener (fuser -v /dev/{})",
                d.name, d.name
            )],
        );
    }
    if !is_mapping(e) {
        return fin(Verdict::Unused, vec![format!("nothing holds {}; {}", d.name, why_not_cleaned(e))]);
    }
    Assessment::Candidate(format!(
        "nothing holds {} (no mount in any namespace, no open fd, no swap, nothing stacked on it) for {{age}}",
        d.name
    ))
}

/// Why an unheld device that no transport claimed is not cleaned, in the words of what it is.
fn why_not_cleaned(e: &DeviceEntry) -> String {
    let d = &e.device;
    match d.kind {
        DeviceKind::Loop => "it is an unbound loop device (no backing file): there is nothing to detach".to_owned(),
        DeviceKind::Rbd | DeviceKind::Nbd => {
            format!("an {} device of size 0 maps nothing (disconnected, or being unmapped): there is nothing to unmap", d.kind.as_str())
        }
        _ => match crate::graph::stack::layer_of(d) {
            Some(layer) => format!(
                "a {} layer is removed only with the map or disk under it, when that is cleaned, never on its own",
                layer.kind().as_str()
            ),
            None => format!("a {} is not something the agent cleans", d.kind.as_str()),
        },
    }
}

/// Kinds the agent may clean once stale.
pub(super) fn is_mapping(e: &DeviceEntry) -> bool {
    match e.device.kind {
        DeviceKind::Loop => e.device.loop_info.is_some(),
        DeviceKind::Rbd | DeviceKind::Nbd => e.device.size_bytes > 0,
        _ => false,
    }
}
