//! Removing a multipath map through multipathd, its owner, when multipathd runs.
//!
//! A map removed behind multipathd's back (`DM_DEV_REMOVE`) can be re-created by it from paths it
//! still knows, and its WWID stays in `/etc/multipath/wwids`, where multipath-tools takes it as a
//! multipath device the next time a path with that WWID appears. So while multipathd runs, a
//! multipath map (uuid `mpath-<wwid>`) is removed the way `multipathd del map NAME` does it, and
//! then its `/<wwid>/` line leaves the wwids file. multipathd is the root process named
//! `multipathd` that holds the listening control socket in its network namespace
//! ([`crate::discover::control_socket`]), pinned by a pidfd until its namespace is entered; a
//! process that only bears the name is not it.
//! Without multipathd the ioctl path (`act/multipath.rs`) stays. Fail closed: when multipathd runs
//! but cannot be reached, does not answer in time, or refuses, the step fails naming the map and
//! the map is left in place; it is never removed behind multipathd's back.
//!
//! The control socket (libmpathcmd): a stream socket bound to the ABSTRACT name
//! `/org/kernel/linux/storage/multipathd` (`@` + that in `/proc/net/unix`). A command is a
//! native `size_t` length (counting a terminating NUL) followed by the command and the NUL; the
//! reply is framed the same way. A reply starting with `fail\n` is a refusal; `ok\n` is the
//! success of a command that prints nothing (`del map`). Abstract sockets are per network
//! namespace, and the agent's pod has its own: the connection is made from a thread that entered
//! multipathd's own network namespace (`/proc/PID/ns/net`, [`crate::host::nsenter::in_net_ns`]).
//! `show daemon` goes first on the connection and `del map` follows only once it was answered, so
//! a daemon that does not answer (stopped, hung) never finds a removal queued on its socket that
//! it would carry out later, after the agent reported the step failed.
//!
//! Measured against multipath-tools 0.9.4 (Debian bookworm) in the guest: `del map mpatha` →
//! `ok\n`; a name it does not know, or the same map again → `fail\n`; the wwid stays in the
//! wwids file after `del map` (multipath-tools itself removes it only for `multipath -w`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::linux::{bounded, LinuxActuator};
use super::{ActError, StepOutcome};
use crate::host::dmioctl::{Control, DmRef};
use crate::model::{DevNum, DeviceName};
use crate::{host::durable, host::nsenter};

/// multipathd's control socket: an abstract name (no leading NUL here).
pub const SOCKET: &str = "/org/kernel/linux/storage/multipathd";

/// The process name (`comm`) of the daemon.
pub const COMM: &str = "multipathd";

/// libmpathcmd refuses replies this long or longer (`MAX_REPLY_LEN`, 32 MiB).
const MAX_REPLY: usize = 32 << 20;

/// How long a removal waits for a lock on the wwids file that multipath-tools holds.
const WWIDS_LOCK_WAIT: Duration = Duration::from_secs(2);

/// multipathd's answer to a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `ok`: the command succeeded and printed nothing.
    Ok,
    /// `fail`, with what followed it (often nothing).
    Fail(String),
    /// Anything else: the command's output (e.g. `show daemon` → `pid 172 idle`).
    Text(String),
}

impl Reply {
    /// Classifies a reply's text as libmpathcmd's clients do (`fail\n` prefix = failure).
    pub fn parse(text: &str) -> Self {
        if text == "ok\n" || text == "ok" {
            Reply::Ok
        } else if let Some(rest) = text.strip_prefix("fail\n") {
            Reply::Fail(rest.trim().to_owned())
        } else if text == "fail" {
            Reply::Fail(String::new())
        } else {
            Reply::Text(text.to_owned())
        }
    }
}

/// One request on the wire: the length (native `size_t`, counting the NUL), the command, a NUL.
pub fn encode(command: &str) -> Vec<u8> {
    let len = command.len() + 1;
    let mut out = Vec::with_capacity(std::mem::size_of::<usize>() + len);
    out.extend_from_slice(&len.to_ne_bytes());
    out.extend_from_slice(command.as_bytes());
    out.push(0);
    out
}

/// Reads one framed reply: the length, then that many bytes, the last a NUL.
pub fn read_reply(r: &mut impl Read) -> io::Result<String> {
    let mut len = [0u8; std::mem::size_of::<usize>()];
    r.read_exact(&mut len)?;
    let len = usize::from_ne_bytes(len);
    if len == 0 || len >= MAX_REPLY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("reply length {len} is out of range (1..{MAX_REPLY})"),
        ));
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    // libmpathcmd ends the string at the last byte whatever it is; so do we.
    body.truncate(len - 1);
    if let Some(nul) = body.iter().position(|&b| b == 0) {
        body.truncate(nul);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Connects to the abstract socket `name` (in this thread's network namespace), sends
/// `command` and reads the reply, each I/O bounded by `timeout`.
pub fn ask_here(name: &str, command: &str, timeout: Duration) -> io::Result<Reply> {
    exchange(&mut connect(name)?, command, timeout)
}

/// Connects to the abstract socket `name` in this thread's network namespace.
fn connect(name: &str) -> io::Result<UnixStream> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    UnixStream::connect_addr(&addr)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot connect to the control socket @{name}: {e}")))
}

/// Sends `command` on a connected stream and reads the reply, within `timeout` in all.
pub fn exchange(stream: &mut UnixStream, command: &str, timeout: Duration) -> io::Result<Reply> {
    exchange_until(stream, command, Instant::now() + timeout, timeout)
}

/// [`exchange`] by `deadline`; `timeout` is only named in errors.
fn exchange_until(
    stream: &mut UnixStream,
    command: &str,
    deadline: Instant,
    timeout: Duration,
) -> io::Result<Reply> {
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| io::Error::new(io::ErrorKind::TimedOut, format!("no answer within {timeout:?}")))
    };
    stream.set_write_timeout(Some(left()?))?;
    stream
        .write_all(&encode(command))
        .map_err(|e| io::Error::new(e.kind(), format!("cannot send '{command}': {e}")))?;
    let mut reader = DeadlineReader { stream, deadline, timeout };
    let text = read_reply(&mut reader).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            io::Error::new(io::ErrorKind::TimedOut, format!("no answer to '{command}' within {timeout:?}"))
        }
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("the connection closed before a whole answer to '{command}'"),
        ),
        _ => io::Error::new(e.kind(), format!("reading the answer to '{command}': {e}")),
    })?;
    Ok(Reply::parse(&text))
}

/// Reads with the socket's timeout set to what is left until the deadline before each read.
struct DeadlineReader<'a> {
    stream: &'a mut UnixStream,
    deadline: Instant,
    timeout: Duration,
}

impl Read for DeadlineReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.checked_duration_since(Instant::now()).filter(|d| !d.is_zero());
        let Some(left) = left else {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no answer within {:?}", self.timeout),
            ));
        };
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Asks the multipathd whose network namespace is `ns_file` (`/proc/PID/ns/net`): the socket
/// is created on a thread that entered that namespace.
pub fn ask_in(ns_file: &Path, name: &str, command: &str, timeout: Duration) -> io::Result<Reply> {
    let command = command.to_owned();
    connected_in(ns_file, name, move |s| exchange(s, &command, timeout))
}

/// Asks `show daemon` first and sends `command` on the same connection only once that was
/// answered: a daemon that does not answer (stopped, hung) never finds a destructive command
/// queued on its socket that it would carry out later, after the agent reported a failure.
/// Returns the probe's reply, and the command's unless the probe was refused. Both within
/// `timeout` in all.
pub fn ask_alive_in(
    ns_file: &Path,
    name: &str,
    command: &str,
    timeout: Duration,
) -> io::Result<(Reply, Option<Reply>)> {
    let command = command.to_owned();
    connected_in(ns_file, name, move |s| {
        let deadline = Instant::now() + timeout;
        let probe = exchange_until(s, PROBE, deadline, timeout)?;
        if matches!(probe, Reply::Fail(_)) {
            return Ok((probe, None));
        }
        let reply = exchange_until(s, &command, deadline, timeout)?;
        Ok((probe, Some(reply)))
    })
}

/// The harmless command that shows multipathd answers (`pid N idle`, `pid N running`...).
pub const PROBE: &str = "show daemon";

/// Connects to the abstract socket `name` from a thread in the network namespace `ns_file` and
/// runs `f` on the connection.
fn connected_in<R: Send + 'static>(
    ns_file: &Path,
    name: &str,
    f: impl FnOnce(&mut UnixStream) -> io::Result<R> + Send + 'static,
) -> io::Result<R> {
    let name = name.to_owned();
    nsenter::in_net_ns(ns_file, move || f(&mut connect(&name)?)).map_err(|e| {
        if e.raw_os_error().is_some() {
            // setns or open of the namespace file itself.
            io::Error::new(e.kind(), format!("cannot enter the network namespace {}: {e}", ns_file.display()))
        } else {
            e
        }
    })
}

/// `text` (a wwids file) without its `/<wwid>/` line(s); every other byte kept. `None` when no
/// such line is there.
pub fn without_wwid(text: &[u8], wwid: &str) -> Option<Vec<u8>> {
    let line = format!("/{wwid}/");
    let mut out = Vec::with_capacity(text.len());
    let mut found = false;
    for chunk in text.split_inclusive(|&b| b == b'\n') {
        let body = chunk.strip_suffix(b"\n").unwrap_or(chunk);
        if body == line.as_bytes() {
            found = true;
        } else {
            out.extend_from_slice(chunk);
        }
    }
    found.then_some(out)
}

/// Removes the `/<wwid>/` line from the wwids file at `path`: under a write lock on the file
/// (multipath-tools takes the same POSIX record lock when it writes it), read, written whole to
/// a temporary file beside it with the same mode, fsync'd, renamed over it, the directory fsync'd.
/// `Ok(false)`: no file, or no such line. (multipath-tools itself comments the line out in
/// place; a rename is what survives a crash whole. One race remains: a multipath-tools writer
/// that opened the file before the rename and waits for the lock appends its line to the old,
/// unlinked file; multipathd writes a map's wwid again whenever it sets the map up.)
pub fn remove_wwid(path: &Path, wwid: &str) -> io::Result<bool> {
    let ctx = |e: io::Error, what: &str| io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()));
    let mut file = match File::options()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(ctx(e, "cannot open")),
    };
    lock(&file).map_err(|e| ctx(e, "cannot lock"))?;
    let mut text = Vec::new();
    file.read_to_end(&mut text).map_err(|e| ctx(e, "cannot read"))?;
    let Some(new) = without_wwid(&text, wwid) else { return Ok(false) };
    let mode = file.metadata().map_err(|e| ctx(e, "cannot stat"))?.mode() & 0o7777;
    durable::replace(path, &new, mode).map_err(|e| ctx(e, "cannot replace"))?;
    Ok(true)
}

/// A write lock on the whole file (an open file description lock, which conflicts with the POSIX
/// record locks multipath-tools takes), retried until [`WWIDS_LOCK_WAIT`] has passed.
fn lock(file: &File) -> io::Result<()> {
    let flock = libc::flock {
        l_type: libc::F_WRLCK as libc::c_short,
        l_whence: libc::SEEK_SET as libc::c_short,
        l_start: 0,
        l_len: 0,
        l_pid: 0,
    };
    let started = Instant::now();
    loop {
        match nix::fcntl::fcntl(file.as_fd(), nix::fcntl::FcntlArg::F_OFD_SETLK(&flock)) {
            Ok(_) => return Ok(()),
            Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EACCES)
                if started.elapsed() < WWIDS_LOCK_WAIT =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

impl LinuxActuator {
    /// Removes the multipath map `uuid` through multipathd when a multipathd runs: `Ok(None)`
    /// when none does (the caller removes it with the ioctl). Called once the caller's
    /// preconditions (uuid, no active path, open count) hold.
    pub(super) fn dm_remove_via_multipathd(
        &self,
        device: &DeviceName,
        devnum: DevNum,
        uuid: &str,
        deferred: bool,
    ) -> Result<Option<StepOutcome>, ActError> {
        let Some(wwid) = uuid.strip_prefix("mpath-") else { return Ok(None) };
        let left = "the map is left in place: it is never removed behind multipathd's back";
        let Some(daemon) = self.multipathd(device, left)? else { return Ok(None) };
        let pid = daemon.id.pid;
        if deferred {
            return Err(ActError::precondition(
                device,
                format!("multipathd runs (pid {pid}) and a deferred removal cannot go through it; {left}"),
            ));
        }
        // The map's name, looked up by uuid, still the planned number.
        let control_path = self.host().dev_node("mapper/control");
        let header = Control::open(&control_path)
            .and_then(|c| c.dev_status(DmRef::Uuid(uuid)))
            .map_err(|e| ActError::precondition(device, format!("DM_DEV_STATUS of uuid '{uuid}': {e}")))?;
        if header.dev != devnum {
            return Err(ActError::precondition(
                device,
                format!("uuid '{uuid}' is now device {}, not {devnum}: the map was recreated", header.dev),
            ));
        }
        let name = header.name;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(ActError::precondition(
                device,
                format!("map name {name:?} cannot be passed to multipathd; {left}"),
            ));
        }
        let command = format!("del map {name}");
        self.ask_del_map(device, &daemon, &command, left)?;
        // multipathd said ok: the map must be gone (looked up by uuid again).
        let still = Control::open(&control_path).and_then(|c| c.dev_status(DmRef::Uuid(uuid)));
        match still {
            Ok(_) => {
                return Err(ActError::NotVerified {
                    device: device.clone(),
                    op: "multipathd del map",
                    reason: format!("the map {name} ({uuid}) is still there"),
                })
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO | libc::ENODEV | libc::ENOENT)) => {}
            Err(e) => {
                return Err(ActError::precondition(
                    device,
                    format!("DM_DEV_STATUS of uuid '{uuid}' after removal: {e}"),
                ))
            }
        }
        let wwid_note = self.forget_wwid(device, wwid);
        let exe = daemon.id.exe_path.as_ref().map_or_else(|| "?".to_owned(), |p| p.display().to_string());
        tracing::info!(target: "audit", device = %device, map = %name, pid, start = daemon.id.start, exe = %exe, "map removed through multipathd");
        Ok(Some(StepOutcome::DoneVia(format!(
            "removed through multipathd (pid {pid}, started at tick {}, {exe}, '{command}'); {wwid_note}",
            daemon.id.start
        ))))
    }

    /// Sends `command` to `daemon` (multipathd, pinned) on its control socket, from a thread in
    /// its network namespace (opened while the pidfd shows it is still that process, and entered
    /// through that open file): `show daemon` first, the command only once that was answered.
    /// `Ok` only on `ok`; anything else fails the step, `left` saying what stays.
    fn ask_del_map(
        &self,
        device: &DeviceName,
        daemon: &crate::discover::process_identity::PinnedProcess,
        command: &str,
        left: &str,
    ) -> Result<(), ActError> {
        let pid = daemon.id.pid;
        // Its network namespace, opened while the pidfd shows it is still the process found
        // (its PID not reused), and entered through that open file.
        let ns_net = File::open(self.host().proc_pid(pid).join("ns/net")).map_err(|e| {
            ActError::precondition(
                device,
                format!("cannot open the network namespace of multipathd (pid {pid}): {e}; {left}"),
            )
        })?;
        if !daemon.still_running() {
            return Err(ActError::precondition(
                device,
                format!("multipathd (pid {pid}) exited while it was being asked; {left}"),
            ));
        }
        let ns_file: PathBuf = self.host().proc().join(format!("self/fd/{}", ns_net.as_raw_fd()));
        // The socket's own deadline ends before the thread's, so a silent daemon is reported as
        // such rather than as a hung thread.
        let io_timeout = self.timeout().mul_f64(0.8);
        let (cmd, ns) = (command.to_owned(), ns_file.clone());
        let (probe, reply) = bounded(device, "multipathd del map", self.timeout(), move || {
            ask_alive_in(&ns, SOCKET, &cmd, io_timeout)
        })
        .map_err(|e| match e {
            ActError::Syscall { source, .. } => ActError::precondition(
                device,
                format!("multipathd (pid {pid}) runs, but asking it to '{command}' through its control socket failed: {source}; {left}"),
            ),
            other => other,
        })?;
        let Some(reply) = reply else {
            return Err(ActError::precondition(
                device,
                format!(
                    "multipathd (pid {pid}) refused '{PROBE}' ({probe:?}); '{command}' was not sent; {left}"
                ),
            ));
        };
        match reply {
            Reply::Ok => {}
            Reply::Fail(why) => {
                let why = if why.is_empty() { String::new() } else { format!(" ({why})") };
                return Err(ActError::precondition(
                    device,
                    format!("multipathd (pid {pid}) refused '{command}'{why}; {left}"),
                ));
            }
            Reply::Text(t) => {
                return Err(ActError::precondition(
                    device,
                    format!(
                        "multipathd (pid {pid}) answered '{command}' with {:?}, not ok; {left}",
                        t.trim()
                    ),
                ));
            }
        }
        drop(ns_net);
        Ok(())
    }

    /// Removes `wwid`'s line from the wwids file once its map is gone; what was done, in words
    /// (a failure is only logged: the map is gone, and multipathd writes a map's wwid again
    /// whenever it sets the map up).
    fn forget_wwid(&self, device: &DeviceName, wwid: &str) -> String {
        let wwids = self.host().multipath_wwids();
        let (path, id) = (wwids.clone(), wwid.to_owned());
        let edited = bounded(device, "edit the wwids file", self.timeout(), move || remove_wwid(&path, &id));
        match edited {
            Ok(true) => format!("wwid {wwid} removed from {}", wwids.display()),
            Ok(false) => format!("wwid {wwid} was not in {}", wwids.display()),
            Err(e) => {
                tracing::warn!(device = %device, wwid, "map removed through multipathd, but its wwid stays: {e}");
                format!("but wwid {wwid} could not be removed from {}: {e}", wwids.display())
            }
        }
    }

    /// The multipathd that owns its control socket, pinned (`None`: no multipathd runs). Never
    /// found by name alone: a process named `multipathd` must hold the listening socket bound to
    /// [`SOCKET`] in its network namespace and run as root. Refused (the step fails, `left` says
    /// what stays): a process not root holding that socket (someone squats the name); a root
    /// process named multipathd holding none (a daemon starting, or stopping: which maps it
    /// owns cannot be told); owners in two network namespaces (which one owns the map?).
    fn multipathd(
        &self,
        device: &DeviceName,
        left: &str,
    ) -> Result<Option<crate::discover::process_identity::PinnedProcess>, ActError> {
        use crate::discover::control_socket;
        let found = control_socket::owners(self.host(), COMM, SOCKET).map_err(|e| {
            ActError::precondition(device, format!("cannot tell whether multipathd runs ({e}); {left}"))
        })?;
        if let Some(p) = found.owners.iter().find(|p| p.id.euid != Some(0)) {
            return Err(ActError::precondition(
                device,
                format!(
                    "process {} (uid {}) holds multipathd's control socket @{SOCKET} but does not run as root: it is not multipathd, and whether the map is multipathd's cannot be told; {left}",
                    p.id.pid,
                    p.id.euid.map_or("?".to_owned(), |u| u.to_string())
                ),
            ));
        }
        let mut namespaces: Vec<u64> = found
            .owners
            .iter()
            .filter_map(|p| {
                std::fs::metadata(self.host().proc_pid(p.id.pid).join("ns/net")).ok().map(|m| m.ino())
            })
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let pids: Vec<String> = found.owners.iter().map(|p| p.id.pid.to_string()).collect();
        if namespaces.len() > 1 || (found.owners.len() > 1 && namespaces.len() != 1) {
            return Err(ActError::precondition(
                device,
                format!(
                    "multipathd runs in {} network namespaces (pids {}): which one owns the map is unclear; {left}",
                    namespaces.len(),
                    pids.join(", ")
                ),
            ));
        }
        if found.owners.is_empty() {
            let root: Vec<String> = found
                .others
                .iter()
                .filter(|&&pid| {
                    let status =
                        std::fs::read_to_string(self.host().proc_pid(pid).join("status")).unwrap_or_default();
                    crate::discover::process_identity::effective_uid(&status) == Some(0)
                })
                .map(u32::to_string)
                .collect();
            if !root.is_empty() {
                return Err(ActError::precondition(
                    device,
                    format!(
                        "a root process named multipathd (pid {}) runs but holds no control socket @{SOCKET} (starting, stopping, or a client): whether the map is multipathd's cannot be told; {left}",
                        root.join(", ")
                    ),
                ));
            }
            // Only processes that are not root bear the name: none of them is multipathd.
            return Ok(None);
        }
        Ok(found.owners.into_iter().next())
    }
}

#[cfg(test)]
#[path = "multipathd_tests.rs"]
mod tests;
