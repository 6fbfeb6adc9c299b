//! What weighs on a verdict besides the device's holders: a device that does not answer I/O
//! (the stall watch), and what the Kubernetes API says of its volume.

use super::{gates, multipath};
use super::{JudgeInput, Judgement, Verdict};
use crate::graph::DeviceEntry;
use crate::judge::gates::ApiWord;
use crate::judge::stall::Stall;

/// The evidence that a device does not answer: its counters, and the holders waiting in D state.
pub(super) fn stall_evidence(e: &DeviceEntry, stall: &Stall) -> String {
    let stuck: Vec<String> = e
        .holders
        .iter()
        .filter(|h| h.process_state == Some('D'))
        .filter_map(|h| {
            let pid = h.pids.first()?;
            Some(match &h.comm {
                Some(c) => format!("pid {pid} ({c})"),
                None => format!("pid {pid}"),
            })
        })
        .collect();
    if stuck.is_empty() {
        return stall.describe();
    }
    format!("{}; waiting on it in D state: {}", stall.describe(), stuck.join(", "))
}

/// Puts the evidence that a device does not answer first among its reasons (an unknown
/// candidate already has it).
pub(super) fn weigh_stall(mut j: Judgement, e: &DeviceEntry, stall: Option<&Stall>) -> Judgement {
    let Some(stall) = stall else { return j };
    if j.reasons.first().is_some_and(|r| r.starts_with("unresponsive:")) {
        return j;
    }
    let why = if multipath::unblocked_by_its_plan(e) {
        format!(
            "{}: stopping the map's queueing (fail_if_no_path, its plan's first step) fails that I/O",
            stall_evidence(e, stall)
        )
    } else {
        stall_evidence(e, stall)
    };
    j.reasons.insert(0, why);
    j
}

/// Weighs what the Kubernetes API says (protected devices aside): a running pod on this node
/// using the device's PV, or its VolumeAttachment attached here, makes it in use; an API that
/// cannot vouch (not synced, a watch broken, silent, no such Node) makes a candidate unknown.
pub(super) fn weigh_api(j: Judgement, e: &DeviceEntry, input: &JudgeInput<'_>) -> Judgement {
    if j.verdict == Verdict::Protected {
        return j;
    }
    let candidate = matches!(j.verdict, Verdict::Stale | Verdict::Suspect);
    match gates::api(e, input.api, input.now) {
        ApiWord::NotConfigured => j,
        word @ ApiWord::CannotVouch(_) => {
            let why = word.refusal().unwrap_or_default();
            if candidate {
                // Why it is unknown comes first.
                let mut reasons = vec![why.clone()];
                reasons.extend(j.reasons);
                Judgement { verdict: Verdict::Unknown, summary: format!("{why}; {}", j.summary), reasons }
            } else {
                let mut reasons = j.reasons;
                reasons.push(why);
                Judgement { verdict: j.verdict, summary: j.summary, reasons }
            }
        }
        ApiWord::InUse(mut users) => {
            users.extend(j.reasons);
            Judgement::new(Verdict::InUse, users)
        }
        ApiWord::NoUser(why) if candidate => {
            let mut reasons = j.reasons;
            reasons.push(why);
            Judgement { verdict: j.verdict, summary: j.summary, reasons }
        }
        ApiWord::NoUser(_) => j,
    }
}
