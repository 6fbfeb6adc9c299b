//! Explain (issue 35): start from the stuck pod. One call answers why a pod (or a PVC, a PV) is
//! stuck: the pod and its events (read from the API now; events expire after an hour, so the
//! answer rests on state, not on them), each volume from its claim down to what a node shows
//! for it ([`volumes`]), every node involved with its devices, attachments, holders and liveness
//! ([`facts`], [`liveness`], [`holders`]), and one diagnosis per volume with its evidence and next
//! steps ([`diagnose`], [`advice`]); the answer's diagnosis is the one to act on first.
//!
//! A node whose agent does not answer is explained from the console's last view of it, with its
//! age; a node that left the fleet (its agent pod gone with its Node) from the view it had when
//! it went. Nothing here acts: every command is printed, none is run.
//!
//! The steps that read the API are async with deadlines; the index and the cluster's tables are
//! read under their locks between them, never across an await.

pub mod advice;
pub mod diagnose;
pub mod facts;
mod fetch;
pub mod holders;
pub mod liveness;
pub mod volumes;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::view::time::now_secs;
use k8s_openapi::api::core::v1::Pod;
use tonic::Status;

use crate::cluster::Cluster;
use crate::service::{uninterpretable, FleetService};
use facts::NodeFacts;
use holders::Pods;
use volumes::Volume;

/// What was asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    Pod { ns: String, name: String },
    Pvc { ns: String, name: String },
    Pv { name: String },
}

impl Asked {
    fn parse(r: &pb::ExplainRequest) -> Result<Self, Status> {
        let name = r.name.trim().to_owned();
        let ns = r.namespace.trim().to_owned();
        if name.is_empty() || name.contains('/') {
            return Err(uninterpretable(&format!(
                "'{name}' is not an object name: give pod/NAME, pvc/NAME or pv/NAME"
            )));
        }
        let need_ns = |what: &str| {
            if ns.is_empty() {
                Err(uninterpretable(&format!("a {what} needs its namespace")))
            } else {
                Ok(())
            }
        };
        match r.kind.trim().to_ascii_lowercase().as_str() {
            "pod" | "pods" | "po" => need_ns("pod").map(|()| Asked::Pod { ns, name }),
            "pvc" | "persistentvolumeclaim" | "persistentvolumeclaims" => {
                need_ns("PVC").map(|()| Asked::Pvc { ns, name })
            }
            "pv" | "persistentvolume" | "persistentvolumes" => Ok(Asked::Pv { name }),
            other => Err(uninterpretable(&format!("'{other}' is not a kind explain takes: pod, pvc or pv"))),
        }
    }

    fn text(&self) -> String {
        match self {
            Asked::Pod { ns, name } => format!("pod {ns}/{name}"),
            Asked::Pvc { ns, name } => format!("pvc {ns}/{name}"),
            Asked::Pv { name } => format!("pv {name}"),
        }
    }
}

/// The pod as the answer shows it.
fn pod_summary(p: &Pod) -> pb::ExplainPod {
    let status = p.status.as_ref();
    let waiting = status
        .into_iter()
        .flat_map(|s| s.init_container_statuses.iter().flatten().chain(s.container_statuses.iter().flatten()))
        .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .unwrap_or_default();
    pb::ExplainPod {
        name: p.metadata.name.clone().unwrap_or_default(),
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default(),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        waiting,
    }
}

/// The pod a PVC's volume is explained for: one that is not running yet, else any.
fn waiting_pod(pods: Vec<Pod>) -> Option<Pod> {
    let running = |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    let mut pods = pods;
    pods.sort_by_key(|p| running(p));
    pods.into_iter().next()
}

/// The volumes to explain: the pod's (those that may be block devices), or the one claim.
fn volumes_of(c: &Cluster, pod: Option<&Pod>, claim: Option<&str>, pv: Option<&str>) -> Vec<Volume> {
    let pv_of = |n: &str| c.pv(n);
    let claimed = |name: &str, key: &str| volumes::from_claim(name, key, c.pvcs.get(key).as_deref(), pv_of);
    let mut out: Vec<Volume> = match pod {
        Some(p) => volumes::of_pod(p)
            .into_iter()
            .map(|(name, v)| match v {
                Ok(key) => claimed(&name, &key),
                Err(inline) => volumes::from_inline(&name, &inline),
            })
            .collect(),
        None => Vec::new(),
    };
    if let Some(key) = claim {
        out.retain(|v| v.pvc == key);
        if out.is_empty() {
            out.push(claimed("", key));
        }
    } else if let Some(name) = pv {
        out.retain(|v| v.pv == name);
        if out.is_empty() {
            out.push(c.pv(name).map(|o| volumes::from_pv(&o)).unwrap_or_default());
        }
    }
    out
}

impl FleetService {
    /// Explain's deadline for each read of the API.
    fn read_timeout(&self) -> Duration {
        self.links.options().call_timeout
    }

    /// The pod (for a PVC or PV: the pod waiting for it), and the claim and PV asked about.
    async fn find_pod(
        &self,
        c: &Cluster,
        client: &kube::Client,
        asked: &Asked,
    ) -> Result<(Option<Pod>, Option<String>, Option<String>), Status> {
        let t = self.read_timeout();
        let claim = match asked {
            Asked::Pod { ns, name } => {
                // Kept (a pod with a volume that may be a block device), else read from the API.
                if let Some(p) = c.pods.get(&format!("{ns}/{name}")) {
                    return Ok((Some(Arc::unwrap_or_clone(p)), None, None));
                }
                let pod = fetch::pod(client, t, ns, name).await.map_err(Status::unavailable)?;
                let pod = pod.ok_or_else(|| Status::not_found(format!("no pod {ns}/{name}")))?;
                return Ok((Some(pod), None, None));
            }
            Asked::Pvc { ns, name } => {
                if c.pvcs.get(&format!("{ns}/{name}")).is_none() {
                    return Err(Status::not_found(format!("no PersistentVolumeClaim {ns}/{name}")));
                }
                format!("{ns}/{name}")
            }
            Asked::Pv { name } => {
                let pv =
                    c.pv(name).ok_or_else(|| Status::not_found(format!("no PersistentVolume {name}")))?;
                let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                match claim.and_then(|r| Some(format!("{}/{}", r.namespace.as_deref()?, r.name.as_deref()?)))
                {
                    Some(key) => key,
                    None => return Ok((None, None, Some(name.clone()))),
                }
            }
        };
        let (ns, name) = claim.split_once('/').unwrap_or(("", ""));
        let pods = if c.pods.synced() {
            c.pods_claiming(&claim).into_iter().map(Arc::unwrap_or_clone).collect()
        } else {
            fetch::pods_claiming(client, t, ns, name).await.map_err(Status::unavailable)?
        };
        let pv = match asked {
            Asked::Pv { name } => Some(name.clone()),
            _ => None,
        };
        Ok((waiting_pod(pods), Some(claim), pv))
    }

    /// The pods on the nodes whose devices of these volumes have holders in pods (by uid).
    async fn holders_pods(&self, client: &kube::Client, all: &[(Volume, Vec<NodeFacts>)]) -> Pods {
        let nodes: BTreeSet<String> = all
            .iter()
            .flat_map(|(_, fs)| fs.iter())
            .filter(|f| f.devs().any(|d| d.holders.iter().any(|h| !h.pod_uid.is_empty())))
            .map(|f| f.node.clone())
            .collect();
        let t = self.read_timeout();
        let mut reads = tokio::task::JoinSet::new();
        for n in nodes {
            let client = client.clone();
            reads.spawn(async move { fetch::pods_on(&client, t, &n).await });
        }
        let mut pods = Pods::new();
        while let Some(list) = reads.join_next().await {
            match list {
                Ok(Ok(list)) => {
                    pods.extend(list.into_iter().map(|p| (p.metadata.uid.clone().unwrap_or_default(), p)))
                }
                Ok(Err(e)) => tracing::info!(error = %e, "Explain: a holder's pods could not be read"),
                Err(e) => tracing::warn!(error = %e, "Explain: a read of a holder's pods ended"),
            }
        }
        pods
    }

    /// The answer (see the module docs).
    pub(crate) async fn explain_now(&self, r: pb::ExplainRequest) -> Result<pb::ExplainResponse, Status> {
        let asked = Asked::parse(&r)?;
        let c = self.cluster()?.clone();
        let client = c
            .client
            .clone()
            .ok_or_else(|| Status::failed_precondition("the console has no Kubernetes API client"))?;
        let (pod, claim, pv) = self.find_pod(&c, &client, &asked).await?;
        let (ev_ns, ev_kind, ev_name) = match &asked {
            Asked::Pod { ns, name } => (ns.clone(), "Pod", name.clone()),
            Asked::Pvc { ns, name } => (ns.clone(), "PersistentVolumeClaim", name.clone()),
            Asked::Pv { name } => ("default".to_owned(), "PersistentVolume", name.clone()),
        };
        let (events, read_error) =
            fetch::events(&client, self.read_timeout(), &ev_ns, ev_kind, &ev_name).await;
        let summary = pod.as_ref().map(pod_summary);
        let pod_node = summary.as_ref().map(|p| p.node.clone()).unwrap_or_default();
        let all: Vec<(Volume, Vec<NodeFacts>)> = {
            let vols = volumes_of(&c, pod.as_ref(), claim.as_deref(), pv.as_deref());
            let ix = self.index.read();
            vols.into_iter()
                .map(|v| {
                    let f = facts::gather(&ix, Some(&c), &v, &pod_node);
                    (v, f)
                })
                .collect()
        };
        let pods = self.holders_pods(&client, &all).await;
        let agent_pods = {
            let ix = self.index.read();
            let mut m: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
            for (n, e) in &ix.nodes {
                m.insert(n.clone(), e.agent_pod.clone());
            }
            for (n, g) in &ix.gone {
                m.insert(n.clone(), g.entry.agent_pod.clone());
            }
            m
        };
        let agent_pod = |n: &str| agent_pods.get(n).cloned().unwrap_or_default();
        let cx =
            diagnose::Context { pod: summary.as_ref(), pods: &pods, agent_pod: &agent_pod, now: now_secs() };
        let response = answer(&asked, summary.clone(), events, read_error, &all, &cx);
        tracing::info!(target = %response.target, outcome = response.outcome, "Explain: {}",
            response.diagnosis.as_ref().map(|d| d.summary.as_str()).unwrap_or(""));
        Ok(response)
    }
}

/// Ranks a diagnosis for the answer's one: blocked (held, private copy, dead node, attached not
/// in use) first, then unknown, then nothing blocks.
fn rank(d: &pb::ExplainDiagnosis) -> u8 {
    match pb::Cause::try_from(d.cause).unwrap_or(pb::Cause::Unspecified) {
        pb::Cause::HeldElsewhere => 0,
        pb::Cause::PrivateMountCopy => 1,
        pb::Cause::DeadNode => 2,
        pb::Cause::AttachedNotInUse => 3,
        pb::Cause::Unknown => 4,
        pb::Cause::NothingBlocks => 5,
        pb::Cause::Unspecified => 6,
    }
}

/// The response: every volume with its nodes and diagnosis, the one to act on, the outcome.
fn answer(
    asked: &Asked,
    pod: Option<pb::ExplainPod>,
    events: Vec<pb::ExplainEvent>,
    read_error: String,
    all: &[(Volume, Vec<NodeFacts>)],
    cx: &diagnose::Context<'_>,
) -> pb::ExplainResponse {
    let mut missing: Vec<pb::MissingNode> = Vec::new();
    let mut explained = Vec::new();
    for (v, fs) in all {
        let d = diagnose::diagnose(v, fs, cx);
        for f in fs.iter().filter(|f| !f.liveness.agent_answers) {
            if !missing.iter().any(|m| m.node == f.node) {
                let age = if f.liveness.view_age_seconds > 0.0 {
                    format!("; its last view is {:.0} s old", f.liveness.view_age_seconds)
                } else {
                    String::new()
                };
                missing.push(pb::MissingNode {
                    node: f.node.clone(),
                    reason: format!("{}{age}", f.liveness.agent_error),
                    ..Default::default()
                });
            }
        }
        explained.push(pb::ExplainedVolume {
            name: v.name.clone(),
            pvc: v.pvc.clone(),
            pvc_phase: v.pvc_phase.clone(),
            pv: v.pv.clone(),
            driver: v.driver.clone(),
            volume_handle: v.handle.clone(),
            identity: v.identity.clone(),
            nodes: fs.iter().map(|f| node_message(f, cx)).collect(),
            diagnosis: Some(d),
        });
    }
    let first = explained.iter().filter_map(|v| v.diagnosis.as_ref()).min_by_key(|d| rank(d)).cloned();
    let diagnosis = first.unwrap_or_else(|| pb::ExplainDiagnosis {
        cause: pb::Cause::NothingBlocks as i32,
        outcome: pb::ExplainOutcome::NotBlocked as i32,
        summary: "no volume of it is one a node maps (no claim, no rbd, iSCSI, FC or CSI volume): nothing on a node \
                  blocks it"
            .into(),
        next: advice::elsewhere(pod.as_ref(), &Volume::default()),
        ..Default::default()
    });
    let events_note = match (read_error.is_empty(), events.is_empty()) {
        (false, _) => format!("events could not all be read ({read_error}): explained from state"),
        (true, true) => "no events left about it (they expire after an hour): explained from state".into(),
        (true, false) => String::new(),
    };
    pb::ExplainResponse {
        target: asked.text(),
        pod,
        events,
        events_note,
        volumes: explained,
        outcome: diagnosis.outcome,
        diagnosis: Some(diagnosis),
        missing_nodes: missing,
        unix_seconds: cx.now,
    }
}

/// One node's part, as the answer shows it.
fn node_message(f: &NodeFacts, cx: &diagnose::Context<'_>) -> pb::VolumeOnNode {
    pb::VolumeOnNode {
        node: f.node.clone(),
        pod_node: f.pod_node,
        devices: f.devices.clone(),
        volume_attachments: f.vas.iter().map(|(n, a)| format!("{n} (attached={a})")).collect(),
        in_volumes_attached: f.in_attached,
        in_volumes_in_use: f.in_use,
        holders: f.devs().flat_map(|d| holders::of_device(&f.node, d, cx.pods)).collect(),
        liveness: Some(f.liveness.clone()),
    }
}

#[cfg(test)]
mod tests;
