//! What the console's benches share (`benches/console_fleet.rs`, `benches/console_cluster.rs`):
//! counts from the environment, the machine's load, a Fleet client with a caller's certificate,
//! and waiting until every replica has synced every answering agent.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use tonic::transport::Channel;

use crate::daemon::{tls_channel, Pki};

/// A count from the environment (`default` when unset); a value that is not a number stops the
/// bench, naming it.
pub fn env_usize(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v}: expected a number")),
        Err(_) => default,
    }
}

/// `/proc/loadavg`'s three averages and the CPU pressure (`some avg10`).
pub fn load() -> String {
    let la = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let la: Vec<&str> = la.split_whitespace().take(3).collect();
    let psi = std::fs::read_to_string("/proc/pressure/cpu").unwrap_or_default();
    let some = psi.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or("avg10=?");
    format!("load {} (CPU pressure {some} %)", la.join(" "))
}

/// A Fleet client of the console at `addr`, as caller `who` (a certificate the PKI issues now).
pub async fn client_as(addr: SocketAddr, pki: &Pki, who: &str) -> FleetClient<Channel> {
    let pem = pki.issue(who, &[who]);
    let ch = tls_channel(addr, &pki.ca.cert, Some((&pem.cert, &pem.key))).await.expect("connect");
    FleetClient::new(ch).max_decoding_message_size(64 << 20)
}

/// Waits until every console lists at least `answering` agents reachable; for each, the time
/// since `started` (polled every 200 ms: a `ListNodes` of 5,000 nodes is not free). Stops the
/// bench after `limit`.
pub async fn converge(
    clients: &mut [FleetClient<Channel>],
    answering: usize,
    started: Instant,
    limit: Duration,
) -> Vec<Duration> {
    let mut done: Vec<Option<Duration>> = vec![None; clients.len()];
    loop {
        for (c, d) in clients.iter_mut().zip(done.iter_mut()).filter(|(_, d)| d.is_none()) {
            let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
            let up = n.nodes.iter().filter(|x| x.reachable).count();
            if up >= answering {
                *d = Some(started.elapsed());
            }
            assert!(started.elapsed() < limit, "no convergence within {limit:?}: {up} of {answering} up");
        }
        if done.iter().all(Option::is_some) {
            return done.into_iter().flatten().collect();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
