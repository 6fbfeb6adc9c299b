//! Sizes for people (`8.0M`), shared by every renderer: the agent's CLI, agentctl and the
//! console.

/// Sizes as `64.0M`, `1.5G`.
pub fn size(bytes: u64) -> String {
    let units = ["B", "K", "M", "G", "T", "P"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else {
        format!("{v:.1}{}", units[u])
    }
}
