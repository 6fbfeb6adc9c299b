//! Real-kernel acceptance tests for issue 34's release doors (items 4, 5, 8): the promise that
//! nothing something uses is torn down or unmounted, where the kernel reaches further than a
//! mount's own propagation fields or a process's leader show.
//!
//! 1. (gotcha 29) A private copy in a pod's namespace whose *parent* is a peer of a shared host
//!    directory (a Bidirectional `/var/lib/kubelet`): detaching it would propagate the unmount
//!    through the parent's peer group and take the host's own mount of the device with it. The
//!    real `release --apply` refuses, naming the host's mount, and leaves it. The same when what
//!    the propagation would take is another device's mount at that place in a third namespace;
//!    and a pod whose parent is private still has its copy released.
//! 2. (gotcha 30) A thread of this test process joins a pod's namespace (`unshare(CLONE_FS)` +
//!    `setns`) and puts its working directory on the mount there: the release refuses, naming
//!    the pid, the tid and the namespace; once the thread steps off it, the mount is released
//!    through that very thread (the namespace's only task).
//! 3. `--force-busy` covers processes only: a loop device backed by a file on the filesystem
//!    still refuses, saying the flag does not cover it; where only processes use it, the release
//!    goes ahead and the journal's plan record holds the operator's reason.
//!
//! Every object is owned by a guard that cleans up on drop, even when an assertion fails; guards
//! are declared so that they drop in the safe order (threads and processes, then mounts, then
//! loop devices).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];

/// The scratch directory's state file and journal, as global flags.
fn files(s: &Scratch) -> Vec<String> {
    let p = |n: &str| s.path(n).to_string_lossy().into_owned();
    vec!["--state".into(), p("state.json"), "--journal".into(), p("journal.jsonl")]
}

/// `release DEV --apply` (plus `extra`): its exit code and everything it said.
fn release_apply(s: &Scratch, dev: &str, extra: &[&str]) -> (Option<i32>, String) {
    let f = files(s);
    let mut args: Vec<&str> = f.iter().map(String::as_str).collect();
    args.extend(["release", dev, "--apply"]);
    args.extend(extra);
    let out = agent(&args);
    let said =
        format!("exit {:?}\nstdout: {}\nstderr: {}", out.status.code(), text(&out.stdout), text(&out.stderr));
    (out.status.code(), said)
}

fn records(s: &Scratch) -> Vec<Value> {
    journal::read(&s.path("journal.jsonl"))
}

fn journal_text(s: &Scratch) -> String {
    journal::text(&s.path("journal.jsonl"))
}

/// The line for mount point `path` in a mountinfo file.
fn mountinfo_line(file: &str, path: &Path) -> Option<String> {
    let t = path.to_string_lossy().into_owned();
    std::fs::read_to_string(file)
        .ok()?
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(t.as_str()))
        .map(str::to_owned)
}

fn ns_inode(link: &str) -> u64 {
    let l = std::fs::read_link(link).unwrap_or_else(|e| panic!("{link}: {e}"));
    l.to_string_lossy().trim_start_matches("mnt:[").trim_end_matches(']').parse().expect("inode")
}

/// A tmpfs at `dir` made shared, as a Bidirectional kubelet directory is.
fn shared_dir(dir: &Path) -> HostMount {
    let m = HostMount::new("tmpfs", dir, &["-t", "tmpfs"]);
    sh("mount", &["--make-shared", utf8(dir)]);
    m
}

/// A kubelet directory as a Bidirectional mount leaves it: a shared tmpfs (`parent`), and the
/// empty `vol` below it where a volume is mounted (`parent` unmounts the tmpfs when dropped:
/// drop it after what is mounted at `vol`).
struct SharedKubelet {
    kubelet: PathBuf,
    vol: PathBuf,
    parent: HostMount,
}

impl SharedKubelet {
    fn new(s: &Scratch) -> Self {
        let kubelet = s.mkdir("kubelet");
        let vol = kubelet.join("vol");
        let parent = shared_dir(&kubelet);
        std::fs::create_dir(&vol).expect("mkdir");
        SharedKubelet { kubelet, vol, parent }
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Gotcha 29: an unmount propagates through the parent's peer group.

#[test]
fn root_a_release_never_unmounts_the_hosts_mount_through_the_parents_peer_group() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let SharedKubelet { kubelet, vol, parent } = SharedKubelet::new(&s);
    let host = HostMount::new(&lo.dev, &vol, &[]);
    // The pod's namespace keeps the parent a peer of the host's (propagation unchanged) and
    // makes only its copy of the device's mount private.
    let pod = NsProcess::spawn_with(
        "unchanged",
        &format!("mount --make-private {} && exec sleep 1000", utf8(&vol)),
    );
    let pod_mounts = format!("/proc/{}/mountinfo", pod.pid());
    assert!(
        wait_until(Duration::from_secs(5), || mountinfo_line(&pod_mounts, &vol)
            .is_some_and(|l| !l.contains("shared:"))),
        "the pod's copy never went private"
    );
    let pod_parent = mountinfo_line(&pod_mounts, &kubelet).expect("the pod's parent");
    assert!(pod_parent.contains("shared:"), "the pod's parent is still a peer: {pod_parent}");

    let (code, said) = release_apply(&s, &lo.dev, &[]);
    assert!(host.is_mounted(), "the host's own mount of {} is still there: {said}", lo.dev);
    assert!(mountinfo_line(&pod_mounts, &vol).is_some(), "the pod's copy was not detached: {said}");
    assert_eq!(code, Some(2), "refused while the host holds it: {said}");
    assert!(
        said.contains("would also unmount") && said.contains(utf8(&vol)) && said.contains("the host's"),
        "the refusal names the host's mount: {said}"
    );
    assert!(
        said.contains("peer group") && said.contains(utf8(&kubelet)),
        "and the parent it propagates through: {said}"
    );
    assert!(
        journal::intents(&records(&s), "detach_mount").is_empty(),
        "no detach was tried: {}",
        journal_text(&s)
    );
    drop(pod);
    drop(host);
    drop(parent);
}

#[test]
fn root_a_release_never_unmounts_another_devices_mount_at_the_same_place() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let a = LoopDev::attach(&s.ext4_image("a.img", 32));
    let b = LoopDev::attach(&s.ext4_image("b.img", 32));
    let SharedKubelet { kubelet, vol, parent } = SharedKubelet::new(&s);
    let host_a = HostMount::new(&a.dev, &vol, &[]);
    let (k, v) = (utf8(&kubelet), utf8(&vol));
    // The pod: its copy of A private below a parent that stays a peer.
    let pod = NsProcess::spawn_with("unchanged", &format!("mount --make-private {v} && exec sleep 1000"));
    let pod_mounts = format!("/proc/{}/mountinfo", pod.pid());
    assert!(wait_until(Duration::from_secs(5), || mountinfo_line(&pod_mounts, &vol)
        .is_some_and(|l| !l.contains("shared:"))));
    // A third namespace: its parent a slave of the group, B mounted at the same place.
    let other = NsProcess::spawn_with(
        "unchanged",
        &format!("mount --make-slave {k} && umount {v} && mount {} {v} && exec sleep 1000", b.dev),
    );
    let other_mounts = format!("/proc/{}/mountinfo", other.pid());
    let b_num =
        std::fs::read_to_string(format!("/sys/class/block/{}/dev", b.name())).expect("dev").trim().to_owned();
    assert!(
        wait_until(Duration::from_secs(5), || mountinfo_line(&other_mounts, &vol)
            .is_some_and(|l| l.contains(&b_num))),
        "the third namespace never mounted {}",
        b.dev
    );
    // The host lets go of A without propagating (its parent made private first): A is mounted
    // in the pod alone, a leak as far as the device goes.
    sh("mount", &["--make-private", k]);
    host_a.umount();
    assert!(mountinfo_line(&pod_mounts, &vol).is_some(), "the pod's copy stays");

    let (code, said) = release_apply(&s, &a.dev, &[]);
    assert!(
        mountinfo_line(&other_mounts, &vol).is_some_and(|l| l.contains(&b_num)),
        "{}'s mount in the third namespace is still there: {said}",
        b.dev
    );
    assert!(mountinfo_line(&pod_mounts, &vol).is_some(), "the pod's copy was not detached: {said}");
    assert_eq!(code, Some(2), "refused (the pod's copy still holds it): {said}");
    let other_ns = ns_inode(&format!("/proc/{}/ns/mnt", other.pid()));
    assert!(
        said.contains("would also unmount")
            && said.contains(&format!("mount namespace {other_ns}"))
            && said.contains(&format!("another device's mount ({b_num})")),
        "the refusal names the other device's mount and its namespace: {said}"
    );
    assert!(journal::intents(&records(&s), "detach_mount").is_empty(), "{}", journal_text(&s));
    drop((other, pod));
    drop(host_a);
    drop(parent);
}

#[test]
fn root_a_copy_below_a_private_parent_is_still_released() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let SharedKubelet { kubelet, vol, parent } = SharedKubelet::new(&s);
    let host = HostMount::new(&lo.dev, &vol, &[]);
    // The pod's whole copy private (as most pods' are): then the host lets go of its own mount,
    // which does not reach the pod, and the pod's copy is a leak.
    let pod = NsProcess::spawn_with(
        "unchanged",
        &format!("mount --make-rprivate {} && exec sleep 1000", utf8(&kubelet)),
    );
    let pod_mounts = format!("/proc/{}/mountinfo", pod.pid());
    assert!(wait_until(Duration::from_secs(5), || mountinfo_line(&pod_mounts, &kubelet)
        .is_some_and(|l| !l.contains("shared:"))));
    host.umount();
    assert!(mountinfo_line(&pod_mounts, &vol).is_some(), "the leak");
    let parent_line = mountinfo_line("/proc/self/mountinfo", &kubelet).expect("the host's parent");
    assert!(parent_line.contains("shared:"), "the host's parent is still shared: {parent_line}");

    let (code, said) = release_apply(&s, &lo.dev, &[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains("is free"), "{said}");
    assert!(mountinfo_line(&pod_mounts, &vol).is_none(), "detached in the pod: {said}");
    assert_eq!(journal::done(&records(&s), "detach_mount"), 1, "{}", journal_text(&s));
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "the filesystem is gone");
    drop(pod);
    drop(parent);
}

// ---------------------------------------------------------------------------------------------
// 2. Gotcha 30: a thread is not its process.

/// What the thread that joined the pod's namespace is told.
enum Ask {
    /// Step off the mount (to the namespace's root).
    Leave,
}

/// A thread of this process that joins the namespace of `pid` (its own filesystem context
/// first, as `setns` requires) and puts its working directory on `dir` there; it steps off when
/// asked, and ends (leaving the namespace) when the sender is dropped. Returns its tid.
fn thread_in_namespace_of(pid: u32, dir: &Path) -> (u32, mpsc::Sender<Ask>, std::thread::JoinHandle<()>) {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/mnt")).expect("its namespace");
    let dir = dir.to_owned();
    let (tid_tx, tid_rx) = mpsc::channel();
    let (ask_tx, ask_rx) = mpsc::channel::<Ask>();
    let t = std::thread::spawn(move || {
        use nix::sched::{setns, unshare, CloneFlags};
        unshare(CloneFlags::CLONE_FS).expect("unshare(CLONE_FS)");
        setns(ns, CloneFlags::CLONE_NEWNS).expect("setns");
        std::env::set_current_dir(&dir).expect("chdir onto the mount");
        tid_tx.send(nix::unistd::gettid().as_raw() as u32).expect("tid");
        while let Ok(Ask::Leave) = ask_rx.recv() {
            std::env::set_current_dir("/").expect("chdir /");
        }
    });
    let tid = tid_rx.recv().expect("the thread joined");
    (tid, ask_tx, t)
}

#[test]
fn root_a_thread_in_a_pods_namespace_with_its_cwd_on_the_mount_refuses_the_release() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let pod = NsProcess::spawn(&format!("mount {} {} && exec sleep 1000", lo.dev, utf8(&mnt)));
    assert!(wait_until(Duration::from_secs(5), || pod.has_mount(&mnt)), "the pod never mounted it");
    let pod_ns = pod.ns_inode();
    let (tid, ask, thread) = thread_in_namespace_of(pod.pid(), &mnt);
    let me = std::process::id();
    // The pod's own process goes: the namespace lives on through the thread alone.
    drop(pod);
    let task = format!("/proc/{me}/task/{tid}");
    assert_eq!(ns_inode(&format!("{task}/ns/mnt")), pod_ns);
    assert_ne!(ns_inode(&format!("/proc/{me}/ns/mnt")), pod_ns, "the leader is elsewhere");
    assert!(mountinfo_line(&format!("{task}/mountinfo"), &mnt).is_some());

    let (code, said) = release_apply(&s, &lo.dev, &[]);
    assert!(
        mountinfo_line(&format!("{task}/mountinfo"), &mnt).is_some(),
        "the mount under the thread stays: {said}"
    );
    assert_eq!(code, Some(2), "refused (held): {said}");
    assert!(
        said.contains(&format!("pid {me} ("))
            && said.contains(&format!("tid {tid} has its working directory on it"))
            && said.contains(&format!("in mount namespace {pod_ns}")),
        "the refusal names the pid, the tid and the namespace: {said}"
    );
    assert!(journal::intents(&records(&s), "detach_mount").is_empty(), "{}", journal_text(&s));

    // `holders` attributes the working directory to the thread, in the pod's namespace.
    let f = files(&s);
    let mut args: Vec<&str> = f.iter().map(String::as_str).collect();
    args.extend(["holders", &lo.dev, "--output", "json"]);
    let v: Value = serde_json::from_slice(&agent(&args).stdout).expect("json");
    let cwd = v["holders"].as_array().expect("holders").iter().find(|h| h["kind"] == "cwd").cloned();
    let cwd = cwd.unwrap_or_else(|| panic!("a cwd holder: {v:#}"));
    assert_eq!(
        (cwd["tid"].as_u64(), cwd["mount_namespace"].as_u64()),
        (Some(u64::from(tid)), Some(pod_ns)),
        "{v:#}"
    );
    // The pod's namespace lists this process (there through the thread alone), and is entered
    // through that task.
    let mount = v["holders"].as_array().expect("holders").iter().find(|h| h["kind"] == "mount").cloned();
    let mount = mount.unwrap_or_else(|| panic!("a mount holder: {v:#}"));
    assert_eq!(mount["pids"], serde_json::json!([me]), "{v:#}");
    assert_eq!(
        (mount["namespace_entry"]["pid"].as_u64(), mount["namespace_entry"]["tid"].as_u64()),
        (Some(u64::from(me)), Some(u64::from(tid))),
        "{v:#}"
    );

    // Stepped off it, the thread no longer holds it: released, entered through that very task.
    ask.send(Ask::Leave).expect("ask");
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_link(format!("{task}/cwd"))
        .is_ok_and(|c| c == Path::new("/"))));
    let (code, said) = release_apply(&s, &lo.dev, &[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.contains(&format!("via pid {me} tid {tid}")), "entered through the thread: {said}");
    assert!(mountinfo_line(&format!("{task}/mountinfo"), &mnt).is_none(), "detached: {said}");
    assert_eq!(journal::done(&records(&s), "detach_mount"), 1, "{}", journal_text(&s));
    drop(ask);
    thread.join().expect("thread");
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "the filesystem is gone");
}

// ---------------------------------------------------------------------------------------------
// 3. --force-busy covers processes, and nothing else.

/// The loop devices backed by a file on loop device `outer`'s filesystem (bound inside a pod's
/// namespace, so their paths are not the host's): every one detached on drop, told by the
/// backing file's device, which is `outer` itself (so none of another test's).
struct LoopsOn {
    outer: String,
}

impl LoopsOn {
    fn new(outer: &LoopDev) -> Self {
        let num = std::fs::read_to_string(format!("/sys/class/block/{}/dev", outer.name())).expect("dev");
        Self { outer: num.trim().to_owned() }
    }

    /// The loop devices whose backing file lives on `outer`.
    fn devices(&self) -> Vec<String> {
        let out = std::process::Command::new("losetup")
            .args(["-n", "-l", "-O", "NAME,BACK-MAJ:MIN"])
            .output()
            .map(|o| text(&o.stdout))
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (name, on) = (f.next()?, f.next()?);
                (on == self.outer).then(|| name.to_owned())
            })
            .collect()
    }
}

impl Drop for LoopsOn {
    fn drop(&mut self) {
        for d in self.devices() {
            let _ = std::process::Command::new("losetup").args(["-d", &d]).status();
        }
    }
}

#[test]
fn root_force_busy_does_not_cover_a_loop_device_backed_by_a_file_on_it() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let inner_img = mnt.join("inner.img");
    let name_file = s.path("inner-name");
    let inner = LoopsOn::new(&lo);
    // The pod mounts it, binds a loop device to a file on it, and has its cwd there too.
    let pod = NsProcess::spawn(&format!(
        "mount {lo} {m} && truncate -s 8M {img} && basename $(losetup -f --show {img}) > {out} && cd {m} && exec sleep 1000",
        lo = lo.dev,
        m = utf8(&mnt),
        img = utf8(&inner_img),
        out = utf8(&name_file)
    ));
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_to_string(&name_file)
        .is_ok_and(|n| !n.trim().is_empty())));
    let inner_name = std::fs::read_to_string(&name_file).expect("name").trim().to_owned();
    assert_eq!(
        inner.devices(),
        [format!("/dev/{inner_name}")],
        "{inner_name} is backed by a file on {}",
        lo.dev
    );

    let reason = "INC-34: the pod is gone";
    let (code, said) = release_apply(&s, &lo.dev, &["--force-busy", reason]);
    assert!(pod.has_mount(&mnt), "not detached: the loop device on it frees nothing: {said}");
    assert_eq!(code, Some(2), "refused (held): {said}");
    assert!(
        said.contains(&format!("loop device {inner_name} is backed by a file on it"))
            && said.contains("--force-busy does not cover these"),
        "the refusal names the loop device and says --force-busy does not cover it: {said}"
    );
    assert!(journal::intents(&records(&s), "detach_mount").is_empty(), "{}", journal_text(&s));
    drop(pod);
    drop(inner);
}

#[test]
fn root_force_busy_over_process_users_is_journaled_with_its_reason() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("vol.img", 32));
    let mnt = s.mkdir("mnt");
    let pod = NsProcess::spawn(&format!("mount {} {m} && cd {m} && exec sleep 1000", lo.dev, m = utf8(&mnt)));
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{}/cwd", pod.pid()))
        .is_ok_and(|c| c == mnt)));
    let reason = "INC-35: evicted pod, agent told to let go";
    let (code, said) = release_apply(&s, &lo.dev, &["--force-busy", reason]);
    assert!(!pod.has_mount(&mnt), "forced over a process user: detached: {said}");
    assert_eq!(code, Some(2), "the cwd still holds the detached filesystem: {said}");
    assert!(said.contains(reason), "the plan's notes say why: {said}");
    let recs = records(&s);
    let plan = recs
        .iter()
        .find(|r| r["phase"] == "plan")
        .unwrap_or_else(|| panic!("a plan record: {}", journal_text(&s)));
    assert_eq!(plan["force_busy"], reason, "the journaled plan holds the operator's reason: {plan:#}");
    assert_eq!(journal::done(&recs, "detach_mount"), 1, "{}", journal_text(&s));
    let audit = said.lines().find(|l| l.contains("phase=\"plan\""));
    assert!(audit.is_some_and(|l| l.contains(reason)), "the plan's audit line holds it too: {said}");
    drop(pod);
}
