//! Unit tests of the renderers: names, values, tables, plans, apply summaries, fleet apply.

use blockjanitor_proto::v1 as pb;
use serde_json::json;

use crate::apply::*;
use crate::fleet_apply::*;
use crate::names::*;
use crate::plan::*;
use crate::table::*;
use crate::text::*;
use crate::time::*;
use crate::values::*;

#[test]
fn fleet_apply_arguments_group_by_node() {
    let args: Vec<String> = ["a/rbd4", "b/nbd0", "a/loop3"].iter().map(|s| s.to_string()).collect();
    let t = fleet_targets(&args).expect("ok");
    assert_eq!(
        t,
        [("a".to_string(), vec!["rbd4".to_string(), "loop3".into()]), ("b".into(), vec!["nbd0".into()])]
    );
    assert!(fleet_targets(&["rbd4".to_string()]).is_err_and(|e| e.contains("NODE/DEVICE")));
    assert!(fleet_targets(&["a/".to_string()]).is_err());
    assert!(fleet_targets(&[]).is_err());
    let ids = vec![vec!["r".to_string(), "l".into()], vec!["n".into()]];
    let req = fleet_apply_request(&t, &ids, false);
    assert_eq!((req.node.as_str(), req.devices.len(), req.identities.len(), req.execute), ("a", 2, 2, false));
    assert_eq!(req.targets.len(), 1);
    assert_eq!(req.targets[0].identities, ["n"]);
    let dry = pb::FleetApplyResponse {
        summary: vec![pb::NodePlanSummary {
            node: "b".into(),
            refusal: "nbd0: in use".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(fleet_dry_run_refuses(&dry));
    assert!(fleet_summary_table(&dry).starts_with("b: REFUSED: nbd0: in use"));
    assert!(!fleet_all_done(&dry), "not executed");
}

/// `fleet plan` and `fleet apply`'s dry run exit as `agentctl plan` does, node by node: the
/// worst of held 2, unknown 3 (a node whose plan could not be had), refused 4, error 1.
#[test]
fn the_fleet_dry_run_exits_by_the_one_table() {
    use blockjanitor_rpc::view::exit;
    let plan = |outcome: &str| pb::DevicePlan { outcome: outcome.into(), ..Default::default() };
    let node = |plans: Option<Vec<pb::DevicePlan>>, refusal: &str| pb::NodePlanSummary {
        node: "n".into(),
        plan: plans.map(|plans| pb::PlanResponse { plans, ..Default::default() }),
        refusal: refusal.into(),
        ..Default::default()
    };
    let code = |nodes: Vec<pb::NodePlanSummary>| {
        fleet_dry_run_exit(&pb::FleetApplyResponse { summary: nodes, ..Default::default() })
    };
    assert_eq!(code(vec![]), exit::DONE);
    assert_eq!(code(vec![node(Some(vec![plan("done")]), "")]), exit::DONE);
    assert_eq!(code(vec![node(Some(vec![plan("done"), plan("held")]), "x: held")]), exit::HELD);
    assert_eq!(code(vec![node(Some(vec![plan("refused")]), "x: protected")]), exit::REFUSED);
    assert_eq!(code(vec![node(None, "its plan could not be had: timeout")]), exit::UNKNOWN);
    assert_eq!(code(vec![node(Some(vec![plan("held")]), ""), node(None, "down")]), exit::UNKNOWN);
    let uncovered = format!("nosuch0: {}", crate::fleet_plan::UNCOVERED);
    assert_eq!(code(vec![node(Some(vec![]), &uncovered)]), exit::ERROR);
}

fn loop_device() -> pb::Device {
    pb::Device {
        name: "loop3".into(),
        major: 7,
        minor: 3,
        kind: pb::DeviceKind::Loop as i32,
        size_bytes: 64 << 20,
        loop_backing_file: "/var/lib/x.img".into(),
        verdict: pb::Verdict::InUse as i32,
        reasons: vec!["mounted at /mnt in mount namespace 4026532001".into(), "second".into()],
        holders: vec![pb::Holder {
            kind: pb::HolderKind::Mount as i32,
            pids: vec![100, 101],
            pid_count: 40,
            comm: "sh".into(),
            mount_namespace: 4026532001,
            mount_point: "/mnt".into(),
            fstype: "ext4".into(),
            pod_uid: "1234-abcd".into(),
            description: "mounted at /mnt in mount namespace 4026532001".into(),
            ..Default::default()
        }],
        kernel_threads: vec!["jbd2/loop3-8 (pid 77)".into()],
        ..Default::default()
    }
}

#[test]
fn enum_names_are_lower_case_without_prefix() {
    assert_eq!(kind_name(pb::DeviceKind::Loop as i32), "loop");
    assert_eq!(verdict_name(pb::Verdict::InUse as i32), "in_use");
    assert_eq!(holder_kind_name(pb::HolderKind::OpenDevice as i32), "open_device");
    assert_eq!(event_type_name(pb::event::Type::DeviceAdded as i32), "device_added");
    assert_eq!(kind_name(99), "unknown(99)");
    assert_eq!(verdict_name(-1), "unknown(-1)");
    assert_eq!(parse_kind("rbd"), Some(pb::DeviceKind::Rbd));
    assert_eq!(parse_verdict("in_use"), Some(pb::Verdict::InUse));
    assert_eq!(parse_verdict("unspecified"), None);
    assert_eq!(parse_kind("floppy"), None);
}

#[test]
fn device_value_keeps_proto_names_and_lower_case_enums() {
    let v = device_value(&loop_device());
    assert_eq!(v["kind"], "loop");
    assert_eq!(v["verdict"], "in_use");
    assert_eq!(v["size_bytes"], 64u64 << 20);
    assert_eq!(v["loop_backing_file"], "/var/lib/x.img");
    assert_eq!(v["holders"][0]["kind"], "mount");
    assert_eq!(v["holders"][0]["pid_count"], 40);
    assert_eq!(v["kernel_threads"][0], "jbd2/loop3-8 (pid 77)");
    let e = pb::Event {
        r#type: pb::event::Type::DeviceRemoved as i32,
        device: "loop3".into(),
        ..Default::default()
    };
    let ev = event_value(&e);
    assert_eq!(ev["type"], "device_removed");
    assert!(ev["current"].is_null());
    let yaml = serde_yaml_ng::to_string(&v).expect("yaml");
    assert!(yaml.contains("verdict: in_use"), "{yaml}");
}

/// `scan`'s text for `devices` as both CLIs print it.
fn scan_text(devices: Vec<pb::Device>, wide: bool, term: crate::term::Term, columns: &str) -> String {
    use clap::ValueEnum;
    let layout = crate::columns::ScanLayout {
        columns: columns
            .split(',')
            .filter(|c| !c.is_empty())
            .map(|c| crate::columns::Column::from_str(c, true).expect("a column"))
            .collect(),
        tree: false,
    };
    let filter = blockjanitor_rpc::view::choices::DeviceFilter { kind: None, verdict: None, stale: false };
    let r = pb::ListDevicesResponse { devices, ..Default::default() };
    crate::scan::report(&r, &crate::scan::ScanStyle { filter: &filter, layout: &layout, wide, term })
}

#[test]
fn scan_table_is_shaped_like_lsblk_and_cuts_only_to_a_width_it_names() {
    use crate::term::Term;
    let mut d = loop_device();
    d.reasons[0] = "x".repeat(200);
    let piped = Term { colour: false, width: None };
    let t = scan_text(vec![d.clone()], false, piped, "");
    let mut lines = t.lines();
    let head = lines.next().expect("header");
    assert_eq!(head, "NAME   MAJ:MIN  SIZE  TYPE  VERDICT  HELD-BY  WHY", "{t}");
    let row = lines.next().expect("row");
    assert_eq!(row, format!("loop3  7:3      64M   loop  in_use   mount    {}", "x".repeat(200)), "{t}");
    assert!(!t.contains('…') && !t.contains("\x1b["), "piped, no width: nothing cut, no colour: {t}");
    let narrow = scan_text(vec![d.clone()], false, Term { colour: false, width: Some(80) }, "");
    let row = narrow.lines().nth(1).expect("row");
    assert!(row.chars().count() <= 80 && row.ends_with('…'), "{narrow}");
    assert!(narrow.contains("(cells cut to fit 80 columns: -o wide shows them whole)"), "{narrow}");
    let wide = scan_text(vec![d.clone()], true, Term { colour: false, width: Some(80) }, "");
    assert!(wide.contains(&format!("{}; second", "x".repeat(200))), "wide never cuts: {wide}");
    assert!(!wide.contains('…') && !wide.contains("cells cut"), "{wide}");
    let coloured = scan_text(vec![d], false, Term { colour: true, width: None }, "");
    assert!(coloured.contains("\x1b[32min_use\x1b[0m   mount"), "{coloured:?}");
    assert!(scan_text(Vec::new(), false, piped, "").starts_with("no matching devices\n"));
}

#[test]
fn scan_columns_pick_the_cells_and_pv_shows_the_pods() {
    use crate::term::Term;
    let mut d = loop_device();
    d.pv_names = vec!["pvc-1".into()];
    d.pod_uids = vec!["uid-a".into()];
    let piped = Term { colour: false, width: None };
    let t = scan_text(vec![d.clone()], false, piped, "size,NAME,pv");
    assert!(t.starts_with("SIZE  NAME   PV\n64M   loop3  pvc-1 (pod uid-a)\n"), "{t}");
    assert!(scan_text(vec![d.clone()], true, piped, "").contains("  pvc-1 (pod uid-a)  "), "wide adds PV");
    d.pod_uids.clear();
    assert!(scan_text(vec![d], false, piped, "PV").contains("pvc-1 (no pod)"));
}

#[test]
fn device_table_shows_holders_and_symptoms() {
    let t = device_table(&loop_device(), true);
    assert!(t.starts_with("loop3 (7:3, loop, 64M) backed by /var/lib/x.img\nverdict: in_use\n"), "{t}");
    assert!(
        t.contains(
            "  - mount: mounted at /mnt in mount namespace 4026532001 [pids 100,101 and 38 more (first: sh); ext4; pod 1234-abcd]"
        ),
        "{t}"
    );
    assert!(t.contains("kernel threads (symptoms, not holders):\n  - jbd2/loop3-8 (pid 77)\n"), "{t}");
}

#[test]
fn node_shows_the_kubernetes_api_and_blind_spots() {
    let n = pb::Node {
        name: "node-a".into(),
        mode: "report".into(),
        kubernetes: "cannot vouch: no Node named 'node-b' in the cluster: its pods cannot be told".into(),
        blind_spots: vec![
            "cannot read /proc/1/ns/mnt of pid 1 (could hide a holder of any device)".into(),
            "dm tables\x1b[2J (could hide a holder of every dm device)".into(),
        ],
        warnings: vec!["w1".into()],
        ..Default::default()
    };
    let t = node_table(&n, 0.0);
    assert!(
        t.contains("\nKubernetes API: cannot vouch: no Node named 'node-b' in the cluster: its pods cannot be told\n"),
        "{t}"
    );
    assert!(t.contains("\nwarnings:       1\n  - w1\n"), "{t}");
    assert!(
        t.contains(
            "\nblind spots:    2\n  - cannot read /proc/1/ns/mnt of pid 1 (could hide a holder of any device)\n  - dm tables\\u{1b}[2J (could hide"
        ),
        "{t}"
    );
    let v = node_value(&n);
    assert_eq!(v["kubernetes"], n.kubernetes.as_str());
    assert_eq!(v["blind_spots"][0], n.blind_spots[0].as_str());
    assert_eq!(v["blind_spots"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["ready"], true);
    assert!(t.contains("\nready:          yes\n"), "{t}");
    let yaml = serde_yaml_ng::to_string(&v).expect("yaml");
    assert!(yaml.contains("kubernetes: ") && yaml.contains("blind_spots:\n- "), "{yaml}");
    let unready = pb::Node {
        not_ready_because: vec!["the journal cannot be written: /j: Read-only file system".into()],
        ..Default::default()
    };
    assert!(
        node_table(&unready, 0.0)
            .contains("\nready:          NO: the journal cannot be written: /j: Read-only"),
        "{}",
        node_table(&unready, 0.0)
    );
    assert_eq!(node_value(&unready)["ready"], false);
    assert_eq!(node_value(&unready)["not_ready_because"][0], unready.not_ready_because[0].as_str());
    let quiet = pb::Node { kubernetes: "vouching".into(), ..Default::default() };
    let t = node_table(&quiet, 0.0);
    assert!(t.contains("Kubernetes API: vouching\n") && t.contains("blind spots:    none\n"), "{t}");
    assert!(node_table(&pb::Node::default(), 0.0).contains("Kubernetes API: not reported\n"));
}

#[test]
fn a_filesystem_holder_shows_its_kind_and_description() {
    let mut d = loop_device();
    d.verdict = pb::Verdict::Unknown as i32;
    d.holders = vec![pb::Holder {
        kind: pb::HolderKind::Filesystem as i32,
        fstype: "ext4".into(),
        path: "/sys/fs/ext4/loop3".into(),
        description:
            "a ext4 filesystem still lives on it with no mount in any namespace (/sys/fs/ext4/loop3)".into(),
        ..Default::default()
    }];
    let t = device_table(&d, true);
    assert!(
        t.contains("holders (1):\n  - filesystem: a ext4 filesystem still lives on it with no mount in any namespace (/sys/fs/ext4/loop3)\n"),
        "{t}"
    );
    assert_eq!(device_value(&d)["holders"][0]["kind"], "filesystem");
}

#[test]
fn identities_are_shown_and_bind_apply_to_the_plan() {
    let mut d = loop_device();
    d.identity = "loop3@7:3#12;loop=8:1/77+0".into();
    let t = device_table(&d, true);
    assert!(
        t.starts_with(
            "loop3 (7:3, loop, 64M) backed by /var/lib/x.img\nidentity: loop3@7:3#12;loop=8:1/77+0\n"
        ),
        "{t}"
    );
    assert_eq!(device_value(&d)["identity"], "loop3@7:3#12;loop=8:1/77+0");
    let plan = |dev: &str, id: &str| pb::DevicePlan {
        device: dev.into(),
        identity: id.into(),
        steps: vec![pb::Step {
            action: "detach_loop".into(),
            device: dev.into(),
            description: "detach".into(),
        }],
        ..Default::default()
    };
    let r = pb::PlanResponse {
        plans: vec![plan("loop3", "loop3@7:3#12;a"), plan("loop4", "loop4@7:4#13;b")],
        ..Default::default()
    };
    let t = plans_table(&r, false);
    assert!(t.starts_with("loop3: 1 step\n  identity: loop3@7:3#12;a\n  1. detach_loop: detach\n"), "{t}");
    assert_eq!(crate::doc::plans_doc(&r)["plans"][1]["identity"], "loop4@7:4#13;b");
    let req = apply_bound_to(&r, pb::Operation::Clean);
    assert_eq!(req.operation, pb::Operation::Clean as i32);
    assert_eq!(apply_bound_to(&r, pb::Operation::Release).operation, pb::Operation::Release as i32);
    assert_eq!(req.devices, ["loop3", "loop4"]);
    assert_eq!(req.identities, ["loop3@7:3#12;a", "loop4@7:4#13;b"]);
    let applied =
        pb::ApplyResponse { plans: vec![r.plans[0].clone()], results: vec![], ..Default::default() };
    assert!(apply_table(&applied).contains("\n  identity: loop3@7:3#12;a\n"));
    let v = crate::doc::results_doc(&r.plans, &applied);
    assert_eq!(v["planned"][1]["identity"], "loop4@7:4#13;b");
    assert_eq!(v["plans"][0]["identity"], "loop3@7:3#12;a");
    assert_eq!(crate::doc::results_doc(&[], &applied)["planned"], json!([]));

    let devs = vec!["loop3".to_owned(), "/dev/loop4".to_owned()];
    let req = apply_with_identities(&devs, &["x".into(), String::new()], pb::Operation::Release)
        .expect("one per device");
    assert_eq!(req.operation, pb::Operation::Release as i32);
    assert_eq!(req.devices, devs);
    assert_eq!(req.identities, ["x", ""]);
    let e = apply_with_identities(&devs, &["x".into()], pb::Operation::Clean).expect_err("too few");
    assert_eq!(
        e,
        "1 identity for 2 devices: give one --identity per device, in the same order (\"\" for none)"
    );
}

#[test]
fn control_characters_are_escaped_in_tables() {
    let mut d = loop_device();
    d.holders[0].description = "evil\x1b[2Jname\n".into();
    let t = device_table(&d, false);
    assert!(!t.contains('\x1b'));
    assert!(t.contains("evil\\u{1b}[2Jname\\n"), "{t}");
}

#[test]
fn apply_summary_and_exit_codes() {
    let step = |d: &str| pb::Step {
        action: "detach_loop".into(),
        device: d.into(),
        description: format!("detach {d}"),
    };
    let plan = |d: &str| pb::DevicePlan { device: d.into(), steps: vec![step(d)], ..Default::default() };
    let result =
        |d: &str, w: &str| pb::StepResult { step: Some(step(d)), result: w.into(), detail: String::new() };
    let ok = pb::ApplyResponse {
        plans: vec![plan("loop1")],
        results: vec![result("loop1", "done")],
        ..Default::default()
    };
    assert_eq!(apply_summary(&ok).exit_code(), 0);
    assert!(apply_table(&ok).contains("  1. detach_loop: detach loop1 -> done\n"), "{}", apply_table(&ok));
    let deferred = pb::ApplyResponse {
        plans: vec![plan("loop1")],
        results: vec![result("loop1", "deferred")],
        ..Default::default()
    };
    assert_eq!(apply_summary(&deferred).exit_code(), 2);
    let failed = pb::ApplyResponse {
        plans: vec![plan("loop1"), plan("loop2")],
        results: vec![result("loop1", "failed"), result("loop2", "deferred")],
        ..Default::default()
    };
    assert_eq!(apply_summary(&failed).exit_code(), 1);
    let refused = pb::ApplyResponse {
        plans: vec![pb::DevicePlan { device: "sda".into(), refusal: "held".into(), ..Default::default() }],
        results: vec![],
        ..Default::default()
    };
    assert_eq!(apply_summary(&refused).exit_code(), 2);
    assert!(apply_table(&refused).starts_with("sda: refused: held\n"));
    let not_run = pb::ApplyResponse { plans: vec![plan("loop1")], results: vec![], ..Default::default() };
    assert_eq!(apply_summary(&not_run).not_run, 1);
    assert!(apply_table(&not_run).contains("-> not run"));
}

#[test]
fn times_and_cuts() {
    assert_eq!(utc_time(0.0), "never");
    assert_eq!(utc_time(f64::NAN), "never");
    assert_eq!(utc_time(1e300), "never");
    assert_eq!(utc_time(951_782_400.0), "2000-02-29 00:00:00 UTC");
    assert_eq!(utc_time(1_700_000_000.5), "2023-11-14 22:13:20 UTC");
    assert_eq!(ago(100.0, 104.0), "4s ago");
    assert_eq!(ago(0.0, 7200.0), "2h ago");
    assert_eq!(cut("abc", 2), "a…");
    assert_eq!(cut("abc", 0), "…");
}
