//! Each person's share of the steps carried out through the console: at most `per_minute` steps in
//! any minute per person (the reviewed username, or a certificate's identity), beside the
//! fleet-wide budget ([`crate::apply::StepBudget`]) every person shares, so that one person (or
//! one mistaken script with their token) cannot spend the whole fleet's minute alone. Counted
//! when an Apply is let through, as the fleet's budget is. Bounded: the people remembered are
//! those who spent something in the last minute. Pure (time is passed in).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WINDOW: Duration = Duration::from_secs(60);

/// Steps spent per person in the last minute.
pub struct PersonBudget {
    per_minute: u32,
    spent: Mutex<HashMap<String, VecDeque<(Instant, u32)>>>,
}

impl PersonBudget {
    /// `per_minute` steps a minute per person (0: no per-person budget).
    pub fn new(per_minute: u32) -> Self {
        PersonBudget { per_minute, spent: Mutex::new(HashMap::new()) }
    }

    /// Takes `steps` from `person`'s budget at `now`, or says why not (nothing taken).
    pub fn take(&self, person: &str, steps: u32, now: Instant) -> Result<(), String> {
        if self.per_minute == 0 {
            return Ok(());
        }
        let mut all = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|_, w| {
            while w.front().is_some_and(|(t, _)| now.saturating_duration_since(*t) >= WINDOW) {
                w.pop_front();
            }
            !w.is_empty()
        });
        let window = all.entry(person.to_owned()).or_default();
        let used: u32 = window.iter().map(|(_, n)| *n).sum();
        let left = self.per_minute.saturating_sub(used);
        if steps <= left {
            window.push_back((now, steps));
            return Ok(());
        }
        let head = format!(
            "{person}'s step budget ({} steps a minute per person, --steps-per-minute-per-caller) has {left} left \
             and this Apply needs {steps}: ",
            self.per_minute
        );
        if steps > self.per_minute {
            return Err(format!(
                "{head}more than a person's whole budget, split it into smaller Applies; nothing ran"
            ));
        }
        let mut freed = left;
        let mut wait = WINDOW;
        for (t, n) in window.iter() {
            freed += n;
            if freed >= steps {
                wait = WINDOW.saturating_sub(now.saturating_duration_since(*t));
                break;
            }
        }
        Err(format!("{head}enough frees in {} s; nothing ran", wait.as_secs() + 1))
    }
}

impl PersonBudget {
    /// Gives back the `steps` `person` took last (the fleet's budget refused the Apply after).
    pub fn give_back(&self, person: &str, steps: u32) {
        let mut all = self.spent.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(w) = all.get_mut(person) {
            if w.back().is_some_and(|(_, n)| *n == steps) {
                w.pop_back();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_person_has_their_own_minute() {
        let b = PersonBudget::new(5);
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        assert_eq!(b.take("alice", 3, t0), Ok(()));
        assert_eq!(b.take("alice", 2, t0 + 10 * s), Ok(()));
        let e = b.take("alice", 1, t0 + 20 * s).expect_err("alice's minute is spent");
        assert!(e.starts_with("alice's step budget (5 steps a minute per person"), "{e}");
        assert!(e.ends_with("enough frees in 41 s; nothing ran"), "{e}");
        assert_eq!(b.take("bob", 5, t0 + 20 * s), Ok(()), "bob has his own");
        assert_eq!(b.take("alice", 3, t0 + 60 * s), Ok(()), "the first Apply left alice's window");
        let e = b.take("carol", 6, t0).expect_err("never fits");
        assert!(e.contains("more than a person's whole budget"), "{e}");
        assert_eq!(PersonBudget::new(0).take("x", 1000, t0), Ok(()), "0: no per-person budget");
        b.give_back("alice", 3);
        assert_eq!(b.take("alice", 3, t0 + 61 * s), Ok(()), "given back: 2 of 5 used");
    }
}
