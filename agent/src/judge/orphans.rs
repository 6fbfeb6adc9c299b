//! Orphaned pod volume directories (kubelet: "orphaned pod ... found, but volume paths are
//! still present on disk"): a verdict for each place a volume of a pod lives below
//! `pods/<uid>/`, from evidence gathered at one instant ([`DirEvidence`]). Pure.
//!
//! A directory is orphaned only when proven so, each proof a gate ([`super::gates`]):
//! - the pod is gone per the Kubernetes API ([`gates::pod_api`]): the view vouches and no pod
//!   on this node has the UID (nor is the mirror of a static pod with it); no API word, no
//!   verdict: `unknown`;
//! - nothing of the pod runs on this node ([`gates::pod_node`]): no process in its cgroup, no
//!   mount of its files (etc-hosts, termination logs, volumes) in any namespace;
//! - nothing is mounted at or below the directory, or rooted in it, in any mount namespace,
//!   and every namespace could be read ([`gates::dir_mounts`]): else `mounted` (or `unknown`).
//!
//! An orphaned directory that holds only empty directories is a candidate: `pending` until it
//! has been seen so, by complete observations, for the grace period (a new pod's directory
//! is made before the API's view may show the pod), then `removable`. Anything else in it
//! (a file, kubelet's `vol_data.json`, a symlink) makes it `kept`: listed, with what a person
//! should check, and never removed (`rmdir` only; no recursive delete, ever).

use std::time::Duration;

use serde::Serialize;

use super::gates::{self, PodWord};
use super::grace::Clocks;
use crate::discover::kubelet::pod_dirs::{Content, PodVolumeEntry, PodVolumeKind};
use crate::graph::pod_volumes::{Pin, Reach};
use crate::host::clock::{human, BootTime};
use crate::kube::ClusterView;

/// What the world shows of one pod volume directory, gathered at one instant.
#[derive(Debug, Clone, Serialize)]
pub struct DirEvidence {
    pub entry: PodVolumeEntry,
    /// The pod's `etc-hosts` is there.
    pub etc_hosts: bool,
    /// The names in the pod's `containers/`.
    pub containers: Vec<String>,
    /// The processes in the pod's cgroup.
    pub pod_pids: Vec<u32>,
    /// Mounts of the pod's files (rooted in its directory), in any namespace.
    pub pod_rooted: Vec<Pin>,
    /// Mounts at or below the directory, or rooted in it, in any namespace.
    pub pins: Vec<Pin>,
    /// Why it cannot be told whether anything is mounted on it (a namespace that could not be
    /// read, a blind spot, the directory not located on the host).
    pub mounts_unknown: Vec<String>,
    /// Why it cannot be told whether something of the pod runs here (a process whose cgroup
    /// could not be read, a namespace that could not be read, its directory not located).
    pub pod_unknown: Vec<String>,
    /// How many mount namespaces were read whole.
    pub namespaces: usize,
}

/// The verdict on one pod volume directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirVerdict {
    /// Its pod is on this node (per the API or the node): not orphaned.
    InUse,
    /// Whether it is orphaned, or mounted, cannot be proven.
    Unknown,
    /// Its pod is gone, but something is still mounted on it (or rooted in it) somewhere.
    Mounted,
    /// Orphaned and unmounted, but not empty (or not a directory): left alone.
    Kept,
    /// Orphaned, unmounted and empty, within the grace period.
    Pending,
    /// Orphaned, unmounted and empty for the whole grace period: `rmdir` may remove it.
    Removable,
}

impl DirVerdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InUse => "in_use",
            Self::Unknown => "unknown",
            Self::Mounted => "mounted",
            Self::Kept => "kept",
            Self::Pending => "pending",
            Self::Removable => "removable",
        }
    }

    /// Every verdict, for metrics.
    pub const ALL: [DirVerdict; 6] =
        [Self::InUse, Self::Unknown, Self::Mounted, Self::Kept, Self::Pending, Self::Removable];
}

/// A verdict with its evidence, in words.
#[derive(Debug, Clone, Serialize)]
pub struct DirJudgement {
    pub verdict: DirVerdict,
    /// The proofs and refusals, in order: the API, the node, the mounts, the content.
    pub reasons: Vec<String>,
    /// What a person should check before doing anything by hand (not for `removable`).
    pub advice: Option<String>,
}

/// What a verdict rests on besides the evidence.
pub struct OrphanInput<'a> {
    pub api: Option<&'a ClusterView>,
    /// Why the API is not asked, when it is not.
    pub api_off: &'a str,
    pub now: BootTime,
    pub grace: Duration,
    pub max_gap: Duration,
}

/// The grace clock's key of a directory: its place below the kubelet directory, device and inode.
pub fn token(entry: &PodVolumeEntry) -> String {
    let key = entry.key.map_or_else(|| "?".to_owned(), |k| k.to_string());
    format!("{}@{key}", entry.rel.display())
}

/// Judges one directory, advancing its grace clock (started, kept, or forgotten).
pub fn judge(ev: &DirEvidence, input: &OrphanInput<'_>, clocks: &mut Clocks) -> DirJudgement {
    let token = token(&ev.entry);
    let j = prove(ev, input);
    if j.verdict != DirVerdict::Pending {
        clocks.forget_dir(&token);
        return j;
    }
    let mut j = j;
    let (since, restarted) = clocks.observe_dir(&token, input.now, input.max_gap);
    let age = input.now.since(since);
    if let Some(why) = restarted {
        j.reasons.push(why);
    }
    if age >= input.grace {
        j.verdict = DirVerdict::Removable;
        j.reasons.push(format!(
            "orphaned and empty for {} (grace period {})",
            human(age),
            human(input.grace)
        ));
    } else {
        j.reasons.push(format!(
            "orphaned and empty for {} of the {} grace period: not removable yet",
            human(age),
            human(input.grace)
        ));
    }
    j
}

/// The verdict without the grace clock (`Pending` for every proven, empty directory).
pub fn prove(ev: &DirEvidence, input: &OrphanInput<'_>) -> DirJudgement {
    let uid = &ev.entry.pod_uid;
    let mut reasons = Vec::new();
    let done = |verdict, reasons, advice: Option<String>| DirJudgement { verdict, reasons, advice };
    // The node first: a pod that still runs here is in use, whatever the API says.
    let rooted: Vec<Pin> = ev.pod_rooted.iter().filter(|p| p.reach == Reach::Rooted).cloned().collect();
    if let Some(why) = gates::pod_node(uid, &ev.pod_pids, &rooted, &[]) {
        return done(DirVerdict::InUse, vec![why], None);
    }
    match gates::pod_api(uid, input.api, input.api_off, input.now) {
        PodWord::OnNode(why) => return done(DirVerdict::InUse, vec![why], None),
        PodWord::CannotVouch(why) => {
            let why = format!("the Kubernetes API cannot say whether pod {uid} is gone ({why}): no orphan verdict rests on missing API evidence");
            return done(DirVerdict::Unknown, vec![why], Some(UNKNOWN_ADVICE.into()));
        }
        PodWord::Gone(why) => reasons.push(why),
    }
    if let Some(why) = gates::pod_node(uid, &[], &[], &ev.pod_unknown) {
        reasons.push(why);
        return done(DirVerdict::Unknown, reasons, Some(UNKNOWN_ADVICE.into()));
    }
    reasons.push(format!(
        "no process of pod {uid} runs on this node and nothing of its directory is mounted anywhere"
    ));
    if let Some(why) = gates::dir_mounts(&ev.pins, &ev.mounts_unknown) {
        let verdict = if ev.pins.is_empty() { DirVerdict::Unknown } else { DirVerdict::Mounted };
        reasons.push(why);
        let advice = if ev.pins.is_empty() { UNKNOWN_ADVICE.into() } else { mounted_advice(&ev.pins) };
        return done(verdict, reasons, Some(advice));
    }
    reasons
        .push(format!("nothing is mounted at or below it in any of the {} mount namespaces", ev.namespaces));
    match &ev.entry.content {
        Content::Empty { dirs } => {
            reasons.push(format!("empty: {} directory(ies), nothing else", dirs.len()));
            done(DirVerdict::Pending, reasons, None)
        }
        other => {
            let (why, advice) = kept_words(&ev.entry, other);
            reasons.push(why);
            let verdict = match other {
                Content::MountedHere { .. } => DirVerdict::Mounted,
                Content::Unreadable { .. } | Content::NotSurveyed => DirVerdict::Unknown,
                _ => DirVerdict::Kept,
            };
            done(verdict, reasons, Some(advice))
        }
    }
}

const UNKNOWN_ADVICE: &str = "nothing is removed until every proof holds: restore what the agent could not see (the API's view, a mount namespace or process it could not read), then scan again";

fn mounted_advice(pins: &[Pin]) -> String {
    let ns: Vec<String> = pins.iter().map(|p| p.namespace.0.to_string()).collect();
    format!(
        "never `rm -rf` it: that deletes the volume's data through the mount. Find the process in mount namespace {} (`blockjanitor-agent holders DEVICE` for a block device names it), let it go (`release DEVICE`, or restart it with mountPropagation: HostToContainer), then the empty directory can be removed",
        ns.join(", ")
    )
}

/// Why an orphaned, unmounted directory is kept, and what to check.
fn kept_words(entry: &PodVolumeEntry, content: &Content) -> (String, String) {
    match content {
        Content::NotEmpty { entries, first } => {
            let vol_data = first.iter().any(|f| f.starts_with("vol_data.json"));
            let advice = if vol_data {
                "it holds kubelet's vol_data.json (a CSI volume's record): make sure the CSI driver unpublished the volume on this node (its NodeUnpublishVolume; `mount | grep` the volume handle), then restart kubelet so it cleans up what it wrote, or look at the files and move them away yourself".to_owned()
            } else {
                "it holds files written after the volume was unmounted, or another volume's data: look at them and move them away yourself; the agent removes only empty directories, never their contents".to_owned()
            };
            (format!("not empty: {entries} entry(ies), first: {}", first.join(", ")), advice)
        }
        Content::NotADirectory { kind, target } => {
            let to = target.as_ref().map(|t| format!(" to {}", t.display())).unwrap_or_default();
            let advice = if entry.kind == PodVolumeKind::Device {
                format!("kubelet's map of a raw block volume{to}: check that nothing uses the device (`blockjanitor-agent holders DEVICE`) before removing the link yourself")
            } else {
                "not a directory: check what it is before removing it yourself".to_owned()
            };
            (format!("a {kind}{to}, not a directory: the agent removes only empty directories"), advice)
        }
        Content::MountedHere { at } => (
            format!("something is mounted at {} in the agent's own mount namespace", entry.rel.join(at).display()),
            "a mount in the agent's namespace is the host's (the agent sees the kubelet directory with HostToContainer propagation): find it with `findmnt` on the node".to_owned(),
        ),
        Content::Unreadable { why } => (format!("cannot be read: {why}"), UNKNOWN_ADVICE.to_owned()),
        Content::NotSurveyed => ("not looked into".to_owned(), UNKNOWN_ADVICE.to_owned()),
        Content::Empty { .. } => (String::new(), String::new()),
    }
}

#[cfg(test)]
#[path = "orphans_tests.rs"]
mod tests;
