//! Network namespaces a test creates (deleted on drop, even on panic), a veth pair between two of
//! them, and ways to run something inside one: a child process (`setns` before `exec`) or the
//! calling thread (for a test's own gRPC client). Every client of a namespace's address runs
//! inside a namespace the test created; nothing here touches the root namespace's interfaces.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

use crate::sh;

/// A named network namespace (`ip netns add`), deleted on drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates `name` (a stale one of that name, left by a killed run, is replaced) with its
    /// loopback up.
    pub fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh("ip", &["netns", "add", name]);
        let ns = NetNs { name: name.to_owned() };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Runs `ip -n NAME ARGS...`, panicking with its output when it fails.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    fn file(&self) -> File {
        let path = format!("/run/netns/{}", self.name);
        File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"))
    }

    /// Makes `cmd` start inside this namespace.
    pub fn enter_command(&self, cmd: &mut Command) {
        let f = Arc::new(self.file());
        // SAFETY: the closure runs in the forked child before exec and only calls setns(2), which
        // is async-signal-safe; the fd stays open because the closure owns the file.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }

    /// Moves the calling thread into this namespace for good: call it on a thread of its own
    /// (sockets it opens afterwards, and processes it spawns, are in the namespace).
    pub fn enter_this_thread(&self) {
        let f = self.file();
        // SAFETY: setns(2) on a file descriptor we own; it changes only this thread's namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns into {}: {}", self.name, std::io::Error::last_os_error());
    }
}

impl NetNs {
    /// Moves the calling thread into the namespace `name` (under /run/netns, made by someone
    /// else, e.g. the Ceph cluster's) for good: call it on a thread of its own.
    pub fn enter_named_thread(name: &str) {
        let path = format!("/run/netns/{name}");
        let f = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        // SAFETY: setns(2) on a file descriptor we own; it changes only this thread's namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "setns into {name}: {}", std::io::Error::last_os_error());
    }

    /// Makes `cmd` start inside the namespace `name` (under /run/netns).
    pub fn enter_named_command(name: &str, cmd: &mut Command) {
        let path = format!("/run/netns/{name}");
        let f = Arc::new(File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}")));
        // SAFETY: the closure runs in the forked child before exec and only calls setns(2), which
        // is async-signal-safe; the fd stays open because the closure owns the file.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Connects `a` and `b` with a veth pair (`a_if` in `a` with `a_cidr`, `b_if` in `b` with
/// `b_cidr`), both ends up. Deleting either namespace deletes the pair.
pub fn veth(a: &NetNs, a_if: &str, a_cidr: &str, b: &NetNs, b_if: &str, b_cidr: &str) {
    a.ip(&["link", "add", a_if, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
    a.ip(&["addr", "add", a_cidr, "dev", a_if]);
    b.ip(&["addr", "add", b_cidr, "dev", b_if]);
    a.ip(&["link", "set", a_if, "up"]);
    b.ip(&["link", "set", b_if, "up"]);
}
