//! What an operator opts into for one request, off by default: plain data a front fills from its
//! flags and the planners read (`plan/clean.rs`, `plan/release.rs`).

/// Opt-ins for `clean`, off by default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanOptions {
    /// Remove a multipath map on its last close if it is still open (`DM_DEFERRED_REMOVE`).
    pub deferred_remove: bool,
    /// Unmap rbd with `force`: in-flight I/O fails, and a mount left behind cannot be unmounted.
    pub force_unmap: bool,
}

/// Opt-ins for `release`, off by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReleaseOptions {
    /// Detach mounts although processes in their namespaces use the filesystem (`--force-busy
    /// REASON`): the operator's reason, which goes into the plan, the journal and the audit log.
    /// Covers process users only: never swap, a loop device's backing file, a stacked device, a
    /// filesystem with no mount, a blind spot or a copy of a host mount.
    pub force_busy: Option<String>,
}
