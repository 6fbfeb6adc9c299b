//! The gRPC Plan/Apply/WatchEvents suite on the simulated host (`blockjanitor::engine::sim`),
//! without root: the agent's real service and daemon state on a unix socket in a temp dir, asked
//! through the real tonic client (`blockjanitor_rpc::client`). The scenes are the real-kernel
//! fixture trees (`tests/fixtures/incident5`: rbd3 mounted only in a pod's namespace), read by
//! the normal scan code; after that the sim keeps the state, so each Apply changes what the next
//! scan sees.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use blockjanitor::engine::sim::SimWorld;
use blockjanitor::server::sim::SimAgent;
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_rpc::client::{connect, Target};
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// The agent on the `fixture` tree's scene, and a client connected to it.
async fn agent_on(fixture: &str, dir: &Path) -> (Arc<SimWorld>, SimAgent, AgentClient<Channel>) {
    let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(fixture);
    let world = Arc::new(SimWorld::from_fixture(&tree).expect("scan the fixture tree"));
    let agent = SimAgent::start(Arc::clone(&world), dir).await.expect("start the agent on the sim");
    let client =
        connect(&Target::Unix(agent.socket.clone()), Duration::from_secs(10)).await.expect("connect");
    (world, agent, client)
}

fn release(device: &str, identity: Option<&str>) -> pb::ApplyRequest {
    pb::ApplyRequest {
        devices: vec![device.into()],
        identities: identity.map(|i| vec![i.to_owned()]).unwrap_or_default(),
        operation: pb::Operation::Release as i32,
    }
}

async fn plan_release(client: &mut AgentClient<Channel>, device: &str) -> pb::DevicePlan {
    let req = pb::PlanRequest { devices: vec![device.into()], operation: pb::Operation::Release as i32 };
    let mut plans = client.plan(req).await.expect("Plan").into_inner().plans;
    assert_eq!(plans.len(), 1, "one plan for {device}: {plans:?}");
    plans.remove(0)
}

/// Plan is a dry run: the release of rbd3's one foreign mount, bound to its identity, and the
/// simulated host untouched; Apply with that identity detaches the mount (the sim no longer has
/// it), answers each step's result and rbd3 as it is afterwards, nothing resumed.
#[tokio::test]
async fn plan_then_apply_with_identity_releases_the_foreign_mount() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (world, agent, mut client) = agent_on("incident5", dir.path()).await;
    let plan = plan_release(&mut client, "rbd3").await;
    assert_eq!(plan.refusal, "", "{plan:?}");
    assert_eq!(plan.outcome, "done", "{plan:?}");
    assert!(!plan.identity.is_empty(), "{plan:?}");
    let actions: Vec<&str> = plan.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(actions, ["detach_mount"], "{plan:?}");
    assert!(world.steps_run().is_empty(), "Plan ran {:?}", world.steps_run());

    let answer = client.apply(release("rbd3", Some(&plan.identity))).await.expect("Apply").into_inner();
    let results: Vec<&str> = answer.results.iter().map(|r| r.result.as_str()).collect();
    assert_eq!(results, ["done"], "{answer:?}");
    assert!(answer.resumed.is_empty(), "{answer:?}");
    assert_eq!(answer.after.len(), 1, "{answer:?}");
    assert_eq!(answer.after[0].name, "rbd3");
    assert!(answer.after[0].holders.is_empty(), "rbd3 afterwards: {:?}", answer.after[0]);
    let rbd3 = world.device("rbd3").expect("rbd3 is still there");
    assert!(rbd3.holders.is_empty(), "the sim still has {:?}", rbd3.holders);
    assert_eq!(world.steps_run().len(), 1);
    agent.stop().await.expect("stop");
}

/// An identity taken before the device became another one is refused, naming the device, and
/// nothing runs.
#[tokio::test]
async fn apply_refuses_a_changed_identity_naming_the_device() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (world, agent, mut client) = agent_on("incident5", dir.path()).await;
    let plan = plan_release(&mut client, "rbd3").await;
    let rbd3 = world.device("rbd3").expect("rbd3");
    world.change_identity(rbd3.device.devnum);
    let status = client.apply(release("rbd3", Some(&plan.identity))).await.expect_err("a changed identity");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains("rbd3"), "{}", status.message());
    assert!(world.steps_run().is_empty(), "ran {:?}", world.steps_run());
    assert_eq!(world.device("rbd3").expect("rbd3").holders.len(), 1);
    agent.stop().await.expect("stop");
}

/// A watcher sees an Apply's ActionStarted and ActionFinished for the device.
#[tokio::test]
async fn watch_events_shows_an_applys_action_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_world, agent, mut client) = agent_on("incident5", dir.path()).await;
    let mut events =
        client.watch_events(pb::WatchEventsRequest::default()).await.expect("watch").into_inner();
    client.apply(release("rbd3", None)).await.expect("Apply");
    let mut seen = Vec::new();
    let wanted = [pb::event::Type::ActionStarted as i32, pb::event::Type::ActionFinished as i32];
    while !wanted.iter().all(|w| seen.iter().any(|(t, d): &(i32, String)| t == w && d == "rbd3")) {
        let next = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
        let e = next.unwrap_or_else(|_| panic!("no action events in 10 s; saw {seen:?}"));
        let e = e.expect("the stream ended").expect("an event");
        seen.push((e.r#type, e.device));
    }
    let started = seen.iter().position(|(t, _)| *t == wanted[0]).expect("started");
    let finished = seen.iter().position(|(t, _)| *t == wanted[1]).expect("finished");
    assert!(started < finished, "{seen:?}");
    agent.stop().await.expect("stop");
}

/// A plan the agent died in the middle of (a simulated crash before its step reached the
/// kernel) is finished by the next Apply, which answers it in `resumed`.
#[tokio::test]
async fn the_next_apply_resumes_a_plan_a_crash_left_unfinished() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (world, agent, mut client) = agent_on("incident5", dir.path()).await;
    world.crash_next_step();
    let crashed = client.apply(release("rbd3", None)).await.expect_err("the acting thread died");
    assert_eq!(crashed.code(), tonic::Code::Internal, "{crashed:?}");
    assert_eq!(world.device("rbd3").expect("rbd3").holders.len(), 1, "the crash ran nothing");
    let answer = client.apply(release("rbd3", None)).await.expect("Apply").into_inner();
    assert_eq!(answer.resumed.len(), 1, "{answer:?}");
    assert_eq!(answer.resumed[0].device, "rbd3", "{answer:?}");
    assert!(world.device("rbd3").expect("rbd3").holders.is_empty());
    agent.stop().await.expect("stop");
}

/// A step the kernel fails is answered as failed, with the kernel's error, and the device keeps
/// its holder.
#[tokio::test]
async fn a_failing_step_is_answered_failed_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (world, agent, mut client) = agent_on("incident5", dir.path()).await;
    let rbd3 = world.device("rbd3").expect("rbd3");
    world.fail_steps_on(rbd3.device.devnum, "simulated EBUSY");
    let answer = client.apply(release("rbd3", None)).await.expect("Apply").into_inner();
    let results: Vec<(&str, &str)> =
        answer.results.iter().map(|r| (r.result.as_str(), r.detail.as_str())).collect();
    assert_eq!(results.len(), 1, "{answer:?}");
    assert_eq!(results[0].0, "failed", "{answer:?}");
    assert!(results[0].1.contains("simulated EBUSY"), "{answer:?}");
    assert_eq!(world.device("rbd3").expect("rbd3").holders.len(), 1);
    agent.stop().await.expect("stop");
}
