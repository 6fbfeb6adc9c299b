//! Removing a multipath map through multipathd, its owner, when multipathd runs.
//!
//! A map removed behind multipathd's back (`DM_DEV_REMOVE`) can be re-created by it from paths it
//! still knows, and its WWID stays in `/etc/multipath/wwids`, where multipath-tools takes it as a
//! multipath device the next time a path with that WWID appears. So while a process named
//! `multipathd` runs, a multipath map (uuid `mpath-<wwid>`) is removed the way
//! `multipathd del map NAME` does it, and then its `/<wwid>/` line leaves the wwids file.
//! Without multipathd the ioctl path (`act/storage.rs`) stays. Fail closed: when multipathd runs
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

/// The PIDs of processes named `multipathd` under the procfs `proc` (thread-group leaders only:
/// what `/proc` lists). A process that exits meanwhile is skipped.
pub fn daemons(proc: &Path) -> io::Result<Vec<u32>> {
    let mut pids = Vec::new();
    for e in std::fs::read_dir(proc)? {
        let e = e?;
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        match std::fs::read(e.path().join("comm")) {
            Ok(comm) if comm.strip_suffix(b"\n").unwrap_or(&comm) == COMM.as_bytes() => pids.push(pid),
            _ => {}
        }
    }
    pids.sort_unstable();
    Ok(pids)
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

fn precondition(device: &DeviceName, reason: String) -> ActError {
    ActError::Precondition { device: device.clone(), reason }
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
        let proc = self.host().proc().to_owned();
        let pids = daemons(&proc).map_err(|e| {
            precondition(
                device,
                format!("cannot tell whether multipathd runs (listing {}: {e})", proc.display()),
            )
        })?;
        let Some(&pid) = pids.first() else { return Ok(None) };
        let left = "the map is left in place: it is never removed behind multipathd's back";
        if deferred {
            return Err(precondition(
                device,
                format!("multipathd runs (pid {pid}) and a deferred removal cannot go through it; {left}"),
            ));
        }
        // One daemon per network namespace we could ask: more is ambiguous.
        let mut namespaces: Vec<(u64, u32)> = pids
            .iter()
            .filter_map(|&p| {
                let st = std::fs::metadata(self.host().proc_pid(p).join("ns/net")).ok()?;
                Some((st.ino(), p))
            })
            .collect();
        namespaces.sort_unstable();
        namespaces.dedup_by_key(|(ino, _)| *ino);
        if namespaces.len() > 1 {
            let list: Vec<String> = pids.iter().map(u32::to_string).collect();
            return Err(precondition(
                device,
                format!(
                    "multipathd runs in {} network namespaces (pids {}): which one owns the map is unclear; {left}",
                    namespaces.len(),
                    list.join(", ")
                ),
            ));
        }
        // The map's name, looked up by uuid, still the planned number.
        let control_path = self.host().dev_node("mapper/control");
        let header = Control::open(&control_path)
            .and_then(|c| c.dev_status(DmRef::Uuid(uuid)))
            .map_err(|e| precondition(device, format!("DM_DEV_STATUS of uuid '{uuid}': {e}")))?;
        if header.dev != devnum {
            return Err(precondition(
                device,
                format!("uuid '{uuid}' is now device {}, not {devnum}: the map was recreated", header.dev),
            ));
        }
        let name = header.name;
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control()) {
            return Err(precondition(
                device,
                format!("map name {name:?} cannot be passed to multipathd; {left}"),
            ));
        }
        let command = format!("del map {name}");
        let ns_file: PathBuf = self.host().proc_pid(pid).join("ns/net");
        // The socket's own deadline ends before the thread's, so a silent daemon is reported as
        // such rather than as a hung thread.
        let io_timeout = self.timeout().mul_f64(0.8);
        let (cmd, ns) = (command.clone(), ns_file.clone());
        let (probe, reply) = bounded(device, "multipathd del map", self.timeout(), move || {
            ask_alive_in(&ns, SOCKET, &cmd, io_timeout)
        })
        .map_err(|e| match e {
            ActError::Syscall { source, .. } => precondition(
                device,
                format!("multipathd (pid {pid}) runs, but asking it to '{command}' through its control socket failed: {source}; {left}"),
            ),
            other => other,
        })?;
        let Some(reply) = reply else {
            return Err(precondition(
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
                return Err(precondition(
                    device,
                    format!("multipathd (pid {pid}) refused '{command}'{why}; {left}"),
                ));
            }
            Reply::Text(t) => {
                return Err(precondition(
                    device,
                    format!(
                        "multipathd (pid {pid}) answered '{command}' with {:?}, not ok; {left}",
                        t.trim()
                    ),
                ));
            }
        }
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
                return Err(precondition(
                    device,
                    format!("DM_DEV_STATUS of uuid '{uuid}' after removal: {e}"),
                ))
            }
        }
        let wwids = self.host().multipath_wwids();
        let (path, id) = (wwids.clone(), wwid.to_owned());
        let edited = bounded(device, "edit the wwids file", self.timeout(), move || remove_wwid(&path, &id));
        let wwid_note = match edited {
            Ok(true) => format!("wwid {wwid} removed from {}", wwids.display()),
            Ok(false) => format!("wwid {wwid} was not in {}", wwids.display()),
            Err(e) => {
                tracing::warn!(device = %device, wwid, "map removed through multipathd, but its wwid stays: {e}");
                format!("but wwid {wwid} could not be removed from {}: {e}", wwids.display())
            }
        };
        tracing::info!(target: "audit", device = %device, map = %name, pid, "map removed through multipathd");
        Ok(Some(StepOutcome::DoneVia(format!(
            "removed through multipathd (pid {pid}, '{command}'); {wwid_note}"
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// The wwids file exactly as multipath-tools 0.9.4 wrote it in the guest, plus two more.
    const WWIDS: &[u8] = b"# Multipath wwids, Version : 1.0\n\
# NOTE: This file is automatically maintained by multipath and multipathd.\n\
# You should not need to edit this file in normal circumstances.\n\
#\n\
# Valid WWIDs:\n\
/3600a098038303634722b4d59646c4436/\n\
/333333330000007d0/\n\
/3333333300000/\n";

    #[test]
    fn frames_a_command_as_libmpathcmd_does() {
        let f = encode("del map mpatha");
        let n = std::mem::size_of::<usize>();
        assert_eq!(usize::from_ne_bytes(f[..n].try_into().expect("len")), 15);
        assert_eq!(&f[n..], b"del map mpatha\0");
    }

    #[test]
    fn parses_replies() {
        let framed = |s: &[u8]| {
            let mut v = s.len().to_ne_bytes().to_vec();
            v.extend_from_slice(s);
            v
        };
        assert_eq!(read_reply(&mut &framed(b"ok\n\0")[..]).expect("ok"), "ok\n");
        assert_eq!(Reply::parse("ok\n"), Reply::Ok);
        assert_eq!(Reply::parse("fail\n"), Reply::Fail(String::new()));
        assert_eq!(Reply::parse("fail\nmap in use\n"), Reply::Fail("map in use".into()));
        assert_eq!(Reply::parse("pid 172 idle\n"), Reply::Text("pid 172 idle\n".into()));
        // Lengths libmpathcmd refuses, and a body cut short.
        let e = read_reply(&mut &0usize.to_ne_bytes()[..]).expect_err("zero");
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = read_reply(&mut &MAX_REPLY.to_ne_bytes()[..]).expect_err("huge");
        assert!(e.to_string().contains("out of range"), "{e}");
        let mut cut = 10usize.to_ne_bytes().to_vec();
        cut.extend_from_slice(b"ok");
        assert_eq!(read_reply(&mut &cut[..]).expect_err("short").kind(), io::ErrorKind::UnexpectedEof);
    }

    static NEXT: AtomicU32 = AtomicU32::new(0);

    /// A fresh abstract name for one test server.
    fn name() -> String {
        format!(
            "/blockjanitor-test/multipathd/{}/{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        )
    }

    /// A server on the abstract socket `name` that reads one framed command, hands it back and,
    /// unless `reply` is `None` (a daemon that never answers), answers `reply` framed.
    fn serve(listener: UnixListener, reply: Option<&'static [u8]>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut len = [0u8; std::mem::size_of::<usize>()];
            s.read_exact(&mut len).expect("length");
            let mut cmd = vec![0u8; usize::from_ne_bytes(len)];
            s.read_exact(&mut cmd).expect("command");
            match reply {
                Some(r) => {
                    s.write_all(&r.len().to_ne_bytes()).expect("reply length");
                    s.write_all(r).expect("reply");
                }
                None => std::thread::sleep(Duration::from_millis(700)),
            }
            cmd
        })
    }

    #[test]
    fn root_probes_before_the_command_and_never_queues_it_on_a_silent_daemon() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: entering a network namespace needs root");
            return;
        }
        let own = Path::new("/proc/self/ns/net");
        // A daemon that answers: both commands on one connection, in order.
        let n = name();
        let listener = listen(&n);
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().expect("accept");
            let mut got = Vec::new();
            for reply in [&b"pid 172 idle\n\0"[..], b"ok\n\0"] {
                let mut len = [0u8; std::mem::size_of::<usize>()];
                s.read_exact(&mut len).expect("length");
                let mut cmd = vec![0u8; usize::from_ne_bytes(len)];
                s.read_exact(&mut cmd).expect("command");
                got.push(String::from_utf8(cmd).expect("utf8"));
                s.write_all(&reply.len().to_ne_bytes()).expect("reply length");
                s.write_all(reply).expect("reply");
            }
            got
        });
        let (probe, reply) = ask_alive_in(own, &n, "del map mpatha", Duration::from_secs(5)).expect("ask");
        assert_eq!(probe, Reply::Text("pid 172 idle\n".into()));
        assert_eq!(reply, Some(Reply::Ok));
        assert_eq!(server.join().expect("server"), ["show daemon\0", "del map mpatha\0"]);

        // A daemon that accepts but never answers: only the probe ever reaches its socket.
        let n = name();
        let listener = listen(&n);
        let e = ask_alive_in(own, &n, "del map mpatha", Duration::from_millis(300)).expect_err("silent");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("no answer to 'show daemon'"), "{e}");
        let (mut s, _) = listener.accept().expect("the queued connection");
        let mut queued = Vec::new();
        s.read_to_end(&mut queued).expect("read what was queued");
        assert_eq!(queued, encode("show daemon"), "nothing but the probe was sent");

        // A daemon that refuses the probe: the command is not sent.
        let n = name();
        let server = serve(listen(&n), Some(b"fail\n\0"));
        let (probe, reply) = ask_alive_in(own, &n, "del map mpatha", Duration::from_secs(5)).expect("ask");
        assert_eq!((probe, reply), (Reply::Fail(String::new()), None));
        assert_eq!(server.join().expect("server"), b"show daemon\0");
    }

    fn listen(name: &str) -> UnixListener {
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).expect("addr"))
            .expect("bind")
    }

    #[test]
    fn talks_to_a_real_socket_speaking_the_same_framing() {
        let n = name();
        let server = serve(listen(&n), Some(b"ok\n\0"));
        let r = ask_here(&n, "del map mpatha", Duration::from_secs(5)).expect("ask");
        assert_eq!(r, Reply::Ok);
        assert_eq!(server.join().expect("server"), b"del map mpatha\0");

        let n = name();
        let server = serve(listen(&n), Some(b"fail\n\0"));
        let r = ask_here(&n, "del map mpathb", Duration::from_secs(5)).expect("ask");
        assert_eq!(r, Reply::Fail(String::new()));
        server.join().expect("server");

        // Nobody listening: refused, naming the socket.
        let e = ask_here(&name(), "del map mpatha", Duration::from_secs(1)).expect_err("no listener");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert!(e.to_string().contains("@/blockjanitor-test/multipathd/"), "{e}");

        // A daemon that accepts but never answers: the deadline holds.
        let n = name();
        let server = serve(listen(&n), None);
        let started = Instant::now();
        let e = ask_here(&n, "del map mpatha", Duration::from_millis(300)).expect_err("silent");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(e.to_string().contains("no answer to 'del map mpatha'"), "{e}");
        assert!(started.elapsed() < Duration::from_millis(650), "{:?}", started.elapsed());
        server.join().expect("server");
    }

    /// multipathd's socket lives in its own network namespace: unreachable from ours, reached
    /// through `/proc/PID/task/TID/ns/net`. Needs root (CI is).
    #[test]
    fn root_reaches_an_abstract_socket_in_another_network_namespace() {
        if !nix::unistd::geteuid().is_root() {
            assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
            eprintln!("SKIPPED: entering a network namespace needs root");
            return;
        }
        let n = name();
        let (tx, rx) = std::sync::mpsc::channel();
        let n2 = n.clone();
        let server = std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare(CLONE_NEWNET)");
            let listener = listen(&n2);
            tx.send(format!("/proc/{}/task/{}/ns/net", std::process::id(), nix::unistd::gettid()))
                .expect("send");
            serve(listener, Some(b"ok\n\0")).join().expect("server")
        });
        let ns = PathBuf::from(rx.recv().expect("namespace path"));
        let e = ask_here(&n, "del map mpatha", Duration::from_secs(1)).expect_err("other namespace");
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        let r = ask_in(&ns, &n, "del map mpatha", Duration::from_secs(5)).expect("through the namespace");
        assert_eq!(r, Reply::Ok);
        assert_eq!(server.join().expect("server"), b"del map mpatha\0");
        let e = ask_in(Path::new("/nonexistent/ns/net"), &n, "x", Duration::from_secs(1)).expect_err("no ns");
        assert!(e.to_string().contains("network namespace /nonexistent/ns/net"), "{e}");
    }

    #[test]
    fn finds_daemons_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (pid, comm) in
            [("1", "systemd\n"), ("170", "multipathd\n"), ("171", "multipathd-x\n"), ("self", "x\n")]
        {
            std::fs::create_dir(dir.path().join(pid)).expect("mkdir");
            std::fs::write(dir.path().join(pid).join("comm"), comm).expect("comm");
        }
        std::fs::create_dir(dir.path().join("172")).expect("a process that exited");
        assert_eq!(daemons(dir.path()).expect("daemons"), vec![170]);
    }

    #[test]
    fn removes_exactly_the_wwid_line() {
        let out = without_wwid(WWIDS, "333333330000007d0").expect("present");
        let expected = String::from_utf8_lossy(WWIDS).replace("/333333330000007d0/\n", "");
        assert_eq!(out, expected.as_bytes(), "every other byte kept");
        // Not present, or only as a prefix of another: nothing to do.
        assert_eq!(without_wwid(&out, "333333330000007d0"), None);
        assert_eq!(without_wwid(WWIDS, "33333333"), None);
        // A last line without its newline.
        assert_eq!(without_wwid(b"# h\n/a/\n/b/", "b").expect("b"), b"# h\n/a/\n");
        assert_eq!(without_wwid(b"# h\n/a/\n/b/", "a").expect("a"), b"# h\n/b/");
        // Duplicates go too.
        assert_eq!(without_wwid(b"/a/\n/b/\n/a/\n", "a").expect("a"), b"/b/\n");
    }

    #[test]
    fn rewrites_the_wwids_file_atomically_keeping_its_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wwids");
        assert!(!remove_wwid(&path, "333333330000007d0").expect("missing file"), "a missing file is fine");
        std::fs::write(&path, WWIDS).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let inode = std::fs::metadata(&path).expect("stat").ino();
        assert!(remove_wwid(&path, "333333330000007d0").expect("remove"));
        let now = std::fs::read(&path).expect("read");
        assert_eq!(now, without_wwid(WWIDS, "333333330000007d0").expect("present"));
        let st = std::fs::metadata(&path).expect("stat");
        assert_eq!(st.mode() & 0o777, 0o644, "mode kept");
        assert_ne!(st.ino(), inode, "replaced by rename, not rewritten in place");
        assert_eq!(std::fs::read_dir(dir.path()).expect("ls").count(), 1, "no temporary file left");
        assert!(!remove_wwid(&path, "333333330000007d0").expect("again"), "already gone");
        assert_eq!(std::fs::read(&path).expect("read"), now, "untouched");
        // A symlink in its place is refused, not followed.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, WWIDS).expect("victim");
        std::fs::remove_file(&path).expect("rm");
        std::os::unix::fs::symlink(&victim, &path).expect("symlink");
        assert!(remove_wwid(&path, "333333330000007d0").is_err(), "through a symlink");
        assert_eq!(std::fs::read(&victim).expect("victim"), WWIDS);
    }

    #[test]
    fn waits_for_the_lock_multipath_tools_holds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wwids");
        std::fs::write(&path, WWIDS).expect("write");
        // Another open file description holds the write lock for a while (as multipath-tools
        // does while it appends).
        let holder = File::options().read(true).write(true).open(&path).expect("open");
        lock(&holder).expect("first lock");
        let released = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(holder);
        });
        let started = Instant::now();
        assert!(remove_wwid(&path, "333333330000007d0").expect("remove after the lock is released"));
        assert!(started.elapsed() >= Duration::from_millis(250), "{:?}", started.elapsed());
        released.join().expect("holder");
    }
}
