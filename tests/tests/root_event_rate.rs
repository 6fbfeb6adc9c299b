//! The per-device cap on state events (issue 21, `daemon::event_rate`, `--cap-device-events`: off
//! by default) on the real kernel: a
//! process mounts and unmounts a loop device in its own namespace about five times a second for
//! four seconds (each cycle changes its holders and its verdict twice); a watcher receives at most
//! about one event about that device a second, the cap's effect is visible in them (`coalesced`
//! and the message), and the last one shows the device as it ended up (nothing held), so folding
//! loses no final state.

use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;
use tokio_stream::StreamExt;

const CHURN_SECONDS: u64 = 4;

#[test]
fn root_a_device_whose_holders_churn_gets_one_event_a_second() {
    let Some((_serial, s)) =
        real_kernel_test(&["losetup", "mkfs.ext4", "unshare", "nsenter", "mount", "umount"])
    else {
        return;
    };
    let img = s.ext4_image("churn.img", 32);
    let target = s.mkdir("mnt");
    let holder = NsProcess::spawn("exec sleep 600");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    let d = Daemon::start(s.dir.path(), &["--rescan-interval", "30", "--cap-device-events"]);
    let rt = rt();
    let (events, cycles) = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut stream = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();
        let script = format!(
            "n=0; end=$(($(date +%s) + {CHURN_SECONDS})); while [ $(date +%s) -lt $end ]; do \
             mount {dev} {t} && umount {t} || exit 1; n=$((n+1)); sleep 0.1; done; echo $n",
            dev = lo.dev,
            t = target.display()
        );
        let pid = holder.pid().to_string();
        let churn = tokio::task::spawn_blocking(move || {
            std::process::Command::new("nsenter")
                .args(["-t", &pid, "-m", "sh", "-c", &script])
                .output()
                .expect("nsenter")
        });
        let started = Instant::now();
        let mut got = Vec::new();
        // The churn, then 6 s: a re-read 1 s after the last unmount (a filesystem outlives its mount a moment) and its event, held up to a second, go out.
        let until = tokio::time::Instant::now() + Duration::from_secs(CHURN_SECONDS + 6);
        while let Ok(Some(e)) = tokio::time::timeout_at(until, stream.next()).await {
            let e = e.expect("an event");
            use pb::event::Type;
            let state = [Type::HoldersChanged, Type::VerdictChanged, Type::ResponsivenessChanged];
            if e.device == name && state.iter().any(|t| *t as i32 == e.r#type) {
                got.push((started.elapsed(), e));
            }
        }
        let out = churn.await.expect("churn thread");
        assert!(out.status.success(), "the churn failed: {}", text(&out.stderr));
        let cycles: u32 = text(&out.stdout).trim().parse().expect("cycle count");
        (got, cycles)
    });
    let changes = 2 * cycles;
    assert!(changes >= 20, "the churn made {changes} changes: too few to show a cap");
    let summary: Vec<String> = events
        .iter()
        .map(|(t, e)| format!("{:.2}s coalesced={} {}", t.as_secs_f64(), e.coalesced, e.message))
        .collect();
    let seconds = CHURN_SECONDS + 6;
    eprintln!("{} events about {name} for {changes} changes in {seconds} s: {summary:#?}", events.len());
    assert!(
        events.len() as u64 <= seconds + 3,
        "{} events for {changes} changes in {seconds} s: the cap is one a second\n{summary:#?}",
        events.len()
    );
    assert!(
        events.iter().any(|(_, e)| e.coalesced > 0 && e.message.contains("folded into one")),
        "the cap's effect is visible to the watcher: {summary:#?}"
    );
    let (_, last) = events.last().expect("at least one event");
    let dev = last.current.as_ref().expect("the device as it is now");
    assert!(dev.holders.is_empty(), "the last event shows the device as it ended (unmounted): {summary:#?}");
    drop(d);
}
