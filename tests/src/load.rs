//! The agent's load test (issue 13), shared by `benches/agent_load.rs` (the full run that
//! BENCHMARKS.md reports) and `tests/load.rs` (a short run asserting counts only).
//!
//! One real agent daemon (report mode, the default) on a scratch socket and on loopback TCP with
//! mutual TLS. `clients` gRPC clients, each on its own TLS connection with its own viewer
//! certificate (so the agent's per-caller Plan limit, `plans_per_minute_per_client`, applies to
//! each client separately and is left at its default), loop over ListDevices, GetDevice and
//! Plan of a loop device the run keeps bound, pausing `think` between calls and planning at most
//! once per `plan_every`. `watchers` WatchEvents streams stay open on the unix socket. Meanwhile
//! a thread creates, mounts, unmounts and detaches loop devices `churn_per_second` times a
//! second through the real kernel (`losetup`, `mount`, `umount` on pre-made ext4 images).
//!
//! Measured: calls, failures and latency per RPC, events received, the agent's fd count and
//! VmRSS from `/proc/PID` (idle before the clients, a quarter into the load, at its end, every
//! tenth of it, and once the clients are gone). Everything the run creates is undone on drop,
//! even on panic.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use tokio_stream::StreamExt;

use crate::daemon::{tls_channel, unix_client, Daemon, Pki};
use crate::{sh, HostMount, LoopDev, Scratch};

/// What to run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub duration: Duration,
    pub clients: usize,
    pub watchers: usize,
    pub churn_per_second: u32,
    /// Pause between one client's calls.
    pub think: Duration,
    /// The least time between one client's Plan calls.
    pub plan_every: Duration,
    /// Where the run's files go (a fresh directory under /var/tmp when None).
    pub dir: Option<PathBuf>,
}

impl LoadConfig {
    /// From `LOAD_SECONDS`, `LOAD_CLIENTS`, `LOAD_WATCHERS`, `LOAD_CHURN_PER_SECOND`,
    /// `LOAD_THINK_MS`, `LOAD_PLAN_EVERY_MS`, `LOAD_DIR`, each defaulting to `self`'s value.
    pub fn from_env(self) -> Result<Self, String> {
        fn var<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
            match std::env::var(name) {
                Ok(v) => v.trim().parse().map_err(|_| format!("{name}={v:?} is not a valid number")),
                Err(_) => Ok(default),
            }
        }
        Ok(Self {
            duration: Duration::from_secs(var("LOAD_SECONDS", self.duration.as_secs())?),
            clients: var("LOAD_CLIENTS", self.clients)?,
            watchers: var("LOAD_WATCHERS", self.watchers)?,
            churn_per_second: var("LOAD_CHURN_PER_SECOND", self.churn_per_second)?,
            think: Duration::from_millis(var("LOAD_THINK_MS", self.think.as_millis() as u64)?),
            plan_every: Duration::from_millis(var("LOAD_PLAN_EVERY_MS", self.plan_every.as_millis() as u64)?),
            dir: std::env::var_os("LOAD_DIR").map(PathBuf::from).or(self.dir),
        })
    }
}

/// One RPC's tally.
#[derive(Debug, Default, Clone)]
pub struct RpcStats {
    pub calls: u64,
    pub failures: u64,
    pub latencies: Vec<Duration>,
    /// The first few failures, for the report.
    pub errors: Vec<String>,
}

impl RpcStats {
    fn record(&mut self, took: Duration, result: Result<(), String>) {
        self.calls += 1;
        self.latencies.push(took);
        if let Err(e) = result {
            self.failures += 1;
            if self.errors.len() < 5 {
                self.errors.push(e);
            }
        }
    }

    fn merge(&mut self, other: RpcStats) {
        self.calls += other.calls;
        self.failures += other.failures;
        self.latencies.extend(other.latencies);
        for e in other.errors {
            if self.errors.len() < 5 {
                self.errors.push(e);
            }
        }
    }

    /// The `p`-quantile (0..=1) of the latencies.
    pub fn quantile(&self, p: f64) -> Duration {
        let mut l = self.latencies.clone();
        l.sort_unstable();
        if l.is_empty() {
            return Duration::ZERO;
        }
        l[(((l.len() - 1) as f64) * p).round() as usize]
    }
}

/// The agent's fd count and VmRSS at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub fds: usize,
    pub rss_kib: u64,
    pub threads: u64,
}

impl Usage {
    pub fn of(pid: u32) -> Self {
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0);
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key)?.trim().trim_end_matches("kB").trim().parse().ok())
        };
        Self { fds, rss_kib: field("VmRSS:").unwrap_or(0), threads: field("Threads:").unwrap_or(0) }
    }
}

/// What a run measured.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub config_line: String,
    pub rpcs: BTreeMap<&'static str, RpcStats>,
    pub watch_streams: usize,
    pub watch_failures: u64,
    pub watch_errors: Vec<String>,
    pub events: u64,
    pub churn_cycles: u64,
    pub churn_failures: u64,
    pub churn_errors: Vec<String>,
    pub elapsed: Duration,
    /// Idle, before any client connected (the least fd count of a few samples).
    pub idle: Usage,
    /// A quarter into the load, when its working set is in place.
    pub warm: Usage,
    /// One second before the end of the load, every client still connected.
    pub end: Usage,
    /// After the clients disconnected (the least fd count within 10 s).
    pub after: Usage,
    /// VmRSS every tenth of the run (seconds since the start, KiB).
    pub rss_trend: Vec<(u64, u64)>,
}

impl LoadReport {
    /// Failed calls and streams, all RPCs together.
    pub fn failures(&self) -> u64 {
        self.rpcs.values().map(|r| r.failures).sum::<u64>() + self.watch_failures
    }

    /// Markdown for BENCHMARKS.md.
    pub fn markdown(&self) -> String {
        let ms = |d: Duration| format!("{:.2} ms", d.as_secs_f64() * 1000.0);
        let mut s = format!("{}\n\n", self.config_line);
        s += "| RPC | calls | failed | calls/s | median | p99 | max |\n|---|---|---|---|---|---|---|\n";
        for (name, r) in &self.rpcs {
            s += &format!(
                "| {name} | {} | {} | {:.0} | {} | {} | {} |\n",
                r.calls,
                r.failures,
                r.calls as f64 / self.elapsed.as_secs_f64(),
                ms(r.quantile(0.5)),
                ms(r.quantile(0.99)),
                ms(r.quantile(1.0))
            );
        }
        s += &format!(
            "\n- WatchEvents: {} streams open for the whole run, {} failed, {} events received\n",
            self.watch_streams, self.watch_failures, self.events
        );
        s += &format!(
            "- loop churn: {} create/mount/umount/detach cycles in {:.0} s ({:.2}/s), {} failed\n",
            self.churn_cycles,
            self.elapsed.as_secs_f64(),
            self.churn_cycles as f64 / self.elapsed.as_secs_f64(),
            self.churn_failures
        );
        s += &format!(
            "- agent fds: idle {}, under load {} (warm) / {} (end), after the clients left {}\n",
            self.idle.fds, self.warm.fds, self.end.fds, self.after.fds
        );
        s += &format!(
            "- agent threads: idle {}, warm {}, end {}\n",
            self.idle.threads, self.warm.threads, self.end.threads
        );
        s += &format!(
            "- agent VmRSS: idle {:.1} MiB, warm {:.1} MiB, end {:.1} MiB ({:+.1} % from warm), after {:.1} MiB\n",
            mib(self.idle.rss_kib),
            mib(self.warm.rss_kib),
            mib(self.end.rss_kib),
            self.rss_growth_pct(),
            mib(self.after.rss_kib)
        );
        let trend: Vec<String> =
            self.rss_trend.iter().map(|(t, kib)| format!("{t} s {:.1}", mib(*kib))).collect();
        s += &format!("- agent VmRSS during the run (MiB): {}\n", trend.join(", "));
        for e in
            self.rpcs.values().flat_map(|r| &r.errors).chain(&self.watch_errors).chain(&self.churn_errors)
        {
            s += &format!("- error: {e}\n");
        }
        s
    }

    /// RSS growth from the warm sample to the end, in percent.
    pub fn rss_growth_pct(&self) -> f64 {
        if self.warm.rss_kib == 0 {
            return 0.0;
        }
        (self.end.rss_kib as f64 / self.warm.rss_kib as f64 - 1.0) * 100.0
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A tiny deterministic generator (xorshift64), one per client.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Creates, mounts, unmounts and detaches loop devices at `per_second` until `stop`; returns
/// (cycles, failed cycles, the first errors).
fn churn(s: &Scratch, per_second: u32, stop: &AtomicBool) -> (u64, u64, Vec<String>) {
    let (mut cycles, mut failures, mut errors) = (0u64, 0u64, Vec::new());
    if per_second == 0 {
        return (0, 0, errors);
    }
    let lanes: Vec<(PathBuf, PathBuf)> =
        (0..4).map(|i| (s.ext4_image(&format!("churn{i}.img"), 8), s.mkdir(&format!("churn{i}")))).collect();
    let period = Duration::from_secs(1) / per_second;
    let start = Instant::now();
    let mut n: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        let (img, dir) = &lanes[n as usize % lanes.len()];
        // The guards undo what a failed step left (detach, lazy umount) as they drop.
        let cycle = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let lo = LoopDev::attach(img);
            let m = HostMount::new(&lo.dev, dir, &[]);
            m.umount();
            sh("losetup", &["-d", &lo.dev]);
        }));
        cycles += 1;
        if let Err(p) = cycle {
            failures += 1;
            if errors.len() < 5 {
                let why = p.downcast_ref::<String>().cloned().unwrap_or_else(|| "a command failed".into());
                errors.push(format!("churn: {why}"));
            }
        }
        n += 1;
        if let Some(wait) = (start + period * n).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    (cycles, failures, errors)
}

/// One client's calls until `deadline`.
async fn client(
    mut c: AgentClient<tonic::transport::Channel>,
    seed: u64,
    anchor: String,
    think: Duration,
    plan_every: Duration,
    deadline: tokio::time::Instant,
) -> BTreeMap<&'static str, RpcStats> {
    let mut stats: BTreeMap<&'static str, RpcStats> = BTreeMap::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed.wrapping_mul(0x2545_f491_4f6c_dd1d));
    // Spread the clients' first calls over one think time.
    tokio::time::sleep(think.mul_f64((rng.next() % 1000) as f64 / 1000.0)).await;
    let mut last_plan: Option<tokio::time::Instant> = None;
    while tokio::time::Instant::now() < deadline {
        let roll = rng.next() % 100;
        let plan_due = last_plan.is_none_or(|t| t.elapsed() >= plan_every);
        let t = Instant::now();
        let (name, result) = if roll < 10 && plan_due {
            last_plan = Some(tokio::time::Instant::now());
            let r = c.plan(pb::PlanRequest { devices: vec![anchor.clone()], ..Default::default() }).await;
            let r = match r {
                Ok(r) if r.get_ref().plans.is_empty() => Err("Plan: no plan".to_owned()),
                Ok(_) => Ok(()),
                Err(e) => Err(format!("Plan: {e}")),
            };
            ("Plan", r)
        } else if roll < 55 {
            let r = c.get_device(pb::GetDeviceRequest { device: anchor.clone() }).await;
            ("GetDevice", r.map(drop).map_err(|e| format!("GetDevice: {e}")))
        } else {
            let r = match c.list_devices(pb::ListDevicesRequest::default()).await {
                Ok(r) if r.get_ref().devices.iter().any(|d| d.name == anchor) => Ok(()),
                Ok(_) => Err(format!("ListDevices: no {anchor}")),
                Err(e) => Err(format!("ListDevices: {e}")),
            };
            ("ListDevices", r)
        };
        stats.entry(name).or_default().record(t.elapsed(), result);
        tokio::time::sleep(think).await;
    }
    stats
}

/// One WatchEvents stream until `deadline`: Ok when it stayed open that long.
async fn watcher(
    socket: PathBuf,
    events: Arc<AtomicU64>,
    deadline: tokio::time::Instant,
) -> Result<(), String> {
    let mut c = unix_client(&socket).await;
    let mut stream = c
        .watch_events(pb::WatchEventsRequest {})
        .await
        .map_err(|e| format!("WatchEvents: {e}"))?
        .into_inner();
    loop {
        match tokio::time::timeout_at(deadline, stream.next()).await {
            Err(_) => return Ok(()),
            Ok(Some(Ok(_))) => {
                events.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Some(Err(e))) => return Err(format!("WatchEvents stream: {e}")),
            Ok(None) => return Err("WatchEvents stream ended early".into()),
        }
    }
}

/// Runs the load and measures it. Panics (cleaning up) when the set-up itself fails.
pub fn run(cfg: &LoadConfig) -> LoadReport {
    let s = match &cfg.dir {
        Some(d) => {
            Scratch { dir: tempfile::Builder::new().prefix("bj-load-").tempdir_in(d).expect("tempdir") }
        }
        None => Scratch::new(),
    };
    let anchor_img = s.path("anchor.img");
    std::fs::File::create(&anchor_img).expect("create").set_len(8 << 20).expect("size");
    let anchor = LoopDev::attach(&anchor_img);
    let anchor_name = anchor.name().to_owned();
    let pki = Pki::new("blockjanitor load CA");
    let tls = pki.write_server(s.dir.path());
    let names: Vec<String> = (0..cfg.clients).map(|i| format!("load-client-{i:03}")).collect();
    let idents: Vec<_> = names.iter().map(|n| pki.issue(n, &[n])).collect();
    let viewers: Vec<&str> = names.iter().flat_map(|n| ["--tls-viewer", n.as_str()]).collect();
    let run_dir = s.mkdir("run");
    let daemon = Daemon::start_tls(&run_dir, &[], "127.0.0.1:0", &tls, &viewers);
    let pid = daemon.child.id();
    let addr = daemon.tcp.expect("tcp address logged");
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");

    // The anchor is in the agent's view before the clients start.
    rt.block_on(async {
        let mut c = unix_client(&daemon.socket).await;
        for _ in 0..500 {
            let list =
                c.list_devices(pb::ListDevicesRequest::default()).await.expect("ListDevices").into_inner();
            if list.devices.iter().any(|d| d.name == anchor_name) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the agent never listed {anchor_name}");
    });
    std::thread::sleep(Duration::from_secs(1));
    let idle = least_fds(pid, 5);

    let stop = Arc::new(AtomicBool::new(false));
    let churn_dir =
        Scratch { dir: tempfile::Builder::new().prefix("churn-").tempdir_in(s.dir.path()).expect("tempdir") };
    let churn_thread = {
        let stop = Arc::clone(&stop);
        let per_second = cfg.churn_per_second;
        std::thread::spawn(move || churn(&churn_dir, per_second, &stop))
    };

    let events = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // A quarter of the run: by then the connections and the blocking pool have their working size
    // (the RSS trend of a 120 s run levels off between 24 and 36 s; BENCHMARKS.md).
    let warm_at = cfg.duration / 4;
    let cfg_duration = cfg.duration;
    let (rpcs, watch, warm, end, rss_trend) = rt.block_on(async {
        let deadline = tokio::time::Instant::now() + cfg.duration;
        let mut watchers = tokio::task::JoinSet::new();
        for _ in 0..cfg.watchers {
            watchers.spawn(watcher(daemon.socket.clone(), Arc::clone(&events), deadline));
        }
        let mut clients = tokio::task::JoinSet::new();
        for (i, ident) in idents.iter().enumerate() {
            let (ca, cert, key) = (pki.ca.cert.clone(), ident.cert.clone(), ident.key.clone());
            let anchor = anchor_name.clone();
            let (think, plan_every) = (cfg.think, cfg.plan_every);
            clients.spawn(async move {
                match tls_channel(addr, &ca, Some((&cert, &key))).await {
                    Ok(ch) => {
                        client(AgentClient::new(ch), i as u64 + 1, anchor, think, plan_every, deadline).await
                    }
                    Err(e) => {
                        let mut stats = BTreeMap::new();
                        let mut connect = RpcStats::default();
                        connect.record(Duration::ZERO, Err(format!("connect: {e}")));
                        stats.insert("connect", connect);
                        stats
                    }
                }
            });
        }
        let sampler = tokio::spawn(async move {
            let mut trend = Vec::new();
            let step = cfg_duration / 10;
            for i in 1..10u32 {
                tokio::time::sleep_until(deadline - cfg_duration + step * i).await;
                trend.push((u64::from(i) * step.as_secs(), Usage::of(pid).rss_kib));
            }
            trend
        });
        tokio::time::sleep(warm_at).await;
        let warm = Usage::of(pid);
        tokio::time::sleep_until(deadline - Duration::from_secs(1).min(cfg.duration / 10)).await;
        let end = Usage::of(pid);
        let mut rpcs: BTreeMap<&'static str, RpcStats> = BTreeMap::new();
        while let Some(r) = clients.join_next().await {
            for (k, v) in r.expect("client task") {
                rpcs.entry(k).or_default().merge(v);
            }
        }
        let mut watch = Vec::new();
        while let Some(r) = watchers.join_next().await {
            watch.push(r.expect("watcher task"));
        }
        (rpcs, watch, warm, end, sampler.await.unwrap_or_default())
    });
    let elapsed = start.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (churn_cycles, churn_failures, churn_errors) = churn_thread.join().expect("churn thread");
    drop(rt);

    // The clients are gone: the agent's fds should come back to the idle count.
    let settle = Instant::now();
    let mut after = least_fds(pid, 3);
    while after.fds > idle.fds && settle.elapsed() < Duration::from_secs(10) {
        after = least_fds(pid, 3);
    }
    let watch_errors: Vec<String> = watch.iter().filter_map(|r| r.clone().err()).take(5).collect();
    let report = LoadReport {
        config_line: format!(
            "{} s, {} TLS clients (own viewer certificate each; think {} ms; Plan at most every {} ms), \
             {} WatchEvents streams on the unix socket, loop churn {}/s",
            cfg.duration.as_secs(),
            cfg.clients,
            cfg.think.as_millis(),
            cfg.plan_every.as_millis(),
            cfg.watchers,
            cfg.churn_per_second
        ),
        rpcs,
        watch_streams: watch.len(),
        watch_failures: watch.iter().filter(|r| r.is_err()).count() as u64,
        watch_errors,
        events: events.load(Ordering::Relaxed),
        churn_cycles,
        churn_failures,
        churn_errors,
        elapsed,
        idle,
        warm,
        end,
        after,
        rss_trend,
    };
    drop(daemon);
    drop(anchor);
    report
}

/// The sample with the fewest fds of `n` taken 100 ms apart (a scan holds a few for a moment).
fn least_fds(pid: u32, n: usize) -> Usage {
    (0..n)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            Usage::of(pid)
        })
        .min_by_key(|u| u.fds)
        .unwrap_or_default()
}
