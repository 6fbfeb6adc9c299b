//! A small cache whose entries expire: the console keeps the API server's answers to its
//! TokenReviews and SubjectAccessReviews here for a few seconds, so that a burst of calls from
//! one person (a plugin command is several calls) costs one review, not one per call. Bounded:
//! at most `capacity` entries; when full, the expired ones go first, then the oldest. Pure (time
//! is passed in).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Entries with their expiry and insertion order.
#[derive(Debug)]
pub struct TtlCache<K, V> {
    capacity: usize,
    entries: HashMap<K, (Instant, u64, V)>,
    /// Insertion counter: the smallest live number is the oldest entry.
    next: u64,
}

impl<K: Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    /// A cache of at most `capacity` entries (0: nothing is kept).
    pub fn new(capacity: usize) -> Self {
        TtlCache { capacity, entries: HashMap::new(), next: 0 }
    }

    /// The value for `key` if it has not expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries.get(key).filter(|(until, _, _)| now < *until).map(|(_, _, v)| v.clone())
    }

    /// Keeps `value` for `key` until `now + ttl` (a zero `ttl` keeps nothing).
    pub fn put(&mut self, key: K, value: V, ttl: Duration, now: Instant) {
        if self.capacity == 0 || ttl.is_zero() {
            return;
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (until, _, _)| now < *until);
        }
        if self.entries.len() >= self.capacity && !self.entries.contains_key(&key) {
            let oldest = self.entries.iter().min_by_key(|(_, (_, n, _))| *n).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.entries.remove(&k);
            }
        }
        self.next += 1;
        self.entries.insert(key, (now + ttl, self.next, value));
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_and_the_cache_stays_bounded() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut c = TtlCache::new(2);
        c.put("alice", 1, 10 * s, t0);
        assert_eq!(c.get(&"alice", t0 + 9 * s), Some(1));
        assert_eq!(c.get(&"alice", t0 + 10 * s), None, "expired at its deadline");
        c.put("bob", 2, 30 * s, t0 + s);
        c.put("carol", 3, 30 * s, t0 + 11 * s);
        assert_eq!((c.len(), c.get(&"bob", t0 + 11 * s)), (2, Some(2)), "the expired alice made room");
        c.put("dave", 4, 30 * s, t0 + 12 * s);
        assert_eq!(c.len(), 2, "bounded");
        assert_eq!(c.get(&"bob", t0 + 12 * s), None, "the oldest went");
        assert_eq!((c.get(&"carol", t0 + 12 * s), c.get(&"dave", t0 + 12 * s)), (Some(3), Some(4)));
        c.put("carol", 5, 30 * s, t0 + 13 * s);
        assert_eq!((c.len(), c.get(&"carol", t0 + 13 * s)), (2, Some(5)), "replaced in place");
        let mut none = TtlCache::new(0);
        none.put("x", 1, s, t0);
        assert!(none.is_empty(), "capacity 0 keeps nothing");
        c.put("erin", 6, Duration::ZERO, t0);
        assert_eq!(c.get(&"erin", t0), None, "a zero TTL keeps nothing");
    }
}
