//! Shared helpers for blockjanitor's integration tests: the agent binary, and guards for the
//! real-kernel objects tests create (image files, loop devices, mounts, processes in their own
//! mount namespace) that clean up on drop, even when the test panics.
//!
//! Real-kernel tests are named `root_*`. They need root, `losetup`, `mkfs.ext4`, `unshare`. When
//! a prerequisite is missing they fail in CI (`CI=true`) and are skipped, with the reason printed,
//! elsewhere.

pub mod ceph;
pub mod child_log;
pub mod cluster_scene;
pub mod console;
pub mod container;
pub mod daemon;
pub mod deploy;
pub mod doc_commands;
pub mod explanation;
pub mod failover;
pub mod fixture;
pub mod fleet_bench;
pub mod guest;
pub mod http;
pub mod journal;
pub mod kube_mock;
pub mod kube_objects;
pub mod kube_portforward;
pub mod kube_reads;
pub mod kube_review;
pub mod lease_mock;
pub mod load;
pub mod measure;
pub mod netns;
pub mod readme;
pub mod standin_fleet;
pub mod stepping_agent;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Real-kernel tests take this lock: a test that starts a process with its own mount namespace
/// copies every mount that exists at that moment, including other tests' (incident 5 between
/// tests), so they run one at a time.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A multi-threaded tokio runtime with every driver, for a synchronous test's async parts.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

/// A path as the UTF-8 text a command line takes.
pub fn utf8(p: &Path) -> &str {
    p.to_str().expect("utf8 path")
}

/// Path of the `blockjanitor-agent` binary built next to this test executable.
pub fn agent_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let bin = dir.join("blockjanitor-agent");
    assert!(
        bin.exists(),
        "{} is missing: build it first (cargo build --workspace --bins), or run the README's test command",
        bin.display()
    );
    bin
}

/// Runs the agent with `args`; returns the output. [`trust_init`] applies.
pub fn agent(args: &[&str]) -> Output {
    trust_init(&mut Command::new(agent_bin()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run blockjanitor-agent")
}

/// The variable that tells the agent to trust a PID 1 it cannot inspect (`--trust-unreadable-init`).
pub const TRUST_INIT_ENV: &str = "BLOCKJANITOR_TRUST_UNREADABLE_INIT";

/// True when PID 1 cannot be inspected on this machine (`/proc/1/ns/mnt` is unreadable even to
/// root: a sandbox supervisor or an LSM shields it). The agent then counts PID 1 as a blind spot,
/// which makes every cleanup candidate `unknown`. Says why on stderr the first time.
pub fn pid1_uninspectable() -> bool {
    static WHY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    WHY.get_or_init(|| {
        let why = std::fs::read_link("/proc/1/ns/mnt").err().map(|e| e.to_string());
        if let Some(e) = &why {
            eprintln!(
                "note: PID 1 cannot be inspected here (readlink /proc/1/ns/mnt: {e}); the agent runs with {TRUST_INIT_ENV}=true"
            );
        }
        why
    })
    .is_some()
}

/// Sets [`TRUST_INIT_ENV`] on `cmd` exactly when [`pid1_uninspectable`] (and removes it
/// otherwise): the agent, or a wrapper (`unshare`, `setpriv`) that execs it. The agent never
/// finds a cluster around a test (`KUBERNETES_SERVICE_HOST`, `NODE_NAME` removed): a test
/// names its API (a stand-in on loopback) or none.
pub fn trust_init(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("KUBERNETES_SERVICE_HOST").env_remove("KUBERNETES_SERVICE_PORT").env_remove("NODE_NAME");
    if pid1_uninspectable() {
        cmd.env(TRUST_INIT_ENV, "true")
    } else {
        cmd.env_remove(TRUST_INIT_ENV)
    }
}

/// Runs the agent and parses its stdout as JSON, asserting the exit code.
pub fn agent_json(args: &[&str], code: i32) -> serde_json::Value {
    let out = agent(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "blockjanitor-agent {args:?}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

/// `blockjanitor-agent ARGS holders DEVICE --output json` (ARGS: global flags): the `device`
/// document (the device's fields at its top level), checking that its exit code says what the
/// report does, as `fuser -s` would: 2 when it names a holder, 0 when
/// none (or 3 when none is seen and a blind spot could hide one).
pub fn agent_holders(args: &[&str], device: &str) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["holders", device, "--output", "json"]);
    let out = agent(&all);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", text(&out.stdout), text(&out.stderr)));
    let held = v["holders"].as_array().is_some_and(|h| !h.is_empty());
    let blind = v["complete"] == false;
    let want = if held {
        2
    } else if blind {
        3
    } else {
        0
    };
    assert_eq!(
        out.status.code(),
        Some(want),
        "blockjanitor-agent {all:?}: {v:#}\nstderr: {}",
        text(&out.stderr)
    );
    v
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The device `name` in a `devices` document (`scan --output json`).
pub fn find_device<'a>(scan: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    scan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {scan:#}"))
}

/// A blind spot as the documents print it (`WHAT (could hide a holder of DEVICES)`): what could
/// not be read, and which devices it could hide a holder of (`any device`, or names).
pub fn blind_spot_parts(spot: &str) -> (String, String) {
    match spot.rsplit_once(" (could hide a holder of ") {
        Some((what, hide)) => (what.to_owned(), hide.trim_end_matches(')').to_owned()),
        None => (spot.to_owned(), String::new()),
    }
}

/// The command names of a device's `kernel_threads` (each `COMM (pid N)`).
pub fn kernel_thread_names(device: &serde_json::Value) -> Vec<String> {
    let threads = device["kernel_threads"].as_array().expect("kernel_threads");
    threads
        .iter()
        .filter_map(|k| k.as_str())
        .map(|k| k.rsplit_once(" (pid ").map_or(k, |(comm, _)| comm).to_owned())
        .collect()
}

/// The tests crate's directory (for fixtures).
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// Checks the prerequisites of a real-kernel test. Returns false (after printing why) when the
/// test should be skipped; panics instead when `CI=true`.
pub fn require_real_kernel(tools: &[&str]) -> bool {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_owned());
    }
    for t in tools {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).exists()))
            .unwrap_or(false);
        if !found {
            missing.push(format!("the {t} command"));
        }
    }
    require("real-kernel test", &missing)
}

/// Returns true when nothing is missing; otherwise panics under `CI=true`, or prints SKIPPED
/// with the reasons and returns false.
pub fn require(test: &str, missing: &[String]) -> bool {
    if missing.is_empty() {
        return true;
    }
    let msg = format!("{test} needs {}", missing.join(", "));
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg} (CI=true: failing instead of skipping)");
    }
    eprintln!("SKIPPED: {msg}");
    false
}

/// The start of a real-kernel test: `None` (the test returns, skipped) when
/// [`require_real_kernel`] says a prerequisite is missing, else the [`serial`] lock and a fresh
/// [`Scratch`]: `let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };`.
pub fn real_kernel_test(tools: &[&str]) -> Option<(std::sync::MutexGuard<'static, ()>, Scratch)> {
    if !require_real_kernel(tools) {
        return None;
    }
    let serial = serial();
    Some((serial, Scratch::new()))
}

/// A child process killed (SIGKILL) and reaped on drop, even when the test panics.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs a command, panicking with its output when it fails.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out =
        Command::new(cmd).args(args).stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Polls `f` until it returns true or `timeout` passes.
/// How long a test gives the daemon to react to something (a uevent, a mount, an API change)
/// before it calls the reaction missing. Generous because CI is 2 cores shared with builds and
/// qemu guests; a wait ends as soon as its condition holds, so passing runs are not slower.
pub const REACT: Duration = Duration::from_secs(60);

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// A scratch directory with an ext4 image file in it.
pub struct Scratch {
    pub dir: tempfile::TempDir,
}

impl Scratch {
    pub fn new() -> Self {
        // Under /var/tmp: /tmp may be tmpfs, and tests want a real block-device filesystem too.
        Self { dir: tempfile::Builder::new().prefix("bj-test-").tempdir_in("/var/tmp").expect("tempdir") }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Makes `name` a `mb` MiB ext4 image and returns its path.
    pub fn ext4_image(&self, name: &str, mb: u64) -> PathBuf {
        let p = self.sparse_file(name, mb);
        sh("mkfs.ext4", &["-q", "-F", p.to_str().expect("utf8")]);
        p
    }

    /// A btrfs image `name` (btrfs needs about 110 MiB at least; the file is sparse).
    pub fn btrfs_image(&self, name: &str) -> PathBuf {
        let p = self.sparse_file(name, 128);
        sh("mkfs.btrfs", &["-q", "-f", utf8(&p)]);
        p
    }

    /// A sparse file `name` of `mb` MiB.
    pub fn sparse_file(&self, name: &str, mb: u64) -> PathBuf {
        let p = self.path(name);
        std::fs::File::create(&p).expect("create image").set_len(mb << 20).expect("size image");
        p
    }

    /// A loop device on a fresh sparse file `name` of 8 MiB.
    pub fn loop_file(&self, name: &str) -> LoopDev {
        LoopDev::attach(&self.sparse_file(name, 8))
    }

    /// A fresh 32 MiB ext4 image `image` mounted on `target` with `mount -o loop` (so the loop
    /// device has autoclear set, as kubelet's mounts and the incident's have): the mount guard
    /// and the loop device guard.
    pub fn loop_mount(&self, image: &str, target: &Path) -> (HostMount, LoopDev) {
        let img = self.ext4_image(image, 32);
        let m = HostMount::new(img.to_str().expect("utf8"), target, &["-o", "loop"]);
        let name = loop_for(&img).expect("mount -o loop made a loop device");
        (m, LoopDev::adopt(&name, &img))
    }

    /// A kubelet directory `kubelet` with one CSI volume `pv` of node `node-a` staged the
    /// pre-1.24 way (`vol_data.json`, an empty `globalmount`) and no pod using it; returns the
    /// kubelet directory and the globalmount.
    pub fn staged_csi_volume(&self, pv: &str) -> (PathBuf, PathBuf) {
        let kdir = self.mkdir("kubelet");
        let pv_dir = kdir.join(format!("plugins/kubernetes.io/csi/pv/pvc-{pv}"));
        let gm = pv_dir.join("globalmount");
        std::fs::create_dir_all(&gm).expect("mkdir globalmount");
        let vol_data = serde_json::json!({
            "driverName": "rbd.csi.ceph.com",
            "specVolID": format!("pvc-{pv}"),
            "volumeHandle": format!("0001-0024-{pv}"),
            "attachmentID": format!("csi-{pv}"),
            "nodeName": "node-a",
            "volumeLifecycleMode": "Persistent",
        });
        std::fs::write(pv_dir.join("vol_data.json"), vol_data.to_string()).expect("vol_data.json");
        (kdir, gm)
    }

    /// Makes an empty directory `name` and returns its path.
    pub fn mkdir(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::create_dir_all(&p).expect("mkdir");
        p
    }
}

impl Default for Scratch {
    fn default() -> Self {
        Self::new()
    }
}

/// A loop device bound to a file; detached on drop (if still bound to that file).
pub struct LoopDev {
    pub dev: String,
    backing: PathBuf,
}

impl LoopDev {
    /// `losetup -f --show FILE`.
    pub fn attach(file: &Path) -> Self {
        let f = file.to_str().expect("utf8");
        let dev = sh("losetup", &["-f", "--show", f]).trim().to_owned();
        Self { dev, backing: file.to_owned() }
    }

    /// Takes charge of a loop device someone else bound (e.g. `mount -o loop`).
    pub fn adopt(name: &str, file: &Path) -> Self {
        Self { dev: format!("/dev/{name}"), backing: file.to_owned() }
    }

    /// `loop3` for `/dev/loop3`.
    pub fn name(&self) -> &str {
        self.dev.trim_start_matches("/dev/")
    }

    /// True while the kernel still has this loop device bound to our file.
    pub fn is_bound(&self) -> bool {
        std::fs::read_to_string(format!("/sys/class/block/{}/loop/backing_file", self.name()))
            .is_ok_and(|b| b.trim_end().trim_end_matches(" (deleted)") == self.backing.to_string_lossy())
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        if self.is_bound() {
            let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        }
    }
}

/// A mount in this (the host's) namespace; lazily unmounted on drop if still there.
pub struct HostMount {
    pub target: PathBuf,
}

impl HostMount {
    pub fn new(source: &str, target: &Path, opts: &[&str]) -> Self {
        let mut args: Vec<&str> = opts.to_vec();
        args.push(source);
        args.push(target.to_str().expect("utf8"));
        sh("mount", &args);
        Self { target: target.to_owned() }
    }

    pub fn is_mounted(&self) -> bool {
        let t = self.target.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(t.as_str())))
    }

    /// Unmounts now (normal umount, as the host would).
    pub fn umount(&self) {
        sh("umount", &[self.target.to_str().expect("utf8")]);
    }
}

impl Drop for HostMount {
    fn drop(&mut self) {
        while self.is_mounted() {
            if !Command::new("umount").arg("-l").arg(&self.target).status().is_ok_and(|s| s.success()) {
                break;
            }
        }
    }
}

/// A process started with `unshare -m --propagation private` (its own mount namespace, a
/// private copy of every mount that existed when it started); killed on drop.
pub struct NsProcess {
    pub child: Child,
}

impl NsProcess {
    /// Runs `sh -c script` in a new private mount namespace.
    pub fn spawn(script: &str) -> Self {
        Self::spawn_with("private", script)
    }

    /// Runs `sh -c script` in a new mount namespace with the given propagation of its copies
    /// (`unshare --propagation private|slave|shared|unchanged`).
    pub fn spawn_with(propagation: &str, script: &str) -> Self {
        Self::spawn_unshared(&["-m", "--propagation", propagation], script)
    }

    /// Runs `sh -c script` as root of a new user namespace, in a new private mount namespace
    /// that namespace owns (`unshare -U -r -m`), as a user-namespaced pod or a rootless
    /// container does: every mount it copies from ours is locked there (`MNT_LOCKED`), and the
    /// kernel refuses to unmount it inside (`EINVAL`).
    pub fn spawn_in_user_ns(script: &str) -> Self {
        Self::spawn_unshared(&["-U", "-r", "-m", "--propagation", "private"], script)
    }

    fn spawn_unshared(flags: &[&str], script: &str) -> Self {
        use std::os::unix::process::CommandExt;
        // A process group of its own: what the script starts in the background dies with it
        // (left running, it would keep the namespace, its mounts and their devices busy).
        let child = Command::new("unshare")
            .args(flags)
            .args(["sh", "-c", script])
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .expect("spawn unshare");
        let p = Self { child };
        let me = std::fs::read_link("/proc/self/ns/mnt").expect("own ns");
        let pid = p.pid();
        assert!(
            wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .is_ok_and(|n| n != me)),
            "process {pid} never entered its own mount namespace"
        );
        p
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The namespace inode.
    pub fn ns_inode(&self) -> u64 {
        let link = std::fs::read_link(format!("/proc/{}/ns/mnt", self.pid())).expect("ns link");
        let s = link.to_string_lossy();
        s.trim_start_matches("mnt:[").trim_end_matches(']').parse().expect("inode")
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// True once the process's own mountinfo shows `path` mounted.
    pub fn has_mount(&self, path: &Path) -> bool {
        let t = path.to_string_lossy().into_owned();
        std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid()))
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(t.as_str())))
    }
}

impl Drop for NsProcess {
    /// Kills the script and everything it started (its process group), then reaps the script.
    fn drop(&mut self) {
        // SAFETY: kill(2) on the process group this struct made (its leader is not reaped yet).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `jbd2/<dev>-8` kernel thread exists for this device.
pub fn jbd2_alive(dev_name: &str) -> bool {
    let want = format!("jbd2/{dev_name}-");
    std::fs::read_dir("/proc").into_iter().flatten().flatten().any(|e| {
        std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim_end().starts_with(&want))
    })
}

/// Loop device currently bound to `file`, via sysfs.
pub fn loop_for(file: &Path) -> Option<String> {
    let want = file.to_string_lossy().into_owned();
    std::fs::read_dir("/sys/class/block").ok()?.flatten().find_map(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        let b = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
        (b.trim_end() == want).then_some(name)
    })
}
