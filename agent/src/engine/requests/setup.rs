//! What a front says to build the engine: where the host is and how to read it ([`HostSpec`],
//! from its flags), the engine's settings in a front's words ([`Settings::with_grace`]), and the
//! default places of what a run keeps on disk.

use std::path::PathBuf;
use std::time::Duration;

use crate::discover::namespaces::MountReader;
use crate::engine::world::LinuxWorld;
use crate::engine::Settings;
use crate::host::HostRoot;
use crate::snapshot::ScanOptions;

/// Where the journal of destructive steps is unless a front names another.
pub const JOURNAL: &str = crate::act::journal::DEFAULT_PATH;
/// Where the one-shot commands that only show keep what `statmount` said of each mount, unless
/// a front names another place.
pub const STATMOUNT_MEMO: &str = crate::engine::statmount_cache_file::DEFAULT_PATH;

/// Where the host is and how to read it, as a front's flags say.
#[derive(Debug, Clone)]
pub struct HostSpec {
    /// The host's root; /proc, /sys and /dev are looked for under it unless named.
    pub root: PathBuf,
    pub proc: Option<PathBuf>,
    pub sys: Option<PathBuf>,
    pub dev: Option<PathBuf>,
    /// Read the mountinfo text of every namespace, never asking `statmount` which to read.
    pub mountinfo_only: bool,
    /// The kubelet directory as the host sees it (unset: `/var/lib/kubelet`).
    pub kubelet_dir: Option<PathBuf>,
    /// PID 1 cannot be inspected here and the operator vouches that it holds no device.
    pub trust_unreadable_init: bool,
    /// Deadline of each kernel call that may block on a device.
    pub timeout: Duration,
}

impl HostSpec {
    /// The host's paths.
    pub(crate) fn host(&self) -> HostRoot {
        let mut h = HostRoot::new(&self.root);
        if let Some(p) = &self.proc {
            h = h.with_proc(p);
        }
        if let Some(s) = &self.sys {
            h = h.with_sys(s);
        }
        if let Some(d) = &self.dev {
            h = h.with_dev(d);
        }
        h
    }

    /// How scans read the host (the daemon adds its config's protected paths and devices).
    pub(crate) fn scan_options(&self) -> ScanOptions {
        let defaults = ScanOptions::default();
        ScanOptions {
            reader: if self.mountinfo_only { MountReader::MountInfo } else { MountReader::Auto },
            kubelet_dir: self.kubelet_dir.clone().unwrap_or_else(|| defaults.kubelet_dir.clone()),
            trust_unreadable_init: self.trust_unreadable_init,
            ..defaults
        }
    }

    /// The machine this names, with no Kubernetes API yet.
    pub(crate) fn world(&self) -> LinuxWorld {
        LinuxWorld::new(self.host(), self.scan_options(), self.timeout)
    }
}

impl Settings {
    /// The settings a front names: the grace period, and the rescan interval (twice it is the
    /// longest gap between two observations that keeps a grace clock running); nothing opted
    /// into, and a device hung after [`crate::judge::stall::DEFAULT_THRESHOLD`] without I/O
    /// completing, as by default.
    pub fn with_grace(grace: Duration, rescan_interval: Duration) -> Self {
        Self { grace, max_gap: rescan_interval * 2, ..Self::default() }
    }
}
