//! One task per agent: connect over mutual TLS with the console's certificate, read the node and
//! its full device list, then follow `WatchEvents`; read the full list again periodically, when
//! the agent says this client missed events, and on every reconnect. Every call has a deadline,
//! so a slow agent delays nobody but its own task. Failures are recorded in the index
//! (reachability, last error, failures in a row) and retried with exponential backoff (jittered,
//! bounded).
//!
//! [`Links`] keeps the tasks in step with discovery (one per node and address) and hands out the
//! live clients for forwarded calls and forced fan-outs.
//!
//! Liveness ([`crate::liveness`]): anything the agent sends counts as alive (an event on its
//! stream, an answer to any call); a link that heard nothing for `keepalive_interval` sends a
//! probe (a `GetNode` call). A link whose silence, less the console's own scheduling lag over the
//! same time, exceeds `keepalive_timeout` ends its session: its node is marked down in the index
//! (since when, why) and named missing in every answer, and fan-outs skip it until a new
//! connection's full read succeeds. The console's promptness is not the agent's: a console that
//! could not run for seconds does not drop links whose answers waited, unread, in its sockets
//! (issue 36), while an agent that stops (SIGSTOP), is cut off or is killed under a console that
//! runs on time is named within `keepalive_timeout` (and the probe interval). No HTTP/2 keepalive
//! is set on the channel: its pings' timeout would judge by the console's promptness again.
//!
//! A read that misses its deadline or fails while the link is heard from (a fresh fan-out's, or
//! the link's own re-read) marks the node "not refreshed" ([`crate::index::NodeEntry::not_refreshed`]):
//! not down, its cached view used but named in every answer's missing nodes with its age, so no
//! "safe" rests on it. The link stays up and reads the list again (backing off) until it succeeds.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_rpc::client::{self, Target, TcpTarget};
use blockjanitor_rpc::view::time::now_secs;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
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
type ClientSlot = Arc<Mutex<Option<AgentClient<Channel>>>>;

struct Link {
    address: String,
    task: JoinHandle<()>,
    client: ClientSlot,
    resync: Arc<Notify>,
}

/// Every agent's link.
pub struct Links {
    index: Index,
    opts: Arc<LinkOptions>,
    links: Mutex<HashMap<String, Link>>,
    /// The agents as last set.
    specs: Mutex<BTreeMap<String, AgentSpec>>,
    /// One fleet-wide fan-out at a time, and how many have started: callers who asked while one
    /// ran share the next one (see [`Links::refresh_all`]).
    fan_out: tokio::sync::Mutex<()>,
    fan_outs: std::sync::atomic::AtomicU64,
    /// The console's scheduling lag, which every link's silence is judged net of, and its ticker.
    lag: Arc<LagMeter>,
    lag_ticker: Option<JoinHandle<()>>,
}

impl Drop for Links {
    fn drop(&mut self) {
        if let Some(t) = &self.lag_ticker {
            t.abort();
        }
        for (_, l) in self.links.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            l.task.abort();
        }
    }
}

impl Links {
    /// Links on the current runtime (the lag meter ticks on it; outside one it never ticks and
    /// excuses nothing).
    pub fn new(index: Index, opts: LinkOptions) -> Self {
        let lag = LagMeter::new();
        let lag_ticker = tokio::runtime::Handle::try_current().ok().map(|_| lag.start());
        Self {
            lag,
            lag_ticker,
            index,
            opts: Arc::new(opts),
            links: Mutex::new(HashMap::new()),
            specs: Mutex::new(BTreeMap::new()),
            fan_out: tokio::sync::Mutex::new(()),
            fan_outs: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn options(&self) -> &LinkOptions {
        &self.opts
    }

    /// Brings the links in step with `agents`: starts one for each new node (or new address),
    /// stops those whose node went, and records every node in the index. Only what changed since
    /// the last call is touched (during a rollout of 5,000 agents every pod event calls this).
    pub fn set(&self, agents: &BTreeMap<String, AgentSpec>) {
        let mut links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = self.specs.lock().unwrap_or_else(|p| p.into_inner());
        let gone: Vec<String> = links
            .iter()
            .filter(|(n, l)| agents.get(*n).is_none_or(|a| a.address != l.address))
            .map(|(n, _)| n.clone())
            .collect();
        for n in gone {
            if let Some(l) = links.remove(&n) {
                l.task.abort();
            }
        }
        let left: Vec<String> = last.keys().filter(|n| !agents.contains_key(*n)).cloned().collect();
        for n in left {
            last.remove(&n);
            self.index.write().remove_node(&n);
        }
        for (name, spec) in agents {
            if last.get(name) == Some(spec) && (spec.address.is_empty() || links.contains_key(name)) {
                continue;
            }
            last.insert(name.clone(), spec.clone());
            self.index.write().upsert_node(name, &spec.address, &spec.source, spec.error.as_deref());
            self.index.with_node(name, |n| n.agent_pod = spec.pod.clone());
            if spec.address.is_empty() || links.contains_key(name) {
                continue;
            }
            let client: ClientSlot = Arc::new(Mutex::new(None));
            let resync = Arc::new(Notify::new());
            let task = tokio::spawn(run(
                spec.clone(),
                Arc::clone(&self.opts),
                self.index.clone(),
                Arc::clone(&client),
                Arc::clone(&resync),
                Arc::clone(&self.lag),
            ));
            links.insert(name.clone(), Link { address: spec.address.clone(), task, client, resync });
        }
    }

    /// The live client for a node, when its link is connected.
    pub fn client(&self, node: &str) -> Option<AgentClient<Channel>> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let l = links.get(node)?;
        let c = l.client.lock().unwrap_or_else(|p| p.into_inner()).clone();
        c
    }

    /// Marks a node's cached view not refreshed after a read that missed its deadline or failed
    /// (`why`) while its link is up, and asks the link to read the list again. Not down: the link
    /// stays, and so does the node's reachability (see [`crate::index::NodeEntry::not_refreshed`]).
    pub fn mark_not_refreshed(&self, node: &str, why: String) {
        tracing::warn!(node = %node, error = %why, "not refreshed: its cached view is used, marked not fresh");
        self.index.with_node(node, |n| {
            if n.reachable {
                n.mark_not_refreshed(why);
            }
        });
        self.request_resync(node);
    }

    /// Asks a node's link to read the full device list again soon.
    pub fn request_resync(&self, node: &str) {
        if let Some(l) = self.links.lock().unwrap_or_else(|p| p.into_inner()).get(node) {
            l.resync.notify_one();
        }
    }

    /// Reads every connected agent's device list now, all at once, each bounded by the call
    /// deadline, and puts the answers in the index. Returns when all have answered or timed out.
    /// Links already known dead are not asked (answers name their nodes missing). A read that
    /// misses the deadline or fails marks its node not refreshed, never dead: a slow agent is not
    /// a down one (its link's own liveness judges that); answers name it with its cached view's age.
    ///
    /// One fleet-wide fan-out runs at a time: a caller who asks while one runs waits for it to
    /// end and then shares the next one with every other caller who asked meanwhile (a fan-out
    /// that started after the caller asked is as fresh as the caller wants). So eight callers
    /// asking `--fresh` at once cost two fan-outs, not eight.
    pub async fn refresh_all(&self, only: Option<&str>) {
        use std::sync::atomic::Ordering;
        if only.is_some() {
            return self.fan_out_now(only).await;
        }
        let asked = self.fan_outs.load(Ordering::Acquire);
        let _one = self.fan_out.lock().await;
        if self.fan_outs.load(Ordering::Acquire) > asked {
            // One started after this caller asked, and it is over (this caller holds the lock).
            return;
        }
        self.fan_outs.fetch_add(1, Ordering::AcqRel);
        self.fan_out_now(None).await;
    }

    async fn fan_out_now(&self, only: Option<&str>) {
        let (clients, skipped) = {
            let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
            let mut clients: Vec<(String, AgentClient<Channel>)> = Vec::new();
            let mut skipped = 0usize;
            for (n, l) in links.iter().filter(|(n, _)| only.is_none_or(|o| o == n.as_str())) {
                match l.client.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    Some(c) => clients.push((n.clone(), c.clone())),
                    None => skipped += 1,
                }
            }
            (clients, skipped)
        };
        let started = std::time::Instant::now();
        let asked = clients.len();
        let mut set = tokio::task::JoinSet::new();
        for (node, mut c) in clients {
            let index = self.index.clone();
            let timeout = self.opts.call_timeout;
            set.spawn(async move {
                let t = std::time::Instant::now();
                let r = sync_devices(&mut c, &index, &node, timeout, None).await;
                (node, t.elapsed(), r)
            });
        }
        let mut slowest = (String::new(), Duration::ZERO);
        let mut not_refreshed = 0usize;
        while let Some(r) = set.join_next().await {
            let Ok((node, took, r)) = r else { continue };
            if let Err(e) = r {
                not_refreshed += 1;
                self.mark_not_refreshed(&node, format!("a fresh read did not complete: {e}"));
            }
            if took > slowest.1 {
                slowest = (node, took);
            }
        }
        tracing::info!(agents = asked, skipped_dead = skipped, not_refreshed, took_ms = started.elapsed().as_millis() as u64,
            slowest = %slowest.0, slowest_ms = slowest.1.as_millis() as u64, "fan-out done");
    }
}

/// A jittered wait: between half and all of `d`. The fraction comes from a fresh `RandomState`
/// (random keys per instance), not the clock: links started in the same microsecond must not
/// wait alike (a clock with microsecond resolution has no useful low digits).
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new().build_hasher().finish();
    d / 2 + d.mul_f64((r % 1000) as f64 / 2000.0)
}

/// The link's loop: a session, then a backoff, until aborted.
async fn run(
    spec: AgentSpec,
    opts: Arc<LinkOptions>,
    index: Index,
    slot: ClientSlot,
    resync: Arc<Notify>,
    lag: Arc<LagMeter>,
) {
    let mut backoff = opts.backoff_initial;
    loop {
        let (synced, error) = session(&spec, &opts, &index, &slot, &resync, &lag).await;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        tracing::info!(node = %spec.node, address = %spec.address, error = %error, "link to the agent lost");
        index.with_node(&spec.node, |n| {
            n.mark_down(error);
            n.failures = n.failures.saturating_add(1);
        });
        if synced {
            backoff = opts.backoff_initial;
        }
        tokio::time::sleep(jitter(backoff)).await;
        backoff = (backoff * 2).min(opts.backoff_max);
    }
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
async fn session(
    spec: &AgentSpec,
    opts: &LinkOptions,
    index: &Index,
    slot: &ClientSlot,
    resync: &Notify,
    lag: &LagMeter,
) -> (bool, String) {
    let target = Target::Tcp(TcpTarget {
        addr: spec.address.clone(),
        cert: opts.tls.cert.clone(),
        key: opts.tls.key.clone(),
        ca: opts.tls.ca.clone(),
        server_name: opts.server_name.clone(),
    });
    // TCP keepalives only: no HTTP/2 keepalive, whose ping timeout would end the link whenever
    // the console itself is slow to read the answer (this loop judges silence, net of lag).
    let tune = |e: tonic::transport::Endpoint| e.tcp_keepalive(Some(opts.tcp_keepalive));
    // Held until the first full read is in (each step has its own deadline).
    let permit = opts.connecting.acquire().await;
    let mut c = match client::connect_tuned(&target, opts.connect_timeout, tune).await {
        Ok(c) => c,
        Err(e) => return (false, e.to_string()),
    };
    // Subscribe first, then read the list: nothing that changes in between is lost.
    let mut stream =
        match tokio::time::timeout(opts.call_timeout, c.watch_events(pb::WatchEventsRequest {})).await {
            Ok(Ok(s)) => s.into_inner(),
            Ok(Err(s)) => return (false, format!("WatchEvents: {}", client::status_line(&s))),
            Err(_) => return (false, format!("WatchEvents: no answer within {:?}", opts.call_timeout)),
        };
    if let Err(e) = sync(&mut c, index, &spec.node, opts.call_timeout).await {
        return (false, e);
    }
    drop(permit);
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(c.clone());
    tracing::debug!(node = %spec.node, address = %spec.address, "agent synced");
    // Resyncs jittered: after a cold start every link syncs within seconds of the others, and
    // unjittered they would all read their agents' lists again in the same second, every period.
    let first = Instant::now() + jitter(opts.resync_interval);
    let mut tick = tokio::time::interval_at(first, opts.resync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let (limit, quiet) = (opts.keepalive_timeout, opts.keepalive_interval);
    let mut heard = Heard::now(lag);
    // When the index's `last_seen` was last moved on by a probe (at most every few seconds: a
    // write lock a second per agent would contend with the queries).
    let mut seen_written = std::time::Instant::now();
    let mut probed_at = Instant::now();
    let mut probing: Option<Pending<bool>> = None;
    let mut syncing: Option<Pending<Result<(), String>>> = None;
    // After a failed re-read: when to try again, and the wait after the next failure.
    let mut retry: Option<Instant> = None;
    let mut retry_wait = opts.backoff_initial;
    let far = || Instant::now() + Duration::from_secs(3600);
    loop {
        let now = std::time::Instant::now();
        let judge_at: Instant = heard.next_judgement(now, lag.reading(now), limit).into();
        let probe_at = Instant::from_std(heard.at).max(probed_at) + quiet;
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
        match step {
            Step::Event(m) => match *m {
                Ok(Some(ev)) => {
                    heard = Heard::now(lag);
                    if apply_event(index, &spec.node, ev) && syncing.is_none() {
                        syncing = Some(read_again(&c, index, &spec.node, opts.call_timeout));
                    }
                }
                Ok(None) => return (true, "the agent ended the event stream".into()),
                Err(s) => {
                    return (
                        true,
                        format!(
                            "the link broke (the connection closed): WatchEvents: {}",
                            client::status_line(&s)
                        ),
                    )
                }
            },
            Step::Synced(r) => {
                syncing = None;
                match r {
                    Ok(()) => {
                        heard = Heard::now(lag);
                        seen_written = std::time::Instant::now();
                        retry = None;
                        retry_wait = opts.backoff_initial;
                    }
                    Err(e) => {
                        // Not down: the liveness judgement says whether the agent is there at all.
                        tracing::warn!(node = %spec.node, error = %e, "re-read failed: the cached view is marked not refreshed");
                        index.with_node(&spec.node, |n| {
                            n.mark_not_refreshed(format!("a re-read did not complete: {e}"))
                        });
                        retry = Some(Instant::now() + jitter(retry_wait));
                        retry_wait = (retry_wait * 2).min(opts.backoff_max);
                    }
                }
            }
            Step::Probed(answered) => {
                probing = None;
                if answered {
                    heard = Heard::now(lag);
                    if seen_written.elapsed() >= SEEN_EVERY {
                        seen_written = std::time::Instant::now();
                        index.with_node(&spec.node, |n| n.last_seen = now_secs());
                    }
                }
            }
            Step::Probe => {
                probed_at = Instant::now();
                probing = Some(probe(&c, limit));
            }
            Step::Judge => {
                let now = std::time::Instant::now();
                let lag_now = lag.reading(now);
                if heard.silent(now, lag_now, limit) {
                    return (true, heard.why(now, lag_now, limit));
                }
            }
            Step::Resync => {
                if syncing.is_none() {
                    retry = None;
                    syncing = Some(read_again(&c, index, &spec.node, opts.call_timeout));
                }
            }
        }
    }
}

/// How often a probe's answer moves the index's `last_seen` on.
const SEEN_EVERY: Duration = Duration::from_secs(5);

/// A full read of the agent, beside the session's loop.
fn read_again(
    c: &AgentClient<Channel>,
    index: &Index,
    node: &str,
    timeout: Duration,
) -> Pending<Result<(), String>> {
    let (mut c, index, node) = (c.clone(), index.clone(), node.to_owned());
    Box::pin(async move { sync(&mut c, &index, &node, timeout).await })
}

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
