//! One diagnosis per volume, from the facts of every node involved (pure). Each node other than
//! the stuck pod's is looked at on its own:
//!
//! - its agent answers, and a device of the volume there is held: by private copies of its mount
//!   in other mount namespaces only, `private_mount_copy` (incident 5; on the pod's own node
//!   too); otherwise `held_elsewhere` (Multi-Attach, incident 1);
//! - its agent answers, the volume is mapped there with nothing holding it, or attached to it (a
//!   VolumeAttachment, its Node's volumesAttached) with nothing there at all: `attached_not_in_use`
//!   (incident 2);
//! - its agent answers and cannot vouch (a device's verdict is unknown): `unknown`;
//! - its agent does not answer, and the node maps (as last seen) or is attached the volume: when
//!   the node is believed dead (its Node NotReady or deleted too), `dead_node` with the
//!   dead-node advice (incident 4); otherwise `unknown`, with its last view and its age.
//!
//! The volume's diagnosis is the first by that order (held, private copy, dead node, attached not
//! in use, unknown); the others are its evidence. None: `nothing_blocks`. Without a pod (a PVC or
//! PV asked about), one node holding the volume is its user, not a block.

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::Pod;

use super::advice;
use super::facts::NodeFacts;
use super::holders::{self, Pods};
use super::liveness::ago;
use super::volumes::Volume;
use crate::multiattach::held;

/// What the diagnosis needs besides the facts.
pub struct Context<'a> {
    /// The stuck pod (`None`: a PVC or PV asked about, no pod waiting for it).
    pub pod: Option<&'a pb::ExplainPod>,
    /// Pods by uid, for holders' names and manifests.
    pub pods: &'a Pods,
    /// Each node's agent pod, `NAMESPACE/NAME` ("" or absent: static agents).
    pub agent_pod: &'a dyn Fn(&str) -> String,
    /// Now, seconds since the epoch.
    pub now: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Held,
    PrivateCopy,
    Dead,
    AttachedNotInUse,
    Unknown,
}

/// One node's finding.
struct Finding<'a> {
    kind: Kind,
    f: &'a NodeFacts,
    device: Option<&'a pb::Device>,
    why: String,
}

fn classify<'a>(f: &'a NodeFacts, pod_scheduled: bool, holders_elsewhere: usize) -> Option<Finding<'a>> {
    let devs: Vec<&pb::Device> = f.devs().collect();
    if devs.is_empty() && !f.attached() && !f.in_use {
        return None;
    }
    let finding = |kind, device, why: String| Some(Finding { kind, f, device, why });
    if !f.liveness.agent_answers {
        if f.pod_node {
            return None; // the pod's own node: its attachment is the one wanted
        }
        let kind = if f.liveness.believed_dead { Kind::Dead } else { Kind::Unknown };
        return finding(kind, devs.first().copied(), f.liveness.agent_error.clone());
    }
    if let Some(d) = devs.iter().find(|d| d.verdict == pb::Verdict::Unknown as i32) {
        let why = format!("its agent cannot vouch for {}: {}", d.name, d.reasons.join("; "));
        return finding(Kind::Unknown, Some(d), why);
    }
    if let Some(d) = devs.iter().find(|d| held(d)) {
        if holders::private_copies_only(d) {
            return finding(Kind::PrivateCopy, Some(d), String::new());
        }
        if f.pod_node || (!pod_scheduled && holders_elsewhere <= 1) {
            return None; // its user
        }
        return finding(Kind::Held, Some(d), String::new());
    }
    if f.pod_node {
        return None;
    }
    finding(Kind::AttachedNotInUse, devs.first().copied(), String::new())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "lists"
    } else {
        "does not list"
    }
}

/// The facts of one node, one line each.
fn node_evidence(f: &NodeFacts, v: &Volume, cx: &Context<'_>, out: &mut Vec<String>) {
    let n = &f.node;
    for w in &f.liveness.why {
        out.push(format!("node {n}: {w}"));
    }
    if f.liveness.agent_answers && matches!(f.liveness.node_ready.as_str(), "False" | "Unknown" | "deleted") {
        out.push(format!(
            "node {n}: its Node is {} but its agent still answers: the machine runs, so it is not dead: never fence it \
             or taint it out-of-service",
            if f.liveness.node_ready == "deleted" { "deleted" } else { "NotReady" }
        ));
    }
    for (va, attached) in &f.vas {
        out.push(format!("node {n}: VolumeAttachment {va} attached={attached}"));
    }
    if f.in_attached || f.in_use || f.attached() {
        out.push(format!(
            "node {n}: its Node's status {} the volume in volumesAttached and {} it in volumesInUse",
            yes_no(f.in_attached),
            yes_no(f.in_use)
        ));
    }
    let as_of = if f.liveness.view_age_seconds > 0.0 {
        format!(" (as last seen {}: its last view)", ago(cx.now - f.liveness.view_age_seconds, cx.now))
    } else {
        String::new()
    };
    let what = v.identity.first().map(String::as_str).unwrap_or("the volume");
    for d in f.devs() {
        let client =
            d.rbd.as_ref().map(|r| format!(", client {} {}", r.client_id, r.client_addr)).unwrap_or_default();
        out.push(format!(
            "node {n}: {} ({}, verdict {}) is {what}{client}{as_of}",
            d.name,
            blockjanitor_rpc::view::names::kind_name(d.kind),
            blockjanitor_rpc::view::names::verdict_name(d.verdict)
        ));
        for h in holders::of_device(n, d, cx.pods) {
            out.push(format!("node {n}: {} is held by {}", d.name, holders::line(&h)));
        }
    }
    if f.devices.is_empty() && f.liveness.agent_answers {
        out.push(format!("node {n}: its agent answers and finds no device of the volume, no mount of it"));
    }
}

fn summary(x: &Finding<'_>, v: &Volume, cx: &Context<'_>) -> String {
    let n = &x.f.node;
    let dev = x.device.map(|d| d.name.as_str()).unwrap_or("");
    let vol = if v.pv.is_empty() { v.name.clone() } else { v.pv.clone() };
    match x.kind {
        Kind::Held => {
            let by = x.device.map(|d| holders::of_device(n, d, cx.pods)).unwrap_or_default();
            format!(
                "Multi-Attach: node {n} still maps {vol} as {dev}, and something there holds it: {}",
                by.first().map(holders::line).unwrap_or_else(|| "in use".into())
            )
        }
        Kind::PrivateCopy => format!(
            "{vol} is mapped on node {n} as {dev} and held only by private copies of its mount in other mount \
             namespaces (not the host's): kubelet cannot unmap it (incident 5)"
        ),
        Kind::Dead => format!(
            "node {n} is believed dead and {} {vol}{}: its client may still watch it (incident 4)",
            if dev.is_empty() { "is still attached" } else { "still maps (as last seen)" },
            if dev.is_empty() { String::new() } else { format!(" as {dev}") }
        ),
        Kind::AttachedNotInUse if dev.is_empty() => format!(
            "{vol} is attached to node {n} and nothing there uses it: the attach/detach controller has not detached \
             it (incident 2)"
        ),
        Kind::AttachedNotInUse => format!(
            "{vol} is still mapped on node {n} as {dev} and nothing there uses it: a stale mapping keeps it attached \
             (incidents 1 and 2)"
        ),
        Kind::Unknown => format!(
            "not known: node {n} could hold {vol} and cannot be asked ({}); not believed dead, so nothing is fenced",
            x.why
        ),
    }
}

/// The next steps for a finding.
fn next(x: &Finding<'_>, v: &Volume, cx: &Context<'_>) -> Vec<pb::Advice> {
    let n = &x.f.node;
    let dev = x.device.map(|d| d.name.clone()).unwrap_or_default();
    match x.kind {
        Kind::Held => {
            let mut out: Vec<pb::Advice> = x
                .device
                .map(|d| holders::of_device(n, d, cx.pods))
                .unwrap_or_default()
                .iter()
                .filter(|h| h.pid > 0 || !h.pod.is_empty())
                .take(3)
                .map(advice::stop_holder)
                .collect();
            out.extend(advice::clean(n, &dev));
            out
        }
        Kind::PrivateCopy => {
            let mut out = advice::release(n, &dev, &(cx.agent_pod)(n));
            let hs = x.device.map(|d| holders::of_device(n, d, cx.pods)).unwrap_or_default();
            let mut fixed: Vec<String> = Vec::new();
            for h in &hs {
                if fixed.contains(&h.pod_uid) {
                    continue;
                }
                fixed.push(h.pod_uid.clone());
                let pod: Option<&Pod> = cx.pods.get(&h.pod_uid);
                out.push(advice::propagation(pod, &h.container, &h.mount_point));
            }
            out
        }
        Kind::Dead => advice::fence(n, &x.f.liveness, &x.f.devs().collect::<Vec<_>>(), v),
        Kind::AttachedNotInUse => {
            let mut out = if dev.is_empty() { Vec::new() } else { advice::clean(n, &dev) };
            out.extend(x.f.vas.iter().filter(|(_, a)| *a).map(|(va, _)| advice::delete_va(va, n)));
            out
        }
        Kind::Unknown => vec![advice::look_at_agent(n)],
    }
}

/// The volume's one diagnosis.
pub fn diagnose(v: &Volume, facts: &[NodeFacts], cx: &Context<'_>) -> pb::ExplainDiagnosis {
    let scheduled = cx.pod.is_some_and(|p| !p.node.is_empty());
    let holding = facts.iter().filter(|f| f.devs().any(held)).count();
    let mut findings: Vec<Finding<'_>> =
        facts.iter().filter_map(|f| classify(f, scheduled, holding)).collect();
    findings.sort_by_key(|x| x.kind);
    let mut evidence = Vec::new();
    if !v.unresolved.is_empty() {
        evidence.push(v.unresolved.clone());
    }
    for f in facts {
        node_evidence(f, v, cx, &mut evidence);
    }
    let Some(top) = findings.first() else {
        let where_ =
            facts.iter().filter(|f| f.devs().next().is_some()).map(|f| f.node.as_str()).collect::<Vec<_>>();
        return pb::ExplainDiagnosis {
            cause: pb::Cause::NothingBlocks as i32,
            outcome: pb::ExplainOutcome::NotBlocked as i32,
            summary: format!(
                "nothing on any node blocks {}{}",
                if v.pv.is_empty() { &v.name } else { &v.pv },
                if where_.is_empty() { String::new() } else { format!(" (it is on {})", where_.join(", ")) }
            ),
            evidence,
            next: advice::elsewhere(cx.pod, v),
            ..Default::default()
        };
    };
    for other in &findings[1..] {
        evidence.push(format!("also: {}", summary(other, v, cx)));
    }
    let (cause, outcome) = match top.kind {
        Kind::Held => (pb::Cause::HeldElsewhere, pb::ExplainOutcome::Blocked),
        Kind::PrivateCopy => (pb::Cause::PrivateMountCopy, pb::ExplainOutcome::Blocked),
        Kind::Dead => (pb::Cause::DeadNode, pb::ExplainOutcome::Blocked),
        Kind::AttachedNotInUse => (pb::Cause::AttachedNotInUse, pb::ExplainOutcome::Blocked),
        Kind::Unknown => (pb::Cause::Unknown, pb::ExplainOutcome::Unknown),
    };
    pb::ExplainDiagnosis {
        cause: cause as i32,
        outcome: outcome as i32,
        node: top.f.node.clone(),
        device: top.device.map(|d| d.name.clone()).unwrap_or_default(),
        summary: summary(top, v, cx),
        evidence,
        holders: top.device.map(|d| holders::of_device(&top.f.node, d, cx.pods)).unwrap_or_default(),
        next: next(top, v, cx),
    }
}
