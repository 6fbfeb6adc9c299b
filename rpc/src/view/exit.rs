//! The exit codes of both CLIs (README "Exit codes"), one table, so that a script reads the same
//! answer from `agentctl` as from the one-shot `blockjanitor-agent` command:
//! `0` free / done, `1` error, `2` held, `3` unknown, `4` refused. The agent's request classes
//! (`Class::exit_code`) map onto these constants.
//!
//! `holders` exits like `fuser -s`: `2` when something holds the device, `0` when nothing does,
//! `3` when the agent cannot say (the device's verdict is `unknown`). `plan` and `apply` take the
//! worst of each plan's outcome (the agent's word for what the request came to) and, for `apply`,
//! of the steps' results (a failed step `1`, a deferred or unrun one `2`).

use blockjanitor_proto::v1 as pb;

pub const DONE: u8 = 0;
pub const ERROR: u8 = 1;
pub const HELD: u8 = 2;
pub const UNKNOWN: u8 = 3;
pub const REFUSED: u8 = 4;
/// `apply` without `--yes`, or an apply that did not carry everything out (a step deferred or
/// not run, a plan refused): the device was left as it was, as for `held`.
pub const NOT_DONE: u8 = HELD;

/// How bad an exit code is: error > refused > unknown > held > done (as the agent ranks them).
fn rank(code: u8) -> u8 {
    match code {
        DONE => 0,
        HELD => 1,
        UNKNOWN => 2,
        REFUSED => 3,
        _ => 4,
    }
}

/// The worse of two exit codes.
pub fn worst(a: u8, b: u8) -> u8 {
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// `holders`: held, free, or unknown (nothing seen holding it, but a blind spot could hide a
/// holder: `incomplete_view` is the INCOMPLETE VIEW line, "" when none; or the verdict is
/// unknown).
pub fn holders(d: &pb::Device, incomplete_view: &str) -> u8 {
    if !d.holders.is_empty() {
        HELD
    } else if !incomplete_view.is_empty() || d.verdict == pb::Verdict::Unknown as i32 {
        UNKNOWN
    } else {
        DONE
    }
}

/// One plan's outcome as an exit code. An agent older than the `outcome` field: a refused plan
/// is `held` if it leaves holders alone, else `refused`.
pub fn plan(p: &pb::DevicePlan) -> u8 {
    match p.outcome.as_str() {
        "done" => DONE,
        "held" => HELD,
        "unknown" => UNKNOWN,
        "refused" => REFUSED,
        "" if p.refusal.is_empty() => DONE,
        "" if !p.left_alone.is_empty() => HELD,
        "" => REFUSED,
        _ => ERROR,
    }
}

/// `plan`: the worst of its plans (none: nothing to do).
pub fn plans(plans: &[pb::DevicePlan]) -> u8 {
    plans.iter().map(plan).fold(DONE, worst)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(outcome: &str, refusal: &str, left_alone: &[&str]) -> pb::DevicePlan {
        pb::DevicePlan {
            outcome: outcome.into(),
            refusal: refusal.into(),
            left_alone: left_alone.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn plans_exit_with_the_worst_outcome() {
        assert_eq!(plans(&[]), DONE);
        assert_eq!(plans(&[p("done", "", &[]), p("held", "held", &["mount"])]), HELD);
        assert_eq!(plans(&[p("unknown", "x", &[]), p("held", "x", &[])]), UNKNOWN);
        assert_eq!(plans(&[p("refused", "x", &[]), p("unknown", "x", &[])]), REFUSED);
        assert_eq!(plans(&[p("error", "x", &[]), p("refused", "x", &[])]), ERROR);
        assert_eq!(plans(&[p("", "", &[])]), DONE, "an older agent's plan that may go");
        assert_eq!(plans(&[p("", "held by a mount", &["mount /x"])]), HELD);
        assert_eq!(plans(&[p("", "protected", &[])]), REFUSED);
    }

    #[test]
    fn holders_exit_like_fuser() {
        let held = pb::Device { holders: vec![pb::Holder::default()], ..Default::default() };
        assert_eq!(holders(&held, ""), HELD);
        assert_eq!(holders(&held, "INCOMPLETE VIEW"), HELD, "held wins");
        let unknown = pb::Device { verdict: pb::Verdict::Unknown as i32, ..Default::default() };
        assert_eq!(holders(&unknown, ""), UNKNOWN);
        let free = pb::Device { verdict: pb::Verdict::Stale as i32, ..Default::default() };
        assert_eq!(holders(&free, ""), DONE);
        assert_eq!(holders(&free, "INCOMPLETE VIEW: 1 thing(s)"), UNKNOWN);
    }
}
