//! The columns of the `scan` table both CLIs print (`--columns NAME,SIZE,...`, `--tree`): what
//! each is called, and its cell for one device, from the `pb::Device` message both CLIs have.

use blockjanitor_proto::v1 as pb;
use clap::builder::PossibleValue;
use clap::ValueEnum;

use crate::units::size;
use crate::view::names::{holder_kind_name, kind_name, verdict_name};
use crate::view::table::clean;

/// One column of the `scan` table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    Name,
    MajMin,
    Size,
    Type,
    Verdict,
    HeldBy,
    Pv,
    Why,
}

/// Every column, in the order `--help` lists them, with its heading and what it shows.
const ALL: [(Column, &str, &str); 8] = [
    (Column::Name, "NAME", "The kernel name (with --tree: drawn under what it is stacked on)"),
    (Column::MajMin, "MAJ:MIN", "The device number"),
    (Column::Size, "SIZE", "The size, as lsblk prints it (powers of 1024: 512M, 97.7G)"),
    (Column::Type, "TYPE", "What it is: loop, dm, rbd, nbd, disk, partition..."),
    (Column::Verdict, "VERDICT", "stale, suspect, in_use, unused, protected, unknown or outage"),
    (Column::HeldBy, "HELD-BY", "Who holds it, counted by kind (mount×3, open_device)"),
    (Column::Pv, "PV", "The Kubernetes PV and pods the kubelet directory ties it to"),
    (Column::Why, "WHY", "The first reason for the verdict (-o wide: every reason)"),
];

/// The columns `scan` shows without `--columns`; `-o wide` adds PV.
pub const DEFAULT: [Column; 7] =
    [Column::Name, Column::MajMin, Column::Size, Column::Type, Column::Verdict, Column::HeldBy, Column::Why];

impl Column {
    /// The heading (`MAJ:MIN`), which `--columns` takes too (in any case).
    pub fn heading(self) -> &'static str {
        ALL.iter().find(|(c, _, _)| *c == self).map_or("?", |(_, h, _)| h)
    }

    /// The cell of device `d` (`wide`: every reason in WHY), escaped for a terminal.
    pub fn cell(self, d: &pb::Device, wide: bool) -> String {
        match self {
            Self::Name => clean(&d.name),
            Self::MajMin => format!("{}:{}", d.major, d.minor),
            Self::Size => size(d.size_bytes),
            Self::Type => kind_name(d.kind),
            Self::Verdict => verdict_name(d.verdict),
            Self::HeldBy => held_by(d),
            Self::Pv => clean(&kube_cell(d)),
            Self::Why => clean(&why(d, wide)),
        }
    }
}

impl ValueEnum for Column {
    fn value_variants<'a>() -> &'a [Self] {
        &[Self::Name, Self::MajMin, Self::Size, Self::Type, Self::Verdict, Self::HeldBy, Self::Pv, Self::Why]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        let (_, heading, help) = ALL.iter().find(|(c, _, _)| c == self)?;
        let p = PossibleValue::new(*heading).help(*help);
        // What lsblk calls them, and the agent's older name for the kind.
        Some(match self {
            Self::Type => p.alias("KIND"),
            Self::HeldBy => p.alias("HOLDERS"),
            _ => p,
        })
    }
}

/// Who holds it, counted by kind in the order first seen: `mount×3, open_device`; `-` for none.
pub fn held_by(d: &pb::Device) -> String {
    if d.holders.is_empty() {
        return "-".into();
    }
    let mut counts: Vec<(i32, usize)> = Vec::new();
    for h in &d.holders {
        match counts.iter_mut().find(|(k, _)| *k == h.kind) {
            Some((_, n)) => *n += 1,
            None => counts.push((h.kind, 1)),
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(k, n)| if *n == 1 { holder_kind_name(*k) } else { format!("{}×{n}", holder_kind_name(*k)) })
        .collect();
    parts.join(", ")
}

/// The reasons: the first one, or (`wide`) every one, the same sentence said once with a count.
fn why(d: &pb::Device, wide: bool) -> String {
    if wide {
        crate::view::fold::fold(&d.reasons).join("; ")
    } else {
        d.reasons.first().cloned().unwrap_or_default()
    }
}

/// The PV and pods (per kubelet) of a device: `pvc-1 (2 pods)`, `-`.
pub fn kube_cell(d: &pb::Device) -> String {
    if d.pv_names.is_empty() && d.pod_uids.is_empty() && d.kubelet_paths.is_empty() {
        return "-".into();
    }
    let pv = d.pv_names.first().cloned().unwrap_or_else(|| "(kubelet volume)".into());
    match d.pod_uids.len() {
        0 => format!("{pv} (no pod)"),
        1 => format!("{pv} (pod {})", d.pod_uids[0]),
        n => format!("{pv} ({n} pods)"),
    }
}

/// Which columns `scan` shows, and how (both CLIs flatten this into their `scan`).
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ScanLayout {
    /// The columns to show, in this order, comma-separated (any case)
    /// [default: NAME,MAJ:MIN,SIZE,TYPE,VERDICT,HELD-BY,WHY; -o wide adds PV].
    #[arg(long, value_enum, value_delimiter = ',', ignore_case = true, value_name = "COLUMNS")]
    pub columns: Vec<Column>,
    /// Draw each stack as lsblk does: what is stacked on a device under it (└─, ├─), down to
    /// its holders (mounts, open files) as leaf lines.
    #[arg(long)]
    pub tree: bool,
}

impl ScanLayout {
    /// The columns to show: `--columns`, else the default (`wide`: with PV).
    pub fn shown(&self, wide: bool) -> Vec<Column> {
        if !self.columns.is_empty() {
            return self.columns.clone();
        }
        let mut c = DEFAULT.to_vec();
        if wide {
            c.insert(6, Column::Pv);
        }
        c
    }
}
