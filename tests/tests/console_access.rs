//! Who may call the fleet console, asked directly over gRPC (what a program other than the
//! kubectl plugin sends): a bearer token the stand-in API server reviews (TokenReview, then a
//! SubjectAccessReview of the call's verb on `fleet.blockjanitor.io`), per-person limits on fresh
//! fan-outs (a viewer cannot keep every agent busy), `/metrics` behind the same review with
//! `--metrics-review`, a console without the API refusing tokens, and the agent counting the
//! Applies the console forwards per person. Real console and agent processes.

use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_tests::console::{console_args, console_kubeconfig, start_agent, Console};
use blockjanitor_tests::daemon::{console_client, console_facing_agent, tls_channel, Daemon, Pki};
use blockjanitor_tests::http::http_response_with;
use blockjanitor_tests::kube_mock::{self, ApiServer};
use blockjanitor_tests::{rt, wait_until, Scratch};
use tonic::transport::Channel;
use tonic::Code;

const NS: &str = "blockjanitor";

/// A console that reviews its callers with a stand-in API server, following one real agent.
struct Reviewed {
    s: Scratch,
    pki: Pki,
    api: ApiServer,
    console: Console,
    _agent: Daemon,
}

impl Reviewed {
    /// Users: vic (viewer: get, plan), olga and otto (also apply), prom (get on /metrics only).
    async fn start(extra: &[&str]) -> Self {
        let s = Scratch::new();
        let pki = Pki::new("blockjanitor test CA");
        let tls = pki.write_server(s.dir.path());
        let agent = start_agent(&s.mkdir("agent"), "incident1", "node-a", "127.0.0.1:0", &tls);
        let api = ApiServer::start(kube_mock::node_object(kube_mock::ready_only())).await;
        api.user("vic-token", "vic", &["viewers"]);
        api.grant("Group:viewers", "blockjanitor.io", "fleet", &["get", "plan"], Some(NS));
        api.user("olga-token", "olga", &[]);
        api.grant("User:olga", "blockjanitor.io", "fleet", &["get", "plan", "apply"], Some(NS));
        api.user("otto-token", "otto", &["operators"]);
        api.grant("Group:operators", "blockjanitor.io", "fleet", &["get", "plan", "apply"], Some(NS));
        api.user("prom-token", "system:serviceaccount:monitoring:prometheus", &["system:serviceaccounts"]);
        api.grant("User:system:serviceaccount:monitoring:prometheus", "", "/metrics", &["get"], None);
        let kubeconfig = console_kubeconfig(s.dir.path(), "console", &api, &pki.ca.cert);
        let agents = format!("node-a=https://{}", agent.tcp.expect("tcp"));
        let kc = kubeconfig.to_string_lossy().into_owned();
        let mut args = vec!["--agents", &agents, "--kubeconfig", &kc, "--namespace", NS];
        args.extend_from_slice(extra);
        let console = Console::start(&console_args(&s, &pki, &tls, &args));
        Reviewed { s, pki, api, console, _agent: agent }
    }

    /// A client of the console with no client certificate.
    async fn client(&self) -> FleetClient<Channel> {
        FleetClient::new(tls_channel(self.console.tcp, &self.pki.ca.cert, None).await.expect("connect"))
    }
}

/// Waits (30 s at most) until the console's link to node-a is up, asking as olga.
async fn synced(c: &mut FleetClient<Channel>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let nodes = c.list_nodes(with(pb::ListNodesRequest {}, "Bearer olga-token")).await.expect("nodes");
        if nodes.into_inner().nodes.iter().any(|n| n.name == "node-a" && n.reachable) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "node-a never synced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// `msg` with `authorization: VALUE`.
fn with<T>(msg: T, authorization: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", authorization.parse().expect("ascii"));
    r
}

fn fresh() -> pb::FleetListDevicesRequest {
    pb::FleetListDevicesRequest { fresh: true, ..Default::default() }
}

#[test]
fn a_token_is_reviewed_per_call_and_each_person_has_their_own_fresh_fan_out_limit() {
    rt().block_on(async {
        let r = Reviewed::start(&["--fresh-per-minute-per-caller", "2"]).await;
        let mut c = r.client().await;
        let e = c.list_nodes(pb::ListNodesRequest {}).await.expect_err("no credentials");
        assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
        assert!(e.message().starts_with("no credentials: send your Kubernetes token"), "{e:?}");
        let e = c.list_nodes(with(pb::ListNodesRequest {}, "Basic dmljOnB3")).await.expect_err("basic");
        assert_eq!(
            (e.code(), e.message()),
            (Code::Unauthenticated, "only bearer tokens are accepted (authorization: Bearer TOKEN)")
        );

        c.list_nodes(with(pb::ListNodesRequest {}, "Bearer vic-token")).await.expect("vic may get");
        synced(&mut c).await;
        for _ in 0..2 {
            c.list_devices(with(fresh(), "Bearer vic-token")).await.expect("within vic's fresh limit");
        }
        let e = c.list_devices(with(fresh(), "Bearer vic-token")).await.expect_err("vic's third fan-out");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().starts_with("vic asked for more than 2 fresh fan-outs"), "{e:?}");
        c.list_devices(with(pb::FleetListDevicesRequest::default(), "Bearer vic-token"))
            .await
            .expect("the index itself is not limited");
        c.list_devices(with(fresh(), "Bearer olga-token")).await.expect("olga has her own limit");

        let plan = pb::FleetPlanRequest { node: "node-a".into(), devices: vec!["rbd4".into()] };
        c.plan(with(plan, "Bearer vic-token")).await.expect("vic may plan");
        let apply = pb::FleetApplyRequest {
            node: "node-a".into(),
            devices: vec!["rbd4".into()],
            identities: vec!["rbd=x".into()],
            ..Default::default()
        };
        let e = c.apply(with(apply.clone(), "Bearer vic-token")).await.expect_err("vic may not apply");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
        assert!(
            e.message()
                .starts_with("user vic may not 'apply' fleet.blockjanitor.io in namespace blockjanitor"),
            "{e:?}"
        );
        let dry = c.apply(with(apply, "Bearer olga-token")).await.expect("olga's dry run").into_inner();
        assert_eq!(dry.on_behalf_of, "olga", "the reviewed user is who the console acts for");

        // The console's audit names the refusal.
        let logged =
            wait_until(Duration::from_secs(5), || r.console.log_text().contains("user vic may not 'apply'"));
        assert!(logged, "{}", r.console.log_text());
        let _ = &r.s;
    });
}

/// One person cannot spend the fleet's whole step budget: each has a share a minute
/// (`--steps-per-minute-per-caller`), refused RESOURCE_EXHAUSTED naming it, before any agent is
/// asked; another person still has theirs.
#[test]
fn each_person_has_a_share_of_the_fleets_step_budget() {
    rt().block_on(async {
        let r =
            Reviewed::start(&["--steps-per-minute-per-caller", "1", "--fleet-steps-per-minute", "5"]).await;
        let mut c = r.client().await;
        synced(&mut c).await;
        let plan = pb::FleetPlanRequest { node: "node-a".into(), devices: vec!["rbd4".into()] };
        let p = c.plan(with(plan, "Bearer olga-token")).await.expect("plan").into_inner();
        let identity = p.plan.expect("plan").plans[0].identity.clone();
        let apply = pb::FleetApplyRequest {
            node: "node-a".into(),
            devices: vec!["rbd4".into()],
            identities: vec![identity],
            execute: true,
            ..Default::default()
        };
        // Let through (the agent, on a fixture tree, then refuses to act: the steps count).
        let e = c.apply(with(apply.clone(), "Bearer olga-token")).await.expect_err("fixture tree");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().starts_with("the agent on node-a: "), "{e:?}");
        let e = c.apply(with(apply.clone(), "Bearer olga-token")).await.expect_err("olga's share is spent");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().starts_with("olga's step budget (1 steps a minute per person"), "{e:?}");
        let e = c.apply(with(apply, "Bearer otto-token")).await.expect_err("fixture tree");
        assert_eq!(e.code(), Code::FailedPrecondition, "otto has his own share: {e:?}");
    });
}

#[test]
fn metrics_are_served_only_to_a_scraper_the_api_server_reviews_with_the_flag() {
    rt().block_on(async {
        let r = Reviewed::start(&["--metrics-review"]).await;
        let addr = r.console.metrics;
        let get = |auth: Option<&str>| {
            let h: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
            http_response_with(addr, "/metrics", &h)
        };
        let (code, body) = tokio::task::block_in_place(|| get(None));
        assert_eq!(code, 401, "{body}");
        let (code, body) = tokio::task::block_in_place(|| get(Some("Bearer nobody-token")));
        assert_eq!(code, 401, "{body}");
        let (code, body) = tokio::task::block_in_place(|| get(Some("Bearer vic-token")));
        assert_eq!(code, 403, "{body}");
        assert!(body.starts_with("user vic may not 'get' /metrics"), "{body}");
        let (code, body) = tokio::task::block_in_place(|| get(Some("Bearer prom-token")));
        assert_eq!(code, 200, "{body}");
        assert!(body.contains("blockjanitor_console_agents"), "{body}");
        let asked = r.api.reviews_received();
        assert!(
            asked.iter().any(|q| q.body["spec"]["nonResourceAttributes"]
                == serde_json::json!({"path": "/metrics", "verb": "get"})),
            "{asked:?}"
        );
    });
}

#[test]
fn a_console_without_the_api_refuses_a_token() {
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let tls = pki.write_server(s.dir.path());
    let console = Console::start(&console_args(&s, &pki, &tls, &["--agents", "node-a=https://127.0.0.1:9"]));
    rt().block_on(async {
        let mut c = FleetClient::new(tls_channel(console.tcp, &pki.ca.cert, None).await.expect("connect"));
        let e = c.list_nodes(with(pb::ListNodesRequest {}, "Bearer vic-token")).await.expect_err("no API");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains("cannot review a bearer token"), "{e:?}");
    });
}

/// The agent counts the Applies the console forwards per person it names ("console for alice"),
/// so one person over the limit does not stop another.
#[test]
fn the_agent_counts_forwarded_applies_per_person() {
    let s = Scratch::new();
    let (d, pki) = console_facing_agent(&s, "incident1", "applies_per_minute_per_client = 1\n");
    rt().block_on(async {
        let mut a = console_client(&d, &pki).await;
        let apply = |who: &str| {
            let mut req =
                tonic::Request::new(pb::ApplyRequest { devices: vec!["rbd4".into()], ..Default::default() });
            req.metadata_mut().insert("x-blockjanitor-on-behalf-of", who.parse().expect("value"));
            req.metadata_mut().append("x-blockjanitor-on-behalf-of-groups", "ops".parse().expect("value"));
            req
        };
        let e = a.apply(apply("alice")).await.expect_err("a fixture tree");
        assert_eq!(e.code(), Code::FailedPrecondition, "past the limit: {e:?}");
        let e = a.apply(apply("alice")).await.expect_err("alice's second Apply this minute");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().starts_with("console for alice asked for more than 1 applies a minute"), "{e:?}");
        let e = a.apply(apply("bob")).await.expect_err("a fixture tree");
        assert_eq!(e.code(), Code::FailedPrecondition, "bob has his own limit: {e:?}");
    });
    let logged = wait_until(Duration::from_secs(5), || {
        d.log_text().contains("\"person\":\"bob\"") && d.log_text().contains("\"groups\":\"ops\"")
    });
    assert!(logged, "the audit names the person and their groups: {}", d.log_text());
}
