//! Tests of the follow-up of live filesystems: which devices are followed, when each is looked
//! at again, for how long, and that an episode ends with the state that started it.

use super::*;
use crate::daemon::events::tests::{device, process};
use crate::graph::Holder;
use crate::judge::Verdict;

/// Devices held by their filesystem alone.
fn names(v: &[&str]) -> HashMap<String, Vec<u32>> {
    v.iter().map(|s| ((*s).to_owned(), Vec::new())).collect()
}

fn empty() -> HashMap<String, Vec<u32>> {
    HashMap::new()
}

/// Every try of `name`'s episode started at `t0`, in ms after it, as the follower would make
/// them (each when due).
fn tries(f: &FsEnds, t0: Instant) -> Vec<u64> {
    let mut out = Vec::new();
    while let Some(due) = f.next_due() {
        assert!(out.len() < 1000, "the follow-up never ends");
        for _ in f.due(due) {
            out.push(due.duration_since(t0).as_millis() as u64);
        }
    }
    out
}

#[test]
fn a_device_held_by_filesystems_alone_is_read_again_soon_then_less_often_and_not_for_ever() {
    let f = FsEnds::default();
    let t0 = Instant::now();
    assert_eq!(f.next_due(), None, "nothing followed");
    f.saw(names(&["loop1"]), t0);
    assert_eq!(f.next_due(), Some(t0 + FIRST));
    assert!(f.due(t0 + FIRST - Duration::from_millis(1)).is_empty(), "not before it is due");
    let at = tries(&f, t0);
    // Soon at first (an unmount's end is a matter of milliseconds)...
    assert_eq!(&at[..5], &[10, 30, 70, 150, 310], "{at:?}");
    // ...then every half second at most (one kept alive a while is seen within that of its end)...
    assert!(at.windows(2).all(|w| w[1] - w[0] <= LONGEST_GAP.as_millis() as u64), "{at:?}");
    // ...capped in count and in time.
    assert!(at.len() as u32 <= TRIES, "{} tries: {at:?}", at.len());
    assert!(*at.last().expect("tries") <= FOR.as_millis() as u64, "{at:?}");
    assert!(at.len() >= 20, "followed for most of {FOR:?}: {at:?}");
    // Still held by filesystems alone: the episode is over, no more tries.
    f.saw(names(&["loop1"]), t0 + FOR);
    assert_eq!(f.next_due(), None);
}

#[test]
fn an_episode_ends_when_the_device_is_no_longer_held_by_filesystems_alone_and_starts_afresh() {
    let f = FsEnds::default();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    f.saw(names(&["loop1", "loop2"]), at(0));
    let mut due: Vec<String> = f.due(at(10)).into_iter().map(|(n, _)| n).collect();
    due.sort();
    assert_eq!(due, ["loop1", "loop2"]);
    // loop1's filesystem ended (or it was mounted again): forgotten; loop2 is still followed.
    f.saw(names(&["loop2"]), at(15));
    assert_eq!(f.due(at(30)), [("loop2".to_owned(), vec![])]);
    assert_eq!(f.next_due(), Some(at(70)));
    // Later loop1 is held by its filesystem alone again: a new episode, from its first try.
    f.saw(names(&["loop1", "loop2"]), at(40));
    assert_eq!(f.next_due(), Some(at(50)));
    assert_eq!(f.due(at(50)), [("loop1".to_owned(), vec![])]);
    // Nothing held by filesystems alone: nothing followed.
    f.saw(empty(), at(60));
    assert_eq!(f.next_due(), None);
    assert!(f.due(at(10_000)).is_empty());
}

/// The follower, run as the daemon runs it: asks for a device's re-read soon after a view showed
/// it held by filesystems alone, and stops asking once a view no longer does. Real time,
/// generous bounds (a loaded machine).
#[test]
fn the_follower_asks_soon_and_stops_when_the_filesystem_ended() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    rt.block_on(async {
        let f = std::sync::Arc::new(FsEnds::default());
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let follower = tokio::spawn({
            let f = std::sync::Arc::clone(&f);
            async move { f.follow(|name, _| tx.send((Instant::now(), name)).expect("receiver"), shutdown).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let shown = Instant::now();
        f.saw(names(&["loop1"]), shown);
        let (at, name) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a re-read asked within 5 s")
            .expect("a name");
        assert_eq!(name, "loop1");
        let waited = at.duration_since(shown);
        assert!(waited >= FIRST && waited < Duration::from_millis(500), "asked {waited:?} after");
        // The next view shows it free: no more asks.
        f.saw(empty(), Instant::now());
        tokio::time::sleep(Duration::from_millis(400)).await;
        while let Ok((at, _)) = rx.try_recv() {
            assert!(at.duration_since(shown) < Duration::from_millis(100), "asked again after it ended");
        }
        stop.send(true).expect("follower listening");
        tokio::time::timeout(Duration::from_secs(5), follower).await.expect("follower stops").expect("joined");
    });
}

/// Followed: a device held by a live filesystem with no mount, alone or with processes whose
/// every pid is listed (a lazily detached mount someone's working directory or file is on).
/// Not followed: a device mounted, held by anything else too, or by a process holder listing
/// only some of its processes.
#[test]
fn the_devices_followed_are_those_held_by_a_live_filesystem_with_no_mount() {
    let fs = || Holder::bare(HolderKind::Filesystem);
    let mut partial = process(HolderKind::OpenFile, 40);
    partial.pid_count = 17;
    let v = |devices: Vec<crate::engine::view::DeviceView>| {
        let mut v = View::empty();
        v.devices = devices.into_iter().map(std::sync::Arc::new).collect();
        v
    };
    let view = v(vec![
        device("loop1", 1, Verdict::InUse, vec![fs()]),
        device(
            "loop2",
            2,
            Verdict::InUse,
            vec![fs(), process(HolderKind::Cwd, 30), process(HolderKind::Mmap, 20)],
        ),
        device("loop3", 3, Verdict::InUse, vec![process(HolderKind::Mount, 1)]),
        device("loop4", 4, Verdict::InUse, vec![fs(), process(HolderKind::Mount, 1)]),
        device("loop5", 5, Verdict::InUse, vec![fs(), process(HolderKind::StackedDevice, 1)]),
        device("loop6", 6, Verdict::InUse, vec![fs(), partial]),
        device("loop7", 7, Verdict::Unused, vec![]),
        device("loop8", 8, Verdict::InUse, vec![process(HolderKind::Cwd, 30)]),
    ]);
    let got = ending_filesystems(&view);
    let want: HashMap<String, Vec<u32>> =
        [("loop1".to_owned(), vec![]), ("loop2".to_owned(), vec![20, 30])].into_iter().collect();
    assert_eq!(got, want);
}

/// A device whose detached filesystem processes hold is followed for them; when the processes
/// that hold it change (a full scan saw them go), its episode starts afresh, from its first try.
#[test]
fn a_device_held_by_processes_too_is_followed_for_them_and_afresh_when_they_change() {
    let f = FsEnds::default();
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let with =
        |pids: Vec<u32>| -> HashMap<String, Vec<u32>> { [("loop1".to_owned(), pids)].into_iter().collect() };
    f.saw(with(vec![30]), at(0));
    assert_eq!(f.due(at(10)), [("loop1".to_owned(), vec![30])]);
    assert_eq!(f.due(at(30)), [("loop1".to_owned(), vec![30])]);
    // The same view again: the episode goes on.
    f.saw(with(vec![30]), at(40));
    assert_eq!(f.next_due(), Some(at(70)));
    // The process went (the full scan it asked for saw so): the filesystem alone, from the start.
    f.saw(with(vec![]), at(50));
    assert_eq!(f.next_due(), Some(at(60)));
    assert_eq!(f.due(at(60)), [("loop1".to_owned(), vec![])]);
}
