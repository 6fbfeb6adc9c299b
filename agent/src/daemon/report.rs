//! What the daemon tells Kubernetes after each full scan and each action, where people look:
//!
//! - a device's verdict (`StaleBlockDevice`; `VolumeHeldElsewhere` for a volume held by a
//!   private copy of its mount in a namespace of none of its pods) and the outcome of each step
//!   on it (`BlockDeviceReleased`, `BlockDeviceCleaned`, `CleanupFailed`) as an Event on the Node
//!   and, for a volume, on its PV, its PVC and the pods on this node that use or wait for it
//!   ([`crate::graph::volume_objects`]), naming the device, the node and the verdict's summary
//!   or the step (no ages, no command lines, no process IDs: the reporter's de-duplication holds
//!   across scans);
//! - each pin risk of a pod as a `MountPinRisk` Event on that pod;
//! - the Node's conditions: `StaleBlockDevices` naming the stale devices, `MountPinRisk` while
//!   any mount namespace is a pin risk (`Unknown` while one cannot be judged).
//!
//! Every Event goes through [`Reporter::event_on`]: de-duplicated per object for 10 minutes and
//! held to the reporter's per-minute budget.

use std::sync::Arc;

use super::state::AgentState;
use crate::act::StepReport;
use crate::engine::view::DeviceView;
use crate::engine::world::World;
use crate::graph::pin_risks::{PinReport, PinRisk};
use crate::judge::Verdict;
use crate::kube::report::{EventReason, Involved, PIN_CONDITION_TYPE};
use crate::kube::{ClusterView, Reporter};

/// How many pin risks the `MountPinRisk` condition's message names (the rest are counted).
const CONDITION_NAMES: usize = 8;

impl AgentState {
    /// Events for devices that are stale (on the Node and the volume's objects), the pods whose
    /// containers are pin risks, and the Node's conditions.
    pub(super) async fn report_to_kubernetes(&self) {
        let Some(reporter) = self.reporter.get() else { return };
        let view = self.view();
        let api = self.engine.world.cluster();
        let stale: Vec<&Arc<DeviceView>> =
            view.devices.iter().filter(|d| d.judgement.verdict == Verdict::Stale).collect();
        for d in &stale {
            let name = d.entry.device.name.as_str();
            let reason = EventReason::StaleBlockDevice;
            if let Err(e) = reporter.event(reason, name, &d.judgement.summary).await {
                tracing::warn!(device = name, "cannot post a StaleBlockDevice event: {e}");
            }
            post_on_volume(reporter, api.as_ref(), d, reason, &d.judgement.summary).await;
        }
        if let Some(api) = api.as_ref() {
            for d in view.devices.iter().filter(|d| d.judgement.verdict == Verdict::InUse) {
                let Some(why) = held_elsewhere_summary(d, api) else { continue };
                let name = d.entry.device.name.as_str();
                let reason = EventReason::VolumeHeldElsewhere;
                if let Err(e) = reporter.event(reason, name, &why).await {
                    tracing::warn!(device = name, "cannot post a VolumeHeldElsewhere event: {e}");
                }
                post_on_volume(reporter, Some(api), d, reason, &why).await;
            }
        }
        let names: Vec<String> = stale.iter().map(|d| d.entry.device.name.to_string()).collect();
        if let Err(e) = reporter.set_condition(&names).await {
            tracing::warn!("cannot set the StaleBlockDevices node condition: {e}");
        }
        report_pin_risks(reporter, &view.pin_risks).await;
    }

    /// The Events of the steps an action carried out: on the Node, and on each one's volume.
    pub(super) async fn report_actions(&self, reports: &[StepReport]) {
        let Some(reporter) = self.reporter.get() else { return };
        let view = self.view();
        let api = self.engine.world.cluster();
        for r in reports {
            let (_, detail) = r.word();
            let reason = match (r.result_word().is_finished(), r.step.is_release()) {
                // Failed, skipped, or deferred (not done: the device stays until its last close).
                (false, _) => EventReason::CleanupFailed,
                (true, true) => EventReason::BlockDeviceReleased,
                (true, false) => EventReason::BlockDeviceCleaned,
            };
            let msg = if detail.is_empty() {
                r.step.describe()
            } else {
                format!("{}: {detail}", r.step.describe())
            };
            let _ = reporter.event(reason, r.step.device.as_str(), &msg).await;
            if let Some(d) = view.devices.iter().find(|d| d.entry.device.devnum == r.step.devnum) {
                post_on_volume(reporter, api.as_ref(), d, reason, &msg).await;
            }
        }
    }
}

/// `reason` with `"<device> on node <node>: <what>"` on the device's PV, PVC and the pods that
/// use or wait for it (none without the API's view, or for a device that is no volume).
async fn post_on_volume(
    reporter: &Reporter,
    api: Option<&ClusterView>,
    d: &DeviceView,
    reason: EventReason,
    what: &str,
) {
    let Some(api) = api else { return };
    let device = d.entry.device.name.as_str();
    let message = format!("{device} on node {}: {what}", reporter.node_name());
    for on in crate::graph::volume_objects::objects(&d.entry, api) {
        if let Err(e) = reporter.event_on(&on, reason, &message).await {
            tracing::warn!(device, kind = on.kind, name = %on.name, "cannot post a {} event: {e}", reason.as_str());
        }
    }
}

/// Why a volume in use is held by something that is none of its pods' (`None`: it is not, or
/// it is no volume the API knows): each private copy of its mount elsewhere, by mount
/// namespace, the pod it belongs to (by name when the API has it) and mount point.
pub fn held_elsewhere_summary(d: &DeviceView, api: &ClusterView) -> Option<String> {
    let holders = crate::graph::volume_objects::held_elsewhere(&d.entry, api);
    if holders.is_empty() || crate::graph::volume_objects::objects(&d.entry, api).is_empty() {
        return None;
    }
    let copies: Vec<String> = holders
        .iter()
        .map(|h| {
            let ns = h.mount_namespace.map(|n| n.0).unwrap_or_default();
            let at = h.mount_point.as_ref().map(ToString::to_string).unwrap_or_default();
            let pod = h.pod_uid.as_ref().map(|uid| match api.pods_on_node.iter().find(|p| &p.uid == uid) {
                Some(p) => format!("pod {}/{}", p.namespace, p.name),
                None => format!("pod uid {uid}"),
            });
            let who = pod.or_else(|| h.comm.as_ref().map(|c| format!("process {c}"))).unwrap_or_default();
            format!("mount namespace {ns} ({who}) at {at}")
        })
        .collect();
    Some(format!(
        "held by a private copy of its mount in {}: no unmount of the host's reaches it, so the device stays busy after this volume's pods stop (incident 5); make that pod's volumeMount HostToContainer, or release the copy (`blockjanitor-agent release {}`)",
        copies.join("; "),
        d.entry.device.name
    ))
}

/// A `MountPinRisk` Event on each pod that is a pin risk, and the Node's condition.
async fn report_pin_risks(reporter: &Reporter, report: &PinReport) {
    if !report.checked {
        return;
    }
    for r in report.known() {
        let Some(pod) = &r.pod else { continue };
        let on = Involved {
            kind: "Pod",
            name: pod.name.clone(),
            namespace: Some(pod.namespace.clone()),
            uid: pod.uid.clone(),
        };
        let message = pin_event_message(r, reporter.node_name());
        if let Err(e) = reporter.event_on(&on, EventReason::MountPinRisk, &message).await {
            tracing::warn!(pod = %pod.name, "cannot post a MountPinRisk event: {e}");
        }
    }
    let (status, reason, message) = pin_condition(report);
    if let Err(e) = reporter.patch_condition(PIN_CONDITION_TYPE, status, reason, &message).await {
        tracing::warn!("cannot set the MountPinRisk node condition: {e}");
    }
}

/// The Event on a pin risk's pod: what it copies, why it matters, the fix. Nothing in it
/// changes while the copies do not (no process ID, no age).
pub fn pin_event_message(r: &PinRisk, node: &str) -> String {
    let who = match &r.container {
        Some(c) => format!("container {c}"),
        None => "a container".to_owned(),
    };
    let mut what = Vec::new();
    if let Some(at) = &r.host_root_copy {
        what.push(format!("the host root at {at}"));
    }
    for c in &r.copies {
        let dev = c.device.as_ref().map_or_else(|| format!("{} {}", c.fstype, c.dev), |d| d.to_string());
        let pv = c.pv_name.as_ref().map(|p| format!(" (PV {p})")).unwrap_or_default();
        what.push(format!("{dev}{pv} at {}", c.mount_point));
    }
    format!(
        "{who} (mount namespace {}) on node {node} keeps private copies of live host mounts: {}; when the host unmounts them, their devices stay busy (rbd unmap: EBUSY). Fix: {}",
        r.mount_namespace,
        what.join("; "),
        r.fix
    )
}

/// `MountPinRisk`: `True` naming the holders, `Unknown` while one namespace (or the host's table)
/// could not be judged and none is known to be one, else `False`.
pub fn pin_condition(report: &PinReport) -> (&'static str, &'static str, String) {
    let known: Vec<&PinRisk> = report.known().collect();
    if !known.is_empty() {
        let mut names: Vec<String> = known
            .iter()
            .take(CONDITION_NAMES)
            .map(|r| format!("{} ({} volume mount copies)", r.holder(), r.copies.len()))
            .collect();
        if known.len() > CONDITION_NAMES {
            names.push(format!("and {} more", known.len() - CONDITION_NAMES));
        }
        let msg =
            format!("mount namespaces holding private copies of live host mounts: {}", names.join(", "));
        return ("True", "MountPinRiskFound", msg);
    }
    if let Some(why) = &report.unknown {
        return ("Unknown", "MountPinRiskUnknown", why.clone());
    }
    if let Some(r) = report.risks.iter().find(|r| r.unknown.is_some()) {
        let why = r.unknown.clone().unwrap_or_default();
        return ("Unknown", "MountPinRiskUnknown", why);
    }
    ("False", "NoMountPinRisk", "no mount namespace holds a private copy of a live host mount".to_owned())
}
