//! The JSON Schema of blockjanitor's documents (docs/schema/blockjanitor-v1.schema.json), for
//! tests: every document either CLI prints is checked against it, and two answers to one question
//! are compared once the fields that legitimately differ between two scans are taken out.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The schema file.
pub fn schema_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema/blockjanitor-v1.schema.json")
}

/// The compiled schema.
pub struct Schema {
    schemas: boon::Schemas,
    root: boon::SchemaIndex,
}

impl Schema {
    /// Loads and compiles the schema file (draft 2020-12); panics when it is not a valid schema.
    pub fn load() -> Self {
        let path = schema_path();
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let schema: Value = serde_json::from_str(&text).expect("the schema file is JSON");
        let mut schemas = boon::Schemas::new();
        let mut compiler = boon::Compiler::new();
        let url = "file:///blockjanitor-v1.schema.json";
        compiler.add_resource(url, schema).expect("add the schema");
        let root = compiler
            .compile(url, &mut schemas)
            .unwrap_or_else(|e| panic!("the schema does not compile: {e}"));
        Self { schemas, root }
    }

    /// Checks `doc` against the schema and that it is the document `document`; panics naming
    /// every error and `what` (the command that printed it).
    pub fn check(&self, doc: &Value, document: &str, what: &str) {
        assert_eq!(doc["schema_version"], 1, "{what}: schema_version\n{doc:#}");
        assert_eq!(doc["document"], document, "{what}: the document type\n{doc:#}");
        if let Err(e) = self.schemas.validate(doc, self.root) {
            // The root is a oneOf: the error of the branch for this document type is the one
            // that says which field is wrong.
            panic!("{what}: the document does not match the schema:\n{e:#}\n{doc:#}");
        }
    }
}

/// Fields that legitimately differ between two scans of an unchanged scene: when a scan ran and
/// which it was (`scan`, `scan_unix_seconds`, `last_seen_unix_seconds`, `last_seen_scan`, and
/// the node's `scans`, `last_scan_unix_seconds`, `last_full_scan`, `last_full_scan_unix_seconds`),
/// what it read and how long it took (`stats`, `last_scan_duration_ms`: a float YAML may print
/// to fewer digits), and the host-wide warnings (a process of the host, not of the scene, that
/// exits while a scan reads it is a warning of that scan only).
pub const SCAN_DEPENDENT: &[&str] = &[
    "scan",
    "scan_unix_seconds",
    "last_seen_unix_seconds",
    "last_seen_scan",
    "scans",
    "last_scan_unix_seconds",
    "last_scan_duration_ms",
    "last_full_scan",
    "last_full_scan_unix_seconds",
    "stats",
    "warnings",
];

/// The reason a scan gives when it is the first to see a candidate unheld: which scan that is
/// depends on when each binary's grace clock started (the daemon's at its first scan, the
/// one-shot agent's at its first run).
const GRACE_CLOCK_STARTED: &str = "grace clock started now";

/// `reason` with every duration (`0s`, `3m05s`, `1h00m`) as `N`: how long a candidate has been
/// unheld grows between two scans.
fn timeless(reason: &str) -> String {
    let duration = |w: &str| {
        let w = w.trim_end_matches([':', ',', ';', ')']);
        w.chars().next().is_some_and(|c| c.is_ascii_digit())
            && w.ends_with(['s', 'm', 'h'])
            && w.chars().all(|c| c.is_ascii_digit() || matches!(c, 'h' | 'm' | 's' | '.'))
    };
    reason.split(' ').map(|w| if duration(w) { "N" } else { w }).collect::<Vec<_>>().join(" ")
}

/// A string as [`timeless`] says; anything else as it is.
fn timeless_value(v: &mut Value) {
    if let Some(t) = v.as_str() {
        *v = Value::from(timeless(t));
    }
}

/// `v` without the [`SCAN_DEPENDENT`] fields, at any depth; without the kernel's workqueue
/// workers among `kernel_threads` (`kworker/u8:3-loop0`: named after the device they last served,
/// they come and go between two scans; `jbd2/loop0-8` stays); and with `reasons`,
/// `refusal` and `left_alone` as [`timeless`] says, without the [`GRACE_CLOCK_STARTED`] reason.
pub fn without_scan_dependent(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                for k in SCAN_DEPENDENT {
                    m.remove(*k);
                }
                if let Some(Value::Array(threads)) = m.get_mut("kernel_threads") {
                    threads.retain(|t| !t.as_str().is_some_and(|t| t.starts_with("kworker/")));
                }
                if let Some(Value::Array(reasons)) = m.get_mut("reasons") {
                    reasons.retain(|r| !r.as_str().is_some_and(|r| r.starts_with(GRACE_CLOCK_STARTED)));
                }
                for key in ["reasons", "refusal", "left_alone"] {
                    match m.get_mut(key) {
                        Some(Value::Array(a)) => a.iter_mut().for_each(timeless_value),
                        Some(v) => timeless_value(v),
                        None => {}
                    }
                }
                m.values_mut().for_each(strip);
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    v
}
