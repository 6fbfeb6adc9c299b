//! The inventories one scan reads besides the mount tables: block devices and their transports
//! (dm, multipath, SCSI, iSCSI, NVMe, rbd, nbd, kubelet), I/O counters and swaps, and the joins
//! of anonymous filesystems (btrfs, loop backing files) to their devices.

use super::SwapUse;
use crate::discover::iostat::{self, IoStat};
use crate::discover::livefs::{AnonIndex, LiveFs};
use crate::discover::namespaces::{NsEntry, NsMount};
use crate::discover::swaps::{self, SwapType};
use crate::discover::{dm, kmsg, nbd, nvme, rbd, scsi};
use crate::host::sys;
use crate::host::HostRoot;
use crate::model::blindspot::BlindSpot;
use crate::model::{BlockDevice, DevNum, DeviceKind, DeviceName};
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The block layer's counters of the devices in `targets`: never touch the device. One that
/// cannot be read only leaves the device's responsiveness unjudged (a warning).
pub(super) fn read_io(
    host: &HostRoot,
    devices: &[BlockDevice],
    targets: &HashSet<DevNum>,
    warnings: &mut Vec<String>,
) -> HashMap<DevNum, IoStat> {
    let mut io = HashMap::new();
    // The live host's files are kept open between reads (a fixture's may be replaced whole).
    let mut kept = host.is_live().then(iostat::StatFiles::shared);
    let mut read = HashSet::new();
    for d in devices.iter().filter(|d| targets.contains(&d.devnum)) {
        let dir = host.sys_class_block().join(d.name.as_str());
        let counters = match kept.as_deref_mut() {
            Some(files) => files.read(&dir),
            None => iostat::read(&dir),
        };
        read.insert(dir);
        match counters {
            Ok(Some(s)) => {
                io.insert(d.devnum, s);
            }
            Ok(None) => {}
            Err(e) => warnings.push(e.to_string()),
        }
    }
    if let Some(files) = kept.as_deref_mut() {
        files.keep_only(&read);
    }
    io
}

/// What each kind's sysfs (and the kernel log, for fenced rbd clients) says of the devices:
/// cheap reads, done again whenever the set of devices changes.
pub(super) struct Inventories {
    pub(super) swaps: Vec<SwapUse>,
    pub(super) dm_devices: Vec<dm::DmDevice>,
    pub(super) scsi: scsi::ScsiScan,
    pub(super) rbd: Vec<rbd::RbdMapping>,
    pub(super) nbd: Vec<nbd::NbdDevice>,
    pub(super) nvme: nvme::NvmeScan,
}

pub(super) fn read_inventories(
    host: &HostRoot,
    devices: &[BlockDevice],
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    blind: &mut Vec<BlindSpot>,
) -> Inventories {
    let swaps = read_swaps(host, targets, anon, blind);
    let dm_devices = dm::scan_any(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Dm, format!("device-mapper: {e}")));
        Vec::new()
    });
    let scsi = scsi::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Disk, format!("SCSI: {e}")));
        scsi::ScsiScan::default()
    });
    let mut rbd = rbd::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Rbd, format!("rbd: {e}")));
        Vec::new()
    });
    if !rbd.is_empty() {
        let log = kmsg::read_rbd(host);
        for m in &mut rbd {
            m.fenced = log.fenced.get(m.device.as_str()).cloned();
            // The attach stamp: the device's diskseq where the kernel has one, else the record.
            let diskseq = devices.iter().find(|d| d.name == m.device).and_then(|d| d.diskseq);
            if diskseq.is_none() {
                m.attach_record = log.attached.get(m.device.as_str()).copied();
            }
        }
    }
    let nbd = nbd::scan(host, devices).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::Nbd, format!("nbd: {e}")));
        Vec::new()
    });
    let nvme = nvme::scan(host).unwrap_or_else(|e| {
        blind.push(BlindSpot::kind(DeviceKind::NvmeNamespace, format!("NVMe: {e}")));
        nvme::NvmeScan::default()
    });
    Inventories { swaps, dm_devices, scsi, rbd, nbd, nvme }
}

/// The swap areas on devices in `targets`. `/proc/swaps` names each area by its path from the
/// host's root (a swap file the host turned on is not in this container's root), so each is
/// resolved on the host ([`HostRoot::stat_on_host`]); a swap file on btrfs (its subvolume's
/// anonymous number) is followed to the filesystem's devices through `anon`. An area that
/// cannot be resolved is a blind spot: any device could be the one it sits on.
pub(super) fn read_swaps(
    host: &HostRoot,
    targets: &HashSet<DevNum>,
    anon: &AnonIndex,
    blind: &mut Vec<BlindSpot>,
) -> Vec<SwapUse> {
    let path = host.proc().join("swaps");
    let text = match std::fs::read(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            blind.push(BlindSpot::any_device(format!("swap areas: cannot read {}: {e}", path.display())));
            return Vec::new();
        }
    };
    let areas = match swaps::parse(&text) {
        Ok(a) => a,
        Err((line, reason)) => {
            blind.push(BlindSpot::any_device(format!(
                "swap areas: malformed {}: line {line}: {reason}",
                path.display()
            )));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for a in areas {
        let id = match host.stat_on_host(a.filename.as_path()) {
            Ok(id) => id,
            Err(e) => {
                blind.push(BlindSpot::any_device(format!(
                    "swap area {}: cannot resolve it on the host ({e}), so its device is not known",
                    a.filename
                )));
                continue;
            }
        };
        let devnums: Vec<DevNum> = match a.swap_type {
            SwapType::Partition => vec![id.rdev],
            SwapType::File if id.dev.major == 0 => anon.members_of(&id).to_vec(),
            SwapType::File => vec![id.dev],
        };
        for devnum in devnums.into_iter().filter(|d| targets.contains(d)) {
            out.push(SwapUse { devnum, filename: a.filename.clone(), swap_type: a.swap_type });
        }
    }
    out
}

/// A loop device whose backing file is on btrfs has the subvolume's anonymous number as
/// `lo_device`, which the index knows only when a mount root or an open file showed it (a file
/// in a nested subvolume shows neither). For the others, the backing file is looked up by its
/// path (`loop/backing_file`, printed from the root of the namespace that mounts it) on the host
/// and through a task of each namespace that mounts a tied btrfs, and only if the kernel says it
/// is the very file (`lo_device` and `lo_inode` match) does the mount it was reached through tie
/// the number to its filesystem's members.
pub(super) fn learn_loop_backing(
    host: &HostRoot,
    devices: &[BlockDevice],
    mounts: &[NsMount],
    anon: &mut AnonIndex,
) {
    if anon.is_empty() {
        return;
    }
    let mut roots: Vec<Option<std::path::PathBuf>> = vec![None];
    for m in mounts.iter().filter(|m| m.mount.devnum.major == 0 && m.block.is_some()) {
        if let NsEntry::Task { pid, tid } = m.via {
            let r = Some(host.proc_task(pid, tid).join("root"));
            if !roots.contains(&r) {
                roots.push(r);
            }
        }
    }
    for l in devices.iter().filter_map(|d| d.loop_info.as_ref()) {
        let (Some(dev), Some(ino)) = (l.backing_dev, l.backing_inode) else { continue };
        if dev.major != 0 || !anon.members_of_dev(dev).is_empty() || l.backing_deleted {
            continue;
        }
        let (h, path, tries) = (host.clone(), l.backing_file.as_path().to_path_buf(), roots.clone());
        let looked =
            crate::host::bounded::read(format!("loop-backing-{dev}"), BTRFS_FSID_DEADLINE, move || {
                tries.iter().find_map(|root| {
                    let id = match root {
                        None => h.stat_on_host(&path),
                        Some(r) => sys::stat_in_root(r, &path),
                    };
                    id.ok().filter(|id| id.dev == dev && id.ino == ino)
                })
            });
        if let Ok(Some(id)) = looked {
            let members = anon.members_of(&id).to_vec();
            anon.add_dev(dev, &members);
        }
    }
}

/// Joins btrfs mounts (anonymous `0:NN`) to their member devices by the filesystem's fsid as the
/// kernel gives it, never by the mount's source text (which whoever made the mount chose: a
/// container can name any device there). For each superblock, one of its mounts is opened
/// through the root of a task of its namespace, checked to be that very mount (the kernel's
/// mount ID), and asked its fsid (`BTRFS_IOC_FS_INFO`), which names the filesystem's directory
/// `/sys/fs/btrfs/<fsid>/devices`. A superblock's number is the kernel's, one per filesystem
/// instance: every other mount of it (in any namespace, a pinned one included) follows, as do
/// the superblocks `index` already knows (a full scan's, for a re-read). The mounts, the
/// superblock's number and the subvolume number of each opened mount root go into `index` (for
/// files, mappings and loop backing files on btrfs). A mount that cannot be tied is a blind spot
/// over every btrfs member device.
pub(super) fn join_anonymous(
    host: &HostRoot,
    mounts: &mut Vec<NsMount>,
    devices: &[BlockDevice],
    live_fs: &[LiveFs],
    blind: &mut Vec<BlindSpot>,
    index: &mut AnonIndex,
) {
    let btrfs: Vec<&LiveFs> = live_fs.iter().filter(|f| f.fstype == "btrfs").collect();
    let anonymous = |m: &NsMount| m.mount.devnum.major == 0 && m.mount.fstype == "btrfs";
    let (anon, rest): (Vec<NsMount>, Vec<NsMount>) = std::mem::take(mounts).into_iter().partition(anonymous);
    *mounts = rest;
    let members_of = |fs: &LiveFs| -> Vec<DevNum> {
        fs.members.iter().filter_map(|n| devices.iter().find(|d| &d.name == n)).map(|d| d.devnum).collect()
    };
    let live: Vec<Vec<DevNum>> = btrfs.iter().map(|f| members_of(f)).collect();
    index.retain(|m| live.iter().any(|l| l.as_slice() == m));
    let mut why: HashMap<DevNum, String> = HashMap::new();
    for m in &anon {
        let sb = m.mount.devnum;
        if !index.members_of_dev(sb).is_empty() || why.get(&sb).is_some_and(|w| w.is_empty()) {
            continue;
        }
        match btrfs_fsid_of(host, m) {
            Ok((fsid, root)) => match btrfs.iter().find(|f| f.id == fsid) {
                Some(fs) => {
                    let members = members_of(fs);
                    index.add_mount(u64::from(m.mount.mount_id), sb, &members);
                    index.add_dev(root.dev, &members);
                    why.insert(sb, String::new());
                }
                None => {
                    why.insert(sb, format!("its fsid {fsid} has no /sys/fs/btrfs/{fsid}/devices"));
                }
            },
            Err(e) => {
                why.entry(sb).or_insert(e);
            }
        }
    }
    for m in anon {
        let members = index.members_of_dev(m.mount.devnum).to_vec();
        if members.is_empty() {
            let all: Vec<DeviceName> = btrfs.iter().flat_map(|f| f.members.iter().cloned()).collect();
            let what = format!(
                "a btrfs mount at {} (source {}, device {}) in mount namespace {} cannot be tied to its devices: {}",
                m.mount.mount_point,
                m.mount.source,
                m.mount.devnum,
                m.ns.0,
                why.get(&m.mount.devnum).map_or("no mount of it could be opened", String::as_str)
            );
            if !all.is_empty() {
                blind.push(BlindSpot::devices(all, what));
            }
            continue;
        }
        index.by_mount.insert(u64::from(m.mount.mount_id), members.clone());
        for d in members {
            mounts.push(NsMount { block: Some(d), ..m.clone() });
        }
    }
}

/// How long opening a btrfs mount's root to ask its fsid may take (the path walk crosses the
/// namespace's other mounts, one of which may be a FUSE or NFS mount that no longer answers).
pub(super) const BTRFS_FSID_DEADLINE: Duration = Duration::from_millis(500);

/// The fsid of the filesystem mounted at `m` (as `/sys/fs/btrfs/` names it) and the stat of the
/// mount's root: opened through the root of the task the table was read through, and only
/// when the kernel says the directory reached is on that very mount (its mount ID: a mount
/// stacked on top, or a path a container swapped, is refused).
pub(super) fn btrfs_fsid_of(host: &HostRoot, m: &NsMount) -> Result<(String, sys::FileId), String> {
    use std::os::fd::AsFd;
    use std::os::unix::ffi::OsStrExt;
    let NsEntry::Task { pid, tid } = m.via else {
        return Err(format!("its namespace is reached through {}, not a task's root", m.via.describe()));
    };
    let root = host.proc_task(pid, tid).join("root");
    let point = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(m.mount.mount_point.as_bytes()));
    let expected = u64::from(m.mount.mount_id);
    let what = format!("{} (through {})", m.mount.mount_point, root.display());
    let key = format!("btrfs-fsid-{pid}-{expected}");
    crate::host::bounded::read(key, BTRFS_FSID_DEADLINE, move || -> Result<(String, sys::FileId), String> {
        let fd = sys::open_in_root(&root, &point, libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NONBLOCK)
            .map_err(|e| format!("cannot open {what}: {e}"))?;
        let id = sys::stat_fd(fd.as_fd()).map_err(|e| format!("cannot stat {what}: {e}"))?;
        if id.mnt_id != Some(expected) {
            return Err(format!(
                "{what} is not mount {expected} (the kernel says mount {:?}): another mount covers it",
                id.mnt_id
            ));
        }
        let fsid = sys::btrfs_fsid(fd.as_fd()).map_err(|e| format!("BTRFS_IOC_FS_INFO on {what}: {e}"))?;
        Ok((sys::uuid_text(&fsid), id))
    })
    .unwrap_or_else(|b| Err(format!("opening {} {b}", m.mount.mount_point)))
}

/// A mount the statmount list shows but no mountinfo text did: a blind spot over its device (a
/// btrfs superblock: over every btrfs member device). Whatever device it reaches, it hides a
/// mount from its namespace's table, which is then not whole ([`BlindSpot::hiding_a_mount`]).
pub(super) fn hidden_mount(
    devnum: DevNum,
    why: &str,
    devices: &[BlockDevice],
    live_fs: &[LiveFs],
) -> BlindSpot {
    if let Some(d) = devices.iter().find(|d| d.devnum == devnum) {
        return BlindSpot::devices(vec![d.name.clone()], why).hiding_a_mount();
    }
    let members: Vec<DeviceName> =
        live_fs.iter().filter(|f| f.fstype == "btrfs").flat_map(|f| f.members.iter().cloned()).collect();
    if devnum.major == 0 && !members.is_empty() {
        BlindSpot::devices(members, why).hiding_a_mount()
    } else {
        BlindSpot::any_device(why).hiding_a_mount()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::blindspot::Reach;

    /// A mount `statmount` sees that its namespace's text lacks leaves that table not whole,
    /// whichever device it is of: the question "is anything mounted on this directory" cannot
    /// rest on it (orphaned pod volume directories), while devices keep their own reach.
    #[test]
    fn a_hidden_mount_hides_a_mount_of_its_namespace_whatever_its_device() {
        let loop3 = BlockDevice::new(
            DeviceName::new("loop3").expect("name"),
            DevNum::new(7, 3),
            DeviceKind::Loop,
            1 << 20,
        );
        let btrfs = LiveFs {
            fstype: "btrfs".into(),
            id: "f00d".into(),
            members: vec![DeviceName::new("vdb").expect("name")],
        };
        let known = hidden_mount(DevNum::new(7, 3), "statmount sees 7:3", std::slice::from_ref(&loop3), &[]);
        assert_eq!(known.reach, Reach::Devices(vec![loop3.name.clone()]));
        let members =
            hidden_mount(DevNum::new(0, 39), "statmount sees 0:39", &[], std::slice::from_ref(&btrfs));
        assert_eq!(members.reach, Reach::Devices(btrfs.members.clone()));
        let unknown = hidden_mount(DevNum::new(0, 61), "statmount sees 0:61", &[], &[]);
        assert_eq!(unknown.reach, Reach::AnyDevice);
        for b in [known, members, unknown] {
            assert!(b.hides_mount_namespace, "{b}");
        }
    }
}
