//! Two console replicas following one fleet (2 real agents and 20 stand-ins over mutual TLS on
//! loopback): each answers from its own full index; callers spread over both (round robin, the
//! Service's stand-in) lose nothing but the questions in flight when one replica is killed, and
//! the survivor goes on answering. Timing is measured in `benches/console_fleet.rs`; the bounds
//! here are generous (CI has 2 loaded cores).
//!
//! Needs the binaries: `cargo build --workspace --bins`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{fleet_agent, fleet_agents, Console, ConsoleFiles};
use blockjanitor_tests::daemon::{tls_channel, Pki};
use blockjanitor_tests::failover::{run_with_kill, Replicas};
use blockjanitor_tests::standin_fleet::{self as fleet, StandIn};

const STAND_INS: usize = 20;

/// The console's log level in these tests.
fn quiet(c: &mut std::process::Command) {
    c.env("RUST_LOG", "warn,blockjanitor_console=info");
}

/// Waits until the console at `addr` has every node synced.
async fn wait_synced(addr: std::net::SocketAddr, pki: &Pki, nodes: usize) {
    let who = pki.issue("viewer", &["viewer"]);
    let ch = tls_channel(addr, &pki.ca.cert, Some((&who.cert, &who.key))).await.expect("connect");
    let mut c = FleetClient::new(ch);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        if n.nodes.iter().filter(|x| x.reachable).count() == nodes {
            return;
        }
        assert!(Instant::now() < deadline, "the replica at {addr} did not sync every node: {n:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[test]
fn a_killed_console_replica_costs_only_the_questions_in_flight() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("ha CA");
    let files = ConsoleFiles::write(&pki, dir.path());
    let (reals, mut entries) = fleet_agents(dir.path(), &files, &["incident1", "incident1-newnode"]);
    let rt = blockjanitor_tests::rt();
    let tls = fleet::server_tls(&pki);
    rt.block_on(async {
        for i in 2..2 + STAND_INS {
            let svc = StandIn::new(format!("node-{i:04}"), fleet::devices_for(i), Duration::ZERO);
            entries.push(format!("node-{i:04}={}", fleet::serve(&tls, svc).await));
        }
    });
    let mut args = files.args("viewer");
    args.extend(["--agents".to_owned(), entries.join(",")]);
    let mut replicas: Vec<Console> = (0..2).map(|_| Console::start_configured(&args, None, quiet)).collect();
    let addrs: Vec<_> = replicas.iter().map(|r| r.tcp).collect();

    let report = rt.block_on(async {
        for a in &addrs {
            wait_synced(*a, &pki, entries.len()).await;
        }
        let who = pki.issue("viewer", &["viewer"]);
        let rr = Arc::new(Replicas::connect(&addrs, &pki.ca.cert, &who).await);
        let mut victim = replicas.pop().expect("two replicas");
        run_with_kill(
            rr,
            4,
            Duration::from_secs(4),
            Duration::from_millis(1500),
            move || victim.kill(),
            |k| pb::WhereRequest {
                image: format!("k8s/csi-vol-{:04}-{}", 2 + k % STAND_INS, k % 5),
                ..Default::default()
            },
            // Right: the one mapping, on its node, and every node answered.
            |r| r.matches.len() == 1 && r.missing_nodes.is_empty(),
        )
        .await
    });
    eprintln!("{report:?}");
    let survivor = &replicas[0];
    assert!(report.asked > 20, "too few questions to say anything: {report:?}");
    assert_eq!(report.unanswered, 0, "a question no replica answered: {report:?}");
    assert_eq!(report.wrong, 0, "a wrong answer: {report:?}");
    assert_eq!(
        report.failed_after_grace, 0,
        "questions asked after the kill failed (beyond those in flight): {report:?}"
    );
    assert!(report.failed_attempts <= 4, "more failures than callers in flight: {report:?}");
    let first = report.first_answer_after_kill.expect("an answer after the kill");
    assert!(first < Duration::from_secs(3), "the survivor answered only after {first:?}: {report:?}");
    assert!(
        report.worst_after_kill < Duration::from_secs(5),
        "a question after the kill took {:?}: {report:?}\nsurvivor's log:\n{}",
        report.worst_after_kill,
        survivor.log_text()
    );
    drop(reals);
}

/// An Apply with `execute` through replica `addr`, as the operator `admin`.
async fn execute_apply(addr: std::net::SocketAddr, pki: &Pki) -> tonic::Status {
    let admin = pki.issue("admin", &["admin"]);
    let ch = tls_channel(addr, &pki.ca.cert, Some((&admin.cert, &admin.key))).await.expect("connect");
    let req = pb::FleetApplyRequest {
        node: "node-0000".into(),
        devices: vec!["loop0".into()],
        identities: vec!["loop=not-this-one".into()],
        execute: true,
        ..Default::default()
    };
    FleetClient::new(ch).apply(req).await.expect_err("nothing here may run")
}

#[test]
fn only_the_apply_lease_holder_executes_and_a_survivor_takes_the_lease_over() {
    const KEY: &str = "blockjanitor/blockjanitor-console-apply";
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::new("lease CA");
    let files = ConsoleFiles::write(&pki, dir.path());
    let agent = fleet_agent(dir.path(), &files, "incident1", "node-0000");
    let rt = blockjanitor_tests::rt();
    let api = rt.block_on(blockjanitor_tests::lease_mock::LeaseServer::start());
    let mut replicas: Vec<Console> = (0..2)
        .map(|i| {
            let mut args = files.args("viewer");
            args.extend(["--operator", "admin", "--kube-url", &api.url(), "--apply-lease"].map(String::from));
            args.extend(
                ["blockjanitor-console-apply", "--lease-namespace", "blockjanitor"].map(String::from),
            );
            args.extend(["--lease-seconds".to_owned(), "3".to_owned(), "--lease-identity".to_owned()]);
            args.extend([
                format!("replica-{i}"),
                "--agents".into(),
                format!("node-0000={}", agent.tcp.expect("tcp")),
            ]);
            Console::start_configured(&args, None, quiet)
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let holder = loop {
        if let Some(h) = api.holder(KEY) {
            break h;
        }
        assert!(Instant::now() < deadline, "no replica took the Lease");
        std::thread::sleep(Duration::from_millis(100));
    };
    let h: usize = holder.strip_prefix("replica-").and_then(|i| i.parse().ok()).expect("a replica's name");
    let other = 1 - h;
    rt.block_on(async {
        for r in &replicas {
            wait_synced(r.tcp, &pki, 1).await;
        }
        let refused = execute_apply(replicas[other].tcp, &pki).await;
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        assert!(
            refused.message().contains(&holder) && refused.message().contains(&format!("replica-{other}")),
            "the refusal names the holder and this replica: {refused:?}"
        );
        // The holder goes on to the dry run (which refuses: the identity is not the device's).
        let dry = execute_apply(replicas[h].tcp, &pki).await;
        assert_eq!(dry.code(), tonic::Code::FailedPrecondition, "the holder asks the nodes: {dry:?}");
    });
    assert_eq!(api.holder(KEY).as_deref(), Some(holder.as_str()), "the holder renews, nobody steals it");

    // The holder dies: the survivor takes the Lease over once it expired, and then executes.
    replicas[h].kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.holder(KEY).as_deref() != Some(&format!("replica-{other}")) {
        assert!(Instant::now() < deadline, "the survivor never took the Lease: {:?}", api.lease(KEY));
        std::thread::sleep(Duration::from_millis(100));
    }
    let lease = api.lease(KEY).expect("lease");
    assert!(lease["spec"]["leaseTransitions"].as_i64() >= Some(1), "{lease}");
    let after = rt.block_on(execute_apply(replicas[other].tcp, &pki));
    assert_eq!(after.code(), tonic::Code::FailedPrecondition, "the survivor now applies: {after:?}");
    drop(replicas);
}
