//! The live host's world: periodic scans stopped mid-way, and light scans that see a task's own
//! namespace (root).

use super::*;
use std::sync::mpsc;

/// The namespace of task `tid` of this process in the latest snapshot.
fn listed_ns(world: &LinuxWorld, tid: u32) -> Option<MountNsId> {
    let latest = world.latest.lock().expect("latest");
    let (snap, _) = latest.as_ref()?;
    let me = std::process::id();
    snap.namespaces.iter().find(|n| n.tasks.contains(&(me, tid))).map(|n| n.id)
}

fn ns_of(tid: u32) -> MountNsId {
    crate::discover::processes::task_mount_ns(&HostRoot::default().proc_task(std::process::id(), tid))
        .expect("ns link")
}

/// The live host's world as the daemon has it (its process memo reading every process in
/// full every `full_read_every`th scan); `None` (skipped, with `why` printed) unless root,
/// which CI always is.
fn live_world(full_read_every: u64, why: &str) -> Option<LinuxWorld> {
    if !nix::unistd::geteuid().is_root() {
        assert_ne!(std::env::var("CI").as_deref(), Ok("true"), "CI runs as root");
        eprintln!("SKIPPED: needs root ({why})");
        return None;
    }
    let options = ScanOptions { trust_unreadable_init: true, ..ScanOptions::default() };
    let world = LinuxWorld::new(HostRoot::default(), options, Duration::from_secs(30));
    world.remember_processes(full_read_every);
    Some(world)
}

/// On the live kernel (root): a periodic scan asked to stop, at its first ask or its last
/// (before the files are read), ends without a snapshot: the previous one stays the
/// latest, and the process memo does not count it as a turn.
#[test]
fn a_stopped_scan_keeps_the_latest_snapshot_and_is_no_turn() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Even turns read every process in full, odd ones are light.
    let Some(world) = live_world(2, "every process's files") else { return };
    world.scan_periodic(Stop::NEVER).expect("scan").expect("not stopped");
    let latest = || Arc::clone(&world.latest.lock().expect("latest").as_ref().expect("a snapshot").0);
    let light_next =
        || world.process_read_cache.lock().expect("memo").as_ref().expect("memo").next_is_light();
    let stops_at = |n: usize, asks: &AtomicUsize| asks.fetch_add(1, Ordering::Relaxed) + 1 >= n;

    let (before, light) = (latest(), light_next());
    let asks = AtomicUsize::new(0);
    let first = || stops_at(1, &asks);
    assert!(world.scan_periodic(Stop::when(&first)).expect("no error").is_none());
    assert!(Arc::ptr_eq(&before, &latest()), "a stopped scan left its snapshot");
    assert_eq!(light_next(), light, "a stopped scan counted as a turn");

    // One ask per process, one before the mount tables, and the last before the files (the
    // count of processes may change between the count and the scan: tried again then).
    let mut stopped_last = false;
    for _ in 0..5 {
        let (before, light) = (latest(), light_next());
        let last = crate::discover::processes::pids(&world.host).expect("pids").len() + 2;
        let asks = AtomicUsize::new(0);
        let at_last = || stops_at(last, &asks);
        if world.scan_periodic(Stop::when(&at_last)).expect("no error").is_some() {
            continue;
        }
        assert!(Arc::ptr_eq(&before, &latest()), "a stopped scan left its snapshot");
        assert_eq!(light_next(), light, "a scan stopped before its files counted as a turn");
        stopped_last = true;
        break;
    }
    assert!(stopped_last, "no scan reached its last ask in five tries");
}

/// On the live kernel (root): the daemon's light scans take each task's namespace as the last
/// scan read it only while no mount namespace was made or went away, so a thread that
/// unshares its own is seen by the very next light scan; a thread that joins an existing
/// namespace (`setns`) is seen by the next full read (`snapshot::task_namespace_cache`).
#[test]
fn a_light_scan_sees_a_task_unshare_and_a_full_read_sees_it_join() {
    use nix::sched::CloneFlags;
    // Scans 1 and 4 read every task; 2 and 3 are light.
    let Some(world) = live_world(3, "unshare, setns") else { return };
    let (to_unsharer, unsharer_rx) = mpsc::channel::<()>();
    let (to_test, from_threads) = mpsc::channel::<u32>();
    let tx = to_test.clone();
    let unsharer = std::thread::spawn(move || {
        tx.send(nix::unistd::gettid().as_raw() as u32).expect("send");
        unsharer_rx.recv().expect("go");
        nix::sched::unshare(CloneFlags::CLONE_FS | CloneFlags::CLONE_NEWNS).expect("unshare");
        tx.send(0).expect("send");
        let _ = unsharer_rx.recv(); // stays in its namespace until told
    });
    let t = from_threads.recv().expect("tid");
    let original = ns_of(t);
    world.scan_periodic(Stop::NEVER).expect("scan 1").expect("not stopped");
    assert_eq!(listed_ns(&world, t), Some(original));
    to_unsharer.send(()).expect("go");
    from_threads.recv().expect("unshared");
    let private = ns_of(t);
    assert_ne!(private, original);
    world.scan_periodic(Stop::NEVER).expect("scan 2 (light)").expect("not stopped");
    assert_eq!(listed_ns(&world, t), Some(private), "a namespace was made: every task read");

    let (to_joiner, joiner_rx) = mpsc::channel::<()>();
    let joiner = std::thread::spawn(move || {
        to_test.send(nix::unistd::gettid().as_raw() as u32).expect("send");
        joiner_rx.recv().expect("go");
        let ns = std::fs::File::open(format!("/proc/self/task/{t}/ns/mnt")).expect("its namespace");
        nix::sched::unshare(CloneFlags::CLONE_FS).expect("own fs");
        nix::sched::setns(ns, CloneFlags::CLONE_NEWNS).expect("setns");
        to_test.send(0).expect("send");
        let _ = joiner_rx.recv();
    });
    let j = from_threads.recv().expect("tid");
    world.scan_periodic(Stop::NEVER).expect("scan 3 (light)").expect("not stopped");
    to_joiner.send(()).expect("go");
    from_threads.recv().expect("joined");
    assert_eq!(ns_of(j), private);
    world.scan_periodic(Stop::NEVER).expect("scan 4 (full read)").expect("not stopped");
    assert_eq!(listed_ns(&world, j), Some(private), "the full read reads every task");
    drop((to_unsharer, to_joiner));
    unsharer.join().expect("unsharer");
    joiner.join().expect("joiner");
}
