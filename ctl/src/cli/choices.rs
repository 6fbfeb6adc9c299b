//! The values `--kind` and `--verdict` take, named as the agent names its kinds and verdicts
//! (`loop`, `nvme_namespace`, `in_use`; `in-use` also accepted), each with the wire enum it
//! stands for. The same names, order and help as the agent's own enums (checked against them in
//! tests/tests/agentctl_choices.rs).

use blockjanitor_proto::v1 as pb;

/// A device kind `--kind` filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum KindChoice {
    Disk,
    Partition,
    Loop,
    Dm,
    Md,
    Rbd,
    Nbd,
    Zram,
    Other,
    /// An NVMe namespace: a native-multipath head (`nvme<S>n<N>`), one of its hidden per-path
    /// devices (`nvme<S>c<C>n<N>`), or a namespace without multipath (`nvme<C>n<N>`).
    NvmeNamespace,
}

impl KindChoice {
    /// The kind as the wire carries it.
    pub fn wire(self) -> pb::DeviceKind {
        match self {
            Self::Disk => pb::DeviceKind::Disk,
            Self::Partition => pb::DeviceKind::Partition,
            Self::Loop => pb::DeviceKind::Loop,
            Self::Dm => pb::DeviceKind::Dm,
            Self::Md => pb::DeviceKind::Md,
            Self::Rbd => pb::DeviceKind::Rbd,
            Self::Nbd => pb::DeviceKind::Nbd,
            Self::Zram => pb::DeviceKind::Zram,
            Self::Other => pb::DeviceKind::Other,
            Self::NvmeNamespace => pb::DeviceKind::NvmeNamespace,
        }
    }
}

/// A verdict `--verdict` filters on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum VerdictChoice {
    /// Something holds it.
    #[value(alias = "in-use")]
    InUse,
    /// Nothing holds it, and it is not a kind the agent cleans.
    Unused,
    /// A candidate nothing holds, not yet for the whole grace period.
    Suspect,
    /// A candidate nothing has held for at least the grace period, observed by complete scans.
    Stale,
    /// Backs the host root, the kubelet or the runtime, or is listed in the config.
    Protected,
    /// A candidate the agent cannot vouch for: a blind spot of the scan could hide a holder of
    /// it, or the Kubernetes API should vouch for it but cannot.
    Unknown,
    /// Behind a transport outage: every iSCSI session (NVMe-oF controller) to its target or
    /// portal is down at once. An array or network outage, not staleness: never cleaned.
    Outage,
}

impl VerdictChoice {
    /// The verdict as the wire carries it.
    pub fn wire(self) -> pb::Verdict {
        match self {
            Self::InUse => pb::Verdict::InUse,
            Self::Unused => pb::Verdict::Unused,
            Self::Suspect => pb::Verdict::Suspect,
            Self::Stale => pb::Verdict::Stale,
            Self::Protected => pb::Verdict::Protected,
            Self::Unknown => pb::Verdict::Unknown,
            Self::Outage => pb::Verdict::Outage,
        }
    }
}
