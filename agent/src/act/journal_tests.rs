//! Tests of the journal: records, torn lines, open plans, the lock.

use super::*;
use crate::graph::identity::{Backing, Identity};
use crate::model::{DevNum, DeviceName};
use crate::plan::Action;
use crate::plan::Step;
use std::io::Write;

fn request(argument: &str, operation: &str) -> PlanRequest {
    PlanRequest { argument: argument.into(), operation: operation.into(), by: String::new() }
}

fn step() -> Step {
    let device = DeviceName::new("loop9").expect("name");
    let devnum = DevNum::new(7, 9);
    let backing = Backing::Loop { dev: None, inode: None, rdev: None, offset: 0 };
    Step {
        identity: Identity { name: device.clone(), devnum, diskseq: Some(4), backing },
        device,
        devnum,
        action: Action::DetachLoop { backing_file: "/x.img".into(), backing_dev: None, backing_inode: None },
    }
}

#[test]
fn unfinished_intents_are_pending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sub/journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let a = j.begin(&step()).expect("begin a");
    j.finish(&a, StepResult::Done, "").expect("finish a");
    let _b = j.begin(&step()).expect("begin b");
    drop(j);
    // A torn last line (crash mid-write) is ignored.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("reopen")
        .write_all(b"{\"ts\":1,")
        .expect("torn");
    let p = pending(&path).expect("read");
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].step["action"], "detach_loop");
    assert_eq!(p[0].step["device"], "loop9");
    assert_eq!(p[0].step["identity"], "loop9@7:9#4;loop=?/?+0", "the identity it was planned for");
    assert_eq!(p[0].step().expect("a step").action_name(), "detach_loop");
    assert!(pending(&dir.path().join("none")).expect("missing").is_empty());
}

#[test]
fn rotation_bounds_the_journal_and_carries_open_intents_over() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open_bounded(&path, 4096).expect("open");
    for _ in 0..20 {
        let id = j.begin(&step()).expect("begin");
        j.finish(&id, StepResult::Done, "").expect("finish");
    }
    let open = j.begin(&step()).expect("begin the one a crash leaves open");
    drop(j);
    let before = std::fs::read(&path).expect("read");
    assert!(before.len() > 4096, "{} bytes: past the bound", before.len());

    let mut j = Journal::open_bounded(&path, 4096).expect("reopen rotates");
    let after = std::fs::read_to_string(&path).expect("read");
    assert!(after.len() < 2048, "bounded: {after}");
    assert_eq!(
        std::fs::read(previous_generation(&path)).expect(".1"),
        before,
        "the old records are kept whole"
    );
    let p = pending(&path).expect("pending");
    assert_eq!(p.len(), 1, "the open intent is carried over: {after}");
    assert_eq!(p[0].id, open.as_str());
    assert!(after.contains("\"phase\":\"rotated\""), "{after}");
    let written = String::from_utf8(before).expect("utf8");
    let line = written.lines().find(|l| l.contains(&open)).expect("its intent");
    assert_eq!(after.lines().next(), Some(line), "carried over as written, byte for byte");
    // Its result, written after the rotation, still closes it.
    j.finish(&open, StepResult::Done, "").expect("finish");
    assert!(pending(&path).expect("pending").is_empty());
}

#[test]
fn a_recovered_record_closes_the_intent_it_names_and_only_that_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let a = j.begin(&step()).expect("begin a");
    let b = j.begin(&step()).expect("begin b");
    assert_eq!(pending(&path).expect("pending").len(), 2);
    j.recovered(&a, Resolution::Gone, "loop9 is gone").expect("recovered");
    let p = pending(&path).expect("pending");
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].id, b.as_str());
    let text = std::fs::read_to_string(&path).expect("read");
    let last: serde_json::Value = serde_json::from_str(text.lines().last().expect("a line")).expect("json");
    assert_eq!(last["phase"], "recovered");
    assert_eq!(last["id"], a.as_str());
    assert_eq!(last["result"], "gone");
    assert_eq!(last["detail"], "loop9 is gone");
    assert!(a.split('-').nth(1) == Some(&std::process::id().to_string()), "the writer's pid is in {a}");
}

#[test]
fn a_symlink_in_place_of_the_journal_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let target = dir.path().join("elsewhere");
    std::fs::write(&target, "").expect("target");
    let path = dir.path().join("journal.jsonl");
    std::os::unix::fs::symlink(&target, &path).expect("symlink");
    let e = Journal::open(&path).expect_err("refused");
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(pending(&path).is_err(), "reading through it is refused too");
}
#[test]
fn a_torn_last_line_is_ended_on_open_so_the_next_record_is_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let a = j.begin(&step()).expect("begin a");
    drop(j);
    // A crash in the middle of writing a's result.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .expect("reopen")
        .write_all(format!("{{\"ts\":1,\"id\":\"{a}\",\"phase\":\"res").as_bytes())
        .expect("torn");
    let mut j = Journal::open(&path).expect("open ends the torn line");
    j.recovered(&a, Resolution::Gone, "loop9 is gone").expect("recovered");
    let text = std::fs::read_to_string(&path).expect("read");
    let last = text.lines().last().expect("a line");
    let v: serde_json::Value = serde_json::from_str(last).expect("the next record is a line of its own");
    assert_eq!(v["phase"], "recovered", "{text}");
    assert!(pending(&path).expect("pending").is_empty(), "the recovered record closed it: {text}");
    assert!(text.ends_with('\n'));
    // Opening a journal whose last line is whole adds nothing.
    let before = std::fs::read(&path).expect("read");
    drop(Journal::open(&path).expect("open"));
    assert_eq!(std::fs::read(&path).expect("read"), before);
}

#[test]
fn a_plan_stays_open_until_its_end_and_knows_which_steps_finished() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let plan =
        j.plan(&PlanBody { request: request("/dev/loop9", "clean"), ..PlanBody::default() }).expect("plan");
    let a = j.begin_at(&step(), Some(0)).expect("intent 0");
    j.finish(&a, StepResult::Done, "").expect("result 0");
    let b = j.begin_at(&step(), Some(1)).expect("intent 1");
    let open = open_plans(&path).expect("open plans");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].id, plan);
    assert_eq!(open[0].writer_pid, Some(std::process::id()));
    assert_eq!(open[0].record.body.request.argument, "/dev/loop9");
    assert_eq!(open[0].finished.iter().copied().collect::<Vec<_>>(), [0]);
    assert_eq!(open[0].in_flight.iter().copied().collect::<Vec<_>>(), [1]);
    let text = std::fs::read_to_string(&path).expect("read");
    let intent: serde_json::Value =
        serde_json::from_str(text.lines().nth(3).expect("intent 1")).expect("json");
    assert_eq!(intent["plan"], plan.as_str(), "an intent names its plan");
    assert_eq!(intent["index"], 1);
    // Recovery closing step 1 as done by the step itself counts it finished.
    j.recovered(&b, Resolution::InPlace, "unbound").expect("recovered");
    assert_eq!(open_plans(&path).expect("open")[0].finished.len(), 2);
    j.plan_end(&plan, PlanEndResult::Finished, "2 step(s)").expect("end");
    assert!(open_plans(&path).expect("open plans").is_empty());
    // Intents after the end name no plan.
    let c = j.begin_at(&step(), Some(0)).expect("intent");
    let text = std::fs::read_to_string(&path).expect("read");
    let last: serde_json::Value = serde_json::from_str(text.lines().last().expect("line")).expect("json");
    assert_eq!(last["id"], c.as_str());
    assert!(last.get("plan").is_none(), "{last}");
}

#[test]
fn rotation_carries_an_unfinished_plan_over_whole() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open_bounded(&path, 4096).expect("open");
    let plan = j.plan(&PlanBody { request: request("", "clean"), ..PlanBody::default() }).expect("plan");
    let a = j.begin_at(&step(), Some(0)).expect("intent");
    j.finish(&a, StepResult::Done, "").expect("result");
    j.plan_end(&plan, PlanEndResult::Finished, "").expect("end");
    let open = j.plan(&PlanBody { request: request("", "release"), ..PlanBody::default() }).expect("plan");
    let b = j.begin_at(&step(), Some(0)).expect("intent");
    j.finish(&b, StepResult::Done, "").expect("result");
    for _ in 0..20 {
        let id = j.begin(&step()).expect("begin");
        j.finish(&id, StepResult::Done, "").expect("finish");
    }
    drop(j);
    drop(Journal::open_bounded(&path, 4096).expect("reopen rotates"));
    let after = std::fs::read_to_string(&path).expect("read");
    assert!(after.contains("\"phase\":\"rotated\""), "{after}");
    let plans = open_plans(&path).expect("open plans");
    assert_eq!(plans.len(), 1, "only the unfinished plan is carried over: {after}");
    assert_eq!(plans[0].id, open);
    assert_eq!(plans[0].finished.len(), 1, "with its finished step: {after}");
    assert!(!after.contains(&plan), "a finished plan is left in the previous generation: {after}");
}

#[test]
fn one_writer_at_a_time_and_the_second_is_told_who_holds_the_journal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let first = lock(&path, std::time::Duration::ZERO).expect("first");
    // flock is per open file: a second open, even in this process, conflicts.
    let started = std::time::Instant::now();
    let e = lock(&path, std::time::Duration::from_millis(300)).expect_err("second");
    assert!(started.elapsed() >= std::time::Duration::from_millis(300), "it waited");
    assert!(is_busy(&e), "{e}");
    let said = e.to_string();
    assert!(said.contains(&format!("agent process {}", std::process::id())), "{said}");
    assert!(said.contains("journal.jsonl"), "{said}");
    drop(first);
    let again = lock(&path, std::time::Duration::ZERO).expect("free once the first let go");
    drop(again);
    // A waiting writer gets the lock as soon as the holder lets go.
    let held = lock(&path, std::time::Duration::ZERO).expect("held");
    let waiter = {
        let path = path.clone();
        std::thread::spawn(move || lock(&path, std::time::Duration::from_secs(10)).map(|_| ()))
    };
    std::thread::sleep(std::time::Duration::from_millis(200));
    drop(held);
    waiter.join().expect("thread").expect("the waiter got it");
}

/// Issue 34: an intent and a plan name their writer by PID, start time and boot, so recovery
/// can tell the very process from another that has its PID now; a record written before they
/// did falls back to the PID in its ID. A step the kernel deferred is not finished: a resumed
/// plan runs it again.
#[test]
fn records_name_their_writer_and_a_deferred_step_is_not_finished() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("journal.jsonl");
    let mut j = Journal::open(&path).expect("open");
    let plan = j.plan(&PlanBody::default()).expect("plan");
    let id = j.begin_at(&step(), Some(0)).expect("begin");
    j.finish(&id, StepResult::Deferred, "the kernel set autoclear").expect("finish");
    let records: Vec<serde_json::Value> = std::fs::read_to_string(&path)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let me = Writer::this();
    assert_eq!(me.pid, std::process::id());
    assert!(me.start.is_some() && me.boot.is_some(), "{me:?}");
    for r in records.iter().filter(|r| r["phase"] == "plan" || r["phase"] == "intent") {
        let writer = match Record::parse(r.to_string().as_bytes()) {
            Some(Record::Plan(p)) => p.writer(),
            Some(Record::Intent(i)) => i.writer(),
            _ => panic!("a plan or an intent: {r}"),
        };
        assert_eq!(writer.as_ref(), Some(me), "{r}");
    }
    let old = br#"{"ts":1,"id":"1796612538458096631-42-0","phase":"intent","step":{}}"#;
    let Some(Record::Intent(old)) = Record::parse(old) else { panic!("an intent") };
    assert_eq!(old.writer(), Some(Writer { pid: 42, start: None, boot: None }));
    let open = open_plans(&path).expect("open plans");
    assert_eq!(open.len(), 1);
    assert_eq!(open[0].id, plan);
    assert!(open[0].finished.is_empty(), "a deferred step did not finish: {:?}", open[0].finished);
}
