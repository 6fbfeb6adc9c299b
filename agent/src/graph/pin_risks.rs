//! Pin risks as the agent reports them: each namespace's private copies ([`discover::pin_risk`],
//! read by [`discover::pin_read`]) joined to what they are (the block device, the PV kubelet
//! knows at the host path), to who holds them (the pod and container the API names for the
//! processes' cgroup pod UID and container ID), and to the fix (`mountPropagation:
//! HostToContainer` on the very `volumeMount` that copies them, when the API shows it). Pure.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::discover::kubelet::KubeletScan;
use crate::discover::pin_read::NsFinding;
use crate::discover::pin_risk::{at_or_under, Copy};
use crate::kube::{ClusterView, PodInfo};
use crate::model::{DevNum, DeviceName, KernelText, MountNsId};

/// A pod, as an Event's `involvedObject` names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// One private copy of a live host mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinCopy {
    /// Where the copy is in the namespace.
    pub mount_point: KernelText,
    /// The host mount it copies.
    pub host_mount_point: KernelText,
    pub dev: DevNum,
    /// The block device, when the copied filesystem is on one the scan knows.
    pub device: Option<DeviceName>,
    pub fstype: KernelText,
    /// The PV kubelet knows at that host path.
    pub pv_name: Option<String>,
}

/// A mount namespace that holds private copies of live host mounts, or that could not be
/// judged (`unknown`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PinRisk {
    pub mount_namespace: MountNsId,
    pub pids: Vec<u32>,
    pub pid_count: usize,
    pub comm: Option<KernelText>,
    /// From the processes' cgroups.
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    /// From the API (pods on this node), when it has the pod.
    pub pod: Option<PodRef>,
    pub container: Option<String>,
    /// Where the namespace holds a private copy of the host root.
    pub host_root_copy: Option<KernelText>,
    pub copies: Vec<PinCopy>,
    /// What to change so that the copies follow the host.
    pub fix: String,
    /// Why whether it is a pin risk is not known.
    pub unknown: Option<String>,
}

impl PinRisk {
    /// "pod shop/web-0 container app", "pod uid 0a5e...", or "pid 4242 (sleep)".
    pub fn holder(&self) -> String {
        let pod = match (&self.pod, &self.pod_uid) {
            (Some(p), _) => Some(format!("pod {}/{}", p.namespace, p.name)),
            (None, Some(uid)) => Some(format!("pod uid {uid}")),
            (None, None) => None,
        };
        let container = self
            .container
            .clone()
            .or_else(|| self.container_id.as_ref().map(|c| c[..c.len().min(13)].to_owned()));
        match (pod, container) {
            (Some(p), Some(c)) => format!("{p} container {c}"),
            (Some(p), None) => p,
            (None, _) => {
                let comm = self.comm.as_ref().map(|c| format!(" ({c})")).unwrap_or_default();
                format!("pid {}{comm}", self.pids.first().copied().unwrap_or(0))
            }
        }
    }
}

/// Every pin risk of one pass, and whether the pass could tell at all.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct PinReport {
    /// Whether pin risks were looked for (a scan of some devices does not).
    pub checked: bool,
    /// The namespaces that are pin risks, then those that could not be judged.
    pub risks: Vec<PinRisk>,
    /// Why no namespace could be judged (the host's table could not be read).
    pub unknown: Option<String>,
}

impl PinReport {
    /// The same findings, the namespaces' processes aside (they come and go without changing
    /// what the namespace holds): what a change event is sent on.
    pub fn same_findings(&self, other: &PinReport) -> bool {
        let strip = |r: &PinRisk| PinRisk { pids: Vec::new(), pid_count: 0, comm: None, ..r.clone() };
        self.checked == other.checked
            && self.unknown == other.unknown
            && self.risks.len() == other.risks.len()
            && self.risks.iter().zip(&other.risks).all(|(a, b)| a == b || strip(a) == strip(b))
    }

    /// The namespaces that are pin risks (not those unknown).
    pub fn known(&self) -> impl Iterator<Item = &PinRisk> {
        self.risks.iter().filter(|r| r.unknown.is_none())
    }
}

/// What the join needs besides the findings.
pub struct Context<'a> {
    pub api: Option<&'a ClusterView>,
    pub kubelet: &'a KubeletScan,
    /// Block devices by number (the scan's).
    pub devices: &'a HashMap<DevNum, DeviceName>,
    /// The kubelet's and the runtimes' directories (host paths).
    pub dirs: &'a [&'a Path],
}

/// The report of a pass: each finding joined to its pod, devices, PVs and fix.
pub fn report(findings: &[NsFinding], host_unknown: Option<String>, cx: &Context<'_>) -> PinReport {
    let mut risks: Vec<PinRisk> = findings.iter().map(|f| risk_of(f, cx)).collect();
    risks.sort_by(|a, b| {
        (a.unknown.is_some(), a.mount_namespace).cmp(&(b.unknown.is_some(), b.mount_namespace))
    });
    PinReport { checked: true, risks, unknown: host_unknown }
}

fn risk_of(f: &NsFinding, cx: &Context<'_>) -> PinRisk {
    let pod_info = f.pod_uid.as_ref().and_then(|uid| cx.api?.pods_on_node.iter().find(|p| &p.uid == uid));
    let container = pod_info.and_then(|p| {
        let id = f.container_id.as_deref()?;
        p.containers.iter().find(|c| !c.id.is_empty() && c.id == id).map(|c| c.name.clone())
    });
    let (host_root_copy, copies, unknown) = match &f.outcome {
        Ok(found) => (found.host_root.clone(), found.copies.iter().map(|c| copy_of(c, cx)).collect(), None),
        Err(why) => (None, Vec::new(), Some(why.clone())),
    };
    let mut r = PinRisk {
        mount_namespace: f.ns,
        pids: f.pids.clone(),
        pid_count: f.pid_count,
        comm: f.comm.clone(),
        pod_uid: f.pod_uid.clone(),
        container_id: f.container_id.clone(),
        pod: pod_info.map(|p| PodRef {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
            uid: p.uid.clone(),
        }),
        container,
        host_root_copy,
        copies,
        fix: String::new(),
        unknown,
    };
    if r.unknown.is_none() {
        let private_host = f.outcome.as_ref().ok().and_then(|found| first_private_source(&found.copies));
        r.fix = fix(&r, pod_info, cx.dirs, private_host.as_deref());
    }
    r
}

fn copy_of(c: &Copy, cx: &Context<'_>) -> PinCopy {
    let pv_name = c
        .source
        .point
        .to_str()
        .and_then(|p| cx.kubelet.find_by_mount_point(p))
        .and_then(|v| v.pv_name.clone());
    PinCopy {
        mount_point: c.mount_point.clone(),
        host_mount_point: c.source.point.clone(),
        dev: c.source.dev,
        device: cx.devices.get(&c.source.dev).cloned(),
        fstype: c.source.fstype.clone(),
        pv_name,
    }
}

/// A copied host mount that is itself private on the host, if any.
fn first_private_source(copies: &[Copy]) -> Option<String> {
    copies.iter().find(|c| !c.source.shared).map(|c| c.source.point.to_string())
}

/// How to fix it: the `volumeMounts` of the container (or of the pod, when the container is not
/// known) that mount the host root or a directory at, under or above the kubelet's or a
/// runtime's directory without propagation; else the general advice.
fn fix(r: &PinRisk, pod: Option<&PodInfo>, dirs: &[&Path], private_host: Option<&str>) -> String {
    let mut out = match pod {
        Some(p) => pod_fix(r, p, dirs),
        None if r.pod_uid.is_some() => "set mountPropagation: HostToContainer on the volumeMount that mounts the host root or the kubelet or runtime directory (a hostPath volume), or do not mount the host root".to_owned(),
        None => format!(
            "{} is not in a pod: run it in a mount namespace made with `unshare -m --propagation slave` (or make its mounts slaves: `mount --make-rslave /` inside it), so that the host's unmounts reach its copies",
            r.holder()
        ),
    };
    if let Some(host) = private_host {
        out.push_str(&format!(
            "; the host's mount {host} is itself private, so a slave copy would receive nothing either: make it shared on the host (`mount --make-rshared /`, as systemd does)"
        ));
    }
    out
}

fn pod_fix(r: &PinRisk, p: &PodInfo, dirs: &[&Path]) -> String {
    let covers = |path: &str| {
        let path = path.trim_end_matches('/');
        path.is_empty() || dirs.iter().any(|d| at_or_under(path.as_bytes(), d) || d.starts_with(path))
    };
    let mut named = Vec::new();
    for c in p.containers.iter().filter(|c| r.container.as_ref().is_none_or(|n| &c.name == n)) {
        for m in &c.mounts {
            let Some((_, host_path)) = p.host_paths.iter().find(|(v, _)| *v == m.volume) else { continue };
            let propagates = matches!(m.propagation.as_deref(), Some("HostToContainer" | "Bidirectional"));
            if !propagates && covers(host_path) {
                let root = if host_path.trim_end_matches('/').is_empty() {
                    ", or do not mount the host root"
                } else {
                    ""
                };
                named.push(format!(
                    "set mountPropagation: HostToContainer on volumeMount {} (hostPath {host_path} at {}) of container {} in pod {}/{}{root}",
                    m.volume, m.mount_path, c.name, p.namespace, p.name
                ));
            }
        }
    }
    if named.is_empty() {
        format!(
            "set mountPropagation: HostToContainer on the volumeMount of pod {}/{} that mounts the host root or the kubelet or runtime directory, or do not mount the host root",
            p.namespace, p.name
        )
    } else {
        named.join("; ")
    }
}

#[cfg(test)]
#[path = "pin_risks_tests.rs"]
mod tests;
