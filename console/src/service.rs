//! `blockjanitor.v1.Fleet`: answers from the fleet index (or, with `fresh`, after asking every
//! connected agent at once), diagnoses Multi-Attach from the Kubernetes view and the index, and
//! forwards Plan and Apply to the nodes' agents. Every answer names the nodes it cannot speak for.
//! Every call names a person ([`crate::access`]: a bearer token the API server's TokenReview
//! names, let through by a SubjectAccessReview of the method's verb on `fleet.blockjanitor.io`;
//! or a per-person client certificate): `get` for questions, `plan` for Plan, `apply` for Apply.
//! Forwarded calls reach the agent with that person in [`ON_BEHALF_OF`] (and their groups), so
//! each agent audits and counts each person apart, not the console as one.
//!
//! Apply ([`crate::apply`], [`crate::apply_run`]): every device with the identity its node's Plan
//! answered, a dry run asking every target node for its plan first (the summary is always
//! returned), execution only when the request says so and the dry run shows no refusal, by the
//! holder of the apply Lease only (another replica forwards it there: [`crate::peer`]), a
//! fleet-wide budget of steps a minute, and per-person limits on Applies, Plans and fresh
//! fan-outs a minute. How many fresh fan-outs, plans and sweeps run at once is bounded per
//! person and in total ([`crate::limits`]): over it, RESOURCE_EXHAUSTED at once.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_server::Fleet;
use tonic::{Request, Response, Status};

use blockjanitor_rpc::peer_limit::PeerLimit;

use crate::access::Access;
use crate::apply::StepBudget;
use crate::cluster::Cluster;
use crate::forward::Forwarder;
use crate::index::{Index, Key};
use crate::lease::ApplyLease;
use crate::limits::{Limit, Limits, Permit};
use crate::link::Links;
use crate::metrics::Metrics;
use crate::peer::PeerTls;
use crate::person::{Person, Verb};
use crate::person_budget::PersonBudget;
use crate::sweep;
use crate::sweeper::Sweeper;

/// The parts of a WhoWatchesStream answer (made in `crate::who_watches`).
pub type AnswerStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::WhoWatchesResponse, tonic::Status>> + Send>>;

/// Everything the service reads.
pub struct FleetService {
    pub index: Index,
    pub links: Arc<Links>,
    /// The Kubernetes view (`None`: the console runs without the API; PV/PVC questions fail).
    pub cluster: Option<Cluster>,
    /// Who may call, for what.
    pub access: Arc<Access>,
    pub metrics: Arc<Metrics>,
    /// Bound on a forwarded Apply.
    pub apply_timeout: Duration,
    /// Applies (dry runs included) a minute per caller.
    pub apply_limit: PeerLimit,
    /// Plans a minute per caller.
    pub plan_limit: PeerLimit,
    /// Fresh fan-outs a minute per caller (a question with `fresh`, a MultiAttach that asks the
    /// nodes' plans).
    pub fresh_limit: PeerLimit,
    /// What the two limits are, for their messages.
    pub limits: CallerLimits,
    /// The fleet-wide budget of steps a minute.
    pub budget: StepBudget,
    /// Each person's share of it.
    pub person_budget: PersonBudget,
    /// The sweep, kept current as events arrive.
    pub sweeper: Arc<Sweeper>,
    /// How many fresh fan-outs, plans and sweeps run at once.
    pub concurrency: Limits,
    /// The apply Lease (the budget's): whether this replica applies, and who does.
    pub lease: ApplyLease,
    /// How to reach the Lease's holder to forward an Apply (`None`: refuse, naming it).
    pub peer: Option<PeerTls>,
    /// Nodes with an Apply's execution in flight on this replica.
    pub applying: Mutex<BTreeSet<String>>,
}

/// Per-person limits a minute (0: none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallerLimits {
    pub applies_per_minute: u32,
    pub plans_per_minute: u32,
    /// Questions with `fresh` (each asks every agent) and MultiAttach diagnoses that ask plans.
    pub fresh_per_minute: u32,
    /// Steps carried out a minute per person (their share of the fleet's budget).
    pub steps_per_minute: u32,
}

impl Default for CallerLimits {
    fn default() -> Self {
        CallerLimits {
            applies_per_minute: 10,
            plans_per_minute: 60,
            fresh_per_minute: 12,
            steps_per_minute: 10,
        }
    }
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
    pub(crate) fn admit(
        &self,
        limit: &PeerLimit,
        caller: &str,
        what: &str,
        per_minute: u32,
    ) -> Result<(), Status> {
        limit.admit(caller, Instant::now()).map_err(|wait| {
            tracing::warn!(target: "audit", caller = %caller, limit = per_minute, "{what} refused: rate limit");
            Status::resource_exhausted(format!(
                "{caller} asked for more than {per_minute} {what} a minute on this console: try again in {} s",
                wait.as_secs() + 1
            ))
        })
    }

    /// The person behind `req` if they may do `verb`.
    async fn person<T>(&self, req: &Request<T>, verb: Verb) -> Result<Person, Status> {
        self.access.authorize(req, verb).await
    }

    /// Counts a fresh fan-out by `person`, when `fresh`, and lets it run if not too many do at
    /// once (the permit, held for the call; `None` when not fresh).
    pub(crate) fn admit_fresh(&self, person: &Person, fresh: bool) -> Result<Option<Permit>, Status> {
        if !fresh {
            return Ok(None);
        }
        let permit = self.enter(&self.concurrency.fresh, person)?;
        let what = "fresh fan-outs (--fresh: every agent asked)";
        self.admit(&self.fresh_limit, &person.name, what, self.limits.fresh_per_minute)?;
        Ok(Some(permit))
    }

    /// Lets one call of `limit`'s kind by `person` run, or refuses it (RESOURCE_EXHAUSTED).
    pub(crate) fn enter(&self, limit: &Limit, person: &Person) -> Result<Permit, Status> {
        limit.enter(&person.name).map_err(|(over, s)| {
            self.metrics.refused(limit.what.split(' ').next().unwrap_or(limit.what), over.label());
            tracing::warn!(target: "audit", caller = %person.name, limit = over.label(), "{} refused: too many at once", limit.what);
            s
        })
    }

    pub(crate) fn timed<T>(&self, method: &'static str, started: Instant, r: T) -> T {
        self.metrics.observe(method, started.elapsed());
        r
    }

    /// The nodes answers cannot speak for: agents not reachable and synced, and, with the
    /// Kubernetes API, every Node with no agent at all.
    pub(crate) fn missing_of(&self, ix: &crate::index::Inner) -> Vec<pb::MissingNode> {
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

    /// The fleet-wide sweep (after asking every agent, with `fresh`): the kept sweep caught up
    /// and put together on a blocking thread, never on a runtime worker.
    async fn sweep_now(
        &self,
        person: &Person,
        fresh: bool,
        kinds: &[pb::FindingKind],
    ) -> Result<pb::SweepResponse, Status> {
        let _one = self.enter(&self.concurrency.sweeps, person)?;
        if fresh {
            self.links.refresh_all(None).await;
        }
        let (sweeper, kinds) = (Arc::clone(&self.sweeper), kinds.to_vec());
        let answer = tokio::task::spawn_blocking(move || sweeper.answer(&kinds))
            .await
            .map_err(|e| Status::internal(format!("the sweep did not finish: {e}")))?;
        tracing::info!(
            findings = answer.findings.len(),
            complete = answer.complete,
            missing = answer.missing_nodes.len(),
            "sweep: {}",
            answer.summary
        );
        Ok(answer)
    }

    /// What forwards calls to the agents for this service.
    pub(crate) fn forwarder(&self) -> Forwarder<'_> {
        Forwarder {
            index: &self.index,
            links: &self.links,
            apply_timeout: self.apply_timeout,
            lease: &self.lease,
        }
    }

    /// The nodes the evidence of a Where answer points at: those with a match and those the
    /// API says attach the volumes the keys name; whether each of them answered.
    fn evidence(
        &self,
        keys: &[Key],
        matches: &[pb::FleetDevice],
        missing: &[pb::MissingNode],
    ) -> (Vec<String>, bool) {
        let mut nodes: BTreeSet<String> = matches.iter().map(|m| m.node.clone()).collect();
        if let Some(c) = &self.cluster {
            let mut pvs: BTreeSet<String> = BTreeSet::new();
            for k in keys {
                match k {
                    Key::Pv(pv) => {
                        pvs.insert(pv.clone());
                    }
                    Key::Image(v) | Key::Wwid(v) => pvs.extend(self.sweeper.pvs_of(v)),
                    _ => {}
                }
            }
            for pv in pvs {
                nodes.extend(
                    c.vas
                        .keys_by(&pv)
                        .into_iter()
                        .filter_map(|va| c.vas.get(&va))
                        .map(|va| va.spec.node_name.clone()),
                );
            }
        }
        let complete = !missing.iter().any(|m| nodes.contains(&m.node));
        (nodes.into_iter().collect(), complete)
    }
}

#[tonic::async_trait]
impl Fleet for FleetService {
    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        let t = Instant::now();
        self.person(&req, Verb::Get).await?;
        let ix = self.index.read();
        let r = pb::ListNodesResponse {
            nodes: ix.nodes.values().map(|n| n.to_message()).collect(),
            missing_nodes: self.missing_of(&ix),
        };
        drop(ix);
        self.timed("ListNodes", t, Ok(Response::new(r)))
    }

    async fn list_pin_risks(
        &self,
        req: Request<pb::ListPinRisksRequest>,
    ) -> Result<Response<pb::ListPinRisksResponse>, Status> {
        let t = Instant::now();
        self.person(&req, Verb::Get).await?;
        let ix = self.index.read();
        let r = crate::pin_risks::page(&ix, req.get_ref(), self.missing_of(&ix));
        drop(ix);
        self.timed("ListPinRisks", t, r.map(Response::new))
    }

    async fn list_devices(
        &self,
        req: Request<pb::FleetListDevicesRequest>,
    ) -> Result<Response<pb::FleetListDevicesResponse>, Status> {
        let t = Instant::now();
        let person = self.person(&req, Verb::Get).await?;
        let r = self.list_devices_now(&person, req.into_inner()).await?;
        self.timed("ListDevices", t, Ok(Response::new(r)))
    }

    async fn r#where(&self, req: Request<pb::WhereRequest>) -> Result<Response<pb::WhereResponse>, Status> {
        let t = Instant::now();
        let person = self.person(&req, Verb::Get).await?;
        let r = req.into_inner();
        let resolved = self.resolve(&r)?;
        let _fresh = self.admit_fresh(&person, r.fresh)?;
        if r.fresh {
            self.links.refresh_all(None).await;
        }
        let (mut matches, missing_nodes) = self.lookup(&resolved.keys);
        if let Some(target) = &resolved.target {
            matches.extend(self.scan_target(target));
        }
        let (evidence_nodes, complete) = self.evidence(&resolved.keys, &matches, &missing_nodes);
        let r =
            pb::WhereResponse { resolved: resolved.text, matches, missing_nodes, evidence_nodes, complete };
        self.timed("Where", t, Ok(Response::new(r)))
    }

    async fn who_watches(
        &self,
        req: Request<pb::WhoWatchesRequest>,
    ) -> Result<Response<pb::WhoWatchesResponse>, Status> {
        let t = Instant::now();
        let person = self.person(&req, Verb::Get).await?;
        let r = self.who_watches_now(&person, req.into_inner()).await?;
        self.timed("WhoWatches", t, Ok(Response::new(r)))
    }

    type WhoWatchesStreamStream = AnswerStream;

    async fn who_watches_stream(
        &self,
        req: Request<pb::WhoWatchesRequest>,
    ) -> Result<Response<Self::WhoWatchesStreamStream>, Status> {
        let t = Instant::now();
        let person = self.person(&req, Verb::Get).await?;
        let r = self.who_watches_stream_now(&person, req.into_inner()).await?;
        self.timed("WhoWatchesStream", t, Ok(Response::new(r)))
    }

    async fn multi_attach(
        &self,
        req: Request<pb::MultiAttachRequest>,
    ) -> Result<Response<pb::MultiAttachResponse>, Status> {
        let t = Instant::now();
        let caller = self.person(&req, Verb::Get).await?;
        let r = req.into_inner();
        if r.pv.is_empty() && r.pvc.is_empty() {
            let sweep = self.sweep_now(&caller, false, &[]).await?;
            let missing_nodes = sweep.missing_nodes.clone();
            let r = pb::MultiAttachResponse { sweep: Some(sweep), missing_nodes, ..Default::default() };
            return self.timed("MultiAttach", t, Ok(Response::new(r)));
        }
        let r = self.multi_attach_now(&caller, r).await?;
        self.timed("MultiAttach", t, Ok(Response::new(r)))
    }

    async fn explain(
        &self,
        req: Request<pb::ExplainRequest>,
    ) -> Result<Response<pb::ExplainResponse>, Status> {
        let t = Instant::now();
        self.person(&req, Verb::Get).await?;
        let r = self.explain_now(req.into_inner()).await?;
        self.timed("Explain", t, Ok(Response::new(r)))
    }

    async fn sweep(&self, req: Request<pb::SweepRequest>) -> Result<Response<pb::SweepResponse>, Status> {
        let t = Instant::now();
        let person = self.person(&req, Verb::Get).await?;
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
        let _fresh = self.admit_fresh(&person, r.fresh)?;
        let answer = self.sweep_now(&person, r.fresh, &kinds).await?;
        self.timed("Sweep", t, Ok(Response::new(answer)))
    }

    async fn plan(
        &self,
        req: Request<pb::FleetPlanRequest>,
    ) -> Result<Response<pb::FleetPlanResponse>, Status> {
        let t = Instant::now();
        let caller = self.person(&req, Verb::Plan).await?;
        let _one = self.enter(&self.concurrency.plans, &caller)?;
        self.admit(&self.plan_limit, &caller.name, "Plans", self.limits.plans_per_minute)?;
        let r = req.into_inner();
        let plan = self.forwarder().node_plan(&r.node, r.devices, &caller).await?;
        self.timed("Plan", t, Ok(Response::new(pb::FleetPlanResponse { node: r.node, plan: Some(plan) })))
    }

    async fn apply(
        &self,
        req: Request<pb::FleetApplyRequest>,
    ) -> Result<Response<pb::FleetApplyResponse>, Status> {
        let t = Instant::now();
        let caller = self.person(&req, Verb::Apply).await?;
        let authorization =
            req.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let from = crate::peer::forwarded(&req);
        let r = self.apply_now(&caller, (authorization, from), req.into_inner()).await?;
        self.timed("Apply", t, Ok(Response::new(r)))
    }
}
