//! A process pinned by a pidfd (`pidfd_open(2)`, Linux 5.3) while it is checked: a PID is
//! reused as soon as its process is reaped, so what `/proc/PID/...` says belongs to the process
//! the PID named when the pidfd was opened only if that process has not exited by the time the
//! reads are done. [`Pidfd::exited`] asks exactly that (the pidfd polls readable once the process
//! has exited, zombie or reaped), so a check reads first and confirms after.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// An open pidfd.
#[derive(Debug)]
pub struct Pidfd {
    pid: u32,
    fd: OwnedFd,
}

impl Pidfd {
    /// `pidfd_open(pid, 0)`: `ESRCH` when no such process (or only a thread of that ID).
    pub fn open(pid: u32) -> io::Result<Self> {
        let p = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open takes a pid and flags; it returns a new fd or -1, touching no memory
        // of ours.
        let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, p, 0 as libc::c_uint) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let raw = libc::c_int::try_from(rc).map_err(|_| io::Error::other("pidfd_open returned no fd"))?;
        // SAFETY: the kernel just returned this fd to us; nothing else owns it.
        Ok(Self { pid, fd: unsafe { OwnedFd::from_raw_fd(raw) } })
    }

    /// The PID it was opened for.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the process has exited (a zombie has): once it has, its PID may name another
    /// process, and nothing read through `/proc/PID` since it was opened can be trusted.
    pub fn exited(&self) -> io::Result<bool> {
        let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd for the duration of the call; timeout 0 never blocks.
        let rc = unsafe { libc::poll(&mut p, 1, 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc > 0 && p.revents & libc::POLLIN != 0)
    }
}

/// The start time (field 22 of `/proc/PID/stat`, clock ticks after boot) in a `stat` line. The
/// command name (field 2) is in parentheses and may hold spaces and parentheses itself: the
/// fields are counted after its last `)`.
pub fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first, so field 22 is the twentieth.
    rest.split_ascii_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_is_field_22_whatever_the_name() {
        let line = "4242 (a) b) (c) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1000 10 18446744073709551615";
        assert_eq!(start_time(line), Some(98765));
        assert_eq!(start_time("4242 (x) S 1"), None);
        assert_eq!(start_time("no parenthesis"), None);
        let own = std::fs::read_to_string("/proc/self/stat").expect("stat");
        assert!(start_time(&own).is_some_and(|t| t > 0), "{own}");
    }

    /// On the live kernel: a pidfd follows its process, not its PID: running, it has not exited;
    /// killed (a zombie), it has, and stays so once reaped; a PID with no process has none.
    #[test]
    fn a_pidfd_says_when_its_process_exited() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("spawn");
        let fd = Pidfd::open(child.id()).expect("pidfd_open");
        assert_eq!(fd.pid(), child.id());
        assert!(!fd.exited().expect("poll"), "running");
        child.kill().expect("kill");
        // A zombie until reaped: already exited.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !fd.exited().expect("poll") && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(fd.exited().expect("poll"), "killed");
        child.wait().expect("reap");
        assert!(fd.exited().expect("poll"), "reaped");
        assert_eq!(Pidfd::open(child.id()).map(|_| ()).map_err(|e| e.raw_os_error()), Err(Some(libc::ESRCH)));
    }
}
