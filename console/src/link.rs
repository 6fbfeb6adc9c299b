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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use blockjanitor_proto::v1::agent_client::AgentClient;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use crate::discover::AgentSpec;
use crate::index::Index;
use crate::link_session::{jitter, session, ClientSlot};
pub use crate::link_session::{sync, sync_devices, LinkOptions, TlsFiles, CONNECTS_AT_ONCE};
use crate::liveness::LagMeter;

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
