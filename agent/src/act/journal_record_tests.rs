//! Tests of the journal's record types: every kind read from and written as the lines the
//! journal has always had, byte for byte; fields of a later version; lines that are not records.

use super::*;
use crate::act::journal::{self, Journal};
use crate::discover::namespaces::NsEntry;
use crate::graph::identity::{Backing, Identity};
use crate::model::{DeviceName, MountNsId};
use crate::plan::{ActionKind, Step};

/// The step the journal tests journal: a loop detach, in the layout an intent has it.
const STEP: &str = r#"{"action":"detach_loop","backing_dev":null,"backing_file":"/x.img","backing_inode":null,"device":"loop9","devnum":{"major":7,"minor":9},"identity":"loop9@7:9#4;loop=?/?+0"}"#;

/// Lines as the journal's writer has written them since records had writers, one of each
/// kind (`{STEP}` stands for [`STEP`]).
const INTENT: &str = r#"{"ts":1796612538.4580965,"id":"1796612538458096631-42-1","phase":"intent","step":{STEP},"plan":"plan-1796612538457000000-42-0","index":0,"writer":{"pid":42,"start":1234567,"boot":"8c1e7a0e-6b1f-4b43-9b4e-3f0e2b1d6c55"}}"#;
const INTENT_ALONE: &str = r#"{"ts":1796612538.5,"id":"1796612538500000000-42-2","phase":"intent","step":{STEP},"writer":{"pid":42}}"#;
const RESULT: &str =
    r#"{"ts":1796612538.6,"id":"1796612538458096631-42-1","phase":"result","result":"done"}"#;
const RESULT_DETAIL: &str = r#"{"ts":1796612538.7,"id":"1796612538500000000-42-2","phase":"result","result":"deferred","detail":"the kernel set autoclear"}"#;
const RECOVERED: &str = r#"{"ts":1796612600.25,"id":"1796612538500000000-42-2","phase":"recovered","result":"identity_changed","detail":"7:9 is now another device"}"#;
const ROTATED: &str = r#"{"ts":1796612700.125,"id":"rotate-43","phase":"rotated","detail":"rotated; the earlier records are in /var/lib/blockjanitor/journal.jsonl.1"}"#;
const PLAN_END: &str = r#"{"detail":"1 step(s) finished","id":"plan-1796612538457000000-42-0","phase":"plan_end","result":"finished","ts":1796612538.75}"#;
const IDENTITY: &str = r#"{"backing":{"dev":null,"inode":null,"kind":"loop","offset":0,"rdev":null},"devnum":{"major":7,"minor":9},"diskseq":4,"name":"loop9"}"#;
const PLAN: &str = r#"{"device":"loop9","devices":[{"devnum":{"major":7,"minor":9},"dm_name":null,"identity":"loop9@7:9#4;loop=?/?+0","name":"loop9","uuid":null,"wwid":null}],"devnum":{"major":7,"minor":9},"expected_openers":[],"force_busy":null,"id":"plan-1796612538457000000-42-0","identity":"loop9@7:9#4;loop=?/?+0","identity_parts":{IDENTITY},"notes":[],"phase":"plan","request":{"argument":"/dev/loop9","by":"operator alice","operation":"clean"},"steps":[{"identity_parts":{IDENTITY},"step":{STEP}}],"ts":1796612538.457,"writer":{"boot":"8c1e7a0e-6b1f-4b43-9b4e-3f0e2b1d6c55","pid":42,"start":1234567}}"#;

fn line(template: &str) -> String {
    template.replace("{STEP}", STEP).replace("{IDENTITY}", IDENTITY)
}

fn identity() -> Identity {
    Identity {
        name: DeviceName::new("loop9").expect("name"),
        devnum: DevNum::new(7, 9),
        diskseq: Some(4),
        backing: Backing::Loop { dev: None, inode: None, rdev: None, offset: 0 },
    }
}

fn step() -> Step {
    Step {
        device: identity().name,
        devnum: identity().devnum,
        identity: identity(),
        action: Action::DetachLoop { backing_file: "/x.img".into(), backing_dev: None, backing_inode: None },
    }
}

/// The plan record's body as the workflow builds it for [`step`].
fn body() -> PlanBody {
    PlanBody {
        request: PlanRequest {
            argument: "/dev/loop9".into(),
            operation: "clean".into(),
            by: "operator alice".into(),
        },
        device: "loop9".into(),
        devnum: Some(DevNum::new(7, 9)),
        identity: identity().token(),
        identity_parts: serde_json::to_value(identity()).expect("json"),
        devices: vec![PlanDevice {
            name: "loop9".into(),
            devnum: DevNum::new(7, 9),
            identity: identity().token(),
            dm_name: None,
            uuid: None,
            wwid: None,
        }],
        steps: vec![PlanStep {
            step: serde_json::to_value(step()).expect("json"),
            identity_parts: serde_json::to_value(identity()).expect("json"),
        }],
        expected_openers: Vec::new(),
        force_busy: None,
        notes: Vec::new(),
    }
}

fn parse(l: &str) -> Record {
    Record::parse(l.as_bytes()).unwrap_or_else(|| panic!("a record: {l}"))
}

fn round_trips(l: &str) -> Record {
    let r = parse(l);
    let again = r.to_line().expect("serialises");
    assert_eq!(String::from_utf8(again).expect("utf8"), format!("{l}\n"), "written as read");
    r
}

#[test]
fn every_kind_of_record_reads_and_writes_the_lines_the_journal_has_always_had() {
    let writer =
        Writer { pid: 42, start: Some(1234567), boot: Some("8c1e7a0e-6b1f-4b43-9b4e-3f0e2b1d6c55".into()) };
    let Record::Intent(i) = round_trips(&line(INTENT)) else { panic!("an intent") };
    assert_eq!(i.ts, 1796612538.4580965);
    assert_eq!(i.id, "1796612538458096631-42-1");
    assert_eq!((i.plan.as_deref(), i.index), (Some("plan-1796612538457000000-42-0"), Some(0)));
    assert_eq!(i.writer(), Some(writer.clone()));
    assert_eq!(
        i.step().expect("a step"),
        JournaledStep::Device {
            device: "loop9".into(),
            devnum: DevNum::new(7, 9),
            identity: identity().token(),
            action: step().action,
        }
    );
    let Record::Intent(alone) = round_trips(&line(INTENT_ALONE)) else { panic!("an intent") };
    assert_eq!((alone.plan, alone.index), (None, None), "a step of no plan");

    let Record::Result(r) = round_trips(RESULT) else { panic!("a result") };
    assert_eq!((r.id.as_str(), r.result, r.detail), ("1796612538458096631-42-1", StepResult::Done, None));
    let Record::Result(r) = round_trips(RESULT_DETAIL) else { panic!("a result") };
    assert_eq!((r.result, r.detail.as_deref()), (StepResult::Deferred, Some("the kernel set autoclear")));
    assert!(!r.result.is_finished(), "a deferred step did not finish");

    let Record::Recovered(r) = round_trips(RECOVERED) else { panic!("recovered") };
    assert_eq!((r.result, r.detail.as_str()), (Resolution::IdentityChanged, "7:9 is now another device"));

    let Record::Rotated(r) = round_trips(ROTATED) else { panic!("rotated") };
    assert_eq!(r.id, "rotate-43");

    let Record::PlanEnd(e) = round_trips(PLAN_END) else { panic!("a plan's end") };
    assert_eq!((e.result, e.detail.as_str()), (PlanEndResult::Finished, "1 step(s) finished"));

    let Record::Plan(p) = round_trips(&line(PLAN)) else { panic!("a plan") };
    assert_eq!(p.writer(), Some(writer));
    assert_eq!(p.body, body(), "every field read into its type");
    // Plans and their ends were JSON objects built whole: keys in order at every level.
    for l in [line(PLAN), PLAN_END.to_owned()] {
        let v: Value = serde_json::from_str(&l).expect("json");
        assert_eq!(v.to_string(), l, "sorted as a JSON object sorts them");
    }
}

/// The words, each serialised as itself.
#[test]
fn the_words_are_their_strings() {
    for w in StepResult::ALL {
        assert_eq!(serde_json::to_value(w).expect("json"), w.as_str());
    }
    for w in Resolution::ALL {
        assert_eq!(serde_json::to_value(w).expect("json"), w.as_str());
    }
    let words: Vec<&str> = StepResult::ALL.iter().map(|w| w.as_str()).collect();
    assert_eq!(words, ["done", "already_absent", "deferred", "skipped", "failed"]);
    let words: Vec<&str> = Resolution::ALL.iter().map(|w| w.as_str()).collect();
    assert_eq!(words, ["gone", "in_place", "identity_changed", "replan"]);
    // An action's name is its step's `action` tag, for every kind.
    let actions = [
        Action::DetachMount {
            namespace: MountNsId(4026532001),
            via: NsEntry::Task { pid: 100, tid: 100 },
            mount_id: 77,
            mount_dev: DevNum::new(7, 9),
            mount_point: "/mnt/x".into(),
            fstype: "ext4".into(),
        },
        step().action,
        Action::DmMessage { uuid: "mpath-1".into(), message: "fail_if_no_path".into() },
        Action::DmRemove { uuid: "mpath-1".into(), deferred: false },
        Action::ScsiOffline { wwid: "naa.1".into(), address: "0:0:0:0".into(), require_offline: false },
        Action::ScsiDelete { wwid: "naa.1".into(), address: "0:0:0:0".into() },
        Action::RbdUnmap { id: 0, pool: "k8s".into(), image: "i".into(), image_id: "1".into(), force: false },
        Action::NbdDisconnect { server_pid: None, backend: None },
        Action::NvmeDeleteController {
            controller: "nvme0".into(),
            subsysnqn: "nqn.a".into(),
            transport: "tcp".into(),
            address: "traddr=127.0.0.1,trsvcid=4420".into(),
            cntlid: None,
        },
        Action::IscsiLogout {
            sid: 1,
            target: "iqn.t".into(),
            portal: "10.0.0.1:3260".into(),
            iface: "default".into(),
        },
    ];
    assert_eq!(actions.iter().map(Action::kind).collect::<Vec<_>>(), ActionKind::ALL, "one of each kind");
    for a in &actions {
        assert_eq!(serde_json::to_value(a).expect("json")["action"], a.name(), "{a:?}");
        assert_eq!(serde_json::to_value(a.kind()).expect("json"), a.name());
    }
}

/// What the writer puts on disk is those lines: each record the journal writes, with its own
/// time, ID and writer put into the line above, is the line it wrote, byte for byte.
#[test]
fn the_writer_writes_those_lines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let plan = j.plan(&body()).expect("plan");
    let intent = j.begin_at(&step(), Some(0)).expect("intent");
    j.finish(&intent, StepResult::Done, "").expect("result");
    j.plan_end(&plan, PlanEndResult::Finished, "1 step(s) finished").expect("end");
    let alone = j.begin(&step()).expect("intent");
    j.finish(&alone, StepResult::Deferred, "the kernel set autoclear").expect("result");
    j.recovered(&alone, Resolution::IdentityChanged, "7:9 is now another device").expect("recovered");
    drop(j);
    let text = std::fs::read_to_string(&path).expect("read");
    let written: Vec<&str> = text.lines().collect();
    let me = Writer::this();
    let me_in_order = serde_json::to_string(me).expect("json");
    let me_sorted = serde_json::to_value(me).expect("json").to_string();
    let expected = [
        line(PLAN).replace("plan-1796612538457000000-42-0", &plan),
        line(INTENT)
            .replace("1796612538458096631-42-1", &intent)
            .replace("plan-1796612538457000000-42-0", &plan),
        RESULT.replace("1796612538458096631-42-1", &intent),
        PLAN_END.replace("plan-1796612538457000000-42-0", &plan),
        line(INTENT_ALONE).replace("1796612538500000000-42-2", &alone),
        RESULT_DETAIL.replace("1796612538500000000-42-2", &alone),
        RECOVERED.replace("1796612538500000000-42-2", &alone),
    ];
    assert_eq!(written.len(), expected.len(), "{text}");
    let their_writer = [
        (
            r#""writer":{"pid":42,"start":1234567,"boot":"8c1e7a0e-6b1f-4b43-9b4e-3f0e2b1d6c55"}"#,
            &me_in_order,
        ),
        (r#""writer":{"pid":42}"#, &me_in_order),
        (r#""writer":{"boot":"8c1e7a0e-6b1f-4b43-9b4e-3f0e2b1d6c55","pid":42,"start":1234567}"#, &me_sorted),
    ];
    for (w, e) in written.iter().zip(expected) {
        // With its own time and writer.
        let mut want = e.replace(raw_ts(&e), raw_ts(w));
        for (theirs, mine) in their_writer {
            want = want.replace(theirs, &format!(r#""writer":{mine}"#));
        }
        assert_eq!(*w, want);
    }
}

/// The `"ts":...` of a line as written (a float read and written again may differ in its last
/// digit: serde_json reads floats fast, not always to the nearest).
fn raw_ts(l: &str) -> &str {
    let start = l.find(r#""ts":"#).expect("a ts");
    let len = l[start..].find([',', '}']).expect("its end");
    &l[start..start + len]
}

/// A later version's fields are read past; its records still count.
#[test]
fn a_journal_with_fields_this_version_does_not_know_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let extra = |l: String| l.replacen('{', r#"{"added_later":{"x":[1,2]},"#, 1);
    let lines = [
        extra(line(PLAN)),
        extra(line(INTENT).replace(r#""index":0"#, r#""index":0,"retry":3"#)),
        extra(line(INTENT_ALONE).replace("-42-2", "-42-3")),
        extra(RESULT.to_owned()),
        extra(line(INTENT_ALONE)),
    ];
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
    let pending = journal::pending(&path).expect("pending");
    let ids: Vec<&str> = pending.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["1796612538500000000-42-3", "1796612538500000000-42-2"], "{pending:?}");
    let plans = journal::open_plans(&path).expect("open plans");
    assert_eq!(plans.len(), 1);
    assert_eq!(plans[0].record.body, body());
    assert_eq!(plans[0].finished.iter().copied().collect::<Vec<_>>(), [0], "its result counted");
}

/// A torn line, garbage, and a line of a phase or a word this version does not know are not
/// records: skipped, as a torn write always was, and the records around them still count.
#[test]
fn a_line_that_is_not_a_record_is_skipped() {
    for not in [
        r#"{"ts":1796612538.6,"id":"1796612538458096631-42-1","phase":"res"#,
        "garbage",
        "",
        r#"{"ts":1,"id":"x","phase":"checkpoint"}"#,
        r#"{"ts":1,"id":"1796612538458096631-42-1","phase":"result","result":"exploded"}"#,
        r#"{"ts":1,"phase":"result","result":"done"}"#,
        "[1,2]",
    ] {
        assert_eq!(Record::parse(not.as_bytes()), None, "{not}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let torn = &RESULT[..40];
    std::fs::write(&path, format!("{}\n{torn}\ngarbage\n{}\n{torn}", line(INTENT_ALONE), line(INTENT)))
        .expect("write");
    let pending = journal::pending(&path).expect("pending");
    assert_eq!(pending.len(), 2, "the torn result closed nothing: {pending:?}");
    // Open again, the torn tail is ended, and the next record is a line of its own.
    let mut j = Journal::open(&path).expect("open");
    j.finish(&pending[1].id, StepResult::Done, "").expect("result");
    let pending = journal::pending(&path).expect("pending");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(pending[0].id, "1796612538500000000-42-2");
}
