//! Human tables for the agent's one-shot commands other than `scan` (whose table, and every JSON
//! and YAML document, go through blockjanitor-rpc's `view`, shared with agentctl). Pure: takes
//! data, returns text.

use std::fmt::Write as _;

use crate::engine::outcome::Outcome;
use crate::engine::recover::Recovery;
use crate::engine::requests::answer::{
    layer_of, DeviceEntry, Holder, Identity, Plan, Scan, ScsiTransport, StepReport, StepResult,
};
use crate::model::scan_stats::ScanStats;
use crate::model::{BlockDevice, HolderKind, KernelText};

/// Sizes as lsblk prints them, `64M`, `1.5G` (one definition for every renderer, in blockjanitor-rpc).
pub use blockjanitor_rpc::units::size;

fn device_line(d: &BlockDevice) -> String {
    let mut s = format!("{} ({}, {}, {})", d.name, d.devnum, d.kind.as_str(), size(d.size_bytes));
    if let Some(l) = &d.loop_info {
        let _ =
            write!(s, " backed by {}{}", l.backing_file, if l.backing_deleted { " (deleted)" } else { "" });
    }
    if let Some(dm) = &d.dm {
        let _ = write!(s, " dm name {}", dm.name);
    }
    if let Some(layer) = layer_of(d) {
        let _ = write!(s, ": {}", layer.describe());
    }
    if let Some(p) = &d.parent {
        let _ = write!(s, " partition of {p}");
    }
    s
}

/// One holder, in a table row.
pub fn holder_line(h: &Holder) -> String {
    let mut s = format!("{:<15}", h.kind.as_str());
    match h.kind {
        HolderKind::Mount => {
            let _ = write!(
                s,
                "{} ({}) in mount namespace {}{}",
                h.mount_point.as_ref().map_or("?".into(), KernelText::escaped),
                h.fstype.as_ref().map_or("?".into(), KernelText::escaped),
                h.mount_namespace.map_or("?".into(), |n| n.0.to_string()),
                if h.in_host_namespace == Some(true) { " [host]" } else { "" }
            );
            match (h.pids.first(), &h.namespace_entry) {
                (Some(p), _) => {
                    let _ =
                        write!(s, ", pid {p} ({})", h.comm.as_ref().map_or("?".into(), KernelText::escaped));
                    if h.pid_count > 1 {
                        let _ = write!(s, " +{} more", h.pid_count - 1);
                    }
                }
                (None, Some(e)) => {
                    let _ = write!(s, ", no process: pinned by {}", e.describe());
                }
                _ => {}
            }
        }
        _ => {
            s.push_str(&h.describe());
            // Where it uses the device from, when that is not (only) the host's namespace: a
            // thread in a pod's namespace holds the device there (gotcha 30).
            if h.in_host_namespace == Some(false) || !h.other_namespaces.is_empty() {
                let all: Vec<String> =
                    h.mount_namespace.iter().chain(&h.other_namespaces).map(|n| n.0.to_string()).collect();
                let _ = write!(s, " in mount namespace {}", all.join(", "));
            }
        }
    }
    if let Some(c) = &h.container_id {
        let _ = write!(s, " container {}", &c[..c.len().min(13)]);
    }
    if let Some(p) = &h.pod_uid {
        let _ = write!(s, " pod {p}");
    }
    s
}

/// Multipath paths and SCSI state under a device line.
fn storage_lines(out: &mut String, e: &DeviceEntry) {
    if let Some(m) = &e.multipath {
        let _ = writeln!(
            out,
            "    multipath {} ({}): {} of {} path(s) active{}{}, open count {}",
            m.name,
            m.wwid,
            m.active_paths,
            m.paths.len(),
            if m.queue_if_no_path == Some(true) { ", queue_if_no_path" } else { "" },
            if m.io_would_hang { " (I/O hangs)" } else { "" },
            m.open_count.map_or("?".into(), |c| c.to_string())
        );
        for p in &m.paths {
            let _ = writeln!(
                out,
                "      path {} {} {} (fail count {}){}",
                p.device.as_ref().map_or("?", |d| d.as_str()),
                p.devnum,
                p.state,
                p.fail_count,
                p.scsi_state.as_deref().map(|s| format!(", scsi {s}")).unwrap_or_default()
            );
        }
    }
    if let Some(sc) = &e.scsi {
        let state = serde_json::to_value(sc.disk.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let transport = match &sc.disk.transport {
            ScsiTransport::Iscsi { session } => format!("iSCSI {session}"),
            ScsiTransport::Fc { rport } => format!("FC {rport}"),
            ScsiTransport::Other => "local".into(),
        };
        let _ = writeln!(
            out,
            "    scsi {} {} {}: {state}, {transport}{}{}, wwid {}, ioerr_cnt {}",
            sc.disk.address,
            sc.disk.vendor,
            sc.disk.model,
            sc.transport_state.as_deref().map(|s| format!(" ({s})")).unwrap_or_default(),
            sc.path_of.as_ref().map(|m| format!(", path of {m}")).unwrap_or_default(),
            sc.disk.wwid.as_deref().unwrap_or("?"),
            sc.disk.ioerr_cnt
        );
        if let Some(s) = &sc.session {
            let _ = writeln!(
                out,
                "    iscsi session{} {} at {}, iface {}, recovery_tmo {}",
                s.detail.sid,
                s.targetname,
                s.detail.portal().as_deref().unwrap_or("?"),
                s.detail.ifacename.as_deref().unwrap_or("?"),
                s.detail.recovery_tmo.map_or("?".into(), |t| t.to_string())
            );
        }
        if let Some(line) = &sc.lun_gone {
            let _ = writeln!(out, "    target reports the LUN gone: {line}");
        }
        if let Some(o) = &sc.outage {
            let _ =
                writeln!(out, "    outage: {} {} down ({})", o.scope.as_str(), o.key, o.members.join(", "));
        }
    }
}

/// rbd and nbd details under a device line.
fn mapping_lines(out: &mut String, e: &DeviceEntry) {
    if let Some(r) = &e.rbd {
        let _ = writeln!(
            out,
            "    rbd {}/{} (id {}, image id {}), {} at {}, cluster {}; {}",
            r.pool,
            r.image,
            r.id,
            r.image_id,
            r.watcher_client,
            r.client_addr,
            r.cluster_fsid,
            r.dev_paths.join(", ")
        );
        if let Some(line) = &r.fenced {
            let _ = writeln!(out, "    fenced: the cluster blocklisted this client ({line})");
        }
    }
    if let Some(n) = &e.nbd {
        let server = match (n.pid, n.server_alive) {
            (Some(p), true) => format!(
                "served by pid {p} ({})",
                n.server_cmdline.as_ref().map_or("?".into(), KernelText::escaped)
            ),
            (Some(p), false) => format!("server process {p} is gone"),
            (None, _) => "no server process".into(),
        };
        let _ = writeln!(
            out,
            "    nbd connected, {server}{}",
            n.backend.as_deref().map(|b| format!(", backend {b}")).unwrap_or_default()
        );
    }
    if let Some(n) = &e.nvme {
        let _ = writeln!(
            out,
            "    nvme {} of {} ({}): {} of {} controller(s) live: {}{}",
            n.role.as_str(),
            n.subsystem.as_deref().unwrap_or("?"),
            n.subsysnqn,
            n.live,
            n.controllers.len(),
            n.describe_controllers(),
            n.outage.as_ref().map(|o| format!("; outage of {}", o.target)).unwrap_or_default()
        );
    }
}

/// Holders and kernel threads under a device line.
fn holders_block(out: &mut String, e: &DeviceEntry, limit: usize) {
    mapping_lines(out, e);
    if let Some(k) = &e.kubernetes {
        let _ = writeln!(
            out,
            "    kubernetes: PV {}, pods {}, at {}",
            if k.pv_names.is_empty() { "?".to_owned() } else { k.pv_names.join(", ") },
            if k.pod_uids.is_empty() { "none on this node".to_owned() } else { k.pod_uids.join(", ") },
            k.paths.join(", ")
        );
    }
    storage_lines(out, e);
    for h in e.holders.iter().take(limit) {
        let _ = writeln!(out, "    {}", holder_line(h));
    }
    if e.holders.len() > limit {
        let mut counts = std::collections::BTreeMap::new();
        for h in &e.holders[limit..] {
            *counts.entry(h.kind.as_str()).or_insert(0) += 1;
        }
        let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            out,
            "    ... and {} more ({}); use --output json for all",
            e.holders.len() - limit,
            parts.join(", ")
        );
    }
    if !e.kernel_threads.is_empty() {
        let names: Vec<String> =
            e.kernel_threads.iter().map(|k| format!("{} (pid {})", k.comm, k.pid)).collect();
        let _ =
            writeln!(out, "    kernel threads (symptoms of a live mount, not holders): {}", names.join(", "));
    }
}

/// One device of a scan as a table: the device, its holders, then the scan's figures, warnings
/// and blind spots.
pub fn entry_table(scan: &Scan, e: &DeviceEntry) -> String {
    let mut out = format!("{}\n", device_line(&e.device));
    let _ = writeln!(out, "    identity: {}", Identity::of(e));
    if e.holders.is_empty() {
        out.push_str("    no holders: nothing mounts it, has it open, swaps on it or is stacked on it\n");
    }
    holders_block(&mut out, e, usize::MAX);
    footer(&mut out, scan);
    out
}

/// The scan's figures, warnings and blind spots, under a table.
fn footer(out: &mut String, scan: &Scan) {
    let _ = writeln!(out, "{}", stats_line(&scan.stats));
    for w in &scan.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    if !scan.blind_spots.is_empty() {
        let _ = writeln!(
            out,
            "blind spots ({}): a cleanup candidate any of these could hide a holder of is unknown, never stale",
            scan.blind_spots.len()
        );
        for b in &scan.blind_spots {
            let _ = writeln!(out, "  - {b}");
        }
    }
}

fn stats_line(s: &ScanStats) -> String {
    format!(
        "scanned {} processes ({} tasks, {} kernel threads) in {} mount namespaces, {} of mountinfo, in {:.0} ms",
        s.processes,
        s.tasks,
        s.kernel_threads,
        s.mount_namespaces,
        size(s.mountinfo_bytes as u64),
        s.duration.as_secs_f64() * 1000.0
    )
}

/// A plan, for humans.
pub fn plan_text(p: &Plan, apply: bool) -> String {
    let mut out = format!("{} {} ({}): ", p.operation, p.device, p.devnum);
    if let Some(r) = &p.refusal {
        let _ = writeln!(out, "refused: {r}");
    } else if p.steps.is_empty() {
        out.push_str("nothing to do\n");
    } else {
        if apply {
            let _ = writeln!(out, "carrying out {} step(s)", p.steps.len());
        } else {
            let _ = writeln!(out, "{} step(s) (dry run: add --apply to carry them out)", p.steps.len());
            for (i, s) in p.steps.iter().enumerate() {
                let _ = writeln!(out, "  {}. {}", i + 1, s.describe());
            }
        }
    }
    // The same sentence (a release saying it of the mount in each of 37 namespaces) once, with a
    // count and the numbers that differ.
    for n in blockjanitor_rpc::view::fold::fold_alike(&p.notes) {
        let _ = writeln!(out, "note: {n}");
    }
    if !p.left_alone.is_empty() {
        out.push_str("left alone:\n");
        let reasons: Vec<&str> = p.left_alone.iter().map(|l| l.reason.as_str()).collect();
        for r in blockjanitor_rpc::view::fold::fold_alike(&reasons) {
            let _ = writeln!(out, "  - {r}");
        }
    }
    out
}

/// Results of carried-out steps, for humans.
pub fn reports_text(reports: &[StepReport]) -> String {
    let mut out = String::new();
    for (i, r) in reports.iter().enumerate() {
        let (word, why) = r.word();
        let res = match r.result_word() {
            StepResult::Failed => format!("FAILED: {why}"),
            _ if why.is_empty() => word.replace('_', " "),
            _ => format!("{word}: {why}"),
        };
        let _ = writeln!(out, "  {}. {}: {res}", i + 1, r.step.describe());
    }
    out
}

/// The report of one request ([`Outcome`]) as text: the "INCOMPLETE
/// VIEW" line first when the scan behind it could not see everything, then the unfinished plans
/// it resumed, the plan, the steps as run and the device afterwards. `argument` is what the
/// operator named.
pub fn outcome_text(out: &Outcome, argument: &str) -> String {
    let mut text = String::new();
    if let Some(line) = out.incomplete() {
        let _ = writeln!(text, "{line}");
    }
    for r in &out.resumed {
        let _ = writeln!(text, "{}", r.describe());
    }
    if let Some(gone) = &out.gone {
        let _ = writeln!(text, "{gone}");
    }
    let Some(plan) = &out.plan else {
        if !out.resumed.is_empty() {
            let _ = writeln!(text, "{argument} is gone: the interrupted plan it named is finished");
        }
        return text;
    };
    text.push_str(&plan_text(plan, out.applied));
    if let Some((_, why)) = &out.refusal {
        let _ = writeln!(text, "refused: {why}");
    }
    if !out.applied {
        return text;
    }
    text.push_str(&reports_text(&out.reports));
    match out.after.as_ref().and_then(|s| s.entry(plan.devnum).map(|e| (s, e))) {
        Some((scan, entry)) if !entry.holders.is_empty() => {
            let _ = writeln!(text, "still held after {}:", plan.operation);
            text.push_str(&entry_table(scan, entry));
        }
        Some((_, entry)) if entry.device.is_unbound_loop() => {
            let _ = writeln!(text, "{} is free and unbound", entry.device.name);
        }
        Some((_, entry)) => {
            let _ = writeln!(text, "{} is free: nothing holds it any more", entry.device.name);
        }
        None => {
            let _ = writeln!(text, "{} is gone", plan.device);
        }
    }
    text
}

/// Says what the journal's recovery did through `say`: each interrupted step closed (or left
/// open), each unfinished plan resumed or left for its own command.
pub fn say_recovery(out: &Outcome, say: impl Fn(&str)) {
    say_recovery_of(&out.recovery, &say);
    for u in &out.unfinished {
        say(u);
    }
}

/// Says what the journal's recovery did: each interrupted step closed, or left open and why.
pub fn say_recovery_of(recovery: &Recovery, say: impl Fn(&str)) {
    for (i, how) in &recovery.resolved {
        say(&format!("recovered interrupted step {} ({}): {}", i.id, how.word, how.detail));
    }
    for (id, why) in &recovery.left_open {
        say(&format!("journal step {id} left open: {why}"));
    }
}
