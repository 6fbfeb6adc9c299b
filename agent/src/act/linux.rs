//! The Linux actuator: detaches mounts inside their own namespace and unbinds loop devices.
//!
//! Every step re-reads the kernel's state right before acting (the mount still exists with the
//! same ID and device, the namespace is still the same inode, the loop device is still bound to
//! the same file), refuses anything that would take more than planned (a mount with mounts
//! beneath it), runs the syscall on its own thread with a deadline, and verifies the result.

use crate::host::bounded::CallError;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::time::Duration;

use nix::mount::{umount2, MntFlags};

use super::{ActError, Actuator, StepOutcome};
use crate::discover::mountinfo::{self, MountEntry};
use crate::discover::namespaces::NsEntry;
use crate::discover::{is_gone, processes};
use crate::host::HostRoot;
use crate::model::{DevNum, DeviceName, KernelText, MountNsId};
use crate::plan::step::{Action, Step};
use crate::{host::nsenter, host::sys};

/// Default deadline for one kernel call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// What tells one attach of an rbd image from the next at the same id and number: the device's
/// `diskseq`, or on a kernel without it the sequence number of the kernel's attach record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttachStamp {
    pub diskseq: Option<u64>,
    pub record: Option<u64>,
}

/// Acts on the live kernel.
#[derive(Debug, Clone)]
pub struct LinuxActuator {
    host: HostRoot,
    timeout: Duration,
}

impl LinuxActuator {
    pub fn new(host: HostRoot, timeout: Duration) -> Self {
        Self { host, timeout }
    }

    pub(crate) fn host(&self) -> &HostRoot {
        &self.host
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Actuator for LinuxActuator {
    fn run(&self, step: &Step) -> Result<StepOutcome, ActError> {
        let (device, devnum) = (&step.device, step.devnum);
        match &step.action {
            Action::DetachMount { namespace, via, mount_id, mount_dev, .. } => {
                self.detach_mount(device, *mount_dev, *namespace, via, *mount_id)
            }
            Action::DetachLoop { backing_dev, backing_inode, .. } => {
                self.detach_loop(device, devnum, step.identity.diskseq, *backing_dev, *backing_inode)
            }
            Action::DmMessage { uuid, message } => self.dm_message(device, devnum, uuid, message),
            Action::DmRemove { uuid, deferred } => self.dm_remove(device, devnum, uuid, *deferred),
            Action::ScsiOffline { wwid, require_offline, .. } => {
                self.scsi_offline(device, devnum, wwid, *require_offline)
            }
            Action::ScsiDelete { wwid, .. } => self.scsi_delete(device, devnum, wwid),
            Action::RbdUnmap { id, pool, image, image_id, force } => {
                let record = match &step.identity.backing {
                    crate::graph::identity::Backing::Rbd { attach_record, .. } => *attach_record,
                    _ => None,
                };
                let stamp = AttachStamp { diskseq: step.identity.diskseq, record };
                self.rbd_unmap(device, devnum, *id, (pool, image, image_id), stamp, *force)
            }
            Action::NbdDisconnect { server_pid, backend } => {
                self.nbd_disconnect(device, devnum, *server_pid, backend.as_deref())
            }
            // Each kind's module takes the action as planned (no name of theirs is needed here).
            Action::NvmeDeleteController { .. } => self.nvme_delete_step(device, &step.action),
            Action::IscsiLogout { .. } => self.iscsi_logout_step(device, &step.action),
        }
    }
}

/// Detaches exactly the mount `mount_id` at `rel` (below `root`), in the current thread's mount
/// namespace. The path is resolved inside an untrusted namespace, so a container could swap any
/// directory on it for a symlink between the check and the unmount: it is opened with `openat2`
/// refusing every symlink and staying beneath `root`, the open mount's ID must be the planned
/// one, and the unmount goes through that open file (`/proc/thread-self/fd/N` of our own procfs),
/// never through the path again.
fn unmount_exactly(
    root: &OwnedFd,
    rel: &std::path::Path,
    mount_id: u32,
    proc_fd: &OwnedFd,
) -> io::Result<()> {
    use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
    let how = OpenHow::new().flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW).resolve(
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    let target = openat2(root.as_fd(), rel, how).map_err(|e| {
        io::Error::new(
            io::Error::from(e).kind(),
            format!("cannot open the mount point without following symlinks: {}", io::Error::from(e)),
        )
    })?;
    let found = sys::mount_id(target.as_fd())?;
    if found != u64::from(mount_id) {
        return Err(io::Error::other(format!(
            "the mount point now leads to mount {found}, not {mount_id}: something was mounted over it or it moved"
        )));
    }
    nix::unistd::fchdir(proc_fd.as_fd()).map_err(io::Error::from)?;
    let via_fd = format!("thread-self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&target));
    umount2(via_fd.as_str(), MntFlags::MNT_DETACH).map_err(io::Error::from)
}

/// Runs `f` on its own thread and waits at most `timeout`. A call that hangs (a dead device)
/// keeps its thread, which is never joined; the caller gets [`ActError::TimedOut`].
pub fn bounded<R: Send + 'static>(
    device: &DeviceName,
    op: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> Result<R, ActError> {
    crate::host::bounded::call(device, op, timeout, f).map_err(|e| match e {
        CallError::Failed(source) => ActError::Syscall { device: device.clone(), op, source },
        CallError::TimedOut => ActError::TimedOut { device: device.clone(), op, after: timeout },
    })
}

impl LinuxActuator {
    /// The namespace's current mount table, read the same way the plan read it.
    fn mount_table(&self, device: &DeviceName, via: &NsEntry) -> Result<Option<Vec<MountEntry>>, ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        let (path, text) = match via {
            NsEntry::Task { pid, tid } => {
                let path = self.host.proc_task(*pid, *tid).join("mountinfo");
                match std::fs::read(&path) {
                    Ok(t) if !t.is_empty() => (path, t),
                    Ok(_) => return Ok(None),
                    Err(e) if is_gone(&e) => return Ok(None),
                    Err(e) => return Err(fail(format!("cannot read {}: {e}", path.display()))),
                }
            }
            NsEntry::Nsfs { .. } | NsEntry::Fd { .. } | NsEntry::TaskNamespace { .. } => {
                let file = via.ns_file(&self.host);
                let proc = self.host.proc().to_owned();
                let text = bounded(device, "read mountinfo", self.timeout, move || {
                    nsenter::read_mountinfo(&file, &proc)
                });
                match text {
                    Ok(t) => (via.ns_file(&self.host), t),
                    Err(ActError::Syscall { source, .. }) if is_gone(&source) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        };
        mountinfo::parse(&text).map(Some).map_err(|e| fail(format!("malformed {}: {e}", path.display())))
    }

    fn ns_of(&self, via: &NsEntry) -> Option<MountNsId> {
        match via {
            NsEntry::Task { pid, tid } | NsEntry::TaskNamespace { pid, tid } => {
                processes::task_mount_ns(&self.host.proc_task(*pid, *tid))
            }
            NsEntry::Nsfs { .. } | NsEntry::Fd { .. } => {
                sys::stat_cached(&via.ns_file(&self.host)).ok().map(|s| MountNsId(s.ino))
            }
        }
    }

    /// `mount_dev` is the mount's own device as mountinfo shows it (a btrfs mount's anonymous
    /// `0:NN`, not the block device the step is for).
    fn detach_mount(
        &self,
        device: &DeviceName,
        mount_dev: DevNum,
        namespace: MountNsId,
        via: &NsEntry,
        mount_id: u32,
    ) -> Result<StepOutcome, ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        self.same_namespace(via, namespace).map_err(fail)?;
        let Some(table) = self.mount_table(device, via)? else {
            return Err(fail(format!(
                "the namespace entry ({}) is gone; scan again to re-plan",
                via.describe()
            )));
        };
        let Some(target) = still_planned(&table, mount_id, mount_dev).map_err(fail)? else {
            return Ok(StepOutcome::AlreadyAbsent);
        };
        self.unmount_in_namespace(device, via, &target.mount_point, mount_id)?;
        match self.mount_table(device, via)? {
            Some(t) if t.iter().any(|m| m.mount_id == mount_id) => Err(ActError::NotVerified {
                device: device.clone(),
                op: "umount2(MNT_DETACH)",
                reason: format!("mount {mount_id} is still in namespace {}", namespace.0),
            }),
            _ => Ok(StepOutcome::Done),
        }
    }

    /// Whether `via` still enters `namespace`, on this host's live `/proc`: why not, if not.
    fn same_namespace(&self, via: &NsEntry, namespace: MountNsId) -> Result<(), String> {
        if !self.host.is_live() {
            return Err(format!(
                "{} is not this host's /proc: namespaces cannot be entered",
                self.host.proc().display()
            ));
        }
        match self.ns_of(via) {
            None => Err(format!("the namespace entry ({}) is gone; scan again to re-plan", via.describe())),
            Some(ns) if ns != namespace => Err(format!(
                "{} is now in namespace {} not {}: PID reused?",
                via.describe(),
                ns.0,
                namespace.0
            )),
            Some(_) => Ok(()),
        }
    }

    /// `umount2(MNT_DETACH)` of mount `mount_id` at `mount_point`, inside the namespace `via`
    /// enters, on a thread of its own with a deadline.
    fn unmount_in_namespace(
        &self,
        device: &DeviceName,
        via: &NsEntry,
        mount_point: &KernelText,
        mount_id: u32,
    ) -> Result<(), ActError> {
        let fail = |reason: String| ActError::Precondition { device: device.clone(), reason };
        let ns_file = via.ns_file(&self.host);
        // For a task, resolve the mount point from the task's own root (it may be chrooted); for
        // an entered namespace, from the namespace root that setns gives us.
        let root: Option<OwnedFd> = match via {
            NsEntry::Task { pid, tid } => {
                let p = self.host.proc_task(*pid, *tid).join("root");
                let f = File::options()
                    .read(true)
                    .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                    .open(&p)
                    .map_err(|e| fail(format!("cannot open {}: {e}", p.display())))?;
                Some(f.into())
            }
            _ => None,
        };
        // Our procfs, opened before entering: the namespace may have none of its own.
        let proc_fd: OwnedFd = File::open(self.host.proc())
            .map_err(|e| fail(format!("cannot open {}: {e}", self.host.proc().display())))?
            .into();
        // The raw bytes, never the escaped text: a name need not be UTF-8.
        let bytes = mount_point.as_bytes();
        let rel = PathBuf::from(match &bytes[bytes.iter().take_while(|&&b| b == b'/').count()..] {
            b"" => OsStr::new("."),
            r => OsStr::from_bytes(r),
        });
        bounded(device, "umount2(MNT_DETACH)", self.timeout, move || {
            nsenter::in_mount_ns(&ns_file, move || {
                let root = match root {
                    Some(fd) => fd,
                    None => File::options()
                        .read(true)
                        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                        .open("/")?
                        .into(),
                };
                unmount_exactly(&root, &rel, mount_id, &proc_fd)
            })
        })?;
        Ok(())
    }
}

/// Mount `mount_id` in `table`, still of `mount_dev` and with no mount beneath it (detaching
/// would take those too): `None` when it is gone, why not when it has changed.
fn still_planned(
    table: &[MountEntry],
    mount_id: u32,
    mount_dev: DevNum,
) -> Result<Option<&MountEntry>, String> {
    let Some(target) = table.iter().find(|m| m.mount_id == mount_id) else {
        return Ok(None);
    };
    if target.devnum != mount_dev {
        return Err(format!(
            "mount {mount_id} is now device {} at {}, not {mount_dev}",
            target.devnum, target.mount_point
        ));
    }
    let beneath: Vec<&KernelText> =
        table.iter().filter(|m| m.parent_id == mount_id).map(|m| &m.mount_point).collect();
    if !beneath.is_empty() {
        return Err(format!(
            "{} mount(s) sit beneath {} (first: {}); detaching would take them too: release those first",
            beneath.len(),
            target.mount_point,
            beneath[0]
        ));
    }
    Ok(Some(target))
}

#[cfg(test)]
mod detach_loop_identity {
    use super::*;

    /// A plan with no identity for the binding (no diskseq, no backing file device and inode)
    /// is refused before anything is opened: the number may be bound to another file by now.
    #[test]
    fn a_detach_with_no_identity_to_check_is_refused() {
        let a = LinuxActuator::new(HostRoot::new("/nonexistent"), Duration::from_secs(1));
        let name = DeviceName::new("loop7").expect("name");
        let err = a.detach_loop(&name, DevNum::new(7, 7), None, None, None).expect_err("refused");
        assert!(
            matches!(&err, ActError::Precondition { reason, .. } if reason.contains("no identity")),
            "{err:?}"
        );
        // With an identity, the same call goes on (here: no such device on the tree, so absent).
        let absent = a.detach_loop(&name, DevNum::new(7, 7), Some(12), None, None).expect("checked");
        assert_eq!(absent, StepOutcome::AlreadyAbsent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `f` on a thread of its own filesystem context (the unmount changes the working
    /// directory; the test process must not notice).
    fn own_fs<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS).expect("unshare(CLONE_FS)");
            f()
        })
        .join()
        .expect("thread")
    }

    /// A real mount: the path to it is resolved without symlinks and beneath the root, the mount
    /// must have the planned ID, and then exactly it is detached. Needs root (CI is).
    #[test]
    fn unmount_exactly_refuses_symlinks_escapes_and_other_mounts() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: unmounting needs root");
            return;
        }
        let dir = tempfile::Builder::new().prefix("bj-umount-").tempdir_in("/var/tmp").expect("tempdir");
        let mnt = dir.path().join("real/mnt");
        std::fs::create_dir_all(&mnt).expect("mkdir");
        std::os::unix::fs::symlink("real", dir.path().join("link")).expect("symlink");
        nix::mount::mount(Some("tmpfs"), &mnt, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
            .expect("mount tmpfs");
        let mounted = |p: &std::path::Path| {
            let t = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
            t.lines().any(|l| l.split(' ').nth(4) == p.to_str())
        };
        let id = sys::mount_id(File::open(&mnt).expect("open").as_fd()).expect("mount id") as u32;
        let open_dir = |p: &std::path::Path| -> OwnedFd {
            File::options()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
                .open(p)
                .expect("open dir")
                .into()
        };
        let try_unmount = |rel: &'static str, id: u32| {
            let (root, proc_fd) = (open_dir(dir.path()), open_dir(std::path::Path::new("/proc")));
            own_fs(move || unmount_exactly(&root, std::path::Path::new(rel), id, &proc_fd))
        };
        let e = try_unmount("link/mnt", id).expect_err("a symlink on the way");
        assert_eq!(e.raw_os_error(), None, "{e}");
        assert!(e.to_string().contains("without following symlinks"), "{e}");
        assert!(mounted(&mnt), "nothing was unmounted through a symlink");
        let e = try_unmount("real/../../mnt", id).expect_err("escapes the root");
        assert!(e.to_string().contains("without following symlinks"), "{e}");
        let e = try_unmount("real/mnt", id + 100_000).expect_err("another mount ID");
        assert!(e.to_string().contains(&format!("not {}", id + 100_000)), "{e}");
        assert!(mounted(&mnt));
        try_unmount("real/mnt", id).expect("the planned mount, resolved beneath the root");
        assert!(!mounted(&mnt), "detached");
    }
}
