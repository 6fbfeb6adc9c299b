//! Orphaned pod volume directories on the real kernel (issue 35, item 5): kubelet logs
//! "orphaned pod ... found, but volume paths are still present on disk" and operators `rm -rf`
//! them, wiping data still mounted somewhere. The scene, a kubelet directory in a scratch
//! directory on this machine's disk:
//!
//! - pod `GONE` (not in the stand-in API server, no process, no mount of its files) with four
//!   CSI volume directories: `pvc-empty` (`mount/`, empty), `pvc-full` (`mount/` and a file),
//!   `pvc-mounted` (`mount/` empty on the host, but an ext4 loop device mounted on it inside
//!   another mount namespace only, as a container or node_exporter would keep it) and
//!   `pvc-hostmount` (a tmpfs mounted on its `mount/` in the host's namespace);
//! - pod `uid-web-0` (Running on this node per the API) with an empty volume directory.
//!
//! Only `pvc-empty` goes (two `rmdir`s, deepest first, journaled); the others are listed with
//! why, the live pod's is not listed at all; through the one-shot binary and the daemon in
//! clean mode. The kernel itself would not stop the third: [`root_rmdir_from_another_namespace_detaches_the_mount`]
//! shows `rmdir` from the host removes a directory mounted on in another namespace and detaches
//! that mount (EBUSY comes only in the namespace where it is mounted).

use std::path::{Path, PathBuf};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::kube_mock::{node_object, ready_only, ApiServer, NODE};
use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];
const GONE: &str = "9f1e6c2a-4b3d-4e5f-8a7b-6c5d4e3f2a1b";
const LIVE: &str = "uid-web-0";
const CSI: &str = "volumes/kubernetes.io~csi";

/// The kubelet directory and what keeps its mounted directories mounted.
struct Scene {
    kdir: PathBuf,
    // Drop order: the namespace's process first (its mount and loop device go with it), then the
    // host's tmpfs.
    ns: NsProcess,
    host_mount: HostMount,
}

impl Scene {
    fn vol(&self, pod: &str, name: &str) -> PathBuf {
        self.kdir.join("pods").join(pod).join(CSI).join(name)
    }

    fn arg(pod: &str, name: &str) -> String {
        format!("pod-volume:{pod}/{CSI}/{name}")
    }
}

fn scene(s: &Scratch) -> Scene {
    let kdir = s.mkdir("kubelet");
    let pod = kdir.join("pods").join(GONE);
    for name in ["pvc-empty", "pvc-full", "pvc-mounted", "pvc-hostmount"] {
        std::fs::create_dir_all(pod.join(CSI).join(name).join("mount")).expect("mkdir");
    }
    std::fs::write(pod.join(CSI).join("pvc-full/data"), b"written after the unmount\n").expect("file");
    // What a dead pod leaves besides its volumes: kubelet's files, bind-mounted by nobody now.
    std::fs::write(pod.join("etc-hosts"), b"127.0.0.1 localhost\n").expect("etc-hosts");
    std::fs::create_dir_all(pod.join("containers/app")).expect("containers");
    std::fs::write(pod.join("containers/app/0a1b2c3d"), b"").expect("termination log");
    std::fs::create_dir_all(kdir.join("pods").join(LIVE).join(CSI).join("pvc-live")).expect("live pod");
    let img = s.ext4_image("mounted.img", 32);
    let target = pod.join(CSI).join("pvc-mounted/mount");
    let ns = NsProcess::spawn(&format!(
        "mount -o loop {} {} && echo data > {}/kept && exec sleep 1000",
        utf8(&img),
        utf8(&target),
        utf8(&target)
    ));
    assert!(wait_until(Duration::from_secs(10), || ns.has_mount(&target)), "mounted in the namespace");
    // And one mounted in the host's namespace, the agent's own (a tmpfs: nothing of a device).
    let host_mount = HostMount::new("tmpfs", &pod.join(CSI).join("pvc-hostmount/mount"), &["-t", "tmpfs"]);
    Scene { kdir, ns, host_mount }
}

/// The global flags of every run: the scene's kubelet directory, the stand-in API, no grace
/// period, the scratch journal and state.
fn globals<'a>(
    s: &'a Scratch,
    kdir: &'a Path,
    url: &'a str,
    journal: &'a str,
    state: &'a str,
) -> Vec<&'a str> {
    let _ = s;
    vec![
        "--kubelet-dir",
        utf8(kdir),
        "--kube-url",
        url,
        "--node-name",
        NODE,
        "--grace-period",
        "0",
        "--journal",
        journal,
        "--state",
        state,
    ]
}

fn run(globals: &[&str], args: &[&str]) -> (Option<i32>, String, String) {
    let all: Vec<&str> = globals.iter().chain(args).copied().collect();
    let out = agent(&all);
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

fn listed<'a>(scan: &'a Value, name: &str) -> Option<&'a Value> {
    scan["orphaned_volume_dirs"].as_array()?.iter().find(|d| d["name"] == name)
}

#[test]
fn root_only_the_empty_orphaned_directory_is_removed_by_the_one_shot_clean() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let sc = scene(&s);
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let url = server.url();
    let (journal, state) = (s.path("journal.jsonl"), s.path("state.json"));
    let g = globals(&s, &sc.kdir, &url, utf8(&journal), utf8(&state));

    // The mounted one: left alone, the mount in the other namespace untouched.
    // (Without the check of every namespace's table, the kernel would let the rmdir through
    // from here and detach that mount: see the last test.)
    let ns = sc.ns.ns_inode().to_string();
    let (code, out, err) = run(&g, &["clean", &Scene::arg(GONE, "pvc-mounted"), "--apply"]);
    let mounted_dir = sc.vol(GONE, "pvc-mounted").join("mount");
    assert!(mounted_dir.is_dir(), "the directory mounted in another namespace was removed: {out}\n{err}");
    assert!(sc.ns.has_mount(&mounted_dir), "and that namespace lost its mount: {out}\n{err}");
    assert_eq!(code, Some(2), "held: {out}\n{err}");
    assert!(out.contains("still mounted: mount") && out.contains(&ns), "{out}");
    assert!(out.contains("never `rm -rf` it"), "{out}");

    // `scan` lists the three orphaned directories with their verdicts; not the live pod's.
    let (code, out, err) = run(&g, &["scan", "-o", "json"]);
    assert!(matches!(code, Some(0 | 3)), "scan: {code:?}\n{err}");
    let scan: Value = serde_json::from_str(&out).expect("json");
    let verdict = |n: &str| listed(&scan, n).map(|d| d["verdict"].as_str().unwrap_or_default().to_owned());
    assert_eq!(verdict("pvc-empty").as_deref(), Some("removable"), "{:#}", scan["orphaned_volume_dirs"]);
    assert_eq!(verdict("pvc-full").as_deref(), Some("kept"));
    assert_eq!(verdict("pvc-mounted").as_deref(), Some("mounted"));
    assert_eq!(verdict("pvc-hostmount").as_deref(), Some("mounted"));
    assert_eq!(verdict("pvc-live"), None, "a pod on this node per the API is not orphaned");
    let mounted = listed(&scan, "pvc-mounted").expect("listed");
    assert!(
        mounted["mounts"]
            .as_array()
            .is_some_and(|m| m.iter().any(|l| l.as_str().is_some_and(|l| l.contains(&ns)))),
        "the mount is named with its namespace {ns}: {mounted:#}"
    );
    let (_, table, _) = run(&g, &["scan"]);
    assert!(table.contains("orphaned pod volume directories (4;"), "{table}");

    // The one mounted in the host's namespace: left alone, the tmpfs untouched.
    let (code, out, err) = run(&g, &["clean", &Scene::arg(GONE, "pvc-hostmount"), "--apply"]);
    assert_eq!(code, Some(2), "held: {out}\n{err}");
    assert!(out.contains("still mounted: mount") && out.contains("tmpfs"), "{out}");
    assert!(sc.host_mount.is_mounted(), "{out}");

    // The full one: left alone with what it holds.
    let (code, out, err) = run(&g, &["clean", &Scene::arg(GONE, "pvc-full"), "--apply"]);
    assert_eq!(code, Some(2), "held: {out}\n{err}");
    assert!(out.contains("not empty") && out.contains("data (file)"), "{out}");
    assert!(sc.vol(GONE, "pvc-full").join("data").is_file());

    // The live pod's: in use per the API.
    let live = format!("pod-volume:{LIVE}/{CSI}/pvc-live");
    let (code, out, _) = run(&g, &["clean", &live, "--apply"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("pod shop/web-0"), "{out}");
    assert!(sc.vol(LIVE, "pvc-live").is_dir());

    // The empty one: its dry run, then two rmdirs, deepest first, journaled.
    let (code, out, _) = run(&g, &["clean", &Scene::arg(GONE, "pvc-empty")]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("would remove the empty directory") && sc.vol(GONE, "pvc-empty").is_dir(), "{out}");
    let (code, out, err) = run(&g, &["clean", &Scene::arg(GONE, "pvc-empty"), "--apply", "-o", "json"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let doc: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(doc["document"], "results");
    let results: Vec<&str> = doc["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| r["result"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(results, ["done", "done"], "{doc:#}");
    assert!(!sc.vol(GONE, "pvc-empty").exists(), "removed");
    let records = blockjanitor_tests::journal::read(&journal);
    let intents = blockjanitor_tests::journal::intents(&records, "rmdir_pod_volume_dir");
    let paths: Vec<&str> = intents.iter().map(|i| i["step"]["path"].as_str().unwrap_or("")).collect();
    assert_eq!(
        paths,
        [format!("pods/{GONE}/{CSI}/pvc-empty/mount"), format!("pods/{GONE}/{CSI}/pvc-empty")],
        "deepest first: {}",
        blockjanitor_tests::journal::text(&journal)
    );
    assert_eq!(blockjanitor_tests::journal::done(&records, "rmdir_pod_volume_dir"), 2);
    assert_eq!(intents.len(), 2, "nothing else was ever attempted");
    // The rest of the scene, as it was.
    assert!(sc.vol(GONE, "pvc-full").join("data").is_file() && sc.vol(GONE, "pvc-mounted").is_dir());
    assert!(sc.ns.has_mount(&sc.vol(GONE, "pvc-mounted").join("mount")));
    drop(rt);
}

#[test]
fn root_clean_mode_removes_only_the_empty_orphaned_directory() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let sc = scene(&s);
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let url = server.url();
    // The budget (2 steps a minute) is the two rmdirs: clean mode acts on pod volume
    // directories first, so no device of this shared machine is cleaned within the minute.
    let d = Daemon::start_with_global(
        s.dir.path(),
        &["--kubelet-dir", utf8(&sc.kdir)],
        &[
            "--mode",
            "clean",
            "--grace-period",
            "0",
            "--kube-url",
            &url,
            "--node-name",
            NODE,
            "--max-actions-per-minute",
            "2",
            "--metrics-listen",
            "127.0.0.1:0",
            "--rescan-interval",
            "2",
        ],
    );
    assert!(
        wait_until(Duration::from_secs(30), || !sc.vol(GONE, "pvc-empty").exists()),
        "clean mode did not remove the empty orphaned directory; log:\n{}",
        d.log_text()
    );
    // The last rmdir's result is journaled after the directory is seen gone.
    let journal = s.path("journal.jsonl");
    let done = || {
        blockjanitor_tests::journal::done(
            &blockjanitor_tests::journal::read(&journal),
            "rmdir_pod_volume_dir",
        )
    };
    assert!(
        wait_until(Duration::from_secs(10), || done() == 2),
        "{}",
        blockjanitor_tests::journal::text(&journal)
    );
    let metrics = d.metrics.expect("metrics listener");
    assert!(
        wait_until(Duration::from_secs(10), || {
            let m = blockjanitor_tests::http::http_get(metrics, "/metrics");
            m.contains("blockjanitor_orphaned_volume_dirs{verdict=\"mounted\"} 2")
                && m.contains("blockjanitor_orphaned_volume_dirs{verdict=\"kept\"} 1")
                && m.contains("blockjanitor_orphaned_volume_dirs{verdict=\"removable\"} 0")
        }),
        "{}",
        blockjanitor_tests::http::http_get(metrics, "/metrics")
    );
    let m = blockjanitor_tests::http::http_get(metrics, "/metrics");
    assert!(
        m.contains("blockjanitor_actions_total{action=\"rmdir_pod_volume_dir\",result=\"done\"} 2"),
        "{m}"
    );
    // agentctl asks the daemon: the same list.
    let ctl = std::process::Command::new(agent_bin().with_file_name("agentctl"))
        .args(["--socket", utf8(&d.socket), "scan", "-o", "json"])
        .output()
        .expect("agentctl");
    let scan: Value = serde_json::from_slice(&ctl.stdout).expect("json");
    assert_eq!(
        listed(&scan, "pvc-mounted").map(|d| d["verdict"].clone()),
        Some("mounted".into()),
        "{scan:#}"
    );
    assert_eq!(listed(&scan, "pvc-full").map(|d| d["verdict"].clone()), Some("kept".into()));
    assert!(listed(&scan, "pvc-empty").is_none());
    assert!(sc.vol(GONE, "pvc-full").join("data").is_file() && sc.vol(GONE, "pvc-mounted").is_dir());
    assert!(
        sc.ns.has_mount(&sc.vol(GONE, "pvc-mounted").join("mount")),
        "the other namespace's mount lives on"
    );
    assert!(sc.vol(LIVE, "pvc-live").is_dir());
    drop(d);
    drop(rt);
}

/// What the kernel does, which is why the agent reads every namespace's table: `rmdir` of a
/// directory something is mounted on fails with `EBUSY` only in the namespace where the mount
/// is; from the host it succeeds, and the kernel detaches that namespace's mount.
#[test]
fn root_rmdir_from_another_namespace_detaches_the_mount() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let dir = s.mkdir("target");
    let img = s.ext4_image("k.img", 32);
    let ns = NsProcess::spawn(&format!("mount -o loop {} {} && exec sleep 1000", utf8(&img), utf8(&dir)));
    assert!(wait_until(Duration::from_secs(10), || ns.has_mount(&dir)));
    let inside = std::process::Command::new("nsenter")
        .args(["-t", &ns.pid().to_string(), "-m", "rmdir", utf8(&dir)])
        .output()
        .expect("nsenter");
    assert!(!inside.status.success() && text(&inside.stderr).contains("busy"), "{}", text(&inside.stderr));
    std::fs::remove_dir(&dir).expect("rmdir from the host succeeds");
    assert!(wait_until(Duration::from_secs(5), || !ns.has_mount(&dir)), "and the namespace lost its mount");
}

/// Killed after the first `rmdir` reached the kernel, before its result was journaled: the next
/// run closes that intent as `in_place` (the directory is gone) and removes what is left, each
/// step re-checked; the journal ends with nothing open.
#[test]
fn root_an_interrupted_rmdir_is_recovered_and_the_rest_removed() {
    use std::os::unix::process::ExitStatusExt;
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let kdir = s.mkdir("kubelet");
    let vol = kdir.join("pods").join(GONE).join(CSI).join("pvc-empty");
    std::fs::create_dir_all(vol.join("mount")).expect("mkdir");
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let url = server.url();
    let (journal, state) = (s.path("journal.jsonl"), s.path("state.json"));
    let g = globals(&s, &kdir, &url, utf8(&journal), utf8(&state));
    let mut args: Vec<&str> = g.clone();
    let arg = Scene::arg(GONE, "pvc-empty");
    args.extend(["clean", &arg, "--apply"]);
    // Step record 2 is the first rmdir's result: killed right before it, after the kernel call.
    let out = trust_init(&mut std::process::Command::new(agent_bin()))
        .env("BLOCKJANITOR_FAULT_SIGKILL_BEFORE_STEP_RECORD", "2")
        .args(&args)
        .output()
        .expect("run");
    assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(!vol.join("mount").exists() && vol.is_dir(), "the first rmdir ran, the second did not");
    let (code, out, err) = run(&g, &["clean", &arg, "--apply"]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    assert!(err.contains("(in_place): the rmdir of") && err.contains("the directory is gone"), "{err}");
    assert!(!vol.exists(), "{out}");
    let records = blockjanitor_tests::journal::read(&journal);
    for i in blockjanitor_tests::journal::intents(&records, "rmdir_pod_volume_dir") {
        assert!(
            records
                .iter()
                .any(|r| r["id"] == i["id"] && (r["phase"] == "result" || r["phase"] == "recovered")),
            "intent {} left open: {records:#?}",
            i["id"]
        );
    }
    let recovered: Vec<&Value> = records.iter().filter(|r| r["phase"] == "recovered").collect();
    assert_eq!(recovered.len(), 1);
    assert_eq!(recovered[0]["result"], "in_place");
    drop(rt);
}
