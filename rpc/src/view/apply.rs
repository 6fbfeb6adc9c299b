//! What `apply` did: each plan's steps matched with their results, counted (with the exit code
//! that follows), and as text.

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::view::plan::{identity_line, left_alone_lines, plan_head, plural, step_text};
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

fn result_text(res: &pb::StepResult) -> String {
    let word = clean(&res.result.replace('_', " "));
    if res.detail.is_empty() {
        word
    } else {
        format!("{word}: {}", clean(&res.detail))
    }
}

/// `apply` as text: per device each step with its result, then a summary line.
pub fn apply_table(r: &pb::ApplyResponse) -> String {
    let (per_plan, rest) = match_results(r);
    let mut out = String::new();
    if r.plans.is_empty() && r.results.is_empty() {
        out.push_str("nothing to do\n");
    }
    for (p, results) in r.plans.iter().zip(&per_plan) {
        let _ = writeln!(out, "{}", plan_head(p));
        identity_line(&mut out, p);
        for (i, (s, res)) in p.steps.iter().zip(results).enumerate() {
            let what = res.map_or_else(|| "not run".to_owned(), result_text);
            let _ = writeln!(out, "  {}. {} -> {what}", i + 1, step_text(s));
        }
        left_alone_lines(&mut out, p);
    }
    for res in rest {
        let step = res.step.as_ref().map_or_else(|| "(unknown step)".to_owned(), step_text);
        let _ = writeln!(out, "{step} -> {}", result_text(res));
    }
    let _ = writeln!(out, "{}", apply_summary(r).line());
    out
}
