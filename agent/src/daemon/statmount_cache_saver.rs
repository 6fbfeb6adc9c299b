//! The daemon keeps the one-shot commands' `statmount` memo file
//! ([`crate::engine::statmount_cache_file`]) up to date: after each full scan that learned or
//! dropped a mount, it writes what its own memo holds, so that `holders` or `scan` run on this
//! node (in the agent's container, or on the host: `/run/blockjanitor` is the host's) asks the
//! kernel only about the mounts made since, even the first time it runs.
//!
//! The daemon only writes the file; it never reads it (its memory is its own, and its scans
//! drive actions). The write (a few MiB at 400 namespaces) runs on a thread of its own at the
//! lowest priority, one at a time, off the scanner's path: a mount event meanwhile is read at
//! once. A save still running when the next full scan ends is not waited for; that scan's
//! changes are written by the save after it.

use std::sync::{Arc, Mutex};

use super::state::AgentState;
use crate::engine::statmount_cache_file::Kept;

impl AgentState {
    /// Writes the memo file at `kept` after each full scan from now on.
    pub fn keep_statmount_cache_file(&self, kept: Kept) {
        let _ = self.statmount_cache_file.set(Arc::new(Mutex::new(kept)));
    }

    /// Starts a save of the memo file when one is kept and none is running.
    pub(super) fn save_statmount_cache_file(&self) {
        let Some(kept) = self.statmount_cache_file.get() else { return };
        // A steady node: nothing to write, no thread.
        if kept.try_lock().map_or(true, |k| !k.unsaved()) {
            return;
        }
        let kept = Arc::clone(kept);
        let spawned = std::thread::Builder::new().name("bj-statmount-memo".into()).spawn(move || {
            crate::host::sys::run_at_idle_priority();
            // A save that is running already writes what the memo holds by its end, or the
            // next full scan's does.
            if let Ok(mut k) = kept.try_lock() {
                k.save();
            }
        });
        if let Err(e) = spawned {
            tracing::debug!("cannot start the statmount memo's save: {e}");
        }
    }
}
