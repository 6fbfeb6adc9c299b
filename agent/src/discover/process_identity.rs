//! Who a process is, not what it calls itself: its PID pinned by a pidfd while it is read
//! ([`crate::host::pidfd`]), its start time (field 22 of `stat`, clock ticks after boot: a PID
//! reused by another process has another), its executable (`/proc/PID/exe`: the file's device
//! and inode, and its path) and its effective user. `comm` is whatever the process set
//! (`prctl(PR_SET_NAME)`): any user can name a process `multipathd` or `blockjanitor-agent`, so
//! it only ever narrows a search, never proves anything.
//!
//! Everything is read while the pidfd is held, and the pidfd is asked afterwards whether the
//! process exited meanwhile ([`PinnedProcess::still_running`]): if it did not, every read was of
//! that process. Only on the live host (a fixture tree's PIDs are nobody's).

use std::path::PathBuf;

use crate::host::pidfd::{self, Pidfd};
use crate::host::{sys, HostRoot};
use crate::model::DevNum;

/// What identifies one process among every process of a boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessIdentity {
    pub pid: u32,
    /// Field 22 of `stat`: when it started, in clock ticks after boot.
    pub start: u64,
    /// Its executable's device and inode (`None`: no executable, a kernel thread).
    pub exe: Option<(DevNum, u64)>,
    /// The executable's path as the link reads (`... (deleted)` once replaced).
    pub exe_path: Option<PathBuf>,
    /// The effective user ID (`Uid:` in `status`, second field).
    pub euid: Option<u32>,
}

/// A process read while pinned by its pidfd.
#[derive(Debug)]
pub struct PinnedProcess {
    pub id: ProcessIdentity,
    pidfd: Pidfd,
}

impl PinnedProcess {
    /// Whether the process is still the one that was read (it has not exited, so its PID has
    /// not been reused). An error of the pidfd counts as "no".
    pub fn still_running(&self) -> bool {
        self.pidfd.exited().is_ok_and(|exited| !exited)
    }
}

/// Reads process `pid` of the live host pinned by a pidfd: `Ok(None)` when it is gone (or exits
/// while it is read); `Err` when it cannot be read (why).
pub fn pin(host: &HostRoot, pid: u32) -> Result<Option<PinnedProcess>, String> {
    if !host.is_live() {
        return Err(format!(
            "{} is not this process's procfs: process {pid} cannot be pinned",
            host.proc().display()
        ));
    }
    let pidfd = match Pidfd::open(pid) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(None),
        Err(e) => return Err(format!("pidfd_open({pid}): {e}")),
    };
    let dir = host.proc_pid(pid);
    let stat = match std::fs::read_to_string(dir.join("stat")) {
        Ok(s) => s,
        Err(e) if super::is_gone(&e) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", dir.join("stat").display())),
    };
    let start = pidfd::start_time(&stat)
        .ok_or_else(|| format!("{}: no start time in {stat:?}", dir.join("stat").display()))?;
    let exe = sys::stat_cached(&dir.join("exe")).ok().map(|id| (id.dev, id.ino));
    let exe_path = std::fs::read_link(dir.join("exe")).ok();
    let euid = std::fs::read_to_string(dir.join("status")).ok().and_then(|s| effective_uid(&s));
    let p = PinnedProcess { id: ProcessIdentity { pid, start, exe, exe_path, euid }, pidfd };
    Ok(p.still_running().then_some(p))
}

/// The effective user ID in a `status` text (`Uid:\treal\teffective\tsaved\tfs`).
pub fn effective_uid(status: &str) -> Option<u32> {
    status.lines().find_map(|l| l.strip_prefix("Uid:"))?.split_ascii_whitespace().nth(1)?.parse().ok()
}

/// Whether the process that wrote a journal record, `pid` started at `start` (clock ticks after
/// boot), is still running: a process at `pid` with another start time is another process (the
/// PID was reused), and the writer is dead. Read pinned.
pub fn same_process_running(host: &HostRoot, pid: u32, start: u64) -> Result<bool, String> {
    Ok(pin(host, pid)?.is_some_and(|p| p.id.start == start && p.still_running()))
}

/// Whether process `pid` runs the same executable file (device and inode) as this process, as
/// root: for a journal record written before records carried their writer's start time, the
/// best there is (a name proves nothing: any process can call itself `blockjanitor-agent`).
pub fn runs_this_executable(host: &HostRoot, pid: u32) -> Result<bool, String> {
    let me = own(host)?;
    let Some(exe) = me.exe else { return Err("this process's executable cannot be read".to_owned()) };
    Ok(pin(host, pid)?.is_some_and(|p| p.id.exe == Some(exe) && p.id.euid == Some(0) && p.still_running()))
}

/// This process's own identity (its start time and executable), read from the live procfs.
pub fn own(host: &HostRoot) -> Result<ProcessIdentity, String> {
    pin(host, std::process::id())?
        .map(|p| p.id)
        .ok_or_else(|| "this process is not in its own procfs".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_effective_uid_is_the_second_field() {
        assert_eq!(effective_uid("Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n"), Some(0));
        assert_eq!(effective_uid("Name:\tx\n"), None);
    }

    /// On the live kernel: a process is its PID and start time; a child reads as itself while
    /// it runs (its executable is `sleep`'s file), and as gone once reaped.
    #[test]
    fn a_running_process_is_read_pinned_and_a_reaped_one_is_gone() {
        let host = HostRoot::default();
        if !host.is_live() {
            return;
        }
        let me = own(&host).expect("own identity");
        assert_eq!(me.pid, std::process::id());
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        let p = pin(&host, child.id()).expect("readable").expect("running");
        assert!(p.still_running());
        assert!(p.id.start >= me.start, "a child starts after its parent");
        let sleep = sys::stat_cached(&p.id.exe_path.clone().expect("exe path")).expect("stat sleep");
        assert_eq!(p.id.exe, Some((sleep.dev, sleep.ino)));
        child.kill().expect("kill");
        child.wait().expect("reap");
        assert!(!p.still_running(), "exited: its PID may be someone else's now");
        assert!(pin(&host, child.id()).expect("no error").is_none());
        assert!(pin(&HostRoot::new("/nonexistent"), 1).is_err());
    }
}
