//! Detaching exactly one planned mount, by the kernel calls that do it: the mount point opened
//! beneath a root with `openat2` refusing every symlink, its mount ID checked, and `umount2`
//! through the open file. `LinuxKernel`'s [`super::kernel::Kernel::unmount_in_ns`] runs it
//! inside the mount's namespace.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::mount::{umount2, MntFlags};

use crate::host::sys;

/// Detaches exactly the mount `mount_id` at `rel` (below `root`), in the current thread's mount
/// namespace. The path is resolved inside an untrusted namespace, so a container could swap any
/// directory on it for a symlink between the check and the unmount: it is opened with `openat2`
/// refusing every symlink and staying beneath `root`, the open mount's ID must be the planned
/// one, and the unmount goes through that open file (`/proc/thread-self/fd/N` of our own procfs),
/// never through the path again.
pub(super) fn unmount_exactly(
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
    umount2(via_fd.as_str(), MntFlags::MNT_DETACH).map_err(|e| match e {
        nix::errno::Errno::EINVAL => locked_or_not(proc_fd).unwrap_or_else(|| io::Error::from(e)),
        e => io::Error::from(e),
    })
}

/// Why `umount2` said `EINVAL` for a mount we had just checked is there: when this thread's
/// mount namespace belongs to another user namespace than ours (a user-namespaced pod or
/// rootless container), the mount came into it from a more privileged namespace (copied when
/// the namespace was made, or propagated later) and the kernel keeps it locked there
/// (`MNT_LOCKED`): no one may unmount it inside. Returns that error, or `None` (our own user
/// namespace: the plain `EINVAL` stands).
fn locked_or_not(proc_fd: &OwnedFd) -> Option<io::Error> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let open = |p: &str| openat(proc_fd.as_fd(), p, OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty()).ok();
    let owner = sys::owning_user_ns(open("thread-self/ns/mnt")?.as_fd()).ok()?;
    let ours = sys::stat_fd(open("thread-self/ns/user")?.as_fd()).ok()?.ino;
    (owner != ours).then(|| {
        io::Error::other(format!(
            "Invalid argument (os error 22): the kernel keeps this mount locked in its mount \
             namespace, which belongs to user namespace {owner} (a user-namespaced pod or rootless \
             container): it came there from the host's side, and goes only when it is unmounted where \
             it came from or the namespace's last process exits"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::OpenOptionsExt;

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
