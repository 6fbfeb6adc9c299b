//! NVMe controllers, subsystems and namespaces from sysfs (NVMe over Fabrics and PCIe alike),
//! checked against drivers/nvme/host/{core,fabrics,multipath,tcp}.c of Linux 6.1 (the guest's):
//!
//! ```text
//! /sys/class/nvme/nvme1 -> ../../devices/virtual/nvme-fabrics/ctl/nvme1   (fabrics; PCIe under its bus)
//!   transport "tcp"   subsysnqn "nqn.2026-11.io.blockjanitor:a"   cntlid "1"   hostnqn "nqn..."
//!   state  "live" | "new" | "resetting" | "connecting" | "deleting" | "deleting (noio)" | "dead"
//!          (anything else prints "unknown state")
//!   address "traddr=127.0.0.1,trsvcid=4420[,host_traddr=..][,host_iface=..][,src_addr=127.0.0.1]"
//!           (nvmf_get_address; nvme-tcp appends src_addr only while the admin queue is live)
//!   ctrl_loss_tmo "off" | "<seconds>"     reconnect_delay "off" | "<seconds>"   (fabrics only)
//!   nvme1c1n1/   the hidden per-path disk of namespace 1 (native multipath: `hidden` 1, no `dev`
//!                attribute and no device node, so it is not among the scan's block devices), or
//!   nvme1n1/     the namespace itself when multipath is off (or PCIe without it)
//! /sys/class/nvme-subsystem/nvme-subsys1 -> ../../devices/virtual/nvme-subsystem/nvme-subsys1
//!   subsysnqn  iopolicy ("numa" | "round-robin"; multipath kernels only)
//!   nvme1 -> ../../nvme-fabrics/ctl/nvme1    one link per controller (path) of the subsystem
//!   nvme1n1/   the namespace head: the block device the host mounts (`nvme<subsys>n<nsid>`)
//! ```
//!
//! Only names and attributes are read; nothing here opens a block device (a namespace with no
//! live path queues every I/O).

use std::path::Path;

use serde::Serialize;

use super::{list_dir, read_attr, read_attr_opt, DiscoverError};
use crate::host::HostRoot;
use crate::model::DeviceName;

/// A controller's state, as `state` prints it (`nvme_sysfs_show_state`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CtrlState {
    New,
    Live,
    Resetting,
    Connecting,
    Deleting,
    DeletingNoio,
    Dead,
    /// Any other text (`unknown state`, or a name a newer kernel adds).
    Other(String),
}

impl CtrlState {
    pub fn parse(text: &str) -> Self {
        match text.trim() {
            "new" => Self::New,
            "live" => Self::Live,
            "resetting" => Self::Resetting,
            "connecting" => Self::Connecting,
            "deleting" => Self::Deleting,
            "deleting (noio)" => Self::DeletingNoio,
            "dead" => Self::Dead,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::New => "new",
            Self::Live => "live",
            Self::Resetting => "resetting",
            Self::Connecting => "connecting",
            Self::Deleting => "deleting",
            Self::DeletingNoio => "deleting (noio)",
            Self::Dead => "dead",
            Self::Other(s) => s,
        }
    }

    pub fn is_live(&self) -> bool {
        *self == Self::Live
    }

    /// A transient state a working controller passes through: it may be live again in a moment.
    /// (`connecting` is where a controller stuck reconnecting stays.)
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::New | Self::Resetting)
    }
}

/// `ctrl_loss_tmo` / `reconnect_delay`: seconds, or `off` (reconnect forever).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Timeout {
    Off,
    Seconds(i64),
}

impl Timeout {
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim() {
            "off" => Some(Self::Off),
            t => t.parse().ok().map(Self::Seconds),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Self::Off => "off (reconnects forever)".into(),
            Self::Seconds(s) => format!("{s}s"),
        }
    }
}

/// A fabrics transport address, from `address` (`key=value` pairs joined by `,`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NvmeAddress {
    /// The text as the kernel printed it (without the newline).
    pub raw: String,
    pub traddr: Option<String>,
    pub trsvcid: Option<String>,
    pub host_traddr: Option<String>,
    pub host_iface: Option<String>,
    /// nvme-tcp's local address, shown only while the admin queue is live: never part of the
    /// controller's identity.
    pub src_addr: Option<String>,
}

impl NvmeAddress {
    /// Parses `address`. A PCIe controller prints its PCI address (`0000:00:04.0`), which has
    /// no `=`: kept as `raw` only.
    pub fn parse(text: &str) -> Self {
        let raw = text.trim_end_matches('\n').to_owned();
        let mut a = Self { raw: raw.clone(), ..Self::default() };
        for pair in raw.split(',') {
            let Some((k, v)) = pair.split_once('=') else { continue };
            let v = Some(v.to_owned());
            match k {
                "traddr" => a.traddr = v,
                "trsvcid" => a.trsvcid = v,
                "host_traddr" => a.host_traddr = v,
                "host_iface" => a.host_iface = v,
                "src_addr" => a.src_addr = v,
                _ => {}
            }
        }
        a
    }

    /// The target end of the connection, stable across reconnects: `traddr=..,trsvcid=..`
    /// (plus `host_traddr`/`host_iface` when set), never `src_addr`.
    pub fn target(&self) -> String {
        let mut parts = Vec::new();
        for (k, v) in [
            ("traddr", &self.traddr),
            ("trsvcid", &self.trsvcid),
            ("host_traddr", &self.host_traddr),
            ("host_iface", &self.host_iface),
        ] {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        }
        if parts.is_empty() {
            return self.raw.clone();
        }
        parts.join(",")
    }
}

/// One NVMe controller (`/sys/class/nvme/nvmeN`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmeController {
    /// `nvmeN`.
    pub name: String,
    /// `tcp`, `rdma`, `fc`, `loop`, `pcie`.
    pub transport: String,
    pub subsysnqn: String,
    pub address: NvmeAddress,
    pub state: CtrlState,
    /// Fabrics only (`None` for PCIe, whose controllers have no such attribute).
    pub ctrl_loss_tmo: Option<Timeout>,
    pub reconnect_delay: Option<Timeout>,
    pub cntlid: Option<u16>,
    pub hostnqn: Option<String>,
    /// The subsystem it belongs to (`nvme-subsysM`), from the subsystem's links.
    pub subsystem: Option<String>,
    /// Its namespace disks: hidden per-path devices (`nvme1c1n1`) with native multipath, the
    /// namespaces themselves (`nvme1n1`) without.
    pub namespaces: Vec<DeviceName>,
    /// Created through `/dev/nvme-fabrics` (listed under `/sys/class/nvme-fabrics/ctl/`).
    pub fabrics: bool,
}

/// One NVMe subsystem (`/sys/class/nvme-subsystem/nvme-subsysM`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmeSubsystem {
    pub name: String,
    pub subsysnqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iopolicy: Option<String>,
    /// Its controllers (`nvmeN`), one per path.
    pub controllers: Vec<String>,
    /// Its namespace heads (`nvmeMnK`), the block devices the host uses (multipath only).
    pub heads: Vec<DeviceName>,
}

/// Every controller and subsystem.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NvmeScan {
    pub controllers: Vec<NvmeController>,
    pub subsystems: Vec<NvmeSubsystem>,
}

/// What an NVMe disk name says: `nvme<A>n<N>` (a head, or a namespace without multipath) or
/// `nvme<S>c<C>n<N>` (a hidden path of head `nvme<S>n<N>` through controller `nvme<C>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsName {
    Plain { instance: u32, nsid: u32 },
    Path { subsys: u32, ctrl: u32, nsid: u32 },
}

impl NsName {
    pub fn parse(name: &str) -> Option<Self> {
        let rest = name.strip_prefix("nvme")?;
        let num = |t: &str| -> Option<u32> {
            (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).then(|| t.parse().ok()).flatten()
        };
        let (left, nsid) = rest.split_once('n')?;
        let nsid = num(nsid)?;
        match left.split_once('c') {
            Some((s, c)) => Some(Self::Path { subsys: num(s)?, ctrl: num(c)?, nsid }),
            None => Some(Self::Plain { instance: num(left)?, nsid }),
        }
    }

    /// For a path: the name of its head.
    pub fn head(&self) -> Option<String> {
        match self {
            Self::Path { subsys, nsid, .. } => Some(format!("nvme{subsys}n{nsid}")),
            Self::Plain { .. } => None,
        }
    }
}

/// `nvmeN`.
fn is_ctrl_name(s: &str) -> bool {
    s.strip_prefix("nvme").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// `nvme-subsysN`.
fn is_subsys_name(s: &str) -> bool {
    s.strip_prefix("nvme-subsys").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_digit()))
}

/// Namespace disk directories under a controller or subsystem directory (a hidden per-path
/// disk has no `dev` attribute: it has no device node).
fn namespace_dirs(dir: &Path) -> Result<Vec<DeviceName>, DiscoverError> {
    Ok(list_dir(dir)?
        .into_iter()
        .filter(|n| NsName::parse(n).is_some() && dir.join(n).is_dir())
        .filter_map(|n| DeviceName::new(&n).ok())
        .collect())
}

/// Reads every controller and subsystem. No NVMe at all (no such class) is an empty scan.
pub fn scan(host: &HostRoot) -> Result<NvmeScan, DiscoverError> {
    let sys = host.sys();
    let mut subsystems = Vec::new();
    let sclass = sys.join("class/nvme-subsystem");
    for name in list_dir(&sclass)?.into_iter().filter(|n| is_subsys_name(n)) {
        let dir = sclass.join(&name);
        let Some(subsysnqn) = read_attr_opt(&dir.join("subsysnqn"))? else { continue }; // gone meanwhile
        let entries = list_dir(&dir)?;
        subsystems.push(NvmeSubsystem {
            subsysnqn: subsysnqn.trim().to_owned(),
            iopolicy: read_attr_opt(&dir.join("iopolicy"))?.map(|s| s.trim().to_owned()),
            controllers: entries.iter().filter(|n| is_ctrl_name(n)).cloned().collect(),
            heads: namespace_dirs(&dir)?,
            name,
        });
    }
    let fabrics_dir = sys.join("class/nvme-fabrics/ctl");
    let fabrics: Vec<String> = list_dir(&fabrics_dir)?;
    let cclass = sys.join("class/nvme");
    let mut controllers = Vec::new();
    for name in list_dir(&cclass)?.into_iter().filter(|n| is_ctrl_name(n)) {
        let dir = cclass.join(&name);
        let state_path = dir.join("state");
        let Some(state) = read_attr_opt(&state_path)? else { continue }; // deleted meanwhile
        let timeout = |attr: &str| -> Result<Option<Timeout>, DiscoverError> {
            let path = dir.join(attr);
            match read_attr_opt(&path)? {
                None => Ok(None),
                Some(t) => Timeout::parse(&t)
                    .map(Some)
                    .ok_or_else(|| DiscoverError::attr(&path, &t, "expected 'off' or a number of seconds")),
            }
        };
        let cntlid_path = dir.join("cntlid");
        let cntlid =
            match read_attr_opt(&cntlid_path)? {
                None => None,
                Some(t) => Some(t.trim().parse::<u16>().map_err(|_| {
                    DiscoverError::attr(&cntlid_path, &t, "expected a controller ID (0-65535)")
                })?),
            };
        controllers.push(NvmeController {
            transport: read_attr(&dir.join("transport"))?.trim().to_owned(),
            subsysnqn: read_attr(&dir.join("subsysnqn"))?.trim().to_owned(),
            address: NvmeAddress::parse(&read_attr_opt(&dir.join("address"))?.unwrap_or_default()),
            state: CtrlState::parse(&state),
            ctrl_loss_tmo: timeout("ctrl_loss_tmo")?,
            reconnect_delay: timeout("reconnect_delay")?,
            cntlid,
            hostnqn: read_attr_opt(&dir.join("hostnqn"))?.map(|s| s.trim().to_owned()),
            subsystem: subsystems.iter().find(|s| s.controllers.contains(&name)).map(|s| s.name.clone()),
            namespaces: namespace_dirs(&dir)?,
            fabrics: fabrics.contains(&name),
            name,
        });
    }
    Ok(NvmeScan { controllers, subsystems })
}

impl NvmeScan {
    pub fn controller(&self, name: &str) -> Option<&NvmeController> {
        self.controllers.iter().find(|c| c.name == name)
    }

    pub fn subsystem(&self, name: &str) -> Option<&NvmeSubsystem> {
        self.subsystems.iter().find(|s| s.name == name)
    }

    /// The controllers behind a namespace disk and the subsystem it belongs to: a head is served
    /// by every controller of its subsystem; a hidden path or a namespace without multipath by
    /// the controller it sits under. `None`: not an NVMe namespace this scan knows.
    pub fn serving(&self, disk: &DeviceName) -> Option<(Option<&NvmeSubsystem>, Vec<&NvmeController>)> {
        if let Some(s) = self.subsystems.iter().find(|s| s.heads.contains(disk)) {
            let ctrls = s.controllers.iter().filter_map(|c| self.controller(c)).collect();
            return Some((Some(s), ctrls));
        }
        let c = self.controllers.iter().find(|c| c.namespaces.contains(disk))?;
        Some((c.subsystem.as_deref().and_then(|s| self.subsystem(s)), vec![c]))
    }
}

impl NvmeScan {
    /// Fabrics controllers that serve no namespace (no disk under them, none in their
    /// subsystem): nothing on the node can hold them and no block device plans them, so they are
    /// reported, one line each.
    pub fn idle_controllers(&self) -> Vec<String> {
        self.controllers
            .iter()
            .filter(|c| c.fabrics && c.namespaces.is_empty())
            .filter(|c| {
                c.subsystem.as_deref().and_then(|s| self.subsystem(s)).is_none_or(|s| s.heads.is_empty())
            })
            .map(|c| {
                format!(
                    "NVMe controller {} ({} {}, subsystem {}) serves no namespace (state {}{}); the agent plans controllers only through their namespaces: if its target is gone, remove it by hand (nvme disconnect -d {})",
                    c.name,
                    c.transport,
                    c.address.target(),
                    c.subsysnqn,
                    c.state.as_str(),
                    c.ctrl_loss_tmo.map(|t| format!(", ctrl_loss_tmo {}", t.describe())).unwrap_or_default(),
                    c.name
                )
            })
            .collect()
    }
}

/// A target the outage guard watches: every controller on this node to one transport address
/// (`transport` + `traddr`, the array's end), or to one subsystem NQN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmeOutage {
    /// `traddr=<addr> (<transport>)` or `subsysnqn=<nqn>`.
    pub target: String,
    /// The controllers to it, none live.
    pub controllers: Vec<String>,
}

/// Targets to which every fabrics controller on this node is down at once: more than one
/// controller (two subsystems behind one array address, or two paths to one subsystem) and
/// none live. That is an array or network outage, not a stale controller: nothing behind it is
/// cleaned. One controller alone cannot tell the two apart, so it is judged on its own.
pub fn outages(scan: &NvmeScan) -> Vec<NvmeOutage> {
    use std::collections::BTreeMap;
    let mut groups: BTreeMap<String, Vec<&NvmeController>> = BTreeMap::new();
    for c in scan.controllers.iter().filter(|c| c.fabrics) {
        if let Some(addr) = &c.address.traddr {
            groups.entry(format!("traddr={addr} ({})", c.transport)).or_default().push(c);
        }
        groups.entry(format!("subsysnqn={}", c.subsysnqn)).or_default().push(c);
    }
    groups
        .into_iter()
        .filter(|(_, cs)| cs.len() >= 2 && cs.iter().all(|c| !c.state.is_live()))
        .map(|(target, cs)| NvmeOutage { target, controllers: cs.iter().map(|c| c.name.clone()).collect() })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/nvme-tcp");

    /// The tree Debian's 6.1 kernel showed in the guest (make-nvme-fixture.py).
    #[test]
    fn scans_the_guest_kernels_layout() {
        let s = scan(&HostRoot::new(FIXTURE)).expect("scan");
        assert_eq!(s.subsystems.len(), 2);
        let sub = s.subsystem("nvme-subsys0").expect("nvme-subsys0");
        assert_eq!(sub.subsysnqn, "nqn.2026-11.io.blockjanitor:a");
        assert_eq!(sub.iopolicy.as_deref(), Some("numa"));
        assert_eq!(sub.controllers, vec!["nvme0"]);
        assert_eq!(sub.heads, vec![DeviceName::new("nvme0n1").expect("name")]);
        let c = s.controller("nvme0").expect("nvme0");
        assert_eq!(c.transport, "tcp");
        assert_eq!(c.state, CtrlState::Connecting);
        assert_eq!(c.ctrl_loss_tmo, Some(Timeout::Off));
        assert_eq!(c.reconnect_delay, Some(Timeout::Seconds(1)));
        assert_eq!(c.cntlid, Some(1));
        assert_eq!(c.address.raw, "traddr=127.0.0.1,trsvcid=4420");
        assert_eq!(c.subsystem.as_deref(), Some("nvme-subsys0"));
        assert_eq!(c.namespaces, vec![DeviceName::new("nvme0c0n1").expect("name")]);
        assert!(c.fabrics);
        assert_eq!(
            c.hostnqn.as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:b10c4a17-0000-4000-8000-000000000012")
        );
        let live = s.controller("nvme1").expect("nvme1");
        assert_eq!(live.state, CtrlState::Live);
        assert_eq!(live.address.src_addr.as_deref(), Some("127.0.0.1"));
        assert_eq!(live.address.target(), "traddr=127.0.0.1,trsvcid=4421");
        let head = DeviceName::new("nvme0n1").expect("name");
        let (sub, ctrls) = s.serving(&head).expect("served");
        assert_eq!(sub.map(|s| s.name.as_str()), Some("nvme-subsys0"));
        assert_eq!(ctrls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), vec!["nvme0"]);
        // One controller to the address is live: no outage.
        assert!(outages(&s).is_empty());
    }

    #[test]
    fn no_nvme_is_an_empty_scan() {
        let empty = tempfile::tempdir().expect("tempdir");
        assert_eq!(scan(&HostRoot::new(empty.path())).expect("scan"), NvmeScan::default());
    }

    #[test]
    fn states_as_the_kernel_prints_them() {
        for (text, s) in [
            ("live\n", CtrlState::Live),
            ("connecting\n", CtrlState::Connecting),
            ("deleting (noio)\n", CtrlState::DeletingNoio),
            ("dead", CtrlState::Dead),
            ("new", CtrlState::New),
            ("resetting", CtrlState::Resetting),
            ("deleting", CtrlState::Deleting),
        ] {
            assert_eq!(CtrlState::parse(text), s);
            assert_eq!(s.as_str(), text.trim());
        }
        assert_eq!(CtrlState::parse("unknown state\n"), CtrlState::Other("unknown state".into()));
        assert!(!CtrlState::Connecting.is_live() && CtrlState::Live.is_live());
    }

    #[test]
    fn timeouts() {
        assert_eq!(Timeout::parse("off\n"), Some(Timeout::Off));
        assert_eq!(Timeout::parse("600\n"), Some(Timeout::Seconds(600)));
        assert_eq!(Timeout::parse("ten"), None);
    }

    #[test]
    fn addresses() {
        let a = NvmeAddress::parse("traddr=127.0.0.1,trsvcid=4420,src_addr=127.0.0.1\n");
        assert_eq!(a.traddr.as_deref(), Some("127.0.0.1"));
        assert_eq!(a.trsvcid.as_deref(), Some("4420"));
        assert_eq!(a.src_addr.as_deref(), Some("127.0.0.1"));
        // src_addr comes and goes with the queue: not part of the target.
        assert_eq!(a.target(), "traddr=127.0.0.1,trsvcid=4420");
        let b = NvmeAddress::parse("traddr=10.0.0.5,trsvcid=4420,host_traddr=10.0.0.1");
        assert_eq!(b.target(), "traddr=10.0.0.5,trsvcid=4420,host_traddr=10.0.0.1");
        let pci = NvmeAddress::parse("0000:00:04.0\n");
        assert_eq!((pci.traddr.clone(), pci.target()), (None, "0000:00:04.0".to_owned()));
        // An IPv6 address keeps its colons.
        assert_eq!(NvmeAddress::parse("traddr=fe80::1,trsvcid=4420").traddr.as_deref(), Some("fe80::1"));
    }

    #[test]
    fn namespace_names() {
        assert_eq!(NsName::parse("nvme0n1"), Some(NsName::Plain { instance: 0, nsid: 1 }));
        assert_eq!(NsName::parse("nvme1c2n3"), Some(NsName::Path { subsys: 1, ctrl: 2, nsid: 3 }));
        assert_eq!(NsName::parse("nvme1c2n3").and_then(|n| n.head()).as_deref(), Some("nvme1n3"));
        for bad in ["nvme0", "nvme0n1p1", "nvmen1", "nvme0n", "nvme-subsys0", "sda", "nvme0c1n"] {
            assert_eq!(NsName::parse(bad), None, "{bad}");
        }
    }

    fn ctrl(name: &str, nqn: &str, traddr: &str, state: CtrlState) -> NvmeController {
        NvmeController {
            name: name.into(),
            transport: "tcp".into(),
            subsysnqn: nqn.into(),
            address: NvmeAddress::parse(&format!("traddr={traddr},trsvcid=4420")),
            state,
            ctrl_loss_tmo: Some(Timeout::Off),
            reconnect_delay: Some(Timeout::Seconds(1)),
            cntlid: Some(1),
            hostnqn: None,
            subsystem: None,
            namespaces: Vec::new(),
            fabrics: true,
        }
    }

    #[test]
    fn every_controller_to_an_address_down_is_an_outage_one_alone_is_not() {
        let mut s = NvmeScan {
            controllers: vec![
                ctrl("nvme0", "nqn.a", "10.0.0.5", CtrlState::Connecting),
                ctrl("nvme1", "nqn.b", "10.0.0.5", CtrlState::Connecting),
                ctrl("nvme2", "nqn.c", "10.0.0.6", CtrlState::Connecting),
            ],
            subsystems: Vec::new(),
        };
        let o = outages(&s);
        assert_eq!(o.len(), 1, "{o:?}");
        assert_eq!(o[0].target, "traddr=10.0.0.5 (tcp)");
        assert_eq!(o[0].controllers, vec!["nvme0", "nvme1"]);
        // One live controller to the address: the array answers, so the others are not an outage.
        s.controllers[1].state = CtrlState::Live;
        assert!(outages(&s).is_empty());
        // Two paths to one subsystem, both down (different addresses): an outage of that target.
        s.controllers = vec![
            ctrl("nvme0", "nqn.a", "10.0.0.5", CtrlState::Connecting),
            ctrl("nvme1", "nqn.a", "10.0.1.5", CtrlState::Resetting),
        ];
        assert_eq!(
            outages(&s).iter().map(|o| o.target.as_str()).collect::<Vec<_>>(),
            vec!["subsysnqn=nqn.a"]
        );
    }
}
