//! `blockjanitor.v1.Agent`: adapters only. Each handler checks the caller's role, unpacks the
//! request, calls the daemon state once and maps the result.

use std::pin::Pin;
use std::sync::Arc;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::Agent;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use super::convert;
use super::status::to_status;
use crate::daemon::state::AgentState;
use blockjanitor_rpc::auth::{Policy, Role};

/// The service, sharing the daemon's state.
pub struct AgentService {
    pub state: Arc<AgentState>,
    pub policy: Arc<Policy>,
    /// Turns true on shutdown: open event streams end then, so shutdown never waits on them.
    pub shutdown: tokio::sync::watch::Receiver<bool>,
    /// The latest scan's devices as messages, converted once per scan (by scan number).
    cache: std::sync::Mutex<Option<(u64, Arc<Vec<pb::Device>>)>>,
}

impl AgentService {
    pub fn new(
        state: Arc<AgentState>,
        policy: Arc<Policy>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> Self {
        Self { state, policy, shutdown, cache: std::sync::Mutex::new(None) }
    }

    /// The latest scan's devices as messages.
    fn devices(&self, view: &crate::engine::view::View) -> Arc<Vec<pb::Device>> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        match &*cache {
            Some((n, d)) if *n == view.scan_number => Arc::clone(d),
            _ => {
                let d = Arc::new(view.devices.iter().map(convert::device).collect::<Vec<_>>());
                *cache = Some((view.scan_number, Arc::clone(&d)));
                d
            }
        }
    }
}

/// Converted events held per `WatchEvents` client before the client reads them.
const WATCH_BUFFER: usize = 8;

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::Event, Status>> + Send>>;

/// Most bytes of one event on the wire: past it, the device it carries has its holders summarised
/// by kind (a device held by thousands of processes would otherwise send every one of them to
/// every watcher at each change), then, if it is still over, only its first reasons (an in-use
/// device has one per holder), and the event's message says so.
pub const EVENT_BYTES_MAX: usize = 4096;

/// Bytes kept free for the message's note when reasons are left out.
const NOTE_BYTES: usize = 160;

/// The event, its device's holders summarised by kind when it would be over [`EVENT_BYTES_MAX`];
/// if that is not enough, its other lists (kubelet paths, pod UIDs, PVs, kernel threads) cut to
/// their first [`LIST_KEPT`] and its reasons to the first that fit. The message says what was
/// left out, and that `GetDevice` shows each.
fn capped(ev: pb::Event) -> pb::Event {
    use prost::Message as _;
    let mut ev = holders_capped(ev);
    if ev.encoded_len() <= EVENT_BYTES_MAX {
        return ev;
    }
    let Some(d) = ev.current.as_mut() else { return ev };
    let mut cut = Vec::new();
    for (name, list) in [
        ("kubelet paths", &mut d.kubelet_paths),
        ("pod UIDs", &mut d.pod_uids),
        ("PVs", &mut d.pv_names),
        ("kernel threads", &mut d.kernel_threads),
    ] {
        if list.len() > LIST_KEPT {
            cut.push(format!("{} of {} {name}", LIST_KEPT, list.len()));
            list.truncate(LIST_KEPT);
        }
    }
    let reasons = std::mem::take(&mut d.reasons);
    let mut room = EVENT_BYTES_MAX.saturating_sub(ev.encoded_len() + NOTE_BYTES);
    let mut kept = Vec::new();
    for r in &reasons {
        // Field tag, length, text.
        let cost = 1 + prost::length_delimiter_len(r.len()) + r.len();
        if cost > room {
            break;
        }
        room -= cost;
        kept.push(r.clone());
    }
    if kept.len() < reasons.len() {
        cut.insert(0, format!("{} of {} reasons", kept.len(), reasons.len()));
    }
    if let Some(d) = ev.current.as_mut() {
        d.reasons = kept;
    }
    if !cut.is_empty() {
        ev.message.push_str(&format!(
            " ({} shown: an event carries at most {} KB; GetDevice shows each)",
            cut.join(", "),
            EVENT_BYTES_MAX / 1024
        ));
    }
    ev
}

/// The event, its device's holders summarised by kind when it would be over [`EVENT_BYTES_MAX`].
fn holders_capped(mut ev: pb::Event) -> pb::Event {
    use prost::Message as _;
    if ev.encoded_len() <= EVENT_BYTES_MAX {
        return ev;
    }
    if let Some(d) = ev.current.as_mut() {
        let n = d.holders.len();
        let mut by_kind: Vec<pb::Holder> = Vec::new();
        for h in &d.holders {
            match by_kind.iter_mut().find(|s| s.kind == h.kind) {
                Some(s) => s.pid_count += h.pid_count.max(1),
                None => by_kind.push(pb::Holder {
                    kind: h.kind,
                    pid_count: h.pid_count.max(1),
                    ..Default::default()
                }),
            }
        }
        d.holders = by_kind;
        ev.message.push_str(&format!(
            " ({n} holders summarised by kind: an event carries at most {} KB; GetDevice shows each)",
            EVENT_BYTES_MAX / 1024
        ));
    }
    ev
}

/// How many entries of each of a device's other lists an event over the cap keeps.
const LIST_KEPT: usize = 3;

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
            last_scan_unix_seconds: v.scanned_at.map_or(0.0, convert::secs),
            last_scan_duration_ms: v.stats.duration.as_secs_f64() * 1000.0,
            scans: v.scan_number,
            devices: v.devices.len() as u32,
            warnings: v.warnings.clone(),
            mode: self.state.config.mode.as_str().into(),
            kubernetes: v.api_state.clone(),
            blind_spots: v.blind_spots.iter().map(|b| b.to_string()).collect(),
            last_full_scan: v.devices_read_scan,
            last_full_scan_unix_seconds: v.devices_read_at.map_or(0.0, convert::secs),
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
        Ok(Response::new(convert::devices_response(&v, devices)))
    }

    async fn get_device(&self, req: Request<pb::GetDeviceRequest>) -> Result<Response<pb::Device>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let d = self.state.find(&req.into_inner().device).map_err(to_status)?;
        Ok(Response::new(for_role(convert::device(&d), role)))
    }

    async fn list_holders(
        &self,
        req: Request<pb::ListHoldersRequest>,
    ) -> Result<Response<pb::ListHoldersResponse>, Status> {
        let role = self.policy.require(&req, Role::Viewer)?;
        let d = self.state.find(&req.into_inner().device).map_err(to_status)?;
        let v = self.state.view();
        Ok(Response::new(convert::holders_response(&v, &d, for_role(convert::device(&d), role))))
    }

    async fn plan(&self, req: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        let caller = self.policy.caller(&req)?;
        // The console forwards many people's Plans: each counts apart ("console for alice"),
        // not all of them in one bucket.
        let forwarded_for = (caller.role == Role::Console)
            .then(|| req.metadata().get(blockjanitor_rpc::auth::ON_BEHALF_OF).and_then(|v| v.to_str().ok()))
            .flatten()
            .map(str::trim)
            .filter(|w| !w.is_empty());
        let who = match forwarded_for {
            Some(w) => format!("{} for {w}", caller.identity),
            None => caller.identity.clone(),
        };
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
                    ..convert::plan(&(p, class))
                })
                .collect(),
            warnings: v.warnings.clone(),
            blind_spots: convert::blind_spots(&v),
        }))
    }

    async fn apply(&self, req: Request<pb::ApplyRequest>) -> Result<Response<pb::ApplyResponse>, Status> {
        let (caller, on_behalf_of) = self.policy.require_apply(&req)?;
        let r = req.into_inner();
        tracing::info!(target: "audit", phase = "request", caller = %caller.identity,
            role = ?caller.role, on_behalf_of = %on_behalf_of.as_deref().unwrap_or(""),
            devices = %r.devices.join(","), operation = r.operation().as_str_name(), "Apply requested by {}{}", caller.identity,
            on_behalf_of.as_deref().map(|w| format!(" on behalf of {w}")).unwrap_or_default());
        let op = convert::operation(r.operation).map_err(to_status)?;
        let (plans, reports) = self.state.apply(&r.devices, &r.identities, op).await.map_err(to_status)?;
        let v = self.state.view();
        Ok(Response::new(pb::ApplyResponse {
            plans: plans.iter().map(convert::plan).collect(),
            results: reports.iter().map(convert::report).collect(),
            warnings: v.warnings.clone(),
            blind_spots: convert::blind_spots(&v),
            ..Default::default()
        }))
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
                        Ok(e) => {
                            let mut ev = convert::event(&e);
                            ev.current = ev.current.map(|d| for_role(d, role));
                            capped(ev)
                        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn event_with(holders: usize) -> pb::Event {
        let h = |i: usize| pb::Holder {
            kind: if i.is_multiple_of(2) { pb::HolderKind::Cwd } else { pb::HolderKind::Mmap } as i32,
            pids: vec![i as u32],
            pid_count: 1,
            comm: "python3".into(),
            cmdline: format!("python3 /srv/app/worker.py --queue jobs-{i}"),
            ..Default::default()
        };
        pb::Event {
            r#type: pb::event::Type::HoldersChanged as i32,
            device: "vdb".into(),
            message: "vdb: 1 holder(s) added, 0 gone".into(),
            current: Some(pb::Device {
                name: "vdb".into(),
                holders: (0..holders).map(h).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A small event goes as it is; a large one has its holders summarised by kind, fits the cap,
    /// and says so.
    #[test]
    fn an_event_over_the_cap_has_its_holders_summarised_and_says_so() {
        use prost::Message as _;
        let small = event_with(3);
        assert_eq!(capped(small.clone()), small);
        let big = event_with(500);
        assert!(big.encoded_len() > EVENT_BYTES_MAX);
        let c = capped(big);
        assert!(c.encoded_len() <= EVENT_BYTES_MAX, "{} bytes", c.encoded_len());
        let holders = &c.current.as_ref().expect("current").holders;
        assert_eq!(holders.len(), 2, "{holders:?}");
        assert_eq!(holders.iter().map(|h| h.pid_count).sum::<u32>(), 500);
        assert!(c.message.contains("500 holders summarised by kind"), "{}", c.message);
        assert!(!c.message.contains("reasons shown"), "{}", c.message);
    }

    /// An in-use device held thousands of times has a reason per holder: with its holders
    /// summarised the event is still over the cap, so only its first reasons go, in order, and
    /// the message says how many of how many.
    #[test]
    fn an_event_still_over_the_cap_keeps_its_first_reasons_and_says_so() {
        use prost::Message as _;
        let mut big = event_with(1600);
        let reasons: Vec<String> =
            (0..1600).map(|i| format!("pid {i} (python3) maps a file on it (/srv/app/lib{i}.so)")).collect();
        big.current.as_mut().expect("current").reasons = reasons.clone();
        let c = capped(big);
        assert!(c.encoded_len() <= EVENT_BYTES_MAX, "{} bytes", c.encoded_len());
        let d = c.current.as_ref().expect("current");
        assert_eq!(d.holders.iter().map(|h| h.pid_count).sum::<u32>(), 1600);
        assert!(!d.reasons.is_empty() && d.reasons.len() < 1600, "{} reasons", d.reasons.len());
        assert_eq!(d.reasons[..], reasons[..d.reasons.len()]);
        let note = format!("({} of 1600 reasons shown", d.reasons.len());
        assert!(c.message.contains(&note) && c.message.contains("1600 holders summarised"), "{}", c.message);
    }

    /// A device mounted in every namespace has a reason per mount and a pod UID per pod:
    /// summarising its holders is not enough, so its other lists are cut to their first entries
    /// and its reasons to those that fit, and the message says so.
    #[test]
    fn an_event_still_over_the_cap_has_its_lists_cut_and_says_so() {
        use prost::Message as _;
        let mut big = event_with(500);
        if let Some(d) = big.current.as_mut() {
            d.reasons =
                (0..1800).map(|i| format!("mounted at /run/pods/{i}/image in mount namespace {i}")).collect();
            d.pod_uids = (0..200).map(|i| format!("5d1c7c2e-8a0b-11e8-9a3b-{i:012}")).collect();
        }
        let c = capped(big);
        assert!(c.encoded_len() <= EVENT_BYTES_MAX, "{} bytes", c.encoded_len());
        let d = c.current.as_ref().expect("current");
        assert_eq!(d.pod_uids.len(), LIST_KEPT);
        assert_eq!(d.reasons[0], "mounted at /run/pods/0/image in mount namespace 0", "the first ones kept");
        let note = format!("({} of 1800 reasons, 3 of 200 pod UIDs shown", d.reasons.len());
        assert!(c.message.contains(&note), "{}", c.message);
    }
}
