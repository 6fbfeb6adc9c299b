//! Who writes the journal: a process named by its PID, start time and boot ([`Writer`]), and
//! the PID in a record ID ([`writer_pid`]), for records written before they named their writer.

use serde::{Deserialize, Serialize};

/// Who wrote a record: a process, by its PID, its start time (field 22 of `/proc/PID/stat`) and
/// the boot it ran in. A PID alone is reused; the three together name one process. Intents and
/// plans carry it (`writer`), so recovery can tell a writer still at work from a dead one whose
/// PID another process has now ([`crate::engine::world::World::writer_alive`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Writer {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<String>,
}

impl Writer {
    /// This process (read once).
    pub fn this() -> &'static Writer {
        static THIS: std::sync::OnceLock<Writer> = std::sync::OnceLock::new();
        THIS.get_or_init(|| {
            let host = crate::host::HostRoot::default();
            let stat = std::fs::read_to_string(host.proc().join("self/stat")).unwrap_or_default();
            Writer {
                pid: std::process::id(),
                start: crate::host::pidfd::start_time(&stat),
                boot: crate::host::clock::boot_id(&host),
            }
        })
    }

    /// The writer a record names (`writer`), or for a record written before records named
    /// one, the PID in its ID `id` (no start time, no boot).
    pub fn of(writer: Option<&Writer>, id: &str) -> Option<Writer> {
        writer.cloned().or_else(|| Some(Writer { pid: writer_pid(id)?, start: None, boot: None }))
    }
}

/// The writer's pid in a record ID (intents: `<ns>-<pid>-<n>`, plans: `plan-<ns>-<pid>-<n>`).
pub fn writer_pid(id: &str) -> Option<u32> {
    id.trim_start_matches("plan-").split('-').nth(1).and_then(|p| p.parse().ok())
}
