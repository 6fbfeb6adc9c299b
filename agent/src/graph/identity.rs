//! What a device number stands for right now: the kernel identity of a device.
//!
//! Device names and numbers are reused at once (`loop3`, `rbd0`, `nbd1`, `dm-4`, `sdb`): the
//! number that was a stale mapping a minute ago can be a fresh one now. Grace clocks, verdicts,
//! plans and Apply requests are therefore bound to an [`Identity`]: the number and name, the
//! kernel's disk sequence number when it has one (`/sys/block/X/diskseq`, new for every disk and
//! every loop attach), and what the device is a view of (loop: backing device, inode and offset;
//! rbd: cluster, pool, image, id and client, and on a kernel without `diskseq` the kernel record
//! of its attach; nbd: server process and backend; dm: uuid; SCSI: wwid and address). Two
//! identities are equal only when all of it is. An rbd image unmapped and mapped again at the
//! same id by the same client is the same in every attribute but its attach stamp.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::graph::DeviceEntry;
use crate::model::{DevNum, DeviceName};

/// What a device is a view of.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Backing {
    /// A bound loop device: its backing file (device and inode, or the device node's number when
    /// it is backed by a block device) and offset.
    Loop { dev: Option<DevNum>, inode: Option<u64>, rdev: Option<DevNum>, offset: u64 },
    /// An unbound loop device.
    UnboundLoop,
    /// A krbd mapping.
    Rbd {
        fsid: String,
        pool: String,
        pool_ns: String,
        image: String,
        image_id: String,
        snap: String,
        id: u32,
        client: String,
        /// The kernel record announcing the mapping, on a kernel without `diskseq`
        /// ([`crate::discover::rbd::RbdMapping::attach_record`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        attach_record: Option<u64>,
    },
    /// A connected nbd device: the process that set it up and the backend it named.
    Nbd { server_pid: Option<u32>, backend: Option<String> },
    /// A device-mapper device.
    Dm { uuid: String },
    /// A SCSI disk.
    Scsi { wwid: Option<String>, address: String },
    /// An NVMe namespace: the subsystem it belongs to.
    Nvme { subsysnqn: String },
    /// Anything else: its number, name and disk sequence are all there is.
    Plain,
}

/// A device's kernel identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    pub name: DeviceName,
    pub devnum: DevNum,
    /// `diskseq` from sysfs (Linux 5.15+): unique per disk and per loop attach within a boot.
    pub diskseq: Option<u64>,
    pub backing: Backing,
}

impl Identity {
    /// The identity of a scanned device.
    pub fn of(e: &DeviceEntry) -> Self {
        let d = &e.device;
        let backing = if let Some(l) = &d.loop_info {
            Backing::Loop {
                dev: l.backing_dev,
                inode: l.backing_inode,
                rdev: l.backing_rdev,
                offset: l.offset,
            }
        } else if d.kind == crate::model::DeviceKind::Loop {
            Backing::UnboundLoop
        } else if let Some(r) = &e.rbd {
            Backing::Rbd {
                fsid: r.cluster_fsid.clone(),
                pool: r.pool.clone(),
                pool_ns: r.pool_ns.clone(),
                image: r.image.clone(),
                image_id: r.image_id.clone(),
                snap: r.snap.clone(),
                id: r.id,
                client: r.client_id.clone(),
                attach_record: r.attach_record,
            }
        } else if let Some(n) = &e.nbd {
            Backing::Nbd { server_pid: n.pid, backend: n.backend.clone() }
        } else if let Some(dm) = &d.dm {
            Backing::Dm { uuid: dm.uuid.clone() }
        } else if let Some(s) = &e.scsi {
            Backing::Scsi { wwid: s.disk.wwid.clone(), address: s.disk.address.to_string() }
        } else if let Some(n) = &e.nvme {
            Backing::Nvme { subsysnqn: n.subsysnqn.clone() }
        } else {
            Backing::Plain
        };
        Self { name: d.name.clone(), devnum: d.devnum, diskseq: d.diskseq, backing }
    }

    /// A compact, exact text of the whole identity: what Plan hands out and Apply is bound to.
    pub fn token(&self) -> String {
        let mut t = format!("{}@{}", self.name, self.devnum);
        if let Some(s) = self.diskseq {
            t.push_str(&format!("#{s}"));
        }
        let opt = |v: Option<String>| v.unwrap_or_else(|| "?".into());
        let part = match &self.backing {
            Backing::Loop { dev, inode, rdev, offset } => match rdev {
                Some(r) => format!("loop=dev:{r}+{offset}"),
                None => format!(
                    "loop={}/{}+{offset}",
                    opt(dev.map(|d| d.to_string())),
                    opt(inode.map(|i| i.to_string()))
                ),
            },
            Backing::UnboundLoop => "loop=unbound".into(),
            Backing::Rbd { fsid, pool, pool_ns, image, image_id, snap, id, client, attach_record } => {
                let stamp = attach_record.map(|r| format!(":kmsg{r}")).unwrap_or_default();
                format!("rbd={fsid}:{pool}/{pool_ns}/{image}@{snap}:{image_id}:{id}:{client}{stamp}")
            }
            Backing::Nbd { server_pid, backend } => format!(
                "nbd=pid:{}:{}",
                opt(server_pid.map(|p| p.to_string())),
                backend.as_deref().unwrap_or("")
            ),
            Backing::Dm { uuid } => format!("dm={uuid}"),
            Backing::Scsi { wwid, address } => format!("scsi={}:{address}", wwid.as_deref().unwrap_or("?")),
            Backing::Nvme { subsysnqn } => format!("nvme={subsysnqn}"),
            Backing::Plain => "plain".into(),
        };
        format!("{t};{part}")
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}", self.name, self.devnum)?;
        if let Some(s) = self.diskseq {
            write!(f, ", diskseq {s}")?;
        }
        f.write_str(")")?;
        match &self.backing {
            Backing::Loop { rdev: Some(r), offset, .. } => {
                write!(f, " backed by device {r} at offset {offset}")
            }
            Backing::Loop { dev, inode, offset, .. } => write!(
                f,
                " backed by inode {} on {} at offset {offset}",
                inode.map_or("?".into(), |i| i.to_string()),
                dev.map_or("?".into(), |d| d.to_string())
            ),
            Backing::UnboundLoop => f.write_str(" unbound"),
            Backing::Rbd { pool, pool_ns, image, id, client, attach_record, .. } => {
                let ns = if pool_ns.is_empty() { String::new() } else { format!("{pool_ns}/") };
                write!(f, " rbd {pool}/{ns}{image} (id {id}, {client}")?;
                match attach_record {
                    Some(r) => write!(f, ", attached at kernel record #{r})"),
                    None => f.write_str(")"),
                }
            }
            Backing::Nbd { server_pid, backend } => write!(
                f,
                " nbd served by pid {}{}",
                server_pid.map_or("?".into(), |p| p.to_string()),
                backend.as_deref().map(|b| format!(", backend {b}")).unwrap_or_default()
            ),
            Backing::Dm { uuid } => write!(f, " dm uuid {uuid}"),
            Backing::Scsi { wwid, address } => {
                write!(f, " SCSI {address} wwid {}", wwid.as_deref().unwrap_or("unknown"))
            }
            Backing::Nvme { subsysnqn } => write!(f, " NVMe namespace of subsystem {subsysnqn}"),
            Backing::Plain => Ok(()),
        }
    }
}
