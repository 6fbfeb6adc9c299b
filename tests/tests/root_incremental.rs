//! Incremental rescans on the real kernel (issue 13): the daemon shows a mount added or removed
//! in a foreign mount namespace, and a loop device attached or detached, by reading again only
//! what changed, not by a full scan; and what a re-read cannot stand in for (a namespace new
//! since the last full scan) still ends up seen, by a full scan.
//!
//! Which kind of scan published a change is told by the device's `last_seen_scan` in the event:
//! a full scan reads the devices (it equals that view's generation), a re-read carries the
//! previous full scan's generation. The file holds one test, so nothing else in its process
//! makes uevents or mounts while it runs.

use std::path::Path;
use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;
use tokio_stream::StreamExt;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "nsenter", "mount", "umount"];

type Events = tonic::Streaming<pb::Event>;

/// Waits for a `kind` event about `device` whose message contains `text`; returns it with the
/// generation of the view it came from.
async fn wait_event(events: &mut Events, kind: pb::event::Type, device: &str, text: &str) -> pb::Event {
    let deadline = tokio::time::Instant::now() + REACT;
    loop {
        let e = tokio::time::timeout_at(deadline, events.next())
            .await
            .unwrap_or_else(|_| panic!("no {kind:?} event for {device} ({text:?}) within {REACT:?}"))
            .expect("the event stream stays open")
            .expect("an event");
        if e.device == device && e.r#type == kind as i32 && e.message.contains(text) {
            return e;
        }
    }
}

/// Whether an event was published by a re-read: the device's own state in it is an earlier
/// (full) scan's than the view that showed the change.
fn by_reread(e: &pb::Event) -> bool {
    let seen = e.current.as_ref().map_or(0, |d| d.last_seen_scan);
    assert!(seen <= e.scan, "a device cannot be seen in a later scan than the view showing it: {e:#?}");
    seen > 0 && seen < e.scan
}

fn in_ns(pid: u32, args: &[&str]) {
    let pid = pid.to_string();
    let mut all = vec!["-t", pid.as_str(), "-m"];
    all.extend_from_slice(args);
    sh("nsenter", &all);
}

#[test]
fn root_mount_changes_and_uevents_are_shown_by_reading_only_what_changed() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    let img = s.ext4_image("disk.img", 32);
    let img2 = s.ext4_image("second.img", 32);
    let target = s.mkdir("mnt");
    let holder = NsProcess::spawn("exec sleep 600");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    let d = Daemon::start(s.dir.path(), &["--rescan-interval", "20"]);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut events = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();

        // Mount and unmount in the holder's namespace (known to the start-up scan): each shown
        // by a re-read of that namespace. Three rounds, so that one full scan another trigger
        // happens to run at the same moment cannot decide the outcome.
        let mut rereads = 0;
        for round in 0..3 {
            in_ns(holder.pid(), &["mount", &lo.dev, target.to_str().expect("utf8")]);
            let added =
                wait_event(&mut events, pb::event::Type::HoldersChanged, &name, "1 holder(s) added").await;
            let dev = added.current.as_ref().expect("the device as it is now");
            let h =
                dev.holders.iter().find(|h| h.mount_point == target.to_string_lossy()).unwrap_or_else(|| {
                    panic!("round {round}: the new mount is among the holders: {:#?}", dev.holders)
                });
            assert_eq!(h.mount_namespace, holder.ns_inode(), "round {round}: in the holder's namespace");
            assert!(h.pids.contains(&holder.pid()), "round {round}: naming its process: {h:#?}");
            let via_added = by_reread(&added);

            in_ns(holder.pid(), &["umount", target.to_str().expect("utf8")]);
            let gone = wait_event(&mut events, pb::event::Type::HoldersChanged, &name, " 0 now").await;
            let dev = gone.current.as_ref().expect("the device as it is now");
            assert!(dev.holders.is_empty(), "round {round}: nothing holds it any more: {:#?}", dev.holders);
            let via_gone = by_reread(&gone);
            if via_added && via_gone {
                rereads += 1;
            }
        }
        assert!(
            rereads >= 1,
            "no mount change was shown by a re-read of its namespace alone (every one by a full scan)"
        );

        // A filesystem outlives its last mount by a moment; once it is gone, the re-read after
        // the unmount must not still report it as living on the device.
        assert!(
            wait_until(Duration::from_secs(10), || !Path::new(&format!("/sys/fs/ext4/{name}")).exists()),
            "the kernel released the filesystem"
        );
        let mut settled = false;
        for _ in 0..100 {
            let dev = c
                .get_device(pb::GetDeviceRequest { device: name.clone() })
                .await
                .expect("GetDevice")
                .into_inner();
            if dev.verdict != pb::Verdict::InUse as i32 {
                settled = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(settled, "after the unmount, {name} is not shown in use by a filesystem that is gone");

        // A loop device attached now: shown by a re-read of that device (its uevent). Twice at
        // most, in case a full scan was under way the first time.
        let mut lo2 = None;
        let mut reread_attach = false;
        for _ in 0..2 {
            drop(lo2.take());
            // An unbound loop device is listed too: attaching changes it (no DeviceAdded). If
            // the device, once shown bound, is still as the full scan before the attach read
            // it, a re-read showed the change.
            let full_before =
                c.get_node(pb::GetNodeRequest {}).await.expect("GetNode").into_inner().last_full_scan;
            let l = LoopDev::attach(&img2);
            let deadline = tokio::time::Instant::now() + REACT;
            let dev = loop {
                if let Ok(d) = c.get_device(pb::GetDeviceRequest { device: l.name().to_owned() }).await {
                    let d = d.into_inner();
                    if d.loop_backing_file == img2.to_string_lossy() {
                        break d;
                    }
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} never showed its new backing file",
                    l.name()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            };
            assert!(dev.size_bytes > 0, "the attached size, as sysfs shows it: {dev:#?}");
            assert!(dev.last_seen_scan >= full_before, "{dev:#?}");
            reread_attach = dev.last_seen_scan == full_before;
            lo2 = Some(l);
            if reread_attach {
                break;
            }
        }
        assert!(
            reread_attach,
            "an attached loop device was shown by a full scan both times, never by a re-read"
        );
        let lo2 = lo2.expect("attached");
        let name2 = lo2.name().to_owned();

        // A namespace created since the last full scan is not watched yet: a mount in it is
        // seen by the next full scan (the timer's, every 20 s here), and from then on its
        // changes are re-read like any other's.
        let newcomer = NsProcess::spawn("exec sleep 600");
        in_ns(newcomer.pid(), &["mount", &lo2.dev, target.to_str().expect("utf8")]);
        let deadline = tokio::time::Instant::now() + REACT;
        loop {
            let dev = c
                .get_device(pb::GetDeviceRequest { device: name2.clone() })
                .await
                .expect("GetDevice")
                .into_inner();
            if dev.holders.iter().any(|h| h.mount_namespace == newcomer.ns_inode()) {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the mount in the namespace created after the full scan was never seen: {:#?}",
                dev.holders
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        in_ns(newcomer.pid(), &["umount", target.to_str().expect("utf8")]);
        let gone = wait_event(&mut events, pb::event::Type::HoldersChanged, &name2, " 0 now").await;
        assert!(gone.current.as_ref().is_some_and(|d| d.holders.is_empty()), "{gone:#?}");
    });
    drop(holder);
}
