//! Crash recovery of an interrupted `rmdir` of a pod volume directory ([`super::recover`] hands
//! such intents here): the directory is looked at again, below the kubelet directory, without
//! following or crossing anything ([`World::dir_key`]):
//! - gone: `in_place`, the `rmdir` (or a later one, or kubelet) took effect;
//! - there, the same device and inode: `replan`, the step did not happen; the directory is
//!   judged afresh by the next scan or request, through every gate, never repeated blindly;
//! - there, another device and inode: `identity_changed`, a new directory at that place
//!   (kubelet made it again): never removed for this step.

use std::path::PathBuf;

use super::{Engine, World};
use crate::act::journal::{self, Intent, JournaledStep, Resolution};
use crate::host::beneath::FileKey;
use crate::plan::pod_volume::DirStep;

/// An interrupted `rmdir`, closed: what [`super::recover`] reports it as.
#[derive(Debug, Clone)]
pub struct DirRecovered {
    /// The intent's record ID.
    pub id: String,
    pub writer: Option<journal::Writer>,
    pub step: DirStep,
    /// `in_place`, `replan` or `identity_changed`, and what was found.
    pub word: Resolution,
    pub detail: String,
}

/// An `rmdir` intent's writer and step.
pub fn intent(record: &Intent) -> Result<(Option<journal::Writer>, DirStep), String> {
    match record.step()? {
        JournaledStep::Dir(step) => Ok((record.writer(), step)),
        JournaledStep::Device { action, .. } => {
            Err(format!("intent {}: a {} step, not an rmdir", record.id, action.name()))
        }
    }
}

/// Resolves an interrupted `rmdir` of `step` against the directory now (`None`: not there): the
/// word and what was found. Pure.
pub fn resolve(step: &DirStep, now: Option<FileKey>) -> (Resolution, String) {
    let what = format!(
        "the rmdir of {} was interrupted (the agent stopped after writing its intent, before its result)",
        step.host_path().display()
    );
    match now {
        None => (Resolution::InPlace, format!("{what}; the directory is gone: removed, nothing to repeat")),
        Some(k) if k == step.key => (
            Resolution::Replan,
            format!(
                "{what}; the directory is still there (device/inode {k}): it is judged afresh, through every gate, before anything removes it"
            ),
        ),
        Some(k) => (
            Resolution::IdentityChanged,
            format!(
                "{what}; another directory is at that place now (device/inode {k}, planned for {}): never removed for this step",
                step.key
            ),
        ),
    }
}

impl<W: World> Engine<W> {
    /// Closes an interrupted `rmdir` intent (`record`), unless its writer is still at work or
    /// the directory cannot be looked at: then its ID and why it stays open.
    pub(super) fn recover_dir(
        &self,
        record: &Intent,
        journal: &mut journal::Journal,
    ) -> std::io::Result<Result<DirRecovered, (String, String)>> {
        let id = record.id.clone();
        let (writer, step) = match intent(record) {
            Ok(x) => x,
            Err(why) => return Ok(Err((id, format!("malformed intent: {why}")))),
        };
        if let Some(w) = writer.as_ref().filter(|w| w.pid != std::process::id() && self.world.writer_alive(w))
        {
            let why =
                format!("its writer, agent process {}, is still running: in flight, not interrupted", w.pid);
            return Ok(Err((id, why)));
        }
        let now = match self.world.dir_key(&step.kubelet_dir, &step.path) {
            Ok(k) => k,
            Err(why) => return Ok(Err((id, format!("cannot look at the directory: {why}")))),
        };
        let (word, detail) = resolve(&step, now);
        journal.recovered(&id, word, &detail)?;
        let path: PathBuf = step.host_path();
        tracing::warn!(target: "audit", phase = "recovered", action = DirStep::ACTION, path = %path.display(), identity = %step.key, result = word.as_str(), detail = %detail, journal_id = %id);
        Ok(Ok(DirRecovered { id, writer, step, word, detail }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DevNum;

    #[test]
    fn gone_is_in_place_the_same_is_replan_another_is_identity_changed() {
        let key = FileKey { dev: DevNum::new(254, 1), ino: 10 };
        let step = DirStep {
            pod_uid: "u1".into(),
            volume: "pods/u1/volumes/kubernetes.io~rbd/v".into(),
            path: "pods/u1/volumes/kubernetes.io~rbd/v".into(),
            key,
            kubelet_dir: "/var/lib/kubelet".into(),
        };
        assert_eq!(resolve(&step, None).0, Resolution::InPlace);
        assert_eq!(resolve(&step, Some(key)).0, Resolution::Replan);
        let (word, detail) = resolve(&step, Some(FileKey { ino: 11, ..key }));
        assert_eq!(word, Resolution::IdentityChanged);
        assert!(detail.contains("254:1/11"), "{detail}");
        let line = serde_json::json!({"id": "1-42-0", "phase": "intent", "step": step}).to_string();
        let Some(journal::Record::Intent(record)) = journal::Record::parse(line.as_bytes()) else {
            panic!("an intent: {line}")
        };
        assert!(record.is_dir_step());
        let (writer, back) = intent(&record).expect("read back");
        assert_eq!((record.id.as_str(), writer.map(|w| w.pid), back), ("1-42-0", Some(42), step));
    }
}
