//! Removing a multipath map through multipathd, its owner, when multipathd runs: the control
//! socket's protocol and the wwids file (the step itself is `act/multipathd_remove.rs`).
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
use std::os::fd::AsFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{SocketAddr, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

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

#[cfg(test)]
#[path = "multipathd_tests.rs"]
mod tests;
