//! The node, one device with its holders, and events as text for people (a scan's devices:
//! [`crate::view::scan`]). Tables escape control characters in anything the agent sends
//! (command lines, paths).

use std::fmt::Write as _;

use crate::units::size;
use blockjanitor_proto::v1 as pb;

use crate::view::names::{event_type_name, holder_kind_name, kind_name, verdict_name};
use crate::view::table::clean;
use crate::view::time::{ago, utc_time};

/// `node` as `key: value` lines; `now` is for the age of the last scan. The warnings and the
/// blind spots follow their counts, one line each.
pub fn node_table(n: &pb::Node, now: f64) -> String {
    let last = if n.last_scan_unix_seconds > 0.0 {
        format!(
            "{} ({}), took {:.0} ms",
            utc_time(n.last_scan_unix_seconds),
            ago(n.last_scan_unix_seconds, now),
            n.last_scan_duration_ms
        )
    } else {
        "none yet".into()
    };
    let rows = [
        ("name", clean(&n.name)),
        ("kernel", clean(&n.kernel)),
        ("agent version", clean(&n.agent_version)),
        ("mode", clean(&n.mode)),
        (
            "Kubernetes API",
            if n.kubernetes.is_empty() { "not reported".into() } else { clean(&n.kubernetes) },
        ),
        (
            "ready",
            if n.not_ready_because.is_empty() {
                "yes".into()
            } else {
                format!("NO: {}", n.not_ready_because.iter().map(|r| clean(r)).collect::<Vec<_>>().join("; "))
            },
        ),
        ("last scan", last),
        ("scans", n.scans.to_string()),
        ("devices", n.devices.to_string()),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{:<16}{v}", format!("{k}:"));
    }
    for (k, list) in [("warnings", &n.warnings), ("blind spots", &n.blind_spots)] {
        let count = if list.is_empty() { "none".into() } else { list.len().to_string() };
        let _ = writeln!(out, "{:<16}{count}", format!("{k}:"));
        for w in list {
            let _ = writeln!(out, "  - {}", clean(w));
        }
    }
    out
}

/// One line about the device: `loop3 (7:3, loop, 8M) backed by /x.img`.
pub fn device_header(d: &pb::Device) -> String {
    let mut s =
        format!("{} ({}:{}, {}, {}", clean(&d.name), d.major, d.minor, kind_name(d.kind), size(d.size_bytes));
    if d.read_only {
        s.push_str(", read-only");
    }
    s.push(')');
    if !d.loop_backing_file.is_empty() {
        let _ = write!(s, " backed by {}", clean(&d.loop_backing_file));
    } else if d.kind == pb::DeviceKind::Loop as i32 {
        s.push_str(" unbound");
    }
    if !d.dm_name.is_empty() {
        let _ = write!(s, " dm name {}", clean(&d.dm_name));
    }
    if !d.parent.is_empty() {
        let _ = write!(s, " partition of {}", clean(&d.parent));
    }
    if let Some(n) = &d.nvme {
        let ctrls: Vec<String> =
            n.controllers.iter().map(|c| format!("{} {}", clean(&c.name), clean(&c.state))).collect();
        let _ = write!(
            s,
            " nvme {} of {} ({} of {} live: {})",
            clean(&n.role),
            clean(&n.subsysnqn),
            n.live_controllers,
            n.controllers.len(),
            ctrls.join(", ")
        );
    }
    s
}

/// Pids listed per holder in tables (JSON has all the agent sent).
const SHOWN_PIDS: usize = 5;

/// What the holder's description does not already say: pids, namespace, mount point,
/// filesystem, container, pod.
fn holder_details(h: &pb::Holder) -> Vec<String> {
    let desc = &h.description;
    let mut parts = Vec::new();
    if let Some(first) = h.pids.first() {
        let total = (h.pid_count as usize).max(h.pids.len());
        let comm = if h.comm.is_empty() || desc.contains(&format!("({})", h.comm)) {
            String::new()
        } else {
            format!(" ({})", clean(&h.comm))
        };
        if total == 1 {
            if !desc.contains(&format!("pid {first}")) {
                parts.push(format!("pid {first}{comm}"));
            }
        } else {
            let shown: Vec<String> = h.pids.iter().take(SHOWN_PIDS).map(u32::to_string).collect();
            let more = total.saturating_sub(shown.len());
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            let comm =
                if h.comm.is_empty() { String::new() } else { format!(" (first: {})", clean(&h.comm)) };
            parts.push(format!("pids {}{more}{comm}", shown.join(",")));
        }
    }
    if h.mount_namespace != 0 {
        let host = if h.in_host_namespace { " (host)" } else { "" };
        if !desc.contains(&h.mount_namespace.to_string()) {
            parts.push(format!("mount namespace {}{host}", h.mount_namespace));
        } else if h.in_host_namespace && !desc.contains("host") {
            parts.push("host namespace".into());
        }
    }
    if !h.mount_point.is_empty() && !desc.contains(&h.mount_point) {
        parts.push(format!("mount point {}", clean(&h.mount_point)));
    }
    if !h.fstype.is_empty() && !desc.contains(&format!("{} filesystem", h.fstype)) {
        parts.push(clean(&h.fstype));
    }
    if !h.container_id.is_empty() {
        parts.push(format!("container {}", clean(&h.container_id)));
    }
    if !h.pod_uid.is_empty() {
        parts.push(format!("pod {}", clean(&h.pod_uid)));
    }
    parts
}

/// One holder: `mount: mounted at /mnt in mount namespace 4026532 [pids 12,13; ext4; pod ...]`.
pub fn holder_line(h: &pb::Holder) -> String {
    let desc = if h.description.is_empty() { "(no description)".to_owned() } else { clean(&h.description) };
    let details = holder_details(h);
    let mut s = format!("{}: {desc}", holder_kind_name(h.kind));
    if !details.is_empty() {
        let _ = write!(s, " [{}]", details.join("; "));
    }
    s
}

/// `device` and `holders` as text: a header line, the verdict with every reason, one line per
/// holder, kernel threads as symptoms. `stack` adds what is stacked on and below it.
pub fn device_table(d: &pb::Device, stack: bool) -> String {
    let mut out = format!("{}\n", device_header(d));
    if !d.identity.is_empty() {
        let _ = writeln!(out, "identity: {}", clean(&d.identity));
    }
    if stack {
        if !d.stacked_on_top.is_empty() {
            let _ = writeln!(out, "stacked on top: {}", clean(&d.stacked_on_top.join(", ")));
        }
        if !d.stacked_below.is_empty() {
            let _ = writeln!(out, "stacked below: {}", clean(&d.stacked_below.join(", ")));
        }
        if !d.dm_uuid.is_empty() {
            let _ = writeln!(out, "dm uuid: {}", clean(&d.dm_uuid));
        }
    }
    if !d.pv_names.is_empty() || !d.pod_uids.is_empty() || !d.kubelet_paths.is_empty() {
        let or_none =
            |v: &[String], none: &str| if v.is_empty() { none.to_owned() } else { clean(&v.join(", ")) };
        let _ = writeln!(out, "kubernetes: PV {}", or_none(&d.pv_names, "unknown"));
        let _ = writeln!(out, "  pods on this node: {}", or_none(&d.pod_uids, "none"));
        let _ = writeln!(out, "  kubelet paths: {}", or_none(&d.kubelet_paths, "none"));
    }
    let _ = writeln!(out, "verdict: {}", verdict_name(d.verdict));
    for r in &d.reasons {
        let _ = writeln!(out, "  - {}", clean(r));
    }
    if d.holders.is_empty() {
        out.push_str("holders: none\n");
    } else {
        let _ = writeln!(out, "holders ({}):", d.holders.len());
        for h in &d.holders {
            let _ = writeln!(out, "  - {}", holder_line(h));
        }
    }
    if !d.kernel_threads.is_empty() {
        out.push_str("kernel threads (symptoms, not holders):\n");
        for k in &d.kernel_threads {
            let _ = writeln!(out, "  - {}", clean(k));
        }
    }
    out
}

/// One event on one line: time, type, device, message.
pub fn event_line(e: &pb::Event) -> String {
    let kind = match pb::event::Type::try_from(e.r#type) {
        Ok(pb::event::Type::Unspecified) => "notice".to_owned(),
        _ => event_type_name(e.r#type),
    };
    let device = if e.device.is_empty() { "-".to_owned() } else { clean(&e.device) };
    let mut s = format!("{}  {kind:<16} {device:<10} {}", utc_time(e.unix_seconds), clean(&e.message));
    if let Some(d) = &e.current {
        let _ = write!(s, " [{}, {} holder(s)]", verdict_name(d.verdict), d.holders.len());
    }
    s
}

/// `table` with the INCOMPLETE VIEW line (`line`, "" when the view is complete) first, as the
/// agent's own tables start.
pub fn incomplete_first(line: &str, table: String) -> String {
    if line.is_empty() {
        table
    } else {
        format!("{}\n{table}", clean(line))
    }
}

/// [`incomplete_first`], then the Kubernetes API's state (`kubernetes`, as the agent says it)
/// when its word is missing (off, or it cannot vouch): the lines the agent's own reports open with.
pub fn report_first(incomplete: &str, kubernetes: &str, table: String) -> String {
    let table = if kubernetes.is_empty() || kubernetes == "vouching" {
        table
    } else {
        format!("Kubernetes API: {}\n{table}", clean(kubernetes))
    };
    incomplete_first(incomplete, table)
}
