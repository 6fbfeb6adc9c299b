//! Multipath maps and SCSI disks as the graph shows them: per map its paths with their state
//! (from the dm status line) and SCSI state, per disk its state, transport and the map it serves.
//! Built from a [`Snapshot`] without further I/O.

use serde::Serialize;

use crate::discover::dm::DmDevice;
use crate::discover::multipath::{Multipath, PathState};
use crate::discover::scsi::{IscsiSession, IscsiSessionState, ScsiDisk, ScsiScan, ScsiState, Transport};
use crate::graph::outage::{self, Outage, TransportObject};
use crate::model::{DevNum, DeviceName};

/// One path of a multipath map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PathView {
    pub devnum: DevNum,
    /// The SCSI disk behind the path, when sysfs names it.
    pub device: Option<DeviceName>,
    /// `active` or `failed`, from the map's status line.
    pub state: &'static str,
    pub fail_count: u32,
    /// The disk's SCSI state (`running`, `offline`, `transport-offline`, ...).
    pub scsi_state: Option<String>,
}

/// A device-mapper multipath map.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MultipathView {
    pub name: String,
    pub uuid: String,
    pub wwid: String,
    /// Openers, from the dm ioctl (`None` when only sysfs could be read).
    pub open_count: Option<u32>,
    pub suspended: bool,
    /// `None` when the table and status could not be read (sysfs only).
    pub queue_if_no_path: Option<bool>,
    pub paths: Vec<PathView>,
    pub active_paths: usize,
    /// Queueing with no active path: any I/O to the map hangs until queueing is stopped.
    pub io_would_hang: bool,
    /// kpartx partition maps on top of it.
    pub partitions: Vec<DeviceName>,
}

/// A SCSI disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ScsiView {
    #[serde(flatten)]
    pub disk: ScsiDisk,
    /// The state of its iSCSI session or FC remote port, when it has one.
    pub transport_state: Option<String>,
    /// The multipath map it is a path of.
    pub path_of: Option<DeviceName>,
    /// Its iSCSI session (target, portal, iface, SID), when it goes through one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<IscsiSession>,
    /// Every session to its session's target or portal is down: an outage
    /// ([`crate::graph::outage`]), never cleaned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outage: Option<Outage>,
    /// Its iSCSI target answered a command with LOGICAL UNIT NOT SUPPORTED since the disk was
    /// attached (the kernel log's line): the array unmapped the LUN.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun_gone: Option<String>,
}

impl ScsiView {
    /// Offline for good, as far as the kernel says (`blocked` is a transport recovering).
    pub fn is_offline(&self) -> bool {
        matches!(self.disk.state, ScsiState::Offline | ScsiState::TransportOffline)
    }

    /// The kernel has given up on it, or its target said its LUN is gone (and its session is
    /// in no outage): what makes an unheld standalone disk a cleanup candidate.
    pub fn is_dead(&self) -> bool {
        self.outage.is_none() && (self.is_offline() || self.lun_gone.is_some())
    }
}

fn state_text<T: Serialize>(v: &T) -> Option<String> {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_owned))
}

/// The multipath view of a dm device, if it is a multipath map.
pub fn multipath_view(
    dm: &DmDevice,
    all_dm: &[DmDevice],
    scsi: &ScsiScan,
    by_devnum: &dyn Fn(DevNum) -> Option<DeviceName>,
) -> Option<MultipathView> {
    let wwid = dm.multipath_wwid()?.to_owned();
    let parsed: Option<Multipath> = dm.multipath().ok().flatten();
    let paths: Vec<PathView> = match &parsed {
        Some(m) => m
            .status
            .paths()
            .map(|p| {
                let device = by_devnum(p.dev);
                let scsi_state = device
                    .as_ref()
                    .and_then(|n| scsi.disks.iter().find(|d| &d.name == n))
                    .and_then(|d| state_text(&d.state));
                PathView {
                    devnum: p.dev,
                    device,
                    state: if p.state == PathState::Active { "active" } else { "failed" },
                    fail_count: p.fail_count,
                    scsi_state,
                }
            })
            .collect(),
        None => Vec::new(),
    };
    let partitions = all_dm
        .iter()
        .filter(|p| p.partition_of().is_some_and(|(_, parent)| parent == dm.uuid))
        .map(|p| p.kernel_name.clone())
        .collect();
    Some(MultipathView {
        name: dm.name.clone(),
        uuid: dm.uuid.clone(),
        wwid,
        open_count: dm.open_count,
        suspended: dm.suspended,
        queue_if_no_path: parsed.as_ref().map(|m| m.table.features.queue_if_no_path),
        active_paths: paths.iter().filter(|p| p.state == "active").count(),
        io_would_hang: parsed.as_ref().is_some_and(Multipath::io_would_hang),
        paths,
        partitions,
    })
}

/// The SCSI view of a disk.
pub fn scsi_view(disk: &ScsiDisk, scsi: &ScsiScan, path_of: Option<DeviceName>) -> ScsiView {
    let transport_state = match &disk.transport {
        Transport::Iscsi { session } => {
            scsi.iscsi_sessions.iter().find(|s| &s.name == session).and_then(|s| state_text(&s.state))
        }
        Transport::Fc { rport } => {
            scsi.fc_remote_ports.iter().find(|r| &r.name == rport).and_then(|r| state_text(&r.port_state))
        }
        Transport::Other => None,
    };
    let session = scsi.session_of(disk).cloned();
    // A live session is in no outage: the groups are only computed around a dead one.
    let outage = session.as_ref().filter(|s| !session_is_live(s, scsi)).and_then(|s| {
        let outages = iscsi_outages(scsi);
        outage::of(&outages, &s.name).cloned()
    });
    let lun_gone = scsi.luns_gone.iter().find(|(n, _)| n == disk.name.as_str()).map(|(_, line)| line.clone());
    ScsiView { disk: disk.clone(), transport_state, path_of, session, outage, lun_gone }
}

/// Whether the kernel says an iSCSI session works: logged in, no connection down or failed,
/// and (when it has disks) not every disk blocked or transport-offline.
pub fn session_is_live(s: &IscsiSession, scsi: &ScsiScan) -> bool {
    let disks: Vec<&ScsiDisk> = scsi.disks_through(&s.name).collect();
    let all_blocked = !disks.is_empty()
        && disks.iter().all(|d| {
            matches!(d.state, ScsiState::Blocked | ScsiState::CreatedBlocked | ScsiState::TransportOffline)
        });
    s.state == IscsiSessionState::LoggedIn
        && !s.detail.connections.iter().any(|c| c.is_down())
        && !all_blocked
}

/// The iSCSI outages of a scan: targets and portals every session to which is down.
pub fn iscsi_outages(scsi: &ScsiScan) -> Vec<Outage> {
    let objects: Vec<TransportObject> = scsi
        .iscsi_sessions
        .iter()
        .map(|s| TransportObject {
            id: s.name.clone(),
            target: s.targetname.clone(),
            address: s.detail.portal(),
            live: session_is_live(s, scsi),
        })
        .collect();
    outage::find(&objects)
}
