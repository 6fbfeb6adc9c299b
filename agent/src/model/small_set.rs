//! Membership tests for the small sets asked about thousands of times: the one or two devices a
//! re-read rebuilds, the namespace it read, the devices a one-shot `holders` asks about. A short
//! list is compared in place instead of hashed: SipHash per mount and per process reference was
//! about a tenth of a re-read's CPU on the 400-namespace node scene, and 3 % of a one-shot
//! `holders`.

use std::collections::HashSet;
use std::hash::Hash;

/// Up to this many members are compared as a list.
const FEW: usize = 8;

/// `set.contains`, the same answer, as a list when the set has a few members.
pub fn member_of<T: Eq + Hash + Copy>(set: &HashSet<T>) -> impl Fn(&T) -> bool + '_ {
    let few: Option<Vec<T>> = (set.len() <= FEW).then(|| set.iter().copied().collect());
    move |x| few.as_ref().map_or_else(|| set.contains(x), |v| v.contains(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_contains_below_and_above_the_list_size() {
        for n in [0u32, 1, 7, 8, 9, 40] {
            let set: HashSet<u32> = (0..n).map(|i| i * 3).collect();
            let member = member_of(&set);
            for x in 0..130 {
                assert_eq!(member(&x), set.contains(&x), "{n} members, {x}");
            }
        }
    }
}
