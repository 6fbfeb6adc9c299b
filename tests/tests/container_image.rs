//! The container proof: the runtime image, built from the repository's Dockerfile
//! (`--target runtime-prebuilt`, the binaries cargo built, the base swapped for a bookworm image
//! made here from Debian's packages, since registry images cannot be pulled), run as the
//! DaemonSet runs it (the `podman run` flags are derived from deploy/base/daemonset.yaml:
//! `--privileged --pid=host`, a read-only root, /sys, /dev and a kubelet-like directory with
//! HostToContainer = `rslave` propagation, the socket and state directories on host paths, the
//! config where the ConfigMap goes, the container's args), handles incident 5 from inside:
//!
//! an ext4 loop device is mounted on the host under the kubelet-like directory, a process in its
//! own mount namespace (`unshare -m --propagation private`) keeps a private copy, the host
//! unmounts; `agentctl` on the host, over the host path of the container's socket, shows that
//! process as the holder (and a cleanup `apply` refuses the held device); `agentctl apply
//! --release` (Apply with RELEASE) has the agent detach the holder's copy inside its namespace:
//! the process lives on, and `agentctl apply` then detaches the now unheld loop device. Throughout, the agent's own mount table (`/proc/<its host pid>/mountinfo`) drops the
//! device's mount as soon as the host unmounts it (the agent never becomes a holder itself), and
//! the host can detach the device at the end.
//!
//! The kubelet-like directory is a unique temporary directory made a shared bind mount, as kubelet
//! makes its root directory (this machine has no /var/lib/kubelet, and its / is not shared).
//!
//! Needs root, podman and runc, and (once, for the cached base image) mmdebstrap and Debian's
//! mirror; `CI=true` fails when one is missing, elsewhere the test is skipped with the reason.
//! The base image (`localhost/bookworm-base`) and its tarball under
//! `/var/cache/blockjanitor-test/` are kept between runs; the image under test is removed. Set `BLOCKJANITOR_IMAGE_BIN_DIR` to
//! build the image from other binaries (e.g. `target/release`); the image size and the agent's
//! RSS after a scan are printed (BENCHMARKS.md).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor_tests::container::{base_image, podman, run, BASE_IMAGE, CACHE, ULIMITS};
use blockjanitor_tests::deploy::{on_path, repo, require};
use blockjanitor_tests::{
    agent_bin, pid1_uninspectable, serial, sh, text, wait_until, HostMount, LoopDev, NsProcess, Scratch,
    TRUST_INIT_ENV,
};

/// The image under test: one tag per test process (removed at the end), so that two runs of the
/// suite on one machine never remove each other's image.
fn image() -> String {
    format!("localhost/blockjanitor:test-{}", std::process::id())
}

/// Builds the runtime image from the Dockerfile's `runtime-prebuilt` target, with the binaries
/// (debug sections stripped, as the Dockerfile's builder does) in a small build context.
fn build_image(bins: &Path, ctx: &Path) -> u64 {
    std::fs::create_dir_all(ctx.join("deploy/image")).expect("ctx");
    std::fs::create_dir_all(ctx.join("bin")).expect("ctx bin");
    for f in ["Dockerfile", ".dockerignore", "deploy/image/collect-rootfs.sh"] {
        std::fs::copy(repo().join(f), ctx.join(f)).unwrap_or_else(|e| panic!("copy {f}: {e}"));
    }
    let mut total = 0;
    for b in ["blockjanitor-agent", "agentctl", "blockjanitor-console"] {
        let out = ctx.join("bin").join(b);
        sh(
            "strip",
            &["--strip-debug", "-o", out.to_str().expect("utf8"), bins.join(b).to_str().expect("utf8")],
        );
        total += std::fs::metadata(&out).expect("stat").len();
    }
    let mut c = podman();
    c.arg("build")
        .args(ULIMITS)
        .args(["--layers=false", "--network", "none", "--target", "runtime-prebuilt"])
        .args(["--build-arg", &format!("BASE={BASE_IMAGE}"), "--build-arg", "BIN_DIR=bin"])
        .args(["-t", &image()])
        .arg(ctx);
    run(c, "podman build");
    total
}

/// The image built by this test; removed on drop (after the containers using it).
struct Image;

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", &image()]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

/// The agent's container; removed (with `podman rm -f`) on drop.
struct Container {
    name: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "5", &self.name]).stdout(Stdio::null()).status();
    }
}

impl Container {
    fn logs(&self) -> String {
        podman()
            .args(["logs", &self.name])
            .output()
            .map(|o| text(&o.stdout) + &text(&o.stderr))
            .unwrap_or_default()
    }

    fn host_pid(&self) -> u32 {
        let mut c = podman();
        c.args(["inspect", "--format", "{{.State.Pid}}", &self.name]);
        run(c, "podman inspect").trim().parse().expect("pid")
    }
}

/// The `podman run` flags and the agent's arguments that run the image as deploy/base's DaemonSet
/// runs it: hostPID, privileged, read-only root, every hostPath mount with its propagation
/// (HostToContainer = rslave, None = rprivate, Bidirectional = rshared) at the path `moved` gives
/// it, the config's parts in the directory `config` where the ConfigMap is mounted, and the container's args with
/// the downward API's NODE_NAME filled in.
fn as_the_daemonset_runs_it(
    moved: &dyn Fn(&str, &str) -> (String, String),
    config: &Path,
) -> (Vec<String>, Vec<String>) {
    use k8s_openapi::api::apps::v1::DaemonSet;
    let text = std::fs::read_to_string(repo().join("deploy/base/daemonset.yaml")).expect("daemonset.yaml");
    let ds: DaemonSet = serde_yaml_ng::from_str(&text).expect("a DaemonSet");
    let pod = ds.spec.and_then(|s| s.template.spec).expect("pod spec");
    let c = pod.containers.first().expect("a container");
    let mut flags = Vec::new();
    assert_eq!(pod.host_pid, Some(true), "the DaemonSet runs in the host's PID namespace");
    flags.push("--pid=host".to_owned());
    let sc = c.security_context.as_ref().expect("securityContext");
    if sc.privileged == Some(true) {
        flags.push("--privileged".to_owned());
    }
    if sc.read_only_root_filesystem == Some(true) {
        flags.push("--read-only".to_owned());
    }
    let volumes = pod.volumes.as_deref().unwrap_or_default();
    for m in c.volume_mounts.as_deref().unwrap_or_default() {
        let v = volumes.iter().find(|v| v.name == m.name).expect("the mount's volume");
        let ro = if m.read_only == Some(true) { ",ro" } else { "" };
        if let Some(h) = &v.host_path {
            let (src, dst) = moved(&h.path, &m.mount_path);
            let propagation = match m.mount_propagation.as_deref() {
                Some("HostToContainer") => "rslave",
                Some("Bidirectional") => "rshared",
                None | Some("None") => "rprivate",
                Some(other) => panic!("unknown mountPropagation {other}"),
            };
            flags.push("-v".to_owned());
            flags.push(format!("{src}:{dst}:{propagation}{ro}"));
        } else if v.config_map.is_some() {
            // The ConfigMap as a directory of parts (its keys), as kubelet mounts it.
            assert_eq!(m.sub_path, None, "the config is mounted as a directory of parts");
            assert!(config.is_dir(), "{} is the config's directory", config.display());
            flags.push("-v".to_owned());
            flags.push(format!("{}:{}:ro", config.display(), m.mount_path));
        } else {
            panic!("the DaemonSet mounts volume {} of a kind this test does not know", v.name);
        }
    }
    let mut args = c.args.clone().unwrap_or_default();
    for e in c.env.as_deref().unwrap_or_default() {
        let field = e.value_from.as_ref().and_then(|v| v.field_ref.as_ref()).map(|f| f.field_path.as_str());
        let value = match field {
            Some("spec.nodeName") => "container-node".to_owned(),
            Some(other) => panic!("env {} from {other}: unknown to this test", e.name),
            None => e.value.clone().unwrap_or_default(),
        };
        for a in &mut args {
            *a = a.replace(&format!("$({})", e.name), &value);
        }
    }
    assert!(args.iter().all(|a| !a.contains("$(")), "unresolved variables in {args:?}");
    (flags, args)
}

/// `agentctl holders DEV -o json`'s device, once the agent's scan shows `ok` of it (polled: the
/// daemon rescans every second).
fn device_until(socket: &Path, dev: &str, ok: impl Fn(&serde_json::Value) -> bool) -> (bool, String) {
    let mut last = String::new();
    let shown = wait_until(Duration::from_secs(20), || {
        let out = agentctl(socket, &["holders", dev, "-o", "json"]);
        last = format!("{}{}", text(&out.stdout), text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        ok(&v)
    });
    (shown, last)
}

/// A swap file turned on on the host; turned off on drop.
struct SwapOn(PathBuf);

impl Drop for SwapOn {
    fn drop(&mut self) {
        let _ = Command::new("swapoff").arg(&self.0).status();
    }
}

/// Issue 17, item 6: the agent in its container (its own root: the image) resolves the host's
/// paths on the host. The host's root disk is `protected` (not `in_use`), and a swap file the
/// host turned on, on a filesystem of a loop device, is that device's `swap` holder (before, the
/// container stat'ed `/` and the swap file in its own root: the root disk was only `in_use`, and
/// the swap file, missing there, blinded every device).
fn host_paths_are_resolved_on_the_host(s: &Scratch, socket: &Path, container: &Container) {
    use std::os::unix::fs::MetadataExt;
    let root_dev = std::fs::metadata("/").expect("stat /").dev();
    let (major, minor) = (libc::major(root_dev), libc::minor(root_dev));
    match std::fs::read_link(format!("/sys/dev/block/{major}:{minor}")) {
        Ok(link) if major != 0 => {
            let name = link.file_name().expect("name").to_string_lossy().into_owned();
            let (shown, last) = device_until(socket, &name, |d| d["verdict"] == "protected");
            assert!(
                shown,
                "the host's root disk {name} ({major}:{minor}) is not protected in the container's scan: {last}\nagent log:\n{}",
                container.logs()
            );
        }
        other => eprintln!(
            "note: the host's / is on {major}:{minor}, not a block device ({other:?}): its protection is not shown here"
        ),
    }
    let img = s.ext4_image("swapfs.img", 64);
    let lo = LoopDev::attach(&img);
    let dir = s.mkdir("swapfs");
    let fs = HostMount::new(&lo.dev, &dir, &[]);
    let file = dir.join("swapfile");
    let dir_text = dir.to_str().expect("utf8");
    sh("dd", &["if=/dev/zero", &format!("of={dir_text}/swapfile"), "bs=1M", "count=16", "status=none"]);
    sh("chmod", &["600", file.to_str().expect("utf8")]);
    sh("mkswap", &[file.to_str().expect("utf8")]);
    sh("swapon", &[file.to_str().expect("utf8")]);
    let swap = SwapOn(file.clone());
    assert!(
        std::fs::read_to_string("/proc/swaps").is_ok_and(|t| t.contains(file.to_str().expect("utf8"))),
        "the host's swap file is not active"
    );
    let want = file.to_string_lossy().into_owned();
    let (shown, last) = device_until(socket, lo.name(), |d| {
        d["holders"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|h| h["kind"] == "swap" && h["path"] == want.as_str()))
    });
    assert!(
        shown,
        "the host's swap file {want} is not a swap holder of {} in the container's scan: {last}\nagent log:\n{}",
        lo.dev,
        container.logs()
    );
    // The swap file blinds nothing: another device's view has no blind spot naming it.
    assert!(!last.contains("cannot resolve it on the host"), "{last}");
    drop(swap);
    drop(fs);
    drop(lo);
}

/// Issue 35 item 4: the agent, run as the DaemonSet runs it (the kubelet directory with
/// HostToContainer, no host root), holds no private copy of a live host mount: its namespace is
/// no pin risk. The holder's (`unshare -m`, propagation private) is, with its copy of the volume:
/// the agent in its container sees pin risks at all.
fn the_daemonset_is_no_pin_risk(socket: &Path, agent_pid: u32, holder: &NsProcess, dev: &str) {
    let ns = |pid: u32| {
        let link = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).expect("ns link");
        link.to_string_lossy()
            .trim_start_matches("mnt:[")
            .trim_end_matches(']')
            .parse::<u64>()
            .expect("inode")
    };
    let (agent_ns, holder_ns) = (ns(agent_pid), holder.ns_inode());
    let mut last = serde_json::Value::Null;
    let seen = wait_until(Duration::from_secs(20), || {
        let out = agentctl(socket, &["scan", "-o", "json"]);
        last = serde_json::from_slice(&out.stdout).unwrap_or_default();
        last["pin_risks"].as_array().is_some_and(|rs| {
            rs.iter().any(|r| {
                r["mount_namespace"].as_u64() == Some(holder_ns)
                    && r["copies"].as_array().is_some_and(|c| c.iter().any(|c| c["device"] == dev))
            })
        })
    });
    assert!(
        seen,
        "the holder's private copy of {dev} is no pin risk in the container's scan: {:#}",
        last["pin_risks"]
    );
    assert_eq!(last["pin_risks_checked"], true);
    let agents: Vec<&serde_json::Value> = last["pin_risks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["mount_namespace"].as_u64() == Some(agent_ns))
        .collect();
    assert!(agents.is_empty(), "the shipped DaemonSet is a pin risk: {agents:#?}");
}

/// `MAJ:MIN` of a block device.
fn devnum(name: &str) -> String {
    std::fs::read_to_string(format!("/sys/class/block/{name}/dev")).expect("dev").trim().to_owned()
}

/// Mount lines of `pid`'s namespace whose device is `maj_min` (mountinfo field 3).
fn mounts_of(pid: u32, maj_min: &str) -> Vec<String> {
    std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/mountinfo: {e}"))
        .lines()
        .filter(|l| l.split(' ').nth(2) == Some(maj_min))
        .map(str::to_owned)
        .collect()
}

fn agentctl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(agent_bin().with_file_name("agentctl"))
        .arg("--socket")
        .arg(socket)
        .args(["--timeout", "20"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run agentctl")
}

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS")
}

#[test]
fn root_container_runs_as_the_daemonset_and_releases_incident_5() {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_owned());
    }
    for t in [
        "podman",
        "runc",
        "strip",
        "losetup",
        "mkfs.ext4",
        "unshare",
        "mount",
        "umount",
        "mkswap",
        "swapon",
        "swapoff",
    ] {
        if on_path(t).is_none() {
            missing.push(format!("the {t} command"));
        }
    }
    let base_cached = on_path("podman").is_some()
        && podman().args(["image", "exists", BASE_IMAGE]).status().is_ok_and(|s| s.success());
    if !base_cached
        && !Path::new(CACHE).join("bookworm-minbase.tar").exists()
        && on_path("mmdebstrap").is_none()
    {
        missing.push("mmdebstrap (to build the bookworm base image once)".to_owned());
    }
    if !require("the container test", &missing) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();

    // The image.
    base_image();
    let bins = std::env::var_os("BLOCKJANITOR_IMAGE_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| agent_bin().parent().expect("bin dir").to_owned());
    let image_guard = Image;
    let bin_bytes = build_image(&bins, &s.path("context"));
    let mut c = podman();
    c.args(["image", "inspect", "--format", "{{.Size}}", &image()]);
    let size: u64 = run(c, "podman image inspect").trim().parse().expect("size");
    println!(
        "image {}: {size} bytes ({:.1} MB; binaries {bin_bytes} bytes, from {})",
        image(),
        size as f64 / 1e6,
        bins.display()
    );
    // The image is the two binaries and the libraries they load, nothing more (the bookworm
    // minbase it comes from is 170 MB).
    assert!(
        size < bin_bytes + 8_000_000,
        "the image holds more than the binaries and their libraries: {size} bytes"
    );
    if std::env::var_os("BLOCKJANITOR_IMAGE_BIN_DIR").is_some() {
        assert!(size < 60_000_000, "the runtime image is {size} bytes, over 60 MB");
    }
    let mut c = podman();
    c.args([
        "image",
        "inspect",
        "--format",
        "{{index .Labels \"org.opencontainers.image.title\"}}",
        &image(),
    ]);
    assert_eq!(run(c, "labels").trim(), "blockjanitor", "OCI labels");

    // Host paths as the DaemonSet mounts them; the kubelet-like directory at the same path inside
    // (mountinfo of host processes names host paths), HostToContainer = rslave.
    let kubelet = s.mkdir("kubelet");
    // As kubelet does with its root directory: a shared mount point, so that volumes mounted
    // under it reach the containers that mount it with HostToContainer (rslave) propagation.
    let kubelet_bind = HostMount::new(kubelet.to_str().expect("utf8"), &kubelet, &["--bind"]);
    sh("mount", &["--make-shared", kubelet.to_str().expect("utf8")]);
    let sock_dir = s.mkdir("run-blockjanitor");
    let state_dir = s.mkdir("var-lib-blockjanitor");
    let multipath_dir = s.mkdir("etc-multipath");
    let k = kubelet.to_str().expect("utf8").to_owned();
    // Host paths of the DaemonSet, moved for the test: the kubelet directory (at the same path
    // inside), the socket, state and multipath directories; /sys and /dev are the host's own.
    let moved = |host_path: &str, mount_path: &str| -> (String, String) {
        match host_path {
            "/var/lib/kubelet" => (k.clone(), k.clone()),
            "/run/blockjanitor" => (sock_dir.display().to_string(), mount_path.to_owned()),
            "/var/lib/blockjanitor" => (state_dir.display().to_string(), mount_path.to_owned()),
            // multipathd's wwids file: a scratch directory, never this machine's /etc/multipath.
            "/etc/multipath" => (multipath_dir.display().to_string(), mount_path.to_owned()),
            "/sys" | "/dev" => (host_path.to_owned(), mount_path.to_owned()),
            other => panic!("the DaemonSet mounts host path {other}, which this test does not know"),
        }
    };
    let start = |config: &Path, tag: &str| -> Container {
        let name = format!("bj-test-{}-{tag}", std::process::id());
        let (flags, args) = as_the_daemonset_runs_it(&moved, config);
        let mut c = podman();
        c.args(["run", "-d", "--name", &name]).args(ULIMITS).args(["--network", "none"]).args(&flags);
        if pid1_uninspectable() {
            c.args(["-e", &format!("{TRUST_INIT_ENV}=true")]);
        }
        c.arg(image())
            .args(["--kubelet-dir", &k, "--rescan-interval", "1", "--log-format", "json"])
            // No Kubernetes API here: the operator says so (without it the agent vouches for
            // nothing a PV could own, and refuses every Apply on such a device).
            .arg("--no-kubernetes")
            .args(&args)
            .args(["--grace-period", "0"]);
        run(c, "podman run");
        Container { name }
    };
    let socket = sock_dir.join("agent.sock");
    let reachable = |container: &Container| {
        assert!(
            wait_until(Duration::from_secs(30), || agentctl(&socket, &["node"]).status.success()),
            "agentctl on the host cannot reach the agent in the container at {}; its log:\n{}",
            socket.display(),
            container.logs()
        );
    };
    // First deploy/base's config: report mode.
    // deploy/base's ConfigMap as kubelet mounts it: a directory with its one part.
    let config_dir = s.mkdir("config.d");
    std::fs::copy(repo().join("deploy/base/agent.toml"), config_dir.join("00-agent.toml"))
        .expect("config part");
    let container = start(&config_dir, "report");
    reachable(&container);
    let agent_pid = container.host_pid();
    host_paths_are_resolved_on_the_host(&s, &socket, &container);

    // Incident 5 on the host, under the kubelet-like directory.
    let img = s.ext4_image("volume.img", 32);
    let lo = LoopDev::attach(&img);
    let dev = lo.name().to_owned();
    let maj_min = devnum(&dev);
    let target = kubelet.join("plugins/kubernetes.io/rbd/mounts/k8s-image-kubernetes-dynamic-pvc-c838");
    std::fs::create_dir_all(&target).expect("mkdir");
    let host_mount = HostMount::new(&lo.dev, &target, &[]);
    // Propagation is real: the host's mount appears in the agent's table (so its disappearance
    // below is the propagation at work, not a mount that was never there).
    assert!(
        wait_until(Duration::from_secs(5), || !mounts_of(agent_pid, &maj_min).is_empty()),
        "the host's mount did not propagate into the container (the DaemonSet's kubelet mount must be HostToContainer)"
    );
    // The kernel's word on whether anything claims the device: an exclusive open (closed at once,
    // so as not to become a holder in turn).
    let exclusive = || {
        nix::fcntl::open(
            Path::new(&lo.dev),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_EXCL | nix::fcntl::OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .is_ok()
    };
    let mut holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&target)), "the holder has its copy");
    the_daemonset_is_no_pin_risk(&socket, agent_pid, &holder, &dev);
    host_mount.umount();
    let agent_clean_of = |pid: u32| mounts_of(pid, &maj_min).is_empty();
    let agent_clean = || agent_clean_of(agent_pid);
    assert!(
        wait_until(Duration::from_secs(5), agent_clean),
        "the agent keeps the device's mount after the host unmounted it: {:?}",
        mounts_of(agent_pid, &maj_min)
    );
    assert!(holder.has_mount(&target), "the holder still pins the device (incident 5)");
    assert!(
        !exclusive(),
        "{dev} is free although the holder's copy is mounted: the check below would prove nothing"
    );

    // agentctl on the host shows the holder, by its pid.
    let mut last = String::new();
    let shown = wait_until(Duration::from_secs(20), || {
        let out = agentctl(&socket, &["holders", &dev, "-o", "json"]);
        last = format!("{}{}", text(&out.stdout), text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["holders"].as_array().is_some_and(|hs| {
            hs.iter().any(|h| {
                h["kind"] == "mount"
                    && h["pids"]
                        .as_array()
                        .is_some_and(|p| p.iter().any(|p| p.as_u64() == Some(u64::from(holder.pid()))))
            })
        })
    });
    assert!(
        shown,
        "agentctl does not show pid {} holding {dev}: {last}\nagent log:\n{}",
        holder.pid(),
        container.logs()
    );
    assert!(agent_clean(), "the agent became a holder while scanning");
    let rss = vm_rss_kib(agent_pid);
    println!("agent in the container (host pid {agent_pid}) after scans: VmRSS {rss} kB");

    // Report mode changes nothing by itself, and a held device is not cleaned on request either.
    let out = agentctl(&socket, &["apply", &dev, "--yes"]);
    let refused = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success() && refused.contains("in_use"), "a held device was not refused: {refused}");
    assert!(holder.has_mount(&target), "report mode released something");

    // The operator asks for the release (Apply with RELEASE): the agent enters the holder's mount
    // namespace from the container and detaches its copy; the process is not touched.
    let out = agentctl(&socket, &["apply", "--release", &dev, "--yes"]);
    last = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "agentctl apply --release {dev} --yes failed: {last}
agent log:
{}",
        container.logs()
    );
    println!("apply --release:\n{last}");
    assert!(last.contains("detach_mount") && last.contains("-> done"), "the plan released the copy: {last}");
    assert!(!holder.has_mount(&target), "the holder's copy is still mounted after the release: {last}");
    assert!(holder.is_alive(), "the holder process lives on");
    assert!(agent_clean(), "the agent holds no mount of {dev}");
    assert!(wait_until(Duration::from_secs(10), exclusive), "{dev} is still claimed after the release");
    let journal = std::fs::read_to_string(state_dir.join("journal.jsonl")).unwrap_or_default();
    assert!(
        journal.contains("detach_mount") && journal.contains(&dev),
        "journaled on the host path: {journal}"
    );

    // Now nothing holds the loop device: stale (grace 0), and agentctl apply on the host cleans it
    // through the container's agent.
    let applied = wait_until(Duration::from_secs(30), || {
        let out = agentctl(&socket, &["apply", &dev, "--yes"]);
        last = format!("{}{}", text(&out.stdout), text(&out.stderr));
        out.status.success()
    });
    assert!(applied, "agentctl apply {dev} --yes failed: {last}\nagent log:\n{}", container.logs());
    println!("apply:\n{last}");
    assert!(
        last.contains("detach_loop") && last.contains("-> done"),
        "the plan detached the loop device: {last}"
    );
    assert!(holder.is_alive());
    assert!(agent_clean_of(agent_pid), "the agent holds no mount of {dev}");

    // The device is free: no holder left, and the host can detach it (it may be gone already if
    // the plan detached it too).
    assert!(
        std::fs::read_dir(format!("/sys/class/block/{dev}/holders")).map_or(true, |mut d| d.next().is_none()),
        "{dev} has holders"
    );
    assert!(wait_until(Duration::from_secs(10), || !lo.is_bound()), "{dev} is still bound after the apply");
    assert!(!blockjanitor_tests::jbd2_alive(&dev), "the filesystem is really gone (jbd2/{dev} exited)");
    assert!(holder.is_alive());
    drop(container);
    drop(holder);
    drop(kubelet_bind);
    drop(image_guard);
}
