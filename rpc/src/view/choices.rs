//! The values `--kind` and `--verdict` take: one table each of the name (as the agent names its
//! kinds and verdicts: `loop`, `nvme_namespace`, `in_use`), the help `--help` shows (the agent's
//! own words), another name also accepted (`in-use`) and the wire value it stands for. Names,
//! order and help are the agent's (checked against its enums in tests/tests/agentctl_choices.rs).
//! Both CLIs take them (`blockjanitor-agent scan --kind loop --stale`, `agentctl scan ...`,
//! `agentctl fleet devices ...`), so a filter means the same everywhere.

use blockjanitor_proto::v1 as pb;
use clap::builder::PossibleValue;
use clap::ValueEnum;

/// One value of a flag: what it is called, what `--help` says of it, and the wire value it stands
/// for. The parsed flag is the value itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice<W: 'static> {
    pub name: &'static str,
    /// None: the value has no help line.
    pub help: Option<&'static str>,
    /// Another name the value is also accepted by.
    pub alias: Option<&'static str>,
    /// The value as the wire carries it.
    pub wire: W,
}

/// A wire enum with the flag values that stand for it.
pub trait Choices: Sized + 'static {
    /// The values, in the order `--help` lists them.
    const ALL: &'static [Choice<Self>];
}

/// A device kind `--kind` filters on.
pub type KindChoice = Choice<pb::DeviceKind>;
/// A verdict `--verdict` filters on.
pub type VerdictChoice = Choice<pb::Verdict>;

/// A value with no other name.
const fn row<W>(name: &'static str, help: Option<&'static str>, wire: W) -> Choice<W> {
    Choice { name, help, alias: None, wire }
}

/// `--kind`'s values, in the order `--help` lists them.
const KINDS: [KindChoice; 10] = [
    row("disk", None, pb::DeviceKind::Disk),
    row("partition", None, pb::DeviceKind::Partition),
    row("loop", None, pb::DeviceKind::Loop),
    row("dm", None, pb::DeviceKind::Dm),
    row("md", None, pb::DeviceKind::Md),
    row("rbd", None, pb::DeviceKind::Rbd),
    row("nbd", None, pb::DeviceKind::Nbd),
    row("zram", None, pb::DeviceKind::Zram),
    row("other", None, pb::DeviceKind::Other),
    row(
        "nvme_namespace",
        Some(
            "An NVMe namespace: a native-multipath head (`nvme<S>n<N>`), one of its hidden per-path devices \
             (`nvme<S>c<C>n<N>`), or a namespace without multipath (`nvme<C>n<N>`)",
        ),
        pb::DeviceKind::NvmeNamespace,
    ),
];

/// `--verdict`'s values, in the order `--help` lists them.
const VERDICTS: [VerdictChoice; 7] = [
    Choice { alias: Some("in-use"), ..row("in_use", Some("Something holds it"), pb::Verdict::InUse) },
    row(
        "unused",
        Some("Nothing holds it, and there is nothing of it for the agent to clean (a disk, an unbound loop device, a stack layer whose map or disk is not being cleaned)"),
        pb::Verdict::Unused,
    ),
    row("suspect", Some("A candidate nothing holds, not yet for the whole grace period"), pb::Verdict::Suspect),
    row(
        "stale",
        Some("A candidate nothing has held for at least the grace period, observed by complete scans"),
        pb::Verdict::Stale,
    ),
    row(
        "protected",
        Some("Backs the host root, the kubelet or the runtime, or is listed in the config"),
        pb::Verdict::Protected,
    ),
    row(
        "unknown",
        Some(
            "A candidate the agent cannot vouch for: a blind spot of the scan could hide a holder of it, or the \
             Kubernetes API should vouch for it but cannot",
        ),
        pb::Verdict::Unknown,
    ),
    row(
        "outage",
        Some(
            "Behind a transport outage: every iSCSI session (NVMe-oF controller) to its target or portal is down \
             at once. An array or network outage, not staleness: never cleaned",
        ),
        pb::Verdict::Outage,
    ),
];

impl Choices for pb::DeviceKind {
    const ALL: &'static [Choice<Self>] = &KINDS;
}

impl Choices for pb::Verdict {
    const ALL: &'static [Choice<Self>] = &VERDICTS;
}

impl<W: Choices + Copy + Send + Sync> ValueEnum for Choice<W> {
    fn value_variants<'a>() -> &'a [Self] {
        W::ALL
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let p = PossibleValue::new(self.name);
        let p = match self.help {
            Some(h) => p.help(h),
            None => p,
        };
        Some(match self.alias {
            Some(a) => p.alias(a),
            None => p,
        })
    }
}

/// Which devices to list (`scan` in both CLIs, `devices`, `fleet devices`): filters combine.
#[derive(Debug, Clone, clap::Args)]
pub struct DeviceFilter {
    /// Only devices of this kind.
    #[arg(long, value_enum)]
    pub kind: Option<KindChoice>,
    /// Only devices with this verdict.
    #[arg(long, value_enum, conflicts_with = "stale")]
    pub verdict: Option<VerdictChoice>,
    /// Only stale devices (same as --verdict stale).
    #[arg(long)]
    pub stale: bool,
}

impl DeviceFilter {
    /// The kind and verdict as the wire carries them (unspecified: any).
    pub fn wire(&self) -> (i32, i32) {
        let verdict = if self.stale { Some(pb::Verdict::Stale) } else { self.verdict.map(|v| v.wire) };
        (
            self.kind.map_or(pb::DeviceKind::Unspecified, |k| k.wire) as i32,
            verdict.unwrap_or(pb::Verdict::Unspecified) as i32,
        )
    }

    /// Whether device `d` passes the filter (both CLIs and the daemon's ListDevices filter alike).
    pub fn matches(&self, d: &pb::Device) -> bool {
        let (kind, verdict) = self.wire();
        (kind == pb::DeviceKind::Unspecified as i32 || d.kind == kind)
            && (verdict == pb::Verdict::Unspecified as i32 || d.verdict == verdict)
    }

    /// Whether any filter is set.
    pub fn is_set(&self) -> bool {
        self.kind.is_some() || self.verdict.is_some() || self.stale
    }
}
