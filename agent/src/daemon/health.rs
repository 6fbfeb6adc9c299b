//! Whether the agent can do its job now, and if not why: what the health service answers for
//! `blockjanitor.v1.Agent` (the DaemonSet's readiness probe), what `GetNode` shows, and the
//! `blockjanitor_not_ready` gauge. Three checks, each re-evaluated after every scan:
//!
//! - **scan**: the latest scan failed or overran (every answer would rest on an older view);
//! - **journal**: the journal cannot be appended to (read-only filesystem, no space, no
//!   permission). Every destructive step is written ahead to it, so nothing may be changed,
//!   neither by an operator's Apply nor by the mode, while it cannot be written;
//! - **kubernetes**: in release and clean modes (which act by themselves on the API's word that
//!   kubelet let a volume go), the API is in use and its view does not vouch (a broken or silent
//!   watch, no Node of this name). In report mode the agent answers without it (devices it
//!   cannot judge without the API are `unknown`), so it stays ready.
//!
//! The server's own health (`""`, the liveness probe's) is not touched: restarting the agent
//! mends none of these.

use std::path::Path;
use std::time::Duration;

use crate::config::Mode;
use crate::kube::ApiState;

/// The failing checks (`None`: passing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Health {
    pub scan: Option<String>,
    pub journal: Option<String>,
    pub kubernetes: Option<String>,
}

impl Health {
    /// Whether every check passes.
    pub fn ready(&self) -> bool {
        self.failing().next().is_none()
    }

    /// Each failing check, by name, with its reason.
    pub fn failing(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [("scan", &self.scan), ("journal", &self.journal), ("kubernetes", &self.kubernetes)]
            .into_iter()
            .filter_map(|(check, why)| why.as_deref().map(|w| (check, w)))
    }

    /// The failing checks as sentences (`GetNode`'s `not_ready_because`, the log).
    pub fn reasons(&self) -> Vec<String> {
        self.failing().map(|(check, why)| format!("{}: {why}", describe(check))).collect()
    }
}

/// The check's name as a reader meets it.
fn describe(check: &str) -> &'static str {
    match check {
        "scan" => "the latest scan failed",
        "journal" => "the journal cannot be written",
        _ => "the Kubernetes API cannot vouch",
    }
}

/// How long the journal check may take (a hung disk must not hold the scanner).
const JOURNAL_CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// Below this many free bytes the journal is taken as unwritable: a plan's records would not fit.
const JOURNAL_MIN_FREE: u64 = 1 << 20;

/// Why the journal at `path` cannot be appended to, if it cannot: it is opened for appending as
/// the journal itself opens it (it and its directory created if absent, as the first step would)
/// and its filesystem's free space is asked; nothing is written. On a bounded thread.
pub fn journal_problem(path: &Path) -> Option<String> {
    let p = path.to_owned();
    let key = format!("journal-check:{}", path.display());
    match crate::host::bounded::read(key, JOURNAL_CHECK_DEADLINE, move || check_journal(&p)) {
        Ok(r) => r.err(),
        Err(blocked) => Some(format!("{}: {blocked}", path.display())),
    }
}

fn check_journal(path: &Path) -> Result<(), String> {
    let shown = path.display();
    // As the journal opens it: its directory made if missing, a symlink refused.
    crate::host::durable::open_append(path).map_err(|e| format!("{shown}: {e}"))?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let fs = nix::sys::statvfs::statvfs(dir).map_err(|e| format!("{}: statvfs: {e}", dir.display()))?;
    if fs.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
        return Err(format!("{shown}: its filesystem is mounted read-only"));
    }
    let free = fs.blocks_available() as u64 * fs.fragment_size() as u64;
    if free < JOURNAL_MIN_FREE {
        return Err(format!("{shown}: {free} bytes left on its filesystem"));
    }
    Ok(())
}

/// Why the Kubernetes API's word is missing where the mode needs it: `api_state` is the latest
/// judgement's. Off by the operator's word is no problem; an API that cannot vouch is, in the
/// modes that act by themselves.
pub fn kubernetes_problem(mode: Mode, api_state: &ApiState) -> Option<String> {
    match api_state {
        ApiState::CannotVouch(why) if mode != Mode::Report => {
            Some(format!("{why} ({} mode acts on its word)", mode.as_str()))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_check_passes() {
        let mut h = Health::default();
        assert!(h.ready());
        assert!(h.reasons().is_empty());
        h.journal = Some("/j: Read-only file system (os error 30)".into());
        h.kubernetes = Some("the pods watch is silent".into());
        assert!(!h.ready());
        assert_eq!(
            h.reasons(),
            [
                "the journal cannot be written: /j: Read-only file system (os error 30)",
                "the Kubernetes API cannot vouch: the pods watch is silent"
            ]
        );
    }

    #[test]
    fn the_api_is_required_only_by_modes_that_act_on_it() {
        let silent = ApiState::CannotVouch("silent".into());
        assert_eq!(kubernetes_problem(Mode::Report, &silent), None);
        assert_eq!(kubernetes_problem(Mode::Clean, &ApiState::Vouching), None);
        assert_eq!(kubernetes_problem(Mode::Clean, &ApiState::Off("--no-kubernetes".into())), None);
        assert_eq!(
            kubernetes_problem(Mode::Release, &silent).as_deref(),
            Some("silent (release mode acts on its word)")
        );
        let nowhere =
            ApiState::CannotVouch("no connection to the Kubernetes API: kubeconfig /k: refused".into());
        assert!(kubernetes_problem(Mode::Clean, &nowhere).is_some_and(|w| w.contains("kubeconfig /k")));
    }

    #[test]
    fn a_journal_that_cannot_be_opened_is_a_problem_and_a_new_one_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(journal_problem(&dir.path().join("journal.jsonl")), None);
        // A directory not there yet is made, as the journal's first step would.
        assert_eq!(journal_problem(&dir.path().join("state/journal.jsonl")), None);
        std::fs::write(dir.path().join("file"), b"").expect("write");
        let under_a_file = dir.path().join("file/journal.jsonl");
        let why = journal_problem(&under_a_file).expect("a problem");
        assert!(why.contains("file/journal.jsonl"), "{why}");
        std::os::unix::fs::symlink("/dev/null", dir.path().join("link")).expect("symlink");
        assert!(
            journal_problem(&dir.path().join("link")).is_some(),
            "a symlink is refused, as the journal refuses it"
        );
    }
}
