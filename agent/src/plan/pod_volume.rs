//! The plan for an orphaned pod volume directory: one `rmdir` per directory of it, deepest
//! first (`.../pvc-1/mount`, then `.../pvc-1`), each carrying the directory's device and inode
//! (re-checked right before it runs, with everything that made the directory removable). Only
//! for a `removable` one ([`crate::judge::orphans`]); anything else is a refusal naming why. No
//! step ever removes anything but an empty directory. Pure.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::discover::kubelet::pod_dirs::{Content, PodVolumeEntry};
use crate::host::beneath::FileKey;
use crate::judge::orphans::{DirJudgement, DirVerdict};

/// How an operator names a pod volume directory: `pod-volume:<uid>/<kind dir>/<...>`, the part
/// below `pods/` (`pod-volume:0a5e.../volumes/kubernetes.io~csi/pvc-1`).
pub const PREFIX: &str = "pod-volume:";

/// `rmdir` of one empty directory below the kubelet directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "action", rename = "rmdir_pod_volume_dir")]
pub struct DirStep {
    pub pod_uid: String,
    /// The volume entry it belongs to, below the kubelet directory.
    pub volume: PathBuf,
    /// This directory, below the kubelet directory.
    pub path: PathBuf,
    /// Its device and inode when planned.
    pub key: FileKey,
    /// The kubelet directory as the host sees it.
    pub kubelet_dir: PathBuf,
}

impl DirStep {
    /// The step's kind, as journals, audit lines and metrics name it.
    pub const ACTION: &'static str = "rmdir_pod_volume_dir";

    pub fn action(&self) -> &'static str {
        Self::ACTION
    }

    /// The directory as the host sees it.
    pub fn host_path(&self) -> PathBuf {
        self.kubelet_dir.join(&self.path)
    }

    /// One line for humans.
    pub fn describe(&self) -> String {
        format!(
            "remove the empty directory {} (rmdir, device/inode {}) of orphaned pod {}",
            self.host_path().display(),
            self.key,
            self.pod_uid
        )
    }
}

/// What to do to one pod volume directory.
#[derive(Debug, Clone, Serialize)]
pub struct DirPlan {
    /// How the operator (or the daemon) named it: `pod-volume:<...>`.
    pub argument: String,
    pub pod_uid: String,
    /// The entry, below the kubelet directory.
    pub volume: PathBuf,
    pub verdict: DirVerdict,
    pub reasons: Vec<String>,
    pub steps: Vec<DirStep>,
    /// Why nothing may be done (every verdict but `removable`).
    pub refusal: Option<String>,
    pub advice: Option<String>,
}

/// The argument that names `entry` (`pod-volume:<below pods/>`).
pub fn argument(entry: &PodVolumeEntry) -> String {
    let below = entry.rel.strip_prefix("pods").unwrap_or(&entry.rel);
    format!("{PREFIX}{}", below.display())
}

/// The path below the kubelet directory an argument names: `pod-volume:<uid>/...`, or an
/// absolute path into `kubelet_dir/pods/`. `None`: it names no pod volume directory.
pub fn parse_argument(arg: &str, kubelet_dir: &Path) -> Option<PathBuf> {
    let below = match arg.strip_prefix(PREFIX) {
        Some(rest) => PathBuf::from(rest.trim_start_matches('/')),
        None => Path::new(arg).strip_prefix(kubelet_dir.join("pods")).ok()?.to_owned(),
    };
    let ok = below.components().count() >= 2
        && below.components().all(|c| matches!(c, std::path::Component::Normal(_)));
    ok.then(|| Path::new("pods").join(below))
}

/// The plan for `entry` as judged: its directories deepest first, or why not.
pub fn plan(entry: &PodVolumeEntry, judged: &DirJudgement, kubelet_dir: &Path) -> DirPlan {
    let mut p = DirPlan {
        argument: argument(entry),
        pod_uid: entry.pod_uid.clone(),
        volume: entry.rel.clone(),
        verdict: judged.verdict,
        reasons: judged.reasons.clone(),
        steps: Vec::new(),
        refusal: None,
        advice: judged.advice.clone(),
    };
    match (&entry.content, judged.verdict) {
        (Content::Empty { dirs }, DirVerdict::Removable) => {
            p.steps = dirs
                .iter()
                .map(|(path, key)| DirStep {
                    pod_uid: entry.pod_uid.clone(),
                    volume: entry.rel.clone(),
                    path: path.clone(),
                    key: *key,
                    kubelet_dir: kubelet_dir.to_owned(),
                })
                .collect();
        }
        (_, verdict) => {
            let last = judged.reasons.last().cloned().unwrap_or_default();
            p.refusal = Some(format!("{} is {}: {last}", p.argument, verdict.as_str()));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::kubelet::pod_dirs::PodVolumeKind;
    use crate::model::DevNum;

    fn key(ino: u64) -> FileKey {
        FileKey { dev: DevNum::new(254, 1), ino }
    }

    fn entry(content: Content) -> PodVolumeEntry {
        PodVolumeEntry {
            pod_uid: "u1".into(),
            kind: PodVolumeKind::Volume,
            rel: "pods/u1/volumes/kubernetes.io~csi/pvc-1".into(),
            path: "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1".into(),
            plugin: "kubernetes.io/csi".into(),
            name: "pvc-1".into(),
            key: Some(key(10)),
            content,
        }
    }

    #[test]
    fn a_removable_directory_is_removed_deepest_first_anything_else_is_refused() {
        let dirs = vec![
            (PathBuf::from("pods/u1/volumes/kubernetes.io~csi/pvc-1/mount"), key(11)),
            (PathBuf::from("pods/u1/volumes/kubernetes.io~csi/pvc-1"), key(10)),
        ];
        let e = entry(Content::Empty { dirs });
        let kdir = Path::new("/var/lib/kubelet");
        let j = |verdict| DirJudgement { verdict, reasons: vec!["why".into()], advice: None };
        let p = plan(&e, &j(DirVerdict::Removable), kdir);
        assert_eq!(p.refusal, None);
        let order: Vec<(String, u64)> =
            p.steps.iter().map(|s| (s.path.display().to_string(), s.key.ino)).collect();
        assert_eq!(
            order,
            [
                ("pods/u1/volumes/kubernetes.io~csi/pvc-1/mount".to_owned(), 11),
                ("pods/u1/volumes/kubernetes.io~csi/pvc-1".to_owned(), 10)
            ]
        );
        assert!(p.steps[0].describe().starts_with("remove the empty directory /var/lib/kubelet/pods/u1/"));
        for v in [DirVerdict::Pending, DirVerdict::Mounted, DirVerdict::Unknown, DirVerdict::InUse] {
            let p = plan(&e, &j(v), kdir);
            assert!(
                p.steps.is_empty() && p.refusal.as_deref().is_some_and(|r| r.contains(v.as_str())),
                "{v:?}"
            );
        }
        let full = entry(Content::NotEmpty { entries: 1, first: vec!["data (file)".into()] });
        assert!(plan(&full, &j(DirVerdict::Removable), kdir).steps.is_empty(), "never a non-empty one");
        assert_eq!(p.argument, "pod-volume:u1/volumes/kubernetes.io~csi/pvc-1");
    }

    #[test]
    fn arguments_name_a_place_below_pods() {
        let kdir = Path::new("/var/lib/kubelet");
        let want = Some(PathBuf::from("pods/u1/volumes/kubernetes.io~csi/pvc-1"));
        assert_eq!(parse_argument("pod-volume:u1/volumes/kubernetes.io~csi/pvc-1", kdir), want);
        assert_eq!(parse_argument("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pvc-1", kdir), want);
        assert_eq!(parse_argument("pod-volume:u1/../../etc", kdir), None, "no way out");
        assert_eq!(parse_argument("pod-volume:u1", kdir), None, "a pod, not a volume");
        assert_eq!(parse_argument("/dev/loop3", kdir), None);
        assert_eq!(parse_argument("loop3", kdir), None);
    }
}
