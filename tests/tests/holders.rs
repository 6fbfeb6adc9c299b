//! Real-kernel tests of the holder engine on loop devices, ext4 and mount namespaces (this
//! machine's kernel; no mocks). Each scene is torn down by guards even when an assertion fails.
//!
//! (a) incident 5 exactly, (b) a cwd pin that survives the release, (c) an open fd on the device
//! node from another namespace, (d) a loop device backed by a file on the device, (e) swap on a
//! loop device, (f) a namespace with no process, pinned by an nsfs bind mount. Plus: a mount in
//! the host's namespace is left alone, and `clean` detaches a free loop device.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];

fn holders(dev: &str) -> Value {
    agent_holders(&[], dev)
}

fn holders_of_kind<'a>(v: &'a Value, kind: &str) -> Vec<&'a Value> {
    v["holders"].as_array().expect("holders").iter().filter(|h| h["kind"] == kind).collect()
}

fn journal_in(s: &Scratch) -> String {
    s.path("journal.jsonl").to_string_lossy().into_owned()
}

#[test]
fn root_incident5_foreign_namespace_holder_is_released_without_killing() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mnt = s.mkdir("mnt");
    let (host_mount, lo) = s.loop_mount("vol.img", &mnt);
    let mut holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    host_mount.umount();
    assert!(jbd2_alive(lo.name()), "the filesystem is still mounted somewhere");

    let v = holders(&lo.dev);
    let mounts = holders_of_kind(&v, "mount");
    assert_eq!(mounts.len(), 1, "{v:#}");
    let h = mounts[0];
    assert!(h["pids"].as_array().expect("pids").contains(&Value::from(holder.pid())), "{h:#}");
    assert_eq!(h["mount_namespace"], holder.ns_inode());
    assert_eq!(h["in_host_namespace"], false);
    assert_eq!(h["mount_point"], mnt.to_str().expect("utf8"));
    assert_eq!(h["comm"], "sleep");
    // Both ways of reading mount tables (statmount prefilter, mountinfo text) agree.
    let text_only = agent_holders(&["--mount-reader", "mountinfo"], &lo.dev);
    assert_eq!(text_only["holders"], v["holders"]);
    let kthreads = v["kernel_threads"].to_string();
    assert!(kthreads.contains(&format!("jbd2/{}-8", lo.name())), "{kthreads}");

    // Dry run: a plan, no change.
    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("dry run"));
    assert!(holder.has_mount(&mnt), "dry run must not change anything");

    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev, "--apply"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(" -> done"), "{stdout}");
    assert!(holder.is_alive(), "release never kills the holder");
    assert!(!holder.has_mount(&mnt), "the mount is gone from the holder's namespace");
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "jbd2 thread still alive");
    assert!(wait_until(Duration::from_secs(10), || !lo.is_bound()), "loop device did not auto-clear");
    let audit = text(&out.stderr);
    assert!(audit.contains("phase=\"intent\"") && audit.contains("phase=\"result\""), "audit lines: {audit}");
    let journal = std::fs::read_to_string(s.path("journal.jsonl")).expect("journal");
    let phases: Vec<String> = journal
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("json")["phase"].as_str().unwrap_or("?").to_owned())
        .collect();
    assert_eq!(
        phases,
        ["plan", "intent", "result", "plan_end"],
        "the plan, intent and result, its end: {journal}"
    );
    assert!(journal.contains("\"result\":\"done\""));
}

#[test]
fn root_cwd_pin_survives_release_and_is_reported() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mnt = s.mkdir("mnt");
    let (host_mount, lo) = s.loop_mount("vol.img", &mnt);
    let mut holder = NsProcess::spawn(&format!("cd {} && exec sleep 1000", mnt.display()));
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    host_mount.umount();

    let v = holders(&lo.dev);
    assert_eq!(holders_of_kind(&v, "mount").len(), 1, "{v:#}");
    let cwd = holders_of_kind(&v, "cwd");
    assert_eq!(cwd.len(), 1, "{v:#}");
    assert_eq!(cwd[0]["pids"], serde_json::json!([holder.pid()]));
    assert_eq!(cwd[0]["mount_namespace"], holder.ns_inode());

    // Detaching a mount a process uses breaks it and frees nothing: refused (issue 17)...
    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(2), "refused: exit 2; {}", text(&out.stderr));
    assert!(text(&out.stdout).contains("has its working directory on it"), "{}", text(&out.stdout));
    assert!(holder.has_mount(&mnt), "refused: the mount stays");
    // ...unless the operator forces it.
    let out = agent(&[
        "--journal",
        &journal_in(&s),
        "release",
        &lo.dev,
        "--apply",
        "--force-busy",
        "show the pin",
        "--output",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(2), "still held: exit 2; {}", text(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(r["results"][0]["result"], "done", "{r:#}");
    assert_eq!(r["document"], "results", "{r:#}");
    let after = &r["after"][0];
    assert_eq!(holders_of_kind(after, "mount").len(), 0, "the mount was detached: {after:#}");
    assert_eq!(holders_of_kind(after, "cwd").len(), 1, "the cwd still pins the filesystem: {after:#}");
    assert!(holder.is_alive());
    assert!(!holder.has_mount(&mnt));
    assert!(lo.is_bound(), "the device stays busy while the cwd pins it");
    assert!(jbd2_alive(lo.name()), "the filesystem lives on, detached");
    let table = text(&agent(&["holders", &lo.dev]).stdout);
    assert!(table.contains("has its working directory on it"), "{table}");
}

#[test]
fn root_open_device_fd_in_another_namespace() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("raw.img", 8));
    // The process opens the node under another name in its own namespace, as a container does
    // with a raw block volume: matching must be by st_rdev, not by path.
    let alias = s.path("xvda");
    let script = format!(
        "mknod {a} b $(stat -c '%t %T' {d} | (read M m; echo $((0x$M)) $((0x$m)))) && exec 7<{a} && rm {a} && exec sleep 1000",
        a = alias.display(),
        d = lo.dev
    );
    let holder = NsProcess::spawn(&script);
    let pid = holder.pid();
    assert!(wait_until(Duration::from_secs(5), || std::fs::read_link(format!("/proc/{pid}/fd/7")).is_ok()));
    let v = holders(&lo.dev);
    let open = holders_of_kind(&v, "open_device");
    assert_eq!(open.len(), 1, "{v:#}");
    assert_eq!(open[0]["pids"], serde_json::json!([pid]));
    assert_eq!(open[0]["fds"], serde_json::json!([7]));
    assert_eq!(open[0]["mount_namespace"], holder.ns_inode());
    assert_eq!(open[0]["in_host_namespace"], false);
    assert!(
        open[0]["path"].as_str().expect("path").contains("xvda"),
        "the process's own path: {:#}",
        open[0]
    );

    let out = agent(&["--journal", &journal_in(&s), "clean", &lo.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(2), "clean refuses a held device");
    let msg = text(&out.stdout);
    assert!(msg.contains("refused") && msg.contains("has the device node open"), "{msg}");
    assert!(lo.is_bound());
    drop(holder);
}

#[test]
fn root_loop_backed_by_a_file_on_the_device() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mnt = s.mkdir("mnt");
    let (_host_mount, outer) = s.loop_mount("vol.img", &mnt);
    let inner_img = mnt.join("inner.img");
    std::fs::File::create(&inner_img).expect("create").set_len(4 << 20).expect("size");
    let inner = LoopDev::attach(&inner_img);

    let v = holders(&outer.dev);
    let lb = holders_of_kind(&v, "loop_backing");
    assert_eq!(lb.len(), 1, "{v:#}");
    assert_eq!(lb[0]["device"], inner.name());
    assert_eq!(lb[0]["path"], inner_img.to_str().expect("utf8"));
    let m = holders_of_kind(&v, "mount");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0]["in_host_namespace"], true);

    // release leaves the host's own mount and the loop device alone, and says so (exit 2: held).
    let out = agent(&["--journal", &journal_in(&s), "release", &outer.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(0), "nothing to do is not an error: {}", text(&out.stdout));
    let t = text(&out.stdout);
    assert!(t.contains("nothing to do"), "{t}");
    assert!(t.contains("in the host's mount namespace: left alone"), "{t}");
    assert!(t.contains(&format!("loop device {} is backed by a file on it", inner.name())), "{t}");
    let out = agent(&["--journal", &journal_in(&s), "clean", &outer.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(outer.is_bound() && inner.is_bound());
    drop(inner);
}

#[test]
fn root_swap_on_a_loop_device() {
    let Some((_serial, s)) = real_kernel_test(&[TOOLS, &["mkswap", "swapon", "swapoff"]].concat()) else {
        return;
    };
    let img = s.sparse_file("swap.img", 16);
    let lo = LoopDev::attach(&img);
    sh("mkswap", &["-q", &lo.dev]);
    struct SwapOn(String);
    impl Drop for SwapOn {
        fn drop(&mut self) {
            let _ = Command::new("swapoff").arg(&self.0).status();
        }
    }
    sh("swapon", &[&lo.dev]);
    let _swap = SwapOn(lo.dev.clone());
    let v = holders(&lo.dev);
    let sw = holders_of_kind(&v, "swap");
    assert_eq!(sw.len(), 1, "{v:#}");
    assert_eq!(sw[0]["path"], lo.dev.as_str());
    assert_eq!(sw[0]["source"], "partition");
    let out = agent(&["--journal", &journal_in(&s), "clean", lo.name(), "--apply"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stdout).contains("it is active swap"));
}

#[test]
fn root_namespace_pinned_by_nsfs_with_no_process() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mnt = s.mkdir("mnt");
    let img = s.ext4_image("vol.img", 32);
    let lo = LoopDev::attach(&img);
    // unshare --mount=FILE needs FILE on a private mount.
    let nsdir = s.mkdir("ns");
    let _bind = HostMount::new(nsdir.to_str().expect("utf8"), &nsdir, &["--bind"]);
    sh("mount", &["--make-private", nsdir.to_str().expect("utf8")]);
    let nsfile = nsdir.join("mnt");
    std::fs::File::create(&nsfile).expect("touch");
    let pin = HostMount { target: nsfile.clone() };
    let pin_arg = format!("--mount={}", nsfile.display());
    sh("unshare", &[&pin_arg, "--propagation", "private", "mount", &lo.dev, mnt.to_str().expect("utf8")]);
    // No process lives in that namespace now; only the nsfs bind mount keeps it.
    assert!(pin.is_mounted());
    assert!(jbd2_alive(lo.name()));

    let v = holders(&lo.dev);
    let m = holders_of_kind(&v, "mount");
    assert_eq!(m.len(), 1, "{v:#}");
    assert_eq!(m[0]["pids"], serde_json::json!([]), "no process in it");
    assert_eq!(m[0]["in_host_namespace"], false);
    assert_eq!(m[0]["mount_point"], mnt.to_str().expect("utf8"));
    assert_eq!(m[0]["namespace_entry"]["via"], "nsfs");
    use std::os::unix::fs::MetadataExt;
    let pinned_ns = std::fs::metadata(&nsfile).expect("stat nsfs").ino();
    assert_eq!(m[0]["mount_namespace"], pinned_ns, "the namespace behind the nsfs bind mount");

    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(0), "{}{}", text(&out.stdout), text(&out.stderr));
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "the filesystem was released");
    let v = holders(&lo.dev);
    assert_eq!(v["holders"], serde_json::json!([]), "free: {v:#}");
    drop(pin);
}

#[test]
fn root_clean_detaches_a_free_loop_device_and_is_idempotent() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let lo = LoopDev::attach(&s.ext4_image("free.img", 8));
    // Stale only after the grace period, observed unheld: the default (300 s) refuses it now.
    let out = agent(&["--journal", &journal_in(&s), "clean", &lo.dev]);
    assert_eq!(out.status.code(), Some(4), "refused, not stale yet: {}", text(&out.stdout));
    assert!(text(&out.stdout).contains("not stale"), "{}", text(&out.stdout));
    let out = agent(&["--journal", &journal_in(&s), "--grace-period", "0", "clean", &lo.dev]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("detach loop device"), "{}", text(&out.stdout));
    assert!(lo.is_bound(), "dry run changes nothing");
    let r = agent_json(
        &[
            "--journal",
            &journal_in(&s),
            "--grace-period",
            "0",
            "clean",
            &lo.dev,
            "--apply",
            "--output",
            "json",
        ],
        0,
    );
    assert_eq!(r["results"][0]["result"], "done", "{r:#}");
    assert!(!lo.is_bound());
    // Again: an unbound loop device needs nothing.
    let out = agent(&["--journal", &journal_in(&s), "clean", &lo.dev, "--apply"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out.stdout).contains("nothing to do"));
}

#[test]
fn root_foreign_mount_shared_with_the_host_is_left_alone() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mnt = s.mkdir("mnt");
    let (host_mount, lo) = s.loop_mount("vol.img", &mnt);
    sh("mount", &["--make-shared", mnt.to_str().expect("utf8")]);
    // Bidirectional propagation: the child's copy joins the host mount's peer group.
    let child = Command::new("unshare")
        .args(["-m", "--propagation", "unchanged", "sleep", "1000"])
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("spawn");
    let holder = NsProcess { child };
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&mnt)));
    let v = holders(&lo.dev);
    let mounts = holders_of_kind(&v, "mount");
    assert_eq!(mounts.len(), 2, "{v:#}");
    let groups: Vec<&Value> = mounts.iter().map(|m| &m["shared_group"]).collect();
    assert!(groups[0].is_u64() && groups[0] == groups[1], "one peer group: {groups:?}");

    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev, "--apply"]);
    let t = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "nothing to do: {t}");
    assert!(t.contains("nothing to do") && t.contains("shared peer"), "{t}");
    assert!(host_mount.is_mounted(), "the host's mount must survive");
    assert!(holder.has_mount(&mnt));
    let journal = std::fs::read_to_string(s.path("journal.jsonl")).unwrap_or_default();
    assert!(!journal.contains("\"intent\""), "no step was taken: {journal}");
}

/// Raw bytes as a path (names that are not UTF-8).
fn bytes_path(b: &[u8]) -> std::path::PathBuf {
    use std::os::unix::ffi::OsStrExt;
    std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b))
}

fn path_bytes(p: &Path) -> &[u8] {
    use std::os::unix::ffi::OsStrExt;
    p.as_os_str().as_bytes()
}

/// True when the mountinfo at `table` (read as bytes) has `target` as a mount point; the kernel
/// escapes space, tab, newline and backslash there and prints every other byte as it is.
fn mounted_in(table: &str, target: &Path) -> bool {
    let mut want = Vec::new();
    for &b in path_bytes(target) {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => want.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => want.push(b),
        }
    }
    std::fs::read(table).is_ok_and(|m| {
        m.split(|&b| b == b'\n').any(|l| l.split(|&b| b == b' ').nth(4) == Some(want.as_slice()))
    })
}

/// `mount -o loop IMAGE TARGET` on the host for a target whose name is not UTF-8 (HostMount
/// takes text); lazily unmounted on drop if still there.
struct BytesMount(std::path::PathBuf);

impl BytesMount {
    fn loop_image(image: &Path, target: &Path) -> Self {
        let st = Command::new("mount").arg("-o").arg("loop").arg(image).arg(target).status().expect("mount");
        assert!(st.success(), "mount -o loop {} {:?}", image.display(), target);
        Self(target.to_owned())
    }

    fn is_mounted(&self) -> bool {
        mounted_in("/proc/self/mountinfo", &self.0)
    }
}

impl Drop for BytesMount {
    fn drop(&mut self) {
        while self.is_mounted() {
            if !Command::new("umount").arg("-l").arg(&self.0).status().is_ok_and(|s| s.success()) {
                break;
            }
        }
    }
}

/// Incident 5 with a hostile name (gotcha 20): the mount point is not UTF-8 and holds a space and
/// a backslash (which the kernel escapes as `\040` and `\134`). Any user with an unprivileged user
/// namespace can make one; it must not blind the scan, it shows escaped, and release detaches it
/// through the raw bytes.
#[test]
fn root_non_utf8_mount_point_in_a_foreign_namespace_scans_and_releases() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let parent = s.mkdir("a\\ b");
    let mut name = path_bytes(&parent).to_vec();
    name.extend_from_slice(b"/d\xff");
    let mnt = bytes_path(&name);
    std::fs::create_dir(&mnt).expect("mkdir d\\xff");
    let img = s.ext4_image("vol.img", 32);
    let host_mount = BytesMount::loop_image(&img, &mnt);
    let lo = LoopDev::adopt(&loop_for(&img).expect("mount -o loop made a loop device"), &img);
    let mut holder = NsProcess::spawn("exec sleep 1000");
    let ns_table = format!("/proc/{}/mountinfo", holder.pid());
    assert!(wait_until(Duration::from_secs(5), || mounted_in(&ns_table, &mnt)));
    let st = Command::new("umount").arg(&mnt).status().expect("umount");
    assert!(st.success() && !host_mount.is_mounted(), "unmounted on the host");
    assert!(jbd2_alive(lo.name()), "the filesystem is still mounted in the holder's namespace");

    // The whole-node scan does not fail on the name.
    let scan = agent_json(&["scan", "--output", "json"], 0);
    let entry = find_device(&scan, lo.name());
    let escaped = format!("{}/d\\xff", parent.to_str().expect("utf8").replace('\\', "\\\\"));
    assert!(escaped.ends_with(r"/a\\ b/d\xff"), "{escaped}");
    let in_scan: Vec<&Value> = entry["holders"].as_array().expect("holders").iter().collect();
    assert!(
        in_scan.iter().any(|h| h["kind"] == "mount" && h["mount_point"] == escaped.as_str()),
        "{entry:#}"
    );

    let v = holders(&lo.dev);
    let mounts = holders_of_kind(&v, "mount");
    assert_eq!(mounts.len(), 1, "{v:#}");
    let h = mounts[0];
    assert_eq!(h["in_host_namespace"], false);
    assert_eq!(h["mount_namespace"], holder.ns_inode());
    assert!(h["mount_point"].as_str().expect("mount_point").ends_with(r"d\xff"), "{h:#}");
    assert_eq!(h["mount_point"], escaped.as_str(), "escaped losslessly");
    let text_only = agent_holders(&["--mount-reader", "mountinfo"], &lo.dev);
    assert_eq!(text_only["holders"], v["holders"]);
    let table = agent(&["holders", &lo.dev]);
    assert_eq!(table.status.code(), Some(2), "held, as the table says");
    assert!(text(&table.stdout).contains(&escaped), "{}", text(&table.stdout));

    let out = agent(&["--journal", &journal_in(&s), "release", &lo.dev, "--apply"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(" -> done") && stdout.contains(&escaped), "{stdout}");
    assert!(holder.is_alive(), "release never kills the holder");
    assert!(!mounted_in(&ns_table, &mnt), "the mount is gone from the holder's namespace");
    assert!(wait_until(Duration::from_secs(10), || !jbd2_alive(lo.name())), "jbd2 thread still alive");
    assert!(wait_until(Duration::from_secs(10), || !lo.is_bound()), "loop device did not auto-clear");
}

/// A loop device whose backing file's name is not UTF-8: sysfs `loop/backing_file` is bytes; the
/// scan shows it escaped, and `clean` still detaches the device.
#[test]
fn root_non_utf8_loop_backing_file() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let mut name = path_bytes(s.dir.path()).to_vec();
    name.extend_from_slice(b"/img\xfe.img");
    let img = bytes_path(&name);
    std::fs::File::create(&img).expect("create").set_len(4 << 20).expect("size");
    let out = Command::new("losetup").arg("-f").arg("--show").arg(&img).output().expect("losetup");
    assert!(out.status.success(), "losetup: {}", text(&out.stderr));
    let dev = text(&out.stdout).trim().to_owned();
    let loop_name = dev.trim_start_matches("/dev/");
    let sysfs = format!("/sys/class/block/{loop_name}/loop/backing_file");
    /// Detaches the device on drop while it is still bound (LoopDev compares backing files as text).
    struct Detach(String, String);
    impl Drop for Detach {
        fn drop(&mut self) {
            if Path::new(&self.1).exists() {
                let _ = Command::new("losetup").args(["-d", &self.0]).status();
            }
        }
    }
    let _guard = Detach(dev.clone(), sysfs.clone());

    let scan = agent_json(&["scan", "--output", "json"], 0);
    let entry = find_device(&scan, loop_name);
    let want = format!("{}/img\\xfe.img", s.dir.path().to_str().expect("utf8"));
    assert_eq!(entry["loop"]["backing_file"], want.as_str(), "{entry:#}");
    let out = agent(&["--journal", &journal_in(&s), "--grace-period", "0", "clean", &dev, "--apply"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains(&want), "{stdout}");
    assert!(wait_until(Duration::from_secs(5), || !Path::new(&sysfs).exists()), "still bound");
}
