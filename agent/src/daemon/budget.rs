//! The per-minute budget of destructive steps in release and clean modes.
//!
//! A plan runs as a unit: its steps depend on each other (release the mounts, then remove the
//! map, then its paths), so it is never cut in two. A plan fits when its steps fit in what is
//! left of the window; a plan larger than the whole budget is admitted only when the window is
//! empty (so a 4-path map teardown of 10 steps still runs under a budget of 6, and at most one
//! such plan runs a minute). Nothing is ever postponed forever.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Steps run in the last `window`.
#[derive(Debug)]
pub struct Budget {
    per_window: usize,
    window: Duration,
    recent: VecDeque<Instant>,
}

impl Budget {
    pub fn new(per_window: usize, window: Duration) -> Self {
        Self { per_window, window, recent: VecDeque::new() }
    }

    /// Admits a plan of `steps` steps at `now` and counts them, or says no.
    pub fn admit(&mut self, steps: usize, now: Instant) -> bool {
        while self.recent.front().is_some_and(|t| now.duration_since(*t) >= self.window) {
            self.recent.pop_front();
        }
        let left = self.per_window.saturating_sub(self.recent.len());
        let fits = steps <= left || self.recent.is_empty();
        if fits && steps > 0 {
            self.recent.extend(std::iter::repeat_n(now, steps));
        }
        fits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_run_whole_and_a_big_one_waits_for_an_empty_window() {
        let t0 = Instant::now();
        let minute = Duration::from_secs(60);
        let mut b = Budget::new(6, minute);
        assert!(b.admit(10, t0), "a plan larger than the budget runs when the window is empty");
        assert!(!b.admit(1, t0 + Duration::from_secs(1)), "then the window is full");
        assert!(b.admit(4, t0 + minute), "a minute later it is empty again");
        assert!(b.admit(2, t0 + minute), "and what fits, fits");
        assert!(!b.admit(1, t0 + minute), "6 of 6 used");
        assert!(!b.admit(10, t0 + minute + Duration::from_secs(1)), "a big plan waits for an empty window");
        assert!(b.admit(10, t0 + minute * 2), "and then runs: never postponed forever");
    }
}
