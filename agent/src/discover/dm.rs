//! Device-mapper devices: identity, open count, suspension, and each target's table and status
//! line, read through the control ioctls on `/dev/mapper/control` ([`scan`]), with a sysfs-only
//! fallback for hosts and fixture trees without device-mapper ([`scan_sysfs`]).
//!
//! ```text
//! ioctl:  DM_LIST_DEVICES -> name, MAJ:MIN; per device DM_DEV_STATUS -> uuid, open count, flags;
//!         DM_TABLE_STATUS (status) and DM_TABLE_STATUS|DM_STATUS_TABLE_FLAG (table)
//! sysfs:  /sys/class/block/dm-12 -> ../../devices/virtual/block/dm-12
//!           dev "253:12"  ro "0"  dm/name "mpathb"  dm/uuid "mpath-3618cf24..."  dm/suspended "0"
//!           slaves/ sdi sdj        holders/ (kpartx partition maps, LVM, ...)
//! ```
//! sysfs shows neither the open count nor the tables: a multipath map's per-path state exists
//! only in its status line, which the kernel hands out by ioctl. Fixture trees keep those lines
//! in a `dm-tables.txt` ([`parse_dump`]). The ioctls never do I/O to a mapped device, so they
//! are safe on a map that queues with no path (gotcha 12).

use crate::host::dmioctl as ioctl;

use std::io;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::multipath::{self, Multipath};
use super::{list_dir, names_in, read_attr, read_attr_opt, read_bool, DiscoverError};
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, DmInfo};

/// What the device-mapper scanner could not do, naming the device or file.
#[derive(Debug, thiserror::Error)]
pub enum DmError {
    /// No device-mapper on this host (no control node, or the driver is not loaded).
    #[error("device-mapper is not available: {}: {source}", path.display())]
    NoDeviceMapper { path: PathBuf, source: io::Error },
    #[error("cannot open {}: {source}", path.display())]
    Control { path: PathBuf, source: io::Error },
    #[error("{op} for {device}: {source}")]
    Ioctl { device: String, op: &'static str, source: io::Error },
    #[error("{device}: its table changed while it was read, three times in a row")]
    Unstable { device: String },
    #[error("{device}: malformed multipath {what} '{line}': {source}")]
    Multipath { device: String, what: &'static str, line: String, source: multipath::ParseError },
    #[error(transparent)]
    Sysfs(#[from] DiscoverError),
}

impl DmError {
    /// True when the host simply has no device-mapper: callers fall back to sysfs.
    pub fn is_absent(&self) -> bool {
        matches!(self, Self::NoDeviceMapper { .. })
    }
}

/// One target (a contiguous range of sectors) of a device's live table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DmTarget {
    /// First sector the target covers.
    pub start: u64,
    /// Sectors it covers.
    pub length: u64,
    /// `multipath`, `linear`, `striped`, `crypt`, ...
    pub target_type: String,
    /// The table line's parameters (what `dmsetup table` prints after the type).
    pub table: String,
    /// The status line's parameters (what `dmsetup status` prints after the type).
    pub status: String,
}

/// A device-mapper device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DmDevice {
    /// The kernel's name, `dm-<minor>`.
    pub kernel_name: DeviceName,
    pub devnum: DevNum,
    /// The map's name (`/dev/mapper/<name>`).
    pub name: String,
    /// Empty when the map has none; `mpath-<wwid>` for multipath maps.
    pub uuid: String,
    pub suspended: bool,
    pub read_only: bool,
    /// Openers of the device (mounts, processes, stacked devices); from the ioctl only.
    pub open_count: Option<u32>,
    /// The live table, target by target; `None` when read from sysfs, which does not show it.
    pub targets: Option<Vec<DmTarget>>,
    /// `slaves/`: the devices this map sits on.
    pub slaves: Vec<DeviceName>,
    /// `holders/`: devices stacked on this map.
    pub holders: Vec<DeviceName>,
}

impl DmDevice {
    /// The identity blockdev.rs also reports.
    pub fn info(&self) -> DmInfo {
        DmInfo { name: self.name.clone(), uuid: self.uuid.clone(), suspended: self.suspended }
    }

    /// The WWID of a multipath map (`mpath-<wwid>`), the identity that survives name reuse.
    pub fn multipath_wwid(&self) -> Option<&str> {
        self.uuid.strip_prefix("mpath-").filter(|w| !w.is_empty())
    }

    /// For a kpartx partition map (`part<N>-<parent uuid>`): the partition number and the
    /// parent map's uuid.
    pub fn partition_of(&self) -> Option<(u32, &str)> {
        let rest = self.uuid.strip_prefix("part")?;
        let (n, parent) = rest.split_once('-')?;
        let n = n.parse().ok()?;
        (!parent.is_empty()).then_some((n, parent))
    }

    /// The parsed table and status of a map whose live table is one `multipath` target.
    /// `Ok(None)` for other maps and for devices read from sysfs.
    pub fn multipath(&self) -> Result<Option<Multipath>, DmError> {
        let Some([t]) = self.targets.as_deref() else { return Ok(None) };
        if t.target_type != "multipath" {
            return Ok(None);
        }
        let err = |what, line: &str, source| DmError::Multipath {
            device: self.label(),
            what,
            line: line.chars().take(200).collect(),
            source,
        };
        let table = multipath::parse_table(&t.table).map_err(|e| err("table", &t.table, e))?;
        let status = multipath::parse_status(&t.status).map_err(|e| err("status", &t.status, e))?;
        Multipath::new(table, status).map(Some).map_err(|e| err("table/status", &t.status, e))
    }

    fn label(&self) -> String {
        format!("{} ({}, {})", self.name, self.kernel_name, self.devnum)
    }
}

/// Every device-mapper device, through the control ioctls. [`DmError::NoDeviceMapper`] when
/// the host has none (`/dev/mapper/control` absent, or the driver not loaded).
pub fn scan(host: &HostRoot) -> Result<Vec<DmDevice>, DmError> {
    let path = host.dev_node("mapper/control");
    let control = ioctl::Control::open(&path).map_err(|source| {
        let absent = source.kind() == io::ErrorKind::NotFound
            || matches!(source.raw_os_error(), Some(libc::ENODEV | libc::ENXIO));
        if absent {
            DmError::NoDeviceMapper { path: path.clone(), source }
        } else {
            DmError::Control { path: path.clone(), source }
        }
    })?;
    let list = control.list_devices().map_err(|source| DmError::Ioctl {
        device: "all devices".into(),
        op: "DM_LIST_DEVICES",
        source,
    })?;
    let mut out = Vec::with_capacity(list.len());
    for (name, dev) in list {
        match read_one(host, &control, dev) {
            Ok(d) => out.push(d),
            Err(DmError::Ioctl { source, .. }) if source.raw_os_error() == Some(libc::ENXIO) => {
                tracing::debug!(name, %dev, "device-mapper device removed while scanning");
            }
            Err(e) => return Err(e),
        }
    }
    out.sort_by_key(|d| d.devnum);
    Ok(out)
}

/// [`scan`], or [`scan_sysfs`] when the host has no device-mapper control node.
pub fn scan_any(host: &HostRoot) -> Result<Vec<DmDevice>, DmError> {
    match scan(host) {
        Err(e) if e.is_absent() => {
            tracing::debug!(error = %e, "no device-mapper control node; reading sysfs only");
            scan_sysfs(host)
        }
        other => other,
    }
}

fn read_one(host: &HostRoot, control: &ioctl::Control, dev: DevNum) -> Result<DmDevice, DmError> {
    let label = dev.to_string();
    let op_err = |op: &'static str| {
        let device = label.clone();
        move |source| DmError::Ioctl { device, op, source }
    };
    let header = control.dev_status(dev).map_err(op_err("DM_DEV_STATUS"))?;
    let device = format!("{} ({dev})", header.name);
    let mut attempts = 0;
    let targets = loop {
        let (_, table) = control.table_status(dev, true).map_err(op_err("DM_TABLE_STATUS (table)"))?;
        let (_, status) = control.table_status(dev, false).map_err(op_err("DM_TABLE_STATUS"))?;
        if let Some(t) = join_targets(table, status) {
            break t;
        }
        attempts += 1;
        if attempts == 3 {
            return Err(DmError::Unstable { device });
        }
    };
    device_from_status(host, &header, targets)
}

/// Pairs each target's table line with its status line; `None` when the two reads saw
/// different tables (the map was reloaded in between).
fn join_targets(table: Vec<ioctl::TargetSpec>, status: Vec<ioctl::TargetSpec>) -> Option<Vec<DmTarget>> {
    if table.len() != status.len() {
        return None;
    }
    table
        .into_iter()
        .zip(status)
        .map(|(t, s)| {
            let same = t.start == s.start && t.length == s.length && t.target_type == s.target_type;
            same.then_some(DmTarget {
                start: t.start,
                length: t.length,
                target_type: t.target_type,
                table: t.params,
                status: s.params,
            })
        })
        .collect()
}

/// Builds the model from a `DM_DEV_STATUS` reply, adding `slaves/` and `holders/` from sysfs.
fn device_from_status(
    host: &HostRoot,
    header: &ioctl::Header,
    targets: Vec<DmTarget>,
) -> Result<DmDevice, DmError> {
    let kernel_name = kernel_name(header.dev)?;
    let dir = host.sys_class_block().join(kernel_name.as_str());
    let open_count = u32::try_from(header.open_count).map_err(|_| DmError::Ioctl {
        device: header.name.clone(),
        op: "DM_DEV_STATUS",
        source: io::Error::new(io::ErrorKind::InvalidData, format!("open count {}", header.open_count)),
    })?;
    Ok(DmDevice {
        devnum: header.dev,
        name: header.name.clone(),
        uuid: header.uuid.clone(),
        suspended: header.flags & ioctl::DM_SUSPEND_FLAG != 0,
        read_only: header.flags & ioctl::DM_READONLY_FLAG != 0,
        open_count: Some(open_count),
        targets: Some(targets),
        slaves: names_in(&dir.join("slaves"))?,
        holders: names_in(&dir.join("holders"))?,
        kernel_name,
    })
}

/// The kernel names every mapped device `dm-<minor>`.
fn kernel_name(dev: DevNum) -> Result<DeviceName, DmError> {
    DeviceName::new(&format!("dm-{}", dev.minor)).map_err(|e| DmError::Ioctl {
        device: dev.to_string(),
        op: "DM_DEV_STATUS",
        source: io::Error::new(io::ErrorKind::InvalidData, e),
    })
}

/// Every `dm-N` under `/sys/class/block`, from sysfs alone: identity, suspension, read-only,
/// slaves and holders; no open count and no tables.
pub fn scan_sysfs(host: &HostRoot) -> Result<Vec<DmDevice>, DmError> {
    let class = host.sys_class_block();
    let mut out = Vec::new();
    for name in list_dir(&class)? {
        if !is_dm_name(&name) {
            continue;
        }
        if let Some(d) = read_sysfs(&class.join(&name), &name)? {
            out.push(d);
        }
    }
    out.sort_by_key(|d| d.devnum);
    Ok(out)
}

fn is_dm_name(name: &str) -> bool {
    name.strip_prefix("dm-").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// One `dm-N` directory; `Ok(None)` when it vanished while we looked.
fn read_sysfs(dir: &Path, name: &str) -> Result<Option<DmDevice>, DmError> {
    let Some((kernel_name, devnum)) = super::read_name_and_dev(dir, name)? else { return Ok(None) };
    let dm = dir.join("dm");
    Ok(Some(DmDevice {
        kernel_name,
        devnum,
        name: read_attr(&dm.join("name"))?,
        uuid: read_attr_opt(&dm.join("uuid"))?.unwrap_or_default(),
        suspended: read_bool(&dm.join("suspended"))?,
        read_only: read_bool(&dir.join("ro"))?,
        open_count: None,
        targets: None,
        slaves: names_in(&dir.join("slaves"))?,
        holders: names_in(&dir.join("holders"))?,
    }))
}

/// One line of a table dump.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpedTarget {
    /// The map's name.
    pub name: String,
    pub target: DmTarget,
}

/// Parses a fixture tree's `dm-tables.txt`: one target per line,
/// `<name>\t<table line>\t<status line>`, both lines as dmsetup prints them
/// (`<start> <length> <type> <parameters>`). Blank lines and `#` comments are skipped. On a
/// live host the agent reads the same lines by ioctl ([`scan`]); sysfs has no copy of them.
#[cfg(test)]
pub fn parse_dump(text: &str) -> Result<Vec<DumpedTarget>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason: String| (i + 1, reason);
        let mut f = line.split('\t');
        let (Some(name), Some(table), Some(status), None) = (f.next(), f.next(), f.next(), f.next()) else {
            return Err(err("expected <name>\\t<table>\\t<status>".into()));
        };
        let (ts, tl, tt, tp) = split_target_line(table).map_err(|e| err(format!("table: {e}")))?;
        let (ss, sl, st, sp) = split_target_line(status).map_err(|e| err(format!("status: {e}")))?;
        if (ts, tl, tt) != (ss, sl, st) {
            return Err(err("table and status lines describe different targets".into()));
        }
        out.push(DumpedTarget {
            name: name.to_owned(),
            target: DmTarget {
                start: ts,
                length: tl,
                target_type: tt.to_owned(),
                table: tp.to_owned(),
                status: sp.to_owned(),
            },
        });
    }
    Ok(out)
}

/// `<start> <length> <type> <parameters>` as dmsetup prints one target.
#[cfg(test)]
fn split_target_line(line: &str) -> Result<(u64, u64, &str, &str), String> {
    let line = line.trim();
    let mut it = line.splitn(4, ' ');
    let num = |s: Option<&str>, what: &str| -> Result<u64, String> {
        let s = s.ok_or_else(|| format!("no {what}"))?;
        s.parse().map_err(|_| format!("{what} '{}' is not a number", s.chars().take(40).collect::<String>()))
    };
    let start = num(it.next(), "start sector")?;
    let length = num(it.next(), "length")?;
    let ty = it.next().filter(|t| !t.is_empty()).ok_or("no target type")?;
    Ok((start, length, ty, it.next().unwrap_or("").trim()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::multipath::PathState;
    use crate::host::dmioctl::tests::{reply, targets_data};

    const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/multipath-incident3");

    fn spec(ty: &str, params: &str) -> ioctl::TargetSpec {
        ioctl::TargetSpec { start: 0, length: 20971520, target_type: ty.into(), params: params.into() }
    }

    #[test]
    fn replies_map_to_the_model() {
        let header = ioctl::Header {
            target_count: 1,
            open_count: 0,
            flags: ioctl::DM_SUSPEND_FLAG,
            event_nr: 4,
            dev: DevNum::new(253, 12),
            name: "mpathb".into(),
            uuid: "mpath-3618cf24100f8f457014a764c000001f6".into(),
        };
        let table = "1 queue_if_no_path 1 alua 1 1 service-time 0 2 2 8:128 1 1 8:144 1 1";
        let status = "2 0 0 0 1 1 A 0 2 2 8:128 F 3 0 1 8:144 F 2 0 1";
        // Round trip through the kernel's byte layout, as scan() reads it.
        let buf = reply(&header, &targets_data(&[spec("multipath", table)]));
        let parsed = ioctl::parse_header(&buf).expect("header");
        let data = ioctl::data_area(&buf).expect("data");
        let table_specs = ioctl::parse_targets(data, parsed.target_count).expect("targets");
        let targets = join_targets(table_specs, vec![spec("multipath", status)]).expect("same table");

        let host = HostRoot::new(FIXTURE);
        let d = device_from_status(&host, &parsed, targets).expect("model");
        assert_eq!(d.kernel_name.as_str(), "dm-12");
        assert_eq!(d.open_count, Some(0));
        assert!(d.suspended && !d.read_only);
        assert_eq!(d.multipath_wwid(), Some("3618cf24100f8f457014a764c000001f6"));
        assert_eq!(d.slaves.iter().map(DeviceName::as_str).collect::<Vec<_>>(), ["sdi", "sdj"]);
        assert_eq!(d.info(), DmInfo { name: "mpathb".into(), uuid: header.uuid.clone(), suspended: true });
        let m = d.multipath().expect("parses").expect("is multipath");
        assert!(m.io_would_hang());
        assert_eq!(m.table.hw_handler.as_ref().map(|h| h.name.as_str()), Some("alua"));

        let negative = ioctl::Header { open_count: -1, ..header };
        assert!(device_from_status(&host, &negative, vec![]).is_err());
    }

    #[test]
    fn reloaded_tables_do_not_pair() {
        assert!(join_targets(vec![spec("multipath", "x")], vec![spec("linear", "y")]).is_none());
        assert!(join_targets(vec![spec("linear", "x")], vec![]).is_none());
        assert_eq!(join_targets(vec![], vec![]), Some(vec![]));
    }

    #[test]
    fn malformed_multipath_lines_name_the_device() {
        let d = DmDevice {
            kernel_name: DeviceName::new("dm-3").expect("name"),
            devnum: DevNum::new(253, 3),
            name: "mpatha".into(),
            uuid: "mpath-36001405abcdef".into(),
            suspended: false,
            read_only: false,
            open_count: Some(1),
            targets: Some(vec![DmTarget {
                start: 0,
                length: 8,
                target_type: "multipath".into(),
                table: "0 0 1 1 round-robin 0 1 1 8:0 1".into(),
                status: "2 0 0 0 1 1 A 0 1 0 8:0 Z 0".into(),
            }]),
            slaves: vec![],
            holders: vec![],
        };
        let e = d.multipath().expect_err("bad status").to_string();
        assert!(e.contains("mpatha (dm-3, 253:3)") && e.contains("status") && e.contains("'Z'"), "{e}");
        let linear = DmDevice {
            targets: Some(vec![DmTarget {
                target_type: "linear".into(),
                ..d.targets.clone().expect("t")[0].clone()
            }]),
            ..d.clone()
        };
        assert_eq!(linear.multipath().expect("not multipath"), None);
        assert_eq!(DmDevice { targets: None, ..d }.multipath().expect("sysfs"), None);
    }

    #[test]
    fn uuid_kinds() {
        let mut d = scan_sysfs(&HostRoot::new(FIXTURE)).expect("scan").remove(0);
        d.uuid = "part1-mpath-3618cf24100f8f457014a764c000001f6".into();
        assert_eq!(d.partition_of(), Some((1, "mpath-3618cf24100f8f457014a764c000001f6")));
        assert_eq!(d.multipath_wwid(), None);
        for u in ["", "mpath-", "partx-mpath-1", "part1-", "LVM-xyz"] {
            d.uuid = u.into();
            assert_eq!((d.multipath_wwid(), d.partition_of()), (None, None), "{u}");
        }
    }

    #[test]
    fn no_control_node_is_absent_and_falls_back_to_sysfs() {
        let host = HostRoot::new(FIXTURE);
        let e = scan(&host).expect_err("fixture has no control node");
        assert!(e.is_absent(), "{e}");
        assert!(e.to_string().contains("dev/mapper/control"), "{e}");
        let devs = scan_any(&host).expect("sysfs fallback");
        assert_eq!(devs.len(), 1);
        assert!(devs[0].targets.is_none() && devs[0].open_count.is_none());
    }

    #[test]
    fn incident3_from_sysfs_and_the_table_dump() {
        let host = HostRoot::new(FIXTURE);
        let mut devs = scan_sysfs(&host).expect("scan");
        assert_eq!(devs.len(), 1);
        let d = &mut devs[0];
        assert_eq!(
            (d.kernel_name.as_str(), d.devnum, d.name.as_str()),
            ("dm-12", DevNum::new(253, 12), "mpathb")
        );
        assert_eq!(d.multipath_wwid(), Some("3618cf24100f8f457014a764c000001f6"));
        assert!(!d.suspended && !d.read_only && d.holders.is_empty());
        assert_eq!(d.slaves.iter().map(DeviceName::as_str).collect::<Vec<_>>(), ["sdi", "sdj"]);

        let text = std::fs::read_to_string(format!("{FIXTURE}/dm-tables.txt")).expect("dump");
        let dump = parse_dump(&text).expect("parses");
        d.targets = Some(dump.into_iter().filter(|t| t.name == d.name).map(|t| t.target).collect());
        let m = d.multipath().expect("parses").expect("multipath");
        assert!(m.table.features.queue_if_no_path);
        let paths: Vec<(DevNum, PathState)> = m.status.paths().map(|p| (p.dev, p.state)).collect();
        assert_eq!(
            paths,
            [(DevNum::new(8, 128), PathState::Failed), (DevNum::new(8, 144), PathState::Failed)]
        );
        assert!(m.io_would_hang(), "incident 3: queue_if_no_path and every path failed");
    }

    #[test]
    fn dump_lines() {
        let ok = "# comment\n\nmp\t0 8 multipath 0 0 0 0\t0 8 multipath 2 0 0 0 0 0\n";
        let d = parse_dump(ok).expect("ok");
        assert_eq!(d[0].target.table, "0 0 0 0");
        assert_eq!(d[0].target.status, "2 0 0 0 0 0");
        assert_eq!(parse_dump("mp\t0 8 multipath 0\n").expect_err("two fields").0, 1);
        assert!(parse_dump("mp\t0 8 multipath 0\t0 9 multipath 2\n").is_err());
        assert!(parse_dump("mp\tx 8 multipath 0\t0 8 multipath 2\n").is_err());
        assert!(parse_dump("mp\t0 8\t0 8\n").is_err());
    }
}
