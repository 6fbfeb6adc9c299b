//! The one write of an orphaned pod volume directory's plan: `rmdir` of one empty directory, as
//! `unlinkat(parent, name, AT_REMOVEDIR)` on the parent opened beneath the kubelet directory
//! ([`crate::host::beneath`]: no symlink followed, no mount crossed below `pods/`), never a
//! recursive delete, never a path resolved twice. Right before it, through that same parent:
//! the name is still a directory, nothing is mounted on it in this namespace (`EXDEV`), and it
//! is still the planned directory (device and inode). After it: the name is gone.
//!
//! The kernel refuses `rmdir` of a directory that is not empty (`ENOTEMPTY`) and of one
//! something is mounted on in the caller's own namespace (`EBUSY`); from any other namespace it
//! removes the directory and detaches the mounts on it there. That is why the engine's re-check
//! ([`crate::judge::gates::dir_mounts`], every namespace's table read right then) comes first.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::unistd::{unlinkat, UnlinkatFlags};

use super::StepOutcome;
use crate::host::beneath::{self, Kind};
use crate::host::bounded::{self, CallError};
use crate::host::HostRoot;
use crate::plan::pod_volume::DirStep;

/// Why an `rmdir` step failed, naming the directory.
#[derive(Debug, thiserror::Error)]
pub enum DirActError {
    #[error("{}: precondition failed: {reason}", path.display())]
    Precondition { path: PathBuf, reason: String },
    /// The directory at the path is another one now (recreated since the plan).
    #[error("{}: precondition failed: {reason}", path.display())]
    IdentityChanged { path: PathBuf, reason: String },
    #[error("{}: rmdir failed: {source}", path.display())]
    Syscall { path: PathBuf, source: io::Error },
    #[error("{}: rmdir did not finish within {after:?}; it is left running on its own thread and reported as hung", path.display())]
    TimedOut { path: PathBuf, after: Duration },
    #[error("{}: rmdir reported success but {reason}", path.display())]
    NotVerified { path: PathBuf, reason: String },
    /// Not run: a step it depends on did not finish.
    #[error("{}: not run: {reason}", path.display())]
    Skipped { path: PathBuf, reason: String },
}

/// A step's result as the journal's word and its detail (as [`super::outcome_word`] for
/// device steps).
pub fn outcome_word(r: &Result<StepOutcome, DirActError>) -> (super::journal::StepResult, String) {
    use super::journal::StepResult;
    match r {
        Ok(StepOutcome::Done) => (StepResult::Done, String::new()),
        Ok(StepOutcome::DoneVia(how)) => (StepResult::Done, how.clone()),
        Ok(StepOutcome::AlreadyAbsent) => (StepResult::AlreadyAbsent, String::new()),
        Ok(StepOutcome::Deferred(why)) => (StepResult::Deferred, why.clone()),
        Err(e @ DirActError::Skipped { .. }) => (StepResult::Skipped, e.to_string()),
        Err(e) => (StepResult::Failed, e.to_string()),
    }
}

/// Removes the empty directory of `step` on the host `host`, within `timeout`.
pub fn remove(host: &HostRoot, step: &DirStep, timeout: Duration) -> Result<StepOutcome, DirActError> {
    let shown = step.host_path();
    let local_kubelet = host.host_path(&step.kubelet_dir);
    let (below_pods, name) = match (step.path.strip_prefix("pods"), step.path.file_name()) {
        (Ok(rel), Some(name)) if rel.components().count() >= 2 => {
            (rel.parent().unwrap_or(Path::new(".")).to_owned(), name.to_owned())
        }
        _ => {
            return Err(DirActError::Precondition {
                path: shown,
                reason: "not a directory below pods/<uid>/: never removed".into(),
            })
        }
    };
    let planned = step.key;
    let path = shown.clone();
    let device = crate::model::DeviceName::new("pod-volume").expect("a valid name");
    let run = move || -> io::Result<Result<StepOutcome, DirActError>> {
        let fail = |reason: String| Ok(Err(DirActError::Precondition { path: path.clone(), reason }));
        let root = beneath::open_root(&local_kubelet)?;
        let pods = beneath::open_dir(root.as_fd(), Path::new("pods"), true)?;
        let parent = match beneath::open_dir(pods.as_fd(), &below_pods, false) {
            Ok(fd) => fd,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(StepOutcome::AlreadyAbsent)),
            Err(e) if beneath::is_mount_crossing(&e) => {
                return fail("something is mounted on a directory above it, in this namespace".into())
            }
            Err(e) => return Err(e),
        };
        match beneath::kind_of(parent.as_fd(), &name) {
            Ok((Kind::Dir, _)) => {}
            Ok((kind, _)) => return fail(format!("it is a {} now, not a directory", kind.as_str())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Ok(StepOutcome::AlreadyAbsent)),
            Err(e) if beneath::is_mount_crossing(&e) => {
                return fail(
                    "something is mounted on it in this namespace (the host's, seen with HostToContainer)"
                        .into(),
                )
            }
            Err(e) => return Err(e),
        }
        let now =
            match beneath::open_keyed(parent.as_fd(), Path::new(&name)) {
                Ok((_, key)) => key,
                Err(e) if beneath::is_mount_crossing(&e) => return fail(
                    "something is mounted on it in this namespace (the host's, seen with HostToContainer)"
                        .into(),
                ),
                Err(e) => return Err(e),
            };
        if now != planned {
            return Ok(Err(DirActError::IdentityChanged {
                path: path.clone(),
                reason: format!("it is another directory now (device/inode {now}, planned for {planned})"),
            }));
        }
        unlinkat(parent.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir).map_err(io::Error::from)?;
        match beneath::kind_of(parent.as_fd(), &name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ok(StepOutcome::Done)),
            Ok((_, key)) => Ok(Err(DirActError::NotVerified {
                path: path.clone(),
                reason: format!("{} is there again (device/inode {key})", path.display()),
            })),
            Err(e) => {
                Ok(Err(DirActError::NotVerified { path: path.clone(), reason: format!("cannot look: {e}") }))
            }
        }
    };
    match bounded::call(&device, "rmdir", timeout, run) {
        Ok(result) => result,
        Err(CallError::Failed(source)) => Err(DirActError::Syscall { path: shown, source }),
        Err(CallError::TimedOut) => Err(DirActError::TimedOut { path: shown, after: timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::beneath::FileKey;

    fn step(kdir: &Path, rel: &str, key: FileKey) -> DirStep {
        DirStep {
            pod_uid: "u1".into(),
            volume: PathBuf::from("pods/u1/volumes/kubernetes.io~rbd/v"),
            path: PathBuf::from(rel),
            key,
            kubelet_dir: kdir.to_owned(),
        }
    }

    fn key_of(p: &Path) -> FileKey {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(p).expect("stat");
        FileKey { dev: crate::model::DevNum::from_dev_t(m.dev()), ino: m.ino() }
    }

    /// On a real directory tree: only the planned, empty directory goes; a recreated one, a
    /// non-empty one, a symlink and a path out of `pods/` are refused.
    #[test]
    fn removes_exactly_the_planned_empty_directory() {
        let kdir = tempfile::tempdir().expect("tempdir");
        let host = HostRoot::default();
        let t = Duration::from_secs(5);
        let vol = kdir.path().join("pods/u1/volumes/kubernetes.io~rbd/v");
        std::fs::create_dir_all(&vol).expect("mkdir");
        let planned = key_of(&vol);
        let rel = "pods/u1/volumes/kubernetes.io~rbd/v";
        // Recreated: same path, another inode.
        std::fs::remove_dir(&vol).expect("rmdir");
        std::fs::create_dir(kdir.path().join("pods/u1/volumes/kubernetes.io~rbd/other"))
            .expect("hold the inode");
        std::fs::create_dir(&vol).expect("mkdir again");
        let err = remove(&host, &step(kdir.path(), rel, planned), t).expect_err("another directory");
        assert!(matches!(err, DirActError::IdentityChanged { .. }), "{err}");
        assert!(vol.exists());
        // Not empty: the kernel says so, nothing is removed.
        std::fs::write(vol.join("data"), b"x").expect("file");
        let err = remove(&host, &step(kdir.path(), rel, key_of(&vol)), t).expect_err("not empty");
        assert!(err.to_string().contains("rmdir failed"), "{err}");
        assert!(vol.join("data").exists());
        std::fs::remove_file(vol.join("data")).expect("rm");
        // A symlink in the way is never followed.
        let link = kdir.path().join("pods/u2");
        std::os::unix::fs::symlink(kdir.path().join("pods/u1"), &link).expect("symlink");
        let err = remove(&host, &step(kdir.path(), "pods/u2/volumes/kubernetes.io~rbd/v", key_of(&vol)), t);
        assert!(err.is_err(), "through a symlink: {err:?}");
        assert!(remove(&host, &step(kdir.path(), "etc", key_of(&vol)), t).is_err(), "not below pods/<uid>");
        // The planned directory, empty: removed; again: already absent.
        assert_eq!(remove(&host, &step(kdir.path(), rel, key_of(&vol)), t).expect("done"), StepOutcome::Done);
        assert!(!vol.exists());
        let again = remove(&host, &step(kdir.path(), rel, planned), t).expect("absent");
        assert_eq!(again, StepOutcome::AlreadyAbsent);
    }
}
