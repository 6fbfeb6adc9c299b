//! Cleaning a loop device: its foreign mounts released, then unbound.

use super::release::release_then;
use crate::graph::DeviceEntry;
use crate::plan::step::{Action, Plan};

/// Plans unbinding a loop device, releasing its foreign mounts first; refused while anything
/// else holds it.
pub fn clean(entry: &DeviceEntry) -> Plan {
    let d = &entry.device;
    let Some(info) = &d.loop_info else {
        return Plan::new("clean", entry); // unbound already: nothing to do
    };
    release_then(
        entry,
        "clean",
        Action::DetachLoop {
            backing_file: info.backing_file.clone(),
            backing_dev: info.backing_dev,
            backing_inode: info.backing_inode,
        },
    )
}
