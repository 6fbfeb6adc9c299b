//! Liveness of the fleet console's links (issue 18), with real agent processes and a real
//! console over mutual TLS: an agent that goes silent (stopped with SIGSTOP, its network link
//! cut inside network namespaces this test creates, or killed with SIGKILL) is named missing
//! in every answer within seconds (silence judged net of the console's own lag: a probe after
//! 1 s of quiet, dead after 3 s unexplained, by default), a slow agent is "not refreshed", not down,
//! "safe to unfence" is never answered (issue 35: only from the client's own node's current answer),
//! the mark clears once the agent answers again, and
//! a fresh fan-out does not wait again on links already known dead.
//!
//! Tests assert generous bounds (CI has two loaded cores) and print what they measured; the
//! figures are in BENCHMARKS.md ("Liveness (issue 18)").

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{console_args, start_agent, start_agent_configured, Console};
use blockjanitor_tests::daemon::{tls_channel, Daemon, Pki};
use blockjanitor_tests::measure::{ms, percentile};
use blockjanitor_tests::netns::{veth, NetNs};
use blockjanitor_tests::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tonic::transport::Channel;

/// The bound the issue asks for is 5 s; tests allow more for a loaded CI machine.
const MISSING_BOUND: Duration = Duration::from_secs(8);
/// The call deadline the shipped manifests set (a fan-out that waited on a hung agent would take
/// at least this long).
const CALL_TIMEOUT_MS: &str = "3000";
/// A watcher address no fixture maps and no node has: "unknown" whoever answers (issue 35), and
/// every answer names the nodes that do not answer.
const UNKNOWN_WATCHER: &str = "10.9.9.9:0/1234";

/// Sends SIGCONT on drop, so that a failed test never leaves a stopped agent behind.
struct Stopped(u32);

impl Stopped {
    fn stop(d: &Daemon) -> Self {
        signal(d.child.id(), Signal::SIGSTOP);
        Stopped(d.child.id())
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, Signal::SIGCONT);
    }
}

/// The console's flags in these tests: mutual TLS (`console_args`), the agents `list`
/// (`node=https://addr,...`), the shipped call deadline and quick reconnects, and no per-person
/// limit on fresh fan-outs (these tests measure fan-outs, dozens a minute from one viewer).
fn liveness_console_args(
    s: &Scratch,
    pki: &Pki,
    tls: &(std::path::PathBuf, std::path::PathBuf, std::path::PathBuf),
    list: &str,
) -> Vec<String> {
    console_args(
        s,
        pki,
        tls,
        &[
            "--agents",
            list,
            "--call-timeout-ms",
            CALL_TIMEOUT_MS,
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "1",
            "--fresh-per-minute-per-caller",
            "0",
        ],
    )
}

fn signal(pid: u32, sig: Signal) {
    kill(Pid::from_raw(pid as i32), sig).unwrap_or_else(|e| panic!("kill -{sig} {pid}: {e}"));
}

/// Agents on loopback (one port each), a console following them statically, and the
/// certificates to ask it.
struct Fleet {
    _s: Scratch,
    pki: Pki,
    agents: Vec<(String, Daemon)>,
    console: Console,
}

impl Fleet {
    fn start(n: usize) -> Self {
        let s = Scratch::new();
        let pki = Pki::new("blockjanitor test CA");
        let tls = pki.write_server(s.dir.path());
        let fixtures = ["incident1", "incident1-newnode", "multipath-incident3"];
        let agents: Vec<(String, Daemon)> = (0..n)
            .map(|i| {
                let node = format!("node-{i:02}");
                let d =
                    start_agent(&s.mkdir(&node), fixtures[i % fixtures.len()], &node, "127.0.0.1:0", &tls);
                (node, d)
            })
            .collect();
        let list = agents
            .iter()
            .map(|(n, d)| format!("{n}=https://{}", d.tcp.expect("the agent's TCP listener")))
            .collect::<Vec<_>>()
            .join(",");
        let args = liveness_console_args(&s, &pki, &tls, &list);
        let console = Console::start(&args);
        Fleet { _s: s, pki, agents, console }
    }

    fn agent(&self, node: &str) -> &Daemon {
        &self.agents.iter().find(|(n, _)| n == node).expect("agent").1
    }
}

async fn viewer(pki: &Pki, console: SocketAddr) -> FleetClient<Channel> {
    let pem = pki.issue("dashboard", &["dashboard"]);
    FleetClient::new(tls_channel(console, &pki.ca.cert, Some((&pem.cert, &pem.key))).await.expect("connect"))
}

fn missing<'a>(n: &'a pb::ListNodesResponse, node: &str) -> Option<&'a pb::MissingNode> {
    n.missing_nodes.iter().find(|m| m.node == node)
}

/// Polls ListNodes until `ok` holds; returns how long that took. Panics after `bound`.
async fn until(
    c: &mut FleetClient<Channel>,
    what: &str,
    bound: Duration,
    ok: impl Fn(&pb::ListNodesResponse) -> bool,
) -> Duration {
    let t = Instant::now();
    loop {
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        if ok(&n) {
            return t.elapsed();
        }
        assert!(t.elapsed() < bound, "{what}: not within {bound:?}: {n:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A fresh Where for `image`: every node asked again, within the console's deadline.
async fn fresh_where(c: &mut FleetClient<Channel>, image: &str) -> pb::WhereResponse {
    c.r#where(pb::WhereRequest { image: image.into(), fresh: true, ..Default::default() })
        .await
        .expect("fresh Where")
        .into_inner()
}

async fn all_up(c: &mut FleetClient<Channel>) {
    until(c, "every agent synced", Duration::from_secs(60), |n| {
        n.missing_nodes.is_empty() && n.nodes.iter().all(|x| x.reachable)
    })
    .await;
}

async fn who_watches_unknown(c: &mut FleetClient<Channel>) -> pb::WhoWatchesResponse {
    c.who_watches(pb::WhoWatchesRequest { client_addr: UNKNOWN_WATCHER.into(), ..Default::default() })
        .await
        .expect("WhoWatches")
        .into_inner()
}

/// The unknown watcher's answer with every node answering: "unknown", its node being unknown.
async fn unknown_with_every_node_up(c: &mut FleetClient<Channel>) {
    let r = who_watches_unknown(c).await;
    let m = &r.watchers[0];
    assert!(r.missing_nodes.is_empty(), "{r:#?}");
    assert!(!m.unfence_safe && m.answer == "unknown", "{m:#?}");
    assert!(m.detail.contains("belongs to no node this console knows"), "{m:#?}");
}

/// Waits until `node` is named missing (by ListNodes, Where and WhoWatches, which must not say
/// "safe" meanwhile) and returns how long after `since` that was.
async fn named_missing(c: &mut FleetClient<Channel>, node: &str, since: Instant) -> Duration {
    until(c, &format!("{node} named missing"), MISSING_BOUND, |n| {
        missing(n, node).is_some() && n.nodes.iter().any(|x| x.name == node && !x.reachable)
    })
    .await;
    let took = since.elapsed();
    let w = c
        .r#where(pb::WhereRequest { image: "k8s/any".into(), ..Default::default() })
        .await
        .expect("Where")
        .into_inner();
    assert!(w.missing_nodes.iter().any(|m| m.node == node), "Where names {node} missing: {w:#?}");
    let r = who_watches_unknown(c).await;
    assert!(!r.watchers[0].unfence_safe, "never safe: {r:#?}");
    assert!(r.missing_nodes.iter().any(|m| m.node == node), "WhoWatches names {node} missing: {r:#?}");
    took
}

#[test]
fn a_stopped_agent_is_named_missing_within_seconds_and_cleared_when_it_continues() {
    let f = Fleet::start(3);
    rt().block_on(async {
        let mut c = viewer(&f.pki, f.console.tcp).await;
        all_up(&mut c).await;
        unknown_with_every_node_up(&mut c).await;

        let t = Instant::now();
        let stopped = Stopped::stop(f.agent("node-01"));
        let took = named_missing(&mut c, "node-01", t).await;
        println!("SIGSTOP: node-01 named missing after {}", ms(took));
        let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
        let reason = &missing(&n, "node-01").expect("missing").reason;
        assert!(reason.starts_with("unreachable for "), "says since when and why: {reason}");
        println!("SIGSTOP: node-01's reason: {reason}");
        assert_eq!(n.missing_nodes.len(), 1, "only the stopped agent: {n:#?}");

        // While it stays stopped, fresh questions do not wait on it again.
        for _ in 0..3 {
            let t = Instant::now();
            let w = fresh_where(&mut c, "k8s/any").await;
            assert!(w.missing_nodes.iter().any(|m| m.node == "node-01"), "{w:#?}");
            assert!(t.elapsed() < Duration::from_millis(2500), "a fresh Where waited on the dead link");
        }

        drop(stopped);
        let back = until(&mut c, "node-01 back after SIGCONT", Duration::from_secs(30), |n| {
            missing(n, "node-01").is_none() && n.nodes.iter().any(|x| x.name == "node-01" && x.reachable)
        })
        .await;
        println!("SIGCONT: node-01 answered again after {}", ms(back));
        unknown_with_every_node_up(&mut c).await;
    });
}

#[test]
fn a_killed_agent_is_named_missing_within_seconds() {
    let mut f = Fleet::start(2);
    rt().block_on(async {
        let mut c = viewer(&f.pki, f.console.tcp).await;
        all_up(&mut c).await;
        let t = Instant::now();
        let d = &mut f.agents[1].1;
        d.child.kill().expect("kill -9");
        let _ = d.child.wait();
        let took = named_missing(&mut c, "node-01", t).await;
        println!("SIGKILL: node-01 named missing after {}", ms(took));
        assert!(f.console.log_text().contains("link to the agent lost"), "the link logs its loss");
    });
}

#[test]
fn fresh_fan_out_skips_hung_agents() {
    const N: usize = 20;
    const CALLS: usize = 50;
    let f = Fleet::start(N);
    rt().block_on(async {
        let mut c = viewer(&f.pki, f.console.tcp).await;
        all_up(&mut c).await;
        let mut healthy = Vec::new();
        for _ in 0..10 {
            let t = Instant::now();
            fresh_where(&mut c, "k8s/any").await;
            healthy.push(t.elapsed());
        }
        healthy.sort();

        // 10 % hung.
        let hung = ["node-03", "node-11"];
        let t = Instant::now();
        let _stopped: Vec<Stopped> = hung.iter().map(|n| Stopped::stop(f.agent(n))).collect();
        let first = fresh_where(&mut c, "k8s/any").await;
        let first_took = t.elapsed();
        for n in hung {
            let took = named_missing(&mut c, n, t).await;
            println!("SIGSTOP: {n} named missing after {}", ms(took));
        }
        let mut times = Vec::new();
        for _ in 0..CALLS {
            let t = Instant::now();
            let r = fresh_where(&mut c, "k8s/any").await;
            times.push(t.elapsed());
            let named: Vec<&str> = r.missing_nodes.iter().map(|m| m.node.as_str()).collect();
            assert_eq!(named, hung, "every answer names the hung nodes, and only them: {r:#?}");
        }
        times.sort();
        let (p50, p99) = (percentile(&times, 0.5), percentile(&times, 0.99));
        let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        println!(
            "fresh fan-out, {N} agents, healthy: p50 {} p99 {}; the first right after 2 SIGSTOPs: {} \
             (missing then: {}); with 2 hung (known dead), {CALLS} calls: p50 {} p99 {} max {}; loadavg {}",
            ms(percentile(&healthy, 0.5)),
            ms(percentile(&healthy, 0.99)),
            ms(first_took),
            first.missing_nodes.len(),
            ms(p50),
            ms(p99),
            ms(times[times.len() - 1]),
            load.trim()
        );
        // A fan-out that waited on the hung agents would take the call deadline (3 s) each time.
        assert!(p99 < Duration::from_millis(2500), "p99 {} with 10 % hung", ms(p99));
    });
}

/// The agent in one namespace, the console (and this test's client) in another, a veth pair
/// between them: the agent's end goes down, then up again.
#[test]
fn root_a_cut_network_link_is_named_missing_within_seconds() {
    if !require_real_kernel(&["ip"]) {
        return;
    }
    let _serial = serial();
    let tag = std::process::id();
    let (agent_ns, console_ns) = (NetNs::new(&format!("bjl-a-{tag}")), NetNs::new(&format!("bjl-c-{tag}")));
    let (a_if, c_if) = (format!("bja{tag}"), format!("bjc{tag}"));
    let (a_if, c_if) = (&a_if[..a_if.len().min(15)], &c_if[..c_if.len().min(15)]);
    veth(&agent_ns, a_if, "10.231.7.1/24", &console_ns, c_if, "10.231.7.2/24");

    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let agent =
        start_agent_configured(&s.mkdir("ns"), "incident1", "node-ns", "10.231.7.1:9443", &tls, |cmd| {
            agent_ns.enter_command(cmd)
        });
    // A second agent on the console namespace's own loopback: it stays reachable throughout.
    let local = start_agent_configured(
        &s.mkdir("lo"),
        "incident1-newnode",
        "node-lo",
        "127.0.0.1:9443",
        &tls,
        |cmd| console_ns.enter_command(cmd),
    );
    let args = liveness_console_args(
        &s,
        &pki,
        &tls,
        "node-ns=https://10.231.7.1:9443,node-lo=https://127.0.0.1:9443",
    );
    let console = Console::start_configured(&args, None, |cmd| console_ns.enter_command(cmd));
    let addr = console.tcp;

    // The test's own client runs on a thread inside the console's namespace.
    let result = std::thread::scope(|sc| {
        sc.spawn(|| {
            console_ns.enter_this_thread();
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async {
                let mut c = viewer(&pki, addr).await;
                all_up(&mut c).await;
                let t = Instant::now();
                agent_ns.ip(&["link", "set", a_if, "down"]);
                let took = named_missing(&mut c, "node-ns", t).await;
                println!("link down: node-ns named missing after {}", ms(took));
                let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
                assert_eq!(n.missing_nodes.len(), 1, "only the cut node: {n:#?}");

                agent_ns.ip(&["link", "set", a_if, "up"]);
                let back = until(&mut c, "node-ns back after link up", Duration::from_secs(30), |n| {
                    n.missing_nodes.is_empty() && n.nodes.iter().all(|x| x.reachable)
                })
                .await;
                println!("link up: node-ns answered again after {}", ms(back));
                unknown_with_every_node_up(&mut c).await;
            });
        })
        .join()
    });
    drop(console);
    drop((agent, local));
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// Established TCP connections the process `pid` holds on its listening `port` (from `ss`).
fn established_on(pid: u32, port: u16) -> usize {
    let out = sh("ss", &["-Htnp", "state", "established", "sport", &format!("= :{port}")]);
    out.lines().filter(|l| l.contains(&format!("pid={pid},"))).count()
}

#[test]
fn the_agent_drops_the_watch_of_a_console_that_went_silent() {
    let f = Fleet::start(1);
    let agent = f.agent("node-00");
    let (pid, port) = (agent.child.id(), agent.tcp.expect("tcp").port());
    rt().block_on(async {
        let mut c = viewer(&f.pki, f.console.tcp).await;
        all_up(&mut c).await;
    });
    assert_eq!(established_on(pid, port), 1, "the console's link (calls and WatchEvents on one connection)");
    let t = Instant::now();
    let _stopped = Stopped(f.console.child.id());
    signal(f.console.child.id(), Signal::SIGSTOP);
    // The agent pings every 5 s and gives up after 10 s without an answer.
    assert!(
        wait_until(Duration::from_secs(30), || established_on(pid, port) == 0),
        "the agent still holds the stopped console's connection after 30 s"
    );
    println!("console stopped: the agent dropped its connection after {}", ms(t.elapsed()));
}

/// A slow agent is not a down one (issue 36): a stand-in whose device list answers after the
/// fresh fan-out's deadline, while its link stays alive (its event stream open, its probes
/// answered at once). A fresh answer names it "not refreshed" (its cached view used, with its
/// age), never down and never safe; its link survives (no reconnect: the same stream stays
/// subscribed), its node stays reachable, and the mark clears once a read completes again.
#[test]
fn a_slow_agent_is_answered_not_refreshed_not_down_and_its_link_survives() {
    use blockjanitor_tests::standin_fleet::{self as fleet, StandIn};
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let rt = rt();
    let server = fleet::server_tls(&pki);
    let (states, list) = rt.block_on(async {
        let mut states = Vec::new();
        let mut list = Vec::new();
        for i in 0..3 {
            let svc = StandIn::new(format!("node-{i:02}"), fleet::devices_for(i), Duration::ZERO);
            states.push(std::sync::Arc::clone(&svc.state));
            list.push(format!("node-{i:02}=https://{}", fleet::serve(&server, svc).await));
        }
        (states, list.join(","))
    });
    let args = console_args(
        &s,
        &pki,
        &tls,
        &[
            "--agents",
            &list,
            "--call-timeout-ms",
            "1000",
            "--connect-timeout-ms",
            "1000",
            "--backoff-max-seconds",
            "1",
            "--fresh-per-minute-per-caller",
            "0",
        ],
    );
    let console = Console::start(&args);
    let slow = &states[1];
    rt.block_on(async {
        let mut c = viewer(&pki, console.tcp).await;
        all_up(&mut c).await;
        assert_eq!(slow.subscribers(), 1, "the console's event stream");
        slow.slow_lists(Duration::from_millis(2500));

        // A fresh Where for one of the slow node's images: its cached devices, marked not fresh.
        let t = Instant::now();
        let w = fresh_where(&mut c, "k8s/csi-vol-0001-0").await;
        let took = t.elapsed();
        println!("fresh Where with node-01 slow: {} ({w:?})", ms(took));
        assert!(took < Duration::from_millis(2400), "waited past the 1 s call deadline: {}", ms(took));
        assert!(w.matches.iter().any(|m| m.node == "node-01"), "its cached devices answer: {w:#?}");
        let m = w.missing_nodes.iter().find(|m| m.node == "node-01").expect("node-01 named");
        assert!(m.not_refreshed && m.reason.starts_with("not refreshed: "), "{m:#?}");
        assert!(m.reason.contains("not down") && m.answer_age_seconds >= 0.0, "{m:#?}");
        assert_eq!(w.missing_nodes.len(), 1, "only the slow node: {w:#?}");

        // Never safe on it: a fresh WhoWatches names it not refreshed and says no "safe".
        let r = c
            .who_watches(pb::WhoWatchesRequest {
                client_addr: fleet::client_addr(1),
                fresh: true,
                ..Default::default()
            })
            .await
            .expect("WhoWatches")
            .into_inner();
        assert!(r.watchers.iter().all(|m| !m.unfence_safe), "{r:#?}");
        assert!(r.missing_nodes.iter().any(|m| m.node == "node-01" && m.not_refreshed), "{r:#?}");

        // The link survives: for twice the silence limit (3 s) the node stays reachable (marked
        // not refreshed), and its one event stream stays subscribed (no reconnect), while the
        // link's own re-reads keep missing their deadline.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(6) {
            let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
            let x = n.nodes.iter().find(|x| x.name == "node-01").expect("node-01");
            assert!(x.reachable && !x.not_refreshed.is_empty(), "reachable, not refreshed: {x:#?}");
            let m = missing(&n, "node-01").expect("named");
            assert!(m.not_refreshed, "{m:#?}");
            assert_eq!(slow.subscribers(), 1, "the link was torn down and made again");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = console.log_text();
        assert!(!log.contains("link to the agent lost"), "no link was lost: {log}");
        assert!(log.contains("not refreshed"), "the console says so: {log}");

        // Fast again: the link's next re-read clears the mark.
        slow.slow_lists(Duration::ZERO);
        let back = until(&mut c, "node-01 refreshed again", Duration::from_secs(15), |n| {
            n.missing_nodes.is_empty() && n.nodes.iter().all(|x| x.reachable && x.not_refreshed.is_empty())
        })
        .await;
        println!("node-01 refreshed again {} after its lists were fast again", ms(back));
        let w = fresh_where(&mut c, "k8s/csi-vol-0001-0").await;
        assert!(w.missing_nodes.is_empty(), "{w:#?}");
        assert_eq!(slow.subscribers(), 1, "still the same stream");
    });
    drop(console);
}

/// The console's own stall is not its agents' silence (issue 36): the console stopped (SIGSTOP)
/// for 5 s, longer than the 3 s silence limit, while every agent runs. On resuming, the lag it
/// measured over those seconds explains the silence: no link is lost, no node is named missing.
/// (With the lag taken as zero, every link is judged silent on resuming and this fails.)
#[test]
fn a_stalled_console_does_not_take_its_own_stall_for_the_agents_silence() {
    let f = Fleet::start(3);
    rt().block_on(async {
        let mut c = viewer(&f.pki, f.console.tcp).await;
        all_up(&mut c).await;
        let before = f.console.log_text().lines().count();
        {
            let _stopped = Stopped(f.console.child.id());
            signal(f.console.child.id(), Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        // Resumed (SIGCONT on drop): every node stays reachable while the links catch up.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            let n = c.list_nodes(pb::ListNodesRequest {}).await.expect("ListNodes").into_inner();
            assert!(n.missing_nodes.is_empty() && n.nodes.iter().all(|x| x.reachable), "{n:#?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let log = f.console.log_text();
        let lost: Vec<&str> =
            log.lines().skip(before).filter(|l| l.contains("link to the agent lost")).collect();
        assert!(lost.is_empty(), "links lost after a 5 s stall of the console: {lost:#?}");
        println!("console stopped 5 s: no link lost, every node reachable after it resumed");
    });
}
