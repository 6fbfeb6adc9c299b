//! How many distinct open files a set of fds on one device node are, asked of the kernel.
//!
//! The kernel counts a device's openers per open file description (`struct file`), not per fd:
//! fds made by `dup`, inherited over `fork`, or passed over a unix socket (`SCM_RIGHTS`) share
//! one, and the device's open count has one open for all of them. The fd scan sees fds
//! ([`super::fds`]); to compare what it saw with a dm device's open count
//! ([`crate::judge::gates::openers`]), the fds are grouped into the open file descriptions they
//! are, with `kcmp(KCMP_FILE)` ([`crate::host::sys::same_open_file`]), pairwise within and across
//! the processes that hold the node.
//!
//! Asked right after the open count was read: an fd the scan saw that is no longer open on the
//! device (its process exited, the fd was closed or now names another file) is an opener that
//! left, and is not counted. One that closes between the count and this check was counted by the
//! kernel and is not here, so the count exceeds what is accounted for: refused, never the other
//! way round. Anything the kernel does not answer (no `CONFIG_KCMP`, `EPERM`, an fd that closes
//! while it is compared) and more comparisons than [`MAX_PAIRS`] are "cannot tell": an error,
//! which the gate turns into a refusal.

use crate::host::sys;
use crate::host::HostRoot;
use crate::model::DevNum;

/// At most this many `kcmp` calls for one device (each fd is compared with one fd of each open
/// file found so far: the readers stuck on one map hold a handful).
pub const MAX_PAIRS: usize = 1024;

/// What the fds on a device node are now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenFiles {
    /// Distinct open file descriptions among the fds still open on the device.
    pub distinct: usize,
    /// Fds (pid, fd) the scan saw that are no longer open on the device.
    pub gone: Vec<(u32, u32)>,
}

/// Groups `fds` (pid, fd), which a scan saw open on the block device node `devnum`, into the
/// open file descriptions they are now. Only on the live host ([`HostRoot::is_live`]: the PIDs
/// must be this process's own to ask the kernel about them). At most `max_pairs` comparisons.
pub fn count(
    host: &HostRoot,
    devnum: DevNum,
    fds: &[(u32, u32)],
    max_pairs: usize,
) -> Result<OpenFiles, String> {
    if fds.is_empty() {
        return Ok(OpenFiles::default());
    }
    if !host.is_live() {
        return Err(format!(
            "{} is not this process's procfs: the kernel cannot be asked which of its fds are one open file",
            host.proc().display()
        ));
    }
    let mut out = OpenFiles::default();
    let mut present = Vec::new();
    for &(pid, fd) in fds {
        let link = host.proc_pid(pid).join("fd").join(fd.to_string());
        match sys::stat_cached(&link) {
            Ok(id) if id.is_block_device() && id.rdev == devnum => present.push((pid, fd)),
            Ok(_) => out.gone.push((pid, fd)),
            Err(e) if super::is_gone(&e) => out.gone.push((pid, fd)),
            Err(e) => return Err(format!("cannot stat {}: {e}", link.display())),
        }
    }
    out.distinct = distinct(&present, &devnum.to_string(), max_pairs)?;
    Ok(out)
}

/// How many open file descriptions the open fds `present` (pid, fd) of `what` are: each fd is
/// compared with one fd of each open file found so far, at most `max_pairs` times in all.
fn distinct(present: &[(u32, u32)], what: &str, max_pairs: usize) -> Result<usize, String> {
    let mut files: Vec<(u32, u32)> = Vec::new();
    let mut pairs = 0usize;
    for &(pid, fd) in present {
        let mut known = false;
        for &(p, f) in &files {
            pairs += 1;
            if pairs > max_pairs {
                return Err(format!(
                    "more than {max_pairs} comparisons of the {} fd(s) open on {what}: too many to tell which are one open file",
                    present.len()
                ));
            }
            match sys::same_open_file(p, f, pid, fd) {
                Ok(true) => {
                    known = true;
                    break;
                }
                Ok(false) => {}
                Err(e) => {
                    return Err(format!(
                        "kcmp(KCMP_FILE) of fd {f} of pid {p} and fd {fd} of pid {pid} (both on {what}): {e}"
                    ))
                }
            }
        }
        if !known {
            files.push((pid, fd));
        }
    }
    Ok(files.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    /// On the live kernel: fds are counted per open file: a dup and an fd inherited by a child
    /// are one, a second open of the same node is another; a closed fd or a gone process is
    /// "cannot tell" (an error naming both fds); past the cap, "cannot tell" too.
    #[test]
    fn fds_are_counted_per_open_file() {
        let a = std::fs::File::open("/dev/null").expect("open");
        let b = std::fs::File::open("/dev/null").expect("open again");
        let dup = a.try_clone().expect("dup");
        let me = std::process::id();
        let fd = |f: &std::fs::File| u32::try_from(f.as_raw_fd()).expect("fd");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .stdin(std::process::Stdio::from(a.try_clone().expect("dup for the child")))
            .spawn()
            .expect("spawn sleep");
        let kid = child.id();
        let all = [(me, fd(&a)), (me, fd(&dup)), (kid, 0), (me, fd(&b))];
        let counted = distinct(&all, "/dev/null", MAX_PAIRS);
        let capped = distinct(&all, "/dev/null", 2);
        let shared = distinct(&all[..3], "/dev/null", MAX_PAIRS);
        let closed = distinct(&[(me, fd(&a)), (me, 999_999)], "/dev/null", MAX_PAIRS);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(counted, Ok(2), "a, its dup and the child's inherited fd are one open file; b another");
        assert_eq!(shared, Ok(1));
        assert_eq!(distinct(&[], "/dev/null", MAX_PAIRS), Ok(0));
        assert_eq!(distinct(&[(me, fd(&b))], "/dev/null", 0), Ok(1), "one fd needs no comparison");
        assert!(capped.as_ref().is_err_and(|e| e.starts_with("more than 2 comparisons")), "{capped:?}");
        let closed = closed.expect_err("fd 999999 is not open");
        assert!(closed.contains("fd 999999 of pid") && closed.contains("Bad file descriptor"), "{closed}");
        let gone = distinct(&[(me, fd(&a)), (kid, 0)], "/dev/null", MAX_PAIRS).expect_err("reaped");
        assert!(gone.contains("No such process"), "{gone}");
    }

    /// Only on the live host: a fixture tree's PIDs are nobody's.
    #[test]
    fn a_fixture_tree_cannot_be_asked() {
        let fixture = HostRoot::new("/nonexistent");
        let why = count(&fixture, DevNum::new(7, 0), &[(1, 3)], MAX_PAIRS).expect_err("not live");
        assert!(why.contains("not this process's procfs"), "{why}");
        assert_eq!(count(&fixture, DevNum::new(7, 0), &[], MAX_PAIRS), Ok(OpenFiles::default()));
    }
}
