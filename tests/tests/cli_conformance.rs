//! The CLI conformance test (issue 21's acceptance): every subcommand of both binaries
//! (`blockjanitor-agent`'s one-shot commands, and `agentctl` asking a daemon serving the same
//! host) with every `-o` value against one real scene, checking the exit code of each case, every
//! JSON document (and YAML parsed to JSON) against docs/schema/blockjanitor-v1.schema.json, and
//! that both binaries give the same answer to the same question.
//!
//! The scene (real loop devices, ext4, a private mount namespace):
//! - HELD: a loop device whose ext4 filesystem is mounted only in a foreign mount namespace
//!   (incident 5: a process's private copy of a mount the host has let go of);
//! - FREE: a bound loop device nothing holds;
//! - DELETED: a bound loop device whose backing file is deleted, nothing holds it.
//!
//! Both binaries run with a grace period of an hour, so FREE and DELETED are cleanup candidates
//! that are not stale yet: cleaning them is refused (exit 4), while releasing HELD's foreign copy
//! may go (0). The cases: held 2, free 0, refused 4, error 1 (an unknown device name), and
//! unknown 3: both binaries once more without CAP_SYS_PTRACE (a second daemon), so this test's
//! own process is a blind spot that could hide a holder of FREE.
//!
//! Answers are compared as JSON after taking out only what differs between two scans of an
//! unchanged scene (`support/schema.rs`: scan numbers and times, `stats` and durations,
//! `warnings`, the transient `kworker/...` workqueue threads among
//! `kernel_threads`, durations inside `reasons` and the "grace clock started now" reason: each
//! binary's grace clock starts at its own first sight); `scan` is compared on the scene's devices (the rest of
//! the host changes between two scans: other processes open and close the root disk).

#[path = "support/schema.rs"]
mod schema;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;
use schema::{without_scan_dependent, Schema};
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "mount", "umount"];
const OUTPUTS: &[&str] = &["table", "wide", "json", "yaml"];
/// The grace period both binaries run with: long enough that no candidate of the scene is stale.
const GRACE: &str = "3600";
/// The pod whose volume directory the scene's kubelet directory keeps.
const ORPHAN_POD: &str = "9f1e6c2a-4b3d-4e5f-8a7b-6c5d4e3f2a1b";

/// A loop device held only by a mount in a foreign mount namespace (the host unmounted it).
struct Held {
    // Field order is drop order: the namespace's process first (its mount goes with it), then
    // the loop device.
    _ns: NsProcess,
    lo: LoopDev,
}

fn held(s: &Scratch, name: &str) -> Held {
    let mnt = s.mkdir(&format!("{name}-mnt"));
    let (host_mount, lo) = s.loop_mount(&format!("{name}.img"), &mnt);
    let ns = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || ns.has_mount(&mnt)), "the namespace copied the mount");
    host_mount.umount();
    Held { _ns: ns, lo }
}

/// The scene, and how to run each binary against it.
struct Scene {
    // Drop order: the daemon, then the devices, then the scratch directory.
    daemon: Daemon,
    held: Held,
    free: LoopDev,
    deleted: LoopDev,
    s: Scratch,
}

impl Scene {
    fn new() -> Option<(std::sync::MutexGuard<'static, ()>, Self)> {
        let (serial, s) = real_kernel_test(TOOLS)?;
        let held = held(&s, "held");
        let free = s.loop_file("free.img");
        let deleted = s.loop_file("deleted.img");
        std::fs::remove_file(s.path("deleted.img")).expect("delete the backing file");
        // A kubelet directory with one orphaned pod volume directory (its pod is gone; no API is
        // asked, so its verdict is unknown) for the `devices` document's `orphaned_volume_dirs`.
        std::fs::create_dir_all(
            s.path(&format!("kubelet/pods/{ORPHAN_POD}/volumes/kubernetes.io~csi/pvc-1/mount")),
        )
        .expect("orphaned directory");
        let kubelet = s.path("kubelet");
        let daemon = Daemon::start_with_global(
            s.dir.path(),
            &["--kubelet-dir", utf8(&kubelet)],
            &["--grace-period", GRACE],
        );
        Some((serial, Self { daemon, held, free, deleted, s }))
    }

    fn agent(&self, args: &[&str]) -> Output {
        let state = self.s.path("cli-state.json");
        let journal = self.s.path("cli-journal.jsonl");
        let kubelet = self.s.path("kubelet");
        let mut all = vec![
            "--grace-period",
            GRACE,
            "--state",
            utf8(&state),
            "--journal",
            utf8(&journal),
            "--kubelet-dir",
            utf8(&kubelet),
        ];
        all.extend_from_slice(args);
        agent(&all)
    }

    fn agentctl(&self, args: &[&str]) -> Output {
        Command::new(agent_bin().with_file_name("agentctl"))
            .arg("--socket")
            .arg(&self.daemon.socket)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run agentctl")
    }

    /// Runs `args -o output` with the binary `bin` ("agent" or "agentctl").
    fn run(&self, bin: &str, args: &[&str], output: &str) -> Output {
        let mut all = args.to_vec();
        all.extend(["-o", output]);
        if bin == "agent" {
            self.agent(&all)
        } else {
            self.agentctl(&all)
        }
    }
}

/// One case: the arguments, the exit code, the document printed (`None`: an error, no document).
struct Case {
    args: Vec<String>,
    code: i32,
    document: Option<&'static str>,
}

fn case(args: &[&str], code: i32, document: Option<&'static str>) -> Case {
    Case { args: args.iter().map(|a| (*a).to_owned()).collect(), code, document }
}

/// Runs `c` with `bin` and `output`; checks the exit code and, for JSON and YAML, the document
/// against the schema. Returns the document (JSON or YAML parsed to JSON).
fn check_one(scene: &Scene, schema: &Schema, bin: &str, c: &Case, output: &str) -> Option<Value> {
    let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
    let out = scene.run(bin, &args, output);
    let what = format!("{bin} {} -o {output}", args.join(" "));
    assert_eq!(
        out.status.code(),
        Some(c.code),
        "{what}: exit code\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let Some(document) = c.document else {
        assert!(!out.stderr.is_empty(), "{what}: an error says why on stderr");
        return None;
    };
    let doc: Value = match output {
        "json" => serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not JSON ({e})")),
        "yaml" => serde_yaml_ng::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{what}: not YAML ({e})")),
        _ => {
            assert!(!out.stdout.is_empty(), "{what}: a table");
            return None;
        }
    };
    schema.check(&doc, document, &what);
    Some(doc)
}

/// Runs `c` with `bin` and every output ([`check_one`]); the YAML is the JSON's document.
/// Returns the JSON document.
fn check(scene: &Scene, schema: &Schema, bin: &str, c: &Case) -> Option<Value> {
    check_seen(scene, schema, bin, c, Value::clone)
}

/// [`check`], comparing the YAML with the JSON as `seen` shows them (a scan: its scene devices;
/// the rest of the host moves between two scans).
fn check_seen(
    scene: &Scene,
    schema: &Schema,
    bin: &str,
    c: &Case,
    seen: impl Fn(&Value) -> Value,
) -> Option<Value> {
    let mut json = None;
    for output in OUTPUTS {
        let doc = check_one(scene, schema, bin, c, output);
        match (*output, doc) {
            ("json", d) => json = d,
            ("yaml", Some(d)) => assert_eq!(
                without_scan_dependent(seen(&d)),
                without_scan_dependent(seen(json.as_ref().expect("json first"))),
                "{bin} {}: the YAML is the JSON's document",
                c.args.join(" ")
            ),
            _ => {}
        }
    }
    json
}

/// The scene's devices of a `devices` document, by name.
fn scene_devices(doc: &Value, names: &[&str]) -> Vec<Value> {
    let all = doc["devices"].as_array().expect("devices");
    names
        .iter()
        .map(|n| {
            all.iter().find(|d| d["name"] == *n).unwrap_or_else(|| panic!("{n} is not in {doc:#}")).clone()
        })
        .collect()
}

/// The same question gave the same answer (after taking out what differs between two scans).
fn same(question: &str, agent: Value, agentctl: Value) {
    let (a, c) = (without_scan_dependent(agent), without_scan_dependent(agentctl));
    let mut differ = Vec::new();
    differences("", &a, &c, &mut differ);
    assert!(
        differ.is_empty(),
        "{question}: the agent and agentctl differ at\n{}\nagent: {a:#}",
        differ.join("\n")
    );
}

/// The paths at which `a` and `b` differ, with both values.
fn differences(at: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys().filter(|k| !x.contains_key(*k))) {
                let (u, v) = (x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null));
                differences(&format!("{at}/{k}"), u, v, out);
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                differences(&format!("{at}/{i}"), u, v, out);
            }
        }
        _ if a != b => out.push(format!("  {at}: agent {a}, agentctl {b}")),
        _ => {}
    }
}

#[test]
fn root_both_clis_answer_every_subcommand_alike_in_every_format() {
    let Some((_serial, scene)) = Scene::new() else { return };
    let schema = Schema::load();
    let (held, free, deleted) = (scene.held.lo.name(), scene.free.name(), scene.deleted.name());
    let shared = [
        case(&["holders", held], 2, Some("device")),
        case(&["holders", free], 0, Some("device")),
        case(&["holders", deleted], 0, Some("device")),
        case(&["holders", "nosuchdevice0"], 1, None),
        case(&["plan", free], 4, Some("plans")),
        case(&["plan", held, "--release"], 0, Some("plans")),
        case(&["release", held], 0, Some("plans")),
        case(&["clean", free], 4, Some("plans")),
        case(&["clean", deleted], 4, Some("plans")),
        case(&["clean", held], 2, Some("plans")),
        case(&["clean", "nosuchdevice0"], 1, None),
        // apply without --yes: the plans shown, nothing carried out (2), or the plan's refusal
        // when worse (4: not stale yet).
        case(&["apply", held, "--release"], 2, Some("plans")),
        case(&["apply", free], 4, Some("plans")),
    ];
    for c in &shared {
        let a = check(&scene, &schema, "agent", c);
        let b = check(&scene, &schema, "agentctl", c);
        if let (Some(a), Some(b)) = (a, b) {
            same(&c.args.join(" "), a, b);
        }
    }
    // A protected device (the disk behind the host's root, as the scan finds it): a safety
    // rule's refusal, 4 in both (held or not), naming the rule that protects it.
    protected(&scene, &schema);
    // scan: the same scene devices (the rest of the host moves between two scans).
    let names = [held, free, deleted];
    let seen = |d: &Value| Value::from(scene_devices(d, &names));
    let a = check_seen(&scene, &schema, "agent", &case(&["scan"], 0, Some("devices")), seen).expect("json");
    let b =
        check_seen(&scene, &schema, "agentctl", &case(&["scan"], 0, Some("devices")), seen).expect("json");
    same("scan", Value::from(scene_devices(&a, &names)), Value::from(scene_devices(&b, &names)));
    assert_eq!(a["complete"], true, "a scene with nothing hidden: {a:#}");
    let found = scene_devices(&a, &names);
    assert_eq!(found[0]["verdict"], "in_use");
    assert_eq!(found[0]["holders"][0]["kind"], "mount", "{:#}", found[0]);
    assert_eq!(found[0]["holders"][0]["in_host_namespace"], false);
    assert_eq!((found[1]["verdict"].as_str(), found[1]["in_use"].as_bool()), (Some("suspect"), Some(false)));
    assert_eq!(found[2]["loop"]["backing_deleted"], true, "{:#}", found[2]);
    // A filtered scan: the same filter in both CLIs lets the same scene devices through, and
    // only devices that match it (the suspect loop devices: the free one, not the held one).
    let filtered = case(&["scan", "--kind", "loop", "--verdict", "suspect"], 0, Some("devices"));
    let in_scene = |d: &Value| -> Value {
        let all = d["devices"].as_array().expect("devices");
        for dev in all {
            assert_eq!(
                (dev["kind"].as_str(), dev["verdict"].as_str()),
                (Some("loop"), Some("suspect")),
                "{dev:#}"
            );
        }
        let names: Vec<&Value> =
            all.iter().map(|dev| &dev["name"]).filter(|n| names.iter().any(|m| *n == *m)).collect();
        Value::from(names.into_iter().cloned().collect::<Vec<_>>())
    };
    let a = check_seen(&scene, &schema, "agent", &filtered, in_scene).expect("json");
    let b = check_seen(&scene, &schema, "agentctl", &filtered, in_scene).expect("json");
    assert_eq!(in_scene(&a), in_scene(&b), "agent: {a:#}\nagentctl: {b:#}");
    assert!(in_scene(&a).as_array().expect("names").contains(&Value::from(free)), "{a:#}");
    assert!(!in_scene(&a).as_array().expect("names").contains(&Value::from(held)), "{a:#}");
    let table = scene.agent(&["scan", "--kind", "loop", "--verdict", "suspect"]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("left out by the filter"), "{table}");
    // The orphaned pod volume directory, alike in both (unknown: no API is asked).
    let orphans = |d: &Value| -> Vec<(Value, Value)> {
        let list = d["orphaned_volume_dirs"].as_array().cloned().unwrap_or_default();
        list.iter().map(|o| (o["argument"].clone(), o["verdict"].clone())).collect()
    };
    let want = vec![(
        Value::from(format!("pod-volume:{ORPHAN_POD}/volumes/kubernetes.io~csi/pvc-1")),
        Value::from("unknown"),
    )];
    assert_eq!(orphans(&a), want, "{a:#}");
    assert_eq!(orphans(&b), want, "{b:#}");
    let dir = format!("pod-volume:{ORPHAN_POD}/volumes/kubernetes.io~csi/pvc-1");
    check(&scene, &schema, "agent", &case(&["clean", &dir], 3, Some("plans")));
    check(&scene, &schema, "agent", &case(&["clean", &dir, "--apply"], 3, Some("results")));

    // Each binary's own commands.
    check(&scene, &schema, "agent", &case(&["journal"], 0, Some("journal")));
    let c =
        check_seen(&scene, &schema, "agentctl", &case(&["devices"], 0, Some("devices")), seen).expect("json");
    assert_eq!(scene_devices(&c, &names).len(), 3, "devices is scan");
    check(&scene, &schema, "agentctl", &case(&["node"], 0, Some("node")));
    let d = check(&scene, &schema, "agentctl", &case(&["device", held], 0, Some("device"))).expect("json");
    let h = scene.agentctl(&["holders", held, "-o", "json"]);
    same("device and holders", d, serde_json::from_slice(&h.stdout).expect("JSON"));
    let completions = scene.agentctl(&["completions", "bash"]);
    assert_eq!(completions.status.code(), Some(0));
    assert!(text(&completions.stdout).contains("agentctl"));
    watch(&scene, &schema);
    carried_out(&scene, &schema);
    unknown(&scene, &schema);
}

/// `plan` and `clean` of every device the scan calls `protected` (the host root's disk and what
/// it sits on): exit 4 from both binaries, outcome `refused`, the refusal naming the rule
/// ("... is protected: it backs / on the host ..."). A host with no protected block device (a
/// root on tmpfs) says so and has no such case.
fn protected(scene: &Scene, schema: &Schema) {
    let out = scene.agent(&["scan", "-o", "json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("scan JSON");
    let names: Vec<String> = doc["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter(|d| d["verdict"] == "protected")
        .filter_map(|d| d["name"].as_str().map(str::to_owned))
        .collect();
    if names.is_empty() {
        eprintln!("no protected device on this host (its root is on no block device): no protected case");
        return;
    }
    for name in &names {
        for bin in ["agent", "agentctl"] {
            for op in ["plan", "clean"] {
                let v = check(scene, schema, bin, &case(&[op, name], 4, Some("plans"))).expect("json");
                let plan = &v["plans"][0];
                assert_eq!(plan["outcome"], "refused", "{bin} {op} {name}: {v:#}");
                let refusal = plan["refusal"].as_str().unwrap_or_default();
                assert!(
                    refusal.starts_with(&format!("{name} is protected: ")),
                    "{bin} {op} {name}: {refusal}"
                );
            }
        }
    }
}

/// `cmd` runs without CAP_SYS_PTRACE (dropped from its bounding set before exec, so root's exec
/// does not get it back): it cannot read the mount namespace of a process that keeps it, such as
/// this test, which is then a blind spot that could hide a holder of any device.
fn without_ptrace(cmd: &mut Command) -> &mut Command {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl(2), which
    // is async-signal-safe; it touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            let cap_sys_ptrace: libc::c_ulong = 19;
            if libc::prctl(libc::PR_CAPBSET_DROP, cap_sys_ptrace, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

/// Unknown (3): both binaries without CAP_SYS_PTRACE (a second daemon) cannot see this test
/// process, so a free device is `unknown`, never free: `holders` and `scan` exit 3 with
/// `complete: false` and the INCOMPLETE VIEW line, in every format.
fn unknown(scene: &Scene, schema: &Schema) {
    let dir = scene.s.mkdir("blind");
    let d = Daemon::start_configured(&dir, &[], &["--grace-period", GRACE], |c| {
        without_ptrace(c);
    });
    let free = scene.free.name();
    for output in OUTPUTS {
        for (args, document) in [(vec!["holders", free], "device"), (vec!["scan"], "devices")] {
            let mut all = args.clone();
            all.extend(["-o", output]);
            let agent = without_ptrace(trust_init(&mut Command::new(agent_bin())))
                .args(["--grace-period", GRACE, "--state", utf8(&dir.join("state.json"))])
                .args(&all)
                .stdin(Stdio::null())
                .output()
                .expect("run the agent");
            let ctl = Command::new(agent_bin().with_file_name("agentctl"))
                .arg("--socket")
                .arg(&d.socket)
                .args(&all)
                .stdin(Stdio::null())
                .output()
                .expect("run agentctl");
            for (bin, out) in [("agent", &agent), ("agentctl", &ctl)] {
                let what = format!("{bin} {} without CAP_SYS_PTRACE", all.join(" "));
                assert_eq!(
                    out.status.code(),
                    Some(3),
                    "{what}: unknown\n{}{}",
                    text(&out.stdout),
                    text(&out.stderr)
                );
                let doc: Value = match *output {
                    "json" => serde_json::from_slice(&out.stdout).expect("JSON"),
                    "yaml" => serde_yaml_ng::from_slice(&out.stdout).expect("YAML"),
                    _ => {
                        assert!(
                            text(&out.stdout).contains("INCOMPLETE VIEW"),
                            "{what}: {}",
                            text(&out.stdout)
                        );
                        continue;
                    }
                };
                schema.check(&doc, document, &what);
                assert_eq!(doc["complete"], false, "{what}: {doc:#}");
                assert!(
                    doc["incomplete_view"].as_str().is_some_and(|l| l.starts_with("INCOMPLETE VIEW")),
                    "{what}"
                );
                let device = if document == "device" { doc.clone() } else { find_device(&doc, free).clone() };
                assert_eq!(device["verdict"], "unknown", "{what}: {device:#}");
            }
        }
    }
}

/// `release --apply` and `apply --release --yes` of a fresh held device for each binary and
/// output: done (0), a `results` document, the foreign copy gone afterwards; both binaries'
/// JSON results are the same document (`resumed` and `after` included), once what names the
/// device itself is taken out ([`as_any_device`]): one engine answer, built once.
fn carried_out(scene: &Scene, schema: &Schema) {
    let mut n = 0;
    for verb in [&["release", "--apply"][..], &["apply", "--release", "--yes"][..]] {
        let mut json_docs = Vec::new();
        for output in OUTPUTS {
            for bin in ["agent", "agentctl"] {
                n += 1;
                let h = held(&scene.s, &format!("applied{n}"));
                let mut args = vec![verb[0], h.lo.name()];
                args.extend(&verb[1..]);
                let c = case(&args, 0, Some("results"));
                let doc = check_one(scene, schema, bin, &c, output);
                let what = format!("{bin} {} -o {output}", args.join(" "));
                let after = scene.agent(&["holders", h.lo.name(), "-o", "json"]);
                assert_eq!(
                    after.status.code(),
                    Some(0),
                    "{what}: the foreign copy is gone: {}",
                    text(&after.stdout)
                );
                if let Some(d) = doc.filter(|_| *output == "json") {
                    assert!(
                        d["results"].as_array().is_some_and(|r| !r.is_empty()),
                        "{what}: a step ran: {d:#}"
                    );
                    assert_eq!(
                        d["after"].as_array().map(Vec::len),
                        Some(1),
                        "{what}: the device afterwards: {d:#}"
                    );
                    assert!(d["resumed"].is_array(), "{what}: {d:#}");
                    json_docs.push(as_any_device(d, &h, &format!("applied{n}")));
                }
            }
        }
        let [agent, agentctl] = <[Value; 2]>::try_from(json_docs).expect("one JSON document from each");
        same(&format!("{verb:?}"), agent, agentctl);
    }
}

/// `text` with the number between each `before` and the `after` that follows it written `N`.
fn numbers_after(text: &str, before: &str, after: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(before) {
        let (head, tail) = rest.split_at(at + before.len());
        out.push_str(head);
        let digits = tail.bytes().take_while(u8::is_ascii_digit).count();
        if digits > 0 && tail[digits..].starts_with(after) {
            out.push('N');
            rest = &tail[digits..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// A results document with what names its own device written as placeholders: the loop
/// device's name and number, its scratch files' name, and the numbers that are its identity
/// (its backing file's inode, its diskseq, the identity token, the plan's id); so that two
/// documents of two devices set up alike compare equal when they say the same.
fn as_any_device(doc: Value, h: &Held, scratch: &str) -> Value {
    let name = h.lo.name();
    let devnum = std::fs::read_to_string(format!("/sys/block/{name}/dev")).unwrap_or_default();
    let mut text = doc.to_string().replace(scratch, "SCRATCH").replace(name, "LOOP");
    // The holder: its own process (pid), and what the kernel numbered for it (its namespace's
    // inode, the mount's ID), which a later device set up alike may or may not reuse.
    for (before, after) in [("via pid ", " "), ("mount namespace ", " "), ("(id ", ")")] {
        text = numbers_after(&text, before, after);
    }
    if !devnum.trim().is_empty() {
        text = text.replace(&format!("\"{}\"", devnum.trim()), "\"MAJ:MIN\"");
    }
    fn mask(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for (k, x) in m.iter_mut() {
                    let own = k.ends_with("inode")
                        || k.contains("diskseq")
                        || k.ends_with("devnum")
                        || ["identity", "plan_id", "minor", "backing_dev"].contains(&k.as_str());
                    if own && !x.is_null() {
                        *x = Value::String("OWN".into());
                    } else {
                        mask(x);
                    }
                }
            }
            Value::Array(a) => a.iter_mut().for_each(mask),
            _ => {}
        }
    }
    let mut v: Value = serde_json::from_str(&text).expect("still JSON");
    mask(&mut v);
    v
}

/// `agentctl watch` in every format: a loop device attached while it watches is one event
/// document (one JSON line; one YAML document), then it is stopped.
fn watch(scene: &Scene, schema: &Schema) {
    for output in OUTPUTS {
        let mut child = Killed(
            Command::new(agent_bin().with_file_name("agentctl"))
                .arg("--socket")
                .arg(&scene.daemon.socket)
                .args(["watch", "-o", output])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .expect("agentctl watch"),
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout = child.0.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // The stream starts with no backlog: attach devices until one shows (the first may come
        // before the subscription).
        let mut lines = Vec::new();
        let mut attached = Vec::new();
        let deadline = std::time::Instant::now() + REACT;
        while lines.is_empty() && std::time::Instant::now() < deadline {
            attached.push(scene.s.loop_file(&format!("watch-{output}-{}.img", attached.len())));
            if let Ok(l) = rx.recv_timeout(Duration::from_secs(2)) {
                lines.push(l);
            }
        }
        assert!(!lines.is_empty(), "agentctl watch -o {output}: no event for a loop device attached");
        // The rest of the first document (YAML: until the next `---`).
        while let Ok(l) = rx.recv_timeout(Duration::from_millis(500)) {
            if l == "---" && lines.len() > 1 {
                break;
            }
            lines.push(l);
        }
        let what = format!("agentctl watch -o {output}");
        match *output {
            "json" => schema.check(&serde_json::from_str(&lines[0]).expect("one JSON line"), "event", &what),
            "yaml" => {
                let doc = lines.iter().skip_while(|l| *l == "---").cloned().collect::<Vec<_>>().join("\n");
                schema.check(&serde_yaml_ng::from_str(&doc).expect("a YAML document"), "event", &what)
            }
            _ => assert!(!lines[0].is_empty(), "{what}: one line per event"),
        }
        drop(child);
        drop(attached);
    }
}
