//! The console during an agent rollout (issue 36): 20 nodes, 3 of them real
//! `blockjanitor-agent serve` processes on fixture roots restarted in turn (stopped as a
//! DaemonSet rollout stops a pod, started again on the same address: 5 % of the fleet away at a
//! time), 14 stand-ins that keep answering, and 3 nodes whose agents never answer (NotReady
//! nodes). Throughout, a who-watches about a client on a node that answers stays definite (its
//! node named, "no": it still maps the image), a where about a volume on such a node is complete
//! (every node the evidence points at answered), and the sweep names as not covered exactly the
//! nodes that did not answer: the 3 silent ones always, a restarting one at most, no other.
//!
//! Also: a replica is not ready (`/readyz` 503, saying what it waits for) until every agent has
//! had its first try.
//!
//! Needs the binaries: `cargo build --workspace --bins`.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{console_args, start_agent, Console};
use blockjanitor_tests::daemon::{tls_channel, Daemon, Pki};
use blockjanitor_tests::http::http_response;
use blockjanitor_tests::standin_fleet::{self as fleet, StandIn};
use blockjanitor_tests::Scratch;
use tonic::transport::Channel;

const STEADY: usize = 14;
const SILENT: [&str; 3] = ["node-silent-0", "node-silent-1", "node-silent-2"];
const RESTARTING: [(&str, &str); 3] =
    [("node-r0", "incident1"), ("node-r1", "incident1-newnode"), ("node-r2", "multipath-incident3")];

fn steady(i: usize) -> String {
    format!("node-{i:04}")
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").to_string()
}

/// What one round of questions found wrong (empty when nothing), and the nodes the sweep said it
/// did not cover.
async fn check_round(c: &mut FleetClient<Channel>, round: usize) -> (Vec<String>, BTreeSet<String>) {
    let mut wrong = Vec::new();
    let silent: BTreeSet<String> = SILENT.iter().map(|s| (*s).to_owned()).collect();
    let may_miss: BTreeSet<String> =
        silent.iter().cloned().chain(RESTARTING.iter().map(|(n, _)| (*n).to_owned())).collect();
    let missing_ok = |m: &[pb::MissingNode]| -> Option<String> {
        let got: BTreeSet<String> = m.iter().map(|m| m.node.clone()).collect();
        (!(got.is_superset(&silent) && got.is_subset(&may_miss))).then(|| format!("missing nodes {got:?}"))
    };
    // A client on a steady node: still mapped there, so "no", from that node's evidence.
    let i = round % STEADY;
    let req = pb::WhoWatchesRequest { client_addr: fleet::client_addr(i), ..Default::default() };
    let w = c.who_watches(req).await.expect("WhoWatches").into_inner();
    let m = &w.watchers[0];
    if m.answer != "no" || m.nodes != [steady(i)] {
        wrong.push(format!(
            "who-watches {}: answer {:?} nodes {:?} ({})",
            m.client_addr, m.answer, m.nodes, m.detail
        ));
    }
    wrong.extend(missing_ok(&w.missing_nodes).map(|e| format!("who-watches: {e}")));
    // A volume on a steady node: complete although nodes elsewhere are missing.
    let image = format!("k8s/csi-vol-{i:04}-1");
    let r = c.r#where(pb::WhereRequest { image, ..Default::default() }).await.expect("Where").into_inner();
    if !r.complete || r.matches.len() != 1 || r.evidence_nodes != [steady(i)] {
        wrong.push(format!(
            "where: complete {} matches {} evidence {:?}",
            r.complete,
            r.matches.len(),
            r.evidence_nodes
        ));
    }
    wrong.extend(missing_ok(&r.missing_nodes).map(|e| format!("where: {e}")));
    // The sweep: what it could not see, exactly.
    let s = c.sweep(pb::SweepRequest::default()).await.expect("Sweep").into_inner();
    wrong.extend(missing_ok(&s.missing_nodes).map(|e| format!("sweep: {e}")));
    if s.complete || s.nodes != 20 || s.covered_nodes as usize + s.missing_nodes.len() != 20 {
        wrong.push(format!(
            "sweep: complete {} nodes {} covered {} missing {}",
            s.complete,
            s.nodes,
            s.covered_nodes,
            s.missing_nodes.len()
        ));
    }
    for n in &silent {
        if !s.summary.contains(n.as_str())
            && !s.missing_nodes.iter().any(|m| &m.node == n && !m.reason.is_empty())
        {
            wrong.push(format!("sweep does not say why {n} is not covered"));
        }
    }
    (wrong, s.missing_nodes.iter().map(|m| m.node.clone()).collect())
}

#[test]
fn during_a_rollout_answers_about_answering_nodes_stay_definite_and_the_sweep_names_what_it_missed() {
    let s = Scratch::new();
    let pki = Pki::new("rollout CA");
    let tls = pki.write_server(s.dir.path());
    let rt = blockjanitor_tests::rt();
    let stand_in_tls = fleet::server_tls(&pki);
    let mut entries: Vec<String> = rt.block_on(async {
        let mut v = Vec::new();
        for i in 0..STEADY {
            let svc = StandIn::new(steady(i), fleet::devices_for(i), Duration::ZERO);
            v.push(format!("{}={}", steady(i), fleet::serve(&stand_in_tls, svc).await));
        }
        for n in SILENT {
            v.push(format!("{n}={}", fleet::refusing().await));
        }
        v
    });
    let addrs: Vec<String> = RESTARTING.iter().map(|_| free_addr()).collect();
    let mut agents: Vec<Option<Daemon>> = RESTARTING
        .iter()
        .zip(&addrs)
        .map(|((node, fixture), addr)| Some(start_agent(&s.mkdir(node), fixture, node, addr, &tls)))
        .collect();
    entries.extend(RESTARTING.iter().zip(&addrs).map(|((node, _), addr)| format!("{node}=https://{addr}")));
    let agents_arg = entries.join(",");
    let args = console_args(
        &s,
        &pki,
        &tls,
        &[
            "--agents",
            &agents_arg,
            "--call-timeout-ms",
            "2000",
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "1",
        ],
    );
    let console = Console::start(&args);
    let viewer = pki.issue("dashboard", &["dashboard"]);
    let mut c = rt.block_on(async {
        let ch =
            tls_channel(console.tcp, &pki.ca.cert, Some((&viewer.cert, &viewer.key))).await.expect("connect");
        FleetClient::new(ch)
    });
    // Converged: all but the silent nodes answer.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = rt.block_on(c.list_nodes(pb::ListNodesRequest {})).expect("ListNodes").into_inner();
        if n.nodes.iter().filter(|x| x.reachable).count() == 17 {
            break;
        }
        assert!(Instant::now() < deadline, "not converged: {n:#?}\n{}", console.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let (code, body) = http_response(console.metrics, "/readyz");
    assert_eq!((code, body.trim()), (200, "ready"), "ready once every agent was tried");

    // The rollout: each real agent stopped, away for 1.5 s, started again on its address, and
    // given 1.5 s before the next; questions asked all along.
    let mut wrong = Vec::new();
    let mut rounds = 0;
    let mut restarts_seen = BTreeSet::new();
    for (k, (node, fixture)) in RESTARTING.iter().enumerate() {
        for phase in 0..2 {
            if phase == 0 {
                agents[k].take().expect("running").stop();
            } else {
                agents[k] =
                    Some(start_agent(&s.mkdir(&format!("{node}-{k}-again")), fixture, node, &addrs[k], &tls));
            }
            let until = Instant::now() + Duration::from_millis(1500);
            while Instant::now() < until {
                let (w, missing) = rt.block_on(check_round(&mut c, rounds));
                wrong.extend(w.into_iter().map(|w| format!("round {rounds}: {w}")));
                restarts_seen.extend(missing.into_iter().filter(|m| RESTARTING.iter().any(|(n, _)| n == m)));
                rounds += 1;
            }
        }
    }
    eprintln!(
        "{rounds} rounds of questions during the rollout; restarting agents seen away: {restarts_seen:?}"
    );
    assert!(!restarts_seen.is_empty(), "the console never saw a restarting agent away: not a rollout scene");
    assert!(rounds >= 6, "too few rounds to say anything: {rounds}");
    assert!(wrong.is_empty(), "{} wrong answers:\n{}", wrong.len(), wrong.join("\n"));
    drop(console);
}

#[test]
fn a_replica_is_not_ready_until_every_agent_was_tried() {
    let s = Scratch::new();
    let pki = Pki::new("ready CA");
    let tls = pki.write_server(s.dir.path());
    let rt = blockjanitor_tests::rt();
    let stand_in_tls = fleet::server_tls(&pki);
    // An agent that answers after 4 s, within the console's 20 s deadline.
    let slow = rt.block_on(async {
        let svc = StandIn::new(steady(0), fleet::devices_for(0), Duration::from_secs(4));
        fleet::serve(&stand_in_tls, svc).await
    });
    let agents = format!("{}={slow}", steady(0));
    let args = console_args(&s, &pki, &tls, &["--agents", &agents, "--call-timeout-ms", "20000"]);
    let console = Console::start(&args);
    let (code, body) = http_response(console.metrics, "/readyz");
    assert_eq!(code, 503, "not ready before its one agent answered: {body}");
    assert!(body.contains("1 of 1 agents not tried yet"), "says what it waits for: {body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = http_response(console.metrics, "/readyz");
        if code == 200 {
            assert_eq!(body.trim(), "ready");
            break;
        }
        assert!(Instant::now() < deadline, "never ready: {code} {body}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
