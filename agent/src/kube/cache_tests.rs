//! Tests of the cluster watch cache.

use super::super::cluster::{PodInfo, VaInfo, WatchHealth};
use super::*;
use crate::host::clock::BootTime;
use std::time::Duration;

fn pod(name: &str) -> PodInfo {
    PodInfo { name: name.into(), namespace: "shop".into(), ..Default::default() }
}

fn names(t: &Table<PodInfo>) -> Vec<&str> {
    t.live.values().map(|p| p.name.as_str()).collect()
}

#[test]
fn a_table_vouches_only_after_a_complete_list() {
    let mut t = Table::new(Kind::Pods);
    assert!(!t.apply(Op::Begin));
    assert!(!t.apply(Op::Listed("shop/a".into(), pod("a"))));
    assert!(!t.apply(Op::Skip));
    assert!(!t.synced && t.live.is_empty(), "half a list is not shown");
    assert!(t.apply(Op::Commit));
    assert!(t.synced && t.error.is_none());
    assert_eq!(names(&t), ["a"]);
    assert!(t.apply(Op::Upsert("shop/b".into(), pod("b"))));
    assert!(t.apply(Op::Remove("shop/a".into())));
    assert!(!t.apply(Op::Remove("shop/a".into())), "removing what is not there changes nothing");

    // The watch breaks mid-relist: unsynced at once, the objects kept as last seen, the
    // partial list dropped.
    assert!(!t.apply(Op::Begin));
    assert!(!t.apply(Op::Listed("shop/c".into(), pod("c"))));
    assert!(t.fail("watch stream failed: EOF".into()));
    assert!(!t.synced);
    assert_eq!(t.error.as_deref(), Some("watch stream failed: EOF"));
    assert_eq!(names(&t), ["b"]);
    assert!(t.pending.is_none());
    assert!(!t.fail("watch stream failed: EOF".into()), "the same failure again changes nothing");
    assert!(t.fail("failed to perform initial object list: 500".into()), "a new error is shown");

    // A plain event (from anywhere) does not make it vouch again, nor clear the error.
    assert!(t.apply(Op::Upsert("shop/d".into(), pod("d"))));
    assert!(t.apply(Op::Remove("shop/d".into())));
    assert!(!t.synced);
    assert!(t.error.is_some());

    // Only a relist that completes does, and it replaces the table whole.
    t.apply(Op::Begin);
    t.apply(Op::Listed("shop/e".into(), pod("e")));
    assert!(!t.synced && t.error.is_some(), "not before the list is complete");
    assert_eq!(names(&t), ["b"]);
    assert!(t.apply(Op::Commit));
    assert!(t.synced && t.error.is_none());
    assert_eq!(names(&t), ["e"]);
    assert_eq!(t.health(), WatchHealth { resource: "pods", synced: true, error: None, heard: None });
}

#[test]
fn state_view_names_the_broken_watch_and_tracks_contact() {
    let t = |s: u64| BootTime::from_since_boot(Duration::from_secs(s));
    let mut state = State::new(Duration::from_secs(60));
    let view = state.view("node-a");
    assert!(!view.synced && view.watches.len() == 3 && view.last_contact.is_none());
    assert_eq!(view.vouch(t(0)), Err("the pods watch is not synced yet".into()));

    assert!(!state.apply(Change::Pod(Op::Begin), t(1)));
    assert_eq!(state.pods.heard, None, "announcing a list is not an answer");
    for (i, change) in
        [Change::Pod(Op::Commit), Change::Va(Op::Commit), Change::Pv(Op::Commit)].into_iter().enumerate()
    {
        assert!(state.apply(change, t(2 + i as u64)));
    }
    let heard: Vec<_> = state.view("node-a").watches.iter().map(|w| w.heard).collect();
    assert_eq!(heard, [Some(t(2)), Some(t(3)), Some(t(4))], "each watch its own");
    assert_eq!(state.last_contact, None, "a watch's answer is not the Node's");
    assert_eq!(state.view("node-a").vouch(t(4)), Err("the Node lookup has not been answered yet".into()));

    // A failed lookup is recorded but neither desyncs nor counts as contact.
    assert!(state.apply(Change::Probe(Err("get node node-a: timed out".into())), t(5)));
    let view = state.view("node-a");
    assert!(view.synced);
    assert_eq!(view.last_error.as_deref(), Some("get node node-a: timed out"));
    assert_eq!(view.last_contact, None);

    assert!(state.apply(Change::Probe(Ok(false)), t(6)));
    assert_eq!(state.last_contact, Some(t(6)), "a 404 is an answer");
    let view = state.view("node-a");
    assert_eq!((view.node_found, view.last_error.as_deref()), (Some(false), None));
    assert!(view.vouch(t(6)).is_err_and(|e| e.starts_with("no Node named 'node-a'")));
    assert!(state.apply(Change::Probe(Ok(true)), t(7)));
    assert!(!state.apply(Change::Probe(Ok(true)), t(8)), "only the contact time changed");
    assert_eq!(state.last_contact, Some(t(8)));
    assert_eq!(state.view("node-a").vouch(t(62)), Ok(()));
    // The pods watch heard last at 2 s: the first to go silent, and named.
    assert_eq!(
        state.view("node-a").vouch(t(63)),
        Err("the pods watch has not heard from the API server for 1m01s (bound 1m00s): no event, \
             no bookmark"
            .into())
    );
    // A bookmark (or an answered watch request) is a sign of life, and changes nothing else.
    assert!(!state.apply(Change::Heard(Kind::Pods), t(63)));
    assert_eq!(state.view("node-a").vouch(t(63)), Ok(()));
    assert!(state.view("node-a").vouch(t(64)).is_err_and(|e| e.starts_with("the volumeattachments watch")));
    for kind in [Kind::VolumeAttachments, Kind::PersistentVolumes] {
        state.apply(Change::Heard(kind), t(64));
    }
    assert!(state
        .view("node-a")
        .vouch(t(69))
        .is_err_and(|e| e.starts_with("the Node lookup has not been answered for 1m01s")));
    assert!(state
        .view("node-a")
        .vouch(t(125))
        .is_err_and(|e| e.starts_with("the Kubernetes API has not answered for 1m01s")));
    state.apply(Change::Probe(Ok(true)), t(9));

    // A broken watch: unsynced, named, and its error wins over a lookup's.
    state.apply(Change::Probe(Err("get node node-a: refused".into())), t(9));
    assert!(state.apply(Change::Broke(Kind::VolumeAttachments, "watch stream failed: EOF".into()), t(9)));
    let view = state.view("node-a");
    assert!(!view.synced);
    assert_eq!(view.last_error.as_deref(), Some("volumeattachments: watch stream failed: EOF"));
    assert_eq!(
        view.vouch(t(9)),
        Err("the volumeattachments watch broke (watch stream failed: EOF): relisting".into())
    );
    state.apply(Change::Va(Op::Upsert("x".into(), VaInfo::default())), t(10));
    assert!(!state.view("node-a").synced, "an event is no relist");
    state.apply(Change::Heard(Kind::VolumeAttachments), t(10));
    assert!(!state.view("node-a").synced, "nor is a bookmark");
    state.apply(Change::Va(Op::Begin), t(11));
    state.apply(Change::Va(Op::Commit), t(12));
    let view = state.view("node-a");
    assert!(view.synced);
    assert_eq!(view.last_error.as_deref(), Some("get node node-a: refused"));
}
