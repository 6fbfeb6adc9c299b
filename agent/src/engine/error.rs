//! Why the engine could not do what it was asked.

/// Why the engine could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The host could not be read at all (sysfs or procfs missing, a malformed kernel file).
    #[error(transparent)]
    Discover(#[from] crate::discover::DiscoverError),
    /// No such device now.
    #[error("{0}")]
    NotFound(String),
    /// The device's identity is not the one the caller expected (Apply bound to a Plan).
    #[error(
        "{device}: the device changed since it was planned: planned for [{planned}], now [{now}]; plan again"
    )]
    IdentityChanged { device: String, planned: String, now: String },
    /// This agent may not act on the host (not in its PID namespace, not its procfs).
    #[error("{0}")]
    CannotAct(String),
    /// The journal could not be opened: nothing acts without it.
    #[error("cannot open the journal {}: {source}", path.display())]
    Journal { path: std::path::PathBuf, source: std::io::Error },
}
