//! A scoped parallel map for scans that are dominated by procfs reads: the kernel renders
//! mountinfo and stat text on the reading CPU, so spreading reads over the cores shortens a scan.

/// Upper bound on worker threads for one scan phase.
const MAX_WORKERS: usize = 4;

/// Maps `f` over `items` on up to [`MAX_WORKERS`] threads, keeping the input order.
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_WORKERS);
    if workers <= 1 || items.len() < 16 {
        return items.iter().map(&f).collect();
    }
    // Interleave so that expensive neighbours (often a pod's processes) spread over workers.
    let f = &f;
    let mut slots: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                s.spawn(move || {
                    items
                        .iter()
                        .enumerate()
                        .skip(w)
                        .step_by(workers)
                        .map(|(i, t)| (i, f(t)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(part) => {
                    for (i, r) in part {
                        slots[i] = Some(r);
                    }
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
    });
    slots.into_iter().flatten().collect()
}

/// What a long read asks as it goes: whether to stop now. The daemon's timer scan stops for a
/// change that is waiting, so that its re-read is not queued behind the whole host's read;
/// every other read runs to its end ([`Stop::NEVER`]).
#[derive(Clone, Copy)]
pub struct Stop<'a>(Option<&'a (dyn Fn() -> bool + Sync)>);

impl<'a> Stop<'a> {
    /// A read that always runs to its end.
    pub const NEVER: Stop<'static> = Stop(None);

    /// A read that stops once `asked` says so.
    pub fn when(asked: &'a (dyn Fn() -> bool + Sync)) -> Self {
        Self(Some(asked))
    }

    /// Whether to stop now.
    pub fn now(&self) -> bool {
        self.0.is_some_and(|asked| asked())
    }
}

impl std::fmt::Debug for Stop<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Stop::when(..)" } else { "Stop::NEVER" })
    }
}

/// [`map`], asking `stop` before each item: `None` once it said stop (the items not yet
/// started are passed over, so a stop takes effect within one item per worker).
pub fn map_until<T: Sync, R: Send>(
    items: &[T],
    stop: Stop<'_>,
    f: impl Fn(&T) -> R + Sync,
) -> Option<Vec<R>> {
    let results = map(items, |t| (!stop.now()).then(|| f(t)));
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order() {
        let v: Vec<u32> = (0..1000).collect();
        assert_eq!(super::map(&v, |x| x * 2), v.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(super::map(&v[..3], |x| x + 1), vec![1, 2, 3]);
    }

    #[test]
    fn a_map_stops_once_asked_and_runs_to_its_end_otherwise() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let v: Vec<u32> = (0..1000).collect();
        let done = AtomicUsize::new(0);
        let asked = || done.load(Ordering::Relaxed) >= 100;
        let stopped = super::map_until(&v, super::Stop::when(&asked), |x| {
            done.fetch_add(1, Ordering::Relaxed);
            x * 2
        });
        assert_eq!(stopped, None);
        // Each worker starts at most one more item after the stop was asked for.
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(super::MAX_WORKERS);
        assert!(done.load(Ordering::Relaxed) <= 100 + workers, "{} items read", done.load(Ordering::Relaxed));
        let whole = super::map_until(&v, super::Stop::NEVER, |x| x * 2);
        assert_eq!(whole, Some(v.iter().map(|x| x * 2).collect::<Vec<_>>()));
    }
}
