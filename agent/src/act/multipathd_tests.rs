//! Tests of removing a map through multipathd.

use super::*;
use crate::act::linux::LinuxActuator;
use crate::model::DeviceName;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::SocketAddr;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

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
    format!("/blockjanitor-test/multipathd/{}/{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
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
    UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).expect("addr")).expect("bind")
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
        tx.send(format!("/proc/{}/task/{}/ns/net", std::process::id(), nix::unistd::gettid())).expect("send");
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

/// A process built from tests/helpers/named-process.c, killed and reaped on drop.
struct Named(std::process::Child, u32);

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `prefix... BIN args...` and waits for its "ready PID" line.
fn named(prefix: &[&str], bin: &Path, args: &[&str]) -> Named {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(prefix.first().copied().unwrap_or(bin.to_str().expect("utf8")));
    if !prefix.is_empty() {
        cmd.args(&prefix[1..]).arg(bin);
    }
    let mut child =
        cmd.args(args).stdout(std::process::Stdio::piped()).spawn().expect("spawn the named process");
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("its line");
    let pid = line.strip_prefix("ready ").and_then(|p| p.trim().parse().ok());
    let pid = pid.unwrap_or_else(|| panic!("the named process said {line:?}"));
    Named(child, pid)
}

/// On the live kernel (root): multipathd is the root process named multipathd that holds the
/// listening control socket in its network namespace, never a process that merely bears the
/// name. A non-root process named so is ignored; one holding the socket name (in a namespace of
/// its own) is refused as a squatter; a root one holding none cannot be told from a daemon
/// starting up, so the removal is refused; the owner is found and pinned (its exit is seen).
#[test]
fn root_multipathd_is_the_owner_of_its_control_socket_not_a_name() {
    if !nix::unistd::geteuid().is_root() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
        eprintln!("SKIPPED: needs root");
        return;
    }
    let host = crate::host::HostRoot::default();
    if crate::discover::control_socket::owners(&host, COMM, SOCKET)
        .is_ok_and(|o| !o.owners.is_empty() || !o.others.is_empty())
    {
        eprintln!("SKIPPED: a process named multipathd runs on this machine");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let bin = dir.path().join("named-process");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/helpers/named-process.c");
    let out = std::process::Command::new("gcc")
        .args(["-O0", "-Wall", "-Werror", "-o"])
        .arg(&bin)
        .arg(&src)
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        other => {
            eprintln!("SKIPPED: cannot build named-process.c with gcc: {other:?}");
            return;
        }
    }
    let act = LinuxActuator::new(host, Duration::from_secs(5));
    let dm0 = DeviceName::new("dm-0").expect("name");
    let find = || act.multipathd(&dm0, "left alone");
    assert!(find().expect("nothing named multipathd").is_none());
    let nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"];
    let impostor = named(&nobody, &bin, &["multipathd"]);
    assert!(
        find().expect("a name is not a daemon").is_none(),
        "a non-root process named multipathd is not it"
    );

    let mut squat_prefix = nobody.to_vec();
    squat_prefix.extend(["unshare", "-r", "-n"]);
    let squatter = named(&squat_prefix, &bin, &["multipathd", "--listen", SOCKET]);
    let e = find().expect_err("a squatter");
    assert!(
        e.to_string()
            .contains(&format!("process {} (uid 65534) holds multipathd's control socket", squatter.1)),
        "{e}"
    );
    drop(squatter);

    let starting = named(&[], &bin, &["multipathd"]);
    let e = find().expect_err("root, no socket");
    assert!(e.to_string().contains(&format!("(pid {}) runs but holds no control socket", starting.1)), "{e}");
    drop(starting);

    let owner = named(&["unshare", "-n"], &bin, &["multipathd", "--listen", SOCKET]);
    let found = find().expect("an owner").expect("found");
    assert_eq!(found.id.pid, owner.1, "the owner, not the impostor {}", impostor.1);
    assert_eq!(found.id.euid, Some(0));
    assert!(found.still_running());
    drop(owner);
    assert!(!found.still_running(), "its exit is seen through the pidfd");
    drop(impostor);
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
