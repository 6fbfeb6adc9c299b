//! Scenarios against a real Ceph cluster (Debian's ceph packages: one monitor and one memstore
//! OSD in a network namespace of their own) with the guest mapping images through the kernel
//! client (`tests/ceph/`). Every client of the cluster runs inside that namespace or inside the
//! guest: nothing leaves the machine.
//!
//! Tests are named `root_ceph_*` and run one at a time (each brings a cluster up and down).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::guest::{guest_dir, stage_agent, Run};

/// Checks that Ceph tests can run: fails in CI, skips with a reason elsewhere.
pub fn require_ceph() -> bool {
    crate::require_real_kernel(&["ip", "strip", "timeout"])
}

/// Runs `tests/ceph/scenarios/<name>` through `agent-scenario.sh` with the agent staged.
pub fn run_ceph_scenario(name: &str) -> Run {
    let _serial = crate::serial();
    let extra = tempfile::tempdir().expect("tempdir");
    stage_agent(extra.path());
    let ceph = guest_dir().with_file_name("ceph");
    std::fs::copy(ceph.join("scenarios/rbd-common.sh"), extra.path().join("lib/rbd-common.sh"))
        .expect("copy rbd-common.sh");
    let out = Command::new(ceph.join("agent-scenario.sh"))
        .arg(ceph.join("scenarios").join(name))
        .arg(extra.path())
        .stdin(Stdio::null())
        .output()
        .expect("agent-scenario.sh");
    Run::from_output(&out)
}

/// A throw-away cluster (`cluster.sh up`) in a temp dir, taken down on drop (`cluster.sh down`
/// also ends anything still running in its network namespace: qemu, a console).
pub struct Cluster {
    pub dir: tempfile::TempDir,
    /// The cluster's network namespace (`BJ_CEPH_NETNS`).
    pub netns: String,
}

impl Cluster {
    /// `cluster.sh up`; panics with its log when it fails.
    pub fn up() -> Self {
        let dir = tempfile::Builder::new().prefix("bj-ceph-test.").tempdir().expect("tempdir");
        let c = dir.path().join("cluster");
        let out = Command::new(ceph_dir().join("cluster.sh"))
            .arg("up")
            .arg(&c)
            .stdin(Stdio::null())
            .output()
            .expect("cluster.sh up");
        let mut cluster = Self { dir, netns: String::new() };
        assert!(
            out.status.success(),
            "cluster.sh up failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let env = cluster.script("cluster.sh", &["env"]);
        cluster.netns = env
            .lines()
            .find_map(|l| l.trim().strip_prefix("export BJ_CEPH_NETNS="))
            .map(|v| v.trim_matches(|c| c == '\'' || c == '"').to_owned())
            .unwrap_or_else(|| panic!("no BJ_CEPH_NETNS in cluster.sh env:\n{env}"));
        cluster
    }

    /// The directories of a test with a guest, created beside the cluster's: `extra` (put into
    /// the guest, the agent staged in it), `share` (shared with the guest) and `host` (the host
    /// side's own files).
    pub fn guest_dirs(&self) -> (PathBuf, PathBuf, PathBuf) {
        let top = self.dir.path();
        let (extra, share, host) = (top.join("extra"), top.join("share"), top.join("host"));
        for d in [&extra, &share, &host] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        stage_agent(&extra);
        (extra, share, host)
    }

    /// Starts `guest-rbd.sh`: the qemu guest maps this cluster's image `vol` through the kernel
    /// client and runs `scenarios/<scenario>` with [`Cluster::guest_dirs`]'s `extra` and `share`,
    /// the guest's port 9443 forwarded to 127.0.0.1:`agent_port`, for at most `timeout_s`
    /// seconds; its output in `guest.out` and `guest.err` in the cluster's directory. Stopped
    /// (its process group) when dropped.
    pub fn start_rbd_guest(&self, scenario: &str, agent_port: u16, timeout_s: u32) -> Proc {
        use std::os::unix::process::CommandExt;
        let top = self.dir.path();
        let file = |name: &str| std::fs::File::create(top.join(name)).expect(name);
        Proc(
            Command::new(ceph_dir().join("guest-rbd.sh"))
                .arg(self.path())
                .arg(ceph_dir().join("scenarios").join(scenario))
                .arg(top.join("extra"))
                .env("BJ_CEPH_IMAGE", "vol")
                .env("BLOCKJANITOR_GUEST_SHARE", top.join("share"))
                .env("BLOCKJANITOR_GUEST_HOSTFWD", format!("tcp:127.0.0.1:{agent_port}-:9443"))
                .env("BLOCKJANITOR_GUEST_TIMEOUT", timeout_s.to_string())
                .stdin(Stdio::null())
                .stdout(file("guest.out"))
                .stderr(file("guest.err"))
                .process_group(0)
                .spawn()
                .expect("guest-rbd.sh"),
        )
    }

    /// The cluster's directory (`DIR` of cluster.sh and image.sh).
    pub fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("cluster")
    }

    /// `tests/ceph/<script> <verb> DIR args...` (every ceph client runs inside the namespace);
    /// panics unless it succeeds; its stdout.
    pub fn script(&self, script: &str, verb_args: &[&str]) -> String {
        let (verb, args) = verb_args.split_first().expect("a verb");
        let out = Command::new(ceph_dir().join(script))
            .arg(verb)
            .arg(self.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect(script);
        assert!(
            out.status.success(),
            "{script} {verb_args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `image.sh DIR args...`: e.g. `["status", "vol"]`.
    pub fn image(&self, args: &[&str]) -> String {
        let out = Command::new(ceph_dir().join("image.sh"))
            .arg(self.path())
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("image.sh");
        assert!(
            out.status.success(),
            "image.sh {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `ip netns exec NETNS program`: a command that runs inside the cluster's namespace (the
    /// only place its addresses and qemu's forwarded ports exist).
    pub fn command(&self, program: &std::path::Path) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.netns]).arg(program);
        c
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(ceph_dir().join("cluster.sh"))
            .arg("down")
            .arg(self.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `tests/ceph/`.
pub fn ceph_dir() -> std::path::PathBuf {
    guest_dir().with_file_name("ceph")
}

/// A process (group) that is stopped on drop: SIGTERM to its group, then SIGKILL.
pub struct Proc(pub std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        if matches!(self.0.try_wait(), Ok(None)) {
            let pgid = Pid::from_raw(-(self.0.id() as i32));
            let _ = kill(pgid, Signal::SIGTERM);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while std::time::Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = kill(pgid, Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

/// Waits (bounded) for a handshake file the guest writes into the share, while the guest runs.
pub fn wait_handshake(
    share: &std::path::Path,
    name: &str,
    guest: &mut Proc,
    out: &std::path::Path,
    secs: u64,
) -> String {
    let f = share.join(name);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Ok(text) = std::fs::read_to_string(&f) {
            return text;
        }
        if let Ok(Some(code)) = guest.0.try_wait() {
            panic!(
                "the guest ended ({code}) before the '{name}' handshake:\n{}\n--- harness ---\n{}",
                std::fs::read_to_string(out).unwrap_or_default(),
                std::fs::read_to_string(out.with_file_name("guest.err")).unwrap_or_default()
            );
        }
        assert!(std::time::Instant::now() < deadline, "no '{name}' handshake from the guest after {secs} s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Answers the guest's handshake `name` with `text`.
pub fn ack(share: &std::path::Path, name: &str, text: &str) {
    let tmp = share.join(".ack");
    std::fs::write(&tmp, format!("{text}\n")).expect("write ack");
    std::fs::rename(&tmp, share.join(format!("{name}.ack"))).expect("rename ack");
}

/// A stand-in API server listening on 127.0.0.1 of a cluster's network namespace (so a console
/// inside it reaches the API there); its runtime's threads live in that namespace and stop on
/// drop. The test reads and changes its state in memory, as any [`ApiServer`]'s.
pub struct NsApi {
    pub api: crate::kube_mock::ApiServer,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl NsApi {
    /// Starts it in `netns` (a name under /run/netns) with `node` as its Node object.
    pub fn start(netns: &str, node: serde_json::Value) -> Self {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let ns = netns.to_owned();
        let thread = std::thread::spawn(move || {
            crate::netns::NetNs::enter_named_thread(&ns);
            let rt = crate::rt();
            let api = rt.block_on(crate::kube_mock::ApiServer::start(node));
            tx.send(api).expect("send the API server");
            let _ = stopped.recv();
            drop(rt);
        });
        let api = rx.recv().expect("the API server started in the namespace");
        NsApi { api, stop: Some(stop), thread: Some(thread) }
    }
}

impl Drop for NsApi {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
