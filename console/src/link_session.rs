//! The links' options, and one connected session of an agent's link (see [`crate::link`]):
//! connect, subscribe to the agent's events, read its full list, then follow: apply events, read
//! the list again (on a timer, on `EVENTS_DROPPED`, when asked), probe the agent when it has been
//! quiet, and end the session when its silence, net of the console's own scheduling lag
//! ([`crate::liveness`]), exceeds the limit. A re-read that fails marks the node not refreshed and
//! is retried with backoff; it never ends the session.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_rpc::client::{self, Target, TcpTarget};
use blockjanitor_rpc::view::time::now_secs;
use tokio::sync::Notify;
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::discover::AgentSpec;
use crate::index::Index;
use crate::liveness::{Heard, LagMeter};

/// The console's client certificate and the CA agents' certificates are signed by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// How links connect, wait and retry.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    pub tls: TlsFiles,
    /// The name every agent's certificate carries.
    pub server_name: String,
    /// Bound on one connection attempt (TCP + TLS + HTTP/2).
    pub connect_timeout: Duration,
    /// Bound on one unary call.
    pub call_timeout: Duration,
    /// Between two full reads of a connected agent's device list.
    pub resync_interval: Duration,
    /// The first wait after a failure; doubled after each further one.
    pub backoff_initial: Duration,
    /// The longest wait.
    pub backoff_max: Duration,
    /// Silence after which a link probes its agent (a `GetNode` call), and the least time
    /// between two probes.
    pub keepalive_interval: Duration,
    /// How long an agent may stay silent (no event, no answer), beyond the console's own
    /// scheduling lag over that time, before its link counts as dead.
    pub keepalive_timeout: Duration,
    /// Idle time before the kernel's TCP keepalive probes start.
    pub tcp_keepalive: Duration,
    /// Connections being set up at once (connect, subscribe, first full read), over every link:
    /// at a cold start thousands of links would otherwise start their TLS handshakes in the same
    /// instant, time out on a busy CPU, back off and try again together.
    pub connecting: Arc<tokio::sync::Semaphore>,
}

/// The default of [`LinkOptions::connecting`].
pub const CONNECTS_AT_ONCE: usize = 128;

impl LinkOptions {
    /// Defaults around the given TLS files and server name.
    pub fn new(tls: TlsFiles, server_name: &str) -> Self {
        Self {
            tls,
            server_name: server_name.to_owned(),
            connect_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(3),
            resync_interval: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            keepalive_interval: Duration::from_secs(1),
            keepalive_timeout: Duration::from_secs(3),
            tcp_keepalive: Duration::from_secs(10),
            connecting: Arc::new(tokio::sync::Semaphore::new(CONNECTS_AT_ONCE)),
        }
    }
}

/// A connected session's client.
pub(crate) type ClientSlot = Arc<Mutex<Option<AgentClient<Channel>>>>;

/// A jittered wait: between half and all of `d`. The fraction comes from a fresh `RandomState`
/// (random keys per instance), not the clock: links started in the same microsecond must not
/// wait alike (a clock with microsecond resolution has no useful low digits).
pub(crate) fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new().build_hasher().finish();
    d / 2 + d.mul_f64((r % 1000) as f64 / 2000.0)
}

/// A call in flight beside the session's loop.
type Pending<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// What woke a session's loop.
enum Step {
    /// Boxed: an event carries a whole device (over a kilobyte).
    Event(Box<Result<Option<pb::Event>, tonic::Status>>),
    Synced(Result<(), String>),
    Probed(bool),
    Probe,
    Judge,
    Resync,
}

/// One connection: returns whether it got as far as a full sync, and why it ended.
pub(crate) async fn session(
    spec: &AgentSpec,
    opts: &LinkOptions,
    index: &Index,
    slot: &ClientSlot,
    resync: &Notify,
    lag: &LagMeter,
) -> (bool, String) {
    let (c, mut stream) = match open(spec, opts, index).await {
        Ok(open) => open,
        Err(e) => return (false, e),
    };
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
    tracing::debug!(node = %spec.node, address = %spec.address, "agent synced");
    // Resyncs jittered: after a cold start every link syncs within seconds of the others, and
    // unjittered they would all read their agents' lists again in the same second, every period.
    let first = Instant::now() + jitter(opts.resync_interval);
    let mut tick = tokio::time::interval_at(first, opts.resync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut f = Follow {
        spec,
        opts,
        index,
        lag,
        c,
        heard: Heard::now(lag),
        seen_written: std::time::Instant::now(),
        probed_at: Instant::now(),
        probing: None,
        syncing: None,
        retry: None,
        retry_wait: opts.backoff_initial,
    };
    let far = || Instant::now() + Duration::from_secs(3600);
    loop {
        let now = std::time::Instant::now();
        let judge_at: Instant = f.heard.next_judgement(now, lag.reading(now), opts.keepalive_timeout).into();
        let probe_at = Instant::from_std(f.heard.at).max(f.probed_at) + opts.keepalive_interval;
        let retry = f.retry;
        let (syncing, probing) = (&mut f.syncing, &mut f.probing);
        let step = tokio::select! {
            biased;
            m = stream.message() => Step::Event(Box::new(m)),
            r = async { syncing.as_mut().expect("a read in flight").await }, if syncing.is_some() => Step::Synced(r),
            r = async { probing.as_mut().expect("a probe in flight").await }, if probing.is_some() => Step::Probed(r),
            _ = tokio::time::sleep_until(judge_at) => Step::Judge,
            _ = tokio::time::sleep_until(probe_at), if probing.is_none() => Step::Probe,
            _ = tick.tick() => Step::Resync,
            _ = resync.notified() => Step::Resync,
            _ = tokio::time::sleep_until(retry.unwrap_or_else(far)), if retry.is_some() => Step::Resync,
        };
        if let Some(end) = f.step(step) {
            return (true, end);
        }
    }
}

/// Connects, subscribes to the agent's events and reads its full list (under the connecting
/// permit, each step with its own deadline).
async fn open(
    spec: &AgentSpec,
    opts: &LinkOptions,
    index: &Index,
) -> Result<(AgentClient<Channel>, tonic::Streaming<pb::Event>), String> {
    let target = Target::Tcp(TcpTarget {
        addr: spec.address.clone(),
        cert: opts.tls.cert.clone(),
        key: opts.tls.key.clone(),
        ca: opts.tls.ca.clone(),
        server_name: opts.server_name.clone(),
    });
    // TCP keepalives only: no HTTP/2 keepalive, whose ping timeout would end the link whenever
    // the console itself is slow to read the answer (the session judges silence, net of lag).
    let tune = |e: tonic::transport::Endpoint| e.tcp_keepalive(Some(opts.tcp_keepalive));
    let _permit = opts.connecting.acquire().await;
    let mut c =
        client::connect_tuned(&target, opts.connect_timeout, tune).await.map_err(|e| e.to_string())?;
    // Subscribe first, then read the list: nothing that changes in between is lost.
    let stream =
        match tokio::time::timeout(opts.call_timeout, c.watch_events(pb::WatchEventsRequest {})).await {
            Ok(Ok(s)) => s.into_inner(),
            Ok(Err(s)) => return Err(format!("WatchEvents: {}", client::status_line(&s))),
            Err(_) => return Err(format!("WatchEvents: no answer within {:?}", opts.call_timeout)),
        };
    sync(&mut c, index, &spec.node, opts.call_timeout).await?;
    Ok((c, stream))
}

/// A connected session's state between two steps of its loop.
struct Follow<'a> {
    spec: &'a AgentSpec,
    opts: &'a LinkOptions,
    index: &'a Index,
    lag: &'a LagMeter,
    c: AgentClient<Channel>,
    /// When the agent was last heard from (any event or answer).
    heard: Heard,
    /// When the index's `last_seen` was last moved on by a probe (at most every [`SEEN_EVERY`]:
    /// a write lock a second per agent would contend with the queries).
    seen_written: std::time::Instant,
    probed_at: Instant,
    probing: Option<Pending<bool>>,
    syncing: Option<Pending<Result<(), String>>>,
    /// After a failed re-read: when to try again, and the wait after the next failure.
    retry: Option<Instant>,
    retry_wait: Duration,
}

impl Follow<'_> {
    /// Takes one step; `Some(why)` ends the session.
    fn step(&mut self, step: Step) -> Option<String> {
        let limit = self.opts.keepalive_timeout;
        match step {
            Step::Event(m) => match *m {
                Ok(Some(ev)) => {
                    self.heard = Heard::now(self.lag);
                    if apply_event(self.index, &self.spec.node, ev) {
                        self.read_again();
                    }
                }
                Ok(None) => return Some("the agent ended the event stream".into()),
                Err(s) => {
                    return Some(format!(
                        "the link broke (the connection closed): WatchEvents: {}",
                        client::status_line(&s)
                    ))
                }
            },
            Step::Synced(r) => self.synced(r),
            Step::Probed(answered) => {
                self.probing = None;
                if answered {
                    self.heard = Heard::now(self.lag);
                    if self.seen_written.elapsed() >= SEEN_EVERY {
                        self.seen_written = std::time::Instant::now();
                        self.index.with_node(&self.spec.node, |n| n.last_seen = now_secs());
                    }
                }
            }
            Step::Probe => {
                self.probed_at = Instant::now();
                self.probing = Some(probe(&self.c, limit));
            }
            Step::Judge => {
                let now = std::time::Instant::now();
                let lag_now = self.lag.reading(now);
                if self.heard.silent(now, lag_now, limit) {
                    return Some(self.heard.why(now, lag_now, limit));
                }
            }
            Step::Resync => self.read_again(),
        }
        None
    }

    /// Starts a full read beside the loop, unless one runs.
    fn read_again(&mut self) {
        if self.syncing.is_none() {
            self.retry = None;
            let (mut c, index, node) = (self.c.clone(), self.index.clone(), self.spec.node.clone());
            let timeout = self.opts.call_timeout;
            self.syncing = Some(Box::pin(async move { sync(&mut c, &index, &node, timeout).await }));
        }
    }

    /// A full read ended: heard from, or (not down: the liveness judgement says whether the
    /// agent is there at all) its node's cached view marked not refreshed until a retry succeeds.
    fn synced(&mut self, r: Result<(), String>) {
        self.syncing = None;
        match r {
            Ok(()) => {
                self.heard = Heard::now(self.lag);
                self.seen_written = std::time::Instant::now();
                self.retry = None;
                self.retry_wait = self.opts.backoff_initial;
            }
            Err(e) => {
                tracing::warn!(node = %self.spec.node, error = %e, "re-read failed: the cached view is marked not refreshed");
                self.index.with_node(&self.spec.node, |n| {
                    n.mark_not_refreshed(format!("a re-read did not complete: {e}"))
                });
                self.retry = Some(Instant::now() + jitter(self.retry_wait));
                self.retry_wait = (self.retry_wait * 2).min(self.opts.backoff_max);
            }
        }
    }
}

/// How often a probe's answer moves the index's `last_seen` on.
const SEEN_EVERY: Duration = Duration::from_secs(5);

/// A liveness probe: whether the agent answered a `GetNode` within `limit`.
fn probe(c: &AgentClient<Channel>, limit: Duration) -> Pending<bool> {
    let mut c = c.clone();
    Box::pin(async move {
        matches!(
            tokio::time::timeout(limit, c.get_node(client::request(pb::GetNodeRequest {}, limit))).await,
            Ok(Ok(_))
        )
    })
}

/// Reads the node and its device list and puts them in the index.
pub async fn sync(
    c: &mut AgentClient<Channel>,
    index: &Index,
    node: &str,
    timeout: Duration,
) -> Result<(), String> {
    let agent = client::call(timeout, c.get_node(client::request(pb::GetNodeRequest {}, timeout)))
        .await
        .map_err(|s| format!("GetNode: {}", client::status_line(&s)))?;
    sync_devices(c, index, node, timeout, Some(agent)).await
}

/// Reads the device list (and records `agent`, when given) and puts them in the index.
pub async fn sync_devices(
    c: &mut AgentClient<Channel>,
    index: &Index,
    node: &str,
    timeout: Duration,
    agent: Option<pb::Node>,
) -> Result<(), String> {
    let list =
        client::call(timeout, c.list_devices(client::request(pb::ListDevicesRequest::default(), timeout)))
            .await
            .map_err(|s| format!("ListDevices: {}", client::status_line(&s)))?;
    // An agent that has not finished a scan lists nothing: that is no evidence of absence.
    if list.scan_unix_seconds <= 0.0 {
        return Err("the agent has not finished a scan yet".into());
    }
    let mut w = index.write();
    w.replace_devices(node, list.devices);
    w.set_pin_risks(node, list.pin_risks, list.pin_risks_checked, list.pin_risks_unknown);
    if let Some(n) = w.nodes.get_mut(node) {
        let now = now_secs();
        n.scan_unix_seconds = list.scan_unix_seconds;
        n.blind_spots = list.blind_spots;
        n.incomplete_view = list.incomplete_view;
        if agent.is_some() {
            n.agent = agent;
        }
        n.mark_up(now);
        n.last_sync = now;
    }
    Ok(())
}

/// Applies one event to the index; true when the full list must be read again.
fn apply_event(index: &Index, node: &str, ev: pb::Event) -> bool {
    let kind = pb::event::Type::try_from(ev.r#type).unwrap_or(pb::event::Type::Unspecified);
    let mut w = index.write();
    if let Some(n) = w.nodes.get_mut(node) {
        n.last_seen = now_secs();
        // An event from a scan: the agent has scanned at least that recently.
        if ev.scan > 0 && ev.unix_seconds > n.scan_unix_seconds {
            n.scan_unix_seconds = ev.unix_seconds;
        }
    }
    match (kind, ev.current) {
        (pb::event::Type::EventsDropped, _) => return true,
        // Too many to send in an event, or none could be judged: the list says.
        (pb::event::Type::PinRisksChanged, _) if !ev.pin_risks_complete => return true,
        (pb::event::Type::PinRisksChanged, _) => w.set_pin_risks(node, ev.pin_risks, true, String::new()),
        (pb::event::Type::DeviceRemoved, _) => w.remove_device(node, &ev.device),
        (_, Some(d)) => w.upsert_device(node, d),
        (_, None) => {}
    }
    false
}
