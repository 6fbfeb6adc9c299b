//! Incremental rescans on the real kernel (issue 13): the daemon shows a mount added or removed
//! in a foreign mount namespace, and a loop device attached or detached, by reading again only
//! what changed, not by a full scan; and a namespace new since the last full scan is seen too.
//!
//! Which kind of scan published a change is told by the device's `last_seen_scan` in the event:
//! a full scan reads the devices (it equals that view's generation), a re-read carries the
//! previous full scan's generation. Its tests take the crate's `serial()` lock, so nothing else
//! in its process makes uevents or mounts while one runs.
//!
//! `root_every_event_leaves_the_view_a_full_scan_would_show` (issue 20) checks the incremental
//! path against the full one: after each round of random mounts, unmounts, namespaces and
//! processes coming and going, once the daemon has settled, its view of every mount and process
//! holder of the test's devices is the one a one-shot full scan shows, in the same order. New
//! namespaces come two ways, both started with `execve` in them as a container's program is: a
//! copy of another (holding the devices by its mounts), and one whose process also holds a device
//! mounted there by its working directory, an open file, the program's own mapping, or all
//! three. Each is read by a re-read of that namespace, never by a full scan: a round that made a
//! namespace fails if the daemon's log says a re-read gave up on it (naming the namespace or its
//! process) and fell back to a full scan.

use std::path::Path;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;
use tokio_stream::StreamExt;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "nsenter", "mount", "umount"];

type Events = tonic::Streaming<pb::Event>;
type Client = pb::agent_client::AgentClient<tonic::transport::Channel>;

/// Waits for an event about the state of `device` (holders, verdict or responsiveness: the agent
/// folds a second's changes of one device into one event, of whichever of these kinds) that
/// shows it as `wanted` says; returns it with the generation of the view it came from.
async fn wait_state(
    events: &mut Events,
    device: &str,
    what: &str,
    wanted: impl Fn(&pb::Device) -> bool,
) -> pb::Event {
    use pb::event::Type;
    let deadline = tokio::time::Instant::now() + REACT;
    loop {
        let e = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("no event showing {device} {what} within {REACT:?}"))
            .expect("the event stream stays open")
            .expect("an event");
        let state = [Type::HoldersChanged, Type::VerdictChanged, Type::ResponsivenessChanged];
        if e.device == device
            && state.iter().any(|t| *t as i32 == e.r#type)
            && e.current.as_ref().is_some_and(&wanted)
        {
            return e;
        }
    }
}

/// Whether an event was published by a re-read: the device's own state in it is an earlier
/// (full) scan's than the view that showed the change.
fn by_reread(e: &pb::Event) -> bool {
    let seen = e.current.as_ref().map_or(0, |d| d.last_seen_scan);
    assert!(seen <= e.scan, "a device cannot be seen in a later scan than the view showing it: {e:#?}");
    seen > 0 && seen < e.scan
}

fn in_ns(pid: u32, args: &[&str]) {
    let pid = pid.to_string();
    let mut all = vec!["-t", pid.as_str(), "-m"];
    all.extend_from_slice(args);
    sh("nsenter", &all);
}

#[test]
fn root_mount_changes_and_uevents_are_shown_by_reading_only_what_changed() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let img = s.ext4_image("disk.img", 32);
    let img2 = s.ext4_image("second.img", 32);
    let target = s.mkdir("mnt");
    let holder = NsProcess::spawn("exec sleep 600");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    let d = Daemon::start(s.dir.path(), &["--rescan-interval", "20"]);
    let rt = blockjanitor_tests::rt();
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut events = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();

        // Mount and unmount in the holder's namespace (known to the start-up scan): each shown
        // by a re-read of that namespace. Three rounds, so that one full scan another trigger
        // happens to run at the same moment cannot decide the outcome.
        let mut rereads = 0;
        for round in 0..3 {
            in_ns(holder.pid(), &["mount", &lo.dev, target.to_str().expect("utf8")]);
            // The mount itself: between the superblock's making and the mount's attach, a scan can
            // see the filesystem with no mount yet (a `filesystem` holder), and say so.
            let placed = target.to_string_lossy().into_owned();
            let added = wait_state(&mut events, &name, "mounted", |d| {
                d.holders.iter().any(|h| h.mount_point == placed)
            })
            .await;
            let dev = added.current.as_ref().expect("the device as it is now");
            let h =
                dev.holders.iter().find(|h| h.mount_point == target.to_string_lossy()).unwrap_or_else(|| {
                    panic!("round {round}: the new mount is among the holders: {:#?}", dev.holders)
                });
            assert_eq!(h.mount_namespace, holder.ns_inode(), "round {round}: in the holder's namespace");
            assert!(h.pids.contains(&holder.pid()), "round {round}: naming its process: {h:#?}");
            let via_added = by_reread(&added);

            in_ns(holder.pid(), &["umount", target.to_str().expect("utf8")]);
            let gone = wait_state(&mut events, &name, "unmounted", |d| d.holders.is_empty()).await;
            let dev = gone.current.as_ref().expect("the device as it is now");
            assert!(dev.holders.is_empty(), "round {round}: nothing holds it any more: {:#?}", dev.holders);
            let via_gone = by_reread(&gone);
            if via_added && via_gone {
                rereads += 1;
            }
        }
        assert!(
            rereads >= 1,
            "no mount change was shown by a re-read of its namespace alone (every one by a full scan)"
        );

        // A filesystem outlives its last mount by a moment; once it is gone, the re-read after
        // the unmount must not still report it as living on the device.
        assert!(
            wait_until(Duration::from_secs(10), || !Path::new(&format!("/sys/fs/ext4/{name}")).exists()),
            "the kernel released the filesystem"
        );
        let mut settled = false;
        for _ in 0..100 {
            let dev = c
                .get_device(pb::GetDeviceRequest { device: name.clone() })
                .await
                .expect("GetDevice")
                .into_inner();
            if dev.verdict != pb::Verdict::InUse as i32 {
                settled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(settled, "after the unmount, {name} is not shown in use by a filesystem that is gone");

        // A loop device attached now: shown by a re-read of that device (its uevent). Twice at
        // most, in case a full scan was under way the first time.
        let mut lo2 = None;
        let mut reread_attach = false;
        for _ in 0..2 {
            drop(lo2.take());
            // An unbound loop device is listed too: attaching changes it (no DeviceAdded). If
            // the device, once shown bound, is still as the full scan before the attach read
            // it, a re-read showed the change.
            let full_before =
                c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner().last_full_scan;
            let l = LoopDev::attach(&img2);
            let deadline = tokio::time::Instant::now() + REACT;
            let dev = loop {
                if let Ok(d) = c.get_device(pb::GetDeviceRequest { device: l.name().to_owned() }).await {
                    let d = d.into_inner();
                    if d.loop_backing_file == img2.to_string_lossy() {
                        break d;
                    }
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} never showed its new backing file",
                    l.name()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert!(dev.size_bytes > 0, "the attached size, as sysfs shows it: {dev:#?}");
            assert!(dev.last_seen_scan >= full_before, "{dev:#?}");
            reread_attach = dev.last_seen_scan == full_before;
            lo2 = Some(l);
            if reread_attach {
                break;
            }
        }
        assert!(
            reread_attach,
            "an attached loop device was shown by a full scan both times, never by a re-read"
        );
        let lo2 = lo2.expect("attached");
        let name2 = lo2.name().to_owned();

        // A namespace created since the last full scan: watched and read (by a re-read of it
        // and its processes) once a program starts in it (`unshare ... sh`); without the
        // kernel's process events, by the next full scan (the timer's, every 20 s here). From
        // then on its changes are re-read like any other's.
        let newcomer = NsProcess::spawn("exec sleep 600");
        in_ns(newcomer.pid(), &["mount", &lo2.dev, target.to_str().expect("utf8")]);
        let deadline = tokio::time::Instant::now() + REACT;
        loop {
            let dev = c
                .get_device(pb::GetDeviceRequest { device: name2.clone() })
                .await
                .expect("GetDevice")
                .into_inner();
            if dev.holders.iter().any(|h| h.mount_namespace == newcomer.ns_inode()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mount in the namespace created after the full scan was never seen: {:#?}",
                dev.holders
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        in_ns(newcomer.pid(), &["umount", target.to_str().expect("utf8")]);
        let gone = wait_state(&mut events, &name2, "unmounted", |d| d.holders.is_empty()).await;
        assert!(gone.current.as_ref().is_some_and(|d| d.holders.is_empty()), "{gone:#?}");
    });
    drop(holder);
}

/// A small pseudo-random sequence (xorshift64), seeded from `BJB_SEED` or the clock (printed, so
/// a failing sequence can be replayed).
struct Rng(u64);

impl Rng {
    fn new() -> Self {
        let seed = std::env::var("BJB_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        }) | 1;
        eprintln!("root_every_event_leaves_the_view_a_full_scan_would_show: BJB_SEED={seed}");
        Self(seed)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// A device's verdict (the first line), then its mount and process holders, in the order the
/// view lists them, one line each (a verdict kept from the view before by a re-read that did not
/// touch the device must be the one a full scan gives): a
/// mount as (namespace inode, mount point), the part of a device's view a mount event changes
/// (not its pids: a process that joins a namespace without starting a program there is seen by
/// the next full scan); a process holder as its kind, pid, namespace, path and fds. The order
/// counts too: a re-read that listed a namespace's mounts elsewhere than a full scan does would
/// publish "holders changed" for every device mounted there, with nothing changed.
type Holders = Vec<String>;

const COMPARED: &[&str] = &["mount", "open_device", "open_file", "cwd", "root", "mmap"];

fn holder_line(kind: &str, ns: u64, mount_point: &str, pid: u32, path: &str, fds: &[u64]) -> Option<String> {
    match kind {
        "mount" => Some(format!("mount ns {ns} at {mount_point}")),
        k if COMPARED.contains(&k) => Some(format!("{k} pid {pid} ns {ns} path {path} fds {fds:?}")),
        _ => None,
    }
}

/// What a one-shot full scan (`holders DEV`, a separate process) shows of `dev`'s holders.
fn full_scan_holders(dev: &str) -> Holders {
    let out = agent(&["holders", dev, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("holders {dev}: not JSON ({e}): {}", text(&out.stdout)));
    let verdict =
        format!("verdict {}", v["verdict"].as_str().unwrap_or_else(|| panic!("holders {dev}: no verdict")));
    let holders = v["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("holders {dev}: no holder list: {v:#}"))
        .iter()
        .filter_map(|h| {
            let ns = h["mount_namespace"].as_u64().unwrap_or_else(|| panic!("a holder's namespace: {h:#}"));
            let pid = h["pids"].get(0).and_then(serde_json::Value::as_u64).unwrap_or(0) as u32;
            let fds: Vec<u64> = h["fds"]
                .as_array()
                .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default();
            holder_line(
                h["kind"].as_str().unwrap_or_default(),
                ns,
                h["mount_point"].as_str().unwrap_or_default(),
                pid,
                h["path"].as_str().unwrap_or_default(),
                &fds,
            )
        });
    std::iter::once(verdict).chain(holders).collect()
}

/// What the daemon's latest view shows of `dev`'s holders.
async fn daemon_holders(c: &mut Client, dev: &str) -> Holders {
    let d =
        c.get_device(pb::GetDeviceRequest { device: dev.to_owned() }).await.expect("GetDevice").into_inner();
    let verdict = pb::Verdict::try_from(d.verdict).expect("a known verdict").as_str_name();
    let verdict = format!("verdict {}", verdict.trim_start_matches("VERDICT_").to_ascii_lowercase());
    let holders = d.holders.iter().filter_map(|h| {
        let kind = pb::HolderKind::try_from(h.kind).map_or_else(
            |_| "?".to_owned(),
            |k| k.as_str_name().trim_start_matches("HOLDER_KIND_").to_ascii_lowercase(),
        );
        let fds: Vec<u64> = h.fds.iter().map(|f| u64::from(*f)).collect();
        let pid = h.pids.first().copied().unwrap_or(0);
        holder_line(&kind, h.mount_namespace, &h.mount_point, pid, &h.path, &fds)
    });
    std::iter::once(verdict).chain(holders).collect()
}

/// How many of the daemon's re-reads (debug log) rebuilt fewer devices than the host has: the
/// ones that kept the untouched devices' entries and verdicts from the view before.
fn partial_rereads(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains("re-read snapshot joined"))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| {
            let f = if v["fields"].is_object() { &v["fields"] } else { v };
            f["rebuilt"].as_u64().zip(f["devices"].as_u64()).is_some_and(|(r, d)| r < d)
        })
        .count()
}

/// Waits until the daemon has published no view for `quiet` (the follow-up re-reads after an
/// unmount come 100 ms and 1 s after it); returns its node summary then.
async fn settled(c: &mut Client, quiet: Duration) -> pb::Node {
    let deadline = tokio::time::Instant::now() + REACT;
    let mut last = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
    let mut since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner();
        if now.scans != last.scans {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= quiet {
            return now;
        }
        assert!(tokio::time::Instant::now() < deadline, "the daemon never settled: {last:#?}");
    }
}

#[path = "support/test_namespaces.rs"]
mod test_namespaces;
use test_namespaces::{copy_of, holding_copy, image_with_sleep, Hold, TestNs};

#[test]
fn root_every_event_leaves_the_view_a_full_scan_would_show() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let devs: Vec<LoopDev> =
        (0..2).map(|i| LoopDev::attach(&image_with_sleep(&s, &format!("d{i}.img")))).collect();
    let points: Vec<String> =
        (0..4).map(|i| s.mkdir(&format!("m{i}")).to_string_lossy().into_owned()).collect();
    let mut spaces: Vec<TestNs> = (0..3)
        .map(|_| TestNs { proc: NsProcess::spawn("exec sleep 600"), mounts: Vec::new(), busy: None })
        .collect();
    // One device mounted from the start, so the first round can start a program on it.
    in_ns(spaces[0].proc.pid(), &["mount", &devs[0].dev, &points[0]]);
    spaces[0].mounts.push(points[0].clone());
    let mut visitors: Vec<NsProcess> = Vec::new();
    let d = Daemon::start_configured(s.dir.path(), &[], &["--rescan-interval", "3600"], |c| {
        c.env("BLOCKJANITOR_LOG", "info,blockjanitor=debug");
    });
    let mut rng = Rng::new();
    let rounds: usize = std::env::var("BJB_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(24);
    let rt = blockjanitor_tests::rt();
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut node = settled(&mut c, Duration::from_millis(500)).await;
        let mut by_rereads = 0;
        // Rounds that made a namespace, and those of them during which some full scan ran.
        let (mut made_rounds, mut made_with_full) = (0, 0);
        for round in 0..rounds {
            let log_from = d.log_text().len();
            // A namespace made this round: (its inode, its process, whether that holds a file).
            let mut made: Option<(u64, u32, bool)> = None;
            let op = match round {
                0 => 7,
                1 => 6,
                _ => rng.below(12),
            };
            let what = match op {
                // Mount a test device in a random namespace, at a point free there.
                0..=3 => {
                    let i = rng.below(spaces.len());
                    let free: Vec<&String> = points.iter().filter(|p| !spaces[i].mounts.contains(p)).collect();
                    if free.is_empty() {
                        continue;
                    }
                    let at = free[rng.below(free.len())].clone();
                    let dev = &devs[rng.below(devs.len())].dev;
                    in_ns(spaces[i].proc.pid(), &["mount", dev, &at]);
                    spaces[i].mounts.push(at.clone());
                    format!("mount {dev} at {at} in namespace #{i}")
                }
                // Unmount one of them (not one a process there holds a file on).
                4 | 5 => {
                    let i = rng.below(spaces.len());
                    let idle: Vec<String> =
                        spaces[i].mounts.iter().filter(|m| spaces[i].busy.as_ref() != Some(*m)).cloned().collect();
                    if idle.is_empty() {
                        continue;
                    }
                    let at = idle[rng.below(idle.len())].clone();
                    spaces[i].mounts.retain(|m| *m != at);
                    in_ns(spaces[i].proc.pid(), &["umount", &at]);
                    format!("unmount {at} in namespace #{i}")
                }
                // A namespace appears: a copy of another, with its mounts.
                6 if spaces.len() < 8 => {
                    let i = rng.below(spaces.len());
                    let copy = copy_of(&spaces[i]);
                    made = Some((copy.proc.ns_inode(), copy.proc.pid(), false));
                    spaces.push(copy);
                    format!("namespace #{} copied from #{i}", spaces.len() - 1)
                }
                // A namespace appears whose program holds a device mounted there by more than
                // the mount.
                7 if spaces.len() < 8 => {
                    let mounted: Vec<(usize, String)> = spaces
                        .iter()
                        .enumerate()
                        .flat_map(|(i, n)| n.mounts.iter().map(move |m| (i, m.clone())))
                        .collect();
                    if mounted.is_empty() {
                        continue;
                    }
                    let (i, at) = mounted[rng.below(mounted.len())].clone();
                    let how = [Hold::Cwd, Hold::Fd, Hold::Map, Hold::All][rng.below(4)];
                    let copy = holding_copy(&spaces[i], &at, how);
                    made = Some((copy.proc.ns_inode(), copy.proc.pid(), true));
                    spaces.push(copy);
                    format!("namespace #{} copied from #{i}, its program holding {at} by {how:?}", spaces.len() - 1)
                }
                // A namespace goes away with its last process (its mounts with it).
                6..=8 if spaces.len() > 1 => {
                    let i = rng.below(spaces.len());
                    drop(spaces.remove(i));
                    format!("namespace #{i} ended")
                }
                // A process comes into a namespace, or one goes. Not into one whose program
                // holds a file: that namespace would outlive its program, whose files the view
                // shows until the next full scan (a process's exit is not watched).
                _ => {
                    let open: Vec<usize> = (0..spaces.len()).filter(|i| spaces[*i].busy.is_none()).collect();
                    if !visitors.is_empty() && (open.is_empty() || rng.below(2) == 0) {
                        drop(visitors.remove(rng.below(visitors.len())));
                        "a visiting process exited".to_owned()
                    } else if open.is_empty() {
                        continue;
                    } else {
                        let i = open[rng.below(open.len())];
                        let pid = spaces[i].proc.pid().to_string();
                        let child = std::process::Command::new("nsenter")
                            .args(["-t", &pid, "-m", "--", "sleep", "600"])
                            .stdin(std::process::Stdio::null())
                            .spawn()
                            .expect("spawn nsenter");
                        visitors.push(NsProcess { child });
                        format!("a process joined namespace #{i}")
                    }
                }
            };
            let now = settled(&mut c, Duration::from_millis(1500)).await;
            let full_ran = now.last_full_scan != node.last_full_scan;
            if now.scans > node.scans && !full_ran {
                by_rereads += 1;
            }
            node = now;
            let mut all = Vec::new();
            for lo in &devs {
                let full = full_scan_holders(lo.name());
                let seen = daemon_holders(&mut c, lo.name()).await;
                if seen != full {
                    let log = d.log_text();
                    if let Ok(f) = std::env::var("BJB_DAEMON_LOG") {
                        let _ = std::fs::write(f, &log);
                    }
                    let tail: Vec<&str> = log.lines().rev().take(40).collect();
                    panic!(
                        "round {round} ({what}): the daemon shows {seen:#?} of {}'s holders, a full scan {full:#?}; \
                         the daemon's last log lines, newest first:\n{}",
                        lo.name(),
                        tail.join("\n")
                    );
                }
                all.extend(full);
            }
            if let Some((ns, pid, holds)) = made {
                // Read by a re-read: no re-read gave up on it for a full scan.
                let log = d.log_text();
                let gave_up: Vec<&str> = log[log_from..]
                    .lines()
                    .filter(|l| l.contains("scanning in full"))
                    .filter(|l| {
                        l.contains(&format!("namespace {ns}"))
                            || l.contains(&format!("pid {pid} "))
                            || l.contains(&format!("/{pid}/"))
                    })
                    .collect();
                assert!(
                    gave_up.is_empty(),
                    "round {round} ({what}): the new namespace {ns} was read by a full scan: {gave_up:#?}"
                );
                made_rounds += 1;
                if full_ran {
                    made_with_full += 1;
                    eprintln!("round {round}: a full scan ran too (not for namespace {ns}: another trigger)");
                }
                if holds {
                    assert!(
                        all.iter().any(|l| !l.starts_with("mount ") && l.contains(&format!(" pid {pid} ns {ns} "))),
                        "round {round} ({what}): no process holder of pid {pid}: {all:#?}"
                    );
                }
            }
            eprintln!("round {round}: {what}: the view agrees with a full scan ({:?})", std::time::SystemTime::now());
        }
        assert!(
            by_rereads >= rounds / 4,
            "only {by_rereads} of {rounds} rounds were shown by re-reads alone: the incremental path was hardly checked"
        );
        assert!(made_rounds >= 2, "only {made_rounds} rounds made a namespace");
        let partial = partial_rereads(&d.log_text());
        assert!(
            partial >= rounds / 8,
            "only {partial} re-reads kept the devices they did not touch: the view updated in place was hardly checked"
        );
        eprintln!("{by_rereads} of {rounds} rounds shown by re-reads alone, {partial} re-reads rebuilt only what they touched");
        assert!(
            made_with_full * 2 <= made_rounds,
            "{made_with_full} of the {made_rounds} rounds that made a namespace ran a full scan (other triggers?)"
        );
    });
    if let Ok(f) = std::env::var("BJB_DAEMON_LOG") {
        let _ = std::fs::write(f, d.log_text());
    }
    // Namespaces first (their mounts pin the devices), then the devices.
    drop(visitors);
    drop(spaces);
}
