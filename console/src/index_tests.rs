//! Tests of the fleet index (`index.rs`): lookups, gone nodes, missing nodes, down marks.

use super::*;

fn rbd_dev(name: &str, image: &str, addr: &str, client: &str) -> pb::Device {
    pb::Device {
        name: name.into(),
        rbd: Some(pb::RbdMapping {
            pool: "k8s".into(),
            image: image.into(),
            client_addr: addr.into(),
            client_id: client.into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn lookups_follow_replacements_and_events() {
    let ix = Index::new();
    let mut w = ix.write();
    w.upsert_node("a", "127.0.0.2:1", "static", None);
    w.replace_devices("a", vec![rbd_dev("rbd4", "img", "10.0.0.5:0/1", "client.7")]);
    let found = w.lookup(&Key::Image("k8s/img".into()));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].node, "a");
    assert_eq!(w.lookup(&Key::ClientIp("10.0.0.5".into())).len(), 1);
    assert_eq!(w.lookup(&Key::ClientId("client.7".into())).len(), 1);
    // The device now maps another image: the old keys go.
    w.upsert_device("a", rbd_dev("rbd4", "other", "10.0.0.5:0/2", "client.8"));
    assert!(w.lookup(&Key::Image("k8s/img".into())).is_empty());
    assert!(w.lookup(&Key::ClientId("client.7".into())).is_empty());
    assert_eq!(w.lookup(&Key::Image("k8s/other".into())).len(), 1);
    w.remove_device("a", "rbd4");
    assert!(w.lookup(&Key::Image("k8s/other".into())).is_empty());
    assert_eq!(w.device_count(), 0);
}

#[test]
fn a_node_that_goes_keeps_its_last_view_out_of_the_fleet_until_it_comes_back() {
    let ix = Index::new();
    let mut w = ix.write();
    w.upsert_node("a", "127.0.0.2:1", "kubernetes", None);
    w.replace_devices("a", vec![rbd_dev("rbd4", "img", "10.0.0.5:0/1", "client.7")]);
    w.remove_node("a");
    assert!(w.nodes.is_empty() && w.missing().is_empty(), "out of the fleet and of missing_nodes");
    assert!(w.lookup(&Key::Image("k8s/img".into())).is_empty(), "out of the key tables");
    let found = w.lookup_gone(&[Key::Image("k8s/img".into())]);
    assert_eq!(found.len(), 1);
    assert_eq!((found[0].0.node.as_str(), found[0].1.entry.error.as_str()), ("a", "its agent pod went away"));
    assert!(w.seen.instance("10.0.0.5".parse().expect("ip"), 1).is_some(), "its client was seen");
    w.upsert_node("a", "127.0.0.3:1", "kubernetes", None);
    assert!(w.gone.is_empty(), "back in the fleet");
}

#[test]
fn iscsi_targets_and_nvme_subsystems_are_keys() {
    let d = pb::Device {
        name: "sdc".into(),
        iscsi_session: Some(pb::IscsiSessionInfo {
            target: "IQN.2004-10.com.example:disk1".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(keys_of(&d).contains(&Key::Iqn("iqn.2004-10.com.example:disk1".into())));
    let n = pb::Device {
        name: "nvme0n1".into(),
        nvme: Some(pb::NvmeNamespace {
            subsysnqn: "nqn.2019-08.org.qemu:t".into(),
            controllers: vec![pb::NvmeController {
                subsysnqn: "nqn.2019-08.org.qemu:t".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(keys_of(&n), vec![Key::Nqn("nqn.2019-08.org.qemu:t".into())]);
}

#[test]
fn unsynced_and_unreachable_nodes_are_missing() {
    let ix = Index::new();
    let mut w = ix.write();
    w.upsert_node("a", "127.0.0.2:1", "static", None);
    w.upsert_node("b", "", "kubernetes", Some("the agent pod has no IP yet"));
    let missing = w.missing();
    assert_eq!(missing.len(), 2);
    assert_eq!(missing[0].reason, "not synced yet");
    assert_eq!(missing[1].reason, "the agent pod has no IP yet");
    if let Some(n) = w.nodes.get_mut("a") {
        n.reachable = true;
        n.synced = true;
    }
    assert_eq!(w.missing().len(), 1);
}

#[test]
fn a_down_mark_says_since_when_and_why_until_the_agent_answers_again() {
    let ix = Index::new();
    let mut w = ix.write();
    w.upsert_node("a", "127.0.0.2:1", "static", None);
    let n = w.nodes.get_mut("a").expect("node");
    n.mark_up(now_secs());
    assert!(n.missing_reason().is_none());
    n.mark_down("WatchEvents: Unavailable: keep-alive timed out".into());
    let since = n.down_since;
    assert!(since > 0.0);
    // A failed retry says why now, and keeps when the link went silent.
    n.mark_down("connect: timed out".into());
    assert_eq!(n.down_since, since);
    let reason = n.missing_reason().expect("missing");
    assert!(reason.starts_with("unreachable for ") && reason.ends_with(": connect: timed out"), "{reason}");
    n.mark_up(now_secs());
    assert!(n.missing_reason().is_none());
    assert_eq!(n.down_since, 0.0);
    assert!(n.error.is_empty());
}

#[test]
fn a_not_refreshed_node_is_missing_but_not_down_with_its_cached_views_age() {
    let ix = Index::new();
    let mut w = ix.write();
    w.upsert_node("a", "127.0.0.2:1", "static", None);
    let n = w.nodes.get_mut("a").expect("node");
    n.mark_up(now_secs());
    n.last_sync = now_secs() - 12.0;
    n.mark_not_refreshed("a fresh read did not complete: ListDevices: deadline".into());
    let m = n.missing_node().expect("missing");
    assert!(m.not_refreshed, "{m:?}");
    assert!((11.0..20.0).contains(&m.answer_age_seconds), "{m:?}");
    assert!(m.reason.starts_with("not refreshed: a fresh read did not complete"), "{}", m.reason);
    assert!(m.reason.contains("12 s old") && m.reason.contains("not down"), "{}", m.reason);
    assert_eq!(
        n.missing_cause().as_deref(),
        Some("not refreshed: a fresh read did not complete: ListDevices: deadline")
    );
    let f = n.to_message();
    assert!(f.reachable && f.not_refreshed.contains("deadline"), "still reachable: {f:?}");
    assert_eq!(n.down_since, 0.0, "not down");
    // A down node is missing as down, not as not refreshed.
    n.mark_down("silent".into());
    let m = n.missing_node().expect("missing");
    assert!(!m.not_refreshed && m.answer_age_seconds == 0.0 && m.reason.starts_with("unreachable"), "{m:?}");
    // A full read clears both.
    n.mark_up(now_secs());
    assert!(n.missing_node().is_none() && n.not_refreshed.is_empty());
    drop(w);
    assert!(ix.read().missing().is_empty());
}
