//! The per-device cap on state events (issue 21, `daemon::event_rate`; on by default, `serve
//! --no-cap-device-events` turns it off) on the real kernel: a process mounts and unmounts a loop
//! device in its own namespace about eight times a second for four seconds (each cycle changes its
//! holders and its verdict twice).
//!
//! - With the agent's defaults, a watcher receives at most about one event about that device a
//!   second, the cap's effect is visible in them (`coalesced` and the message), the first one is
//!   the first mount itself, sent at once (not held and folded), and the last one shows the device
//!   as it ended up (nothing held), so folding loses no final state and the held events are sent
//!   (the flusher, asleep while nothing is held, wakes for them).
//! - With `--no-cap-device-events`, the same churn reaches the watcher as it happens: many more
//!   events than one a second, none folded.

use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_tests::daemon::{unix_client, Daemon};
use blockjanitor_tests::*;
use tokio_stream::StreamExt;

const CHURN_SECONDS: u64 = 4;
/// The churn, then 6 s: a re-read 1 s after the last unmount (a filesystem outlives its mount a
/// moment) and its event, held up to a second, go out.
const WATCH_SECONDS: u64 = CHURN_SECONDS + 6;
const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "unshare", "nsenter", "mount", "umount"];

/// What the watcher received about the churning device (arrival time since the churn started,
/// event), and the number of mount/unmount cycles made.
struct Churned {
    name: String,
    events: Vec<(Duration, pb::Event)>,
    cycles: u32,
}

impl Churned {
    fn changes(&self) -> u32 {
        2 * self.cycles
    }

    fn summary(&self) -> Vec<String> {
        self.events
            .iter()
            .map(|(t, e)| format!("{:.2}s coalesced={} {}", t.as_secs_f64(), e.coalesced, e.message))
            .collect()
    }
}

/// Starts a daemon with `flags`, opens a watch, churns a loop device's mounts in a namespace of
/// its own for [`CHURN_SECONDS`], and collects the state events about it for [`WATCH_SECONDS`].
fn churn(flags: &[&str]) -> Option<Churned> {
    let (_serial, s) = real_kernel_test(TOOLS)?;
    let img = s.ext4_image("churn.img", 32);
    let target = s.mkdir("mnt");
    let holder = NsProcess::spawn("exec sleep 600");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    let mut args = vec!["--rescan-interval", "30"];
    args.extend_from_slice(flags);
    let d = Daemon::start(s.dir.path(), &args);
    let (events, cycles) = rt().block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut stream = c.watch_events(pb::WatchEventsRequest {}).await.expect("WatchEvents").into_inner();
        // Each state held 50 ms, long enough for a re-read to see it.
        let script = format!(
            "n=0; end=$(($(date +%s) + {CHURN_SECONDS})); while [ $(date +%s) -lt $end ]; do \
             mount {dev} {t} || exit 1; sleep 0.05; umount {t} || exit 1; n=$((n+1)); sleep 0.05; done; echo $n",
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
        let until = tokio::time::Instant::now() + Duration::from_secs(WATCH_SECONDS);
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
    drop(d);
    let churned = Churned { name, events, cycles };
    let changes = churned.changes();
    assert!(changes >= 20, "the churn made {changes} changes: too few to show a cap");
    eprintln!(
        "{} events about {} for {changes} changes in {WATCH_SECONDS} s (flags {flags:?}): {:#?}",
        churned.events.len(),
        churned.name,
        churned.summary()
    );
    Some(churned)
}

#[test]
fn root_by_default_a_device_whose_holders_churn_gets_one_event_a_second() {
    let Some(c) = churn(&[]) else { return };
    let (changes, summary) = (c.changes(), c.summary());
    assert!(
        c.events.len() as u64 <= WATCH_SECONDS + 3,
        "{} events for {changes} changes in {WATCH_SECONDS} s: the cap is one a second\n{summary:#?}",
        c.events.len()
    );
    assert!(
        c.events.iter().any(|(_, e)| e.coalesced > 0 && e.message.contains("folded into one")),
        "the cap's effect is visible to the watcher: {summary:#?}"
    );
    // The device's first change after a quiet time goes at once: the first mount itself, not a
    // fold of it with the unmount 50 ms later.
    let (_, first) = c.events.first().expect("at least one event");
    let dev = first.current.as_ref().expect("the device as it is now");
    assert!(
        first.coalesced == 0 && !dev.holders.is_empty(),
        "the first event is the first mount, sent at once: {summary:#?}"
    );
    let (_, last) = c.events.last().expect("at least one event");
    let dev = last.current.as_ref().expect("the device as it is now");
    assert!(dev.holders.is_empty(), "the last event shows the device as it ended (unmounted): {summary:#?}");
}

#[test]
fn root_without_the_cap_every_change_goes_at_once() {
    let Some(c) = churn(&["--no-cap-device-events"]) else { return };
    let summary = c.summary();
    assert!(
        c.events.len() as u64 > WATCH_SECONDS + 3,
        "{} events for {} changes in {WATCH_SECONDS} s: without the cap a watcher gets more than one a \
         second\n{summary:#?}",
        c.events.len(),
        c.changes()
    );
    assert!(c.events.iter().all(|(_, e)| e.coalesced == 0), "nothing folded: {summary:#?}");
    let (_, last) = c.events.last().expect("at least one event");
    let dev = last.current.as_ref().expect("the device as it is now");
    assert!(dev.holders.is_empty(), "the last event shows the device as it ended (unmounted): {summary:#?}");
}
