//! NVMe namespaces as the graph shows them: whether a namespace block device is a native
//! multipath head, one of its hidden per-path devices or a namespace without multipath, the
//! controllers serving it and the outage guard's finding. Built from a [`NvmeScan`] without
//! further I/O, below the graph (as `graph/multipath.rs` is for multipath maps); what the agent may do
//! about it is `nvme.rs`.

use serde::Serialize;

use crate::discover::nvme::{NsName, NvmeController, NvmeOutage, NvmeScan};
use crate::model::{BlockDevice, DeviceName};

/// What an NVMe namespace block device is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NvmeRole {
    /// A native-multipath head (`nvme<S>n<N>`), served by every controller of its subsystem.
    Head,
    /// A hidden per-path device (`nvme<S>c<C>n<N>`): judged and removed with its head.
    Path,
    /// A namespace without multipath (`nvme<C>n<N>`), served by one controller.
    Namespace,
}

impl NvmeRole {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Head => "head",
            Self::Path => "path",
            Self::Namespace => "namespace",
        }
    }
}

/// An NVMe namespace block device and what serves it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NvmeView {
    pub role: NvmeRole,
    /// `nvme-subsysM`, when sysfs names it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subsystem: Option<String>,
    pub subsysnqn: String,
    /// For a hidden path: its head.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<DeviceName>,
    /// The controllers serving it (for a head: every path of its subsystem).
    pub controllers: Vec<NvmeController>,
    /// How many of them are live.
    pub live: usize,
    /// The outage guard: every controller to its target is down at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<NvmeOutage>,
    /// Other namespace devices that deleting these controllers removes too.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub siblings: Vec<DeviceName>,
    /// Why some of those are in use (their holders, pods per kubelet), filled in by the graph.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub siblings_held: Vec<String>,
}

impl NvmeView {
    /// Any controller over a fabric (PCIe controllers are never touched).
    pub fn fabrics(&self) -> bool {
        self.controllers.iter().any(|c| c.fabrics)
    }

    /// `nvme1 connecting to traddr=..,trsvcid=.. (tcp, ctrl_loss_tmo off)` for each controller.
    pub fn describe_controllers(&self) -> String {
        if self.controllers.is_empty() {
            return "no controller".into();
        }
        self.controllers
            .iter()
            .map(|c| {
                let tmo =
                    c.ctrl_loss_tmo.map(|t| format!(", ctrl_loss_tmo {}", t.describe())).unwrap_or_default();
                format!("{} {} to {} ({}{tmo})", c.name, c.state.as_str(), c.address.target(), c.transport)
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The NVMe view of a block device (`None`: not an NVMe namespace the scan knows).
pub fn view(scan: &NvmeScan, outages: &[NvmeOutage], d: &BlockDevice) -> Option<NvmeView> {
    let name = NsName::parse(d.name.as_str())?;
    let (subsys, ctrls) = scan.serving(&d.name)?;
    let role = match (name, subsys.is_some_and(|s| s.heads.contains(&d.name))) {
        (_, true) => NvmeRole::Head,
        (NsName::Path { .. }, false) => NvmeRole::Path,
        (NsName::Plain { .. }, false) => NvmeRole::Namespace,
    };
    let controllers: Vec<NvmeController> = ctrls.into_iter().cloned().collect();
    let subsysnqn = subsys
        .map(|s| s.subsysnqn.clone())
        .or_else(|| controllers.first().map(|c| c.subsysnqn.clone()))
        .unwrap_or_default();
    let names: Vec<&str> = controllers.iter().map(|c| c.name.as_str()).collect();
    let outage = outages.iter().find(|o| o.controllers.iter().any(|c| names.contains(&c.as_str()))).cloned();
    let mut siblings: Vec<DeviceName> = match role {
        NvmeRole::Head => subsys.map(|s| s.heads.clone()).unwrap_or_default(),
        NvmeRole::Namespace => controllers.iter().flat_map(|c| c.namespaces.iter().cloned()).collect(),
        NvmeRole::Path => Vec::new(),
    };
    siblings.retain(|s| *s != d.name);
    siblings.sort();
    siblings.dedup();
    Some(NvmeView {
        role,
        subsystem: subsys.map(|s| s.name.clone()),
        subsysnqn,
        head: (role == NvmeRole::Path).then(|| name.head().and_then(|h| DeviceName::new(&h).ok())).flatten(),
        live: controllers.iter().filter(|c| c.state.is_live()).count(),
        controllers,
        outage,
        siblings,
        siblings_held: Vec::new(),
    })
}

/// Entries and controllers for tests of every stage (judge, plan, metrics).
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::discover::nvme::{CtrlState, NvmeAddress, NvmeController, NvmeScan, NvmeSubsystem, Timeout};
    use crate::graph::DeviceEntry;
    use crate::model::{BlockDevice, DevNum, DeviceKind};

    pub(crate) fn ctrl(name: &str, nqn: &str, port: &str, state: CtrlState, fabrics: bool) -> NvmeController {
        NvmeController {
            name: name.into(),
            transport: if fabrics { "tcp" } else { "pcie" }.into(),
            subsysnqn: nqn.into(),
            address: NvmeAddress::parse(&format!("traddr=127.0.0.1,trsvcid={port}")),
            state,
            ctrl_loss_tmo: fabrics.then_some(Timeout::Off),
            reconnect_delay: fabrics.then_some(Timeout::Seconds(1)),
            cntlid: Some(1),
            hostnqn: None,
            subsystem: Some("nvme-subsys0".into()),
            namespaces: Vec::new(),
            fabrics,
        }
    }

    pub(crate) fn name(n: &str) -> DeviceName {
        DeviceName::new(n).expect("name")
    }

    /// The graph's entries for the heads of one subsystem served by `ctrls`.
    pub(crate) fn entries(
        heads: &[&str],
        ctrls: Vec<NvmeController>,
        extra: Vec<NvmeController>,
    ) -> Vec<DeviceEntry> {
        let subsys = NvmeSubsystem {
            name: "nvme-subsys0".into(),
            subsysnqn: ctrls[0].subsysnqn.clone(),
            iopolicy: Some("numa".into()),
            controllers: ctrls.iter().map(|c| c.name.clone()).collect(),
            heads: heads.iter().map(|h| name(h)).collect(),
        };
        let scan =
            NvmeScan { controllers: ctrls.into_iter().chain(extra).collect(), subsystems: vec![subsys] };
        let outages = crate::discover::nvme::outages(&scan);
        let mut out: Vec<DeviceEntry> = heads
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let devnum = DevNum::new(259, i as u32 * 2 + 1);
                let device = BlockDevice {
                    diskseq: Some(14 + i as u64),
                    ..BlockDevice::new(name(h), devnum, DeviceKind::NvmeNamespace, 16 << 20)
                };
                let nvme = view(&scan, &outages, &device);
                DeviceEntry { nvme, ..DeviceEntry::new(device, Vec::new()) }
            })
            .collect();
        crate::graph::mark_held_siblings(&mut out);
        out
    }
}
