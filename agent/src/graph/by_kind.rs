//! Holders counted by kind: how a device held thousands of times (a node's image disk) is shown
//! where its holders cannot all be (a protected device's events, an event over its size cap).

/// One entry per kind, in the order the kinds are first seen, each with the number of
/// processes its holders stand for (a holder counts at least one: a mount or a stacked device
/// names no process). `holders` gives each holder's kind and process count.
pub fn count_by_kind<K: PartialEq>(holders: impl IntoIterator<Item = (K, usize)>) -> Vec<(K, usize)> {
    let mut kinds: Vec<(K, usize)> = Vec::new();
    for (kind, processes) in holders {
        let count = processes.max(1);
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += count,
            None => kinds.push((kind, count)),
        }
    }
    kinds
}

#[cfg(test)]
mod tests {
    #[test]
    fn kinds_in_first_seen_order_each_holder_counting_at_least_one() {
        let held = [("mount", 0), ("cwd", 3), ("mount", 0), ("mmap", 1), ("cwd", 2)];
        assert_eq!(super::count_by_kind(held), vec![("mount", 2), ("cwd", 5), ("mmap", 1)]);
        assert_eq!(super::count_by_kind(Vec::<(u8, usize)>::new()), vec![]);
    }
}
