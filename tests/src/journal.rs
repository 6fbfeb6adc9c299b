//! Reading the agent's journal (JSON lines) in tests: the records of a journal file or of a
//! guest's journal section, the intents of one action, and how many of them are done.

use std::path::Path;

use serde_json::Value;

/// Parses every line of `lines` as one journal record; a line that is not JSON fails the test,
/// naming `what` (the file or the section) and the line.
pub fn parse<'a>(lines: impl Iterator<Item = &'a str>, what: &str) -> Vec<Value> {
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: journal line {l:?}: {e}")))
        .collect()
}

/// The records of the journal at `path` (none when it does not exist).
pub fn read(path: &Path) -> Vec<Value> {
    match std::fs::read_to_string(path) {
        Ok(t) => parse(t.lines(), &path.display().to_string()),
        Err(_) => Vec::new(),
    }
}

/// The journal at `path` as text, for failure messages.
pub fn text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|_| "(no journal)".into())
}

/// The intents of `action` among `records`.
pub fn intents<'a>(records: &'a [Value], action: &str) -> Vec<&'a Value> {
    records.iter().filter(|r| r["phase"] == "intent" && r["step"]["action"] == action).collect()
}

/// How many intents of `action` have a result `done`.
pub fn done(records: &[Value], action: &str) -> usize {
    intents(records, action)
        .iter()
        .filter(|i| {
            records.iter().any(|r| r["phase"] == "result" && r["id"] == i["id"] && r["result"] == "done")
        })
        .count()
}
