//! Fleet.Apply as the service runs it: the request read ([`crate::apply::targets`]), an
//! execution passed on to the holder of the apply Lease when this replica is not it
//! ([`crate::peer`]), the dry run (every target's plan at once), then, when asked and nothing
//! refuses, the execution node by node ([`crate::forward::Forwarder::execute`]: the Lease written
//! before each node's step, the Apply stopped when it is lost), with each target node claimed on
//! this replica for as long (a second Apply on the same node meanwhile is refused), within the
//! person's and the fleet's step budgets.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Instant;

use blockjanitor_proto::v1 as pb;
use tonic::Status;

use crate::apply;
use crate::forward::join_in_order;
use crate::person::{Person, Via};
use crate::service::FleetService;

/// Target nodes claimed on this replica while an Apply runs on them; released when dropped.
struct Claimed<'a> {
    set: &'a Mutex<BTreeSet<String>>,
    nodes: Vec<String>,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        let mut set = self.set.lock().unwrap_or_else(|p| p.into_inner());
        for n in &self.nodes {
            set.remove(n);
        }
    }
}

/// Claims every node of `targets`, or names those an Apply already runs on.
fn claim<'a>(set: &'a Mutex<BTreeSet<String>>, targets: &[apply::Target]) -> Result<Claimed<'a>, Status> {
    let mut s = set.lock().unwrap_or_else(|p| p.into_inner());
    let busy: Vec<&str> = targets.iter().map(|t| t.node.as_str()).filter(|n| s.contains(*n)).collect();
    if !busy.is_empty() {
        return Err(Status::aborted(format!(
            "an Apply is running on {} on this console now: nothing ran; ask again when it has ended",
            busy.join(", ")
        )));
    }
    let nodes: Vec<String> = targets.iter().map(|t| t.node.clone()).collect();
    s.extend(nodes.iter().cloned());
    Ok(Claimed { set, nodes })
}

impl FleetService {
    /// Fleet.Apply (see the module docs). `authorization`: the caller's bearer token as sent;
    /// `from`: the replica that forwarded this call, if one did.
    pub(crate) async fn apply_now(
        &self,
        caller: &Person,
        (authorization, from): (Option<String>, Option<String>),
        r: pb::FleetApplyRequest,
    ) -> Result<pb::FleetApplyResponse, Status> {
        let targets = apply::targets(&r).map_err(|e| Status::invalid_argument(e.to_string()))?;
        if r.execute {
            if let Some((holder, address)) = self.lease.other_holder() {
                return self.to_holder(caller, (authorization, from), (holder, address), r).await;
            }
        }
        self.admit(&self.apply_limit, &caller.name, "Applies", self.limits.applies_per_minute)?;
        // Only the apply Lease's holder spends the fleet's one budget: an execution is refused
        // before any node is asked when this replica cannot vouch that it holds it.
        if r.execute {
            self.budget.may_apply(Instant::now()).map_err(Status::unavailable)?;
        }
        let plans_running = self.enter(&self.concurrency.plans, caller)?;
        let (mut response, steps) = self.dry_run(caller, &targets, r.execute).await;
        drop(plans_running);
        if !r.execute {
            return Ok(response);
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
        let _claimed = claim(&self.applying, &targets)?;
        self.person_budget.take(&caller.name, steps, Instant::now()).map_err(Status::resource_exhausted)?;
        response.budget_steps_left = self.budget.take(steps, Instant::now()).map_err(|e| {
            self.person_budget.give_back(&caller.name, steps);
            Status::resource_exhausted(e.to_string())
        })?;
        self.forwarder().execute(&targets, caller, &mut response).await?;
        response.executed = true;
        response.result = response.results.first().and_then(|r| r.result.clone());
        Ok(response)
    }

    /// The dry run: every target's plan, asked at once, before anything runs; the response with
    /// its summary, and the steps it would take.
    async fn dry_run(
        &self,
        caller: &Person,
        targets: &[apply::Target],
        execute: bool,
    ) -> (pb::FleetApplyResponse, u32) {
        let forwarder = self.forwarder();
        let plans = join_in_order(
            targets.iter().map(|target| forwarder.node_plan(&target.node, target.devices.clone(), caller)),
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
        tracing::info!(target: "audit", caller = %caller.name, groups = %caller.groups.join(","),
            authenticated_by = caller.via.as_str(), devices = %devices, steps, execute,
            "Apply dry run for {}:\n{text}", caller.name);
        let response = pb::FleetApplyResponse {
            node: targets[0].node.clone(),
            result: None,
            on_behalf_of: caller.name.clone(),
            summary,
            executed: false,
            results: Vec::new(),
            budget_steps_left: self.budget.left(Instant::now()),
            budget_steps_per_minute: self.budget.per_minute(),
        };
        (response, steps)
    }

    /// An execution this replica may not carry out: passed on to the holder, or refused naming it.
    async fn to_holder(
        &self,
        caller: &Person,
        (authorization, from): (Option<String>, Option<String>),
        (holder, address): (String, String),
        r: pb::FleetApplyRequest,
    ) -> Result<pb::FleetApplyResponse, Status> {
        let refusal = || self.budget.may_apply(Instant::now()).err().unwrap_or_default();
        if let Some(by) = from {
            return Err(Status::unavailable(format!(
                "replica {by} forwarded this Apply here, but {}; nothing ran: retry",
                refusal()
            )));
        }
        let Some(tls) = self.peer.as_ref().filter(|_| !address.is_empty()) else {
            return Err(Status::unavailable(refusal()));
        };
        if caller.via == Via::Peer {
            return Err(Status::unavailable(refusal()));
        }
        let timeout = self.apply_timeout + std::time::Duration::from_secs(30);
        let me = self.lease.identity().to_owned();
        crate::peer::forward_apply(
            tls,
            (&holder, &address),
            &me,
            r,
            (authorization.as_deref(), caller),
            timeout,
        )
        .await
    }
}
