//! The long-running agent: keeps the latest scan in memory, rescans when something changes
//! (block uevents, host mount-table changes, a slow timer), coalescing triggers so scans never
//! stack, and publishes what changed as events. A mount change in a namespace re-reads that
//! namespace alone (`mount_watch`), a device held by live filesystems alone is read again until
//! they end (`fs_end`); the full scan stays the safety net. [`start`] builds and starts it.

pub mod budget;
pub mod event_rate;
pub mod events;
pub mod fs_end;
pub mod health;
pub mod metrics;
pub mod mount_watch;
pub mod new_namespace_watch;
mod pod_volumes;
mod recovery;
pub mod report;
mod requests;
mod scanner;
pub mod start;
pub mod state;
mod statmount_cache_saver;
pub mod triggers;
pub mod world;

use std::sync::Arc;

use tokio::sync::watch;

use mount_watch::MountWatch;
use state::AgentState;

/// Follows the kernel's mount events with `watch` ([`mount_watch::run`]) and, once they are
/// polled, the new mount namespaces too ([`new_namespace_watch::run`]), until `shutdown`.
pub async fn watch_mounts(state: Arc<AgentState>, watch: Arc<MountWatch>, shutdown: watch::Receiver<bool>) {
    let (s, w, stop) = (Arc::clone(&state), Arc::clone(&watch), shutdown.clone());
    mount_watch::run(state, watch, shutdown, move || {
        tokio::spawn(new_namespace_watch::run(s, w, stop));
    })
    .await
}
