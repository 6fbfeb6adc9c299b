//! Mount namespaces for incremental_rescans's random rounds: copies of a test namespace, and copies
//! whose program (started with `execve` in it, as a container's is) holds a device mounted there
//! by its working directory, an open file or its own mapping.

use std::path::Path;
use std::time::Duration;

use blockjanitor_tests::*;

/// A namespace of the test: a process in a private mount namespace (a copy of the host's, or of
/// another test namespace's, mounts included), with the mounts the test made in it, and the one
/// its process holds a file on (`busy`: never unmounted).
pub struct TestNs {
    pub proc: NsProcess,
    pub mounts: Vec<String>,
    pub busy: Option<String>,
}

/// Waits until `proc` runs `sleep` in a namespace of its own (not `theirs`).
pub fn wait_entered(proc: &NsProcess, theirs: u64) {
    let pid = proc.pid();
    assert!(
        wait_until(Duration::from_secs(5), || {
            std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .is_ok_and(|l| !l.to_string_lossy().contains(&theirs.to_string()))
                && std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        }),
        "process {pid} never started sleep in a namespace of its own"
    );
}

/// A private copy of `parent`'s namespace, its process killed on drop.
pub fn copy_of(parent: &TestNs) -> TestNs {
    let pid = parent.proc.pid().to_string();
    let child = std::process::Command::new("nsenter")
        .args(["-t", &pid, "-m", "--", "unshare", "-m", "--propagation", "private", "sleep", "600"])
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("spawn nsenter");
    let proc = NsProcess { child };
    wait_entered(&proc, parent.proc.ns_inode());
    TestNs { proc, mounts: parent.mounts.clone(), busy: None }
}

/// How a new namespace's process holds the device mounted where it starts, besides the mount.
#[derive(Debug, Clone, Copy)]
pub enum Hold {
    Cwd,
    Fd,
    Map,
    All,
}

/// `sleep` on the host.
pub fn sleep_binary() -> String {
    ["/usr/bin/sleep", "/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep in /usr/bin or /bin")
        .to_owned()
}

/// A 16 MiB ext4 image holding a copy of `sleep` and a file `data`.
pub fn image_with_sleep(s: &Scratch, name: &str) -> std::path::PathBuf {
    let dir = s.mkdir(&format!("{name}.d"));
    std::fs::copy(sleep_binary(), dir.join("sleep")).expect("copy sleep");
    std::fs::write(dir.join("data"), "data\n").expect("write data");
    let img = s.sparse_file(name, 16);
    sh("mkfs.ext4", &["-q", "-F", "-d", utf8(&dir), utf8(&img)]);
    img
}

/// A private copy of `parent`'s namespace made by a process that then starts `sleep` there (an
/// `execve`, as a container's program starts), holding the device mounted at `at` by `how`: its
/// working directory there, `at/data` open, the program run from `at/sleep` (mapped), or all
/// three.
pub fn holding_copy(parent: &TestNs, at: &str, how: Hold) -> TestNs {
    use std::ffi::CString;
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", parent.proc.pid())).expect("open the namespace");
    let (cwd, open, map) = match how {
        Hold::Cwd => (true, false, false),
        Hold::Fd => (false, true, false),
        Hold::Map => (false, false, true),
        Hold::All => (true, true, true),
    };
    let dir = CString::new(at).expect("a path without NUL");
    let data = CString::new(format!("{at}/data")).expect("a path without NUL");
    let program = if map { format!("{at}/sleep") } else { sleep_binary() };
    let mut cmd = std::process::Command::new(&program);
    cmd.arg("600").stdin(std::process::Stdio::null());
    let fd = ns.as_raw_fd();
    // SAFETY: between fork and exec the closure only makes system calls on what was made before
    // the fork (no allocation, no lock); `fd` stays open until the spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| if rc < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) };
            check(libc::setns(fd, libc::CLONE_NEWNS))?;
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            if cwd {
                check(libc::chdir(dir.as_ptr()))?;
            }
            if open {
                // Left open (no O_CLOEXEC) for the program.
                check(libc::open(data.as_ptr(), libc::O_RDONLY))?;
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap_or_else(|e| panic!("start {program} holding {at} by {how:?}: {e}"));
    drop(ns);
    let proc = NsProcess { child };
    wait_entered(&proc, parent.proc.ns_inode());
    TestNs { proc, mounts: parent.mounts.clone(), busy: Some(at.to_owned()) }
}
