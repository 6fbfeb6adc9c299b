//! Benchmark of incremental rescans on the busy-node scene (issue 13), printed as Markdown for
//! BENCHMARKS.md:
//!
//! - how long after a mount (and an unmount) in ONE of the scene's 200 namespaces the change is
//!   visible through the API: a `WatchEvents` stream opened beforehand receives the device's
//!   `HOLDERS_CHANGED` event; timed from the moment `mount(2)`/`umount2(2)` returned;
//! - the daemon's CPU while nothing changes, with the scene up, over `BENCH_IDLE_SECONDS` (60);
//! - how many scans were full and how many re-read only the namespaces that changed.
//!
//! Run (root): `bench/busy-node-scene.sh up && cargo build --release --bins &&
//! cargo bench -p blockjanitor-tests --bench mount_events; bench/busy-node-scene.sh down`, or
//! `bench/node-bench.sh` for issue 20's node-shaped scene at 200 and 400 namespaces.
//! `BENCH_MOUNTS` (50) sets the number of mount/unmount pairs; each round mounts in a scene
//! namespace picked at random (never the template's, which the churn's pods copy). `BENCH_CHURN=1` runs the scene's pod churn
//! (`busy-node-scene.sh churn`, node shape) during the mount rounds, not during the idle window.
//! `BENCH_DAEMON_LOG=path` writes the daemon's whole log there at the end.
//! `BENCH_TRACE=1` prints every other event the client receives while it waits for the one it
//! times, with its arrival time (where a round's time went).
//!
//! Pacing: the agent sends at most one state event per device a second by default (issue 21, the
//! per-device cap, `daemon::event_rate`): a change less than a second after the device's previous
//! event is held until that second is up, so a bench that changed its device every ~50 ms timed
//! the cap (about 1 s), not the agent's work per event. Each change of the bench device therefore
//! comes `BENCH_GAP_MS` (1,050) after the event of its previous change arrived: every change is
//! the device's first after a quiet second, which the cap sends at once. Events that arrive in a
//! gap are counted apart. A gap under a second (`BENCH_GAP_MS=50`: the pace of the bench before
//! the cap) runs the agent with `--no-cap-device-events`. An event of the bench device that the cap folded (`coalesced` > 0)
//! stops the bench: the gap was too short to measure what it says.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::measure::{cpu_ticks, ms, percentile};
use tokio_stream::StreamExt;

const STATE: &str = "/run/blockjanitor-bench";

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The scene's processes (running its sleeper binary) and its loop device.
fn scene() -> (Vec<u32>, PathBuf) {
    // The busy shape runs its sleeper from the state dir, the node shape from its image disk.
    let sleepers = [Path::new(STATE).join("bjb-sleeper"), Path::new(STATE).join("image/bin/bjb-sleeper")];
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|p: &u32| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|x| sleepers.contains(&x)))
        .collect();
    pids.sort_unstable();
    let out = std::process::Command::new("losetup")
        .args(["-j", &format!("{STATE}/disk.img"), "-O", "NAME", "-n"])
        .output()
        .expect("losetup");
    let dev = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_owned();
    assert!(
        pids.len() >= 100 && !dev.is_empty(),
        "the busy-node scene is not up ({} scene processes, loop device {dev:?}): run bench/busy-node-scene.sh up",
        pids.len()
    );
    (pids, PathBuf::from(dev))
}

/// Mounts (or, with `None`, unmounts) inside the mount namespace of `pid`, on a thread of its
/// own that enters it; returns when the call has returned.
fn in_namespace(pid: u32, dev: Option<&Path>, target: &Path) {
    let target = target.to_owned();
    let dev = dev.map(Path::to_owned);
    std::thread::spawn(move || {
        use nix::sched::{setns, unshare, CloneFlags};
        unshare(CloneFlags::CLONE_FS).expect("unshare CLONE_FS");
        let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).expect("open ns");
        setns(ns.as_fd(), CloneFlags::CLONE_NEWNS).expect("setns");
        match dev {
            Some(d) => {
                nix::mount::mount(Some(&d), &target, Some("ext4"), nix::mount::MsFlags::empty(), None::<&str>)
                    .expect("mount")
            }
            None => nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).expect("umount"),
        }
    })
    .join()
    .expect("namespace thread");
}

fn main() {
    assert!(nix::unistd::geteuid().is_root(), "run as root");
    let (pids, dev) = scene();
    let dev_name = dev.file_name().and_then(|n| n.to_str()).expect("device name").to_owned();
    let rt = blockjanitor_tests::rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let target = Path::new(STATE).join("bench-mnt");
    std::fs::create_dir_all(&target).expect("mkdir mount point");
    // Changes closer than the cap's second: the agent without the cap (as before issue 21).
    let gap = Duration::from_millis(env_u64("BENCH_GAP_MS", 1050));
    let capped = gap >= Duration::from_secs(1);
    let d = Daemon::start(dir.path(), if capped { &[] } else { &["--no-cap-device-events"] });
    let agent_pid = d.child.id();
    let rounds = env_u64("BENCH_MOUNTS", 50) as usize;
    let idle_secs = env_u64("BENCH_IDLE_SECONDS", 60);

    let (attach, detach, node_before, node_after, idle_pct, others) = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        // The start-up scan must be done and the scene seen.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let n = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
            if n.scans >= 1 {
                break;
            }
            assert!(Instant::now() < deadline, "no scan finished in 120 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let holder_ns: Vec<u64> = c
            .get_device(pb::GetDeviceRequest { device: dev_name.clone() })
            .await
            .expect("GetDevice")
            .into_inner()
            .holders
            .iter()
            .flat_map(|h| h.pids.clone())
            .map(u64::from)
            .collect();
        // Scene processes whose namespace does not mount the device: one at random each round.
        // Not the template's (process #0): every pod the churn starts is a copy of its
        // namespace, so a pod started while the device is mounted there holds it too, and that
        // second change of the device (then its end with the pod) makes the agent's per-device
        // cap hold the bench's next change for the rest of its second (the ~950 ms rounds of
        // the ninth round).
        let template: Option<u32> = std::fs::read_to_string(Path::new(STATE).join("template_pid"))
            .ok()
            .and_then(|t| t.trim().parse().ok());
        let candidates: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|p| !holder_ns.contains(&u64::from(*p)) && Some(*p) != template)
            .collect();
        assert!(!candidates.is_empty(), "a scene process not holding the device");
        let mut rng = XorShift(std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15);

        // Idle: the scene up, nothing changing.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let t0 = cpu_ticks(agent_pid);
        let w0 = Instant::now();
        tokio::time::sleep(Duration::from_secs(idle_secs)).await;
        let ticks = cpu_ticks(agent_pid) - t0;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let idle_pct = ticks as f64 / hz / w0.elapsed().as_secs_f64() * 100.0;

        let node_before = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
        let churn = env_u64("BENCH_CHURN", 0) == 1;
        let mut churn = churn.then(|| {
            std::process::Command::new(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/busy-node-scene.sh"),
            )
            .arg("churn")
            .spawn()
            .expect("start the pod churn")
        });
        let mut events = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();
        // BENCH_TRACE=1: every other event received while waiting, with its arrival time.
        let trace = env_u64("BENCH_TRACE", 0) == 1;
        let mut others = [0usize; 3];
        let mut attach = Vec::with_capacity(rounds);
        let mut detach = Vec::with_capacity(rounds);
        for round in 0..rounds {
            let pid = candidates[(rng.next() % candidates.len() as u64) as usize];
            for mounting in [true, false] {
                let d = mounting.then_some(dev.as_path());
                in_namespace(pid, d, &target);
                let done = Instant::now();
                let want = if mounting { "1 holder(s) added" } else { "1 gone" };
                let mut before = 0;
                loop {
                    let e = tokio::time::timeout(Duration::from_secs(30), events.next())
                        .await
                        .unwrap_or_else(|_| panic!("round {round}: no event within 30 s"))
                        .expect("stream open")
                        .expect("event");
                    assert!(
                        e.device != dev_name || e.coalesced == 0,
                        "round {round}: the agent's per-device cap folded changes of the bench device \
                         ({}): BENCH_GAP_MS={} is too short to time single events",
                        e.message,
                        gap.as_millis()
                    );
                    if e.device == dev_name
                        && e.r#type == pb::event::Type::HoldersChanged as i32
                        && e.message.contains(want)
                    {
                        break;
                    }
                    before += 1;
                    if trace {
                        let msg: String = e.message.chars().take(100).collect();
                        eprintln!(
                            "round {round}: +{} other event (scan {}): {msg}",
                            ms(done.elapsed()),
                            e.scan
                        );
                    }
                }
                let took = done.elapsed();
                if trace {
                    eprintln!(
                        "round {round}: {} seen after {} (made at {} UTC)",
                        if mounting { "mount" } else { "unmount" },
                        ms(took),
                        utc_of(std::time::SystemTime::now() - took)
                    );
                }
                others[usize::from(!mounting)] += before;
                if mounting { &mut attach } else { &mut detach }.push(took);
                // The gap before the device's next change, reading what arrives meanwhile.
                let next = tokio::time::Instant::now() + gap;
                while let Ok(e) = tokio::time::timeout_at(next, events.next()).await {
                    let e = e.expect("stream open").expect("event");
                    others[2] += 1;
                    if trace {
                        // An event between rounds starts the device's second of the agent's
                        // per-device cap: a change of the bench device then is held.
                        let msg: String = e.message.chars().take(100).collect();
                        eprintln!(
                            "round {round}: between changes, at {} UTC (scan {}): {msg}",
                            utc_of(std::time::SystemTime::now()),
                            e.scan
                        );
                    }
                }
            }
        }
        let node_after = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
        if let Some(mut ch) = churn.take() {
            // SAFETY: kill(2) on the churn's own pid (a child of ours, not yet reaped).
            unsafe { libc::kill(ch.id() as i32, libc::SIGTERM) };
            let _ = ch.wait();
        }
        (attach, detach, node_before, node_after, idle_pct, others)
    });
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name").map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned()))
        .unwrap_or_default();
    println!("| machine | {} cores, {cpu} |", std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!("| scene | {} scene processes; device {} |", pids.len(), dev.display());
    println!("| idle CPU over {idle_secs} s, scene up | **{idle_pct:.3} %** of a core |");
    println!("ACCEPT idle CPU over {idle_secs} s: {idle_pct:.3} % (target <= 0.1 % over 600 s)");
    for (what, mut v) in
        [("mount in a random namespace -> HOLDERS_CHANGED", attach), ("unmount -> HOLDERS_CHANGED", detach)]
    {
        v.sort();
        println!(
            "| {what} ({} runs) | median **{}**, p99 **{}**, max {} |",
            v.len(),
            ms(percentile(&v, 0.5)),
            ms(percentile(&v, 0.99)),
            ms(*v.last().expect("runs"))
        );
        println!(
            "ACCEPT {what}: median {} (target <= 2 ms), p99 {} (target <= 5 ms), {} runs",
            ms(percentile(&v, 0.5)),
            ms(percentile(&v, 0.99)),
            v.len()
        );
    }
    println!(
        "| pacing | each change of the device {} ms after its previous change's event arrived; the agent's per-device event cap (one a second) {} |",
        gap.as_millis(),
        if capped { "on (its default)" } else { "off (--no-cap-device-events: the gap is under its second)" }
    );
    println!(
        "| other events received before the awaited one | {} after the mounts, {} after the unmounts; {} in the gaps |",
        others[0], others[1], others[2]
    );
    println!(
        "| scans during the mount rounds | {} (generations {} to {}); latest full scan: generation {} before, {} after |",
        node_after.scans - node_before.scans,
        node_before.scans,
        node_after.scans,
        node_before.last_full_scan,
        node_after.last_full_scan
    );
    println!("| daemon log lines | {} |", d.log_text().lines().count());
    // BENCH_DAEMON_LOG=path keeps the daemon's whole log (to line its debug timings up with
    // BENCH_TRACE's arrivals).
    if let Ok(path) = std::env::var("BENCH_DAEMON_LOG") {
        std::fs::write(&path, d.log_text()).unwrap_or_else(|e| panic!("cannot write {path}: {e}"));
    }
    // With BLOCKJANITOR_LOG=debug the daemon logs where each re-read's time went: medians.
    let mut phases: std::collections::BTreeMap<String, Vec<u64>> = Default::default();
    for line in d.log_text().lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        // The agent logs JSON with the event's fields flattened into the record.
        let Some(fields) = v.as_object() else { continue };
        for (k, x) in fields {
            if let (true, Some(us)) = (k.ends_with("_us"), x.as_u64()) {
                phases.entry(k.clone()).or_default().push(us);
            }
        }
    }
    for (k, mut v) in phases {
        v.sort_unstable();
        println!(
            "| daemon phase {k} | median {} us, p90 {} us ({} samples) |",
            v[v.len() / 2],
            v[v.len() * 9 / 10],
            v.len()
        );
    }
}

/// `HH:MM:SS.mmm` of `t` (UTC), to line a round up with the daemon's log.
fn utc_of(t: std::time::SystemTime) -> String {
    let d = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let (s, ms) = (d.as_secs() % 86_400, d.subsec_millis());
    format!("{:02}:{:02}:{:02}.{ms:03}", s / 3600, s / 60 % 60, s % 60)
}

/// A small pseudo-random sequence (xorshift64): which namespace each round mounts in.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}
