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
//! Liveness: every link sends HTTP/2 pings (and TCP keepalives), so an agent that goes silent
//! (stopped, partitioned, killed) ends its connection within `keepalive_interval +
//! keepalive_timeout`, and its node is marked down in the index (since when, why) and named
//! missing in every answer. A forced read that fails marks the node down at once and ends its
//! session, so the next fan-out skips it instead of waiting the call deadline again; only a new
//! connection whose full read succeeds marks it up again.

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
use tonic::transport::Channel;

use crate::discover::AgentSpec;
use crate::index::Index;

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
    /// Between two HTTP/2 pings on a link (sent whether or not calls are in flight).
    pub keepalive_interval: Duration,
    /// How long a ping may go unanswered before the link counts as dead.
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
            keepalive_timeout: Duration::from_secs(2),
            tcp_keepalive: Duration::from_secs(10),
            connecting: Arc::new(tokio::sync::Semaphore::new(CONNECTS_AT_ONCE)),
        }
    }
}

/// A connected session's client, and how to end that session (a forced read found it dead).
#[derive(Clone)]
struct Live {
    client: AgentClient<Channel>,
    end: Arc<Notify>,
}

type ClientSlot = Arc<Mutex<Option<Live>>>;

/// Why a session ended when a forced read marked its link dead (the index says more).
const ENDED_BY_FAN_OUT: &str = "a forced read failed";

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
}

impl Drop for Links {
    fn drop(&mut self) {
        for (_, l) in self.links.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            l.task.abort();
        }
    }
}

impl Links {
    pub fn new(index: Index, opts: LinkOptions) -> Self {
        Self {
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
            ));
            links.insert(name.clone(), Link { address: spec.address.clone(), task, client, resync });
        }
    }

    /// The live client for a node, when its link is connected.
    pub fn client(&self, node: &str) -> Option<AgentClient<Channel>> {
        let links = self.links.lock().unwrap_or_else(|p| p.into_inner());
        let l = links.get(node)?;
        let c = l.client.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map(|l| l.client.clone());
        c
    }

    /// Marks a node's link dead after a failed call (`why`) and ends its session, so that no
    /// caller waits on it again until a new connection has answered a full read.
    pub fn mark_dead(&self, node: &str, why: String) {
        let live = self
            .links
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(node)
            .and_then(|l| l.client.lock().unwrap_or_else(|p| p.into_inner()).take());
        tracing::warn!(node = %node, error = %why, "link marked dead: skipped until the agent answers again");
        self.index.with_node(node, |n| n.mark_down(why));
        if let Some(l) = live {
            l.end.notify_one();
        }
    }

    /// Asks a node's link to read the full device list again soon.
    pub fn request_resync(&self, node: &str) {
        if let Some(l) = self.links.lock().unwrap_or_else(|p| p.into_inner()).get(node) {
            l.resync.notify_one();
        }
    }

    /// Reads every connected agent's device list now, all at once, each bounded by the call
    /// deadline, and puts the answers in the index. Returns when all have answered or timed out.
    /// Links already known dead are not asked (answers name their nodes missing); a link whose
    /// read fails is marked dead, so the next fan-out does not wait on it again.
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
                    Some(live) => clients.push((n.clone(), live.client.clone())),
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
        let mut failed = 0usize;
        while let Some(r) = set.join_next().await {
            let Ok((node, took, r)) = r else { continue };
            if let Err(e) = r {
                failed += 1;
                self.mark_dead(&node, format!("a forced read failed: {e}"));
            }
            if took > slowest.1 {
                slowest = (node, took);
            }
        }
        tracing::info!(agents = asked, skipped_dead = skipped, failed, took_ms = started.elapsed().as_millis() as u64,
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
async fn run(spec: AgentSpec, opts: Arc<LinkOptions>, index: Index, slot: ClientSlot, resync: Arc<Notify>) {
    let mut backoff = opts.backoff_initial;
    loop {
        let (synced, error) = session(&spec, &opts, &index, &slot, &resync).await;
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        tracing::info!(node = %spec.node, address = %spec.address, error = %error, "link to the agent lost");
        index.with_node(&spec.node, |n| {
            // A forced read that ended the session marked the node down already, saying why.
            if error != ENDED_BY_FAN_OUT {
                n.mark_down(error);
            }
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

/// One connection: returns whether it got as far as a full sync, and why it ended.
async fn session(
    spec: &AgentSpec,
    opts: &LinkOptions,
    index: &Index,
    slot: &ClientSlot,
    resync: &Notify,
) -> (bool, String) {
    let target = Target::Tcp(TcpTarget {
        addr: spec.address.clone(),
        cert: opts.tls.cert.clone(),
        key: opts.tls.key.clone(),
        ca: opts.tls.ca.clone(),
        server_name: opts.server_name.clone(),
    });
    let keepalive = |e: tonic::transport::Endpoint| {
        e.http2_keep_alive_interval(opts.keepalive_interval)
            .keep_alive_timeout(opts.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_keepalive(Some(opts.tcp_keepalive))
    };
    // Held until the first full read is in (each step has its own deadline).
    let permit = opts.connecting.acquire().await;
    let mut c = match client::connect_tuned(&target, opts.connect_timeout, keepalive).await {
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
    let end = Arc::new(Notify::new());
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(Live { client: c.clone(), end: Arc::clone(&end) });
    tracing::debug!(node = %spec.node, address = %spec.address, "agent synced");
    // Resyncs jittered: after a cold start every link syncs within seconds of the others, and
    // unjittered they would all read their agents' lists again in the same second, every period.
    let first = tokio::time::Instant::now() + jitter(opts.resync_interval);
    let mut tick = tokio::time::interval_at(first, opts.resync_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let again = tokio::select! {
            m = stream.message() => match m {
                Ok(Some(ev)) => apply_event(index, &spec.node, ev),
                Ok(None) => return (true, "the agent ended the event stream".into()),
                Err(s) => return (true, format!(
                    "the link broke (no answer to a keepalive ping within {:?}, or the connection closed): WatchEvents: {}",
                    opts.keepalive_timeout,
                    client::status_line(&s)
                )),
            },
            _ = tick.tick() => true,
            _ = resync.notified() => true,
            _ = end.notified() => return (true, ENDED_BY_FAN_OUT.into()),
        };
        if again {
            if let Err(e) = sync(&mut c, index, &spec.node, opts.call_timeout).await {
                return (true, e);
            }
        }
    }
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
