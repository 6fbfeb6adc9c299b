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

#[cfg(test)]
mod tests {
    #[test]
    fn keeps_order() {
        let v: Vec<u32> = (0..1000).collect();
        assert_eq!(super::map(&v, |x| x * 2), v.iter().map(|x| x * 2).collect::<Vec<_>>());
        assert_eq!(super::map(&v[..3], |x| x + 1), vec![1, 2, 3]);
    }
}
