//! Issue 36's acceptance bench: the fleet console on a 5,000-node cluster, printed as Markdown.
//!
//! The scene ([`blockjanitor_tests::cluster_scene`]): a stand-in API server
//! ([`blockjanitor_tests::kube_mock`]) serving `BENCH_AGENTS` Nodes (default 5,000),
//! `BENCH_VOLUMES` PVs, PVCs and VolumeAttachments (default 10 a node: 50,000) and `BENCH_PODS`
//! pods (default 20 a node: 100,000, half of them with a PVC), shaped as the API server returns
//! them, with a trickle of watch events (`BENCH_KUBE_EVENTS` a second, default 20: pods
//! restarting, VolumeAttachments detached and attached again); one stand-in agent per Node
//! ([`blockjanitor_tests::standin_fleet`], real gRPC over mutual TLS on loopback) whose devices
//! agree with the objects (disk, partitions, an rbd mapping per attached volume with its mounts
//! and the pod's process holding it, 2 % stale, 0.1 % also mapped on a second node, loops, nbd)
//! and whose event streams carry a churn of `BENCH_CHURN` changes per node per minute (default 1,
//! nodes at random) plus a burst of `BENCH_BURST_NODES` nodes at once (default 50) every
//! `BENCH_BURST_SECONDS` (default 60). `BENCH_REPLICAS` real `blockjanitor-console` processes
//! (default 2) follow the agents (static `--agents`) and the API (`--kube-url`), with the shipped
//! defaults (a 3 s deadline on every call to an agent, the per-person limits).
//!
//! Measured, all in one run: convergence per replica (from spawning it until `/readyz` answers
//! 200 and `ListNodes` shows every agent reachable); then for `BENCH_SECONDS` (default 300)
//! `BENCH_CALLERS` concurrent callers (default 8, each a person with their own certificate, on
//! replica `caller % replicas`, `BENCH_THINK_MS` between two calls, default 200) mixing `Where`
//! (by image, PV or PVC), `WhoWatches` (a node's `rados listwatchers` line), `Explain` (a pod with
//! a volume), `Sweep` and, every `BENCH_FRESH_SECONDS` per caller (default 10, within the
//! per-person limit of 12 a minute), `Where` with `fresh`; every call with a
//! `BENCH_DEADLINE_MS` deadline (default 3,000), over it counted as such; while a scraper GETs
//! each replica's `/metrics` every `BENCH_SCRAPE_SECONDS` (default 15). Reported: p50 / p99 / max
//! per call kind, calls over the deadline, refused and failed, answers that miss what the scene
//! put there; scrape latency; each replica's RSS (converged, peak while measured, `VmHWM`); and
//! false "agent down": every agent answers throughout, so any node a replica lists not reachable
//! (or stale) in `ListNodes` (polled every `BENCH_LIVENESS_SECONDS`, default 5), any agent link
//! its log says was lost or marked dead, and any `agents{state="down"}` in a scrape is one.
//!
//! Run (the full scale, on a quiet machine; about 15 minutes with the build warm):
//! `cargo build --release --bins && cargo bench -p blockjanitor-tests --bench console_cluster`
//!
//! A small run: `BENCH_AGENTS=300 BENCH_SECONDS=60 cargo bench -p blockjanitor-tests --bench
//! console_cluster` (volumes and pods follow the agents' count). `BENCH_CONSOLE_LOG=1` prints
//! the consoles' logs.
//!
//! Lists: the stand-in API server pages a list as the real one does (`limit` honoured at the
//! most recent version, ignored at resource version 0, which its watch cache answers in one
//! piece: kubernetes/kubernetes#70735). The scene's line says how the console's pod lists were
//! answered: in pages, or whole.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockjanitor_console::scale_objects::{self as objects, Shape};
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::cluster_scene::{self as scene, Rng, Sent};
use blockjanitor_tests::console::{Console, ConsoleFiles};
use blockjanitor_tests::daemon::Pki;
use blockjanitor_tests::fleet_bench::{client_as, env_usize, load};
use blockjanitor_tests::http::http_response;
use blockjanitor_tests::kube_mock::{ApiServer, Recorded};
use blockjanitor_tests::kube_reads::PODS;
use blockjanitor_tests::measure::{ms, percentile, status_kib};
use blockjanitor_tests::standin_fleet::{self as fleet, NodeState, StandIn};
use tonic::transport::Channel;

/// Everything the environment sets.
struct Config {
    shape: Shape,
    replicas: usize,
    seconds: u64,
    callers: usize,
    think: Duration,
    deadline: Duration,
    fresh_every: Duration,
    scrape_every: Duration,
    liveness_every: Duration,
    churn: f64,
    burst: (usize, Duration),
    kube_events: f64,
}

impl Config {
    fn from_env() -> Self {
        let nodes = env_usize("BENCH_AGENTS", objects::ISSUE_36.nodes).max(2);
        let secs = |name, default| Duration::from_secs(env_usize(name, default) as u64);
        Config {
            shape: Shape {
                nodes,
                volumes: env_usize("BENCH_VOLUMES", nodes * 10),
                pods: env_usize("BENCH_PODS", nodes * 20),
            },
            replicas: env_usize("BENCH_REPLICAS", 2).max(1),
            seconds: env_usize("BENCH_SECONDS", 300) as u64,
            callers: env_usize("BENCH_CALLERS", 8).max(1),
            think: Duration::from_millis(env_usize("BENCH_THINK_MS", 200) as u64),
            deadline: Duration::from_millis(env_usize("BENCH_DEADLINE_MS", 3000) as u64),
            fresh_every: secs("BENCH_FRESH_SECONDS", 10),
            scrape_every: secs("BENCH_SCRAPE_SECONDS", 15).max(Duration::from_secs(1)),
            liveness_every: secs("BENCH_LIVENESS_SECONDS", 5).max(Duration::from_secs(1)),
            churn: env_usize("BENCH_CHURN", 1) as f64,
            burst: (
                env_usize("BENCH_BURST_NODES", 50),
                secs("BENCH_BURST_SECONDS", 60).max(Duration::from_secs(1)),
            ),
            kube_events: env_usize("BENCH_KUBE_EVENTS", 20) as f64,
        }
    }
}

/// The deadline of the bench's own `ListNodes` (convergence, liveness polls): a replica that
/// stops answering is reported, not waited for.
const MONITOR: Duration = Duration::from_secs(10);

/// The kinds of call the callers make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Where,
    WhoWatches,
    Explain,
    Sweep,
    Fresh,
}

impl Kind {
    const ALL: [Kind; 5] = [Kind::Where, Kind::WhoWatches, Kind::Explain, Kind::Sweep, Kind::Fresh];

    fn label(self) -> &'static str {
        match self {
            Kind::Where => "`Where` from the index (image, PV or PVC)",
            Kind::WhoWatches => "`WhoWatches` from the index (a `listwatchers` line)",
            Kind::Explain => "`Explain` (a pod with a volume)",
            Kind::Sweep => "`Sweep` (every kind)",
            Kind::Fresh => "`Where` with `fresh` (fan-out to every agent)",
        }
    }

    fn goal(self) -> &'static str {
        match self {
            Kind::Where | Kind::WhoWatches => "p99 ≤ 50 ms",
            Kind::Explain => "p99 ≤ 200 ms",
            Kind::Sweep => "",
            Kind::Fresh => "p99 ≤ 5 s",
        }
    }

    /// The goal's bound on p99, if any.
    fn bound(self) -> Option<Duration> {
        match self {
            Kind::Where | Kind::WhoWatches => Some(Duration::from_millis(50)),
            Kind::Explain => Some(Duration::from_millis(200)),
            Kind::Sweep => None,
            Kind::Fresh => Some(Duration::from_secs(5)),
        }
    }

    /// The weighted pick of the index questions: Where 40 %, WhoWatches 25 %, Explain 25 %,
    /// Sweep 10 %.
    fn pick(rng: &mut Rng) -> Kind {
        match rng.below(100) {
            0..=39 => Kind::Where,
            40..=64 => Kind::WhoWatches,
            65..=89 => Kind::Explain,
            _ => Kind::Sweep,
        }
    }
}

/// How one call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// Answered, but without what the scene put there (the string says what).
    Wrong(String),
    OverDeadline,
    /// RESOURCE_EXHAUSTED: a per-person or total limit.
    Refused,
    Failed(String),
}

/// Every call of one kind.
#[derive(Default)]
struct Calls {
    /// Latencies of the calls that were answered (right or wrong).
    answered: Vec<Duration>,
    over: usize,
    refused: usize,
    failed: Vec<String>,
    wrong: Vec<String>,
}

type Record = Arc<Mutex<BTreeMap<Kind, Calls>>>;

fn record(rec: &Record, kind: Kind, took: Duration, outcome: Outcome) {
    let mut r = rec.lock().expect("record");
    let c = r.entry(kind).or_default();
    match outcome {
        Outcome::Ok => c.answered.push(took),
        Outcome::Wrong(w) => {
            c.answered.push(took);
            c.wrong.push(w);
        }
        Outcome::OverDeadline => c.over += 1,
        Outcome::Refused => c.refused += 1,
        Outcome::Failed(e) => c.failed.push(e),
    }
}

/// A call with the deadline (sent as `grpc-timeout`, and enforced here).
async fn bounded<T, F>(deadline: Duration, call: F, check: impl FnOnce(&T) -> Option<String>) -> Outcome
where
    F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
{
    match tokio::time::timeout(deadline, call).await {
        Err(_) => Outcome::OverDeadline,
        // The server ends a call past its `grpc-timeout` with CANCELLED.
        Ok(Err(s)) if matches!(s.code(), tonic::Code::DeadlineExceeded | tonic::Code::Cancelled) => {
            Outcome::OverDeadline
        }
        Ok(Err(s)) if s.code() == tonic::Code::ResourceExhausted => Outcome::Refused,
        Ok(Err(s)) => Outcome::Failed(format!("{:?}: {}", s.code(), s.message())),
        Ok(Ok(r)) => check(r.get_ref()).map_or(Outcome::Ok, Outcome::Wrong),
    }
}

fn timed<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(deadline);
    r
}

/// One caller: questions until `until`, each recorded.
async fn caller(
    mut c: FleetClient<Channel>,
    k: usize,
    cfg: Arc<Config>,
    until: tokio::time::Instant,
    rec: Record,
) {
    let s = cfg.shape;
    let mut rng = Rng::new(1000 + k as u64);
    let start = tokio::time::Instant::now();
    let mut next_fresh = (!cfg.fresh_every.is_zero())
        .then(|| start + cfg.fresh_every.mul_f64((k + 1) as f64 / cfg.callers as f64));
    let d = cfg.deadline;
    while tokio::time::Instant::now() < until {
        let kind = match next_fresh {
            Some(at) if tokio::time::Instant::now() >= at => {
                next_fresh = Some(at + cfg.fresh_every);
                Kind::Fresh
            }
            _ => Kind::pick(&mut rng),
        };
        let v = rng.below(s.volumes.max(1));
        let node = objects::node_name(s.volume_node(v));
        let t = Instant::now();
        let outcome = match kind {
            Kind::Where | Kind::Fresh => {
                let (pvc_ns, pvc_name) = objects::pvc_of(v);
                let mut req = pb::WhereRequest { fresh: kind == Kind::Fresh, ..Default::default() };
                match rng.below(3) {
                    0 => req.image = format!("{}/{}", objects::POOL, objects::image_name(v)),
                    1 => req.pv = objects::pv_name(v),
                    _ => req.pvc = format!("{pvc_ns}/{pvc_name}"),
                }
                bounded(d, c.r#where(timed(req, d)), |r: &pb::WhereResponse| {
                    (!r.matches.iter().any(|m| m.node == node))
                        .then(|| format!("volume {v} not found on {node}: {}", r.resolved))
                })
                .await
            }
            Kind::WhoWatches => {
                let i = s.volume_node(v);
                let req = pb::WhoWatchesRequest { text: scene::watcher_text(i), ..Default::default() };
                bounded(d, c.who_watches(timed(req, d)), |r: &pb::WhoWatchesResponse| {
                    let w = r.watchers.first()?;
                    w.mappings.is_empty().then(|| format!("no mapping of node-{i}'s client: {}", w.detail))
                })
                .await
            }
            Kind::Explain => match s.pod_of_volume(v) {
                Some(p) => {
                    let (namespace, name) = s.pod_of(p);
                    let req = pb::ExplainRequest { kind: "pod".into(), name, namespace };
                    bounded(d, c.explain(timed(req, d)), |r: &pb::ExplainResponse| {
                        r.volumes.is_empty().then(|| format!("no volume explained for {}", r.target))
                    })
                    .await
                }
                None => continue,
            },
            Kind::Sweep => bounded(d, c.sweep(timed(pb::SweepRequest::default(), d)), |_| None).await,
        };
        record(&rec, kind, t.elapsed(), outcome);
        tokio::time::sleep(cfg.think).await;
    }
}

/// Scrapes of one replica: latencies, bytes of the last, the highest `agents{state="down"}`.
#[derive(Default)]
struct Scrapes {
    took: Vec<Duration>,
    failed: Vec<String>,
    bytes: usize,
    max_down: f64,
}

fn scrape(addr: SocketAddr) -> Result<(Duration, String), String> {
    let t = Instant::now();
    let r =
        std::panic::catch_unwind(|| http_response(addr, "/metrics")).map_err(|_| "no answer".to_owned())?;
    match r {
        (200, body) => Ok((t.elapsed(), body)),
        (code, body) => Err(format!("HTTP {code}: {}", body.lines().next().unwrap_or(""))),
    }
}

fn agents_down(metrics: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("blockjanitor_console_agents{state=\"down\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// What the liveness polls saw on one replica: nodes listed not reachable or stale, and why.
#[derive(Default)]
struct Liveness {
    polls: usize,
    /// Polls the replica did not answer within [`MONITOR`].
    unanswered: usize,
    down: BTreeMap<String, String>,
}

fn not_answering(n: &pb::FleetNode) -> Option<String> {
    if !n.reachable {
        Some(if n.error.is_empty() { "not reachable".into() } else { n.error.clone() })
    } else if !n.stale.is_empty() {
        Some(n.stale.clone())
    } else {
        None
    }
}

/// Lines of a console's log after the first `from` that say an agent link was lost or marked dead.
fn link_losses(log: &str, from: usize) -> (usize, BTreeSet<String>) {
    let mut nodes = BTreeSet::new();
    let mut n = 0;
    for l in log.lines().skip(from) {
        if l.contains("link to the agent lost") || l.contains("link marked dead") {
            n += 1;
            if let Some(node) = l.split("\"node\":\"").nth(1).and_then(|r| r.split('"').next()) {
                nodes.insert(node.to_owned());
            }
        }
    }
    (n, nodes)
}

/// Per replica: how long until it was ready and had every agent reachable (`None`: not within
/// `limit`).
async fn converge(
    clients: &mut [FleetClient<Channel>],
    metrics: &[SocketAddr],
    agents: usize,
    started: Instant,
    limit: Duration,
) -> Vec<(Option<Duration>, Option<Duration>)> {
    let mut done: Vec<(Option<Duration>, Option<Duration>)> = vec![(None, None); clients.len()];
    while started.elapsed() < limit && done.iter().any(|(r, s)| r.is_none() || s.is_none()) {
        for ((c, m), (ready, synced)) in clients.iter_mut().zip(metrics).zip(done.iter_mut()) {
            if ready.is_none() {
                let m = *m;
                let code = tokio::task::spawn_blocking(move || {
                    std::panic::catch_unwind(|| http_response(m, "/readyz").0).unwrap_or(0)
                })
                .await
                .unwrap_or(0);
                if code == 200 {
                    *ready = Some(started.elapsed());
                }
            }
            if synced.is_none() {
                if let Ok(Ok(n)) = tokio::time::timeout(MONITOR, c.list_nodes(pb::ListNodesRequest {})).await
                {
                    if n.get_ref().nodes.iter().filter(|x| x.reachable).count() >= agents {
                        *synced = Some(started.elapsed());
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (r, (c, m)) in clients.iter_mut().zip(metrics).enumerate() {
        if done[r].0.is_none() || done[r].1.is_none() {
            let m = *m;
            let ready =
                tokio::task::spawn_blocking(move || std::panic::catch_unwind(|| http_response(m, "/readyz")))
                    .await
                    .ok()
                    .and_then(Result::ok);
            let up = tokio::time::timeout(MONITOR, c.list_nodes(pb::ListNodesRequest {})).await.map(|n| {
                let Ok(n) = n else { return "ListNodes failed".to_owned() };
                let n = n.into_inner();
                let down: Vec<String> = n
                    .nodes
                    .iter()
                    .filter_map(|x| Some(format!("{}: {}", x.name, not_answering(x)?)))
                    .take(3)
                    .collect();
                format!(
                    "{} of {agents} reachable; e.g. {down:?}",
                    n.nodes.iter().filter(|x| x.reachable).count()
                )
            });
            eprintln!("bench: replica {r} not converged within {limit:?}: /readyz {ready:?}; {up:?}");
        }
    }
    done
}

/// What one list of the pods on a node costs the stand-in API server (indexed by node, as in the
/// API server's watch cache): a part of every Explain's time here.
fn mock_pods_on_node(api: &ApiServer) -> Duration {
    let rec = Recorded {
        method: hyper::Method::GET,
        path: PODS.into(),
        query: [("fieldSelector".to_owned(), format!("spec.nodeName={}", objects::node_name(0)))].into(),
        content_type: String::new(),
        authorization: String::new(),
        accept: String::new(),
        body: serde_json::Value::Null,
    };
    let t = Instant::now();
    let _ = api.list(PODS, &rec);
    t.elapsed()
}

fn mib(k: u64) -> String {
    format!("{:.1} MiB", k as f64 / 1024.0)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("not within the limit".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

fn met(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**not met**"
    }
}

fn main() {
    let cfg = Arc::new(Config::from_env());
    let s = cfg.shape;
    let replicas = cfg.replicas;
    let load_start = load();
    // This process: the stand-ins' listeners and connections, and the API server's.
    fleet::raise_nofile_for(s.nodes, replicas, 4096);
    let rt = blockjanitor_tests::rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("bench CA");
    let files = ConsoleFiles::write(&pki, dir.path());

    let t = Instant::now();
    let api = rt.block_on(ApiServer::start(serde_json::Value::Null));
    let objects_served = scene::fill(&api, &s);
    let built_objects = t.elapsed();
    let pods_on_node = mock_pods_on_node(&api);
    eprintln!("bench: {objects_served} objects built in {:.1} s", built_objects.as_secs_f64());
    let me = std::process::id();

    let tls = fleet::server_tls(&pki);
    let (states, entries): (Vec<Arc<NodeState>>, Vec<String>) = rt.block_on(async {
        let mut states = Vec::with_capacity(s.nodes);
        let mut entries = Vec::with_capacity(s.nodes);
        for i in 0..s.nodes {
            let svc = StandIn::new(objects::node_name(i), scene::devices(&s, i), Duration::ZERO);
            states.push(Arc::clone(&svc.state));
            entries.push(format!("{}={}", objects::node_name(i), fleet::serve(&tls, svc).await));
        }
        (states, entries)
    });
    let devices: usize = states.iter().map(|n| n.device_count()).sum();
    let states = Arc::new(states);
    let bench_rss = status_kib(me, "VmRSS:");
    eprintln!("bench: {} stand-in agents serving {devices} devices; starting {replicas} console(s)", s.nodes);

    let callers: Vec<String> = (0..cfg.callers).map(|k| format!("caller-{k}")).collect();
    let mut args = files.args("bench");
    for c in &callers {
        args.extend(["--viewer".to_owned(), c.clone()]);
    }
    args.extend(["--kube-url".to_owned(), api.url(), "--agents".to_owned(), entries.join(",")]);
    let echo = std::env::var_os("BENCH_CONSOLE_LOG").is_some();

    let started = Instant::now();
    let consoles: Vec<Console> = (0..replicas)
        .map(|_| {
            Console::start_configured(&args, echo.then_some("console"), |c| {
                c.env("RUST_LOG", "warn,blockjanitor_console=info");
            })
        })
        .collect();
    let pids: Vec<u32> = consoles.iter().map(|c| c.pid).collect();
    let grpc: Vec<SocketAddr> = consoles.iter().map(|c| c.tcp).collect();
    let metrics: Vec<SocketAddr> = consoles.iter().map(|c| c.metrics).collect();

    rt.block_on(async {
        // The cluster changes from the start, as a live one does; through the window.
        let window = Duration::from_secs(cfg.seconds);
        let limit = Duration::from_secs(env_usize("BENCH_CONVERGE_LIMIT", 600) as u64);
        let churn_until = tokio::time::Instant::now() + limit + window + Duration::from_secs(5);
        let sent = Arc::new(Mutex::new(Sent::default()));
        let churn = tokio::spawn(scene::churn(
            s,
            Arc::clone(&states),
            cfg.churn,
            cfg.burst,
            churn_until,
            Arc::clone(&sent),
        ));
        let trickle_stop = Arc::new(tokio::sync::Notify::new());
        let trickle = {
            let (api, stop) = (api.clone(), Arc::clone(&trickle_stop));
            let per_second = cfg.kube_events;
            tokio::spawn(async move {
                tokio::select! {
                    n = scene::kube_trickle(api, s, per_second, churn_until) => n,
                    _ = stop.notified() => 0,
                }
            })
        };
        let published_before = || api.state.lock().expect("state").log.len();

        let mut monitors = Vec::new();
        for a in &grpc {
            monitors.push(client_as(*a, &pki, "bench").await);
        }
        let converged = converge(&mut monitors, &metrics, s.nodes, started, limit).await;
        eprintln!("bench: converged {converged:?}; measuring for {window:?}");
        let rss_converged: Vec<u64> = pids.iter().map(|p| status_kib(*p, "VmRSS:")).collect();
        let log_mark: Vec<usize> = consoles.iter().map(|c| c.log_text().lines().count()).collect();
        let sent_at_start = *sent.lock().expect("sent");
        let kube_at_start = published_before();
        let load_converged = load();

        // The measured window.
        let until = tokio::time::Instant::now() + window;
        let rec: Record = Arc::default();
        let mut tasks = Vec::new();
        for (k, who) in callers.iter().enumerate() {
            let c = client_as(grpc[k % replicas], &pki, who).await;
            tasks.push(tokio::spawn(caller(c, k, Arc::clone(&cfg), until, Arc::clone(&rec))));
        }
        let scrapes: Arc<Mutex<Vec<Scrapes>>> =
            Arc::new(Mutex::new((0..replicas).map(|_| Scrapes::default()).collect()));
        let scraper = {
            let (scrapes, metrics, every) = (Arc::clone(&scrapes), metrics.clone(), cfg.scrape_every);
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                while tokio::time::Instant::now() < until {
                    tick.tick().await;
                    for (r, m) in metrics.iter().enumerate() {
                        let m = *m;
                        let got = tokio::task::spawn_blocking(move || scrape(m)).await.expect("scrape task");
                        let mut all = scrapes.lock().expect("scrapes");
                        match got {
                            Ok((took, body)) => {
                                all[r].took.push(took);
                                all[r].bytes = body.len();
                                all[r].max_down = all[r].max_down.max(agents_down(&body));
                            }
                            Err(e) => all[r].failed.push(e),
                        }
                    }
                }
            })
        };
        let liveness: Arc<Mutex<Vec<Liveness>>> =
            Arc::new(Mutex::new((0..replicas).map(|_| Liveness::default()).collect()));
        let poller = {
            let (liveness, every, pids) = (Arc::clone(&liveness), cfg.liveness_every, pids.clone());
            let mut clients = monitors.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                while tokio::time::Instant::now() < until {
                    tick.tick().await;
                    for (r, c) in clients.iter_mut().enumerate() {
                        let n = tokio::time::timeout(MONITOR, c.list_nodes(pb::ListNodesRequest {})).await;
                        let mut all = liveness.lock().expect("liveness");
                        all[r].polls += 1;
                        let Ok(Ok(n)) = n else {
                            all[r].unanswered += 1;
                            eprintln!("bench: replica {r} (pid {}) did not answer ListNodes: {n:?}", pids[r]);
                            continue;
                        };
                        for node in &n.get_ref().nodes {
                            if let Some(why) = not_answering(node) {
                                all[r].down.entry(node.name.clone()).or_insert(why);
                            }
                        }
                    }
                }
            })
        };
        let mut peak: Vec<u64> = rss_converged.clone();
        while tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_secs(1)).await;
            for (p, pid) in peak.iter_mut().zip(&pids) {
                *p = (*p).max(status_kib(*pid, "VmRSS:"));
            }
        }
        for t in tasks {
            let _ = t.await;
        }
        let _ = scraper.await;
        let _ = poller.await;
        let load_end = load();
        let hwm: Vec<u64> = pids.iter().map(|p| status_kib(*p, "VmHWM:")).collect();
        let sent_end = *sent.lock().expect("sent");
        let kube_events = published_before() - kube_at_start;
        churn.abort();
        trickle_stop.notify_one();
        let _ = trickle.await;
        let bench_hwm = status_kib(me, "VmHWM:");

        // The report.
        let window_s = window.as_secs_f64().max(1.0);
        let changes = sent_end.changes - sent_at_start.changes;
        println!("Load at the start: {load_start}; converged: {load_converged}; at the end: {load_end}.\n");
        println!("| figure | measured | goal | |");
        println!("|---|---|---|---|");
        println!(
            "| scene | {} Nodes and agents ({devices} devices, {:.1} a node), {} PVs / PVCs / VolumeAttachments, {} pods: {objects_served} objects served (built in {:.1} s), lists {}; {replicas} console replica(s) | | |",
            s.nodes,
            devices as f64 / s.nodes as f64,
            s.volumes,
            s.pods,
            built_objects.as_secs_f64(),
            pod_lists(&api)
        );
        println!(
            "| churn while measured ({:.0} s): device changes / per node a minute / bursts of {} nodes / events delivered; Kubernetes watch events | {changes} / {:.2} / {} / {}; {kube_events} | 1 a node a minute, bursts of 50 | |",
            window_s,
            cfg.burst.0,
            changes as f64 / s.nodes as f64 / (window_s / 60.0),
            sent_end.bursts - sent_at_start.bursts,
            sent_end.delivered - sent_at_start.delivered,
        );
        let conv: Vec<String> = converged
            .iter()
            .enumerate()
            .map(|(r, (ready, synced))| format!("#{r}: ready {} / every agent synced {}", secs(*ready), secs(*synced)))
            .collect();
        let conv_ok = converged
            .iter()
            .all(|(ready, synced)| ready.zip(*synced).is_some_and(|(r, y)| r.max(y) <= Duration::from_secs(60)));
        println!("| convergence after a cold start (from spawning), per replica | {} | ≤ 60 s | {} |", conv.join("; "), met(conv_ok));
        let rec = rec.lock().expect("record");
        for kind in Kind::ALL {
            let Some(c) = rec.get(&kind) else {
                println!("| {} | no call | {} | |", kind.label(), kind.goal());
                continue;
            };
            let mut lat = c.answered.clone();
            lat.sort();
            let (p50, p99, max) = if lat.is_empty() {
                ("-".to_owned(), "-".to_owned(), "-".to_owned())
            } else {
                (ms(percentile(&lat, 0.5)), ms(percentile(&lat, 0.99)), ms(lat[lat.len() - 1]))
            };
            let verdict = match kind.bound() {
                Some(b) => met(!lat.is_empty() && percentile(&lat, 0.99) <= b && c.over == 0),
                None => "",
            };
            println!(
                "| {}: p50 / p99 / max ({} answered; over the deadline {}, refused {}, failed {}, wrong {}) | {p50} / {p99} / {max} | {} | {verdict} |",
                kind.label(),
                lat.len(),
                c.over,
                c.refused,
                c.failed.len(),
                c.wrong.len(),
                kind.goal(),
            );
        }
        let scrapes = scrapes.lock().expect("scrapes");
        let mut all_scrapes: Vec<Duration> = scrapes.iter().flat_map(|s| s.took.iter().copied()).collect();
        all_scrapes.sort();
        let per: Vec<String> = scrapes
            .iter()
            .enumerate()
            .map(|(r, x)| {
                let mut t = x.took.clone();
                t.sort();
                let p99 = if t.is_empty() { "-".into() } else { ms(percentile(&t, 0.99)) };
                format!("#{r}: {} scrapes, p99 {p99}, {} failed, {} KiB", t.len(), x.failed.len(), x.bytes / 1024)
            })
            .collect();
        let scrape_ok = !all_scrapes.is_empty()
            && percentile(&all_scrapes, 0.99) <= Duration::from_secs(1)
            && scrapes.iter().all(|x| x.failed.is_empty());
        println!(
            "| `/metrics` scrape every {} s, p50 / p99 / max over the replicas ({}) | {} | p99 ≤ 1 s | {} |",
            cfg.scrape_every.as_secs(),
            per.join("; "),
            if all_scrapes.is_empty() {
                "-".to_owned()
            } else {
                format!(
                    "{} / {} / {}",
                    ms(percentile(&all_scrapes, 0.5)),
                    ms(percentile(&all_scrapes, 0.99)),
                    ms(all_scrapes[all_scrapes.len() - 1])
                )
            },
            met(scrape_ok)
        );
        let rss: Vec<String> = (0..replicas)
            .map(|r| format!("#{r}: {} / {} / {}", mib(rss_converged[r]), mib(peak[r]), mib(hwm[r])))
            .collect();
        let rss_ok = hwm.iter().all(|k| *k <= 1024 * 1024);
        println!("| console RSS per replica: converged / peak while measured / `VmHWM` (whole run) | {} | ≤ 1 GiB | {} |", rss.join("; "), met(rss_ok));
        let liveness = liveness.lock().expect("liveness");
        let mut false_down = 0;
        let lines: Vec<String> = (0..replicas)
            .map(|r| {
                let (losses, nodes) = link_losses(&consoles[r].log_text(), log_mark[r]);
                let l = &liveness[r];
                false_down += l.down.len() + losses + scrapes[r].max_down as usize;
                let sample = l.down.iter().next().map(|(n, why)| format!(" (e.g. {n}: {why})")).unwrap_or_default();
                format!(
                    "#{r}: {} node(s) listed down or stale in {} polls ({} unanswered within {} s){sample}; {losses} link(s) lost or marked dead ({} nodes); scrapes: at most {} agent(s) down",
                    l.down.len(),
                    l.polls,
                    l.unanswered,
                    MONITOR.as_secs(),
                    nodes.len(),
                    scrapes[r].max_down
                )
            })
            .collect();
        println!("| false \"agent down\" while measured (every agent answers throughout) | {} | none | {} |", lines.join("; "), met(false_down == 0));
        let startup: Vec<String> = (0..replicas)
            .map(|r| {
                let log = consoles[r].log_text();
                let before: String = log.lines().take(log_mark[r]).collect::<Vec<_>>().join("\n");
                format!("#{r}: {}", link_losses(&before, 0).0)
            })
            .collect();
        println!("| agent links lost or marked dead before convergence (cold start) | {} | | |", startup.join("; "));
        println!("| the bench process (stand-ins, API server, callers): RSS after the scene was built / peak | {} / {} | | |", mib(bench_rss), mib(bench_hwm));
        println!("| the stand-in API server's list of the pods on one node (Explain reads one per node holding the volume; indexed by node) | {} | | |", ms(pods_on_node));
        for kind in Kind::ALL {
            if let Some(c) = rec.get(&kind) {
                for (what, list) in [("failed", &c.failed), ("wrong", &c.wrong)] {
                    let distinct: BTreeSet<&String> = list.iter().collect();
                    for e in distinct.iter().take(3) {
                        println!("\n{kind:?} {what}: {e}");
                    }
                }
            }
        }
    });
    drop(consoles);
}

/// How the consoles' pod lists were answered, from the stand-in API server's request log: how
/// many list requests, how many of them paged (a `limit` at the most recent version) and how
/// many answered whole (at a given resource version, from the watch cache).
fn pod_lists(api: &ApiServer) -> String {
    let st = api.state.lock().expect("state");
    let lists: Vec<_> =
        st.requests.iter().filter(|r| r.path == PODS && !r.is_watch() && r.method == "GET").collect();
    let paged = lists
        .iter()
        .filter(|r| {
            r.query.contains_key("limit") && r.query.get("resourceVersion").is_none_or(|v| v.is_empty())
        })
        .count();
    format!("pods listed in {} requests: {paged} paged, {} whole", lists.len(), lists.len() - paged)
}
