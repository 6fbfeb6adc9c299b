//! Whether this run can see the whole host at all: a run in a PID namespace of its own (a
//! container without `hostPID`, `unshare --pid`) reads a procfs that lists only its own
//! processes and gets no error for the others, so "nothing holds it" would be an answer about
//! a handful of processes (gotcha 31). Each reason found here becomes a blind spot over every
//! device, so no verdict, plan or `holders` answer rests on such a scan.
//!
//! The signs, read from the procfs the scan reads (never on a fixture tree):
//! - the procfs is not the initial PID namespace's: PID 1's `ns/pid` is not
//!   `pid:[4026531836]` (`PROC_PID_INIT_INO`), or kthreadd (a kernel thread, PID 2 there) is
//!   absent: kernel threads have PIDs only in the initial namespace;
//! - this process is not in the procfs's namespace: its `self` link names another PID than its
//!   own `getpid()`, or its `NSpid:` line has more than one level (it sits in a namespace
//!   below the one the procfs lists), so its own files cannot be told from another process's;
//! - it is in a mount namespace other than the host's, and the host's root cannot be reached
//!   through PID 1's or kthreadd's `root` link (the host's paths cannot be resolved).

use std::path::Path;

use crate::host::HostRoot;
use crate::model::MountNsId;

/// `PROC_PID_INIT_INO`: the inode of the initial PID namespace, fixed by the kernel.
pub const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// `PF_KTHREAD` in `stat`'s flags field.
const PF_KTHREAD: u64 = 0x0020_0000;

/// What to do about it, said once at the end of every reason.
const REMEDY: &str = "run it in the host's PID namespace: in a pod `hostPID: true`, with podman or docker `--pid=host`, from a shell `nsenter -t 1 -p -m -- COMMAND`";

/// Why the procfs at `host.proc()` is not a view of every process of the host, one reason per
/// sign ([`self`] lists them); empty when it is, and on a fixture tree (no procfs).
pub fn pid_namespace_gaps(host: &HostRoot) -> Vec<String> {
    if !is_procfs(host.proc()) {
        return Vec::new();
    }
    let mut out = Vec::new();
    if let Some(why) = not_initial(host) {
        out.push(format!("{why}: this run sees only the processes of that namespace, and no error tells it of the others; {REMEDY}"));
    }
    if let Some(why) = not_in_it(host) {
        out.push(format!(
            "{why}: it cannot tell its own open files and mounts from another process's; {REMEDY}"
        ));
    }
    out
}

/// Why the host's root cannot be reached from a run in mount namespace `own` when the host's
/// is `host_ns` (`None`: it is the host's, or a root could be opened, or this is a fixture).
pub fn host_root_gap(host: &HostRoot, own: Option<MountNsId>, host_ns: MountNsId) -> Option<String> {
    if own == Some(host_ns) || !is_procfs(host.proc()) {
        return None;
    }
    let roots = host.host_fs_roots();
    let errors: Vec<String> = roots
        .iter()
        .filter_map(|r| crate::host::sys::stat_cached(r).err().map(|e| format!("{}: {e}", r.display())))
        .collect();
    if errors.len() < roots.len() {
        return None;
    }
    Some(format!(
        "this run is in mount namespace {} and the host's is {host_ns}, but the host's root cannot be reached ({}): the host's paths (protected directories, swap files) cannot be resolved; run it with the host's PID namespace and CAP_SYS_PTRACE, or in the host's mount namespace",
        own.map_or("?".to_owned(), |n| n.to_string()),
        errors.join("; ")
    ))
}

/// Whether `path` is a procfs (a fixture tree is a plain directory).
fn is_procfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::PROC_SUPER_MAGIC)
}

/// Why the procfs is not the initial PID namespace's, if it is not.
fn not_initial(host: &HostRoot) -> Option<String> {
    let init_ns = std::fs::read_link(host.proc_pid(1).join("ns/pid")).ok();
    if let Some(ns) = init_ns.as_ref().and_then(|p| p.to_str()) {
        if ns != INITIAL_PID_NS {
            return Some(format!(
                "{} is the procfs of PID namespace {ns}, not the host's ({INITIAL_PID_NS})",
                host.proc().display()
            ));
        }
    }
    match kthreadd(host) {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "{} lists no kthreadd (PID 2 is not the kernel thread kthreadd): it is not the host's PID namespace, where every kernel thread has its PID",
            host.proc().display()
        )),
        // PID 1 said the namespace is the initial one: an unreadable PID 2 is no sign.
        Err(_) if init_ns.is_some() => None,
        Err(e) => Some(format!(
            "neither PID 1's ns/pid nor PID 2's stat can be read in {} ({e}): whether it lists every process of the host cannot be told",
            host.proc().display()
        )),
    }
}

/// Whether PID 2 is kthreadd (a kernel thread of that name).
fn kthreadd(host: &HostRoot) -> std::io::Result<bool> {
    let stat = match std::fs::read(host.proc_pid(2).join("stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(stat_is_kthreadd(&stat))
}

/// `stat` of kthreadd: `2 (kthreadd) S 0 0 0 0 -1 FLAGS ...` with `PF_KTHREAD` in FLAGS.
fn stat_is_kthreadd(stat: &[u8]) -> bool {
    let Some(close) = stat.iter().rposition(|&b| b == b')') else { return false };
    let Some(open) = stat.iter().position(|&b| b == b'(') else { return false };
    if open >= close || &stat[open + 1..close] != b"kthreadd" {
        return false;
    }
    // After ") ": state ppid pgrp session tty_nr tpgid flags.
    let rest = String::from_utf8_lossy(&stat[close + 1..]);
    rest.split_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Why this process is not in the procfs's PID namespace, if it is not.
fn not_in_it(host: &HostRoot) -> Option<String> {
    let own = std::process::id();
    let self_pid = std::fs::read_link(host.proc().join("self"))
        .ok()
        .and_then(|p| p.to_str().and_then(|s| s.parse::<u32>().ok()));
    match self_pid {
        None => {
            return Some(format!(
                "{}/self does not name this process (pid {own}): it is not in that procfs's PID namespace",
                host.proc().display()
            ))
        }
        Some(p) if p != own => {
            return Some(format!(
                "this process is pid {p} in {} but pid {own} in its own PID namespace: it runs in a namespace below the one that procfs lists",
                host.proc().display()
            ))
        }
        Some(_) => {}
    }
    let status = std::fs::read_to_string(host.proc().join("self/status")).ok()?;
    let levels = nspid_levels(&status)?;
    (levels > 1).then(|| {
        format!(
            "this process's NSpid has {levels} levels in {}: it is in a PID namespace below that procfs's",
            host.proc().display()
        )
    })
}

/// The number of PIDs on the `NSpid:` line of a `status` file (`None`: no such line, before
/// Linux 4.1).
fn nspid_levels(status: &str) -> Option<usize> {
    status.lines().find_map(|l| l.strip_prefix("NSpid:")).map(|v| v.split_whitespace().count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kthreadd_is_told_by_its_name_and_flag() {
        // Real lines (Linux 6.18): kthreadd, and a user process that named itself kthreadd.
        let kthreadd = b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 2 0 0 18446744073709551615 0 0 0 0 0 0 0 2147483647 0 0 0 0 0 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert!(stat_is_kthreadd(kthreadd));
        let impostor = b"2 (kthreadd) S 1 2 2 0 -1 4194560 90 0 0 0 0 0 0 0 20 0 1 0 9 2334720 200 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0 0 0 0 0 0 0 0 0\n";
        assert!(!stat_is_kthreadd(impostor), "a user process named kthreadd lacks PF_KTHREAD");
        let other = b"2 (sh) S 1 2 2 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 2 0\n";
        assert!(!stat_is_kthreadd(other));
        assert!(!stat_is_kthreadd(b"garbage"));
    }

    #[test]
    fn nspid_levels_count_the_namespaces_below_the_procfs() {
        assert_eq!(nspid_levels("Name:\tsh\nNSpid:\t4242\nNSpgid:\t4242\n"), Some(1));
        assert_eq!(nspid_levels("Name:\tsh\nNSpid:\t4242\t1\n"), Some(2));
        assert_eq!(nspid_levels("Name:\tsh\n"), None);
    }

    #[test]
    fn a_fixture_tree_is_not_judged() {
        let dir = tempfile::tempdir().expect("tempdir");
        let host = HostRoot::new(dir.path());
        assert!(pid_namespace_gaps(&host).is_empty());
    }

    /// On the live host (CI runs as root in the host's PID namespace): no gap.
    #[test]
    fn the_live_host_procfs_has_no_gap() {
        let ns = std::fs::read_link("/proc/self/ns/pid").ok().map(|p| p.to_string_lossy().into_owned());
        if ns.as_deref() != Some(INITIAL_PID_NS) {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs in the host's PID namespace");
            eprintln!("SKIPPED: this test runs in PID namespace {ns:?}, not the host's");
            return;
        }
        assert_eq!(pid_namespace_gaps(&HostRoot::default()), Vec::<String>::new());
    }
}
