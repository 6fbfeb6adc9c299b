//! Per-client rate limit for the calls that make the agent scan afresh (Plan): a sliding
//! one-minute window per caller identity (`uid N` on the socket, the certificate's identity on
//! TCP), so one client cannot keep the node busy scanning for everyone else.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);
/// Callers remembered at most (the oldest are forgotten first): bounds memory against a client
/// that invents identities (each needs a certificate from the CA or a uid on the node anyway).
const MAX_PEERS: usize = 4096;

/// The windows of every recent caller.
#[derive(Debug)]
pub struct PeerLimit {
    per_minute: u32,
    calls: Mutex<HashMap<String, VecDeque<Instant>>>,
}

impl PeerLimit {
    /// `per_minute` calls a minute per caller; 0 turns the limit off.
    pub fn new(per_minute: u32) -> Self {
        Self { per_minute, calls: Mutex::new(HashMap::new()) }
    }

    /// Counts a call by `peer` at `now`, or says how long until the next one is allowed.
    pub fn admit(&self, peer: &str, now: Instant) -> Result<(), Duration> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        if calls.len() >= MAX_PEERS && !calls.contains_key(peer) {
            calls.retain(|_, w| w.back().is_some_and(|t| now.duration_since(*t) < WINDOW));
        }
        let window = calls.entry(peer.to_owned()).or_default();
        while window.front().is_some_and(|t| now.duration_since(*t) >= WINDOW) {
            window.pop_front();
        }
        if window.len() >= self.per_minute as usize {
            let oldest = window.front().copied().unwrap_or(now);
            return Err(WINDOW.saturating_sub(now.duration_since(oldest)));
        }
        window.push_back(now);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_caller_has_its_own_minute() {
        let l = PeerLimit::new(3);
        let t0 = Instant::now();
        for i in 0..3 {
            assert!(l.admit("uid 1000", t0 + Duration::from_secs(i)).is_ok());
        }
        let wait = l.admit("uid 1000", t0 + Duration::from_secs(10)).expect_err("fourth in a minute");
        assert_eq!(wait, Duration::from_secs(50), "until the first call leaves the window");
        assert!(l.admit("uid 0", t0 + Duration::from_secs(10)).is_ok(), "another caller is not slowed");
        assert!(l.admit("uid 1000", t0 + Duration::from_secs(60)).is_ok(), "the window moved on");
        assert!(PeerLimit::new(0).admit("x", t0).is_ok(), "0: no limit");
    }
}
