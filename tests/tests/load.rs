//! A short, bounded run of the load test (issue 13; the full one is `bench/load-bench.sh`, its
//! figures in BENCHMARKS.md): TLS clients mixing ListDevices, GetDevice and Plan, open
//! WatchEvents streams and loop devices churned through the real kernel, against the real
//! agent. Asserts counts only: no failed call or stream, calls of every kind made, every client
//! connected, the churn done, and the agent's fd count back to its idle count once the clients
//! are gone.

use std::time::Duration;

use blockjanitor_tests::load::{run, LoadConfig};
use blockjanitor_tests::*;

#[test]
fn root_load_short_no_failed_call_and_no_fd_leak() {
    if !require_real_kernel(&["losetup", "mkfs.ext4", "mount", "umount"]) {
        return;
    }
    // It mounts on the host: other tests' new mount namespaces would copy those mounts.
    let _serial = serial();
    let r = run(&LoadConfig {
        duration: Duration::from_secs(20),
        clients: 40,
        watchers: 20,
        churn_per_second: 5,
        think: Duration::from_millis(50),
        plan_every: Duration::from_secs(2),
        dir: None,
    });
    let report = r.markdown();
    eprintln!("{report}");
    assert_eq!(r.failures(), 0, "failed calls or streams:\n{report}");
    for rpc in ["ListDevices", "GetDevice", "Plan"] {
        assert!(r.rpcs.get(rpc).is_some_and(|s| s.calls > 0), "no {rpc} call made:\n{report}");
    }
    assert!(!r.rpcs.contains_key("connect"), "a client could not connect:\n{report}");
    assert_eq!(r.watch_streams, 20, "{report}");
    assert!(r.churn_cycles >= 20 && r.churn_failures == 0, "loop churn:\n{report}");
    // Events are reported, not asserted: a churned device lives for milliseconds, and whether a
    // scan lands inside that window depends on how busy the host is (on a node with thousands of
    // mounts a scan takes seconds). A stream that failed or ended early is asserted above.
    assert!(
        r.after.fds <= r.idle.fds,
        "fd leak: idle {} fds, {} after the clients left:\n{report}",
        r.idle.fds,
        r.after.fds
    );
}
