//! `blockjanitor.v1.Fleet`: answers from the fleet index (or, with `fresh`, after asking every
//! connected agent at once), diagnoses Multi-Attach from the Kubernetes view and the index, and
//! forwards Plan and Apply to the nodes' agents. Every answer names the nodes it cannot speak for.
//! Roles come from the caller's client certificate, as on the agent; Apply needs an operator and
//! reaches the agent with the caller's identity in [`ON_BEHALF_OF`] (forwarded Plans carry it
//! too, so that each agent's rate limit counts each caller apart, not the console as one).
//!
//! Apply ([`crate::apply`]): every device with the identity its node's Plan answered, a dry run
//! asking every target node for its plan first (the summary is always returned), execution only
//! when the request says so and the dry run shows no refusal, a fleet-wide budget of steps a
//! minute, and per-caller limits on Applies and Plans a minute.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_server::Fleet;
use blockjanitor_rpc::auth::{Policy, Role, ON_BEHALF_OF};
use blockjanitor_rpc::client;
use tonic::metadata::MetadataValue;
use tonic::{Request, Response, Status};

use blockjanitor_rpc::peer_limit::PeerLimit;

use crate::apply::{self, StepBudget};
use crate::ceph_addr;
use crate::cluster::Cluster;
use crate::index::{Index, Key};
use crate::link::Links;
use crate::metrics::Metrics;
use crate::multiattach;
use crate::sweep;
use crate::watchers;

/// Everything the service reads.
pub struct FleetService {
    pub index: Index,
    pub links: Arc<Links>,
    /// The Kubernetes view (`None`: the console runs without the API; PV/PVC questions fail).
    pub cluster: Option<Cluster>,
    pub policy: Arc<Policy>,
    pub metrics: Arc<Metrics>,
    /// Bound on a forwarded Apply.
    pub apply_timeout: Duration,
    /// Applies (dry runs included) a minute per caller.
    pub apply_limit: PeerLimit,
    /// Plans a minute per caller.
    pub plan_limit: PeerLimit,
    /// What the two limits are, for their messages.
    pub limits: CallerLimits,
    /// The fleet-wide budget of steps a minute.
    pub budget: StepBudget,
}

/// Per-caller limits a minute (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerLimits {
    pub applies_per_minute: u32,
    pub plans_per_minute: u32,
}

impl Default for CallerLimits {
    fn default() -> Self {
        CallerLimits { applies_per_minute: 10, plans_per_minute: 60 }
    }
}

/// Marks a forwarded call as made on behalf of `who`.
fn on_behalf_of<T>(req: &mut Request<T>, who: &str) -> Result<(), Status> {
    let value = MetadataValue::try_from(who)
        .map_err(|_| Status::invalid_argument("the caller's identity cannot travel as metadata"))?;
    req.metadata_mut().insert(ON_BEHALF_OF, value);
    Ok(())
}

/// What a WhoWatches request asks about: `text` (any form [`ceph_addr::parse_query`] reads), or
/// `client_addr` and/or `client_id`. Anything not understood is an error, never an answer.
fn parse_who_watches(r: &pb::WhoWatchesRequest) -> Result<Vec<ceph_addr::Query>, String> {
    if !r.text.trim().is_empty() {
        return ceph_addr::parse_query(&r.text).map_err(|e| e.to_string());
    }
    let (addr, id) = (r.client_addr.trim(), r.client_id.trim());
    if addr.is_empty() && id.is_empty() {
        return Err(format!("give client_addr, client_id or text: {}", ceph_addr::EXPECTED));
    }
    let mut q = ceph_addr::Query::default();
    if !addr.is_empty() {
        q.addrs = ceph_addr::parse_addr(addr).map_err(|e| e.to_string())?;
        q.addr_text = addr.to_owned();
    }
    if !id.is_empty() {
        q.client = Some(ceph_addr::parse_client(id).map_err(|e| e.to_string())?);
    }
    Ok(vec![q])
}

pub(crate) fn uninterpretable(what: &str) -> Status {
    Status::invalid_argument(what.to_owned())
}

impl FleetService {
    pub(crate) fn cluster(&self) -> Result<&Cluster, Status> {
        let c = self.cluster.as_ref().ok_or_else(|| {
            Status::failed_precondition(
                "the console runs without the Kubernetes API: PVs and PVCs are unknown",
            )
        })?;
        if let Some(why) = c.not_synced() {
            return Err(Status::unavailable(why));
        }
        Ok(c)
    }

    /// Counts a call by `caller` against `limit`, or refuses it saying when to try again.
    fn admit(&self, limit: &PeerLimit, caller: &str, what: &str, per_minute: u32) -> Result<(), Status> {
        limit.admit(caller, Instant::now()).map_err(|wait| {
            tracing::warn!(caller = %caller, limit = per_minute, "{what} refused: rate limit");
            Status::resource_exhausted(format!(
                "{caller} asked for more than {per_minute} {what} a minute on this console: try again in {} s",
                wait.as_secs() + 1
            ))
        })
    }

    /// One node's plan of `devices` (CLEAN), asked on behalf of `caller`.
    async fn node_plan(
        &self,
        node: &str,
        devices: Vec<String>,
        caller: &str,
    ) -> Result<pb::PlanResponse, Status> {
        let mut c = self.agent_for(node)?;
        let timeout = self.links.options().call_timeout;
        let mut req =
            client::request(pb::PlanRequest { devices, operation: pb::Operation::Clean as i32 }, timeout);
        on_behalf_of(&mut req, caller)?;
        client::call(timeout, c.plan(req))
            .await
            .map_err(|s| Status::new(s.code(), format!("the agent on {node}: {}", s.message())))
    }

    fn timed<T>(&self, method: &'static str, started: Instant, r: T) -> T {
        self.metrics.observe(method, started.elapsed());
        r
    }

    /// The nodes answers cannot speak for: agents not reachable and synced, and, with the
    /// Kubernetes API, every Node with no agent at all.
    fn missing_of(&self, ix: &crate::index::Inner) -> Vec<pb::MissingNode> {
        sweep::missing_nodes(ix, self.cluster.as_ref())
    }

    pub(crate) fn lookup(&self, keys: &[Key]) -> (Vec<pb::FleetDevice>, Vec<pb::MissingNode>) {
        let ix = self.index.read();
        let mut out: Vec<pb::FleetDevice> = Vec::new();
        for k in keys {
            for d in ix.lookup(k) {
                let same = |o: &pb::FleetDevice| {
                    o.node == d.node
                        && o.device.as_ref().map(|x| &x.name) == d.device.as_ref().map(|x| &x.name)
                };
                if !out.iter().any(same) {
                    out.push(d);
                }
            }
        }
        (out, self.missing_of(&ix))
    }

    /// The rbd mappings that belong to a WhoWatches query (parsed values compared, never raw
    /// text), the rbd mappings whose client cannot be read (they may be this client's) and the
    /// nodes not answered for.
    fn watcher_mappings(
        &self,
        q: &ceph_addr::Query,
    ) -> (Vec<pb::FleetDevice>, Vec<String>, Vec<pb::MissingNode>) {
        let ix = self.index.read();
        let mut found = Vec::new();
        let mut unreadable = Vec::new();
        // A node's mappings mostly share one client (one kernel client per cluster): the last
        // client's verdict is reused for the same text, so a question parses about one address per
        // node, not one per mapping (the fleet bench: 22,500 mappings at 5,000 agents).
        let mut last: Option<(&str, &str, bool, bool)> = None;
        for n in ix.nodes.values() {
            for d in n.devices.values() {
                let Some(r) = &d.rbd else { continue };
                let (matches, readable) = match last {
                    Some((a, i, m, rd)) if a == r.client_addr && i == r.client_id => (m, rd),
                    _ => {
                        let m = q.matches(&r.client_addr, &r.client_id);
                        let rd = m || ceph_addr::readable(&r.client_addr, &r.client_id);
                        last = Some((&r.client_addr, &r.client_id, m, rd));
                        (m, rd)
                    }
                };
                if matches {
                    found.push(pb::FleetDevice { node: n.name.clone(), device: Some(pb::Device::clone(d)) });
                } else if !readable {
                    unreadable.push(format!("{}/{}", n.name, d.name));
                }
            }
        }
        (found, unreadable, self.missing_of(&ix))
    }

    /// The fleet-wide sweep of the index (after asking every agent, with `fresh`).
    async fn sweep_now(&self, fresh: bool, kinds: &[pb::FindingKind]) -> pb::SweepResponse {
        if fresh {
            self.links.refresh_all(None).await;
        }
        let answer = sweep::run(&self.index.read(), self.cluster.as_ref(), kinds);
        tracing::info!(
            findings = answer.findings.len(),
            complete = answer.complete,
            missing = answer.missing_nodes.len(),
            "sweep: {}",
            answer.summary
        );
        answer
    }

    fn agent_for(
        &self,
        node: &str,
    ) -> Result<blockjanitor_proto::v1::agent_client::AgentClient<tonic::transport::Channel>, Status> {
        if node.is_empty() {
            return Err(uninterpretable("name the node"));
        }
        let reason = match self.index.read().nodes.get(node) {
            None => return Err(Status::not_found(format!("no agent is known on node {node}"))),
            Some(n) => n.missing_reason(),
        };
        self.links.client(node).ok_or_else(|| {
            Status::unavailable(format!(
                "the agent on {node} is not connected ({})",
                reason.unwrap_or_default()
            ))
        })
    }
}

#[tonic::async_trait]
impl Fleet for FleetService {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let ix = self.index.read();
        let r = pb::ListNodesResponse {
            nodes: ix.nodes.values().map(|n| n.to_message()).collect(),
            missing_nodes: self.missing_of(&ix),
        };
        drop(ix);
        self.timed("ListNodes", t, Ok(Response::new(r)))
    }

    async fn list_devices(
        &self,
        req: Request<pb::FleetListDevicesRequest>,
    ) -> Result<Response<pb::FleetListDevicesResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let r = req.into_inner();
        if r.fresh {
            self.links.refresh_all((!r.node.is_empty()).then_some(r.node.as_str())).await;
        }
        let ix = self.index.read();
        if !r.node.is_empty() && !ix.nodes.contains_key(&r.node) {
            return Err(Status::not_found(format!("no agent is known on node {}", r.node)));
        }
        let devices = ix
            .nodes
            .values()
            .filter(|n| r.node.is_empty() || n.name == r.node)
            .flat_map(|n| n.devices.values().map(move |d| (n, d)))
            .filter(|(_, d)| r.kind == 0 || d.kind == r.kind)
            .filter(|(_, d)| r.verdict == 0 || d.verdict == r.verdict)
            .map(|(n, d)| pb::FleetDevice { node: n.name.clone(), device: Some(pb::Device::clone(d)) })
            .collect();
        let missing_nodes =
            self.missing_of(&ix).into_iter().filter(|m| r.node.is_empty() || m.node == r.node).collect();
        drop(ix);
        self.timed(
            "ListDevices",
            t,
            Ok(Response::new(pb::FleetListDevicesResponse { devices, missing_nodes })),
        )
    }

    async fn r#where(&self, req: Request<pb::WhereRequest>) -> Result<Response<pb::WhereResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let r = req.into_inner();
        let resolved = self.resolve(&r)?;
        if r.fresh {
            self.links.refresh_all(None).await;
        }
        let (mut matches, missing_nodes) = self.lookup(&resolved.keys);
        if let Some(target) = &resolved.target {
            matches.extend(self.scan_target(target));
        }
        let resolved = resolved.text;
        self.timed("Where", t, Ok(Response::new(pb::WhereResponse { resolved, matches, missing_nodes })))
    }

    async fn who_watches(
        &self,
        req: Request<pb::WhoWatchesRequest>,
    ) -> Result<Response<pb::WhoWatchesResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let r = req.into_inner();
        let asked = parse_who_watches(&r).map_err(|e| {
            tracing::info!(error = %e, "WhoWatches: query not understood");
            uninterpretable(&e)
        })?;
        if r.fresh {
            self.links.refresh_all(None).await;
        }
        let mut out = Vec::new();
        let mut missing = Vec::new();
        for w in asked {
            let (mappings, unreadable, m) = self.watcher_mappings(&w);
            missing = m;
            let ip =
                w.ip().or_else(|| watchers::ip_of_mappings(&mappings)).map(|i| i.to_canonical().to_string());
            let node_by_address = match (&self.cluster, ip) {
                (Some(c), Some(ip)) => c.node_with_address(&ip).unwrap_or_default(),
                _ => String::new(),
            };
            out.push(watchers::answer(&w, mappings, &unreadable, &missing, node_by_address));
        }
        self.timed(
            "WhoWatches",
            t,
            Ok(Response::new(pb::WhoWatchesResponse { watchers: out, missing_nodes: missing })),
        )
    }

    async fn multi_attach(
        &self,
        req: Request<pb::MultiAttachRequest>,
    ) -> Result<Response<pb::MultiAttachResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let caller = self.policy.caller(&req)?;
        let r = req.into_inner();
        if r.pv.is_empty() && r.pvc.is_empty() {
            let sweep = self.sweep_now(false, &[]).await;
            let missing_nodes = sweep.missing_nodes.clone();
            let r = pb::MultiAttachResponse { sweep: Some(sweep), missing_nodes, ..Default::default() };
            return self.timed("MultiAttach", t, Ok(Response::new(r)));
        }
        let cluster = self.cluster()?;
        let pv = match (r.pv.is_empty(), r.pvc.is_empty()) {
            (false, true) => r.pv.clone(),
            (true, false) => cluster.pv_of_pvc(&r.pvc).map_err(Status::not_found)?,
            _ => return Err(uninterpretable("give exactly one of pv, pvc")),
        };
        let obj = cluster.pv(&pv).ok_or_else(|| Status::not_found(format!("no PersistentVolume {pv}")))?;
        let v = multiattach::volume_id(&obj);
        let vas = cluster.vas_of(&pv);
        let nodes = cluster.nodes.all();
        let mut missing = self.missing_of(&self.index.read());
        let mut diags = multiattach::diagnose(&v, &vas, &nodes, &self.index.read(), &mut missing);
        // A stale mapping: the agent's own plan is the exact way to clear it (asked on behalf of
        // the caller, as every forwarded call is, so the agent's audit names who wanted it).
        for d in diags.iter_mut().filter(|d| d.diagnosis == pb::Diagnosis::StaleMapping as i32) {
            let devices: Vec<String> =
                d.devices.iter().filter_map(|f| f.device.as_ref().map(|x| x.name.clone())).collect();
            if self.links.client(&d.node).is_none() {
                continue;
            }
            match self.node_plan(&d.node, devices, &caller.identity).await {
                Ok(p) => {
                    for plan in p.plans {
                        d.clear_steps.extend(plan.steps);
                        d.identities.push(plan.identity);
                        if !plan.refusal.is_empty() {
                            d.detail.push_str(&format!(
                                "; the agent refuses to clean {}: {}",
                                plan.device, plan.refusal
                            ));
                        }
                    }
                }
                Err(s) => d
                    .detail
                    .push_str(&format!("; the agent's plan could not be read: {}", client::status_line(&s))),
            }
        }
        self.timed(
            "MultiAttach",
            t,
            Ok(Response::new(pb::MultiAttachResponse {
                pv,
                nodes: diags,
                missing_nodes: missing,
                sweep: None,
            })),
        )
    }

    async fn sweep(&self, req: Request<pb::SweepRequest>) -> Result<Response<pb::SweepResponse>, Status> {
        let t = Instant::now();
        self.policy.require(&req, Role::Viewer)?;
        let r = req.into_inner();
        let kinds = r
            .kinds
            .iter()
            .map(|k| {
                pb::FindingKind::try_from(*k).ok().filter(|k| *k != pb::FindingKind::Unspecified).ok_or_else(
                    || uninterpretable(&format!("finding kind {k} is not one of {:?}", sweep::KINDS)),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let answer = self.sweep_now(r.fresh, &kinds).await;
        self.timed("Sweep", t, Ok(Response::new(answer)))
    }

    async fn plan(
        &self,
        req: Request<pb::FleetPlanRequest>,
    ) -> Result<Response<pb::FleetPlanResponse>, Status> {
        let t = Instant::now();
        let caller = self.policy.caller(&req)?;
        self.admit(&self.plan_limit, &caller.identity, "Plans", self.limits.plans_per_minute)?;
        let r = req.into_inner();
        let plan = self.node_plan(&r.node, r.devices, &caller.identity).await?;
        self.timed("Plan", t, Ok(Response::new(pb::FleetPlanResponse { node: r.node, plan: Some(plan) })))
    }

    async fn apply(
        &self,
        req: Request<pb::FleetApplyRequest>,
    ) -> Result<Response<pb::FleetApplyResponse>, Status> {
        let t = Instant::now();
        let caller = self.policy.caller(&req)?;
        if caller.role < Role::Operator {
            return Err(Status::permission_denied("Apply needs the operator role on the console"));
        }
        let r = req.into_inner();
        let targets = apply::targets(&r).map_err(|e| Status::invalid_argument(e.to_string()))?;
        self.admit(&self.apply_limit, &caller.identity, "Applies", self.limits.applies_per_minute)?;
        // With several replicas only the apply Lease's holder spends the fleet's one budget:
        // the others refuse an execution before asking any node (dry runs: any replica).
        if r.execute {
            self.budget.may_apply(Instant::now()).map_err(Status::unavailable)?;
        }

        // The dry run: every target's plan, asked at once, before anything runs.
        let plans = join_in_order(
            targets
                .iter()
                .map(|target| self.node_plan(&target.node, target.devices.clone(), &caller.identity)),
        )
        .await;
        let summary: Vec<pb::NodePlanSummary> = targets
            .iter()
            .zip(plans)
            .map(|(target, plan)| apply::summarise(target, plan.map_err(|s| s.message().to_owned())))
            .collect();
        let steps: u32 = summary.iter().map(|s| s.steps).sum();
        let text = apply::summary_text(&summary);
        let devices = targets
            .iter()
            .flat_map(|t| t.devices.iter().map(move |d| format!("{}/{d}", t.node)))
            .collect::<Vec<_>>()
            .join(",");
        tracing::info!(target: "audit", caller = %caller.identity, devices = %devices, steps, execute = r.execute,
            "Apply dry run for {}:\n{text}", caller.identity);
        let mut response = pb::FleetApplyResponse {
            node: targets[0].node.clone(),
            result: None,
            on_behalf_of: caller.identity.clone(),
            summary,
            executed: false,
            results: Vec::new(),
            budget_steps_left: self.budget.left(Instant::now()),
            budget_steps_per_minute: self.budget.per_minute(),
        };
        if !r.execute {
            return self.timed("Apply", t, Ok(Response::new(response)));
        }
        let refused: Vec<String> = response
            .summary
            .iter()
            .filter(|s| !s.refusal.is_empty())
            .map(|s| format!("{}: {}", s.node, s.refusal))
            .collect();
        if !refused.is_empty() {
            return Err(Status::failed_precondition(format!(
                "the dry run refuses, so nothing ran: {}",
                refused.join("; ")
            )));
        }
        // Still the holder after the dry run?
        self.budget.may_apply(Instant::now()).map_err(Status::unavailable)?;
        response.budget_steps_left =
            self.budget.take(steps, Instant::now()).map_err(|e| Status::resource_exhausted(e.to_string()))?;

        // Node by node, in order; the first failure stops the rest.
        for (i, target) in targets.iter().enumerate() {
            let mut c = match self.agent_for(&target.node) {
                Ok(c) => c,
                Err(s) => return Err(stopped(s, &target.node, &response.results, &targets[i + 1..])),
            };
            let mut fwd = client::request(
                pb::ApplyRequest {
                    devices: target.devices.clone(),
                    identities: target.identities.clone(),
                    operation: pb::Operation::Clean as i32,
                },
                self.apply_timeout,
            );
            on_behalf_of(&mut fwd, &caller.identity)?;
            tracing::info!(target: "audit", node = %target.node, caller = %caller.identity,
                devices = %target.devices.join(","), "forwarding Apply to the agent on {}", target.node);
            match client::call(self.apply_timeout, c.apply(fwd)).await {
                Ok(result) => {
                    self.links.request_resync(&target.node);
                    response.results.push(pb::FleetApplyNodeResult {
                        node: target.node.clone(),
                        result: Some(result),
                        error: String::new(),
                    });
                }
                Err(s) => {
                    self.links.request_resync(&target.node);
                    let s = Status::new(s.code(), format!("the agent on {}: {}", target.node, s.message()));
                    return Err(stopped(s, &target.node, &response.results, &targets[i + 1..]));
                }
            }
        }
        response.executed = true;
        response.result = response.results.first().and_then(|r| r.result.clone());
        self.timed("Apply", t, Ok(Response::new(response)))
    }
}

/// A failed node's status, saying which nodes ran before it and which were not asked.
fn stopped(s: Status, node: &str, done: &[pb::FleetApplyNodeResult], rest: &[apply::Target]) -> Status {
    let mut message = s.message().to_owned();
    if !done.is_empty() {
        let names: Vec<&str> = done.iter().map(|d| d.node.as_str()).collect();
        message.push_str(&format!("; ran before it: {}", names.join(", ")));
    }
    if !rest.is_empty() {
        let names: Vec<&str> = rest.iter().map(|t| t.node.as_str()).collect();
        message.push_str(&format!("; not run after {node} failed: {}", names.join(", ")));
    }
    Status::new(s.code(), message)
}

/// Awaits every future together, keeping their order.
async fn join_in_order<F: std::future::Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<std::pin::Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (i, f) in pending.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.into_iter().flatten().collect()
}
