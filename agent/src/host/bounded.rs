//! Reads that may block on a hung device or filesystem, run on a thread of their own with a
//! deadline.
//!
//! Some kernel reads wait for whatever sits behind a file: `LOOP_GET_STATUS64` asks the backing
//! file's filesystem for fresh attributes (a FUSE or NFS server that stopped answering never
//! replies), and `/proc/PID/maps` of a process in D state waits for its mmap lock. A scan must
//! not wait for them: [`read`] runs one such read on a named helper thread and gives up after
//! its deadline, reporting the read as blocked. The helper thread stays in the kernel until the
//! read returns (a thread in an uninterruptible wait cannot be cancelled); while it does, a
//! read of the same key is refused at once instead of starting a second thread, so a hung
//! device costs at most one thread per key however many scans run.
//!
//! A blocked read may hold a device node open (a loop device's `LOOP_GET_STATUS64`): such an fd
//! is marked ([`mark_fd`]) for as long as it is open, so that the scan of this agent's own files
//! does not report the agent's probe as a holder of the device it is probing.

use std::collections::BTreeSet;
use std::sync::{mpsc, Mutex};
use std::time::Duration;

/// Reads still blocked on their helper thread, by key.
static BLOCKED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Fds of this process that a bounded read holds open.
static PROBE_FDS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// Marks an fd of this process as a bounded read's probe until the mark is dropped (drop the mark
/// before closing the fd, so a reused number is never taken for a probe).
pub struct FdMark(i32);

/// Marks `fd` (see [`FdMark`]).
pub fn mark_fd(fd: i32) -> FdMark {
    PROBE_FDS.lock().unwrap_or_else(|p| p.into_inner()).insert(fd);
    FdMark(fd)
}

impl Drop for FdMark {
    fn drop(&mut self) {
        PROBE_FDS.lock().unwrap_or_else(|p| p.into_inner()).remove(&self.0);
    }
}

/// Whether `fd` of this process is held open by a bounded read now.
pub fn is_probe_fd(fd: i32) -> bool {
    PROBE_FDS.lock().unwrap_or_else(|p| p.into_inner()).contains(&fd)
}

/// Why a bounded read gave no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Blocked {
    /// The read did not return within its deadline; its thread is left to finish.
    #[error("blocked for more than {0:?}")]
    TimedOut(Duration),
    /// An earlier read of the same key is still blocked: no second thread was started.
    #[error("an earlier read is still blocked")]
    StillBlocked,
    /// No helper thread could be started.
    #[error("cannot start a thread for it: {0}")]
    Spawn(String),
}

/// How many reads are blocked on their helper thread now (for metrics and the node's status).
pub fn blocked_now() -> usize {
    BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).len()
}

/// Whether a read of `key` is blocked on its helper thread now.
pub fn is_blocked(key: &str) -> bool {
    BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).contains(key)
}

/// Runs `f` on a helper thread named after `key` and waits for it at most `deadline`.
pub fn read<T: Send + 'static>(
    key: String,
    deadline: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Blocked> {
    {
        let mut blocked = BLOCKED.lock().unwrap_or_else(|p| p.into_inner());
        if !blocked.insert(key.clone()) {
            return Err(Blocked::StillBlocked);
        }
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let done = key.clone();
    let name: String = format!("bj-read-{key}").chars().take(15).collect();
    let spawned = std::thread::Builder::new().name(name).spawn(move || {
        let r = f();
        BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).remove(&done);
        let _ = tx.send(r);
    });
    if let Err(e) = spawned {
        BLOCKED.lock().unwrap_or_else(|p| p.into_inner()).remove(&key);
        return Err(Blocked::Spawn(e.to_string()));
    }
    rx.recv_timeout(deadline).map_err(|_| Blocked::TimedOut(deadline))
}

/// How a kernel call on its own bounded thread ([`call`]) failed.
#[derive(Debug)]
pub enum CallError {
    /// The thread could not be started, or the call returned this error.
    Failed(std::io::Error),
    /// The call did not return within the deadline; its thread is left running on its own.
    TimedOut,
}

/// Runs the kernel call `f` for `device` on its own thread (named after `op`) and waits for it at
/// most `timeout`; a call that hangs is abandoned (logged) and reported as [`CallError::TimedOut`].
pub fn call<R: Send + 'static>(
    device: &crate::model::DeviceName,
    op: &'static str,
    timeout: Duration,
    f: impl FnOnce() -> std::io::Result<R> + Send + 'static,
) -> Result<R, CallError> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name(format!("blockjanitor-{op}"))
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(CallError::Failed)?;
    match rx.recv_timeout(timeout) {
        Ok(r) => r.map_err(CallError::Failed),
        Err(_) => {
            tracing::error!(device = %device, op, ?timeout, "kernel call hung; abandoning its thread");
            Err(CallError::TimedOut)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_fd_is_a_probe_until_its_mark_drops() {
        let m = mark_fd(987_654);
        assert!(is_probe_fd(987_654));
        drop(m);
        assert!(!is_probe_fd(987_654));
    }

    #[test]
    fn a_read_that_returns_in_time_is_its_answer() {
        assert_eq!(read("test-quick".into(), Duration::from_secs(5), || 42), Ok(42));
        assert!(!is_blocked("test-quick"));
    }

    #[test]
    fn a_blocked_read_times_out_and_is_not_started_twice() {
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let r = read("test-slow".into(), Duration::from_millis(50), move || {
            let _ = release_rx.recv();
            1
        });
        assert_eq!(r, Err(Blocked::TimedOut(Duration::from_millis(50))));
        assert!(is_blocked("test-slow"));
        assert_eq!(read("test-slow".into(), Duration::from_secs(5), || 2), Err(Blocked::StillBlocked));
        release_tx.send(()).expect("release");
        let start = std::time::Instant::now();
        while is_blocked("test-slow") && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!is_blocked("test-slow"), "the helper finished");
        assert_eq!(read("test-slow".into(), Duration::from_secs(5), || 3), Ok(3));
    }
}
