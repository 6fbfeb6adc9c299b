//! Pin risks of the latest whole-host snapshot ([`LinuxWorld::pin_risks`]): judged again where
//! something changed: a namespace whose mounts came or went (after a re-read: one it read
//! again), every namespace with a mount on a device whose sources (the host's own mounts every
//! namespace is judged against) changed, every namespace that could not be judged (on a full
//! pass), and every namespace on every [`statmount_cache::DEEP_EVERY`]th full pass (a propagation
//! change keeps the mount IDs and sends no event). A namespace nothing changed in keeps its
//! finding, as a private copy receives no mount or unmount from anywhere; a kept finding keeps
//! its processes' names (pod, container) while its first process is the same.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use crate::discover::namespaces::{MountNamespace, MountReader};
use crate::discover::pin_read::{self, NsFinding};
use crate::discover::pin_risk;
use crate::discover::statmount_cache;
use crate::engine::world::{LinuxWorld, World};
use crate::graph::pin_risks::{self, Context, PinReport};
use crate::model::{DevNum, DeviceName, MountNsId};
use crate::snapshot::Snapshot;

impl LinuxWorld {
    /// The kubelet's and the runtimes' directories (host paths): the kubelet directory and
    /// every protected path but `/`.
    fn pin_dirs(&self) -> Vec<&Path> {
        let mut dirs: Vec<&Path> = vec![self.options.kubelet_dir.as_path()];
        for p in &self.options.protected_paths {
            if p.as_path() != Path::new("/") && !dirs.contains(&p.as_path()) {
                dirs.push(p);
            }
        }
        dirs
    }

    /// The pin risks of the latest whole-host snapshot. `changed`: the namespaces a re-read read
    /// again (`None`: a full scan's). A full pass reads the host's table again and judges every
    /// namespace whose mounts changed since it was last judged (every one on every
    /// [`statmount_cache::DEEP_EVERY`]th full pass, and every one that could not be judged); a
    /// re-read's judges the namespaces it read. Both judge again, when the host's sources
    /// changed, every namespace with a mount on a device whose sources changed (or whose mounts
    /// are not listed): kubelet mounting again a volume a namespace kept a copy of makes that
    /// copy a risk again with no change in the namespace. Unchecked when there is no whole-host
    /// snapshot. `None` only after a re-read that changed no finding: the caller's report stands
    /// (building one asks the API's view, which is not free on the event path).
    pub fn pin_risks(&self, changed: Option<&HashSet<MountNsId>>) -> Option<PinReport> {
        let Some(snap) = self.latest_snapshot() else { return Some(PinReport::default()) };
        let started = std::time::Instant::now();
        let mut memo = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        let dirs = self.pin_dirs();
        let text = self.options.reader == MountReader::MountInfo;
        let full = changed.is_none();
        if full {
            memo.passes += 1;
        }
        let before = memo.sources.clone();
        if full || changed.is_some_and(|c| c.contains(&snap.host_ns)) || memo.sources.is_none() {
            memo.sources = Some(match snap.namespace(snap.host_ns) {
                Some(ns) => pin_read::host_sources(&self.host, ns, &dirs).map(Arc::new),
                None => Err(format!(
                    "the host's mount namespace {} has no process to read it through",
                    snap.host_ns
                )),
            });
        }
        let (host_unknown, differs) = match (before, memo.sources.clone()) {
            (before, Some(Ok(sources))) => {
                // Every namespace when the sources were not known before (the first pass, or
                // the host's table unreadable: the findings were dropped).
                let touched = match &before {
                    Some(Ok(old)) if Arc::ptr_eq(old, &sources) => Some(HashSet::new()), // not read again
                    Some(Ok(old)) => Some(pin_risk::changed_devs(old, &sources)),
                    _ => None,
                };
                let everything =
                    touched.is_none() || (full && memo.passes % statmount_cache::DEEP_EVERY == 1);
                let listed = !text && self.host.is_live();
                let again = |n: &MountNamespace| {
                    everything
                        || changed.is_some_and(|c| c.contains(&n.id))
                        || (full && !memo.same_listing(n))
                        || (full && memo.findings.get(&n.id).is_some_and(|f| f.outcome.is_err()))
                        || touched.as_ref().is_some_and(|t| !t.is_empty() && may_mount_on(n, t, listed))
                };
                let judged: Vec<&MountNamespace> = snap.namespaces.iter().filter(|n| again(n)).collect();
                let found =
                    pin_read::check_all(&self.host, &judged, snap.host_ns, &sources, text, &memo.findings);
                let differs = keep(&mut memo, &snap, &judged, found, full);
                tracing::debug!(
                    judged = judged.len(),
                    namespaces = snap.namespaces.len(),
                    everything,
                    touched_devices = touched.as_ref().map_or(0, HashSet::len),
                    us = started.elapsed().as_micros() as u64,
                    "pin risks judged"
                );
                (None, differs)
            }
            (_, Some(Err(why))) => {
                memo.findings.clear();
                (Some(why), true)
            }
            (_, None) => (None, true),
        };
        if !full && !differs {
            return None;
        }
        let findings: Vec<NsFinding> = memo.findings.values().cloned().collect();
        drop(memo);
        let report = self.pin_report(&snap, &findings, host_unknown, &dirs);
        tracing::debug!(
            risks = report.risks.len(),
            us = started.elapsed().as_micros() as u64,
            "pin risks reported"
        );
        Some(report)
    }

    fn pin_report(
        &self,
        snap: &Snapshot,
        findings: &[NsFinding],
        host_unknown: Option<String>,
        dirs: &[&Path],
    ) -> PinReport {
        let devices: HashMap<DevNum, DeviceName> =
            snap.devices.iter().map(|d| (d.devnum, d.name.clone())).collect();
        let api = self.cluster();
        let cx = Context { api: api.as_ref(), kubelet: &snap.kubelet, devices: &devices, dirs };
        pin_risks::report(findings, host_unknown, &cx)
    }
}

/// Whether namespace `ns` may have a mount on one of `devs`: its listing (the scan's, the one
/// it is judged from when `listed`) says so, or it has none to ask.
fn may_mount_on(ns: &MountNamespace, devs: &HashSet<DevNum>, listed: bool) -> bool {
    let listing = (listed && ns.pinned_by.is_none())
        .then_some(ns.kernel_id)
        .flatten()
        .and_then(statmount_cache::last_listing);
    listing.is_none_or(|l| l.iter().any(|e| devs.contains(&e.1)))
}

/// Puts what a pass found in the memo: the findings of the namespaces `judged` replaced by
/// `found`, those of namespaces gone dropped; on a full pass the kept findings name the
/// processes there now. Returns whether any finding changed (which processes are in a
/// namespace aside).
fn keep(
    memo: &mut pin_read::PinMemo,
    snap: &Snapshot,
    judged: &[&MountNamespace],
    found: Vec<NsFinding>,
    full: bool,
) -> bool {
    let live: HashMap<MountNsId, &MountNamespace> = snap.namespaces.iter().map(|n| (n.id, n)).collect();
    let mut found: HashMap<MountNsId, NsFinding> = found.into_iter().map(|f| (f.ns, f)).collect();
    let shown =
        |f: &NsFinding| (f.outcome.clone(), f.comm.clone(), f.container_id.clone(), f.pod_uid.clone());
    let mut differs = false;
    for n in judged {
        let old = memo.findings.remove(&n.id);
        let new = found.remove(&n.id);
        differs |= old.as_ref().map(shown) != new.as_ref().map(shown);
        if let Some(f) = new {
            memo.findings.insert(f.ns, f);
        }
    }
    let before = memo.findings.len();
    memo.findings.retain(|id, _| live.contains_key(id));
    differs |= memo.findings.len() != before;
    memo.judged_from.retain(|id, _| live.contains_key(id));
    memo.judged(judged);
    if full {
        pin_read::forget_other_namespaces(&snap.namespaces.iter().collect::<Vec<_>>());
        for f in memo.findings.values_mut() {
            if let Some(n) = live.get(&f.ns) {
                f.pids = n.pids.iter().copied().take(pin_read::MAX_PIDS).collect();
                f.pid_count = n.pids.len();
            }
        }
    }
    differs
}
