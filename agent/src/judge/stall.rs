//! Which devices do not answer: I/O in flight and no I/O completed, across observations, for
//! at least a threshold. Kernel-general: it reads only the block layer's own counters
//! ([`crate::discover::iostat`]), so a dead multipath map, a hung nbd or rbd client and a loop
//! device whose backing file sits on a FUSE or NFS server that stopped answering all look alike.
//!
//! The completed count only grows, and an I/O counts as completed when it ends (failed or not).
//! So when two observations both see I/O in flight and the same completed count, nothing
//! completed in between, whatever the gap: the I/O in flight at the first one is still stuck.
//! A device is unresponsive once that has held for the threshold; one completion, or nothing in
//! flight, makes it responsive again. Time is [`BootTime`]; the caller (the engine) observes.

use std::collections::HashMap;
use std::time::Duration;

use serde::Serialize;

use crate::discover::iostat::IoStat;
use crate::host::clock::{human, BootTime};
use crate::model::DevNum;

/// The default threshold: a device whose I/O has made no progress for this long is unresponsive.
pub const DEFAULT_THRESHOLD: Duration = Duration::from_secs(10);

/// The evidence that a device does not answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Stall {
    /// I/Os in flight at the latest observation.
    pub in_flight: u64,
    /// How long no I/O has completed while some was in flight (at least, as observed).
    #[serde(serialize_with = "secs")]
    pub stalled_for: Duration,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl Stall {
    /// One line of evidence, for reasons (with its age).
    pub fn describe(&self) -> String {
        format!(
            "unresponsive: {} I/O(s) in flight and none completed for {} (the block layer's counters in sysfs `stat`)",
            self.in_flight,
            human(self.stalled_for)
        )
    }

    /// The same without figures that change from scan to scan (for summaries and Events).
    pub const SUMMARY: &'static str = "unresponsive: I/O in flight and none completing";
}

/// Where a device's I/O stood when it was last seen progressing.
#[derive(Debug, Clone, Copy)]
struct Progress {
    completed: u64,
    /// When it was last seen idle or completing I/O (or first seen, busy).
    since: BootTime,
}

/// The observations so far, per device (a new binding of the same number starts afresh).
#[derive(Debug, Default)]
pub struct StallWatch {
    seen: HashMap<(DevNum, Option<u64>), Progress>,
}

impl StallWatch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one observation of a device (`diskseq` tells its bindings apart) at `now`, and
    /// says whether it is unresponsive: I/O in flight and no completion for at least `threshold`.
    pub fn observe(
        &mut self,
        devnum: DevNum,
        diskseq: Option<u64>,
        stat: IoStat,
        now: BootTime,
        threshold: Duration,
    ) -> Option<Stall> {
        let key = (devnum, diskseq);
        let fresh = Progress { completed: stat.completed, since: now };
        let p = self.seen.entry(key).or_insert(fresh);
        if stat.in_flight == 0 || stat.completed != p.completed {
            *p = fresh;
            return None;
        }
        let stalled_for = now.since(p.since);
        (stalled_for >= threshold).then_some(Stall { in_flight: stat.in_flight, stalled_for })
    }

    /// Forgets devices no longer present (call after a scan of every device).
    pub fn retain(&mut self, present: impl Fn(DevNum, Option<u64>) -> bool) {
        self.seen.retain(|(d, s), _| present(*d, *s));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::iostat::parse;

    fn at(s: u64) -> BootTime {
        BootTime::from_since_boot(Duration::from_secs(s))
    }

    const T: Duration = Duration::from_secs(10);
    const LO: DevNum = DevNum::new(7, 0);

    /// `stat` of loop0 on this kernel before and while its backing FUSE server was stopped: the
    /// read in flight never completes.
    const BEFORE: &str = "    9771       21  4068140      986     1094      242    21616      665        0     3323     2272        2        0   131074        0      873      620";
    const HUNG: &str = "    9772       21  4068148      986     1094      242    21616      665        1     3324     2272        2        0   131074        0      873      620";
    const HUNG_LATER: &str = "    9772       21  4068148      986     1094      242    21616      665        1   219340     2272        2        0   131074        0      873      620";
    const RESUMED: &str = "    9790       21  4069000      990     1094      242    21616      665        0   219360     2272        2        0   131074        0      873      620";

    #[test]
    fn in_flight_without_completion_for_the_threshold_is_unresponsive() {
        let mut w = StallWatch::new();
        let obs = |w: &mut StallWatch, text: &str, s: u64| {
            w.observe(LO, Some(9), parse(text).expect("parses"), at(s), T)
        };
        assert_eq!(obs(&mut w, BEFORE, 100), None, "idle");
        assert_eq!(obs(&mut w, HUNG, 101), None, "busy: its own completion moved");
        assert_eq!(obs(&mut w, HUNG, 105), None, "4 s without completion is under the threshold");
        let s = obs(&mut w, HUNG_LATER, 111).expect("10 s without completion");
        assert_eq!(s, Stall { in_flight: 1, stalled_for: Duration::from_secs(10) });
        assert!(s.describe().contains("1 I/O(s) in flight and none completed for 10s"), "{}", s.describe());
        assert_eq!(obs(&mut w, HUNG_LATER, 140).map(|s| s.stalled_for), Some(Duration::from_secs(39)));
        assert_eq!(obs(&mut w, RESUMED, 141), None, "completions moved: responsive again");
        assert_eq!(obs(&mut w, RESUMED, 200), None);
    }

    #[test]
    fn busy_but_completing_is_never_unresponsive_and_a_rebinding_starts_afresh() {
        let mut w = StallWatch::new();
        for (i, s) in (100..200).step_by(5).enumerate() {
            let stat = IoStat { completed: i as u64 * 50, in_flight: 32 };
            assert_eq!(w.observe(LO, Some(1), stat, at(s), T), None);
        }
        let stuck = IoStat { completed: 7, in_flight: 1 };
        assert_eq!(w.observe(LO, Some(2), stuck, at(300), T), None, "first seen: no history");
        assert!(w.observe(LO, Some(2), stuck, at(310), T).is_some());
        assert_eq!(w.observe(LO, Some(3), stuck, at(311), T), None, "another binding of loop0");
        w.retain(|_, s| s == Some(3));
        assert_eq!(w.observe(LO, Some(2), stuck, at(400), T), None, "forgotten");
    }
}
