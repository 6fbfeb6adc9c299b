//! A document as text: pretty JSON, one JSON line (a stream's), YAML, or one YAML document of a
//! stream (`---` first).

use serde_json::Value;

/// A serialising error (never expected: values are built from plain data).
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("cannot write JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] serde_yaml_ng::Error),
}

/// Pretty JSON, ending in a newline.
pub fn json(v: &Value) -> Result<String, FormatError> {
    Ok(serde_json::to_string_pretty(v)? + "\n")
}

/// One line of JSON (a stream's), ending in a newline.
pub fn json_line(v: &Value) -> Result<String, FormatError> {
    Ok(serde_json::to_string(v)? + "\n")
}

/// YAML.
pub fn yaml(v: &Value) -> Result<String, FormatError> {
    Ok(serde_yaml_ng::to_string(v)?)
}

/// One YAML document of a stream: `---` then the document.
pub fn yaml_doc(v: &Value) -> Result<String, FormatError> {
    Ok(format!("---\n{}", yaml(v)?))
}

/// The documents of a command that answers for several things (`holders DEV...`): one document
/// as [`json`] or [`yaml`] prints it; several as a stream, one JSON line ([`json_line`]) or one
/// YAML document ([`yaml_doc`]) each, every one valid against the schema on its own.
pub fn documents(yaml_out: bool, docs: &[Value]) -> Result<String, FormatError> {
    match (docs, yaml_out) {
        ([one], false) => json(one),
        ([one], true) => yaml(one),
        (many, false) => many.iter().map(json_line).collect(),
        (many, true) => many.iter().map(yaml_doc).collect(),
    }
}
