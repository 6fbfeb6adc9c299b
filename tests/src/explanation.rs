//! Reading an `explanation` document (`agentctl fleet explain -o json`, `kubectl blockjanitor
//! explain -o json`): its diagnosis's cause, the commands it gives, and whether any of them
//! fences (the tests of explain's real scenes ask the same three questions).

use serde_json::Value;

/// The diagnosis's cause (`held_elsewhere`, `dead_node`...), "" when there is none.
pub fn cause(v: &Value) -> &str {
    v["diagnosis"]["cause"].as_str().unwrap_or("")
}

/// The commands of the diagnosis's next steps, in order.
pub fn commands(v: &Value) -> Vec<String> {
    v["diagnosis"]["next"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a["command"].as_str())
        .map(String::from)
        .collect()
}

/// Whether a next step fences: a Ceph blocklist entry, the out-of-service taint, or a
/// CSI-Addons NetworkFence manifest.
pub fn fences(v: &Value) -> bool {
    v["diagnosis"]["next"].as_array().into_iter().flatten().any(|a| {
        let c = a["command"].as_str().unwrap_or("");
        c.contains("blocklist add")
            || c.contains("taint nodes")
            || a["manifest"].as_str().unwrap_or("").contains("kind: NetworkFence")
    })
}
