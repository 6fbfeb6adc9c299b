//! Two console replicas and the apply Lease while an Apply runs (issue 36): the holder, frozen
//! with SIGSTOP in the middle of a node's step (a stand-in for a replica cut off from the API
//! server, or killed: it sends nothing more either way), loses the Lease; the other replica
//! takes it over and carries on, but sends no step to the node whose step may still run (the
//! Lease names it); the old holder, thawed, finds the Lease gone before its next node's step and
//! stops. Four stepping stand-in agents (`tests/src/stepping_agent.rs`) record every step with
//! the replica that sent it: no node receives a step from both replicas. And an Apply asked of
//! the replica that does not hold the Lease (the plugin reaches whichever pod is first by name)
//! is carried out by the holder, to which it forwards it.
//!
//! Needs the binaries: `cargo build --workspace --bins`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{Console, ConsoleFiles};
use blockjanitor_tests::daemon::{tls_channel, Pki};
use blockjanitor_tests::lease_mock::LeaseServer;
use blockjanitor_tests::standin_fleet::{self as fleet, StandIn};
use blockjanitor_tests::stepping_agent::{identity_of, StepLog, StepSeen, SteppingAgent};

const KEY: &str = "blockjanitor/blockjanitor-console-apply";
/// Nodes 0-3 for the Apply cut off, node 4 for the forwarded one.
const NODES: usize = 5;
const STEP: Duration = Duration::from_millis(1500);

fn node(i: usize) -> String {
    format!("node-{i:04}")
}

/// The operator's certificate and the CA: who asks for the Applies.
struct Operator {
    ca: String,
    cert: String,
    key: String,
}

/// An Apply with `execute` of `rbd0` on `nodes`, as the operator `admin`, through `addr`.
async fn apply(
    addr: std::net::SocketAddr,
    op: &Operator,
    nodes: &[String],
) -> Result<pb::FleetApplyResponse, tonic::Status> {
    let ch = tls_channel(addr, &op.ca, Some((&op.cert, &op.key))).await.expect("connect");
    let targets = nodes
        .iter()
        .map(|n| pb::FleetApplyTarget {
            node: n.clone(),
            devices: vec!["rbd0".into()],
            identities: vec![identity_of("rbd0")],
        })
        .collect();
    let req = pb::FleetApplyRequest { targets, execute: true, ..Default::default() };
    FleetClient::new(ch).apply(req).await.map(tonic::Response::into_inner)
}

/// Waits until the replica at `addr` has every node synced.
async fn wait_synced(addr: std::net::SocketAddr, pki: &Pki) {
    let who = pki.issue("viewer", &["viewer"]);
    let ch = tls_channel(addr, &pki.ca.cert, Some((&who.cert, &who.key))).await.expect("connect");
    let mut c = FleetClient::new(ch);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        if n.nodes.iter().filter(|x| x.reachable).count() == NODES {
            return;
        }
        assert!(Instant::now() < deadline, "the replica at {addr} did not sync every node: {n:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn steps(log: &StepLog) -> Vec<StepSeen> {
    log.lock().expect("step log").clone()
}

fn wait_until(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done() {
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn signal(c: &Console, sig: libc::c_int) {
    // SAFETY: kill(2) on the pid of a child this test started and has not reaped.
    let rc = unsafe { libc::kill(c.pid as libc::pid_t, sig) };
    assert_eq!(rc, 0, "signal {sig} to the console {}", c.pid);
}

#[test]
fn a_holder_cut_off_mid_apply_stops_and_no_node_gets_a_step_from_both_replicas() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("apply lease CA");
    let files = ConsoleFiles::write(&pki, dir.path());
    let rt = blockjanitor_tests::rt();
    let log: StepLog = Arc::new(Mutex::new(Vec::new()));
    let tls = fleet::server_tls(&pki);
    let agents: Vec<String> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..NODES {
            let inner = StandIn::new(node(i), fleet::devices_for(i), Duration::ZERO);
            let svc = SteppingAgent { inner, step_time: STEP, log: Arc::clone(&log) };
            v.push(format!("{}={}", node(i), fleet::serve(&tls, svc).await));
        }
        v
    });
    let api = rt.block_on(LeaseServer::start());
    let ports: Vec<u16> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port())
        .collect();
    let replicas: Vec<Console> = (0..2)
        .map(|i| {
            let mut args = files.args("viewer");
            let me = format!("127.0.0.1:{}", ports[i]);
            args.extend(["--listen".to_owned(), me.clone(), "--advertise-address".to_owned(), me]);
            args.extend(["--peer-console", "console", "--peer-server-name", "localhost"].map(String::from));
            args.extend(["--operator", "admin", "--kube-url", &api.url(), "--apply-lease"].map(String::from));
            args.extend(
                ["blockjanitor-console-apply", "--lease-namespace", "blockjanitor"].map(String::from),
            );
            args.extend(["--lease-seconds", "3", "--apply-timeout-seconds", "10"].map(String::from));
            args.extend(["--lease-identity".to_owned(), format!("replica-{i}")]);
            args.extend(["--agents".to_owned(), agents.join(",")]);
            Console::start_configured(&args, None, |c| {
                c.env("RUST_LOG", "warn,blockjanitor_console=info");
            })
        })
        .collect();
    let mut holder = None;
    wait_until("a replica takes the Lease", 30, || {
        holder = api.holder(KEY);
        holder.is_some()
    });
    let holder = holder.expect("holder");
    let h: usize = holder.strip_prefix("replica-").and_then(|i| i.parse().ok()).expect("a replica's name");
    let other = 1 - h;
    let survivor = format!("replica-{other}");
    rt.block_on(async {
        for r in &replicas {
            wait_synced(r.tcp, &pki).await;
        }
    });
    let all: Vec<String> = (0..4).map(node).collect();
    let admin = pki.issue("admin", &["admin"]);
    let op = Arc::new(Operator { ca: pki.ca.cert.clone(), cert: admin.cert, key: admin.key });

    // Asked of the replica that does not hold the Lease, an Apply is carried out by the holder.
    // (A replica that lost the race to create the Lease cannot tell who holds it until its next
    // read, a fraction of a second later: it refuses, nothing ran, and the caller asks again.)
    let deadline = Instant::now() + Duration::from_secs(10);
    let forwarded = loop {
        match rt.block_on(apply(replicas[other].tcp, &op, &[node(4)])) {
            Err(e) if e.message().contains("cannot tell who holds") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(200));
            }
            r => break r.expect("forwarded to the holder"),
        }
    };
    assert_eq!(forwarded.results.len(), 1, "{forwarded:?}");
    assert_eq!(
        steps(&log).iter().map(|s| (s.node.as_str(), s.replica.as_str())).collect::<Vec<_>>(),
        [(node(4).as_str(), holder.as_str())],
        "the holder sent node 4 its step"
    );

    // The holder applies on nodes 0-3, one after the other; frozen during node 1's step.
    let first = rt.spawn({
        let (addr, all, op) = (replicas[h].tcp, all.clone(), Arc::clone(&op));
        async move { apply(addr, &op, &all).await }
    });
    wait_until("the holder's step on node-0001 starts", 30, || steps(&log).iter().any(|s| s.node == node(1)));
    signal(&replicas[h], libc::SIGSTOP);
    let frozen_at = Instant::now();
    wait_until("the other replica takes the Lease over", 30, || {
        api.holder(KEY).as_deref() == Some(&survivor)
    });

    // The new holder refuses node 1 (the old holder's step there may still run)...
    let refused = rt.block_on(apply(replicas[other].tcp, &op, &[node(1)])).expect_err("node-0001 is locked");
    assert!(refused.message().contains("may still run"), "the refusal says why: {refused:?}");
    // ...and carries on with the nodes the old holder never reached.
    let done =
        rt.block_on(apply(replicas[other].tcp, &op, &[node(2), node(3)])).expect("the survivor applies");
    assert_eq!(done.results.len(), 2, "{done:?}");

    // The old holder, thawed, finds the Lease gone before its next node's step and stops.
    signal(&replicas[h], libc::SIGCONT);
    let thawed_at = Instant::now();
    let first = rt.block_on(async { tokio::time::timeout(Duration::from_secs(30), first).await });
    let first = first.expect("the old holder's Apply ends").expect("task");
    let stopped = first.expect_err("the old holder's Apply stops");
    assert_eq!(stopped.code(), tonic::Code::Unavailable, "{stopped:?}");
    std::thread::sleep(Duration::from_secs(2));

    let seen = steps(&log);
    eprintln!("steps: {:#?}", seen.iter().map(|s| (&s.node, &s.replica)).collect::<Vec<_>>());
    for n in (0..NODES).map(node) {
        let by: BTreeSet<&str> = seen.iter().filter(|s| s.node == n).map(|s| s.replica.as_str()).collect();
        assert!(by.len() <= 1, "{n} received steps from both replicas: {seen:#?}");
    }
    let by_node = |n: usize| -> Vec<&str> {
        seen.iter().filter(|s| s.node == node(n)).map(|s| s.replica.as_str()).collect()
    };
    assert_eq!(by_node(0), [holder.as_str()], "{seen:#?}");
    assert_eq!(by_node(1), [holder.as_str()], "node-0001: only the old holder's step: {seen:#?}");
    assert_eq!(by_node(2), [survivor.as_str()], "{seen:#?}");
    assert_eq!(by_node(3), [survivor.as_str()], "{seen:#?}");
    assert!(
        seen.iter().filter(|s| s.replica == holder).all(|s| s.started < frozen_at),
        "the old holder sent nothing after it was frozen: {seen:#?} (thawed {:?} after)",
        thawed_at.elapsed()
    );
    drop(replicas);
}
