//! Tests of the raw syscalls, and a private mount namespace for the tests of other modules.

use super::*;
use crate::model::DevNum;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

#[test]
fn stat_cached_sees_files_and_devices() {
    let me = stat_cached(Path::new("/proc/self/exe")).expect("stat exe");
    assert!(!me.is_block_device());
    assert_eq!(
        stat_cached(Path::new("/nonexistent/x")).expect_err("missing").kind(),
        io::ErrorKind::NotFound
    );
    assert_eq!(std::mem::size_of::<LoopInfo64>(), 232, "struct loop_info64 is 232 bytes");
    let root = std::fs::File::open("/").expect("open /");
    let id = mount_id(std::os::fd::AsFd::as_fd(&root)).expect("statx mount id");
    let text = std::fs::read_to_string("/proc/self/mountinfo").expect("mountinfo");
    let root_line = text.lines().find(|l| l.split(' ').nth(4) == Some("/")).expect("a mount on /");
    assert_eq!(root_line.split(' ').next().and_then(|f| f.parse::<u64>().ok()), Some(id), "{root_line}");
}

#[test]
fn mount_api_agrees_with_mountinfo_when_available() {
    use std::os::fd::AsFd;
    let ns = std::fs::File::open("/proc/self/ns/mnt").expect("open ns");
    let id = match mount_api::mntns_id(ns.as_fd()) {
        Ok(id) => id,
        Err(e) if mount_api::is_unsupported(&e) => return, // older kernel: mountinfo is used
        Err(e) => panic!("NS_GET_MNTNS_ID: {e}"),
    };
    let ids = mount_api::list(id).expect("listmount");
    let text = std::fs::read("/proc/self/mountinfo").expect("mountinfo");
    let mut from_text: Vec<DevNum> =
        crate::discover::mountinfo::parse(&text).expect("parse").iter().map(|m| m.devnum).collect();
    let mut from_api: Vec<DevNum> =
        ids.iter().map(|m| mount_api::sb_dev(id, *m).expect("statmount").0).collect();
    from_text.sort();
    from_api.sort();
    assert_eq!(from_api, from_text);
}

/// The kernel as the oracle: for every mount of this namespace, the line built from
/// `statmount` ([`crate::discover::mountinfo::entry_from_stat`]) is the line mountinfo shows,
/// field for field, and `sb_dev_with_old_id` names the same mountinfo ID.
#[test]
fn statmount_builds_the_mountinfo_line() {
    compare_statmount_with_mountinfo("/proc/self");
}

/// The same in a mount namespace of its own (root only), holding what the host's table may
/// lack: a tmpfs under a name with a space, a tab, a backslash and invalid UTF-8, made
/// shared, a bind of it made a slave, read-only, nosuid/nodev/noexec, noatime, and a
/// filesystem option.
#[test]
fn statmount_builds_the_mountinfo_line_of_shared_and_slave_mounts() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root (a mount namespace of its own)");
        return;
    }
    use nix::mount::{mount, MsFlags};
    in_private_mount_namespace(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let odd = dir.path().join(std::ffi::OsStr::from_bytes(b"a b\tc\\d\xff"));
        let bind = dir.path().join("bind");
        std::fs::create_dir(&odd).expect("mkdir");
        std::fs::create_dir(&bind).expect("mkdir");
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_NOATIME;
        mount(Some("bj test"), &odd, Some("tmpfs"), flags, Some("size=1m,mode=0750")).expect("tmpfs");
        mount(None::<&str>, &odd, None::<&str>, MsFlags::MS_SHARED, None::<&str>).expect("shared");
        mount(Some(&odd), &bind, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
        mount(None::<&str>, &bind, None::<&str>, MsFlags::MS_SLAVE, None::<&str>).expect("slave");
        mount(
            None::<&str>,
            &bind,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .expect("read-only");
        let n = compare_statmount_with_mountinfo("/proc/thread-self");
        assert!(n >= 3, "compared {n} lines");
    });
}

/// Runs `f` on a thread of its own in a new mount namespace, a private copy of this one
/// (root only): mounts made there reach no other namespace.
pub(crate) fn in_private_mount_namespace(f: impl FnOnce() + Send + 'static) {
    use nix::mount::{mount, MsFlags};
    std::thread::spawn(move || {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS)
            .expect("unshare");
        mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
            .expect("make / private");
        f();
    })
    .join()
    .expect("the namespace thread");
}

/// Compares every mount of the namespace of `proc_dir` (a `/proc/...` process directory);
/// returns how many lines were compared.
fn compare_statmount_with_mountinfo(proc_dir: &str) -> usize {
    use std::os::fd::AsFd;
    let ns = std::fs::File::open(format!("{proc_dir}/ns/mnt")).expect("open ns");
    let Ok(id) = mount_api::mntns_id(ns.as_fd()) else {
        eprintln!("SKIPPED: NS_GET_MNTNS_ID unavailable on this kernel");
        return 0;
    };
    let ids = mount_api::list(id).expect("listmount");
    match mount_api::stat_full(id, ids[0]) {
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || mount_api::is_unsupported(&e) => {
            eprintln!("SKIPPED: statmount cannot describe a whole line on this kernel ({e})");
            return 0;
        }
        other => {
            other.expect("statmount");
        }
    }
    let text = std::fs::read(format!("{proc_dir}/mountinfo")).expect("mountinfo");
    let lines = crate::discover::mountinfo::parse(&text).expect("parse");
    let mut compared = 0;
    for mnt in &ids {
        let Ok(stat) = mount_api::stat_full(id, *mnt) else { continue }; // unmounted meanwhile
        let (_, _, old) = mount_api::sb_dev_with_old_id(id, *mnt).expect("statmount basic");
        assert_eq!(old, stat.mnt_id_old);
        let Some(line) = lines.iter().find(|l| l.mount_id == stat.mnt_id_old) else { continue };
        let built = crate::discover::mountinfo::entry_from_stat(&stat).expect("reachable");
        assert_eq!(&built, line, "mount {mnt}");
        compared += 1;
    }
    assert!(compared >= lines.len().saturating_sub(2), "compared {compared} of {} lines", lines.len());
    compared
}

/// `kcmp(KCMP_FILE)` tells one open file description from another: a `dup` and an fd a child
/// inherited are the same open file; a second `open` of the same file is another.
#[test]
fn same_open_file_follows_dup_and_inheritance_not_the_path() {
    use std::os::fd::AsRawFd;
    let me = std::process::id();
    let a = std::fs::File::open("/proc/self/status").expect("open");
    let b = std::fs::File::open("/proc/self/status").expect("open again");
    let dup = a.try_clone().expect("dup");
    let fd = |f: &std::fs::File| u32::try_from(f.as_raw_fd()).expect("fd");
    assert!(same_open_file(me, fd(&a), me, fd(&dup)).expect("kcmp"), "dup: one open file");
    assert!(!same_open_file(me, fd(&a), me, fd(&b)).expect("kcmp"), "two opens: two files");
    let mut child = std::process::Command::new("sleep")
        .arg("30")
        .stdin(std::process::Stdio::from(a.try_clone().expect("dup for the child")))
        .spawn()
        .expect("spawn sleep");
    let inherited = same_open_file(me, fd(&a), child.id(), 0);
    let other = same_open_file(me, fd(&b), child.id(), 0);
    let closed = same_open_file(me, 999_999, child.id(), 0);
    let _ = child.kill();
    let _ = child.wait();
    assert!(inherited.expect("kcmp across processes"), "inherited over fork: one open file");
    assert!(!other.expect("kcmp across processes"));
    assert_eq!(closed.expect_err("no such fd").raw_os_error(), Some(libc::EBADF));
    let gone = same_open_file(me, fd(&a), child.id(), 0).expect_err("reaped");
    assert_eq!(gone.raw_os_error(), Some(libc::ESRCH), "{gone}");
}
