//! Pin risks as text for people (`scan`, `agentctl scan`, `agentctl fleet pin-risks`): one row
//! per mount namespace that holds private copies of live host mounts, what it copies and the
//! fix; the namespaces that could not be judged after them, each with why.

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::view::table::{clean, columns, cut, is_wide};

/// Who holds the copies: `pod shop/web-0 container app`, `pod uid ...`, `pid 42 (sleep)`.
pub fn holder(r: &pb::PinRisk) -> String {
    let pod = if !r.pod_name.is_empty() {
        Some(format!("pod {}/{}", r.pod_namespace, r.pod_name))
    } else if !r.pod_uid.is_empty() {
        Some(format!("pod uid {}", r.pod_uid))
    } else {
        None
    };
    let container = if !r.container_name.is_empty() {
        Some(r.container_name.clone())
    } else if !r.container_id.is_empty() {
        Some(r.container_id.chars().take(13).collect())
    } else {
        None
    };
    match (pod, container) {
        (Some(p), Some(c)) => format!("{p} container {c}"),
        (Some(p), None) => p,
        (None, _) => {
            let comm = if r.comm.is_empty() { String::new() } else { format!(" ({})", r.comm) };
            format!("pid {}{comm}", r.pids.first().copied().unwrap_or(0))
        }
    }
}

/// What it copies, in a few words: `host root at /host; rbd3 (pvc-c838) at /host/var/...`.
pub fn copies(r: &pb::PinRisk) -> String {
    let mut parts = Vec::new();
    if !r.host_root_copy.is_empty() {
        parts.push(format!("host root at {}", r.host_root_copy));
    }
    for c in &r.copies {
        let what = if c.device.is_empty() { format!("{} {}", c.fstype, c.dev) } else { c.device.clone() };
        let pv = if c.pv_name.is_empty() { String::new() } else { format!(" ({})", c.pv_name) };
        parts.push(format!("{what}{pv} at {}", c.mount_point));
    }
    parts.join("; ")
}

/// The section a scan's text ends with: a table of the pin risks and a line per namespace that
/// could not be judged; "" when there is nothing to say (or pin risks were not looked for).
pub fn pin_risks_section(risks: &[pb::PinRisk], unknown: &str) -> String {
    let mut out = String::new();
    if !unknown.is_empty() {
        let _ = writeln!(out, "\nPIN RISKS UNKNOWN: {}", clean(unknown));
    }
    let known: Vec<&pb::PinRisk> = risks.iter().filter(|r| r.unknown.is_empty()).collect();
    if !known.is_empty() {
        let _ = writeln!(
            out,
            "\nPIN RISKS: {} mount namespace(s) keep private copies of live host mounts (a device stays busy after the host unmounts it)",
            known.len()
        );
        let rows: Vec<Vec<String>> = known
            .iter()
            .map(|r| {
                vec![
                    r.mount_namespace.to_string(),
                    cut(&clean(&holder(r)), 50),
                    cut(&clean(&copies(r)), 60),
                    if is_wide() { clean(&r.fix) } else { cut(&clean(&r.fix), 60) },
                ]
            })
            .collect();
        out.push_str(&columns(&["MOUNT NS", "HELD BY", "COPIES", "FIX"], &rows));
    }
    for r in risks.iter().filter(|r| !r.unknown.is_empty()) {
        let _ = writeln!(
            out,
            "pin risk unknown for mount namespace {} ({}): {}",
            r.mount_namespace,
            clean(&holder(r)),
            clean(&r.unknown)
        );
    }
    out
}
