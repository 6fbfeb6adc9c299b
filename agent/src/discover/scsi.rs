//! SCSI disks from sysfs, and the transport each one goes through: an iSCSI session or a
//! Fibre Channel remote port. Attribute names and formats are the kernel's own, from
//! drivers/scsi/scsi_sysfs.c, scsi_transport_iscsi.c and scsi_transport_fc.c; the fixture
//! generator tests/fixtures/make-transport-fixtures.py documents the layout.
//!
//! ```text
//! /sys/class/block/sdc -> ../../devices/platform/host3/session1/target3:0:0/3:0:0:1/block/sdc
//!   dev "8:32"   device -> ../../../3:0:0:1   (H:C:T:L is the link target's name)
//!   device/ state "running"  vendor "HUAWEI  "  model "XSG1            "
//!           wwid "naa.618cf24100f8f457014a764c000001f6"  ioerr_cnt "0x2"  iorequest_cnt "0x1a4"
//! /sys/class/iscsi_session/session1 -> ../../devices/platform/host3/session1/iscsi_session/session1
//!   targetname "iqn.2006-08.com.huawei:oceanstor:..."  state "LOGGED_IN" | "FAILED" | "FREE"
//! /sys/class/fc_remote_ports/rport-5:0-2 -> ../../devices/pci.../host5/rport-5:0-2/fc_remote_ports/rport-5:0-2
//!   port_name "0x500507680b215660"  node_name "0x..."  port_id "0x010600"  port_state "Online"
//! ```
//! A disk belongs to the session or remote port its device path goes through. Only sysfs is
//! read: never the disk itself, which may hang forever when its paths are gone (gotcha 12).

use std::fmt;
use std::path::{Component, Path};
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::{list_dir, read_attr, read_attr_opt, DiscoverError};
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName};

/// A SCSI address, `host:channel:target:lun`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ScsiAddress {
    pub host: u32,
    pub channel: u32,
    pub target: u32,
    pub lun: u64,
}

impl FromStr for ScsiAddress {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        let mut it = s.split(':');
        let mut num =
            || it.next().filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit())).ok_or(());
        let (h, c, t, l) = (num()?, num()?, num()?, num()?);
        if it.next().is_some() {
            return Err(());
        }
        Ok(Self {
            host: h.parse().map_err(|_| ())?,
            channel: c.parse().map_err(|_| ())?,
            target: t.parse().map_err(|_| ())?,
            lun: l.parse().map_err(|_| ())?,
        })
    }
}

impl fmt::Display for ScsiAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:{}", self.host, self.channel, self.target, self.lun)
    }
}

/// `device/state` (scsi_sysfs.c `sdev_states`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScsiState {
    Created,
    Running,
    Cancel,
    Deleted,
    Quiesce,
    /// Taken offline by error handling or by hand (`echo offline > device/state`).
    Offline,
    /// The transport gave up on the device (iSCSI session or FC port lost past its timeout).
    TransportOffline,
    /// The transport is recovering; I/O waits.
    Blocked,
    CreatedBlocked,
}

impl ScsiState {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "created" => Self::Created,
            "running" => Self::Running,
            "cancel" => Self::Cancel,
            "deleted" => Self::Deleted,
            "quiesce" => Self::Quiesce,
            "offline" => Self::Offline,
            "transport-offline" => Self::TransportOffline,
            "blocked" => Self::Blocked,
            "created-blocked" => Self::CreatedBlocked,
            _ => return None,
        })
    }
}

/// What a disk's device path goes through.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// An iSCSI session, by its sysfs name (`session1`).
    Iscsi { session: String },
    /// A Fibre Channel remote port, by its sysfs name (`rport-5:0-2`).
    Fc { rport: String },
    /// SAS, SATA, virtio-scsi, USB, scsi_debug...
    Other,
}

/// A SCSI disk (`sdX`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScsiDisk {
    pub name: DeviceName,
    pub devnum: DevNum,
    pub address: ScsiAddress,
    pub state: ScsiState,
    /// `device/vendor`, padding trimmed.
    pub vendor: String,
    /// `device/model`, padding trimmed.
    pub model: String,
    /// `device/wwid` (`naa.…`, `eui.…`, `t10.…`); absent on kernels or devices without VPD 0x83.
    pub wwid: Option<String>,
    /// `device/ioerr_cnt`: commands completed with an error.
    pub ioerr_cnt: u64,
    /// `device/iorequest_cnt`: commands issued.
    pub iorequest_cnt: u64,
    pub transport: Transport,
}

impl ScsiDisk {
    /// The WWID multipath-tools uses by default (udev's `ID_SERIAL`, from the same VPD page):
    /// `naa.X` gives `3X`, `eui.X` gives `2X`; a multipath map's uuid is `mpath-` plus this.
    /// `None` for other designators, whose udev form this cannot reproduce.
    pub fn multipath_wwid(&self) -> Option<String> {
        let w = self.wwid.as_deref()?;
        if let Some(naa) = w.strip_prefix("naa.") {
            Some(format!("3{naa}"))
        } else {
            w.strip_prefix("eui.").map(|eui| format!("2{eui}"))
        }
    }
}

/// `state` of an iSCSI session (scsi_transport_iscsi.c `iscsi_session_state_names`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IscsiSessionState {
    LoggedIn,
    /// The connection is lost and being recovered (until `recovery_tmo`).
    Failed,
    Free,
}

/// An iSCSI session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IscsiSession {
    /// `session<N>`.
    pub name: String,
    pub targetname: String,
    pub state: IscsiSessionState,
    /// SID, portal, iface, connections, host ([`super::iscsi`]).
    #[serde(flatten)]
    pub detail: super::iscsi::IscsiDetail,
}

/// A Fibre Channel world wide name (port or node), printed `0x%016x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Wwn(pub u64);

impl fmt::Display for Wwn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:016x}", self.0)
    }
}

impl Serialize for Wwn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `port_state` of an FC remote port (scsi_transport_fc.c `fc_port_state_names`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FcPortState {
    Unknown,
    NotPresent,
    Online,
    Offline,
    /// Lost; its disks are blocked until it returns or `dev_loss_tmo` expires.
    Blocked,
    Bypassed,
    Diagnostics,
    Linkdown,
    Error,
    Loopback,
    Deleted,
    Marginal,
}

impl FcPortState {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "Unknown" => Self::Unknown,
            "Not Present" => Self::NotPresent,
            "Online" => Self::Online,
            "Offline" => Self::Offline,
            "Blocked" => Self::Blocked,
            "Bypassed" => Self::Bypassed,
            "Diagnostics" => Self::Diagnostics,
            "Linkdown" => Self::Linkdown,
            "Error" => Self::Error,
            "Loopback" => Self::Loopback,
            "Deleted" => Self::Deleted,
            "Marginal" => Self::Marginal,
            _ => return None,
        })
    }
}

/// A Fibre Channel remote port (a target port seen by one HBA port).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FcRemotePort {
    /// `rport-H:B-R`.
    pub name: String,
    pub port_name: Wwn,
    pub node_name: Wwn,
    /// Fabric address, e.g. `0x010600`.
    pub port_id: Option<String>,
    pub port_state: FcPortState,
}

/// Everything this module reads, in one pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScsiScan {
    pub disks: Vec<ScsiDisk>,
    pub iscsi_sessions: Vec<IscsiSession>,
    pub fc_remote_ports: Vec<FcRemotePort>,
    /// iSCSI disks whose target reports the LUN gone (kernel log), with the line
    /// ([`super::iscsi::read_luns_gone`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub luns_gone: Vec<(String, String)>,
}

impl ScsiScan {
    /// The disks whose path goes through this iSCSI session or FC remote port (by sysfs name).
    /// An empty result for a session means it has no LUNs left and may be logged out.
    pub fn disks_through<'a>(&'a self, transport: &'a str) -> impl Iterator<Item = &'a ScsiDisk> + 'a {
        self.disks.iter().filter(move |d| match &d.transport {
            Transport::Iscsi { session } => session == transport,
            Transport::Fc { rport } => rport == transport,
            Transport::Other => false,
        })
    }

    /// The session a disk goes through, if it is an iSCSI disk.
    pub fn session_of(&self, disk: &ScsiDisk) -> Option<&IscsiSession> {
        let Transport::Iscsi { session } = &disk.transport else { return None };
        self.iscsi_sessions.iter().find(|s| &s.name == session)
    }

    /// The remote port a disk goes through, if it is an FC disk.
    pub fn rport_of(&self, disk: &ScsiDisk) -> Option<&FcRemotePort> {
        let Transport::Fc { rport } = &disk.transport else { return None };
        self.fc_remote_ports.iter().find(|r| &r.name == rport)
    }
}

/// Disks, iSCSI sessions and FC remote ports.
pub fn scan(host: &HostRoot) -> Result<ScsiScan, DiscoverError> {
    let disks = scan_disks(host)?;
    let iscsi: Vec<(String, String)> = disks
        .iter()
        .filter(|d| matches!(d.transport, Transport::Iscsi { .. }))
        .map(|d| (d.name.to_string(), d.address.to_string()))
        .collect();
    Ok(ScsiScan {
        luns_gone: super::iscsi::read_luns_gone(host, &iscsi),
        disks,
        iscsi_sessions: scan_iscsi_sessions(host)?,
        fc_remote_ports: scan_fc_remote_ports(host)?,
    })
}

/// Every `sdX` under `/sys/class/block` (partitions excluded), sorted by name.
pub fn scan_disks(host: &HostRoot) -> Result<Vec<ScsiDisk>, DiscoverError> {
    let class = host.sys_class_block();
    let mut out = Vec::new();
    for name in list_dir(&class)? {
        if is_disk_name(&name) {
            let dir = class.join(&name);
            match read_disk(&dir, &name) {
                Ok(Some(d)) => out.push(d),
                Ok(None) => {}
                Err(_) if super::blockdev::vanished(&dir) => {} // deleted while we read it
                Err(e) => return Err(e),
            }
        }
    }
    Ok(out)
}

fn is_disk_name(name: &str) -> bool {
    name.strip_prefix("sd").is_some_and(|r| !r.is_empty() && r.bytes().all(|b| b.is_ascii_lowercase()))
}

/// One `sdX`; `Ok(None)` when it vanished while we looked.
fn read_disk(dir: &Path, name: &str) -> Result<Option<ScsiDisk>, DiscoverError> {
    let Some((name, devnum)) = super::read_name_and_dev(dir, name)? else { return Ok(None) };
    let link = dir.join("device");
    let target = std::fs::read_link(&link).map_err(|e| DiscoverError::read(&link, e))?;
    let hctl = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let address = hctl.parse().map_err(|_| DiscoverError::attr(&link, &hctl, "a link to H:C:T:L"))?;
    let device = dir.join("device");
    let state_path = device.join("state");
    let state_text = read_attr(&state_path)?;
    let state = ScsiState::parse(state_text.trim())
        .ok_or_else(|| DiscoverError::attr(&state_path, &state_text, "a SCSI device state"))?;
    let real = std::fs::canonicalize(dir).map_err(|e| DiscoverError::read(dir, e))?;
    Ok(Some(ScsiDisk {
        name,
        devnum,
        address,
        state,
        vendor: read_attr(&device.join("vendor"))?.trim().to_owned(),
        model: read_attr(&device.join("model"))?.trim().to_owned(),
        wwid: read_attr_opt(&device.join("wwid"))?.map(|w| w.trim().to_owned()).filter(|w| !w.is_empty()),
        ioerr_cnt: read_hex(&device.join("ioerr_cnt"))?,
        iorequest_cnt: read_hex(&device.join("iorequest_cnt"))?,
        transport: transport_of(&real),
    }))
}

/// The session or remote port named in a disk's resolved sysfs path.
fn transport_of(real: &Path) -> Transport {
    for c in real.components() {
        let Component::Normal(c) = c else { continue };
        let c = c.to_string_lossy();
        if is_session_name(&c) {
            return Transport::Iscsi { session: c.into_owned() };
        }
        if is_rport_name(&c) {
            return Transport::Fc { rport: c.into_owned() };
        }
    }
    Transport::Other
}

fn is_session_name(s: &str) -> bool {
    s.strip_prefix("session").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// `rport-H:B-R`.
fn is_rport_name(s: &str) -> bool {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = s.strip_prefix("rport-") else { return false };
    let Some((hb, r)) = rest.split_once('-') else { return false };
    let Some((h, b)) = hb.split_once(':') else { return false };
    digits(h) && digits(b) && digits(r)
}

/// A counter the kernel prints as `0x%llx`.
fn read_hex(path: &Path) -> Result<u64, DiscoverError> {
    let s = read_attr(path)?;
    s.trim()
        .strip_prefix("0x")
        .filter(|h| !h.is_empty())
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(|| DiscoverError::attr(path, &s, "expected a 0x-prefixed hex number"))
}

/// Every `/sys/class/iscsi_session/session<N>`, sorted by name.
pub fn scan_iscsi_sessions(host: &HostRoot) -> Result<Vec<IscsiSession>, DiscoverError> {
    let class = host.sys().join("class/iscsi_session");
    let mut out = Vec::new();
    for name in list_dir(&class)? {
        if !is_session_name(&name) {
            continue;
        }
        let dir = class.join(&name);
        let state_path = dir.join("state");
        let Some(state_text) = read_attr_opt(&state_path)? else { continue }; // logged out meanwhile
        let state = match state_text.trim() {
            "LOGGED_IN" => IscsiSessionState::LoggedIn,
            "FAILED" => IscsiSessionState::Failed,
            "FREE" => IscsiSessionState::Free,
            _ => return Err(DiscoverError::attr(&state_path, &state_text, "LOGGED_IN, FAILED or FREE")),
        };
        let detail = super::iscsi::read_detail(host, &dir, &name)?;
        out.push(IscsiSession {
            targetname: read_attr(&dir.join("targetname"))?.trim().to_owned(),
            state,
            name,
            detail,
        });
    }
    Ok(out)
}

/// Every `/sys/class/fc_remote_ports/rport-H:B-R`, sorted by name.
pub fn scan_fc_remote_ports(host: &HostRoot) -> Result<Vec<FcRemotePort>, DiscoverError> {
    let class = host.sys().join("class/fc_remote_ports");
    let mut out = Vec::new();
    for name in list_dir(&class)? {
        if !is_rport_name(&name) {
            continue;
        }
        let dir = class.join(&name);
        let state_path = dir.join("port_state");
        let Some(state_text) = read_attr_opt(&state_path)? else { continue }; // deleted meanwhile
        let port_state = FcPortState::parse(state_text.trim())
            .ok_or_else(|| DiscoverError::attr(&state_path, &state_text, "an FC port state"))?;
        out.push(FcRemotePort {
            port_name: read_wwn(&dir.join("port_name"))?,
            node_name: read_wwn(&dir.join("node_name"))?,
            port_id: read_attr_opt(&dir.join("port_id"))?.map(|s| s.trim().to_owned()),
            port_state,
            name,
        });
    }
    Ok(out)
}

fn read_wwn(path: &Path) -> Result<Wwn, DiscoverError> {
    read_hex(path).map(Wwn).map_err(|e| match e {
        DiscoverError::Attr { path, value, .. } => {
            DiscoverError::Attr { path, value, expected: "a 0x-prefixed world wide name" }
        }
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISCSI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/iscsi");
    const FC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/fc");
    const INCIDENT3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/multipath-incident3");

    #[test]
    fn addresses_and_names() {
        let a: ScsiAddress = "3:0:0:1".parse().expect("hctl");
        assert_eq!(a, ScsiAddress { host: 3, channel: 0, target: 0, lun: 1 });
        assert_eq!(a.to_string(), "3:0:0:1");
        for bad in ["", "3:0:0", "3:0:0:1:2", "a:0:0:1", "3::0:1", "target3:0:0"] {
            assert!(bad.parse::<ScsiAddress>().is_err(), "{bad}");
        }
        assert!(is_disk_name("sdc") && is_disk_name("sdaa"));
        assert!(!is_disk_name("sdc1") && !is_disk_name("sd") && !is_disk_name("sr0"));
        assert!(is_rport_name("rport-5:0-2") && !is_rport_name("rport-5:0") && !is_rport_name("rport-:0-1"));
        assert!(is_session_name("session12") && !is_session_name("session") && !is_session_name("sessionx"));
    }

    #[test]
    fn iscsi_tree() {
        let s = scan(&HostRoot::new(ISCSI)).expect("scan");
        let names: Vec<&str> = s.disks.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["sdc", "sdd", "sde", "sdf"]);

        let sdc = &s.disks[0];
        assert_eq!(sdc.devnum, DevNum::new(8, 32));
        assert_eq!(sdc.address.to_string(), "3:0:0:1");
        assert_eq!(sdc.state, ScsiState::Running);
        assert_eq!((sdc.vendor.as_str(), sdc.model.as_str()), ("HUAWEI", "XSG1"));
        assert_eq!(sdc.wwid.as_deref(), Some("naa.618cf24100f8f457014a764c0000021a"));
        assert_eq!(sdc.multipath_wwid().as_deref(), Some("3618cf24100f8f457014a764c0000021a"));
        assert_eq!((sdc.ioerr_cnt, sdc.iorequest_cnt), (0x1, 0x1a4));
        let session = s.session_of(sdc).expect("session");
        assert_eq!(session.name, "session1");
        assert_eq!(session.state, IscsiSessionState::LoggedIn);
        assert!(session.targetname.starts_with("iqn.2006-08.com.huawei:oceanstor:"));
        assert_eq!(session.detail.sid, 1);
        assert_eq!(session.detail.portal().as_deref(), Some("192.168.10.20:3260"));
        let host = session.detail.host.as_ref().expect("iscsi_host");
        assert_eq!(
            (host.name.as_str(), host.ipaddress.as_deref(), host.netdev.as_deref()),
            ("host3", Some("192.168.12.5"), None)
        );

        let sdd = &s.disks[1];
        assert_eq!(sdd.state, ScsiState::TransportOffline);
        assert_eq!(
            s.session_of(sdd).map(|x| (x.name.as_str(), x.state)),
            Some(("session2", IscsiSessionState::Failed))
        );
        assert_eq!(sdd.ioerr_cnt, 0x2);

        // session3 is logged in with no LUN left: the one a teardown may log out of.
        let empty: Vec<&str> = s
            .iscsi_sessions
            .iter()
            .filter(|x| s.disks_through(&x.name).next().is_none())
            .map(|x| x.name.as_str())
            .collect();
        assert_eq!(empty, ["session3"]);
        assert_eq!(s.disks_through("session4").count(), 2);
        assert!(s.fc_remote_ports.is_empty());
    }

    #[test]
    fn fc_tree() {
        let s = scan(&HostRoot::new(FC)).expect("scan");
        assert!(s.iscsi_sessions.is_empty());
        let online = &s.disks[0];
        assert_eq!((online.name.as_str(), online.state), ("sdd", ScsiState::Running));
        assert_eq!(online.address, ScsiAddress { host: 5, channel: 0, target: 0, lun: 1 });
        let r = s.rport_of(online).expect("rport");
        assert_eq!((r.name.as_str(), r.port_state), ("rport-5:0-2", FcPortState::Online));
        assert_eq!(r.port_name.to_string(), "0x500507680b215660");
        assert_eq!(r.port_id.as_deref(), Some("0x010600"));
        assert_eq!(serde_json::to_string(&r.node_name).expect("json"), "\"0x500507680b005660\"");

        let blocked = &s.disks[1];
        assert_eq!((blocked.name.as_str(), blocked.state), ("sde", ScsiState::Blocked));
        let r = s.rport_of(blocked).expect("rport");
        assert_eq!((r.name.as_str(), r.port_state), ("rport-5:0-3", FcPortState::Blocked));
        assert_eq!(s.disks_through("rport-5:0-3").count(), 1);
    }

    #[test]
    fn incident3_paths() {
        let s = scan(&HostRoot::new(INCIDENT3)).expect("scan");
        let d: Vec<(&str, DevNum, String, Option<String>)> = s
            .disks
            .iter()
            .map(|d| (d.name.as_str(), d.devnum, d.address.to_string(), d.multipath_wwid()))
            .collect();
        let wwid = Some("3618cf24100f8f457014a764c000001f6".to_owned());
        assert_eq!(
            d,
            [
                ("sdi", DevNum::new(8, 128), "39:0:0:1".to_owned(), wwid.clone()),
                ("sdj", DevNum::new(8, 144), "38:0:0:1".to_owned(), wwid),
            ]
        );
        // Incident 3's `multipath -ll` says "failed faulty running": the kernel still calls the
        // SCSI devices running; only the map's status line shows the paths failed.
        assert!(s.disks.iter().all(|d| d.state == ScsiState::Running && d.vendor == "HUAWEI"));
        assert!(s.disks.iter().all(|d| s.rport_of(d).is_some_and(|r| r.port_state == FcPortState::Online)));
    }

    #[test]
    fn block_device_scanner_reads_the_same_trees() {
        for root in [ISCSI, FC, INCIDENT3] {
            let devs = crate::discover::blockdev::scan(&HostRoot::new(root)).expect(root);
            assert!(devs
                .iter()
                .all(|d| d.name.as_str().starts_with("dm-") || d.kind == crate::model::DeviceKind::Disk));
        }
        let devs = crate::discover::blockdev::scan(&HostRoot::new(INCIDENT3)).expect("incident3");
        let sdi = devs.iter().find(|d| d.name.as_str() == "sdi").expect("sdi");
        assert_eq!(sdi.holders.iter().map(DeviceName::as_str).collect::<Vec<_>>(), ["dm-12"]);
        let dm = devs.iter().find(|d| d.name.as_str() == "dm-12").expect("dm-12");
        assert_eq!(dm.dm.as_ref().map(|i| i.name.as_str()), Some("mpathb"));
        assert_eq!(dm.slaves.len(), 2);
    }

    #[test]
    fn malformed_attributes_name_the_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = dir.path().join("sys/devices/x/host0/target0:0:0/0:0:0:0");
        std::fs::create_dir_all(dev.join("block/sda")).expect("mkdir");
        for (k, v) in [("state", "running\n"), ("vendor", "ATA     \n"), ("model", "X\n")] {
            std::fs::write(dev.join(k), v).expect("write");
        }
        std::fs::write(dev.join("ioerr_cnt"), "12\n").expect("write");
        std::fs::write(dev.join("iorequest_cnt"), "0x0\n").expect("write");
        std::fs::write(dev.join("block/sda/dev"), "8:0\n").expect("write");
        std::os::unix::fs::symlink("../../../0:0:0:0", dev.join("block/sda/device")).expect("link");
        std::fs::create_dir_all(dir.path().join("sys/class/block")).expect("mkdir");
        std::os::unix::fs::symlink(dev.join("block/sda"), dir.path().join("sys/class/block/sda"))
            .expect("link");
        let host = HostRoot::new(dir.path());
        let e = scan_disks(&host).expect_err("decimal counter").to_string();
        assert!(e.contains("ioerr_cnt") && e.contains("'12'"), "{e}");
        std::fs::write(dev.join("ioerr_cnt"), "0x0\n").expect("write");
        std::fs::write(dev.join("state"), "sleepy\n").expect("write");
        let e = scan_disks(&host).expect_err("state").to_string();
        assert!(e.contains("sda/device/state") && e.contains("sleepy"), "{e}");
        std::fs::write(dev.join("state"), "offline\n").expect("write");
        let d = scan_disks(&host).expect("ok").remove(0);
        assert_eq!((d.state, d.wwid, d.transport), (ScsiState::Offline, None, Transport::Other));
    }
}
