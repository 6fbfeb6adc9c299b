//! The orphaned pod volume directories of a view as the wire has them
//! (`ListDevicesResponse.orphaned_volume_dirs`), which `scan` prints in both CLIs; and a
//! request about one ([`DirOutcome`]) as a plan and its step results, which `clean`, `plan`
//! and `apply` print as the `plans` and `results` documents.

use blockjanitor_proto::v1 as pb;

use crate::discover::kubelet::pod_dirs::Content;
use crate::engine::dir_workflow::DirOutcome;
use crate::engine::pod_volumes::{JudgedDir, PodVolumeReport};
use crate::plan::pod_volume::DirStep;

/// Every listed directory of the report, in its order.
pub fn orphaned_volume_dirs(r: &PodVolumeReport) -> Vec<pb::OrphanedVolumeDir> {
    r.dirs.iter().map(dir).collect()
}

/// Why the report lists nothing because the kubelet directory could not be read ("" if it was).
pub fn unknown(r: &PodVolumeReport) -> String {
    r.error.clone().unwrap_or_default()
}

fn dir(d: &JudgedDir) -> pb::OrphanedVolumeDir {
    let e = &d.evidence.entry;
    let mounts = d.evidence.pins.iter().chain(&d.evidence.pod_rooted).map(|p| p.describe()).collect();
    pb::OrphanedVolumeDir {
        argument: d.argument.clone(),
        path: e.path.display().to_string(),
        pod_uid: e.pod_uid.clone(),
        kind: e.kind.as_str().to_owned(),
        plugin: e.plugin.clone(),
        name: e.name.clone(),
        verdict: d.judgement.verdict.as_str().to_owned(),
        reasons: d.judgement.reasons.clone(),
        advice: d.judgement.advice.clone().unwrap_or_default(),
        mounts,
        content: content(&e.content),
        identity: e.key.map(|k| k.to_string()).unwrap_or_default(),
    }
}

/// What a directory holds, in words.
pub fn content(c: &Content) -> String {
    match c {
        Content::Empty { dirs } => format!("empty ({} directories)", dirs.len()),
        Content::NotEmpty { entries, first } => format!("{entries} entries: {}", first.join(", ")),
        Content::NotADirectory { kind, target } => match target {
            Some(t) => format!("{kind} to {}", t.display()),
            None => (*kind).to_owned(),
        },
        Content::MountedHere { at } => format!("mounted at {} in the agent's namespace", at.display()),
        Content::Unreadable { why } => format!("unreadable: {why}"),
        Content::NotSurveyed => "not looked into (its pod runs here)".to_owned(),
    }
}

/// A pod volume directory's outcome as a plan on the wire (the `plans` and `results`
/// documents): its argument as the device, its `rmdir` steps, its verdict's reasons and
/// advice as notes, its device and inode as the identity; a refusal before any plan (sight,
/// may-act, the journal's lock) is a plan of no steps that says why.
pub fn dir_plan(out: &DirOutcome, argument: &str) -> pb::DevicePlan {
    let class = out.class();
    let mut p = pb::DevicePlan {
        device: argument.to_owned(),
        operation: "clean".into(),
        outcome: class.as_str().to_owned(),
        ..Default::default()
    };
    if let Some(plan) = &out.plan {
        p.steps = plan.steps.iter().map(|s| dir_step(s, argument)).collect();
        p.refusal = plan.refusal.clone().unwrap_or_default();
        p.notes =
            plan.reasons.iter().cloned().chain(plan.advice.iter().map(|a| format!("check: {a}"))).collect();
        p.identity =
            out.evidence.as_ref().and_then(|e| e.entry.key).map(|k| k.to_string()).unwrap_or_default();
        if let Some(ev) = &out.evidence {
            p.left_alone = ev.pins.iter().chain(&ev.pod_rooted).map(|pin| pin.describe()).collect();
        }
    }
    if let Some((_, why)) = &out.refusal {
        p.refusal = why.clone();
    }
    if let Some(gone) = &out.gone {
        p.notes.push(gone.clone());
    }
    p
}

fn dir_step(s: &DirStep, argument: &str) -> pb::Step {
    pb::Step { action: s.action().to_owned(), device: argument.to_owned(), description: s.describe() }
}

/// The `rmdir`s a directory's outcome ran, as Apply answers them.
pub fn dir_results(out: &DirOutcome, argument: &str) -> Vec<pb::StepResult> {
    out.reports
        .iter()
        .map(|r| {
            let (result, detail) = r.word();
            pb::StepResult { step: Some(dir_step(&r.step, argument)), result: result.to_owned(), detail }
        })
        .collect()
}
