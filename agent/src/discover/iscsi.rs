//! iSCSI sessions in detail: what a session is logged in to (target, portal, iface), its
//! connections and its host, from sysfs only. The names are the kernel's own
//! (drivers/scsi/scsi_transport_iscsi.c, `iscsi_session_attrs`, `iscsi_conn_attrs`,
//! `iscsi_host_attrs`; iscsi_tcp exposes `persistent_address`/`persistent_port`,
//! `address`/`port` per connection and `netdev`, `hwaddress`, `ipaddress`, `initiatorname` per
//! host).
//!
//! ```text
//! /sys/class/iscsi_session/session1 -> ../../devices/platform/host3/session1/iscsi_session/session1
//!   targetname "iqn.2003-01.org.linux-iscsi.x:sn.1"   state "LOGGED_IN" | "FAILED" | "FREE"
//!   tpgt "1"  recovery_tmo "120"  ifacename "default"  initiatorname "iqn.1993-08.org.debian:01:x"
//!   target_state "SCANNED"
//! /sys/class/iscsi_connection/connection1:0 -> ../../devices/platform/host3/session1/connection1:0/iscsi_connection/connection1:0
//!   persistent_address "192.168.12.30"  persistent_port "3260"  address ...  port ...
//!   state "up" | "down" | "failed" | "bound"   (Linux 5.7+; older kernels have no `state`)
//! /sys/devices/platform/host3/iscsi_host/host3
//!   netdev, hwaddress, ipaddress, initiatorname   (reading `ipaddress` of a host whose
//!   connection is not bound fails with ENOTCONN: such a value is simply absent)
//! ```
//! The session ID (`iscsiadm -m session -r SID`) is the number in `session<SID>`; the portal is
//! the persistent address and port of connection 0 (the one iscsiadm logged in to), else its
//! current one. Nothing here reads a disk.

use std::path::Path;

use serde::Serialize;

use super::{list_dir, read_attr_opt, DiscoverError};
use crate::host::HostRoot;

/// One iSCSI connection (`connection<SID>:<CID>`).
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IscsiConnection {
    /// `connection1:0`.
    pub name: String,
    pub persistent_address: Option<String>,
    pub persistent_port: Option<u16>,
    pub address: Option<String>,
    pub port: Option<u16>,
    /// `up`, `down`, `failed`, `bound` (`None`: a kernel without the attribute).
    pub state: Option<String>,
}

impl IscsiConnection {
    /// `ADDRESS:PORT` (`[ADDRESS]:PORT` for IPv6), persistent values first.
    pub fn portal(&self) -> Option<String> {
        let (addr, port) = match (&self.persistent_address, self.persistent_port) {
            (Some(a), Some(p)) if !a.is_empty() => (a, p),
            _ => (self.address.as_ref().filter(|a| !a.is_empty())?, self.port?),
        };
        Some(if addr.contains(':') { format!("[{addr}]:{port}") } else { format!("{addr}:{port}") })
    }

    /// The kernel says this connection is lost (a kernel without `state` says nothing).
    pub fn is_down(&self) -> bool {
        matches!(self.state.as_deref(), Some("down" | "failed"))
    }
}

/// The SCSI host an iSCSI session lives on (`iscsi_host/host<H>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IscsiHost {
    /// `host3`.
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netdev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ipaddress: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hwaddress: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initiatorname: Option<String>,
}

/// What a session is logged in to, beyond its name, target and state.
#[serde_with::skip_serializing_none]
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IscsiDetail {
    /// The `SID` of `session<SID>`.
    pub sid: u32,
    pub tpgt: Option<u32>,
    /// Seconds a FAILED session waits to be re-established before its disks go
    /// `transport-offline` (`-1`: forever).
    pub recovery_tmo: Option<i64>,
    pub ifacename: Option<String>,
    pub initiatorname: Option<String>,
    /// `UNBOUND`, `ALLOCATED`, `SCANNED`, `UNBINDING` (Linux 5.13+).
    pub target_state: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<IscsiConnection>,
    pub host: Option<IscsiHost>,
}

impl IscsiDetail {
    /// The portal of its lowest-numbered connection (connection 0: the login).
    pub fn portal(&self) -> Option<String> {
        self.connections.iter().find_map(IscsiConnection::portal)
    }
}

/// `session<SID>` → SID.
pub fn sid_of(name: &str) -> Option<u32> {
    let n = name.strip_prefix("session")?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    n.parse().ok()
}

/// An attribute's text, or `None` when it is absent, empty, `(null)`, or its read is refused by
/// the driver: iscsi_tcp answers `address`/`port` of a connection with no socket (a FAILED
/// session) with ENOTCONN (measured on Debian's 6.1 kernel), and `ipaddress` of an unbound host
/// the same way. Such a value is simply not known; the scan goes on.
fn opt_text(path: &Path) -> Option<String> {
    match read_attr_opt(path) {
        Ok(v) => v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty() && s != "(null)"),
        Err(_) => None,
    }
}

/// A number, when [`opt_text`] has one; a malformed one is an error naming the file.
fn opt_num<T: std::str::FromStr>(path: &Path) -> Result<Option<T>, DiscoverError> {
    match opt_text(path) {
        None => Ok(None),
        Some(s) => s.parse().map(Some).map_err(|_| DiscoverError::attr(path, &s, "a number")),
    }
}

/// The detail of `session<SID>`, whose class directory is `dir`.
pub fn read_detail(host: &HostRoot, dir: &Path, name: &str) -> Result<IscsiDetail, DiscoverError> {
    let sid = sid_of(name).ok_or_else(|| DiscoverError::attr(dir, name, "session<SID>"))?;
    let mut d = IscsiDetail {
        sid,
        tpgt: opt_num(&dir.join("tpgt"))?,
        recovery_tmo: opt_num(&dir.join("recovery_tmo"))?,
        ifacename: opt_text(&dir.join("ifacename")),
        initiatorname: opt_text(&dir.join("initiatorname")),
        target_state: opt_text(&dir.join("target_state")),
        connections: read_connections(host, sid)?,
        host: None,
    };
    // .../hostH/session<SID>/iscsi_session/session<SID>: the host is three levels up.
    if let Ok(real) = std::fs::canonicalize(dir) {
        if let Some(h) = real.ancestors().nth(3) {
            d.host = read_host(h);
        }
    }
    Ok(d)
}

/// `connection<SID>:<CID>` of one session, by CID.
fn read_connections(host: &HostRoot, sid: u32) -> Result<Vec<IscsiConnection>, DiscoverError> {
    let class = host.sys().join("class/iscsi_connection");
    let prefix = format!("connection{sid}:");
    let mut out: Vec<(u32, IscsiConnection)> = Vec::new();
    for name in list_dir(&class)? {
        let Some(cid) = name.strip_prefix(&prefix).and_then(|c| c.parse::<u32>().ok()) else { continue };
        let dir = class.join(&name);
        let c = IscsiConnection {
            persistent_address: opt_text(&dir.join("persistent_address")),
            persistent_port: opt_num(&dir.join("persistent_port"))?,
            address: opt_text(&dir.join("address")),
            port: opt_num(&dir.join("port"))?,
            state: opt_text(&dir.join("state")),
            name,
        };
        out.push((cid, c));
    }
    out.sort_by_key(|(cid, _)| *cid);
    Ok(out.into_iter().map(|(_, c)| c).collect())
}

/// `hostH/iscsi_host/hostH`, when there is one.
fn read_host(host_dir: &Path) -> Option<IscsiHost> {
    let name = host_dir.file_name()?.to_str()?.to_owned();
    if !name.strip_prefix("host").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())) {
        return None;
    }
    let dir = host_dir.join("iscsi_host").join(&name);
    if !dir.is_dir() {
        return Some(IscsiHost { name, ..IscsiHost::default() });
    }
    Some(IscsiHost {
        netdev: opt_text(&dir.join("netdev")),
        ipaddress: opt_text(&dir.join("ipaddress")),
        hwaddress: opt_text(&dir.join("hwaddress")),
        initiatorname: opt_text(&dir.join("initiatorname")),
        name,
    })
}

/// The `targetname` of a session, for the re-check before a logout.
pub fn targetname(host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
    let dir = host.sys().join(format!("class/iscsi_session/session{sid}"));
    Ok(read_attr_opt(&dir.join("targetname"))?.map(|s| s.trim().to_owned()))
}

/// Whether any SCSI device (any LUN, disk or not) still sits on the session: its
/// `target*/H:C:T:L` directories under the session's device directory.
pub fn scsi_devices_of(host: &HostRoot, sid: u32) -> Result<Vec<String>, DiscoverError> {
    let dir = host.sys().join(format!("class/iscsi_session/session{sid}"));
    let real = std::fs::canonicalize(&dir).map_err(|e| DiscoverError::read(&dir, e))?;
    // .../session<SID>/iscsi_session/session<SID> → .../session<SID>
    let Some(session_dir) = real.ancestors().nth(2) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for t in list_dir(session_dir)? {
        if !t.starts_with("target") {
            continue;
        }
        for lun in list_dir(&session_dir.join(&t))? {
            if is_hctl(&lun) {
                out.push(lun);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A SCSI device directory's name: `H:C:T:L`, four numbers (the LUN may be 64-bit).
fn is_hctl(name: &str) -> bool {
    let parts: Vec<&str> = name.split(':').collect();
    parts.len() == 4 && parts.iter().all(|p| !p.is_empty() && p.parse::<u64>().is_ok())
}

/// The state text of a session (`None`: gone).
pub fn state(host: &HostRoot, sid: u32) -> Result<Option<String>, DiscoverError> {
    let p = host.sys().join(format!("class/iscsi_session/session{sid}/state"));
    Ok(read_attr_opt(&p)?.map(|s| s.trim().to_owned()))
}

/// Re-reads one session's detail (`None`: gone).
pub fn detail(host: &HostRoot, sid: u32) -> Result<Option<IscsiDetail>, DiscoverError> {
    let name = format!("session{sid}");
    let dir = host.sys().join("class/iscsi_session").join(&name);
    if read_attr_opt(&dir.join("state"))?.is_none() {
        return Ok(None);
    }
    read_detail(host, &dir, &name).map(Some)
}

/// What the kernel log says about a SCSI disk (`sd H:C:T:L: [sdX] ...` records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SdEvent {
    /// `Attached SCSI disk`: this incarnation of the name and address began.
    Attached,
    /// `Add. Sense: Logical unit not supported` (ASC 0x25): the target answered a command with
    /// "no such LUN" on this I_T nexus: the array unmapped the volume.
    NotSupported,
}

/// `(H:C:T:L, sdX, event, evidence)` of one kmsg record, when it is one the LUN check needs.
/// Only the kernel's own records (facility 0) count: `/dev/kmsg` takes writes from user space
/// (facility >= 1), and a forged line must never make a healthy LUN look gone (gotcha 26).
///
/// `sd ` must start the message, the address be `H:C:T:L` in numbers and the name a kernel disk
/// name (`sd` and letters), and the rest one of the exact forms sd prints (a `tag#N ` before the
/// sense text, on newer kernels): a record that begins with a task name a user chose (a segfault
/// line, `COMM[PID]: segfault at ...`) never is one.
fn sd_record(record: &str) -> Option<(&str, &str, SdEvent, String)> {
    let k = crate::discover::kmsg::KernelRecord::parse(record)?;
    let (hctl, rest) = k.after("sd ")?.split_once(": [")?;
    let (name, what) = rest.split_once("] ")?;
    let numbers = hctl.split(':').filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).count();
    let disk =
        name.strip_prefix("sd").is_some_and(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_lowercase()));
    if numbers != 4 || hctl.split(':').count() != 4 || !disk {
        return None;
    }
    let untagged = what
        .strip_prefix("tag#")
        .and_then(|t| t.split_once(' '))
        .filter(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        .map_or(what, |(_, rest)| rest);
    let event = if what == "Attached SCSI disk" {
        SdEvent::Attached
    } else if untagged == "Add. Sense: Logical unit not supported" {
        SdEvent::NotSupported
    } else {
        return None;
    };
    Some((hctl, name, event, k.evidence()))
}

/// The disks (by name) whose LUN the target reports gone, with the kernel's record (its
/// evidence text names it a kernel record): the latest of the kernel's own records for the
/// disk's name and address since it was attached is `Logical unit not supported`; records
/// written from user space are ignored. Only these names are looked for (`wanted`: `(name, H:C:T:L)`); no record: not
/// gone (the kernel says nothing until a command reaches the LUN, see ARCHITECTURE.md).
pub fn luns_gone(
    records: impl IntoIterator<Item = String>,
    wanted: &[(String, String)],
) -> Vec<(String, String)> {
    let mut last: std::collections::HashMap<&str, (SdEvent, String)> = std::collections::HashMap::new();
    for r in records {
        let Some((hctl, name, event, msg)) = sd_record(&r) else { continue };
        if let Some((n, _)) = wanted.iter().find(|(n, a)| n == name && a == hctl) {
            last.insert(n.as_str(), (event, msg));
        }
    }
    let mut out: Vec<(String, String)> = last
        .into_iter()
        .filter(|(_, (e, _))| *e == SdEvent::NotSupported)
        .map(|(n, (_, line))| (n.to_owned(), line))
        .collect();
    out.sort();
    out
}

/// [`luns_gone`] over the kernel log (`/dev/kmsg`, read once without blocking).
pub fn read_luns_gone(host: &HostRoot, wanted: &[(String, String)]) -> Vec<(String, String)> {
    if wanted.is_empty() {
        return Vec::new();
    }
    let mut records = Vec::new();
    crate::discover::kmsg::for_each_record(host, |r| {
        if r.contains(";sd ") {
            records.push(r.to_owned());
        }
    });
    luns_gone(records, wanted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISCSI: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/iscsi");

    #[test]
    fn sids_and_portals() {
        assert_eq!(sid_of("session12"), Some(12));
        assert_eq!(sid_of("session"), None);
        assert_eq!(sid_of("sessionx"), None);
        let c = IscsiConnection {
            persistent_address: Some("fd00::1".into()),
            persistent_port: Some(3260),
            ..IscsiConnection::default()
        };
        assert_eq!(c.portal().as_deref(), Some("[fd00::1]:3260"));
        let c = IscsiConnection { address: Some("10.0.0.1".into()), port: Some(3261), ..c };
        assert_eq!(c.portal().as_deref(), Some("[fd00::1]:3260"), "persistent first");
        let c = IscsiConnection { persistent_address: None, ..c };
        assert_eq!(c.portal().as_deref(), Some("10.0.0.1:3261"));
        assert!(!c.is_down());
        assert!(IscsiConnection { state: Some("failed".into()), ..c }.is_down());
    }

    #[test]
    fn a_lun_is_gone_when_its_latest_record_since_attach_says_so() {
        // Measured on Debian's 6.1 kernel against a LIO target whose LUN 1 was removed.
        let log = [
            "5,900,13682979,-;sd 0:0:0:1: [sdb] Attached SCSI disk",
            "3,950,23438262,-;sd 0:0:0:1: [sdb] tag#18 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK cmd_age=0s",
            "3,951,23438461,-;sd 0:0:0:1: [sdb] tag#18 Sense Key : Illegal Request [current] ",
            "3,952,23438550,-;sd 0:0:0:1: [sdb] tag#18 Add. Sense: Logical unit not supported",
            "3,953,23438550,-;sd 0:0:0:2: [sdc] tag#19 Add. Sense: Logical unit not supported",
            "5,960,30000000,-;sd 0:0:0:2: [sdc] Attached SCSI disk",
            "3,961,30000001,-;sd 0:0:0:3: [sdd] tag#1 Add. Sense: Logical unit not supported",
        ]
        .map(String::from);
        let wanted = [("sdb", "0:0:0:1"), ("sdc", "0:0:0:2"), ("sdd", "0:0:0:4")]
            .map(|(n, a)| (n.to_owned(), a.to_owned()));
        let gone = luns_gone(log, &wanted);
        // sdc was attached again after its error (a new incarnation); sdd's record is for
        // another address (the name was reused).
        assert_eq!(
            gone,
            [(
                "sdb".to_owned(),
                "kernel record #952 at 23.438550 s, facility kern: sd 0:0:0:1: [sdb] tag#18 Add. Sense: Logical unit not supported".to_owned()
            )]
        );
        // The same line written from user space (facility 1: PRIORITY 8 + level) is no
        // evidence: a healthy LUN with a forged record stays not gone.
        let forged = [
            "5,900,13682979,-;sd 0:0:0:1: [sdb] Attached SCSI disk",
            "11,990,23438999,-;sd 0:0:0:1: [sdb] tag#18 Add. Sense: Logical unit not supported",
        ]
        .map(String::from);
        assert!(luns_gone(forged.clone(), &wanted).is_empty(), "a user-space record is not the kernel's");
        let mut kern = forged;
        kern[1] = kern[1].replacen("11,", "3,", 1);
        assert_eq!(luns_gone(kern, &wanted).len(), 1, "the same text from the kernel counts");
        assert!(read_luns_gone(&HostRoot::new("/nonexistent"), &wanted).is_empty());
        // Facility-0 lines a user can shape (a task name, an executable's name): never evidence.
        let hostile = [
            "5,900,13682979,-;sd 0:0:0:1: [sdb] Attached SCSI disk",
            "6,991,23439000,-;sd 0:0:0:1: [a][4242]: segfault at 0 ip 0 sp 0 error 6 in Add. Sense: Logical unit not supported[1+1] likely on CPU 0 (core 0, socket 0)",
            "3,992,23439001,-;sd 0:0:0:1: [sdb] tag#18 Add. Sense: Logical unit not supported[4242]: segfault at 0",
            "3,993,23439002,-;sd 0:0:0:1: [sdb] x Add. Sense: Logical unit not supported",
            "3,994,23439003,-;sd 0:0:0:1x: [sdb] Add. Sense: Logical unit not supported",
            "3,995,23439004,-;sd 0:0:0:1: [sdB] Add. Sense: Logical unit not supported",
            "3,996,23439005,-; sd 0:0:0:1: [sdb] Add. Sense: Logical unit not supported",
        ]
        .map(String::from);
        assert!(luns_gone(hostile, &wanted).is_empty(), "none of these is sd's word");
        let untagged = [
            "5,900,13682979,-;sd 0:0:0:1: [sdb] Attached SCSI disk",
            "3,997,23439006,-;sd 0:0:0:1: [sdb] Add. Sense: Logical unit not supported",
        ]
        .map(String::from);
        assert_eq!(luns_gone(untagged, &wanted).len(), 1, "an older kernel's line without tag#N counts");
    }

    #[test]
    fn fixture_sessions() {
        let host = HostRoot::new(ISCSI);
        let dir = host.sys().join("class/iscsi_session/session3");
        let d = read_detail(&host, &dir, "session3").expect("detail");
        assert_eq!(d.sid, 3);
        assert_eq!(d.tpgt, Some(1));
        assert_eq!(d.recovery_tmo, Some(120));
        assert_eq!(d.ifacename.as_deref(), Some("default"));
        assert_eq!(d.initiatorname.as_deref(), Some("iqn.1993-08.org.debian:01:5a1c2f3e4d5b"));
        assert_eq!(d.portal().as_deref(), Some("192.168.12.30:3260"));
        assert_eq!(d.connections.len(), 1);
        assert_eq!(d.connections[0].name, "connection3:0");
        assert_eq!(d.connections[0].state.as_deref(), Some("up"));
        assert_eq!(d.host.as_ref().map(|h| h.name.as_str()), Some("host5"));
        assert_eq!(scsi_devices_of(&host, 3).expect("luns"), Vec::<String>::new());
        assert_eq!(scsi_devices_of(&host, 1).expect("luns"), ["3:0:0:1"]);
        assert_eq!(
            targetname(&host, 3).expect("t").as_deref(),
            Some("iqn.2003-01.org.linux-iscsi.store1.x8664:sn.4b1e4f9c2d7a")
        );
        assert_eq!(state(&host, 9).expect("gone"), None);
        assert_eq!(detail(&host, 9).expect("gone"), None);
        assert_eq!(detail(&host, 3).expect("d"), Some(d));
    }
}
