//! Tests of reading the namespaces' mount tables.

use super::*;
use crate::discover::mount_wanted::NSFS_MAGIC;
use std::collections::HashMap;

/// The matcher a listing is filtered with says what [`Wanted::magic`] says, whether the
/// devices in scope are compared as a short list (few) or hashed (many).
#[test]
fn the_listing_matcher_agrees_with_magic() {
    let nsfs = DevNum::new(0, 4);
    let probes: Vec<(DevNum, u64)> = [(7, 1), (7, 2), (8, 0), (0, 4), (0, 41), (259, 3), (7, 40)]
        .into_iter()
        .flat_map(|(a, b)| {
            [0xef53, mount_api::BTRFS_SUPER_MAGIC, NSFS_MAGIC].map(move |m| (DevNum::new(a, b), m))
        })
        .collect();
    for n in [0u32, 1, 2, 8, 9, 40] {
        let mut targets: HashSet<DevNum> = (1..=n).map(|i| DevNum::new(7, i)).collect();
        // An anonymous device in scope is looked up too (the matcher skips major 0 otherwise).
        if n % 2 == 1 {
            targets.insert(DevNum::new(0, 41));
        }
        for nsfs_dev in [None, Some(nsfs)] {
            let wanted =
                Wanted { targets: &targets, nsfs_dev, reuse_text: TextReuse::Never, kernel_names: None };
            let wants = wanted.magic_matcher();
            for &(d, m) in &probes {
                assert_eq!(wants(d, m), wanted.magic(d, m), "{n} targets, nsfs {nsfs_dev:?}, {d} {m:#x}");
            }
        }
    }
}

/// The namespace of the calling thread, as a scan sees it.
fn this_thread_ns() -> BTreeMap<MountNsId, MountNamespace> {
    let id = MountNsId::from_link(
        std::fs::read_link("/proc/thread-self/ns/mnt").expect("ns link").to_str().expect("text"),
    )
    .expect("mnt:[N]");
    let task = (std::process::id(), nix::unistd::gettid().as_raw() as u32);
    let ns = MountNamespace {
        id,
        pids: vec![task.0],
        tasks: vec![task],
        pinned_by: None,
        read_via: None,
        mount_count: 0,
        mountinfo_bytes: 0,
        kernel_id: None,
    };
    BTreeMap::from([(id, ns)])
}

/// Detaches every nsfs mount of this thread's (private) mount namespace: copies of the host's
/// namespace pins, which nothing here uses.
fn drop_nsfs_pins() {
    let text = std::fs::read("/proc/thread-self/mountinfo").expect("mountinfo");
    for m in crate::discover::mountinfo::parse(&text).expect("parse") {
        if m.fstype.as_bytes() == b"nsfs" {
            nix::mount::umount2(m.mount_point.as_path(), nix::mount::MntFlags::MNT_DETACH)
                .expect("detach a pin");
        }
    }
}

/// Runs `test` as root in a mount namespace of its own, with a temporary directory on a block
/// device and a reader of that device's mounts in this thread's namespace (sorted by ID).
fn with_a_directory_on_a_device(
    test: impl FnOnce(&Path, &dyn Fn(TextReuse) -> Vec<MountEntry>) + Send + 'static,
) {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root (a mount namespace of its own)");
        return;
    }
    crate::host::sys::tests::in_private_mount_namespace(|| {
        let host = HostRoot::new("/");
        let dir = tempfile::tempdir().expect("tempdir");
        let dev = crate::host::sys::stat_cached(dir.path()).expect("stat").dev;
        if dev.major == 0 {
            eprintln!("SKIPPED: the temporary directory is not on a block device");
            return;
        }
        let targets = HashSet::from([dev]);
        let read = |reuse_text| {
            let mut nss = this_thread_ns();
            let wanted = Wanted { targets: &targets, nsfs_dev: None, reuse_text, kernel_names: None };
            let mut s = read_some(&host, &mut nss, wanted, MountReader::Auto);
            assert!(s.unreadable.is_empty() && s.hidden.is_empty(), "{:?} {:?}", s.unreadable, s.hidden);
            let mut m: Vec<MountEntry> = s.mounts.drain(..).map(|m| m.mount).collect();
            m.sort_by_key(|m| m.mount_id);
            m
        };
        test(dir.path(), &read);
    });
}

/// On the live kernel (root): a scan that only shows follows a mount added to, and removed
/// from, a namespace whose text it read before by `statmount` alone (the memo's delta),
/// and sees exactly what reading the text again sees.
#[test]
fn a_changed_namespace_is_followed_without_reading_its_text() {
    use nix::mount::{mount, umount2, MntFlags, MsFlags};
    with_a_directory_on_a_device(|dir, read| {
        let first = read(TextReuse::WhileSameIds);
        let bind = dir.join("bind");
        std::fs::create_dir(&bind).expect("mkdir");
        for step in ["mount", "unmount"] {
            if step == "mount" {
                mount(Some(dir), &bind, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
            } else {
                umount2(&bind, MntFlags::MNT_DETACH).expect("umount");
            }
            let before = super::super::statmount_cache::deltas();
            let followed = read(TextReuse::WhileSameIds);
            if super::super::statmount_cache::deltas() == before {
                eprintln!("SKIPPED: statmount cannot describe a whole line on this kernel");
                return;
            }
            let fresh = read(TextReuse::Never);
            assert_eq!(followed, fresh, "after the {step}");
            let shows_bind = followed.iter().any(|m| m.mount_point.as_bytes() == bind.as_os_str().as_bytes());
            assert_eq!(shows_bind, step == "mount", "after the {step}: {followed:?}");
        }
        assert_eq!(read(TextReuse::WhileSameIds), first);
    });
}

/// Whether `statmount` says everything a mountinfo line says here (Linux 6.13 and later).
fn statmount_describes_lines() -> bool {
    use std::os::fd::AsFd;
    let Ok(ns) = std::fs::File::open("/proc/thread-self/ns/mnt") else { return false };
    let Ok(id) = mount_api::mntns_id(ns.as_fd()) else { return false };
    let ids = mount_api::list(id).unwrap_or_default();
    ids.first().is_some_and(|m| mount_api::stat_full(id, *m).is_ok())
}

/// On the live kernel (root): a remount keeps every mount ID, so a scan that reuses text while
/// the IDs are the same still shows the mount writable; the confirmed turn asks `statmount`
/// about each remembered line, sees the change, reads the text again and shows what a fresh
/// read shows; with nothing changed it answers without reading the text.
#[test]
fn a_remount_is_seen_by_the_confirmed_turn() {
    use nix::mount::{mount, MsFlags};
    with_a_directory_on_a_device(|dir, read| {
        let bind = dir.join("bind");
        std::fs::create_dir(&bind).expect("mkdir");
        mount(Some(dir), &bind, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
        let options = |mounts: &[MountEntry]| {
            mounts
                .iter()
                .find(|m| m.mount_point.as_bytes() == bind.as_os_str().as_bytes())
                .map(|m| m.mount_options.clone())
                .expect("the bind mount is shown")
        };
        let first = read(TextReuse::Never);
        assert!(options(&first).starts_with("rw"), "{first:?}");
        if !statmount_describes_lines() {
            eprintln!("SKIPPED: statmount cannot describe a whole line on this kernel (before 6.13)");
            return;
        }
        // Remembered, and confirmed as it is: no text read.
        let confirmed = super::super::statmount_cache::confirmed();
        assert_eq!(read(TextReuse::Confirmed), first);
        assert!(super::super::statmount_cache::confirmed() > confirmed, "confirmed by statmount, not read");
        let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, &bind, None::<&str>, flags, None::<&str>).expect("remount read-only");
        // The IDs are the same: reused while they are, the text is out of date.
        assert!(options(&read(TextReuse::WhileSameIds)).starts_with("rw"), "the remount kept the IDs");
        let confirmed = read(TextReuse::Confirmed);
        assert!(options(&confirmed).starts_with("ro"), "{confirmed:?}");
        assert_eq!(confirmed, read(TextReuse::Never), "the confirmed turn shows what a fresh read shows");
    });
}

/// The mounts of `targets` in this thread's namespace (sorted by ID), and how many namespaces
/// were answered without reading their text.
fn read_here(targets: &HashSet<DevNum>, reuse_text: TextReuse) -> (Vec<MountEntry>, usize) {
    let mut nss = this_thread_ns();
    let wanted = Wanted { targets, nsfs_dev: None, reuse_text, kernel_names: None };
    let mut s = read_some(&HostRoot::new("/"), &mut nss, wanted, MountReader::Auto);
    assert!(s.unreadable.is_empty() && s.hidden.is_empty(), "{:?} {:?}", s.unreadable, s.hidden);
    let mut m: Vec<MountEntry> = s.mounts.drain(..).map(|m| m.mount).collect();
    m.sort_by_key(|m| m.mount_id);
    (m, s.via_statmount)
}

/// On the live kernel (root): once a text this process read was equal to the lines `statmount`
/// builds for it (every mount of the namespace: the test wants every device), a scan that
/// only shows builds the table of a namespace it never read from `statmount` alone, and it is
/// what reading the text shows: a read-only bind mount, a shared one and its peer included. A
/// scan behind an action still reads the text.
#[test]
fn a_namespace_never_read_is_built_from_statmount_once_a_text_matched() {
    use nix::mount::{mount, MsFlags};
    with_a_directory_on_a_device(|dir, read| {
        let bind = |name: &str, flags: MsFlags| {
            let at = dir.join(name);
            std::fs::create_dir(&at).expect("mkdir");
            mount(Some(dir), &at, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
            if !flags.is_empty() {
                mount(None::<&str>, &at, None::<&str>, flags, None::<&str>).expect("change the bind mount");
            }
        };
        bind("ro", MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY);
        bind("shared", MsFlags::MS_SHARED);
        if !statmount_describes_lines() {
            eprintln!("SKIPPED: statmount cannot describe a whole line on this kernel (before 6.13)");
            return;
        }
        // This namespace's text is read (nothing is remembered of it), and compared.
        let first = read(TextReuse::WhileSameIds);
        assert!(
            super::super::statmount_cache::builds_lines(),
            "the lines statmount builds differ from the text read"
        );
        let targets = HashSet::from([crate::host::sys::stat_cached(dir).expect("stat").dev]);
        let shown = std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS | nix::sched::CloneFlags::CLONE_NEWNS)
                    .expect("unshare");
                let (built, unread) = read_here(&targets, TextReuse::WhileSameIds);
                assert_eq!(unread, 1, "a namespace never read is built, not read");
                let (read, unread) = read_here(&targets, TextReuse::Never);
                assert_eq!(unread, 0, "a scan behind an action reads the text");
                assert_eq!(built, read, "built from statmount as the text shows it");
                built
            })
            .join()
            .expect("the thread in a namespace of its own")
        });
        // The copy shows the same mounts under new IDs: the same places, options and peers.
        let shape = |m: &[MountEntry]| -> Vec<_> {
            m.iter().map(|m| (m.mount_point.clone(), m.mount_options.clone(), m.optional.clone())).collect()
        };
        assert_eq!(shape(&shown), shape(&first));
        let ro = shown.iter().find(|m| m.mount_point.as_bytes().ends_with(b"/ro")).expect("the ro bind");
        assert!(ro.mount_options.starts_with("ro"), "{ro:?}");
        let shared = shown.iter().find(|m| m.mount_point.as_bytes().ends_with(b"/shared")).expect("shared");
        assert!(shared.shared_group().is_some(), "{shared:?}");
    });
}

/// On the live kernel (root): a light scan answers a watched namespace with no mount event
/// since its last listing from what it read then, through no task of it, and shows the same;
/// not when the task the text was read through is not among the namespace's tasks, nor once
/// a mount event came.
#[test]
fn a_quiet_watched_namespace_is_answered_without_going_through_a_task() {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    with_a_directory_on_a_device(|dir, _| {
        if !statmount_describes_lines() {
            eprintln!("SKIPPED: statmount cannot describe a whole line on this kernel (before 6.13)");
            return;
        }
        // A namespace pinned by an nsfs bind mount is never answered from memory (by design):
        // this private copy drops the copies of the host's pins (`ip netns add` leaves one under
        // /run/netns, as another test on the machine may be doing now).
        drop_nsfs_pins();
        let file = std::fs::File::open("/proc/thread-self/ns/mnt").expect("ns");
        let ns_id = mount_api::mntns_id(file.as_fd()).expect("NS_GET_MNTNS_ID");
        let names = HashMap::from([(file.metadata().expect("stat").ino(), ns_id)]);
        let targets = HashSet::from([crate::host::sys::stat_cached(dir).expect("stat").dev]);
        let read = |tasks: Option<Vec<(u32, u32)>>| {
            let mut nss = this_thread_ns();
            if let Some(t) = tasks {
                nss.values_mut().for_each(|n| n.tasks = t.clone());
            }
            let wanted = Wanted {
                targets: &targets,
                nsfs_dev: None,
                reuse_text: TextReuse::WhileSameIds,
                kernel_names: Some(&names),
            };
            let s = read_some(&HostRoot::new("/"), &mut nss, wanted, MountReader::Auto);
            let mut m: Vec<MountEntry> = s.mounts.into_iter().map(|m| m.mount).collect();
            m.sort_by_key(|m| m.mount_id);
            m
        };
        use super::super::statmount_cache::{confirm_watched, note_watched};
        let before = answered_without_a_task();
        read(None); // listed once, so that it can be marked watched
        note_watched(ns_id);
        // Listed in the epoch the watch began in: that listing may be older than the mark.
        let listed = read(None);
        assert!(!listed.is_empty(), "the directory's device is mounted here");
        assert_eq!(answered_without_a_task(), before, "a listing as old as the mark: not quiet");
        // A listing made after the mark confirms the last one when it has the same mounts
        // (the daemon lists each namespace it marks: `mount_watch::confirm_listing`).
        let mut ids = mount_api::list(ns_id).expect("listmount");
        let last = ids.pop().expect("a mount");
        assert!(!confirm_watched(ns_id, &ids), "other mounts than the last listing's: not confirmed");
        assert_eq!(read(None), listed);
        assert_eq!(answered_without_a_task(), before, "not confirmed: listed again");
        ids.push(last);
        assert!(confirm_watched(ns_id, &ids), "the same mounts, listed under the watch");
        assert_eq!(read(None), listed);
        assert_eq!(answered_without_a_task(), before + 1, "quiet: answered without a task");
        // And a listing in a later epoch than the mark is quiet by itself.
        super::super::statmount_cache::begin_full_listing();
        assert_eq!(read(None), listed);
        assert_eq!(answered_without_a_task(), before + 2);
        let before = before + 1;
        // The text was read through this thread: a namespace whose tasks the scan counts are
        // others (here the main thread, in another namespace) goes through them, and is
        // passed over.
        let main = (std::process::id(), std::process::id());
        assert!(read(Some(vec![main])).is_empty(), "not answered through a task elsewhere");
        assert_eq!(answered_without_a_task(), before + 1);
        super::super::statmount_cache::note_changed(ns_id);
        assert_eq!(read(None), listed, "listed again after the event");
        assert_eq!(answered_without_a_task(), before + 1, "a mount event: not quiet");
    });
}

/// Why every task's `ns/mnt` is read (issue 20 asked whether one read per process would do):
/// a thread that shares its leader's `fs_struct` (`kcmp(KCMP_FS)` says so) can still be in
/// another mount namespace. `setns(pidfd, CLONE_NEWNS | CLONE_NEWUTS)` installs the namespace
/// through a copy of the fs_struct, so the kernel's "fs shared: no setns" check does not stop it
/// (checked on Linux 6.18). Live kernel, root only.
#[test]
fn a_thread_sharing_its_leaders_fs_can_be_in_another_mount_namespace() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: needs root (setns)");
        return;
    }
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::sync::mpsc;
    crate::host::sys::tests::in_private_mount_namespace(|| {
        let host = HostRoot::new("/");
        let me = std::process::id();
        let ns_of = |tid: u32| {
            let link = std::fs::read_link(host.proc_task(me, tid).join("ns/mnt")).expect("ns link");
            MountNsId::from_link(link.to_str().expect("text")).expect("mnt:[N]")
        };
        let this = nix::unistd::gettid().as_raw() as u32;
        let (private, original) = (ns_of(this), ns_of(me));
        assert_ne!(private, original, "the test thread is in a namespace of its own");
        let (tid_tx, tid_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        // Shares this thread's fs_struct (a pthread), then joins the leader's mount namespace
        // through a pidfd, as a runtime's helper thread may.
        let joiner = std::thread::spawn(move || {
            // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
            let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, me as libc::pid_t, 0) };
            if fd < 0 {
                tid_tx.send(Err(std::io::Error::last_os_error())).expect("send");
                return;
            }
            // SAFETY: the kernel just returned this fd to us; nothing else owns it.
            let pidfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
            let r = nix::sched::setns(
                &pidfd,
                nix::sched::CloneFlags::CLONE_NEWNS | nix::sched::CloneFlags::CLONE_NEWUTS,
            );
            tid_tx
                .send(r.map(|()| nix::unistd::gettid().as_raw() as u32).map_err(std::io::Error::from))
                .expect("send");
            let _ = done_rx.recv();
        });
        let joined = match tid_rx.recv().expect("tid") {
            Ok(tid) => tid,
            Err(e) => {
                eprintln!("SKIPPED: setns through a pidfd is not available here ({e})");
                drop(done_tx);
                joiner.join().expect("join");
                return;
            }
        };
        assert_eq!(
            crate::host::sys::same_fs_context(this, joined).ok(),
            Some(true),
            "kcmp(KCMP_FS): still one fs_struct"
        );
        assert_eq!(ns_of(joined), original, "yet the thread is in the leader's namespace");
        let entry = super::super::processes::read_entry(&host, me).expect("readable").expect("alive");
        let task_ns = |tid| entry.tasks.iter().find(|(t, _)| *t == tid).map(|(_, ns)| *ns);
        assert_eq!(task_ns(this), Some(private), "{:?}", entry.tasks);
        assert_eq!(task_ns(joined), Some(original), "the scan reads each task's own namespace");
        let grouped = group(std::slice::from_ref(&entry));
        assert!(
            grouped[&original].tasks.contains(&(me, joined)) && grouped[&private].tasks.contains(&(me, this))
        );
        drop(done_tx);
        joiner.join().expect("join");
    });
}

/// On the live kernel (root): a namespace's table is never read through a task that is in
/// another namespace now (a light scan may list a task where the last scan saw it,
/// `snapshot::task_namespace_cache`): that task is passed over, and the next one that is there is used.
#[test]
fn a_table_is_never_read_through_a_task_that_is_elsewhere() {
    with_a_directory_on_a_device(|dir, _| {
        use nix::mount::{mount, MsFlags};
        let host = HostRoot::new("/");
        let bind = dir.join("bind");
        std::fs::create_dir(&bind).expect("mkdir");
        mount(Some(dir), &bind, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
        let targets = HashSet::from([crate::host::sys::stat_cached(dir).expect("stat").dev]);
        let wanted =
            Wanted { targets: &targets, nsfs_dev: None, reuse_text: TextReuse::Never, kernel_names: None };
        let mut nss = this_thread_ns();
        let (&id, _) = nss.iter().next().expect("this namespace");
        let me = std::process::id();
        // The leader stayed in the namespace the test process started in.
        let leader_ns = super::super::processes::task_mount_ns(&host.proc_task(me, me)).expect("leader's");
        assert_ne!(leader_ns, id, "the test thread has a namespace of its own");
        let this = nss[&id].tasks[0];
        // (mounts of the bind, mounts of the device) read for the namespace, by each reader.
        let read = |tasks: Vec<(u32, u32)>, nss: &mut BTreeMap<MountNsId, MountNamespace>| {
            nss.get_mut(&id).expect("ns").tasks = tasks;
            [MountReader::Auto, MountReader::MountInfo].map(|reader| {
                let s = read_some(&host, nss, wanted, reader);
                assert!(s.unreadable.is_empty(), "{:?}", s.unreadable);
                let mine = s.mounts.iter().filter(|m| m.ns == id);
                let binds = mine
                    .clone()
                    .filter(|m| m.mount.mount_point.as_bytes() == bind.as_os_str().as_bytes())
                    .count();
                (binds, mine.count())
            })
        };
        assert_eq!(read(vec![(me, me)], &mut nss), [(0, 0); 2], "nothing read through the leader, elsewhere");
        for (binds, all) in read(vec![(me, me), this], &mut nss) {
            assert_eq!(binds, 1, "read through the task that is there ({all} mounts of the device)");
        }
    });
}
