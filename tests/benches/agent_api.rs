//! Benchmarks of the daemon's API (issue 3), printed as Markdown for BENCHMARKS.md:
//!
//! - `ListDevices` latency over the unix socket with 1,000 devices (a generated fixture tree in
//!   the kernel's layout): p50/p90/p99/max of 2,000 sequential calls after 200 warm-up calls;
//! - the daemon's idle CPU over 60 s on this host (after its start-up scan) and its RSS.
//!
//! Run: `cargo build --release --bins && cargo bench -p blockjanitor-tests --bench agent_api`
//! (root; `BENCH_IDLE_SECONDS` shortens the idle measurement).

use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::measure::{cpu_ticks, percentile, status_kib};

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    let rt = blockjanitor_tests::rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("host");
    blockjanitor_tests::fixture::many_devices(&root, 1000);
    let run = dir.path().join("run");
    std::fs::create_dir_all(&run).expect("mkdir");
    let d = Daemon::start_with_global(&run, &["--root", root.to_str().expect("utf8")], &[]);
    let (lat, n_devices) = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        for _ in 0..200 {
            c.list_devices(pb::ListDevicesRequest::default()).await.expect("warm-up");
        }
        let mut lat = Vec::with_capacity(2000);
        let mut n = 0;
        for _ in 0..2000 {
            let t = Instant::now();
            n = c
                .list_devices(pb::ListDevicesRequest::default())
                .await
                .expect("list")
                .into_inner()
                .devices
                .len();
            lat.push(t.elapsed());
        }
        (lat, n)
    });
    let mut sorted = lat.clone();
    sorted.sort();
    let rss_fixture = status_kib(d.child.id(), "VmHWM:");
    drop(d);

    let idle_secs: u64 = std::env::var("BENCH_IDLE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let host_run = dir.path().join("host-run");
    std::fs::create_dir_all(&host_run).expect("mkdir");
    let d = Daemon::start(&host_run, &[]);
    std::thread::sleep(Duration::from_secs(3));
    let pid = d.child.id();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let (t0, c0) = (Instant::now(), cpu_ticks(pid));
    std::thread::sleep(Duration::from_secs(idle_secs));
    let (t1, c1) = (Instant::now(), cpu_ticks(pid));
    let cpu_pct = (c1 - c0) as f64 / hz / (t1 - t0).as_secs_f64() * 100.0;
    let (rss, hwm) = (status_kib(pid, "VmRSS:"), status_kib(pid, "VmHWM:"));

    println!("### Agent API (`cargo bench -p blockjanitor-tests --bench agent_api`)\n");
    println!("- ListDevices over the unix socket, {n_devices} devices (generated fixture tree), 2000 sequential calls after 200 warm-up:");
    println!(
        "  p50 {}, p90 {}, p99 {}, max {} (daemon peak RSS on the fixture {:.1} MiB)",
        ms(percentile(&sorted, 0.50)),
        ms(percentile(&sorted, 0.90)),
        ms(percentile(&sorted, 0.99)),
        ms(*sorted.last().expect("samples")),
        rss_fixture as f64 / 1024.0
    );
    println!(
        "- Idle daemon on this host over {idle_secs} s: {:.3}% of one core ({} ticks at {hz} Hz); RSS {:.1} MiB, peak {:.1} MiB",
        cpu_pct,
        c1 - c0,
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
}
