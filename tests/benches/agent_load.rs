//! The load benchmark of issue 13, printed as Markdown for BENCHMARKS.md: 200 TLS clients
//! mixing ListDevices, GetDevice and Plan and 100 open WatchEvents streams for 120 s while loop
//! devices are created, mounted, unmounted and detached 5 times a second (see
//! `blockjanitor_tests::load`), then each of the bounds with pass or fail.
//!
//! Run as root with `bench/load-bench.sh` (it builds the release agent first); `LOAD_SECONDS`,
//! `LOAD_CLIENTS`, `LOAD_WATCHERS`, `LOAD_CHURN_PER_SECOND`, `LOAD_THINK_MS`,
//! `LOAD_PLAN_EVERY_MS` and `LOAD_DIR` change the run. Exits 1 when a bound is missed.

use std::time::Duration;

use blockjanitor_tests::load::{run, LoadConfig};

fn main() {
    let defaults = LoadConfig {
        duration: Duration::from_secs(120),
        clients: 200,
        watchers: 100,
        churn_per_second: 5,
        think: Duration::from_millis(100),
        plan_every: Duration::from_secs(5),
        dir: None,
    };
    let cfg = match defaults.from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent_load: {e}");
            std::process::exit(2);
        }
    };
    if !nix::unistd::geteuid().is_root() {
        eprintln!("agent_load: needs root (loop devices, mounts)");
        std::process::exit(2);
    }
    let r = run(&cfg);
    println!("### Load (`bench/load-bench.sh`)\n");
    print!("{}", r.markdown());
    let list_p99 = r.rpcs.get("ListDevices").map(|s| s.quantile(0.99)).unwrap_or_default();
    let bounds = [
        ("no failed call", format!("{} failed", r.failures()), r.failures() == 0),
        (
            "ListDevices p99 at most 20 ms",
            format!("{:.2} ms", list_p99.as_secs_f64() * 1000.0),
            list_p99 <= Duration::from_millis(20),
        ),
        ("no fd leak", format!("idle {} fds, after {}", r.idle.fds, r.after.fds), r.after.fds <= r.idle.fds),
        (
            "RSS growth at most 10 %",
            format!("{:+.1} % (warm to end)", r.rss_growth_pct()),
            r.rss_growth_pct() <= 10.0,
        ),
    ];
    println!("\n| bound | measured | |\n|---|---|---|");
    for (what, got, ok) in &bounds {
        println!("| {what} | {got} | {} |", if *ok { "met" } else { "MISSED" });
    }
    if bounds.iter().any(|b| !b.2) {
        std::process::exit(1);
    }
}
