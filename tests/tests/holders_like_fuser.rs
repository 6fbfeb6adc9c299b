//! `holders` shaped like `fuser -v` (issue 38), on the real kernel: a loop device with ext4
//! mounted in a scratch directory and real processes holding it every way fuser names (a working
//! directory, a file open for reading, one open for writing, a mapped file, a program run from it,
//! a root chrooted into it); both CLIs (the one-shot agent, and agentctl asking a daemon) must list
//! each process once, with the access letters `fuser -v -m` prints for it. Then several devices
//! and paths in one call (and a tmpfs path's error), and `-v`'s long form.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "mount", "umount", "fuser", "stdbuf", "python3"];

/// pid -> ACCESS, from lines `... PID ACCESS COMMAND` (fuser -v's, and holders' process table).
fn access_by_pid(table: &str) -> BTreeMap<u32, Vec<String>> {
    let is_access = |t: &str| {
        t.len() == 5 && t.chars().zip(["fF.", "r.", "c.", "e.", "m."]).all(|(c, ok)| ok.contains(c))
    };
    let mut out: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for line in table.lines() {
        let t: Vec<&str> = line.split_whitespace().collect();
        for w in t.windows(2) {
            if let (Ok(pid), true) = (w[0].parse::<u32>(), is_access(w[1])) {
                out.entry(pid).or_default().push(w[1].to_owned());
                break;
            }
        }
    }
    out
}

/// What `fuser -v -m MOUNT` prints: its table goes to stderr and the pids to stdout, so stdout
/// is unbuffered and both go to one pipe, in order.
fn fuser(mount: &Path) -> BTreeMap<u32, Vec<String>> {
    let out = Command::new("sh")
        .args(["-c", "stdbuf -o0 fuser -v -m \"$0\" 2>&1", utf8(mount)])
        .stdin(Stdio::null())
        .output()
        .expect("fuser");
    let t = text(&out.stdout);
    let table: String =
        t.lines().filter(|l| !l.starts_with("Cannot stat")).map(|l| format!("{l}\n")).collect();
    access_by_pid(&table)
}

/// A process started by `sh -c SCRIPT ARG` (killed and reaped on drop).
fn holder(script: &str, arg: &Path, cwd: Option<&Path>) -> Killed {
    let mut c = Command::new("sh");
    c.args(["-c", script, utf8(arg)]).stdin(Stdio::null()).stdout(Stdio::null());
    if let Some(d) = cwd {
        c.current_dir(d);
    }
    Killed(c.spawn().expect("spawn a holder"))
}

/// A mounted ext4 loop device with a file and a program on it.
struct Scene {
    s: Scratch,
    mnt: std::path::PathBuf,
    _mount: HostMount,
    lo: LoopDev,
}

fn scene(s: Scratch) -> Scene {
    let mnt = s.mkdir("mnt");
    let (mount, lo) = s.loop_mount("vol.img", &mnt);
    std::fs::write(mnt.join("data"), b"some bytes to map\n").expect("write a file on it");
    std::fs::copy("/bin/sleep", mnt.join("sleep")).expect("copy a program on it");
    std::fs::create_dir(mnt.join("sub")).expect("mkdir on it");
    Scene { s, mnt, _mount: mount, lo }
}

/// Every way fuser names, one process each; their pids.
fn holders_of_every_kind(sc: &Scene) -> (Vec<Killed>, Vec<u32>) {
    let data = sc.mnt.join("data");
    let procs = vec![
        holder("exec sleep 1000", &data, Some(&sc.mnt.join("sub"))), // c
        holder("exec 3<\"$0\"; exec sleep 1000", &data, None),       // f
        holder("exec 3>>\"$0\"; exec sleep 1000", &data, None),      // F
        holder("exec \"$0\" 1000", &sc.mnt.join("sleep"), None),     // e
        // m (Python's mmap keeps a dup of the fd: f too, for fuser as for the agent)
        holder(
            "exec python3 -c 'import mmap,sys,time; f=open(sys.argv[1],\"rb\"); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); f.close(); time.sleep(1000)' \"$0\"",
            &data,
            None,
        ),
        // r (python chroots itself; its program and libraries stay on the host's filesystem)
        holder("exec python3 -c 'import os,sys,time; os.chroot(sys.argv[1]); time.sleep(1000)' \"$0\"", &sc.mnt, None),
    ];
    let pids = procs.iter().map(|k| k.0.id()).collect();
    (procs, pids)
}

fn agentctl(socket: &Path, args: &[&str]) -> Output {
    Command::new(agent_bin().with_file_name("agentctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run agentctl")
}

/// `fuser`'s view of our processes, once each has its letter and the scene every kind of access
/// (exec, open, chroot and mmap take a moment: the Pythons longest).
fn fuser_when_settled(mnt: &Path, pids: &[u32]) -> BTreeMap<u32, Vec<String>> {
    fuser_when(mnt, &format!("every process of {pids:?} listed, every kind of access among them"), |seen| {
        let all: String = seen.values().flatten().cloned().collect();
        pids.iter().all(|p| seen.contains_key(p))
            && seen.values().all(|a| a.len() == 1)
            && pids.iter().filter(|p| seen[*p][0] == ".....").count() == 0
            && ['f', 'F', 'r', 'c', 'e', 'm'].iter().all(|l| all.contains(*l))
    })
}

/// `fuser -v -m` on `mnt` once `ready` holds of its answer (its holders have set themselves up:
/// a loaded machine may take seconds to start a Python); fails the test after 10 s.
fn fuser_when(
    mnt: &Path,
    what: &str,
    ready: impl Fn(&BTreeMap<u32, Vec<String>>) -> bool,
) -> BTreeMap<u32, Vec<String>> {
    let mut seen = BTreeMap::new();
    let settled = wait_until(Duration::from_secs(10), || {
        seen = fuser(mnt);
        ready(&seen)
    });
    assert!(settled, "fuser never showed {what}: {seen:?}");
    seen
}

#[test]
fn root_holders_list_each_process_once_with_fusers_letters_in_both_clis() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let sc = scene(s);
    let (_procs, pids) = holders_of_every_kind(&sc);
    // Every kind of access is in the scene, as fuser sees it.
    let want = fuser_when_settled(&sc.mnt, &pids);

    let out = agent(&["holders", &sc.lo.dev]);
    assert_eq!(out.status.code(), Some(2), "held: {}", text(&out.stderr));
    let table = text(&out.stdout);
    assert_eq!(access_by_pid(&table), want, "the agent's table against fuser -v -m:\n{table}");
    assert!(table.contains("PID") && table.contains("ACCESS") && table.contains("MOUNT NS"), "{table}");
    let mine: Vec<&str> = table.lines().filter(|l| l.starts_with(&format!("{} ", pids[0]))).collect();
    assert!(mine[0].contains("host"), "the mount namespace column says host: {table}");
    assert!(table.contains("mount (1):"), "the mount keeps a line of its own: {table}");

    let mut d = Daemon::start_with_global(sc.s.dir.path(), &["--rescan-interval", "2"], &[]);
    let mut last = String::new();
    let same = wait_until(REACT, || {
        let o = agentctl(&d.socket, &["holders", &sc.lo.dev]);
        last = format!("exit {:?}\n{}{}", o.status.code(), text(&o.stdout), text(&o.stderr));
        o.status.code() == Some(2) && access_by_pid(&text(&o.stdout)) == want
    });
    assert!(same, "agentctl holders against fuser -v -m ({want:?}):\n{last}\n{}", d.log_text());
    d.stop();
}

#[test]
fn root_holders_of_several_devices_and_paths() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let sc = scene(s);
    let _cwd = holder("exec sleep 1000", &sc.mnt, Some(&sc.mnt.join("sub")));
    let free = sc.s.loop_file("free.img");
    let tmp = sc.s.mkdir("tmp");
    let _tmpfs = HostMount::new("tmpfs", &tmp, &["-t", "tmpfs"]);
    let sub = sc.mnt.join("sub");
    let free_name = free.name().to_owned();
    let held_name = sc.lo.name().to_owned();

    // A path names its filesystem's device, in both CLIs.
    let out = agent(&["holders", utf8(&sub), "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one device: one JSON document");
    assert_eq!(v["document"], "device");
    assert_eq!(v["name"], held_name.as_str(), "{v:#}");
    assert_eq!(out.status.code(), Some(2));

    // Several: one document per device, one JSON line each; held wins the exit code.
    let out = agent(&["holders", &free.dev, utf8(&sub), "-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "one held, one free: held: {}", text(&out.stderr));
    let docs: Vec<serde_json::Value> =
        text(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    let names: Vec<&str> = docs.iter().map(|d| d["name"].as_str().unwrap_or("?")).collect();
    assert_eq!(names, [free_name.as_str(), held_name.as_str()]);
    assert!(docs.iter().all(|d| d["document"] == "device" && d["schema_version"] == 1));
    let out = agent(&["holders", &free.dev, "-o", "yaml"]);
    assert!(!text(&out.stdout).starts_with("---"), "one device: the one YAML document");
    let out = agent(&["holders", &free.dev, &sc.lo.dev, "-o", "yaml"]);
    assert_eq!(text(&out.stdout).matches("---\n").count(), 2, "a YAML stream: {}", text(&out.stdout));

    // The table: each device in turn.
    let out = agent(&["holders", &free.dev, utf8(&sc.mnt)]);
    let t = text(&out.stdout);
    assert!(t.contains(&format!("{free_name} (")) && t.contains(&format!("{held_name} (")), "{t}");
    assert_eq!(out.status.code(), Some(2));
    let out = agent(&["holders", &free.dev]);
    let alone = out.status.code();
    assert!(matches!(alone, Some(0) | Some(3)), "the free one alone: free or unknown: {alone:?}");

    // A path on a filesystem with no block device: an error naming the path, nothing printed.
    let d = Daemon::start(sc.s.dir.path(), &[]);
    for out in [
        agent(&["holders", &sc.lo.dev, utf8(&tmp)]),
        agentctl(&d.socket, &["holders", &sc.lo.dev, utf8(&tmp)]),
    ] {
        let e = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{e}");
        assert!(e.contains(utf8(&tmp)) && e.contains("tmpfs") && e.contains("no block device"), "{e}");
        assert!(out.stdout.is_empty(), "nothing printed: {}", text(&out.stdout));
    }

    // agentctl resolves the path on its side, to the same device.
    let mut last = String::new();
    let ok = wait_until(REACT, || {
        let o = agentctl(&d.socket, &["holders", utf8(&sub), &free.dev, "-o", "json"]);
        last = text(&o.stdout) + &text(&o.stderr);
        let names: Vec<String> = text(&o.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .map(|d| d["name"].as_str().unwrap_or("?").to_owned())
            .collect();
        o.status.code() == Some(2) && names == [held_name.clone(), free_name.clone()]
    });
    assert!(ok, "agentctl holders PATH DEV: {last}");
}

#[test]
fn root_holders_verbose_is_one_line_per_hold() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let sc = scene(s);
    // One process, three holds: its working directory, an open file, a mapping.
    let p = holder(
        "exec python3 -c 'import mmap,os,sys,time; os.chdir(os.path.dirname(sys.argv[1])); f=open(sys.argv[1],\"rb\"); m=mmap.mmap(f.fileno(),0,prot=mmap.PROT_READ); time.sleep(1000)' \"$0\"",
        &sc.mnt.join("data"),
        None,
    );
    let pid = p.0.id();
    // Its three holds as fuser shows them (once Python has made them).
    fuser_when(&sc.mnt, &format!("pid {pid} with f.c.m"), |seen| {
        seen.get(&pid).is_some_and(|a| a == &["f.c.m"])
    });

    let short = text(&agent(&["holders", &sc.lo.dev]).stdout);
    let rows: Vec<&str> = short.lines().filter(|l| l.starts_with(&format!("{pid} "))).collect();
    assert_eq!(rows.len(), 1, "one line for the process:\n{short}");
    assert!(rows[0].contains("f.c.m") && rows[0].contains("python3"), "{short}");
    assert!(!rows[0].contains(utf8(&sc.mnt)), "no paths on the process's line:\n{short}");

    let long = text(&agent(&["holders", &sc.lo.dev, "-v"]).stdout);
    let listed = long.split_once("holders (").map_or("", |(_, rest)| rest);
    let holds: Vec<&str> = listed.lines().filter(|l| l.contains(&format!("pid {pid}"))).collect();
    assert_eq!(holds.len(), 3, "one line per hold (cwd, open file, mapping):\n{long}");
    assert!(long.contains(utf8(&sc.mnt.join("data"))), "paths in the long form:\n{long}");
    assert!(long.contains("holders (4):"), "three holds and the mount:\n{long}");
}
