//! What the console forwards to the agents, always on behalf of a person: a node's Plan, and an
//! Apply's execution node by node (the first failure stops the rest, and the error names who ran
//! before it and who was not asked). The person travels in [`ON_BEHALF_OF`] and their groups in
//! [`ON_BEHALF_OF_GROUPS`] (one value each), which the agent accepts for Apply only from the
//! console role and writes into its audit line.

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::auth::{ON_BEHALF_OF, ON_BEHALF_OF_GROUPS};
use blockjanitor_rpc::client;
use tonic::metadata::MetadataValue;
use tonic::{Request, Status};

use std::time::Duration;

use blockjanitor_proto::v1::agent_client::AgentClient;

use crate::apply;
use crate::index::Index;
use crate::lease::ApplyLease;
use crate::link::Links;
use crate::person::Person;

/// Marks a forwarded call as made on behalf of `person`.
pub(crate) fn on_behalf_of<T>(req: &mut Request<T>, person: &Person) -> Result<(), Status> {
    let text = |what: &str, v: &str| {
        MetadataValue::try_from(v).map_err(|_| {
            Status::invalid_argument(format!(
                "the caller's {what} '{v}' cannot travel as gRPC metadata (ASCII)"
            ))
        })
    };
    req.metadata_mut().insert(ON_BEHALF_OF, text("name", &person.name)?);
    for g in &person.groups {
        req.metadata_mut().append(ON_BEHALF_OF_GROUPS, text("group", g)?);
    }
    Ok(())
}

/// The console's way to the agents.
pub(crate) struct Forwarder<'a> {
    pub index: &'a Index,
    pub links: &'a Links,
    /// Bound on a forwarded Apply.
    pub apply_timeout: Duration,
    /// The apply Lease: re-checked (written) before every node's step, watched during it.
    pub lease: &'a ApplyLease,
}

/// The metadata naming the console replica that sent a call (an agent's stand-in records it;
/// a replica that receives a forwarded Apply does not forward it again).
pub const FROM_REPLICA: &str = "x-blockjanitor-console-replica";

impl Forwarder<'_> {
    /// The connected agent on `node`, or why there is none.
    fn agent_for(&self, node: &str) -> Result<AgentClient<tonic::transport::Channel>, Status> {
        if node.is_empty() {
            return Err(Status::invalid_argument("name the node"));
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

    /// One node's plan of `devices` (CLEAN), asked on behalf of `person`.
    pub(crate) async fn node_plan(
        &self,
        node: &str,
        devices: Vec<String>,
        person: &Person,
    ) -> Result<pb::PlanResponse, Status> {
        let mut c = self.agent_for(node)?;
        let timeout = self.links.options().call_timeout;
        let mut req =
            client::request(pb::PlanRequest { devices, operation: pb::Operation::Clean as i32 }, timeout);
        on_behalf_of(&mut req, person)?;
        client::call(timeout, c.plan(req))
            .await
            .map_err(|s| Status::new(s.code(), format!("the agent on {node}: {}", s.message())))
    }

    /// Carries out `targets` node by node, in order, on behalf of `person`, adding each node's
    /// result to `response`; the first failure stops the rest. Before each node's step the apply
    /// Lease is written with it (proof that this replica still holds it, and a lock on the node
    /// across replicas: [`crate::lease_steps`]); a Lease lost during a step stops the Apply at
    /// once (the agent may still finish that one step; no further node is asked).
    pub(crate) async fn execute(
        &self,
        targets: &[apply::Target],
        person: &Person,
        response: &mut pb::FleetApplyResponse,
    ) -> Result<(), Status> {
        for (i, target) in targets.iter().enumerate() {
            let mut c = match self.agent_for(&target.node) {
                Ok(c) => c,
                Err(s) => return Err(stopped(s, &target.node, &response.results, &targets[i + 1..])),
            };
            // The step may run until the Apply's deadline, and a little past it on the agent.
            let until = blockjanitor_rpc::view::time::now_secs() + self.apply_timeout.as_secs_f64() + 30.0;
            if let Err(why) = self.lease.begin_step(&target.node, until).await {
                let s = Status::unavailable(format!("nothing was sent to {}: {why}", target.node));
                return Err(stopped(s, &target.node, &response.results, &targets[i + 1..]));
            }
            let mut fwd = client::request(
                pb::ApplyRequest {
                    devices: target.devices.clone(),
                    identities: target.identities.clone(),
                    operation: pb::Operation::Clean as i32,
                },
                self.apply_timeout,
            );
            on_behalf_of(&mut fwd, person)?;
            if let Ok(me) = MetadataValue::try_from(self.lease.identity()) {
                fwd.metadata_mut().insert(FROM_REPLICA, me);
            }
            tracing::info!(target: "audit", node = %target.node, caller = %person.name,
                groups = %person.groups.join(","), authenticated_by = person.via.as_str(),
                devices = %target.devices.join(","), "forwarding Apply to the agent on {} for {}", target.node, person.name);
            let called = tokio::select! {
                r = client::call(self.apply_timeout, c.apply(fwd)) => r,
                () = self.lease.lost() => {
                    tracing::warn!(target: "audit", node = %target.node, caller = %person.name,
                        "the apply Lease was lost during the step on {}: the Apply stops here", target.node);
                    self.links.request_resync(&target.node);
                    let s = Status::unavailable(format!(
                        "this console replica lost the apply Lease during the step on {}: it stopped waiting (the \
                         agent may still finish that step; the Lease names it, so no other replica sends {} a step \
                         before it may have ended)",
                        target.node, target.node
                    ));
                    return Err(stopped(s, &target.node, &response.results, &targets[i + 1..]));
                }
            };
            self.lease.end_step(&target.node).await;
            match called {
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
        Ok(())
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
pub(crate) async fn join_in_order<F: std::future::Future>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output> {
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
