//! What `apply` did: each plan's steps matched with their results, counted (with the exit code
//! that follows), and as text, with the device as it is afterwards; both CLIs print it.

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::view::plan::{
    identity_line, incomplete_line, left_alone_lines, note_lines, plan_head, plural, step_text,
};
use crate::view::table::clean;

/// What `apply` did, counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplySummary {
    pub done: usize,
    pub already_absent: usize,
    pub deferred: usize,
    pub failed: usize,
    /// Planned steps with no result (an earlier step failed or was deferred).
    pub not_run: usize,
    /// Plans refused as a whole.
    pub refused: usize,
}

impl ApplySummary {
    /// 1 when a step failed; 2 when a step was deferred or not run, or a plan refused; else 0.
    pub fn exit_code(&self) -> u8 {
        if self.failed > 0 {
            1
        } else if self.deferred > 0 || self.not_run > 0 || self.refused > 0 {
            2
        } else {
            0
        }
    }

    pub fn line(&self) -> String {
        let mut parts = vec![format!("{} done", self.done)];
        if self.already_absent > 0 {
            parts.push(format!("{} already absent", self.already_absent));
        }
        parts.push(format!("{} deferred", self.deferred));
        parts.push(format!("{} failed", self.failed));
        if self.not_run > 0 {
            parts.push(format!("{} not run", self.not_run));
        }
        if self.refused > 0 {
            parts.push(format!("{} refused", plural(self.refused, "plan")));
        }
        parts.join(", ")
    }
}

/// Each plan's steps paired with their results, in order; results no step claims come last.
type Matched<'a> = (Vec<Vec<Option<&'a pb::StepResult>>>, Vec<&'a pb::StepResult>);

fn match_results(r: &pb::ApplyResponse) -> Matched<'_> {
    let mut used = vec![false; r.results.len()];
    let mut per_plan = Vec::new();
    for p in &r.plans {
        let mut row = Vec::new();
        for s in p.steps.iter().filter(|_| p.refusal.is_empty()) {
            let found = r
                .results
                .iter()
                .enumerate()
                .find(|(i, res)| !used.get(*i).copied().unwrap_or(true) && res.step.as_ref() == Some(s));
            row.push(found.map(|(i, res)| {
                if let Some(u) = used.get_mut(i) {
                    *u = true;
                }
                res
            }));
        }
        per_plan.push(row);
    }
    let rest = r.results.iter().zip(&used).filter(|(_, u)| !**u).map(|(res, _)| res).collect();
    (per_plan, rest)
}

fn count(s: &mut ApplySummary, res: &pb::StepResult) {
    match res.result.as_str() {
        "done" => s.done += 1,
        "already_absent" => s.already_absent += 1,
        "deferred" => s.deferred += 1,
        // "failed", and any word this client does not know.
        _ => s.failed += 1,
    }
}

/// Counts `apply`'s results.
pub fn apply_summary(r: &pb::ApplyResponse) -> ApplySummary {
    let (per_plan, rest) = match_results(r);
    let mut s = ApplySummary {
        refused: r.plans.iter().filter(|p| !p.refusal.is_empty()).count(),
        ..Default::default()
    };
    for res in per_plan.iter().flatten() {
        match res {
            Some(res) => count(&mut s, res),
            None => s.not_run += 1,
        }
    }
    for res in rest {
        count(&mut s, res);
    }
    s
}

/// A step's result: its word (a failure in capitals, to stand out), then the detail.
fn result_text(res: &pb::StepResult) -> String {
    let word =
        if res.result == "failed" { "FAILED".to_owned() } else { clean(&res.result.replace('_', " ")) };
    if res.detail.is_empty() {
        word
    } else {
        format!("{word}: {}", clean(&res.detail))
    }
}

/// The device a plan was carried out on, as the scan after its steps saw it: still held (its
/// table), free, or gone. Nothing for a plan refused, of no steps, or not run through.
fn after_lines(
    out: &mut String,
    r: &pb::ApplyResponse,
    p: &pb::DevicePlan,
    results: &[Option<&pb::StepResult>],
) {
    let ran = results.iter().all(|res| res.is_some_and(|res| res.result != "failed"));
    if !p.refusal.is_empty() || p.steps.is_empty() || !ran {
        return;
    }
    let name = clean(&p.device);
    match r.after.iter().find(|d| d.name == p.device) {
        Some(d) if !d.holders.is_empty() => {
            let _ = writeln!(out, "still held after {}:", clean(&p.operation));
            out.push_str(&crate::view::text::device_table(d, false));
        }
        Some(d) if d.kind == pb::DeviceKind::Loop as i32 && d.loop_backing_file.is_empty() => {
            let _ = writeln!(out, "{name} is free and unbound");
        }
        Some(_) => {
            let _ = writeln!(out, "{name} is free: nothing holds it any more");
        }
        None => {
            let _ = writeln!(out, "{name} is gone");
        }
    }
}

/// `apply` as text: the unfinished plans resumed first, then per device (after its INCOMPLETE
/// VIEW line, if any) each step with its result and the device afterwards, then a summary line
/// (not after the one line of a single device's plan refused as a whole).
pub fn apply_table(r: &pb::ApplyResponse) -> String {
    let (per_plan, rest) = match_results(r);
    let mut out = String::new();
    for resumed in &r.resumed {
        let _ = writeln!(out, "{}", clean(&resumed.summary));
    }
    if r.plans.is_empty() && r.results.is_empty() {
        if r.resumed.is_empty() {
            out.push_str("nothing to do\n");
        }
        // The device named was gone once the interrupted plans it named were finished.
        for resumed in &r.resumed {
            let _ = writeln!(
                out,
                "{} is gone: the interrupted plan it named is finished",
                clean(&resumed.argument)
            );
        }
    }
    for (p, results) in r.plans.iter().zip(&per_plan) {
        incomplete_line(&mut out, p);
        let _ = writeln!(out, "{}", plan_head(p));
        identity_line(&mut out, p);
        for (i, (s, res)) in p.steps.iter().zip(results).enumerate() {
            let what = res.map_or_else(|| "not run".to_owned(), result_text);
            let _ = writeln!(out, "  {}. {} -> {what}", i + 1, step_text(s));
        }
        note_lines(&mut out, p);
        left_alone_lines(&mut out, p);
        after_lines(&mut out, r, p, results);
    }
    for res in rest {
        let step = res.step.as_ref().map_or_else(|| "(unknown step)".to_owned(), step_text);
        let _ = writeln!(out, "{step} -> {}", result_text(res));
    }
    // One device refused as a whole is said in its one line: a count adds nothing to it.
    let one_refusal = r.plans.len() == 1 && !r.plans[0].refusal.is_empty() && r.resumed.is_empty();
    if !(one_refusal && r.results.is_empty()) {
        let _ = writeln!(out, "{}", apply_summary(r).line());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::plan::{dry_run_table, plans_table};

    fn step(d: &str) -> pb::Step {
        pb::Step { action: "detach_loop".into(), device: d.into(), description: format!("detach {d}") }
    }

    fn plan(d: &str) -> pb::DevicePlan {
        pb::DevicePlan {
            device: d.into(),
            steps: vec![step(d)],
            operation: "clean".into(),
            ..Default::default()
        }
    }

    fn result(d: &str, word: &str) -> pb::StepResult {
        pb::StepResult { step: Some(step(d)), result: word.into(), detail: String::new() }
    }

    fn applied(word: &str, after: Vec<pb::Device>) -> pb::ApplyResponse {
        pb::ApplyResponse {
            plans: vec![plan("loop1")],
            results: vec![result("loop1", word)],
            after,
            ..Default::default()
        }
    }

    #[test]
    fn the_device_afterwards_follows_its_steps_and_the_summary_ends() {
        let unbound =
            pb::Device { name: "loop1".into(), kind: pb::DeviceKind::Loop as i32, ..Default::default() };
        let t = apply_table(&applied("done", vec![unbound]));
        assert_eq!(t, "loop1: 1 step\n  1. detach_loop: detach loop1 -> done\nloop1 is free and unbound\n1 done, 0 deferred, 0 failed\n");
        let bound = pb::Device {
            name: "loop1".into(),
            kind: pb::DeviceKind::Loop as i32,
            loop_backing_file: "/x.img".into(),
            ..Default::default()
        };
        assert!(apply_table(&applied("done", vec![bound]))
            .contains("\nloop1 is free: nothing holds it any more\n"));
        let held = pb::Device {
            name: "loop1".into(),
            holders: vec![pb::Holder { description: "held by pid 7".into(), ..Default::default() }],
            ..Default::default()
        };
        let t = apply_table(&applied("done", vec![held]));
        assert!(t.contains("\nstill held after clean:\nloop1 ("), "{t}");
        assert!(apply_table(&applied("done", vec![])).contains("\nloop1 is gone\n"));
        // A failed step says nothing of the device afterwards, and stands out.
        let t = apply_table(&applied("failed", vec![]));
        assert!(t.contains(" -> FAILED\n") && !t.contains("is gone"), "{t}");
    }

    #[test]
    fn one_device_refused_is_one_line_and_more_devices_end_with_the_count() {
        let refused = pb::DevicePlan { refusal: "--apply refused: not root".into(), ..plan("loop1") };
        let one = pb::ApplyResponse { plans: vec![refused.clone()], ..Default::default() };
        let t = apply_table(&one);
        assert_eq!(t.lines().count(), 1, "{t}");
        assert!(t.starts_with("loop1: refused: --apply refused: not root"), "{t}");
        let two = pb::ApplyResponse { plans: vec![refused, plan("loop2")], ..Default::default() };
        assert!(
            apply_table(&two).ends_with("\n0 done, 0 deferred, 0 failed, 1 not run, 1 plan refused\n"),
            "{}",
            apply_table(&two)
        );
    }

    #[test]
    fn a_device_gone_once_its_interrupted_plan_is_finished_says_so() {
        let r = pb::ApplyResponse {
            resumed: vec![pb::ResumedPlan {
                argument: "mpathb".into(),
                summary: "resumed plan 7 of mpathb: 2 done".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            apply_table(&r),
            "resumed plan 7 of mpathb: 2 done\nmpathb is gone: the interrupted plan it named is finished\n0 done, 0 deferred, 0 failed\n"
        );
    }

    #[test]
    fn plans_show_their_incomplete_view_and_notes_and_a_dry_run_says_how_to_carry_it_out() {
        let p = pb::DevicePlan {
            incomplete_view: "INCOMPLETE VIEW: /proc/9 unreadable".into(),
            notes: vec!["the mount stays in 3 namespaces".into()],
            ..plan("loop1")
        };
        let r = pb::PlanResponse { plans: vec![p], ..Default::default() };
        let t = plans_table(&r, false);
        assert_eq!(
            t,
            "INCOMPLETE VIEW: /proc/9 unreadable\nloop1: 1 step\n  1. detach_loop: detach loop1\n  note: the mount stays in 3 namespaces\n"
        );
        assert_eq!(dry_run_table(&r), format!("{t}dry run: add --apply to carry them out\n"));
        let refused = pb::PlanResponse {
            plans: vec![pb::DevicePlan { refusal: "held".into(), ..plan("loop1") }],
            ..Default::default()
        };
        assert_eq!(dry_run_table(&refused), "loop1: refused: held\n", "nothing to carry out");
    }
}
