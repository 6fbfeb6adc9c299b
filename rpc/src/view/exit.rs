//! The exit codes of both CLIs (README "Exit codes"), one table, so that a script reads the same
//! answer from `agentctl` as from the one-shot `blockjanitor-agent` command:
//! `0` free / done, `1` error, `2` held, `3` unknown, `4` refused. The agent's request classes
//! map onto these constants by their words ([`outcome`]): the engine knows no exit code.
//!
//! `holders` exits like `fuser -s`: `2` when something holds the device, `0` when nothing does,
//! `3` when the agent cannot say (the device's verdict is `unknown`); of several devices, `2` if
//! any is held, else `3` if any is unknown ([`holders_many`]). `plan` and `apply` take the
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
/// What every `apply` (the agent's, agentctl's, `fleet apply`) says on stderr when it showed
/// the plans and, without `--yes`, carried nothing out. None of them asks a question.
pub const NOT_CONFIRMED: &str = "not applied: add --yes to carry it out";

/// The table itself, as both CLIs' `--help` print it and README's "Exit codes" gives it: each
/// code, its word, and when it is used.
pub const TABLE: [(u8, &str, &str); 5] = [
    (
        DONE,
        "free / done",
        "nothing holds the device (holders, as fuser -s), nothing to do, a dry run that may go, or every step done",
    ),
    (
        ERROR,
        "error",
        "a bad argument or unknown device, no connection, an unreadable host or journal, a step that failed",
    ),
    (
        HELD,
        "held",
        "something holds the device (holders, as fuser -s); release, clean and plans leave it alone; \
         apply: not everything carried out (no --yes, a step deferred)",
    ),
    (
        UNKNOWN,
        "unknown",
        "the agent could not see everything that could hold it (a blind spot; the API cannot vouch); \
         the report's first line says INCOMPLETE VIEW",
    ),
    (
        REFUSED,
        "refused",
        "a safety rule other than a holder said no (protected, not stale yet, an outage, the identity changed, \
         --apply without the privileges to see, another run holds the journal, not an operator)",
    ),
];

/// The `EXIT CODES:` section of both CLIs' `--help`, from [`TABLE`].
pub fn help_section() -> String {
    let mut out = String::from("EXIT CODES (both CLIs, one table):\n");
    for (code, word, when) in TABLE {
        out.push_str(&format!("  {code}  {word}: {when}\n"));
    }
    out
}

/// `explain` (agentctl fleet, the kubectl plugin), in the same table's words: `2` blocked with a
/// known fix (something holds or keeps the volume, as `held`: the answer says what and the next
/// command), `0` not blocked (nothing on any node blocks it: look elsewhere), `3` unknown (a
/// node involved cannot be asked and is not believed dead, or its agent cannot vouch), `1` error
/// (the pod does not exist, the console cannot read the API).
pub fn explain(outcome: i32) -> u8 {
    match pb::ExplainOutcome::try_from(outcome) {
        Ok(pb::ExplainOutcome::Blocked) => HELD,
        Ok(pb::ExplainOutcome::NotBlocked) => DONE,
        Ok(pb::ExplainOutcome::Unknown) => UNKNOWN,
        _ => ERROR,
    }
}

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

/// `holders` of several devices, from each device's own code ([`holders`]): `2` if any is held
/// (as `fuser -s` answers for several files), else `3` if any is unknown, else `0`; an error (any
/// other code) outranks them all. One device: its own code.
pub fn holders_many(codes: impl IntoIterator<Item = u8>) -> u8 {
    let codes: Vec<u8> = codes.into_iter().collect();
    if let Some(e) = codes.iter().copied().find(|c| ![DONE, HELD, UNKNOWN].contains(c)) {
        return e;
    }
    if codes.contains(&HELD) {
        HELD
    } else if codes.contains(&UNKNOWN) {
        UNKNOWN
    } else {
        DONE
    }
}

/// One plan's outcome as an exit code. An agent older than the `outcome` field: a refused plan
/// is `held` if it leaves holders alone, else `refused`.
pub fn plan(p: &pb::DevicePlan) -> u8 {
    match p.outcome.as_str() {
        "" if p.refusal.is_empty() => DONE,
        "" if !p.left_alone.is_empty() => HELD,
        "" => REFUSED,
        word => outcome(word),
    }
}

/// The exit code of a request's outcome word (`DevicePlan.outcome`, the agent's `OutcomeClass`): done,
/// held, unknown, refused; anything else (error, a word this client does not know) is an error.
pub fn outcome(word: &str) -> u8 {
    match word {
        "done" => DONE,
        "held" => HELD,
        "unknown" => UNKNOWN,
        "refused" => REFUSED,
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
    fn explain_exits_blocked_not_blocked_unknown_without_a_new_code() {
        assert_eq!(explain(pb::ExplainOutcome::Blocked as i32), HELD);
        assert_eq!(explain(pb::ExplainOutcome::NotBlocked as i32), DONE);
        assert_eq!(explain(pb::ExplainOutcome::Unknown as i32), UNKNOWN);
        assert_eq!(explain(pb::ExplainOutcome::Unspecified as i32), ERROR);
    }

    #[test]
    fn several_devices_exit_held_before_unknown() {
        assert_eq!(holders_many([DONE, UNKNOWN, HELD]), HELD, "held wins, as for one device");
        assert_eq!(holders_many([DONE, UNKNOWN]), UNKNOWN);
        assert_eq!(holders_many([DONE, DONE]), DONE);
        assert_eq!(holders_many([HELD, ERROR]), ERROR);
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
