//! Real-kernel acceptance test for issue 13, "Hung devices": a process blocked in D state on a
//! device, and a filesystem whose server stopped answering, never stall scans or the API; the
//! device is reported unresponsive, and all is normal once the server answers again.
//!
//! The scene: a FUSE filesystem (`tests/fuse/hangfs.c`, built here against Debian's libfuse3)
//! exposes one file; a loop device is bound to it (buffered, not direct I/O); `dd iflag=direct`
//! reads the loop device over and over, and another process keeps its working directory inside
//! the FUSE mount. Then the server is stopped (SIGSTOP): the loop device's I/O hangs in the FUSE
//! request queue and the reader sits in D state, as with a backing file on a dead NFS or FUSE
//! server. While it hangs, for 30 s, a client calls ListDevices and GetNode back to back and keeps
//! a WatchEvents stream open. Then the server resumes (SIGCONT).
//!
//! Every object is owned by [`Scene`], whose drop resumes the server first (a process in D state
//! cannot even be killed until its I/O completes), then kills the processes, detaches the loop
//! device, stops the server and unmounts, even when an assertion fails.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::http::http_get;
use blockjanitor_tests::*;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio_stream::StreamExt;

const TOOLS: &[&str] = &["losetup", "cc", "pkg-config", "dd", "umount", "sh"];
/// How long the server stays stopped.
const HANG: Duration = Duration::from_secs(30);
/// The agent's threshold in this test (`--unresponsive-after`).
const UNRESPONSIVE_AFTER: &str = "3";
/// The latency the API must keep while the device hangs, at the 99th percentile.
const P99_LIMIT: Duration = Duration::from_millis(100);

/// Like [`require_real_kernel`], for what it cannot check: fuse3's headers and `/dev/fuse`.
fn require_fuse() -> bool {
    let mut missing = Vec::new();
    let dev = Command::new("pkg-config").args(["--exists", "fuse3"]).status().is_ok_and(|s| s.success());
    if !dev {
        missing.push("libfuse3's headers (Debian: libfuse3-dev; scripts/test.sh installs it)".to_owned());
    }
    if !Path::new("/dev/fuse").exists() {
        missing.push("/dev/fuse".to_owned());
    }
    require("the hung-device test", &missing)
}

/// Builds `hangfs` into `dir`.
fn build_hangfs(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuse/hangfs.c");
    let flags = sh("pkg-config", &["--cflags", "--libs", "fuse3"]);
    let bin = dir.join("hangfs");
    let mut args: Vec<&str> =
        vec!["-O1", "-Wall", "-o", bin.to_str().expect("utf8"), src.to_str().expect("utf8")];
    args.extend(flags.split_whitespace());
    sh("cc", &args);
    bin
}

/// A process group (a shell and what it runs), killed whole on drop.
struct Group(Child);

impl Group {
    fn spawn(script: &str) -> Self {
        let child = Command::new("sh")
            .args(["-c", script])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sh");
        Self(child)
    }

    fn pgid(&self) -> Pid {
        Pid::from_raw(self.0.id() as i32)
    }

    /// The processes of the group with their state letter (`/proc/PID/stat` field 3).
    fn members(&self) -> Vec<(u32, char)> {
        let pgid = self.0.id().to_string();
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
            let Some((_, rest)) = stat.rsplit_once(')') else { continue };
            let f: Vec<&str> = rest.split_whitespace().collect();
            if f.get(2) == Some(&pgid.as_str()) {
                out.push((pid, f[0].chars().next().unwrap_or('?')));
            }
        }
        out
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        let _ = killpg(self.pgid(), Signal::SIGKILL);
        let _ = self.0.wait();
    }
}

/// The FUSE server, the loop device on its file, the reader and the process whose cwd is on it.
struct Scene {
    mnt: PathBuf,
    server: Child,
    lo: Option<LoopDev>,
    reader: Option<Group>,
    cwd_holder: Option<Group>,
}

impl Scene {
    fn new(s: &Scratch) -> Self {
        let hangfs = build_hangfs(s.dir.path());
        let mnt = s.mkdir("fuse");
        let server = Command::new(&hangfs)
            .arg(&mnt)
            .arg("64")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn hangfs");
        let mut scene = Self { mnt, server, lo: None, reader: None, cwd_holder: None };
        let img = scene.mnt.join("disk.img");
        assert!(
            wait_until(Duration::from_secs(10), || scene.is_mounted() && img.exists()),
            "hangfs never mounted {}",
            scene.mnt.display()
        );
        let lo = LoopDev::attach(&img);
        let dio =
            std::fs::read_to_string(format!("/sys/class/block/{}/loop/dio", lo.name())).unwrap_or_default();
        assert_eq!(dio.trim(), "0", "the loop device must go through the backing file's page cache path");
        scene.reader = Some(Group::spawn(&format!(
            "while :; do dd if={} of=/dev/null bs=64k iflag=direct 2>/dev/null; done",
            lo.dev
        )));
        scene.cwd_holder = Some(Group::spawn(&format!("cd '{}' && exec sleep 100000", scene.mnt.display())));
        scene.lo = Some(lo);
        scene
    }

    fn is_mounted(&self) -> bool {
        let t = self.mnt.to_string_lossy().into_owned();
        std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(t.as_str())))
    }

    fn lo(&self) -> &LoopDev {
        self.lo.as_ref().expect("loop device")
    }

    fn signal_server(&self, sig: Signal) {
        kill(Pid::from_raw(self.server.id() as i32), sig).expect("signal hangfs");
    }

    /// The reader's processes in D state.
    fn stuck_readers(&self) -> Vec<u32> {
        let r = self.reader.as_ref().expect("reader");
        r.members().into_iter().filter(|(_, s)| *s == 'D').map(|(p, _)| p).collect()
    }

    /// (I/Os completed, I/Os in flight) of the loop device, from sysfs.
    fn io(&self) -> (u64, u64) {
        let text =
            std::fs::read_to_string(format!("/sys/class/block/{}/stat", self.lo().name())).expect("stat");
        let s = blockjanitor::discover::iostat::parse(&text).expect("parses");
        (s.completed, s.in_flight)
    }
}

impl Drop for Scene {
    fn drop(&mut self) {
        // Resume first: processes in D state die only once their I/O completes.
        let pid = Pid::from_raw(self.server.id() as i32);
        let _ = kill(pid, Signal::SIGCONT);
        self.reader.take();
        self.cwd_holder.take();
        self.lo.take();
        let _ = kill(pid, Signal::SIGTERM);
        let start = Instant::now();
        while matches!(self.server.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
        while self.is_mounted() {
            if !Command::new("umount").arg("-l").arg(&self.mnt).status().is_ok_and(|s| s.success()) {
                break;
            }
        }
    }
}

/// The 99th percentile (nearest rank) and the largest of some latencies.
fn p99_and_max(mut v: Vec<Duration>) -> (Duration, Duration) {
    assert!(!v.is_empty(), "no calls measured");
    v.sort();
    let rank = (v.len() * 99).div_ceil(100).max(1);
    (v[rank - 1], v[v.len() - 1])
}

/// The `blockjanitor_device_unresponsive` series of one device, if exported.
fn unresponsive_series(metrics: &str, device: &str) -> Option<String> {
    let label = format!("device=\"{device}\"");
    metrics
        .lines()
        .find(|l| l.starts_with("blockjanitor_device_unresponsive{") && l.contains(&label))
        .map(str::to_owned)
}

#[test]
fn root_hung_fuse_backed_loop_device_is_reported_unresponsive_and_never_stalls_the_api() {
    if !require_real_kernel(TOOLS) || !require_fuse() {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let scene = Scene::new(&s);
    let name = scene.lo().name().to_owned();
    let d = Daemon::start_with_global(
        s.dir.path(),
        &["--rescan-interval", "1"],
        &["--metrics-listen", "127.0.0.1:0", "--unresponsive-after", UNRESPONSIVE_AFTER],
    );
    let metrics = d.metrics.expect("metrics address");
    rt().block_on(async {
        let mut c = unix_client(&d.socket).await;
        let device = |devices: &[pb::Device]| devices.iter().find(|x| x.name == name).cloned();

        // Before: the loop device is seen, busy and answering.
        let start = Instant::now();
        let before = loop {
            let r = c.list_devices(pb::ListDevicesRequest::default()).await.expect("ListDevices").into_inner();
            if let Some(dev) = device(&r.devices) {
                break dev;
            }
            assert!(start.elapsed() < REACT, "{name} never showed up in ListDevices");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(!before.unresponsive, "answering before the server stops: {before:?}");

        // The event stream, collected on its own task.
        let mut stream = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();
        let (ev_tx, mut ev_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, pb::Event)>();
        let watcher = tokio::spawn(async move {
            while let Some(e) = stream.next().await {
                match e {
                    Ok(e) => {
                        if ev_tx.send((Instant::now(), e)).is_err() {
                            return true;
                        }
                    }
                    Err(_) => return false,
                }
            }
            false // the stream ended: the server closed it
        });

        // The server stops answering: the reader blocks in D state on the loop device.
        scene.signal_server(Signal::SIGSTOP);
        let hang_start = Instant::now();
        assert!(
            wait_until(Duration::from_secs(10), || !scene.stuck_readers().is_empty()),
            "the reader never blocked in D state after the FUSE server stopped"
        );
        let stuck = scene.stuck_readers();
        let (hung_completed, in_flight) = scene.io();
        assert!(in_flight > 0, "the loop device has I/O in flight while the reader is stuck");
        let node_before = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();

        // While it hangs: ListDevices and GetNode back to back, each timed.
        let mut list_ms = Vec::new();
        let mut node_ms = Vec::new();
        let mut seen_unresponsive: Option<pb::Device> = None;
        let mut last_node = node_before.clone();
        while hang_start.elapsed() < HANG {
            let t = Instant::now();
            let r = tokio::time::timeout(Duration::from_secs(5), c.list_devices(pb::ListDevicesRequest::default()))
                .await
                .expect("ListDevices answered within 5 s while the device hangs")
                .expect("ListDevices");
            list_ms.push(t.elapsed());
            if let Some(dev) = device(&r.into_inner().devices).filter(|d| d.unresponsive) {
                seen_unresponsive = Some(dev);
            }
            let t = Instant::now();
            last_node = tokio::time::timeout(Duration::from_secs(5), c.get_node(pb::GetNodeRequest {}))
                .await
                .expect("GetNode answered within 5 s while the device hangs")
                .expect("GetNode")
                .into_inner();
            node_ms.push(t.elapsed());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let still_stuck: Vec<u32> = scene.stuck_readers();
        assert!(
            !still_stuck.is_empty() && scene.io().0 == hung_completed,
            "the hang lasted the whole window (readers in D state {stuck:?} at the start, {still_stuck:?} at the end)"
        );
        let metrics_hung = tokio::task::spawn_blocking(move || http_get(metrics, "/metrics")).await.expect("metrics");

        let (list_p99, list_max) = p99_and_max(list_ms.clone());
        let (node_p99, node_max) = p99_and_max(node_ms.clone());
        let scans = last_node.scans - node_before.scans;
        eprintln!(
            "hung {:?}: ListDevices {} calls p99 {list_p99:?} max {list_max:?}; GetNode {} calls p99 {node_p99:?} max {node_max:?}; {scans} scans completed, the last took {:.1} ms",
            HANG,
            list_ms.len(),
            node_ms.len(),
            last_node.last_scan_duration_ms
        );
        assert!(list_p99 <= P99_LIMIT, "ListDevices p99 {list_p99:?} > {P99_LIMIT:?} while the device hangs");
        assert!(node_p99 <= P99_LIMIT, "GetNode p99 {node_p99:?} > {P99_LIMIT:?} while the device hangs");
        // Rescans every second: a scan stuck on the hung device would stop the count.
        assert!(scans >= 10, "only {scans} scans completed in {HANG:?} while the device hung:\n{}", d.log_text());
        let age = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64()
            - last_node.last_scan_unix_seconds;
        assert!(age < 5.0, "the latest scan finished {age:.1} s ago: scans stopped completing");

        // Reported unresponsive: API (flag, evidence first), metric, event.
        let dev = seen_unresponsive.unwrap_or_else(|| {
            panic!("{name} was never reported unresponsive during the hang:\n{}", d.log_text())
        });
        assert!(dev.unresponsive_seconds >= 3.0, "{dev:?}");
        assert!(
            dev.reasons.first().is_some_and(|r| r.starts_with("unresponsive: ") && r.contains("in flight")),
            "the evidence comes first: {:?}",
            dev.reasons
        );
        assert!(
            stuck.iter().any(|p| dev.reasons[0].contains(&format!("pid {p} (dd)"))),
            "the evidence names the reader stuck in D state ({stuck:?}): {:?}",
            dev.reasons
        );
        assert_ne!(dev.verdict, pb::Verdict::Stale as i32, "{dev:?}");
        let series = unresponsive_series(&metrics_hung, &name)
            .unwrap_or_else(|| panic!("no blockjanitor_device_unresponsive for {name} in\n{metrics_hung}"));
        assert!(series.ends_with(" 1") && series.contains("kind=\"loop\""), "{series}");
        assert!(
            metrics_hung.lines().any(|l| l.starts_with("blockjanitor_unresponsive_devices{kind=\"loop\"} ")
                && !l.ends_with(" 0")),
            "the count by kind the alert uses: {metrics_hung}"
        );
        let mut events = Vec::new();
        while let Ok(e) = ev_rx.try_recv() {
            events.push(e);
        }
        assert!(!watcher.is_finished(), "the WatchEvents stream closed during the hang: {events:?}");
        let went = events.iter().find(|(_, e)| {
            e.device == name
                && e.r#type == pb::event::Type::ResponsivenessChanged as i32
                && e.current.as_ref().is_some_and(|d| d.unresponsive)
        });
        let (at, _) = went.unwrap_or_else(|| panic!("no ResponsivenessChanged event for {name}: {events:?}"));
        assert!(at.duration_since(hang_start) < HANG, "delivered during the hang");

        // The server answers again: the reader's I/O completes and all is normal.
        scene.signal_server(Signal::SIGCONT);
        assert!(
            wait_until(Duration::from_secs(10), || scene.io().0 > hung_completed),
            "the loop device's hung I/O never completed after the server resumed"
        );
        assert!(
            wait_until(Duration::from_secs(10), || stuck.iter().all(|p| !scene.stuck_readers().contains(p))),
            "the reader stayed in D state after the server resumed"
        );
        let start = Instant::now();
        let after = loop {
            let r = c.list_devices(pb::ListDevicesRequest::default()).await.expect("ListDevices").into_inner();
            let dev = device(&r.devices).expect("still there");
            if !dev.unresponsive {
                break dev;
            }
            assert!(start.elapsed() < REACT, "{name} still unresponsive after the server resumed: {dev:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        assert!(!after.reasons.iter().any(|r| r.starts_with("unresponsive")), "{after:?}");
        let node = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
        assert!(
            !node.blind_spots.iter().any(|b| b.contains(&name)),
            "no blind spot about {name} once it answers: {:?}",
            node.blind_spots
        );
        assert!(
            wait_until(Duration::from_secs(10), || {
                let m = http_get(metrics, "/metrics");
                unresponsive_series(&m, &name).is_none() && m.contains("blockjanitor_blocked_reads 0")
            }),
            "the unresponsive series or a blocked read stayed after the server resumed"
        );
        let back = tokio::time::timeout(REACT, async {
            loop {
                match ev_rx.recv().await {
                    Some((_, e))
                        if e.device == name
                            && e.r#type == pb::event::Type::ResponsivenessChanged as i32
                            && e.current.as_ref().is_some_and(|d| !d.unresponsive) =>
                    {
                        return true
                    }
                    Some(_) => {}
                    None => return false,
                }
            }
        })
        .await
        .unwrap_or(false);
        assert!(back, "no ResponsivenessChanged event saying {name} answers again");
        watcher.abort();
    });
    drop(d);
    drop(scene);
}
