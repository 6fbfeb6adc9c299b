//! `scan` as text, the one renderer both CLIs print it with (`blockjanitor-agent scan` from the
//! messages it converts its judged devices to, `agentctl scan` from ListDevices): the INCOMPLETE
//! VIEW and Kubernetes API lines first, then one row per device shaped like `lsblk` (NAME,
//! MAJ:MIN, SIZE as lsblk prints it, TYPE, VERDICT, HELD-BY, WHY; `--columns` picks them,
//! `--tree` draws each stack with its holders as leaves, [`crate::view::tree`]), then the summary:
//! counts, what the filter left out, the scan's figures and blind spots, the pin risks and the
//! orphaned pod volume directories. Warnings are not in it: [`warnings`] are for stderr.
//!
//! `-o wide` never cuts a cell; `-o table` cuts the widest cells (WHY first) to the terminal's
//! width, and says so under the table. Verdicts are coloured only when [`Term`] allows.

use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::units::size;
use crate::view::choices::DeviceFilter;
use crate::view::columns::{Column, ScanLayout};
use crate::view::names::kind_name;
use crate::view::table::clean;
use crate::view::term::{paint_verdict, Term};
use crate::view::tree::{rows, Row};

/// How to print a scan: which devices, which columns, how wide, in colour or not.
#[derive(Debug, Clone, Copy)]
pub struct ScanStyle<'a> {
    pub filter: &'a DeviceFilter,
    pub layout: &'a ScanLayout,
    /// `-o wide`: no cell is cut, every reason is shown.
    pub wide: bool,
    pub term: Term,
}

/// Narrowest a cut column gets.
const MIN_CUT: usize = 12;

/// Narrowest HELD-BY and PV get before WHY is cut.
const MIN_SIDE: usize = 24;

/// Holder lines under a device in `--tree` before the rest are counted (`-o wide`: every one).
const LEAVES: usize = 8;

/// A bound loop device, or any device something holds: what the table lists.
fn listed(d: &pb::Device) -> bool {
    !(d.kind == pb::DeviceKind::Loop as i32 && d.loop_backing_file.is_empty() && d.holders.is_empty())
}

/// `scan`'s report on stdout (see the module docs); `r` holds every device of the scan (the
/// filter is applied here, so the summary can count what it left out).
pub fn report(r: &pb::ListDevicesResponse, style: &ScanStyle<'_>) -> String {
    let shown: Vec<&pb::Device> = r.devices.iter().filter(|d| style.filter.matches(d)).collect();
    let filtered = r.devices.len() - shown.len();
    let listed_devices: Vec<&pb::Device> = shown.iter().copied().filter(|d| listed(d)).collect();
    let hidden = shown.len() - listed_devices.len();
    let mut out = if listed_devices.is_empty() {
        "no matching devices\n".to_owned()
    } else {
        table(&listed_devices, style)
    };
    summary(&mut out, r, filtered, hidden);
    out.push_str(&multipath_section(r, &listed_devices));
    out.push_str(&crate::view::pins::pin_risks_section(&r.pin_risks, &r.pin_risks_unknown));
    out.push_str(&crate::view::orphans::section(r));
    crate::view::text::report_first(&r.incomplete_view, &r.kubernetes, out)
}

/// The scan's warnings for stderr: one line per cause, each said once (with a count when the
/// scan said it more often).
pub fn warnings(r: &pb::ListDevicesResponse) -> Vec<String> {
    crate::view::fold::fold(&r.warnings).iter().map(|w| format!("warning: {}", clean(w))).collect()
}

/// The devices as rows, cut to the terminal's width unless wide.
fn table(devices: &[&pb::Device], style: &ScanStyle<'_>) -> String {
    let columns = style.layout.shown(style.wide);
    let rows = rows(devices, style.layout.tree, (!style.wide).then_some(LEAVES));
    let mut cells: Vec<Vec<String>> = rows
        .iter()
        .filter_map(|row| match row {
            Row::Device { prefix, device } => Some(
                columns
                    .iter()
                    .map(|c| {
                        let cell = c.cell(device, style.wide);
                        if *c == Column::Name {
                            format!("{prefix}{cell}")
                        } else {
                            cell
                        }
                    })
                    .collect(),
            ),
            Row::Leaf { .. } => None,
        })
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.heading().chars().count()).collect();
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let limit = style.term.width.filter(|_| !style.wide);
    let mut cut = limit.is_some_and(|w| fit(&columns, &mut widths, w));
    for row in &mut cells {
        for (cell, w) in row.iter_mut().zip(&widths) {
            if cell.chars().count() > *w {
                *cell = cut_to(cell, *w);
            }
        }
    }
    let mut out = line(&columns.iter().map(|c| c.heading().to_owned()).collect::<Vec<_>>(), &widths, None);
    let mut next = cells.into_iter();
    for row in &rows {
        match row {
            Row::Device { device, .. } => {
                let cells = next.next().unwrap_or_default();
                let verdict = columns.iter().position(|c| *c == Column::Verdict);
                let painted = verdict.map(|i| (i, device.verdict, style.term.colour));
                out.push_str(&line(&cells, &widths, painted));
            }
            Row::Leaf { prefix, text } => {
                let whole = format!("{prefix}{text}");
                let shown = match limit {
                    Some(w) if whole.chars().count() > w => {
                        cut = true;
                        cut_to(&whole, w)
                    }
                    _ => whole,
                };
                let _ = writeln!(out, "{shown}");
            }
        }
    }
    if cut {
        let w = limit.unwrap_or_default();
        let _ = writeln!(out, "(cells cut to fit {w} columns: -o wide shows them whole)");
    }
    out
}

/// Narrows the cuttable columns until the row fits `limit`: HELD-BY and PV to a few words
/// first, then WHY, then any of them (and NAME) to [`MIN_CUT`]; whether any was narrowed.
fn fit(columns: &[Column], widths: &mut [usize], limit: usize) -> bool {
    let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1);
    let mut narrowed = false;
    let steps = [
        (Column::HeldBy, MIN_SIDE),
        (Column::Pv, MIN_SIDE),
        (Column::Why, MIN_CUT),
        (Column::HeldBy, MIN_CUT),
        (Column::Pv, MIN_CUT),
        (Column::Name, MIN_CUT),
    ];
    for (victim, floor) in steps {
        let Some(i) = columns.iter().position(|c| *c == victim) else { continue };
        let over = total(widths).saturating_sub(limit);
        if over == 0 {
            break;
        }
        let w = widths[i];
        let to = w.saturating_sub(over).max(floor.min(w));
        narrowed |= to < w;
        widths[i] = to;
    }
    narrowed
}

/// At most `max` characters of `s`, ending in `…` when cut.
fn cut_to(s: &str, max: usize) -> String {
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// One row: cells left-aligned two spaces apart, the last not padded; `paint` is the verdict
/// cell's index, the verdict and whether to colour it.
fn line(cells: &[String], widths: &[usize], paint: Option<(usize, i32, bool)>) -> String {
    let mut s = String::new();
    for (i, cell) in cells.iter().enumerate() {
        let last = i + 1 == cells.len();
        let pad = if last {
            0
        } else {
            widths.get(i).copied().unwrap_or(0).saturating_sub(cell.chars().count()) + 2
        };
        let padded = format!("{cell}{}", " ".repeat(pad));
        match paint {
            Some((at, verdict, colour)) if at == i => s.push_str(&paint_verdict(&padded, verdict, colour)),
            _ => s.push_str(&padded),
        }
    }
    let mut s = s.trim_end().to_owned();
    s.push('\n');
    s
}

/// The lines under the table: how many devices of which kinds (held), what the filter left out,
/// the unbound loop devices not listed, the scan's figures and its blind spots.
fn summary(out: &mut String, r: &pb::ListDevicesResponse, filtered: usize, hidden: usize) {
    let mut kinds: Vec<(i32, usize)> = Vec::new();
    for d in &r.devices {
        match kinds.iter_mut().find(|(k, _)| *k == d.kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((d.kind, 1)),
        }
    }
    kinds.sort_unstable();
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{n} {}", kind_name(*k))).collect();
    let held = r.devices.iter().filter(|d| !d.holders.is_empty()).count();
    let _ = writeln!(out, "\n{} block devices ({}), {held} held", r.devices.len(), kinds.join(", "));
    if filtered > 0 {
        let _ = writeln!(out, "{filtered} devices left out by the filter (--kind, --verdict, --stale)");
    }
    if hidden > 0 {
        let _ = writeln!(out, "{hidden} unbound loop devices not shown");
    }
    if let Some(s) = &r.stats {
        let _ = writeln!(
            out,
            "scanned {} processes ({} tasks, {} kernel threads) in {} mount namespaces, {} of mountinfo, in {:.0} ms",
            s.processes,
            s.tasks,
            s.kernel_threads,
            s.mount_namespaces,
            size(s.mountinfo_bytes),
            s.duration_ms
        );
    }
    if !r.blind_spots.is_empty() {
        let _ = writeln!(
            out,
            "blind spots ({}): a cleanup candidate any of these could hide a holder of is unknown, never stale",
            r.blind_spots.len()
        );
        for b in crate::view::fold::fold(&r.blind_spots) {
            let _ = writeln!(out, "  - {}", clean(&b));
        }
    }
}

/// Each listed multipath map's paths and their SCSI disks, under the table: what a row cannot
/// hold and what a person facing a dead map reads first (how many paths are active, whether I/O
/// hangs, each path's state and SCSI address).
fn multipath_section(r: &pb::ListDevicesResponse, listed: &[&pb::Device]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    for m in listed.iter().filter_map(|d| d.multipath.as_ref()) {
        let open = if m.open_count < 0 { "?".to_owned() } else { m.open_count.to_string() };
        let _ = writeln!(
            out,
            "multipath {} ({}): {} of {} path(s) active{}{}, open count {open}",
            crate::view::table::clean(&m.name),
            crate::view::table::clean(&m.wwid),
            m.active_paths,
            m.paths.len(),
            if m.queue_if_no_path == "on" { ", queue_if_no_path" } else { "" },
            if m.io_would_hang { " (I/O hangs)" } else { "" },
        );
        for p in &m.paths {
            let scsi = r
                .devices
                .iter()
                .find(|d| !p.device.is_empty() && d.name == p.device)
                .and_then(|d| d.scsi.as_ref())
                .map(|sc| {
                    format!(
                        ", scsi {} {}",
                        crate::view::table::clean(&sc.address),
                        crate::view::table::clean(&sc.state)
                    )
                })
                .unwrap_or_default();
            let name = if p.device.is_empty() { "?" } else { p.device.as_str() };
            let _ = writeln!(
                out,
                "  path {} {} {} (fail count {}){scsi}",
                crate::view::table::clean(name),
                p.devnum,
                p.state,
                p.fail_count
            );
        }
    }
    out
}
