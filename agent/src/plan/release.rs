//! Releasing a device: detaching its mounts in namespaces other than the host's, never a copy
//! of a mount live in the host's namespace, refused while a process in a namespace it would
//! detach in uses the filesystem. Every `clean` by kind releases first.

use crate::graph::propagation::HostChain;
use crate::graph::{DeviceEntry, Holder};
use crate::judge::gates::{self, Releasing};
use crate::model::opt_ins::ReleaseOptions;
use crate::model::{HolderKind, MountNsId};
use crate::plan::step::{Action, LeftAlone, Plan, Step};

/// Why a foreign mount must not be detached: it is tied to a mount live in the host's namespace
/// by propagation, directly or through any chain of peer groups ([`HostChain`]).
pub fn host_copy(h: &Holder, chain: &HostChain) -> Option<String> {
    chain.ties(h).map(|why| format!("{}: {why}: left alone", h.describe()))
}

/// Plans the release of every foreign-namespace mount of `entry`'s device that is not tied to
/// a mount live in the host's namespace (a shared peer, a slave through any chain of peer
/// groups, a master of the host's mount). Nothing else: who uses the mounts is the caller's
/// question ([`release_with`], the teardowns' own holder checks).
pub fn release(entry: &DeviceEntry) -> Plan {
    let mut p = Plan::new("release", entry);
    let chain = HostChain::of(&entry.holders);
    for h in &entry.holders {
        if h.is_foreign_mount() {
            if let Some(reason) = host_copy(h, &chain) {
                p.left_alone.push(LeftAlone { holder: h.clone(), reason });
                continue;
            }
        }
        match (h.is_foreign_mount(), &h.namespace_entry, h.mount_namespace, h.mount_id, h.mount_dev) {
            (true, Some(via), Some(ns), Some(id), Some(dev)) => p.steps.push(Step::on(
                entry,
                Action::DetachMount {
                    namespace: ns,
                    via: via.clone(),
                    mount_id: id,
                    mount_dev: dev,
                    mount_point: h.mount_point.clone().unwrap_or_default(),
                    fstype: h.fstype.clone().unwrap_or_default(),
                },
            )),
            _ => {
                let mut reason = h.describe();
                if h.kind != HolderKind::Mount {
                    reason.push_str(": release does not touch processes or other devices");
                }
                p.left_alone.push(LeftAlone { holder: h.clone(), reason });
            }
        }
    }
    p
}

/// The mount namespaces a plan detaches mounts in.
pub fn detached_namespaces(p: &Plan) -> Vec<MountNsId> {
    let mut out: Vec<MountNsId> = p
        .steps
        .iter()
        .filter_map(|s| match &s.action {
            Action::DetachMount { namespace, .. } => Some(*namespace),
            _ => None,
        })
        .collect();
    out.sort_unstable_by_key(|n| n.0);
    out.dedup();
    out
}

/// The operation `release`: [`release`], held to the clean path's standard. Refused while a
/// process with a task in a namespace it would detach a mount in uses the filesystem (cwd, root,
/// an open file or the device node, a mapping), or anything the kernel holds without a namespace
/// (swap, a loop device's backing file, a stacked device, a filesystem with no mount) reaches
/// the device ([`gates::mount_users`]): a detached mount stays alive for its users, who lose only
/// path lookups, so detaching it breaks them and frees nothing (gotcha 24). `--force-busy REASON`
/// lets it go ahead despite the process users only (never the kernel's own holders, a blind spot
/// or a host copy): the reason is kept in the plan (journaled with it, and audited), and the
/// re-check right before each detach lets process users through too. A process in a namespace
/// the plan does not touch (the host's, or one whose only mount is a copy left alone) does not
/// refuse it: its own mount stays, and the detached copies were not its way to the files.
pub fn release_with(entry: &DeviceEntry, opts: &ReleaseOptions) -> Plan {
    let mut p = release(entry);
    if p.steps.is_empty() {
        return p;
    }
    let detached = detached_namespaces(&p);
    let forced = Releasing { force_busy: opts.force_busy.is_some(), ..Releasing::default() };
    if let Some(why) = gates::mount_users(entry, &detached, &forced) {
        p.refuse(why);
        return p;
    }
    if let Some(reason) = &opts.force_busy {
        p.notes.push(match gates::mount_users(entry, &detached, &Releasing::default()) {
            Some(users) => format!("--force-busy ({reason}): detaching anyway although {users}"),
            None => format!(
                "--force-busy ({reason}): nothing in the namespaces it detaches in uses the filesystem now; process users that come before a detach do not stop it"
            ),
        });
        p.force_busy = Some(reason.clone());
    }
    p
}

/// Releases a device's foreign mounts, then runs `last` on it; anything else that holds it (or
/// a mount release leaves alone) refuses the plan.
pub(super) fn release_then(entry: &DeviceEntry, operation: &'static str, last: Action) -> Plan {
    let mut p = release(entry);
    p.operation = operation;
    if !p.left_alone.is_empty() {
        let n = p.left_alone.len();
        p.refuse(format!("{} is still held by {n} holder(s) release cannot detach", p.device));
        return p;
    }
    p.steps.push(Step::on(entry, last));
    p
}
