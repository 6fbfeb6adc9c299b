//! Running a closure inside another mount namespace, safely.
//!
//! `setns(CLONE_NEWNS)` fails with EINVAL in a thread that shares its filesystem context with
//! others (every thread of a multithreaded process), and it changes the calling thread's root and
//! working directory. So each entry happens on a fresh, dedicated thread that first calls
//! `unshare(CLONE_FS)`, and that thread ends when the closure returns: it never goes back to a
//! pool or touches the rest of the process.
//!
//! A network namespace is entered the same way ([`in_net_ns`]): `setns(CLONE_NEWNET)` changes
//! only the calling thread, and a socket created there stays in that namespace for its whole life
//! (abstract unix sockets, such as multipathd's control socket, are per network namespace).

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use nix::fcntl::{openat, OFlag};
use nix::sched::{setns, unshare, CloneFlags};
use nix::sys::stat::Mode;

/// Opens the namespace file (`/proc/PID/task/TID/ns/mnt`, an nsfs bind mount, or
/// `/proc/PID/fd/N`), then runs `f` in a dedicated thread that has entered it.
pub fn in_mount_ns<R: Send + 'static>(
    ns_file: &Path,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let ns = File::open(ns_file)?;
    let handle =
        std::thread::Builder::new().name("blockjanitor-setns".into()).spawn(move || -> io::Result<R> {
            unshare(CloneFlags::CLONE_FS).map_err(io::Error::from)?;
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNS).map_err(io::Error::from)?;
            drop(ns);
            f()
        })?;
    handle.join().unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
}

/// Opens the network namespace file (`/proc/PID/ns/net`), then runs `f` in a dedicated thread
/// that has entered it. Sockets `f` creates belong to that namespace and may be used from any
/// thread afterwards.
pub fn in_net_ns<R: Send + 'static>(
    ns_file: &Path,
    f: impl FnOnce() -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let ns = File::open(ns_file)?;
    let handle = std::thread::Builder::new().name("blockjanitor-setns-net".into()).spawn(
        move || -> io::Result<R> {
            setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(io::Error::from)?;
            drop(ns);
            f()
        },
    )?;
    handle.join().unwrap_or_else(|_| Err(io::Error::other("namespace thread panicked")))
}

/// Reads the mount table of the namespace behind `ns_file` from inside it: the only way to see
/// a namespace no process lives in. `proc` is the procfs to read through; it is opened before
/// entering, because the namespace may have no `/proc` of its own.
pub fn read_mountinfo(ns_file: &Path, proc: &Path) -> io::Result<Vec<u8>> {
    let procfd: OwnedFd = File::open(proc)?.into();
    in_mount_ns(ns_file, move || {
        let fd = openat(&procfd, "thread-self/mountinfo", OFlag::O_RDONLY | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(io::Error::from)?;
        let mut text = Vec::new();
        File::from(fd).read_to_end(&mut text)?;
        Ok(text)
    })
}
