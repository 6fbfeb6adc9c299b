//! The gRPC Plan/Apply/WatchEvents suite, one set of scenes run on two hosts:
//!
//! - **the simulated host** (`blockjanitor::engine::sim`), without root: the agent's real
//!   service and daemon state on a unix socket in a temp dir; the scene is the real-kernel
//!   fixture tree `tests/fixtures/incident5` (rbd3 mounted only in a pod's namespace), read by
//!   the normal scan code, after which the sim keeps the state;
//! - **this machine's kernel**, as root (`root_*`): `blockjanitor-agent serve` on a loop
//!   device's ext4 filesystem mounted only inside another process's private mount namespace.
//!
//! Both are asked through the real tonic client (`blockjanitor_rpc::client`). What a scene
//! needs from its host (a changed identity, a step the kernel refuses, a crash before a step
//! reaches the kernel) is the [`Host`] trait: the sim's hooks on one side; on the kernel, a
//! loop number attached to another file, a mount locked in a user namespace's mount table
//! (`umount2` answers `EINVAL` there), and the journal's SIGKILL fault points.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use blockjanitor::engine::sim::SimWorld;
use blockjanitor::server::sim::SimAgent;
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_rpc::client::{connect, Target};
use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;
use tokio_stream::StreamExt;
use tonic::transport::Channel;

/// What a scene starts from: the device mounted only in a foreign mount namespace, where the
/// release may unmount it, or where the kernel refuses to.
#[derive(Clone, Copy, PartialEq)]
enum Start {
    ForeignMount,
    Unreleasable,
}

/// A host a scene runs on.
trait Host {
    /// The device the scene is about.
    fn device(&self) -> String;
    /// The agent's unix socket.
    fn socket(&self) -> PathBuf;
    /// Mounts of the device the host has now.
    fn mounts(&self) -> usize;
    /// Steps that reached the kernel so far.
    fn steps_run(&self) -> usize;
    /// A word the kernel's refusal of the release (in an [`Start::Unreleasable`] scene) says.
    fn refusal_word(&self) -> &'static str;
    /// The device becomes another one under its name, mounted as before.
    fn replace_device(&mut self);
    /// The agent dies right before its next step reaches the kernel.
    fn crash_before_next_step(&mut self);
    /// After that crash: the agent serves again.
    fn serve_again(&mut self);
}

/// The simulated host on the incident 5 fixture tree.
struct Sim {
    world: Arc<SimWorld>,
    agent: Option<SimAgent>,
    _dir: tempfile::TempDir,
}

impl Sim {
    async fn start(start: Start) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = fixtures().join("incident5");
        let world = Arc::new(SimWorld::from_fixture(&tree).expect("scan the fixture tree"));
        if start == Start::Unreleasable {
            let rbd3 = world.device("rbd3").expect("rbd3");
            world.fail_steps_on(rbd3.device.devnum, "simulated EINVAL");
        }
        let agent =
            SimAgent::start(Arc::clone(&world), dir.path()).await.expect("start the agent on the sim");
        Self { world, agent: Some(agent), _dir: dir }
    }

    async fn stop(mut self) {
        self.agent.take().expect("serving").stop().await.expect("stop");
    }
}

impl Host for Sim {
    fn device(&self) -> String {
        "rbd3".into()
    }
    fn socket(&self) -> PathBuf {
        self.agent.as_ref().expect("serving").socket.clone()
    }
    fn mounts(&self) -> usize {
        self.world.device("rbd3").expect("rbd3").holders.len()
    }
    fn steps_run(&self) -> usize {
        self.world.steps_run().len()
    }
    fn refusal_word(&self) -> &'static str {
        "simulated EINVAL"
    }
    fn replace_device(&mut self) {
        let rbd3 = self.world.device("rbd3").expect("rbd3");
        self.world.change_identity(rbd3.device.devnum);
    }
    fn crash_before_next_step(&mut self) {
        self.world.crash_next_step();
    }
    fn serve_again(&mut self) {
        // The sim's crash kills the acting thread only: the service stays up.
    }
}

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];

/// This machine's kernel: an ext4 loop device mounted only in another process's mount
/// namespace, and `blockjanitor-agent serve` (report mode, its journal in the scratch dir).
struct Kernel {
    s: Scratch,
    lo: LoopDev,
    /// The process whose mount namespace holds the device's one mount.
    ns: Option<NsProcess>,
    mnt: PathBuf,
    daemon: Option<Daemon>,
    replaced: usize,
}

impl Kernel {
    /// `None` when the real kernel is not available here (the reason printed; CI fails loudly).
    fn start(start: Start) -> Option<(std::sync::MutexGuard<'static, ()>, Self)> {
        let (serial, s) = real_kernel_test(TOOLS)?;
        let img = s.ext4_image("scene.img", 16);
        let lo = LoopDev::attach(&img);
        let mnt = s.mkdir("mnt");
        let ns = Some(match start {
            Start::ForeignMount => mounted_in_own_namespace(&lo, &mnt),
            Start::Unreleasable => locked_in_user_namespace(&lo, &mnt),
        });
        let daemon = Some(Daemon::start(s.dir.path(), &[]));
        Some((serial, Self { s, lo, ns, mnt, daemon, replaced: 0 }))
    }

    fn restart(&mut self, configure: impl FnOnce(&mut std::process::Command)) {
        drop(self.daemon.take());
        self.daemon = Some(Daemon::start_configured(self.s.dir.path(), &[], &[], configure));
    }
}

/// A process in a private mount namespace of its own that mounts `lo` on `mnt` there (the
/// host never sees the mount).
fn mounted_in_own_namespace(lo: &LoopDev, mnt: &Path) -> NsProcess {
    let ns = NsProcess::spawn(&format!("mount {} {} && exec sleep 600", lo.dev, mnt.display()));
    assert!(wait_until(REACT, || ns.has_mount(mnt)), "the namespace never mounted {}", lo.dev);
    ns
}

/// `lo` mounted on `mnt` here, copied into a user namespace's new mount namespace (where it
/// is locked), then unmounted here: its only mount is one the kernel will not unmount.
fn locked_in_user_namespace(lo: &LoopDev, mnt: &Path) -> NsProcess {
    let here = HostMount::new(&lo.dev, mnt, &[]);
    let ns = NsProcess::spawn_in_user_ns("exec sleep 600");
    assert!(wait_until(REACT, || ns.has_mount(mnt)), "the user namespace has no copy of {}", lo.dev);
    here.umount();
    assert!(ns.has_mount(mnt), "the copy in the user namespace went with the host's unmount");
    ns
}

impl Host for Kernel {
    fn device(&self) -> String {
        self.lo.name().to_owned()
    }
    fn socket(&self) -> PathBuf {
        self.daemon.as_ref().expect("serving").socket.clone()
    }
    fn mounts(&self) -> usize {
        usize::from(self.ns.as_ref().is_some_and(|ns| ns.has_mount(&self.mnt)))
    }
    fn steps_run(&self) -> usize {
        let journal = std::fs::read_to_string(self.s.path("journal.jsonl")).unwrap_or_default();
        journal.lines().filter(|l| l.contains("\"phase\":\"intent\"")).count()
    }
    fn refusal_word(&self) -> &'static str {
        "locked"
    }
    /// The namespace ends (and its mount with it), the loop number is detached and attached to
    /// a new image, which a new namespace mounts.
    fn replace_device(&mut self) {
        self.ns = None;
        sh("losetup", &["-d", &self.lo.dev]);
        self.replaced += 1;
        let img = self.s.ext4_image(&format!("replacement-{}.img", self.replaced), 16);
        let path = img.to_str().expect("utf8").to_owned();
        // The detach completes on the last close (a scan may hold it open a moment).
        assert!(
            wait_until(REACT, || std::process::Command::new("losetup")
                .args([self.lo.dev.as_str(), path.as_str()])
                .status()
                .is_ok_and(|s| s.success())),
            "cannot attach {} again",
            self.lo.dev
        );
        self.lo = LoopDev::adopt(self.lo.name(), &img);
        self.ns = Some(mounted_in_own_namespace(&self.lo, &self.mnt));
    }
    /// The agent runs again with the journal's fault point: SIGKILL right before it writes its
    /// first step's intent (the plan is journaled; nothing reached the kernel).
    fn crash_before_next_step(&mut self) {
        self.restart(|c| {
            c.env("BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD", "1");
        });
    }
    fn serve_again(&mut self) {
        let mut d = self.daemon.take().expect("the killed daemon");
        assert!(
            wait_until(Duration::from_secs(10), || d.child.try_wait().is_ok_and(|s| s.is_some())),
            "the fault point did not kill the daemon:\n{}",
            d.log_text()
        );
        self.restart(|_| {});
    }
}

async fn client(host: &impl Host) -> AgentClient<Channel> {
    connect(&Target::Unix(host.socket()), Duration::from_secs(10)).await.expect("connect")
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

/// Plan is a dry run: the release of the device's one foreign mount, bound to its identity, and
/// the host untouched; Apply with that identity detaches the mount, answers each step's result
/// and the device as it is afterwards, nothing resumed.
async fn plan_then_apply_with_identity(host: &mut impl Host) {
    let dev = host.device();
    let mut c = client(host).await;
    let plan = plan_release(&mut c, &dev).await;
    assert_eq!(plan.refusal, "", "{plan:?}");
    assert_eq!(plan.outcome, "done", "{plan:?}");
    assert!(plan.identity.starts_with(&format!("{dev}@")), "{plan:?}");
    let actions: Vec<&str> = plan.steps.iter().map(|s| s.action.as_str()).collect();
    assert_eq!(actions, ["detach_mount"], "{plan:?}");
    assert_eq!(host.steps_run(), 0, "Plan ran a step");
    assert_eq!(host.mounts(), 1, "Plan changed the host");

    let answer = c.apply(release(&dev, Some(&plan.identity))).await.expect("Apply").into_inner();
    let results: Vec<&str> = answer.results.iter().map(|r| r.result.as_str()).collect();
    assert_eq!(results, ["done"], "{answer:?}");
    assert!(answer.resumed.is_empty(), "{answer:?}");
    assert_eq!(answer.after.len(), 1, "{answer:?}");
    assert_eq!(answer.after[0].name, dev);
    assert!(answer.after[0].holders.is_empty(), "{dev} afterwards: {:?}", answer.after[0]);
    assert_eq!(host.mounts(), 0, "the mount is still there");
    assert_eq!(host.steps_run(), 1);
}

/// An identity taken before the device became another one is refused, naming the device, and
/// nothing runs: the new device keeps its mount.
async fn apply_refuses_a_changed_identity(host: &mut impl Host) {
    let dev = host.device();
    let plan = plan_release(&mut client(host).await, &dev).await;
    host.replace_device();
    let status =
        client(host).await.apply(release(&dev, Some(&plan.identity))).await.expect_err("a changed identity");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(status.message().contains(&dev), "{}", status.message());
    assert_eq!(host.steps_run(), 0, "a step ran");
    assert_eq!(host.mounts(), 1, "the new device lost its mount");
}

/// A watcher sees an Apply's ActionStarted and ActionFinished for the device, in that order.
async fn watch_events_show_an_applys_actions(host: &mut impl Host) {
    let dev = host.device();
    let mut c = client(host).await;
    let mut events = c.watch_events(pb::WatchEventsRequest::default()).await.expect("watch").into_inner();
    c.apply(release(&dev, None)).await.expect("Apply");
    let mut seen = Vec::new();
    let wanted = [pb::event::Type::ActionStarted as i32, pb::event::Type::ActionFinished as i32];
    while !wanted.iter().all(|w| seen.iter().any(|(t, d): &(i32, String)| t == w && *d == dev)) {
        let next = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
        let e = next.unwrap_or_else(|_| panic!("no action events in 10 s; saw {seen:?}"));
        let e = e.expect("the stream ended").expect("an event");
        seen.push((e.r#type, e.device));
    }
    let at = |t: i32| seen.iter().position(|(s, d)| *s == t && *d == dev).expect("seen");
    assert!(at(wanted[0]) < at(wanted[1]), "{seen:?}");
}

/// A plan the agent died in the middle of (before its step reached the kernel) is finished by
/// the next Apply, which answers it in `resumed`.
async fn the_next_apply_resumes_a_crashed_plan(host: &mut impl Host) {
    let dev = host.device();
    host.crash_before_next_step();
    let crashed = client(host).await.apply(release(&dev, None)).await;
    assert!(crashed.is_err(), "the agent died acting, yet answered {crashed:?}");
    assert_eq!(host.mounts(), 1, "the crash ran a step");
    assert_eq!(host.steps_run(), 0, "a step was journaled before the crash");
    host.serve_again();
    let answer = client(host).await.apply(release(&dev, None)).await.expect("Apply").into_inner();
    let resumed: Vec<&str> = answer.resumed.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(resumed, [dev.as_str()], "{answer:?}");
    assert_eq!(host.mounts(), 0, "the resumed plan left the mount");
}

/// A step the kernel refuses is answered as failed, with the kernel's reason, and the device
/// keeps its mount.
async fn a_refused_step_is_answered_failed_and_changes_nothing(host: &mut impl Host) {
    let dev = host.device();
    let answer = client(host).await.apply(release(&dev, None)).await.expect("Apply").into_inner();
    let results: Vec<(&str, &str)> =
        answer.results.iter().map(|r| (r.result.as_str(), r.detail.as_str())).collect();
    assert_eq!(results.len(), 1, "{answer:?}");
    assert_eq!(results[0].0, "failed", "{answer:?}");
    assert!(results[0].1.contains(host.refusal_word()), "{answer:?}");
    assert_eq!(host.mounts(), 1, "the refused step changed the host");
    assert_eq!(answer.after.len(), 1, "{answer:?}");
    assert!(!answer.after[0].holders.is_empty(), "the device is still held: {:?}", answer.after[0]);
}

/// Each scene on the simulated host (a normal user) and on this machine's kernel (root).
macro_rules! on_both_hosts {
    ($($scene:ident: $start:expr => $sim:ident, $real:ident;)*) => {$(
        #[tokio::test]
        async fn $sim() {
            let mut host = Sim::start($start).await;
            $scene(&mut host).await;
            host.stop().await;
        }

        #[test]
        fn $real() {
            let Some((_serial, mut host)) = Kernel::start($start) else { return };
            rt().block_on($scene(&mut host));
        }
    )*};
}

on_both_hosts! {
    plan_then_apply_with_identity: Start::ForeignMount
        => sim_plan_then_apply_with_identity_releases_the_foreign_mount,
           root_plan_then_apply_with_identity_releases_the_foreign_mount;
    apply_refuses_a_changed_identity: Start::ForeignMount
        => sim_apply_refuses_a_changed_identity_naming_the_device,
           root_apply_refuses_a_changed_identity_naming_the_device;
    watch_events_show_an_applys_actions: Start::ForeignMount
        => sim_watch_events_show_an_applys_action_events,
           root_watch_events_show_an_applys_action_events;
    the_next_apply_resumes_a_crashed_plan: Start::ForeignMount
        => sim_the_next_apply_resumes_a_plan_a_crash_left_unfinished,
           root_the_next_apply_resumes_a_plan_a_crash_left_unfinished;
    a_refused_step_is_answered_failed_and_changes_nothing: Start::Unreleasable
        => sim_a_refused_step_is_answered_failed_and_changes_nothing,
           root_a_mount_locked_in_a_user_namespace_is_answered_failed_and_changes_nothing;
}
