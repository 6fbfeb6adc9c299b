//! Parsers for the device-mapper multipath target's table and status lines (dm-mpath.c's
//! `multipath_status`, read by multipath-tools' `libmultipath/dmparser.c`).
//!
//! The table (`dmsetup table`, `DM_TABLE_STATUS` with `DM_STATUS_TABLE_FLAG`) is the map's
//! configuration; the status (`dmsetup status`, `DM_TABLE_STATUS`) is the kernel's live view of
//! every path. Both are plain text; these functions take it as `&str` and never open a file.
//!
//! ```text
//! table:  <#features> <feature>* <#hwhandler words> <hwhandler name> <hwhandler arg>*
//!         <#groups> <initial group>
//!         { <selector> <#selector args> <arg>* <#paths> <#path args> { <MAJ:MIN> <arg>* }* }*
//!         0 1 queue_if_no_path 0 1 1 round-robin 0 2 1 8:0 1 8:16 1
//! status: 2 <queue_io> <pg_init_count> <#hwhandler words> <word>* <#groups> <next group>
//!         { <A|E|D> <#selector words> <word>* <#paths> <#path words>
//!           { <MAJ:MIN> <A|F> <fail count> <word>* }* }*
//!         2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 1
//! ```
//! Either line may carry dmsetup's `<start> <length> multipath` prefix; it is skipped.
//!
//! `queue_if_no_path` shows only in the table: the status line's first feature is the kernel's
//! "I/O is being queued right now" flag (`MPATHF_QUEUE_IO`; the count of queued I/Os on old
//! kernels), not the configuration. A map whose table queues and whose status has no active
//! path makes every read, flush and even `stat` of a mount hang (gotchas 11-12).

use std::str::FromStr;

use serde::Serialize;

use crate::model::DevNum;

/// Why a table or status line was rejected. `word` is the 1-based word number in the line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("line ends at word {word}: expected {expected}")]
    Truncated { word: usize, expected: &'static str },
    #[error("word {word} '{found}': expected {expected}")]
    Invalid { word: usize, found: String, expected: &'static str },
    #[error("word {word} '{found}': left over after the last path group")]
    Trailing { word: usize, found: String },
    #[error("word {word}: {what} {count} is more than the {left} words left")]
    TooMany { word: usize, what: &'static str, count: String, left: usize },
    #[error("table and status disagree: {0}")]
    Mismatch(String),
}

/// The table's feature words.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Features {
    /// `queue_if_no_path`: with no usable path, I/O waits forever instead of failing.
    pub queue_if_no_path: bool,
    /// `pg_init_retries N`.
    pub pg_init_retries: Option<u32>,
    /// `pg_init_delay_msecs N`.
    pub pg_init_delay_msecs: Option<u32>,
    /// `retain_attached_hw_handler` (kernels before 4.3 only).
    pub retain_attached_hw_handler: bool,
    /// `queue_mode bio|rq|mq`; `None` for the default (request based).
    pub queue_mode: Option<String>,
    /// Feature words this parser does not know, in order.
    pub other: Vec<String>,
}

/// A hardware handler (`1 alua`, `1 emc`, `2 rdac ARG`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HwHandler {
    pub name: String,
    pub args: Vec<String>,
}

/// One path as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TablePath {
    pub dev: DevNum,
    /// The path selector's per-path arguments (round-robin: repeat count).
    pub args: Vec<String>,
}

/// One priority group as the table lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TableGroup {
    /// Path selector: `round-robin`, `service-time`, `queue-length`, `historical-service-time`.
    pub selector: String,
    pub selector_args: Vec<String>,
    pub paths: Vec<TablePath>,
}

/// A multipath target's table line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MultipathTable {
    pub features: Features,
    pub hw_handler: Option<HwHandler>,
    /// 1-based number of the group tried first; 0 when there are no groups.
    pub initial_group: u32,
    pub groups: Vec<TableGroup>,
}

/// A priority group's state in the status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// `A`: the group I/O goes to now.
    Active,
    /// `E`: usable, not in use.
    Enabled,
    /// `D`: bypassed (all its paths failed, or disabled by a message).
    Disabled,
}

/// A path's state in the status line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PathState {
    /// `A`: the kernel may send I/O down this path.
    Active,
    /// `F`: failed; I/O will not use it until it is reinstated.
    Failed,
}

/// One path as the status line shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusPath {
    pub dev: DevNum,
    pub state: PathState,
    /// How many times this path has failed since the map was loaded.
    pub fail_count: u32,
    /// The path selector's per-path status words (service-time: in-flight size, throughput).
    pub selector_status: Vec<String>,
}

/// One priority group as the status line shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusGroup {
    pub state: GroupState,
    pub selector_status: Vec<String>,
    pub paths: Vec<StatusPath>,
}

/// A multipath target's status line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MultipathStatus {
    /// First status feature: the kernel's `MPATHF_QUEUE_IO` flag, 1 while the target holds I/O
    /// back to (re)select a path or initialise a group; on older kernels the number of queued
    /// I/Os. Not a sign of `queue_if_no_path`: measured with that feature and every path failed,
    /// it read 0.
    pub queue_io: Option<u32>,
    /// Second status feature: how many times a hardware handler initialised a group.
    pub pg_init_count: Option<u32>,
    /// The hardware handler's status words (current kernels print none).
    pub hw_handler_status: Vec<String>,
    /// 1-based number of the group the next I/O goes to; 0 when there are no groups.
    pub next_group: u32,
    pub groups: Vec<StatusGroup>,
}

impl MultipathStatus {
    /// Every path of every group, in table order.
    pub fn paths(&self) -> impl Iterator<Item = &StatusPath> {
        self.groups.iter().flat_map(|g| g.paths.iter())
    }

    /// Paths the kernel may still send I/O to.
    pub fn active_paths(&self) -> usize {
        self.paths().filter(|p| p.state == PathState::Active).count()
    }
}

/// A map's table and status together, checked to describe the same paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Multipath {
    pub table: MultipathTable,
    pub status: MultipathStatus,
}

impl Multipath {
    /// Joins a table and a status; they must list the same groups and paths in the same order
    /// (both come from one target, so anything else means they were read from different maps or
    /// the map was reloaded in between).
    pub fn new(table: MultipathTable, status: MultipathStatus) -> Result<Self, ParseError> {
        if table.groups.len() != status.groups.len() {
            return Err(ParseError::Mismatch(format!(
                "table has {} path groups, status has {}",
                table.groups.len(),
                status.groups.len()
            )));
        }
        for (i, (t, s)) in table.groups.iter().zip(&status.groups).enumerate() {
            let tdevs: Vec<DevNum> = t.paths.iter().map(|p| p.dev).collect();
            let sdevs: Vec<DevNum> = s.paths.iter().map(|p| p.dev).collect();
            if tdevs != sdevs {
                return Err(ParseError::Mismatch(format!(
                    "group {}: table paths {} but status paths {}",
                    i + 1,
                    join(&tdevs),
                    join(&sdevs)
                )));
            }
        }
        Ok(Self { table, status })
    }

    /// Parses both lines and joins them.
    pub fn parse(table: &str, status: &str) -> Result<Self, ParseError> {
        Self::new(parse_table(table)?, parse_status(status)?)
    }

    /// True when I/O to the map cannot complete and will not fail either: the table queues with
    /// no path, and no path is active. Nothing may read this device (gotcha 12).
    pub fn io_would_hang(&self) -> bool {
        self.table.features.queue_if_no_path && self.status.active_paths() == 0
    }
}

fn join(devs: &[DevNum]) -> String {
    let v: Vec<String> = devs.iter().map(DevNum::to_string).collect();
    if v.is_empty() {
        "none".to_owned()
    } else {
        v.join(" ")
    }
}

/// Parses a multipath table line (with or without the `<start> <length> multipath` prefix).
pub fn parse_table(line: &str) -> Result<MultipathTable, ParseError> {
    let mut w = Words::new(line);
    let feature_words = w.counted("feature count", "feature word")?;
    let features = features(&feature_words, &w)?;
    let handler_words = w.counted("hardware handler word count", "hardware handler word")?;
    let hw_handler = handler_words.split_first().map(|(name, args)| HwHandler {
        name: name.to_string(),
        args: args.iter().map(|a| a.to_string()).collect(),
    });
    let group_count = w.count("path group count")?;
    let initial_group = w.number("initial path group")?;
    check_group_number(initial_group, group_count, &w)?;
    let mut groups = Vec::new();
    for _ in 0..group_count {
        let selector = w.next("path selector name")?.to_owned();
        let selector_args = owned(w.counted("path selector argument count", "path selector argument")?);
        let path_count = w.count("path count")?;
        let arg_count = w.count("per-path argument count")?;
        let mut paths = Vec::new();
        for _ in 0..path_count {
            let dev = w.devnum()?;
            let args = owned(w.take(arg_count, "per-path argument")?);
            paths.push(TablePath { dev, args });
        }
        groups.push(TableGroup { selector, selector_args, paths });
    }
    w.finish()?;
    Ok(MultipathTable { features, hw_handler, initial_group, groups })
}

/// Parses a multipath status line (with or without the `<start> <length> multipath` prefix).
pub fn parse_status(line: &str) -> Result<MultipathStatus, ParseError> {
    let mut w = Words::new(line);
    let feature_words = w.counted("status feature count", "status feature word")?;
    let status_number = |i: usize| -> Result<Option<u32>, ParseError> {
        feature_words.get(i).map(|s| number_at(s, w.pos - feature_words.len() + i, "a number")).transpose()
    };
    let queue_io = status_number(0)?;
    let pg_init_count = status_number(1)?;
    let hw_handler_status = owned(w.counted("hardware handler status count", "hardware handler status")?);
    let group_count = w.count("path group count")?;
    let next_group = w.number("next path group")?;
    check_group_number(next_group, group_count, &w)?;
    let mut groups = Vec::new();
    for _ in 0..group_count {
        let state = match w.next("path group state")? {
            "A" => GroupState::Active,
            "E" => GroupState::Enabled,
            "D" => GroupState::Disabled,
            other => return Err(w.invalid(other, "path group state A, E or D")),
        };
        let selector_status = owned(w.counted("path selector status count", "path selector status")?);
        let path_count = w.count("path count")?;
        let arg_count = w.count("per-path status word count")?;
        let mut paths = Vec::new();
        for _ in 0..path_count {
            let dev = w.devnum()?;
            let state = match w.next("path state")? {
                "A" => PathState::Active,
                "F" => PathState::Failed,
                other => return Err(w.invalid(other, "path state A or F")),
            };
            let fail_count = w.number("path fail count")?;
            let selector_status = owned(w.take(arg_count, "per-path status word")?);
            paths.push(StatusPath { dev, state, fail_count, selector_status });
        }
        groups.push(StatusGroup { state, selector_status, paths });
    }
    w.finish()?;
    Ok(MultipathStatus { queue_io, pg_init_count, hw_handler_status, next_group, groups })
}

/// Interprets the table's feature words (already counted off).
fn features(words: &[&str], w: &Words<'_>) -> Result<Features, ParseError> {
    let first = w.pos - words.len();
    let mut f = Features::default();
    let mut i = 0;
    while i < words.len() {
        let value = |what: &'static str| -> Result<&str, ParseError> {
            words.get(i + 1).copied().ok_or(ParseError::Truncated { word: first + i + 2, expected: what })
        };
        match words[i] {
            "queue_if_no_path" => f.queue_if_no_path = true,
            "retain_attached_hw_handler" => f.retain_attached_hw_handler = true,
            "pg_init_retries" => {
                f.pg_init_retries =
                    Some(number_at(value("pg_init_retries value")?, first + i + 1, "a number")?);
                i += 1;
            }
            "pg_init_delay_msecs" => {
                f.pg_init_delay_msecs =
                    Some(number_at(value("pg_init_delay_msecs value")?, first + i + 1, "a number")?);
                i += 1;
            }
            "queue_mode" => {
                f.queue_mode = Some(value("queue_mode value")?.to_owned());
                i += 1;
            }
            other => f.other.push(other.to_owned()),
        }
        i += 1;
    }
    Ok(f)
}

fn check_group_number(n: u32, groups: usize, w: &Words<'_>) -> Result<(), ParseError> {
    let ok = if groups == 0 { n == 0 } else { n >= 1 && n as usize <= groups };
    if ok {
        Ok(())
    } else {
        Err(ParseError::Invalid {
            word: w.pos,
            found: n.to_string(),
            expected: "a path group number within the group count",
        })
    }
}

fn owned(words: Vec<&str>) -> Vec<String> {
    words.into_iter().map(str::to_owned).collect()
}

/// Parses `s` (word `pos`, 0-based) as a number.
fn number_at<T: FromStr>(s: &str, pos: usize, expected: &'static str) -> Result<T, ParseError> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ParseError::Invalid { word: pos + 1, found: clip(s), expected });
    }
    s.parse().map_err(|_| ParseError::Invalid { word: pos + 1, found: clip(s), expected })
}

fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A cursor over the words of one line. Counts read from the line are checked against the words
/// left, so garbage can neither loop long nor allocate much.
struct Words<'a> {
    words: Vec<&'a str>,
    /// Index of the next word.
    pos: usize,
}

impl<'a> Words<'a> {
    /// Splits the line and skips dmsetup's `<start> <length> multipath` prefix when present.
    fn new(line: &'a str) -> Self {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let prefixed = words.len() >= 3 && numeric(words[0]) && numeric(words[1]) && words[2] == "multipath";
        Self { words, pos: if prefixed { 3 } else { 0 } }
    }

    fn left(&self) -> usize {
        self.words.len() - self.pos
    }

    fn next(&mut self, expected: &'static str) -> Result<&'a str, ParseError> {
        let w = self
            .words
            .get(self.pos)
            .copied()
            .ok_or(ParseError::Truncated { word: self.pos + 1, expected })?;
        self.pos += 1;
        Ok(w)
    }

    fn number<T: FromStr>(&mut self, expected: &'static str) -> Result<T, ParseError> {
        let s = self.next(expected)?;
        number_at(s, self.pos - 1, expected)
    }

    /// A count of items that each take at least one word: more than the words left is an error.
    fn count(&mut self, expected: &'static str) -> Result<usize, ParseError> {
        let s = self.next(expected)?;
        let too_many =
            |w: &Self| ParseError::TooMany { word: w.pos, what: expected, count: clip(s), left: w.left() };
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(self.invalid(s, expected));
        }
        match s.parse::<usize>() {
            Ok(n) if n <= self.left() => Ok(n),
            _ => Err(too_many(self)),
        }
    }

    /// A count followed by that many words.
    fn counted(&mut self, count: &'static str, item: &'static str) -> Result<Vec<&'a str>, ParseError> {
        let n = self.count(count)?;
        self.take(n, item)
    }

    fn take(&mut self, n: usize, expected: &'static str) -> Result<Vec<&'a str>, ParseError> {
        if n > self.left() {
            return Err(ParseError::Truncated { word: self.words.len() + 1, expected });
        }
        let out = self.words[self.pos..self.pos + n].to_vec();
        self.pos += n;
        Ok(out)
    }

    fn devnum(&mut self) -> Result<DevNum, ParseError> {
        let s = self.next("path device MAJ:MIN")?;
        s.parse().map_err(|_| self.invalid(s, "path device MAJ:MIN"))
    }

    /// An error for the word just read.
    fn invalid(&self, found: &str, expected: &'static str) -> ParseError {
        ParseError::Invalid { word: self.pos, found: clip(found), expected }
    }

    fn finish(&self) -> Result<(), ParseError> {
        match self.words.get(self.pos) {
            None => Ok(()),
            Some(w) => Err(ParseError::Trailing { word: self.pos + 1, found: clip(w) }),
        }
    }
}

#[cfg(test)]
#[path = "multipath_tests.rs"]
mod tests;
