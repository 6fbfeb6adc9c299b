//! The order and indentation of `scan`'s rows: one row per device as listed, or (`--tree`) each
//! stack drawn as `lsblk` draws it: a device, then what it holds (its holders as leaf lines:
//! mounts, open files, swap) and what is stacked on it (partitions, dm maps, loop devices on its
//! files), each under it with `├─`/`└─`. A device stacked on two others is drawn under both, as
//! lsblk does.

use blockjanitor_proto::v1 as pb;

use crate::view::names::holder_kind_name;
use crate::view::table::clean;

/// One line of the table.
#[derive(Debug, Clone, PartialEq)]
pub enum Row<'a> {
    /// A device's row; `prefix` goes before its name (`└─`).
    Device { prefix: String, device: &'a pb::Device },
    /// A holder of the device above, a line of its own.
    Leaf { prefix: String, text: String },
}

/// Deepest a stack is drawn (a cycle in what sysfs said stops here).
const MAX_DEPTH: usize = 16;

/// The rows for `devices` (kept in their order): flat, or as a tree with at most `leaves`
/// holder lines under a device (`None`: every one; the rest are counted on a line of their own).
pub fn rows<'a>(devices: &[&'a pb::Device], tree: bool, leaves: Option<usize>) -> Vec<Row<'a>> {
    if !tree {
        return devices.iter().map(|d| Row::Device { prefix: String::new(), device: d }).collect();
    }
    let mut walk = Walk { devices, leaves, path: Vec::new(), drawn: Default::default(), out: Vec::new() };
    for d in devices.iter().filter(|d| below(d, devices).next().is_none()) {
        walk.draw(d, "", "");
    }
    // What only a cycle reaches: drawn from itself.
    for d in devices {
        if !walk.drawn.contains(d.name.as_str()) {
            walk.draw(d, "", "");
        }
    }
    walk.out
}

/// The listed devices `d` is stacked on (its disk, for a partition).
fn below<'a, 'b>(
    d: &'b pb::Device,
    devices: &'b [&'a pb::Device],
) -> impl Iterator<Item = &'a pb::Device> + 'b {
    devices
        .iter()
        .copied()
        .filter(move |x| x.name != d.name && (d.parent == x.name || d.stacked_below.contains(&x.name)))
}

/// The listed devices stacked on `d` (its partitions, the maps and loop devices on it).
fn above<'a>(d: &pb::Device, devices: &[&'a pb::Device]) -> Vec<&'a pb::Device> {
    devices
        .iter()
        .copied()
        .filter(|x| {
            x.name != d.name
                && (x.parent == d.name
                    || x.stacked_below.contains(&d.name)
                    || d.stacked_on_top.contains(&x.name))
        })
        .collect()
}

/// `d`'s holders as leaf lines, the same line once with a count, at most `max` (then how many
/// more); a stacked device drawn under it anyway is not said again.
fn leaves(d: &pb::Device, children: &[&pb::Device], max: Option<usize>) -> Vec<String> {
    let lines: Vec<String> = d
        .holders
        .iter()
        .filter(|h| {
            !(h.kind == pb::HolderKind::StackedDevice as i32 && children.iter().any(|c| c.name == h.device))
        })
        .map(|h| {
            let what = if h.description.is_empty() { clean(&h.device) } else { clean(&h.description) };
            format!("{}: {what}", holder_kind_name(h.kind))
        })
        .collect();
    let mut lines = crate::view::fold::fold(&lines);
    if let Some(max) = max.filter(|m| lines.len() > *m) {
        let more = lines.len() - max;
        lines.truncate(max);
        lines.push(format!(
            "… {more} more holder lines (-o wide shows every one; holders {} each holder)",
            d.name
        ));
    }
    lines
}

/// A tree being drawn: the devices, the rows so far, the stack walked down to get here.
struct Walk<'a, 'd> {
    devices: &'d [&'a pb::Device],
    leaves: Option<usize>,
    path: Vec<&'a str>,
    drawn: std::collections::HashSet<&'a str>,
    out: Vec<Row<'a>>,
}

impl<'a> Walk<'a, '_> {
    /// Draws `d` (after `prefix`), then its leaves and the devices stacked on it, under `indent`.
    fn draw(&mut self, d: &'a pb::Device, prefix: &str, indent: &str) {
        self.out.push(Row::Device { prefix: prefix.to_owned(), device: d });
        self.drawn.insert(d.name.as_str());
        if self.path.len() >= MAX_DEPTH || self.path.contains(&d.name.as_str()) {
            return;
        }
        self.path.push(&d.name);
        let children = above(d, self.devices);
        let leaves = leaves(d, &children, self.leaves);
        let total = leaves.len() + children.len();
        for (i, text) in leaves.into_iter().enumerate() {
            let branch = if i + 1 == total { "└─" } else { "├─" };
            self.out.push(Row::Leaf { prefix: format!("{indent}{branch}"), text });
        }
        let first_child = total - children.len();
        for (i, c) in children.into_iter().enumerate() {
            let (branch, rest) =
                if first_child + i + 1 == total { ("└─", "  ") } else { ("├─", "│ ") };
            self.draw(c, &format!("{indent}{branch}"), &format!("{indent}{rest}"));
        }
        self.path.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(name: &str, parent: &str, below: &[&str]) -> pb::Device {
        pb::Device {
            name: name.into(),
            parent: parent.into(),
            stacked_below: below.iter().map(|s| (*s).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn drawn(rows: &[Row<'_>]) -> Vec<String> {
        rows.iter()
            .map(|r| match r {
                Row::Device { prefix, device } => format!("{prefix}{}", device.name),
                Row::Leaf { prefix, text } => format!("{prefix}{text}"),
            })
            .collect()
    }

    #[test]
    fn a_stack_is_drawn_as_lsblk_draws_it() {
        let mut dm = dev("dm-0", "", &["loop1p1"]);
        dm.holders.push(pb::Holder {
            kind: pb::HolderKind::Mount as i32,
            description: "mounted at /mnt".into(),
            ..Default::default()
        });
        let all = [dev("loop1", "", &[]), dev("loop1p1", "loop1", &[]), dev("loop1p2", "loop1", &[]), dm];
        let refs: Vec<&pb::Device> = all.iter().collect();
        assert_eq!(
            drawn(&rows(&refs, true, None)),
            ["loop1", "├─loop1p1", "│ └─dm-0", "│   └─mount: mounted at /mnt", "└─loop1p2"]
        );
        assert_eq!(drawn(&rows(&refs, false, None)), ["loop1", "loop1p1", "loop1p2", "dm-0"]);
    }

    #[test]
    fn a_cycle_ends() {
        let all = [dev("a", "", &["b"]), dev("b", "", &["a"])];
        let refs: Vec<&pb::Device> = all.iter().collect();
        let r = drawn(&rows(&refs, true, None));
        assert!(r.len() < 40 && r.contains(&"a".to_owned()), "{r:?}");
    }

    #[test]
    fn leaves_beyond_the_limit_are_counted_and_the_same_line_is_said_once() {
        let mut d = dev("loop1", "", &[]);
        for i in [1, 1, 2, 3, 4] {
            d.holders.push(pb::Holder {
                kind: pb::HolderKind::Mount as i32,
                description: format!("mounted at /m{i}"),
                ..Default::default()
            });
        }
        let refs = [&d];
        assert_eq!(
            drawn(&rows(&refs, true, Some(2))),
            [
                "loop1",
                "├─mount: mounted at /m1 (×2)",
                "├─mount: mounted at /m2",
                "└─… 2 more holder lines (-o wide shows every one; holders loop1 each holder)"
            ]
        );
        assert_eq!(drawn(&rows(&refs, true, None)).len(), 5);
    }
}
