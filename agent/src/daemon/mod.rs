//! The long-running agent: keeps the latest scan in memory, rescans when something changes
//! (block uevents, host mount-table changes, a slow timer), coalescing triggers so scans never
//! stack, and publishes what changed as events. A mount change in a namespace re-reads that
//! namespace alone (`mount_watch`); the full scan stays the safety net.

pub mod metrics;

pub mod budget;
pub mod events;
pub mod mount_watch;
pub mod new_namespaces;
pub mod peer_limit;
pub mod state;
pub mod triggers;
