//! Whether an agent's link has gone silent, judged so that the console's own slowness is never
//! taken for the agent's (issue 36: under load every link dropped on its 2 s HTTP/2 keepalive, and
//! every reconnect re-read a whole agent: a reconnect storm).
//!
//! Two parts:
//! - [`LagMeter`]: one ticker task wakes every [`TICK`] and adds up how late it woke (its
//!   scheduling lag: a busy runtime, a starved CPU, a stopped process). The total only grows; the
//!   lag over a window is the difference of two readings, and a reading also counts the lateness
//!   of a tick that is overdue now (the ticker itself may not have run yet).
//! - [`Heard`]: when a link last heard from its agent (any message on its event stream, any
//!   answer to a call or probe) and the meter's reading then. Its silence is the time since,
//!   minus the lag the console showed over that same time; only that unexplained silence counts
//!   against the limit. An agent stopped or cut off while the console runs on time is named
//!   silent after the limit; a console that could not run for 3 s does not blame the agents
//!   whose answers wait, unread, in its sockets.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the lag ticker wakes.
pub const TICK: Duration = Duration::from_millis(100);

/// The console's accumulated scheduling lag (see the module docs). Cheap to read from any task.
#[derive(Debug)]
pub struct LagMeter {
    base: Instant,
    /// Lateness of every tick so far, microseconds.
    total_us: AtomicU64,
    /// When the ticker is next due, microseconds after `base`.
    due_us: AtomicU64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl LagMeter {
    /// A meter whose ticker is not running yet (see [`LagMeter::start`]).
    pub fn new() -> Arc<Self> {
        Arc::new(LagMeter {
            base: Instant::now(),
            total_us: AtomicU64::new(0),
            due_us: AtomicU64::new(u64::MAX),
        })
    }

    /// Starts the ticker on the current runtime; it runs until the returned task is aborted.
    pub fn start(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let m = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                let due = Instant::now() + TICK;
                m.due_us.store(micros(due - m.base), Ordering::Release);
                tokio::time::sleep_until(due.into()).await;
                m.woke(due, Instant::now());
            }
        })
    }

    /// Records a tick due at `due` that ran at `woke`. Adds before the caller moves `due_us` on:
    /// a reading in between counts that lateness twice (more excuse, never less).
    fn woke(&self, due: Instant, woke: Instant) {
        self.total_us.fetch_add(micros(woke.saturating_duration_since(due)), Ordering::AcqRel);
    }

    /// The lag accumulated up to `now`: every tick's lateness, and how overdue the pending tick is.
    pub fn reading(&self, now: Instant) -> Duration {
        let total = self.total_us.load(Ordering::Acquire);
        let due = self.due_us.load(Ordering::Acquire);
        let overdue = micros(now.saturating_duration_since(self.base)).saturating_sub(due);
        Duration::from_micros(total.saturating_add(overdue))
    }
}

/// When a link last heard from its agent, with the meter's reading then.
#[derive(Debug, Clone, Copy)]
pub struct Heard {
    pub at: Instant,
    pub lag: Duration,
}

impl Heard {
    pub fn now(meter: &LagMeter) -> Self {
        let at = Instant::now();
        Heard { at, lag: meter.reading(at) }
    }

    /// The silence at `now` that the console's own lag (`lag_now`, a reading at `now`) does not
    /// explain.
    pub fn unexplained(&self, now: Instant, lag_now: Duration) -> Duration {
        now.saturating_duration_since(self.at).saturating_sub(lag_now.saturating_sub(self.lag))
    }

    /// Whether the agent counts as silent at `now`: unexplained silence over `limit`.
    pub fn silent(&self, now: Instant, lag_now: Duration, limit: Duration) -> bool {
        self.unexplained(now, lag_now) > limit
    }

    /// When to judge again: the instant the silence would exceed `limit` if nothing is heard and
    /// the console shows no more lag than it has (`lag_now` at `now`).
    pub fn next_judgement(&self, now: Instant, lag_now: Duration, limit: Duration) -> Instant {
        let excused = lag_now.saturating_sub(self.lag);
        (self.at + limit + excused + Duration::from_millis(1)).max(now + Duration::from_millis(1))
    }

    /// Why a silent link is ended, in words (the index keeps it as the node's error).
    pub fn why(&self, now: Instant, lag_now: Duration, limit: Duration) -> String {
        let silence = now.saturating_duration_since(self.at);
        let lag = lag_now.saturating_sub(self.lag);
        format!(
            "the agent went silent: nothing heard for {:.1} s (no event, no answer to a probe), {:.1} s more \
             than the console's own scheduling lag over that time ({:.1} s) explains; the limit is {:.1} s",
            silence.as_secs_f64(),
            silence.saturating_sub(lag).as_secs_f64(),
            lag.as_secs_f64(),
            limit.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(3);

    #[test]
    fn silence_explained_by_the_consoles_own_lag_is_not_silence() {
        let t0 = Instant::now();
        let heard = Heard { at: t0, lag: Duration::from_secs(10) };
        // 4 s without a word while the console itself ran on time: silent.
        let now = t0 + Duration::from_secs(4);
        assert_eq!(heard.unexplained(now, Duration::from_secs(10)), Duration::from_secs(4));
        assert!(heard.silent(now, Duration::from_secs(10), LIMIT));
        // The same 4 s, of which the console could not run for 2.5: 1.5 s unexplained.
        let lag = Duration::from_millis(12_500);
        assert_eq!(heard.unexplained(now, lag), Duration::from_millis(1500));
        assert!(!heard.silent(now, lag, LIMIT));
        // The console was stalled longer than the silence: nothing unexplained.
        assert_eq!(heard.unexplained(now, Duration::from_secs(20)), Duration::ZERO);
        // At the limit exactly: not yet.
        assert!(!heard.silent(t0 + LIMIT, Duration::from_secs(10), LIMIT));
        let why = heard.why(now, lag, LIMIT);
        assert!(why.contains("4.0 s") && why.contains("1.5 s more") && why.contains("(2.5 s)"), "{why}");
    }

    #[test]
    fn the_next_judgement_moves_with_the_lag() {
        let t0 = Instant::now();
        let heard = Heard { at: t0, lag: Duration::ZERO };
        let now = t0 + Duration::from_secs(1);
        let first = heard.next_judgement(now, Duration::ZERO, LIMIT);
        assert!(first > t0 + LIMIT && first < t0 + LIMIT + Duration::from_millis(5));
        let later = heard.next_judgement(now, Duration::from_secs(2), LIMIT);
        assert!(later > t0 + LIMIT + Duration::from_secs(2), "2 s of lag pushes it by 2 s");
        // Overdue: judged again at once, never in the past.
        let overdue = heard.next_judgement(t0 + Duration::from_secs(9), Duration::ZERO, LIMIT);
        assert!(overdue > t0 + Duration::from_secs(9));
    }

    /// The meter on a real runtime: a task that holds the only worker thread for 1.5 s (as a
    /// starved or busy console would) shows as about that much lag; an idle second shows little.
    #[test]
    fn the_meter_measures_a_blocked_runtime() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let meter = LagMeter::new();
            let ticker = meter.start();
            tokio::time::sleep(Duration::from_millis(250)).await;
            let t = Instant::now();
            let before = meter.reading(t);
            tokio::time::sleep(Duration::from_secs(1)).await;
            let idle = meter.reading(Instant::now()) - before;
            assert!(idle < Duration::from_millis(300), "an idle second showed {idle:?} of lag");

            let heard = Heard::now(&meter);
            // The ticker is due within 100 ms and cannot run while this blocks the thread.
            std::thread::sleep(Duration::from_millis(1500));
            let now = Instant::now();
            let lag = meter.reading(now);
            let shown = lag - heard.lag;
            assert!(
                shown >= Duration::from_millis(1300) && shown <= Duration::from_millis(1700),
                "a 1.5 s stall showed {shown:?} of lag"
            );
            // Read before the ticker ran again (the overdue part) and after: the same, near enough.
            tokio::time::sleep(Duration::from_millis(150)).await;
            let after = meter.reading(Instant::now()) - heard.lag;
            assert!(after >= shown && after < shown + Duration::from_millis(300), "{shown:?} then {after:?}");
            assert!(
                !heard.silent(now, lag, Duration::from_secs(1)),
                "the stall is the console's, not the agent's"
            );
            ticker.abort();
        });
    }
}
