//! Running a program in the host's mount and network namespaces (the iSCSI logout's
//! `iscsiadm`): a child forked with a `pre_exec` that `setns`es into PID 1's `ns/net` and
//! `ns/mnt`, waited for up to a deadline and killed after it.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::ActError;
use crate::host::HostRoot;
use crate::model::DeviceName;

/// Runs `program args` in PID 1's mount and network namespaces, waits up to the deadline
/// (then kills it), and returns its exit code and its output (stdout and stderr, bounded).
pub(super) fn run_in_host_namespaces(
    host: &HostRoot,
    device: &DeviceName,
    program: &Path,
    args: &[String],
    timeout: Duration,
) -> Result<(Option<i32>, String), ActError> {
    let op = "iscsiadm -m session -u";
    let sys = |source: std::io::Error| ActError::Syscall { device: device.clone(), op, source };
    let ns_dir = host.proc_pid(1).join("ns");
    let open = |name: &str| {
        let p = ns_dir.join(name);
        File::open(&p).map_err(|e| {
            ActError::precondition(
                device,
                format!("cannot open {} (the host's namespace; needs hostPID): {e}", p.display()),
            )
        })
    };
    let (mnt, net) = (open("mnt")?, open("net")?);
    let (mnt_fd, net_fd) = (mnt.as_raw_fd(), net.as_raw_fd());
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only makes two setns(2)
    // system calls on file descriptors opened before the fork (kept open by `mnt` and `net`,
    // which outlive `spawn`); it allocates nothing and takes no lock, as required between
    // fork and exec. The child is single-threaded, so joining a mount namespace is allowed.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(net_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setns(mnt_fd, libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(sys)?;
    drop((mnt, net));
    let mut out = child.stdout.take();
    let mut err = child.stderr.take();
    let reader = std::thread::Builder::new()
        .name("blockjanitor-iscsiadm".into())
        .spawn(move || {
            let mut text = Vec::new();
            for r in [out.as_mut().map(|o| o as &mut dyn Read), err.as_mut().map(|e| e as &mut dyn Read)]
                .into_iter()
                .flatten()
            {
                let _ = r.take(16 * 1024).read_to_end(&mut text);
            }
            String::from_utf8_lossy(&text).into_owned()
        })
        .map_err(sys)?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(sys)? {
            Some(s) => break s,
            None if started.elapsed() > timeout => {
                let _ = child.kill(); // our own child, by its handle
                let _ = child.wait();
                return Err(ActError::TimedOut { device: device.clone(), op, after: timeout });
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let text = reader.join().unwrap_or_default();
    Ok((status.code(), text))
}
