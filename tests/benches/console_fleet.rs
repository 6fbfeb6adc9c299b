//! Benchmark of the fleet console (issues 11 and 18), printed as Markdown for BENCHMARKS.md.
//!
//! A fleet of `BENCH_AGENTS` (default 5,000) agents on loopback, every one a real gRPC server
//! speaking `blockjanitor.v1.Agent` over mutual TLS: 3 real `blockjanitor-agent serve` processes
//! on fixture roots (incident 1's old and new node, incident 3's multipath node) and light
//! in-process stand-ins (`blockjanitor_tests::standin_fleet`, 20 generated devices each), all served by
//! this process on distinct loopback ports. 5 % of the addresses refuse connections (nothing
//! listens) and 5 % of the stand-ins answer every call after 5 s, past the console's 1 s deadline.
//! `BENCH_REPLICAS` (default 2) real `blockjanitor-console` processes follow the whole fleet
//! (static `--agents` list), started at the same moment.
//!
//! Measured, all in one run: index convergence after a cold start (every answering agent synced,
//! on every replica), `Where` and `WhoWatches` latency from the index (`BENCH_QUERIES` calls each,
//! default 2,000), the sweep (a hook until the sweep RPC is merged), forced fan-out (`Where` with
//! `fresh`, `BENCH_FANOUT` calls, default 30), each console's RSS, index memory per device (an
//! index filled in this process with the same devices: RSS delta / devices; and each console's
//! RSS delta from listening to converged, per device), and with 2+ replicas: 4 callers
//! round-robin over the replicas (the Service's stand-in) while one replica is killed (SIGKILL)
//! mid-run. The machine's load average is printed with the figures.
//!
//! Run: `cargo build --release --bins && cargo bench -p blockjanitor-tests --bench console_fleet`
//! (`BENCH_AGENTS=500 BENCH_REPLICAS=1` gives issue 11's scene; `BENCH_CONSOLE_LOG=1` prints the
//! consoles' logs).

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockjanitor_console::index::Index;
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{fleet_agents, Console, ConsoleFiles};
use blockjanitor_tests::daemon::Pki;
use blockjanitor_tests::failover::{run_with_kill, Replicas, IN_FLIGHT_GRACE};
use blockjanitor_tests::fleet_bench::{client_as, converge, env_usize, load};
use blockjanitor_tests::measure::{ms, percentile, status_kib};
use blockjanitor_tests::standin_fleet::{self as fleet, StandIn};
use tonic::transport::Channel;

const REAL: usize = 3;

/// RSS of this process grown by filling an index with `agents` stand-ins' devices, per device
/// (bytes).
fn index_bytes_per_device(agents: usize) -> (f64, usize) {
    let me = std::process::id();
    let before = status_kib(me, "VmRSS:");
    let index = Index::new();
    for i in 0..agents {
        let node = format!("node-{i:04}");
        let mut w = index.write();
        w.upsert_node(&node, "127.0.0.1:1", "static", None);
        w.replace_devices(&node, fleet::devices_for(i));
    }
    let devices = index.read().device_count();
    let after = status_kib(me, "VmRSS:");
    drop(index);
    ((after.saturating_sub(before) * 1024) as f64 / devices.max(1) as f64, devices)
}

fn who_text(i: usize) -> String {
    format!(
        "Watchers:\n\twatcher={} client.{} cookie=18446462598732840961\n",
        fleet::client_addr(i),
        100_000 + i
    )
}

/// The fleet-wide sweep from the index (every kind), `calls` times: the sorted latencies, and
/// the last answer's finding count and size.
async fn sweep(c: &mut FleetClient<Channel>, calls: usize) -> Option<(Vec<Duration>, usize, usize)> {
    let mut lat = Vec::with_capacity(calls);
    let mut last = (0, 0);
    for _ in 0..calls {
        let t = Instant::now();
        let r = c.sweep(pb::SweepRequest::default()).await.expect("Sweep").into_inner();
        lat.push(t.elapsed());
        last = (r.findings.len(), prost::Message::encoded_len(&r));
    }
    lat.sort();
    Some((lat, last.0, last.1))
}

fn main() {
    let agents = env_usize("BENCH_AGENTS", 5000);
    let replicas = env_usize("BENCH_REPLICAS", 2).max(1);
    let queries = env_usize("BENCH_QUERIES", 2000).max(1);
    let fanouts = env_usize("BENCH_FANOUT", 30).max(1);
    let (refusing, slow) = (agents / 20, agents / 20);
    assert!(agents > REAL + refusing + slow, "BENCH_AGENTS={agents}: too few");
    let answering = agents - refusing - slow;
    let load_before = load();
    let (index_per_device, index_devices) = index_bytes_per_device(agents);

    fleet::raise_nofile_for(agents, replicas, 2048);
    let rt = blockjanitor_tests::rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("bench CA");
    let files = ConsoleFiles::write(&pki, dir.path());

    // Real agents.
    let (reals, mut entries) =
        fleet_agents(dir.path(), &files, &["incident1", "incident1-newnode", "multipath-incident3"]);

    // Stand-ins, slow ones, refusing addresses.
    let tls = fleet::server_tls(&pki);
    let addrs = rt.block_on(async {
        let mut out = Vec::new();
        for i in REAL..agents {
            let addr = if i >= agents - refusing {
                fleet::refusing().await
            } else {
                let slow = i >= agents - refusing - slow;
                let delay = if slow { Duration::from_secs(5) } else { Duration::ZERO };
                let svc = StandIn::new(format!("node-{i:04}"), fleet::devices_for(i), delay);
                fleet::serve(&tls, svc).await
            };
            out.push(format!("node-{i:04}={addr}"));
        }
        out
    });
    entries.extend(addrs);
    let mut args = files.args("bench");
    args.extend(
        [
            "--call-timeout-ms",
            "1000",
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "5",
            // The bench drives BENCH_FANOUT fresh fan-outs from one caller: no per-person limit.
            "--fresh-per-minute-per-caller",
            "0",
        ]
        .map(String::from),
    );
    args.extend(["--agents".to_owned(), entries.join(",")]);

    let echo = std::env::var_os("BENCH_CONSOLE_LOG").is_some();
    let started = Instant::now();
    let mut consoles: Vec<Console> = (0..replicas)
        .map(|_| {
            Console::start_configured(&args, echo.then_some("console"), |c| {
                c.env("RUST_LOG", "warn,blockjanitor_console=info");
            })
        })
        .collect();
    let rss_listening: Vec<u64> = consoles.iter().map(|c| status_kib(c.pid, "VmRSS:")).collect();
    let addrs: Vec<_> = consoles.iter().map(|c| c.tcp).collect();
    let pids: Vec<u32> = consoles.iter().map(|c| c.pid).collect();

    rt.block_on(async {
        let mut clients = Vec::new();
        for a in &addrs {
            clients.push(client_as(*a, &pki, "bench").await);
        }
        let converged = converge(&mut clients, answering, started, Duration::from_secs(300)).await;
        let rss_converged: Vec<u64> = pids.iter().map(|p| status_kib(*p, "VmRSS:")).collect();
        let c = &mut clients[0];
        let nodes = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let devices: u32 = nodes.nodes.iter().map(|n| n.devices).sum();
        let missing = nodes.missing_nodes.len();

        let mut where_lat = Vec::new();
        for k in 0..queries {
            let i = REAL + k % (answering - REAL);
            let req = pb::WhereRequest { image: format!("k8s/csi-vol-{i:04}-{}", k % 5), ..Default::default() };
            let t = Instant::now();
            let r = c.r#where(req).await.expect("Where").into_inner();
            where_lat.push(t.elapsed());
            assert_eq!(r.matches.len(), 1, "{r:?}");
        }
        let mut who_lat = Vec::new();
        for k in 0..queries {
            let i = REAL + k % (answering - REAL);
            let req = pb::WhoWatchesRequest { text: who_text(i), ..Default::default() };
            let t = Instant::now();
            let r = c.who_watches(req).await.expect("WhoWatches").into_inner();
            who_lat.push(t.elapsed());
            assert_eq!(r.watchers[0].mappings.len(), 5, "{r:?}");
        }
        let sweeps = sweep(c, (queries / 100).max(5)).await;
        let mut fan = Vec::new();
        for k in 0..fanouts {
            let i = REAL + k % (answering - REAL);
            let req = pb::WhereRequest { image: format!("k8s/csi-vol-{i:04}-0"), fresh: true, ..Default::default() };
            let t = Instant::now();
            let r = c.r#where(req).await.expect("Where fresh").into_inner();
            fan.push(t.elapsed());
            assert_eq!(r.matches.len(), 1);
        }
        let rss: Vec<u64> = pids.iter().map(|p| status_kib(*p, "VmRSS:")).collect();
        let hwm: Vec<u64> = pids.iter().map(|p| status_kib(*p, "VmHWM:")).collect();
        let load_after = load();

        let failover = if replicas >= 2 {
            let bench = pki.issue("bench", &["bench"]);
            let rr = Arc::new(Replicas::connect(&addrs, &pki.ca.cert, &bench).await);
            let mut victim = consoles.pop().expect("a replica");
            let span = answering - REAL;
            Some(
                run_with_kill(
                    rr,
                    4,
                    Duration::from_secs(6),
                    Duration::from_secs(2),
                    move || victim.kill(),
                    move |k| pb::WhereRequest {
                        image: format!("k8s/csi-vol-{:04}-{}", REAL + k % span, k % 5),
                        ..Default::default()
                    },
                    |r| r.matches.len() == 1,
                )
                .await,
            )
        } else {
            None
        };

        where_lat.sort();
        who_lat.sort();
        fan.sort();
        let mib = |k: u64| format!("{:.1}", k as f64 / 1024.0);
        let secs = |v: &[Duration]| v.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect::<Vec<_>>().join(" / ");
        let per_device: Vec<String> = rss_converged
            .iter()
            .zip(&rss_listening)
            .map(|(c, l)| format!("{:.0} B", (c.saturating_sub(*l) * 1024) as f64 / f64::from(devices.max(1))))
            .collect();
        println!("Load before: {load_before}; after the timed queries: {load_after}.\n");
        println!("| figure | measured | target |");
        println!("|---|---|---|");
        println!("| agents (answering / slow / refusing) | {agents} ({answering} / {slow} / {refusing}), {REAL} of them real; {replicas} console replica(s) | |");
        println!("| index after convergence | {} nodes, {devices} devices, {missing} missing | |", nodes.nodes.len());
        println!("| index convergence after cold start, per replica | {} | ≤ 30 s |", secs(&converged));
        println!("| `Where` from the index, p50 / p99 ({queries} calls) | {} / {} | p99 ≤ 50 ms |", ms(percentile(&where_lat, 0.5)), ms(percentile(&where_lat, 0.99)));
        println!("| `WhoWatches` from the index, p50 / p99 ({queries} calls) | {} / {} | p99 ≤ 50 ms |", ms(percentile(&who_lat, 0.5)), ms(percentile(&who_lat, 0.99)));
        if let Some((s, findings, bytes)) = sweeps {
            println!("| sweep from the index, every kind, p50 / p99 ({} calls; {findings} findings, {} KiB an answer) | {} / {} | p99 ≤ 2 s |", s.len(), bytes / 1024, ms(percentile(&s, 0.5)), ms(percentile(&s, 0.99)));
        }
        println!("| forced fan-out (`Where` fresh), p50 / p99 / max ({fanouts} calls) | {} / {} / {} | p99 ≤ 5 s |", ms(percentile(&fan, 0.5)), ms(percentile(&fan, 0.99)), ms(fan[fan.len() - 1]));
        let rss_rows: Vec<String> = (0..replicas)
            .map(|r| format!("#{r}: {} → {} → {} ({})", mib(rss_listening[r]), mib(rss_converged[r]), mib(rss[r]), mib(hwm[r])))
            .collect();
        println!("| console RSS per replica, MiB: listening → converged → after the queries (peak) | {} | ≤ 1 GiB |", rss_rows.join("; "));
        println!("| console RSS growth listening → converged, per device, per replica (links + index) | {} | |", per_device.join(" / "));
        println!("| index memory per device (an index of the same {index_devices} devices filled in the bench process: RSS delta / devices) | {index_per_device:.0} B | |");
        if let Some(f) = failover {
            println!("| replica killed mid-run (SIGKILL at 2 s of 6 s, 4 callers round-robin over {replicas}): questions / failed attempts (in flight: started ≤ {} ms after the kill) / failed later / unanswered / wrong | {} / {} / {} / {} / {} | failed later = 0, unanswered = 0 |",
                IN_FLIGHT_GRACE.as_millis(), f.asked, f.failed_attempts, f.failed_after_grace, f.unanswered, f.wrong);
            println!("| after the kill: first answer / slowest question started after it (retries included) | {} / {} | ≤ 1 s |",
                f.first_answer_after_kill.map_or("none".into(), ms), ms(f.worst_after_kill));
        }
    });
    drop(consoles);
    drop(reals);
}
