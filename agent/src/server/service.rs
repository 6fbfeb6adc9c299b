//! `blockjanitor.v1.Agent`: adapters only. Each handler checks the caller's role, unpacks the
//! request, calls the daemon state once and maps the result. Plan and Apply are counted per
//! person ([`blockjanitor_rpc::auth::person`]: whom the console names, else the caller), and
//! Apply's audit line and journaled plan name that person.

use std::pin::Pin;
use std::sync::Arc;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::convert;
use super::event_cap;
use super::status::to_status;
use crate::daemon::state::AgentState;
use crate::engine::view::View;
use crate::engine::wire;
use blockjanitor_rpc::auth::{self, Policy, Role};
use blockjanitor_rpc::peer_limit::PeerLimit;

/// The service, sharing the daemon's state.
pub struct AgentService {
    pub state: Arc<AgentState>,
    pub policy: Arc<Policy>,
    /// Turns true on shutdown: open event streams end then, so shutdown never waits on them.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The latest scan's devices as messages, converted once per scan (by scan number).
    cache: std::sync::Mutex<Option<(u64, Arc<Vec<pb::Device>>)>>,
    /// Applies a minute per person over TCP (`applies_per_minute_per_client`).
    apply_limit: PeerLimit,
}

impl AgentService {
    pub fn new(
        state: Arc<AgentState>,
        policy: Arc<Policy>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        let apply_limit = PeerLimit::new(state.config.applies_per_minute_per_client);
        Self { state, policy, shutdown, cache: std::sync::Mutex::new(None), apply_limit }
    }

    /// The latest scan's devices as messages.
    fn devices(&self, view: &View) -> Arc<Vec<pb::Device>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            Some((n, d)) if *n == view.scan_number => Arc::clone(d),
            _ => {
                let d = Arc::new(view.devices.iter().map(|d| wire::device(d)).collect::<Vec<_>>());
                *cache = Some((view.scan_number, Arc::clone(&d)));
                d
            }
        }
    }
}

/// Converted events held per `WatchEvents` client before the client reads them.
const WATCH_BUFFER: usize = 8;

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

/// Command lines can carry secrets (`qemu-nbd --object secret,data=...`): they are shown to
/// operators only. A viewer gets every device with its holders' command lines blanked.
fn for_role(mut d: pb::Device, role: Role) -> pb::Device {
    if role < Role::Operator {
        for h in &mut d.holders {
            h.cmdline.clear();
        }
        if let Some(n) = &mut d.nbd {
            n.server_cmdline.clear();
        }
    }
    d
}

#[tonic::async_trait]
impl Agent for AgentService {
    async fn get_node(&self, req: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        self.policy.require(&req, Role::Viewer)?;
        let v = self.state.view();
        Ok(Response::new(pb::Node {
            name: self.state.node_name.clone(),
            kernel: self.state.kernel.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            last_scan_unix_seconds: v.scanned_at.map_or(0.0, wire::secs),
            last_scan_duration_ms: v.stats.duration.as_secs_f64() * 1000.0,
            scans: v.scan_number,
            devices: v.devices.len() as u32,
            warnings: v.warnings.clone(),
            mode: self.state.config.mode.as_str().into(),
            kubernetes: v.api_state.to_string(),
            blind_spots: v.blind_spots.iter().map(|b| b.to_string()).collect(),
            last_full_scan: v.devices_read_scan,
            last_full_scan_unix_seconds: v.devices_read_at.map_or(0.0, wire::secs),
            not_ready_because: self.state.health.borrow().reasons(),
        }))
    }

    async fn list_devices(
        &self,
        req: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let r = req.into_inner();
        let kind = pb::DeviceKind::try_from(r.kind)
            .map_err(|_| Status::invalid_argument(format!("unknown device kind {}", r.kind)))?;
        let verdict = pb::Verdict::try_from(r.verdict)
            .map_err(|_| Status::invalid_argument(format!("unknown verdict {}", r.verdict)))?;
        let v = self.state.view();
        let devices = self
            .devices(&v)
            .iter()
            .filter(|d| kind == pb::DeviceKind::Unspecified || d.kind == kind as i32)
            .filter(|d| verdict == pb::Verdict::Unspecified || d.verdict == verdict as i32)
            .map(|d| for_role(d.clone(), role))
            .collect();
        Ok(Response::new(wire::devices_response(&v, devices)))
    }

    async fn get_device(&self, req: Request<pb::GetDeviceRequest>) -> Result<Response<pb::Device>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let d = self.state.find(&req.into_inner().device).map_err(to_status)?;
        Ok(Response::new(for_role(wire::device(&d), role)))
    }

    async fn list_holders(
        &self,
        req: Request<pb::ListHoldersRequest>,
    ) -> Result<Response<pb::ListHoldersResponse>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let d = self.state.find(&req.into_inner().device).map_err(to_status)?;
        let v = self.state.view();
        Ok(Response::new(wire::holders_response(&v, &d, for_role(wire::device(&d), role))))
    }

    async fn plan(&self, req: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        let caller = self.policy.caller(&req)?;
        // The console forwards many people's Plans: each counts apart ("console for alice"),
        // not all of them in one bucket.
        let who = auth::person(&caller, &req).key;
        if let Err(wait) = self.state.plan_limit.admit(&who, std::time::Instant::now()) {
            return Err(Status::resource_exhausted(format!(
                "{} asked for more than {} plans a minute (each scans afresh): try again in {} s",
                who,
                self.state.config.plans_per_minute_per_client,
                wait.as_secs() + 1
            )));
        }
        let r = req.into_inner();
        let op = convert::operation(r.operation).map_err(to_status)?;
        let plans = self.state.plan(&r.devices, op).await.map_err(to_status)?;
        let v = self.state.view();
        Ok(Response::new(pb::PlanResponse {
            plans: plans
                .into_iter()
                .map(|(p, class, incomplete)| pb::DevicePlan {
                    incomplete_view: incomplete.unwrap_or_default(),
                    ..wire::plan(&(p, class))
                })
                .collect(),
            warnings: v.warnings.clone(),
            blind_spots: wire::blind_spots(&v),
        }))
    }

    async fn apply(&self, req: Request<pb::ApplyRequest>) -> Result<Response<pb::ApplyResponse>, Status> {
        let (caller, on_behalf_of) = self.policy.require_apply(&req)?;
        let person = auth::person(&caller, &req);
        let r = req.into_inner();
        tracing::info!(target: "audit", phase = "request", caller = %caller.identity,
            role = ?caller.role, on_behalf_of = %on_behalf_of.as_deref().unwrap_or(""), person = %person.name,
            groups = %person.groups.join(","), devices = %r.devices.join(","),
            operation = r.operation().as_str_name(), "Apply requested by {}{}", caller.identity,
            on_behalf_of.as_deref().map(|w| format!(" on behalf of {w}")).unwrap_or_default());
        // Root on the node's socket is not slowed (it could act without the agent anyway); every
        // person over TCP is, the console's each apart.
        if !caller.on_socket {
            if let Err(wait) = self.apply_limit.admit(&person.key, std::time::Instant::now()) {
                tracing::warn!(target: "audit", person = %person.name, "Apply refused: rate limit");
                return Err(Status::resource_exhausted(format!(
                    "{} asked for more than {} applies a minute: try again in {} s",
                    person.key,
                    self.state.config.applies_per_minute_per_client,
                    wait.as_secs() + 1
                )));
            }
        }
        let op = convert::operation(r.operation).map_err(to_status)?;
        let outcomes =
            self.state.apply(&r.devices, &r.identities, op, &person.name).await.map_err(to_status)?;
        let mut answer = pb::ApplyResponse::default();
        wire::outcome::add_results(&mut answer, &outcomes, op);
        Ok(Response::new(answer))
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        req: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let mut events = self.state.events.subscribe();
        let mut shutdown = self.shutdown.clone();
        // A few messages per client: the shared broadcast ring (1,024 events) absorbs bursts
        // once, instead of each of a hundred watchers holding its own copy of them.
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BUFFER);
        // Forward events until the client goes away or the agent shuts down: a graceful stop
        // never waits on a watching client.
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            while !*shutdown.borrow() {
                let msg = tokio::select! {
                    _ = shutdown.changed() => continue,
                    r = events.recv() => match r {
                        Ok(e) => event_cap::event_for(&e, |d| for_role(d, role)),
                        // A slow client missed events: tell it, and go on.
                        Err(RecvError::Lagged(n)) => pb::Event {
                            r#type: pb::event::Type::EventsDropped as i32,
                            message: format!("{n} events were dropped: this client fell behind; re-read the state"),
                            ..Default::default()
                        },
                        Err(RecvError::Closed) => break,
                    },
                };
                if tx.send(Ok(msg)).await.is_err() {
                    break;
                }
            }
        });
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        Ok(Response::new(Box::pin(stream)))
    }
}
