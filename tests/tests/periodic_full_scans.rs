//! The daemon's periodic full scans keep what a process's last full read found while its cheap
//! signs of change (start time, fd count, virtual size) are the same, and read every process in
//! full every `--full-read-every`th scan (issue 20, `snapshot::process_read_cache`), on the real
//! kernel: a process opens a file on a loop device's filesystem (a new fd), maps one (a new
//! size), enters a directory there (cwd, read every scan), and swaps an fd for a file there at
//! the same fd count (`dup2`: no sign at all); each is shown by the daemon, the swap by the
//! next full read at the latest; light scans did happen (the daemon's debug log says how many
//! processes each kept); and once settled, the daemon's holders of the device are those a
//! one-shot full scan shows. And the timer's scan stops for a mount change that is waiting,
//! yet still runs to its end (`daemon::scanner`). Not timed (generous bounds).

use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "mount", "umount", "python3"];

/// Rescan interval (s) and full-read period of the daemon under test.
const INTERVAL: &str = "1";
const FULL_READ_EVERY: u64 = 4;

/// A python process that opens, maps, enters and swaps files when told (one command a line,
/// answered `ok` once done). Fd 9 is /dev/null from the start: the swap's target.
const HOLDER: &str = r#"
import mmap, os, sys
n = os.open("/dev/null", os.O_RDONLY); os.dup2(n, 9); os.close(n)
keep = []
print("ok", flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "open":
        keep.append(os.open(arg, os.O_RDONLY))
    elif cmd == "mmap":
        with open(arg, "rb") as f:
            keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
    elif cmd == "chdir":
        os.chdir(arg)
    elif cmd == "swap":
        fd = os.open(arg, os.O_RDONLY); os.dup2(fd, 9); os.close(fd)
    print("ok", flush=True)
"#;

struct Holder {
    child: Killed,
    out: std::io::BufReader<std::process::ChildStdout>,
}

impl Holder {
    fn start(cwd: &Path) -> Self {
        let mut child = Command::new("python3")
            .args(["-c", HOLDER])
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn python3");
        let out = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut h = Self { child: Killed(child), out };
        h.ack("start");
        h
    }

    fn ack(&mut self, what: &str) {
        let mut line = String::new();
        self.out.read_line(&mut line).expect("read the holder's answer");
        assert_eq!(line.trim(), "ok", "the holder did {what}");
    }

    fn tell(&mut self, cmd: &str, path: &Path) {
        let stdin = self.child.0.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{cmd} {}", path.display()).expect("write to the holder");
        self.ack(cmd);
    }

    fn pid(&self) -> u32 {
        self.child.0.id()
    }
}

/// Process holders of `dev` as (kind, pid, path, fds), sorted: the daemon's view and a one-shot
/// full scan are compared on these. (A process's fds on one device are one holder, with the
/// first one's path.)
type Held = Vec<(String, u32, String, Vec<u32>)>;

fn kind_name(k: i32) -> String {
    let k = pb::HolderKind::try_from(k).expect("a holder kind");
    k.as_str_name().trim_start_matches("HOLDER_KIND_").to_lowercase()
}

async fn daemon_holders(c: &mut pb::agent_client::AgentClient<tonic::transport::Channel>, dev: &str) -> Held {
    let d =
        c.get_device(pb::GetDeviceRequest { device: dev.to_owned() }).await.expect("GetDevice").into_inner();
    let mut v: Held = d
        .holders
        .iter()
        .filter(|h| h.kind != pb::HolderKind::Mount as i32)
        .flat_map(|h| h.pids.iter().map(move |p| (kind_name(h.kind), *p, h.path.clone(), h.fds.clone())))
        .collect();
    v.sort();
    v
}

fn full_scan_holders(dev: &str) -> Held {
    let out = agent(&["holders", dev, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("holders {dev}: not JSON ({e}): {}", text(&out.stdout)));
    let mut held: Held = v["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("holders {dev}: no holder list: {v:#}"))
        .iter()
        .filter(|h| h["kind"] != "mount")
        .flat_map(|h| {
            let kind = h["kind"].as_str().expect("kind").to_owned();
            let path = h["path"].as_str().unwrap_or_default().to_owned();
            let fds: Vec<u32> = h["fds"]
                .as_array()
                .map(|f| f.iter().map(|n| n.as_u64().expect("fd") as u32).collect())
                .unwrap_or_default();
            h["pids"]
                .as_array()
                .expect("pids")
                .iter()
                .map(move |p| (kind.clone(), p.as_u64().expect("pid") as u32, path.clone(), fds.clone()))
        })
        .collect();
    held.sort();
    held
}

/// The daemon's debug lines for the files phase of its full scans: `(full_read, kept)`.
fn file_phases(log: &str) -> Vec<(bool, u64)> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| {
            let f = v.get("fields").unwrap_or(&v);
            if f["phase"] != "files" {
                return None;
            }
            Some((f["full_read"].as_bool()?, f["kept"].as_u64()?))
        })
        .collect()
}

#[test]
fn root_periodic_scans_keep_unchanged_processes_and_see_every_change() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let img = s.ext4_image("disk.img", 32);
    let lo = LoopDev::attach(&img);
    let dev = lo.name().to_owned();
    let mnt = s.mkdir("mnt");
    let _mount = HostMount::new(&lo.dev, &mnt, &[]);
    for f in ["opened", "mapped", "swapped"] {
        std::fs::write(mnt.join(f), vec![7u8; 8192]).expect("write a file on the device");
    }
    let dir = mnt.join("dir");
    std::fs::create_dir(&dir).expect("mkdir on the device");
    let mut holder = Holder::start(s.dir.path());
    let pid = holder.pid();
    let every = FULL_READ_EVERY.to_string();
    let d = Daemon::start_configured(
        s.dir.path(),
        &[],
        &["--rescan-interval", INTERVAL, "--full-read-every", &every],
        |c| {
            c.env("BLOCKJANITOR_LOG", "blockjanitor=debug");
        },
    );
    let rt = blockjanitor_tests::rt();
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        // `file`: the path's end, or `fd N` for an fd among the holder's.
        let shows = |held: &Held, kind: &str, file: &str| {
            held.iter().any(|(k, p, path, fds)| {
                k == kind
                    && *p == pid
                    && match file.strip_prefix("fd ") {
                        Some(n) => fds.iter().any(|f| f.to_string() == n),
                        None => path.ends_with(file),
                    }
            })
        };
        // Nothing of the holder's on the device yet, and the start-up scan is done.
        assert!(
            daemon_holders(&mut c, &dev).await.iter().all(|(_, p, _, _)| *p != pid),
            "the holder holds nothing yet"
        );
        let steps: [(&str, &Path, &str, &str); 4] = [
            ("open", &mnt.join("opened"), "open_file", "/opened"),
            ("mmap", &mnt.join("mapped"), "mmap", "/mapped"),
            ("chdir", &dir, "cwd", "/dir"),
            ("swap", &mnt.join("swapped"), "open_file", "fd 9"),
        ];
        for (cmd, path, kind, file) in steps {
            holder.tell(cmd, path);
            let deadline = tokio::time::Instant::now() + REACT;
            loop {
                let held = daemon_holders(&mut c, &dev).await;
                if shows(&held, kind, file) {
                    break;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "after `{cmd}`, the daemon never showed pid {pid} as {kind} of {file}: {held:?}\n{}",
                    d.log_text()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }

        // Light scans did happen: some full scan kept the holder (and the others) unread.
        let phases = file_phases(&d.log_text());
        assert!(
            phases.iter().any(|(full, kept)| !full && *kept > 0),
            "no periodic scan kept an unchanged process: {phases:?}"
        );
        assert!(phases.iter().any(|(full, _)| *full), "the first scan is a full read: {phases:?}");

        // Settled (nothing changes now): the daemon's holders are a one-shot full scan's.
        let deadline = tokio::time::Instant::now() + REACT;
        let last = loop {
            let ours = daemon_holders(&mut c, &dev).await;
            let full = full_scan_holders(&dev);
            if ours == full {
                break full;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the daemon shows {ours:?}, a one-shot full scan {full:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        };
        for (kind, file) in
            [("open_file", "/opened"), ("mmap", "/mapped"), ("cwd", "/dir"), ("open_file", "fd 9")]
        {
            assert!(shows(&last, kind, file), "the full scan shows {kind} {file}: {last:?}");
        }
    });
    drop(holder);
}

/// Mount holders of `dev` as (namespace, mount point), sorted, as the daemon shows them.
async fn daemon_mounts(
    c: &mut pb::agent_client::AgentClient<tonic::transport::Channel>,
    dev: &str,
) -> Vec<(u64, String)> {
    let d =
        c.get_device(pb::GetDeviceRequest { device: dev.to_owned() }).await.expect("GetDevice").into_inner();
    let mut v: Vec<(u64, String)> = d
        .holders
        .iter()
        .filter(|h| h.kind == pb::HolderKind::Mount as i32)
        .map(|h| (h.mount_namespace, h.mount_point.clone()))
        .collect();
    v.sort();
    v
}

/// The same, from a one-shot full scan.
fn full_scan_mounts(dev: &str) -> Vec<(u64, String)> {
    let out = agent(&["holders", dev, "--output", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("holders {dev}: not JSON ({e}): {}", text(&out.stdout)));
    let mut mounts: Vec<(u64, String)> = v["holders"]
        .as_array()
        .unwrap_or_else(|| panic!("holders {dev}: no holder list: {v:#}"))
        .iter()
        .filter(|h| h["kind"] == "mount")
        .map(|h| {
            let ns = h["mount_namespace"].as_u64().unwrap_or_else(|| panic!("a mount's namespace: {h:#}"));
            (ns, h["mount_point"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    mounts.sort();
    mounts
}

/// The daemon's debug lines, each as its JSON fields (message included).
fn debug_lines(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| v.get("fields").cloned().unwrap_or(v))
        .collect()
}

/// The timer's full scan stops for a change that is waiting, so that the change is read and
/// shown without waiting for the whole host's read, and still runs to its end (at most three
/// stops in a row): on the real kernel, a process in a namespace of its own bind-mounts the
/// loop device's filesystem and unmounts it again without pause while the daemon's timer fires
/// every second. Its debug log shows timer scans that stopped and timer scans that were
/// published, never more than three stops between two; once the churn ends, the daemon's mounts
/// of the device are a one-shot full scan's. Not timed.
#[test]
fn root_the_timer_scan_stops_for_a_waiting_change_and_still_finishes() {
    let Some((_serial, s)) = real_kernel_test(&["losetup", "mkfs.ext4", "mount", "umount", "unshare"]) else {
        return;
    };
    let img = s.ext4_image("disk.img", 32);
    let lo = LoopDev::attach(&img);
    let dev = lo.name().to_owned();
    let mnt = s.mkdir("mnt");
    let _mount = HostMount::new(&lo.dev, &mnt, &[]);
    let target = s.mkdir("copy");
    let (go, stop) = (s.dir.path().join("go"), s.dir.path().join("stop"));
    // Waits (in its own namespace, before the daemon's first scan reads it) until told to go.
    let churn = format!(
        "while [ ! -e {go} ]; do sleep 0.05; done; n=0; \
         while [ ! -e {stop} ]; do mount --bind {mnt} {target} && umount {target}; n=$((n+1)); done; echo $n",
        go = go.display(),
        stop = stop.display(),
        mnt = mnt.display(),
        target = target.display()
    );
    let churner = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &churn])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn unshare");
    let mut churner = Killed(churner);
    std::thread::sleep(Duration::from_millis(300));
    let d = Daemon::start_configured(s.dir.path(), &[], &["--rescan-interval", INTERVAL], |c| {
        c.env("BLOCKJANITOR_LOG", "blockjanitor=debug");
    });
    let rt = blockjanitor_tests::rt();
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        daemon_mounts(&mut c, &dev).await; // the start-up scan is done
        std::fs::write(&go, b"").expect("go");
        tokio::time::sleep(Duration::from_secs(6)).await;
        std::fs::write(&stop, b"").expect("stop");
    });
    let mut out = String::new();
    std::io::Read::read_to_string(&mut churner.0.stdout.take().expect("its stdout"), &mut out).expect("read");
    let _ = churner.0.wait();
    let rounds: u64 = out.trim().parse().unwrap_or_else(|_| panic!("the churn's count: {out}"));
    assert!(rounds > 100, "the churn made only {rounds} mounts");

    let log = d.log_text();
    let lines = debug_lines(&log);
    let (mut stopped, mut published, mut in_a_row, mut most_in_a_row) = (0, 0, 0, 0);
    for l in &lines {
        if l["message"] == "scan stopped for a waiting change" && l["trigger"] == "timer" {
            (stopped, in_a_row) = (stopped + 1, in_a_row + 1);
            most_in_a_row = most_in_a_row.max(in_a_row);
        } else if l["message"] == "published" && l["trigger"] == "timer" {
            (published, in_a_row) = (published + 1, 0);
        }
    }
    eprintln!("{rounds} mount changes; timer scans: {stopped} stopped, {published} published, {most_in_a_row} stops in a row at most");
    assert!(stopped > 0, "no timer scan stopped for the {rounds} mount changes:\n{log}");
    assert!(published >= 3, "{published} timer scans were published in 6 s ({stopped} stopped):\n{log}");
    assert!(most_in_a_row <= 3, "{most_in_a_row} timer scans stopped in a row:\n{log}");

    // Settled: the daemon's mounts of the device are a one-shot full scan's (the host's only).
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        let deadline = tokio::time::Instant::now() + REACT;
        loop {
            let (ours, full) = (daemon_mounts(&mut c, &dev).await, full_scan_mounts(&dev));
            if ours == full {
                assert_eq!(ours.len(), 1, "the host's mount alone: {ours:?}");
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the daemon shows {ours:?}, a full scan {full:?}"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
}
