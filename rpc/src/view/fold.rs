//! The same sentence said once: a list where one line repeats (a device's reasons) shown with
//! each line once, where it first appears, and how many times it was said: `… (×37)`; and
//! ([`fold_alike`]) lines that differ only in their numbers (a release's dry run saying the same
//! thing of the mount in each of 37 mount namespaces) said once, with the count and the numbers
//! the others have.

/// `lines` with each distinct line once, in the order first seen, ` (×N)` after one said N > 1
/// times.
pub fn fold<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    let mut seen: Vec<(&str, usize)> = Vec::new();
    for l in lines {
        match seen.iter_mut().find(|(s, _)| *s == l.as_ref()) {
            Some((_, n)) => *n += 1,
            None => seen.push((l.as_ref(), 1)),
        }
    }
    seen.into_iter().map(|(s, n)| if n == 1 { s.to_owned() } else { format!("{s} (×{n})") }).collect()
}

/// How many differing numbers [`fold_alike`] names before it says how many more.
const NAMED_NUMBERS: usize = 8;

/// The runs of digits of `s`, and `s` with each of them as `#`.
fn numbers(s: &str) -> (Vec<&str>, String) {
    let mut runs = Vec::new();
    let mut shape = String::new();
    let mut start = None;
    for (i, c) in s.char_indices().chain(std::iter::once((s.len(), ' '))) {
        match (c.is_ascii_digit() && i < s.len(), start) {
            (true, None) => start = Some(i),
            (false, Some(b)) => {
                runs.push(&s[b..i]);
                shape.push('#');
                start = None;
            }
            _ => {}
        }
        if !c.is_ascii_digit() && i < s.len() {
            shape.push(c);
        }
    }
    (runs, shape)
}

/// [`fold`], and lines that differ only in their numbers said once (the first, where it first
/// appears) with how many there were and the numbers the others have in its place:
/// `mounted at /m in mount namespace 4026532198: ... (×3; also 4026532199, 4026532200)`.
pub fn fold_alike<S: AsRef<str>>(lines: &[S]) -> Vec<String> {
    let mut groups: Vec<(String, &str, Vec<&str>, usize)> = Vec::new();
    for l in lines {
        let l = l.as_ref();
        let (runs, shape) = numbers(l);
        let Some((_, first, others, n)) = groups.iter_mut().find(|(s, _, _, _)| *s == shape) else {
            groups.push((shape, l, Vec::new(), 1));
            continue;
        };
        *n += 1;
        let (firsts, _) = numbers(first);
        for (a, b) in runs.iter().zip(firsts) {
            if *a != b && !others.contains(a) {
                others.push(a);
            }
        }
    }
    groups
        .into_iter()
        .map(|(_, first, others, n)| match (n, others.len()) {
            (1, _) => first.to_owned(),
            (_, 0) => format!("{first} (×{n})"),
            (_, k) => {
                let named = others.iter().take(NAMED_NUMBERS).copied().collect::<Vec<_>>().join(", ");
                let more = if k > NAMED_NUMBERS {
                    format!(" and {} more", k - NAMED_NUMBERS)
                } else {
                    String::new()
                };
                format!("{first} (×{n}; also {named}{more})")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{fold, fold_alike};

    #[test]
    fn lines_alike_but_for_their_numbers_are_said_once_with_the_others_numbers() {
        let lines = [
            "mounted at /m in mount namespace 41: a peer (shared:3): left alone",
            "host mount",
            "mounted at /m in mount namespace 42: a peer (shared:3): left alone",
            "mounted at /m in mount namespace 43: a peer (shared:3): left alone",
            "host mount",
        ];
        assert_eq!(
            fold_alike(&lines),
            [
                "mounted at /m in mount namespace 41: a peer (shared:3): left alone (×3; also 42, 43)",
                "host mount (×2)"
            ]
        );
        let many: Vec<String> = (10..30).map(|i| format!("ns {i}")).collect();
        assert_eq!(fold_alike(&many), ["ns 10 (×20; also 11, 12, 13, 14, 15, 16, 17, 18 and 11 more)"]);
        assert_eq!(fold_alike(&["a 1", "a 1 b"]), ["a 1", "a 1 b"]);
    }

    #[test]
    fn a_repeated_line_is_said_once_with_its_count_where_it_first_appears() {
        let lines = ["a", "b", "a", "c", "a", "b"];
        assert_eq!(fold(&lines), ["a (×3)", "b (×2)", "c"]);
        assert_eq!(fold::<&str>(&[]), Vec::<String>::new());
        assert_eq!(fold(&["only"]), ["only"]);
    }
}
