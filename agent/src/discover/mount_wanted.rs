//! Which mounts a scan of the mount namespaces wants ([`Wanted`]): the full line of each mount
//! of a device in scope, of btrfs (joined to its devices later) and of nsfs (namespace pins),
//! asked of mountinfo's text or of `statmount`; and whether a namespace's remembered text may
//! answer for it ([`TextReuse`]). The reading itself is [`super::namespaces`].

use std::collections::{HashMap, HashSet};

use super::mountinfo::MountEntry;
use crate::host::sys::mount_api;
use crate::model::DevNum;

/// Which mounts a scan wants the full line of.
#[derive(Debug, Clone, Copy)]
pub struct Wanted<'a> {
    /// Devices in scope.
    pub targets: &'a HashSet<DevNum>,
    /// nsfs's device on a live host (namespace pins); `None`: every line is wanted.
    pub nsfs_dev: Option<DevNum>,
    /// Whether a namespace's remembered mountinfo text may stand in for reading it again.
    pub reuse_text: TextReuse,
    /// The host's mount namespaces as the kernel listed them for this scan, by the inode of
    /// their `ns/mnt` file to their 64-bit ID (`host::nsfs::namespaces`): with them, a scan
    /// that reuses text answers a quiet namespace without going through any of its tasks
    /// ([`super::namespaces`]). `None`: every namespace is reached through a task.
    pub kernel_names: Option<&'a HashMap<u64, u64>>,
}

/// Whether a namespace's mountinfo text, remembered from an earlier read
/// ([`super::statmount_cache::text_for`]), may answer for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TextReuse {
    /// Read the text: every scan behind an action, and a pinned namespace's read.
    Never,
    /// Reuse it while the namespace's mount IDs are the same, and take a watched namespace with
    /// no mount event since as it was listed: the daemon's scans that only show.
    WhileSameIds,
    /// Reuse a text only once `statmount` has said again, of every remembered line, what that
    /// line says ([`super::statmount_cache::still_true`]): a remount, a propagation change or a
    /// renamed mount point keeps the mount IDs. List again every namespace not watched or with a
    /// mount event since, and a share of the quiet ones, each in its turn
    /// ([`super::statmount_cache::RELIST_SHARE`]). The daemon's every
    /// [`super::statmount_cache::DEEP_EVERY`]th full scan (it read all the text before: 17 MB on the
    /// 200-namespace node scene), and a one-shot run's (it watches nothing: it lists all).
    Confirmed,
}

impl Wanted<'_> {
    pub(super) fn device(&self, d: DevNum) -> bool {
        self.targets.contains(&d) || self.nsfs_dev.is_none_or(|n| n == d)
    }

    /// By mountinfo's device and filesystem type.
    pub fn text(&self, d: DevNum, fstype: &[u8]) -> bool {
        self.device(d) || (d.major == 0 && fstype == b"btrfs")
    }

    /// The lines of a namespace's text the scan wants ([`Wanted::text`]).
    pub(super) fn lines_of(&self, lines: &[MountEntry]) -> Vec<MountEntry> {
        lines.iter().filter(|m| self.text(m.devnum, m.fstype.as_bytes())).cloned().collect()
    }

    /// By `statmount`'s device and filesystem magic.
    pub(super) fn magic(&self, d: DevNum, magic: u64) -> bool {
        self.device(d) || (d.major == 0 && magic == mount_api::BTRFS_SUPER_MAGIC)
    }

    /// [`Self::magic`] for every mount of a listing: the same answer, with the devices in
    /// scope compared as a short list when there are few (a one-shot `holders`), not hashed
    /// (`SipHash` per mount was about 3 % of a one-shot `holders` on the busy-node scene,
    /// 200,000 mounts).
    ///
    /// Most of a node's mounts are of anonymous superblocks (tmpfs, proc, overlay: major 0),
    /// which no block device in scope is: they are not looked up at all unless one is (a daemon's
    /// full scan has every device in scope, too many for a list: the lookup of each of 200,000
    /// mounts was 9 % of a light periodic scan's CPU on the node scene).
    pub(super) fn magic_matcher(&self) -> impl Fn(DevNum, u64) -> bool + '_ {
        let target = crate::model::small_set::member_of(self.targets);
        let anonymous_target = self.targets.iter().any(|d| d.major == 0);
        move |d, magic| {
            ((d.major != 0 || anonymous_target) && target(&d))
                || self.nsfs_dev.is_none_or(|n| n == d)
                || (d.major == 0 && magic == mount_api::BTRFS_SUPER_MAGIC)
        }
    }

    /// Whether a full line is one to keep (not only a pin candidate).
    pub(super) fn keeps(&self, m: &MountEntry) -> bool {
        self.targets.contains(&m.devnum) || (m.devnum.major == 0 && m.fstype == "btrfs")
    }
}

/// `NSFS_MAGIC` from `<linux/magic.h>`: a namespace file bind-mounted (a pin).
pub(super) const NSFS_MAGIC: u64 = 0x6e73_6673;

/// By `statmount`'s device and magic: the mounts whose lines a listed namespace's remembered
/// text keeps (block devices, btrfs, nsfs pins, and whatever the scan wants).
pub(super) fn kept_kind(wanted: Wanted<'_>, d: DevNum, magic: u64) -> bool {
    d.major != 0 || magic == NSFS_MAGIC || wanted.magic(d, magic)
}
