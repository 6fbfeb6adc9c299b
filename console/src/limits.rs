//! How many of a costly kind of call run at once (issue 36): fresh fan-outs (every agent asked),
//! plans (a call to an agent each: Fleet.Plan, an Apply's dry run, a MultiAttach diagnosis) and
//! sweeps (the whole fleet put together), per caller and in total. A call over either is refused
//! at once with RESOURCE_EXHAUSTED naming the limit and the flag that sets it, never queued: a
//! queue would hold callers past their deadlines and memory past its bound. These limits add to
//! the per-minute rate limits ([`crate::service::CallerLimits`]), which bound how often, not how
//! many at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tonic::Status;

/// A limit on one kind of call: at most `per_caller` at once for each person, `total` over all.
#[derive(Debug)]
pub struct Limit {
    /// What is limited, as refusals and metrics say it ("fresh", "plan", "sweep").
    pub what: &'static str,
    /// The flags that set the limits, for the refusal.
    pub flags: (&'static str, &'static str),
    pub per_caller: usize,
    pub total: usize,
    running: Arc<Mutex<Running>>,
}

#[derive(Debug, Default)]
struct Running {
    total: usize,
    by_caller: HashMap<String, usize>,
}

/// One call let through: released when dropped.
#[derive(Debug)]
pub struct Permit {
    caller: String,
    running: Arc<Mutex<Running>>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        r.total = r.total.saturating_sub(1);
        if let Some(n) = r.by_caller.get_mut(&self.caller) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                r.by_caller.remove(&self.caller);
            }
        }
    }
}

/// Which of a [`Limit`]'s bounds refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Caller,
    Total,
}

impl Over {
    pub fn label(self) -> &'static str {
        match self {
            Over::Caller => "caller",
            Over::Total => "total",
        }
    }
}

impl Limit {
    /// `per_caller` and `total` at once (0: no bound).
    pub fn new(
        what: &'static str,
        flags: (&'static str, &'static str),
        per_caller: usize,
        total: usize,
    ) -> Self {
        Limit { what, flags, per_caller, total, running: Arc::default() }
    }

    /// Lets one call by `caller` through, or says which bound it is over.
    pub fn enter(&self, caller: &str) -> Result<Permit, (Over, Status)> {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mine = r.by_caller.get(caller).copied().unwrap_or(0);
        if self.per_caller > 0 && mine >= self.per_caller {
            return Err((
                Over::Caller,
                Status::resource_exhausted(format!(
                    "{caller} already has {mine} {} call(s) running on this console, the most one person may \
                     ({}): wait for them to end, then ask again; nothing was done",
                    self.what, self.flags.0
                )),
            ));
        }
        if self.total > 0 && r.total >= self.total {
            return Err((
                Over::Total,
                Status::resource_exhausted(format!(
                    "{} {} call(s) are running on this console, the most it takes at once ({}): ask again in \
                     a few seconds; nothing was done",
                    r.total, self.what, self.flags.1
                )),
            ));
        }
        r.total += 1;
        *r.by_caller.entry(caller.to_owned()).or_default() += 1;
        Ok(Permit { caller: caller.to_owned(), running: Arc::clone(&self.running) })
    }
}

/// Every concurrency limit of the console.
#[derive(Debug)]
pub struct Limits {
    pub fresh: Limit,
    pub plans: Limit,
    pub sweeps: Limit,
}

/// The limits' settings: (per caller, total) for each kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Concurrency {
    pub fresh: (usize, usize),
    pub plans: (usize, usize),
    pub sweeps: (usize, usize),
}

impl Default for Concurrency {
    fn default() -> Self {
        Concurrency { fresh: (2, 16), plans: (8, 64), sweeps: (2, 8) }
    }
}

impl Limits {
    pub fn new(c: Concurrency) -> Self {
        Limits {
            fresh: Limit::new(
                "fresh fan-out (--fresh: every agent asked)",
                ("--fresh-at-once-per-caller", "--fresh-at-once"),
                c.fresh.0,
                c.fresh.1,
            ),
            plans: Limit::new(
                "plan",
                ("--plans-at-once-per-caller", "--plans-at-once"),
                c.plans.0,
                c.plans.1,
            ),
            sweeps: Limit::new(
                "sweep",
                ("--sweeps-at-once-per-caller", "--sweeps-at-once"),
                c.sweeps.0,
                c.sweeps.1,
            ),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits::new(Concurrency::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_over_its_share_or_the_console_over_its_total_is_refused_with_resource_exhausted() {
        let l = Limit::new("sweep", ("--sweeps-at-once-per-caller", "--sweeps-at-once"), 2, 3);
        let a1 = l.enter("alice").expect("first");
        let _a2 = l.enter("alice").expect("second");
        let (over, s) = l.enter("alice").expect_err("third of alice's");
        assert_eq!((over, s.code()), (Over::Caller, tonic::Code::ResourceExhausted));
        assert!(
            s.message().contains("--sweeps-at-once-per-caller") && s.message().contains("nothing was done"),
            "{s:?}"
        );
        let _b1 = l.enter("bob").expect("bob's first");
        let (over, s) = l.enter("carol").expect_err("the console is full");
        assert_eq!(over, Over::Total);
        assert!(s.message().contains("--sweeps-at-once"), "{s:?}");
        drop(a1);
        let _c1 = l.enter("carol").expect("one freed");
        let unbounded = Limit::new("plan", ("a", "b"), 0, 0);
        let held: Vec<Permit> = (0..100).map(|_| unbounded.enter("x").expect("no bound")).collect();
        assert_eq!(held.len(), 100);
    }
}
