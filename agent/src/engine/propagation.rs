//! What a mount release takes with it through mount propagation (gotcha 29), asked of the world
//! when a plan is made and again right before each detach: the whole tables of the namespaces
//! the plan detaches in (each read once), then, only when a detached mount's parent is shared,
//! every other namespace's (a mount that receives from the parent can be anywhere), each read
//! once; the pure answer is [`crate::graph::propagation::umount_reach`], the gate
//! [`crate::judge::gates::umount_propagation`] ([`recheck::propagation_refusal`]).

use super::recheck;
use super::{Engine, World};
use crate::graph::propagation::{self, NsTable, Reach};
use crate::graph::scan::Scan;
use crate::model::MountNsId;
use crate::plan::{Action, Plan, Step};

impl<W: World> Engine<W> {
    /// What unmounting each of `mounts` (namespace, mount ID) takes with it, from tables read now.
    pub(super) fn umount_reaches(&self, scan: &Scan, mounts: &[(MountNsId, u32)]) -> Vec<Reach> {
        let mut own: Vec<MountNsId> = mounts.iter().map(|(ns, _)| *ns).collect();
        own.sort_unstable();
        own.dedup();
        let mut tables: Vec<NsTable> = self.world.mount_tables(scan, &|n| own.binary_search(&n).is_ok());
        let propagates = mounts.iter().any(|&(ns, id)| match tables.iter().find(|(n, _)| *n == ns) {
            Some((_, Ok(t))) => !matches!(propagation::parent_group(t, ns, id), Ok(None)),
            _ => false,
        });
        if propagates {
            tables.extend(self.world.mount_tables(scan, &|n| own.binary_search(&n).is_err()));
        }
        mounts.iter().map(|&(ns, id)| propagation::umount_reach(ns, id, &tables)).collect()
    }

    /// Why the plan's mount releases must not run, when it is made: what one of them would take
    /// with it through propagation is not a releasable copy of the same device.
    pub(super) fn propagation_refusal(&self, p: &Plan, scan: &Scan) -> Option<String> {
        let releases: Vec<&Step> = p.steps.iter().filter(|s| s.is_release()).collect();
        let mounts: Vec<(MountNsId, u32)> = releases
            .iter()
            .filter_map(|s| match &s.action {
                Action::DetachMount { namespace, mount_id, .. } => Some((*namespace, *mount_id)),
                _ => None,
            })
            .collect();
        if mounts.is_empty() {
            return None;
        }
        let reaches = self.umount_reaches(scan, &mounts);
        releases.iter().zip(&reaches).find_map(|(s, r)| recheck::propagation_refusal(p, s, scan, r))
    }

    /// The same, right before the mount release `step`, from `fresh` (a scan taken just now).
    pub(super) fn propagation_recheck(&self, p: &Plan, step: &Step, fresh: &Scan) -> Option<String> {
        let Action::DetachMount { namespace, mount_id, .. } = &step.action else { return None };
        // A planned mount the fresh scan no longer shows is the actuator's to find gone.
        let shown = fresh.entry(step.devnum).is_some_and(|e| {
            e.holders.iter().any(|h| h.mount_namespace == Some(*namespace) && h.mount_id == Some(*mount_id))
        });
        if !shown {
            return None;
        }
        let reach = self.umount_reaches(fresh, &[(*namespace, *mount_id)]);
        reach.first().and_then(|r| recheck::propagation_refusal(p, step, fresh, r))
    }
}
