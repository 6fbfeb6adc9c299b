//! `holders` as text, the one renderer both CLIs print it with (the agent renders the same
//! `ListHoldersResponse` its daemon would answer).
//!
//! By default, shaped like `fuser -v`: one line per process, however many ways it holds the
//! device, with its ACCESS in fuser's letters and columns (`f`/`F` open file (for writing), `r`
//! root, `c` working directory, `e` executable, `m` mapped file), then what fuser does not know:
//! the mount namespace(s) it uses the device from (`host` for the host's), its container and pod.
//! The other holders (mounts, swap, stacked devices, loop backing, a filesystem alive with no
//! mount) follow, a line each, grouped by kind, then kernel threads as symptoms. `verbose` is the
//! long form: one line per hold, with paths and fds ([`text::device_table`]), and the scan's
//! warnings and blind spots.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use blockjanitor_proto::v1 as pb;

use crate::view::names::holder_kind_name;
use crate::view::table::{clean, columns, cut};
use crate::view::text;

/// One process, every way it holds the device.
#[derive(Default)]
struct Process {
    comm: String,
    letters: BTreeSet<char>,
    /// `host` or a mount namespace's inode, each once.
    namespaces: BTreeSet<String>,
    container: String,
    pod: String,
}

/// Whether a holder is a process's own (an fd, a directory, a mapping), as fuser lists them.
fn is_process_kind(kind: i32) -> bool {
    use pb::HolderKind as K;
    matches!(pb::HolderKind::try_from(kind), Ok(K::OpenDevice | K::OpenFile | K::Cwd | K::Root | K::Mmap))
}

/// A process holder's letters: the agent's `access`, else (an agent before it) its kind's.
fn letters(h: &pb::Holder) -> Vec<char> {
    if !h.access.is_empty() {
        return h.access.chars().collect();
    }
    use pb::HolderKind as K;
    match pb::HolderKind::try_from(h.kind) {
        Ok(K::OpenDevice | K::OpenFile) => vec!['f'],
        Ok(K::Cwd) => vec!['c'],
        Ok(K::Root) => vec!['r'],
        Ok(K::Mmap) => vec!['m'],
        _ => Vec::new(),
    }
}

/// Letters in `fuser -v`'s five places: `f` or `F`, `r`, `c`, `e`, `m`, `.` for each missing.
pub fn access_column(letters: &BTreeSet<char>) -> String {
    let file = if letters.contains(&'F') {
        'F'
    } else if letters.contains(&'f') {
        'f'
    } else {
        '.'
    };
    std::iter::once(file)
        .chain(['r', 'c', 'e', 'm'].into_iter().map(|c| if letters.contains(&c) { c } else { '.' }))
        .collect()
}

/// The processes among `holders`, by pid.
fn processes(holders: &[pb::Holder]) -> BTreeMap<u32, Process> {
    let mut by_pid: BTreeMap<u32, Process> = BTreeMap::new();
    for h in holders.iter().filter(|h| is_process_kind(h.kind)) {
        let Some(pid) = h.pids.first() else { continue };
        let p = by_pid.entry(*pid).or_default();
        if p.comm.is_empty() {
            p.comm = h.comm.clone();
        }
        p.letters.extend(letters(h));
        if h.mount_namespace != 0 {
            p.namespaces.insert(if h.in_host_namespace {
                "host".into()
            } else {
                h.mount_namespace.to_string()
            });
        }
        p.namespaces.extend(h.other_mount_namespaces.iter().map(u64::to_string));
        if p.container.is_empty() {
            p.container = h.container_id.clone();
        }
        if p.pod.is_empty() {
            p.pod = h.pod_uid.clone();
        }
    }
    by_pid
}

/// The process lines: PID, ACCESS, COMMAND, MOUNT NS, CONTAINER, POD.
fn process_rows(by_pid: &BTreeMap<u32, Process>) -> String {
    let or_dash = |s: String| if s.is_empty() { "-".to_owned() } else { s };
    let rows: Vec<Vec<String>> = by_pid
        .iter()
        .map(|(pid, p)| {
            vec![
                pid.to_string(),
                access_column(&p.letters),
                or_dash(clean(&p.comm)),
                or_dash(p.namespaces.iter().cloned().collect::<Vec<_>>().join(",")),
                or_dash(cut(&clean(&p.container), 13)),
                or_dash(clean(&p.pod)),
            ]
        })
        .collect();
    columns(&["PID", "ACCESS", "COMMAND", "MOUNT NS", "CONTAINER", "POD"], &rows)
}

/// One device's holders, fuser-style (see the module's doc).
fn grouped(d: &pb::Device) -> String {
    let mut out = String::new();
    let by_pid = processes(&d.holders);
    if !by_pid.is_empty() {
        out.push_str(&process_rows(&by_pid));
    }
    let mut others: BTreeMap<String, Vec<&pb::Holder>> = BTreeMap::new();
    for h in d.holders.iter().filter(|h| !is_process_kind(h.kind) || h.pids.is_empty()) {
        others.entry(holder_kind_name(h.kind)).or_default().push(h);
    }
    for (kind, hs) in others {
        let _ = writeln!(out, "{kind} ({}):", hs.len());
        for h in hs {
            let _ = writeln!(out, "  - {}", text::holder_line(h));
        }
    }
    if !d.kernel_threads.is_empty() {
        let names: Vec<String> = d.kernel_threads.iter().map(|k| clean(k)).collect();
        let _ = writeln!(out, "kernel threads (symptoms, not holders): {}", names.join(", "));
    }
    out
}

/// `holders DEVICE` (one answer) as text: the INCOMPLETE VIEW line when a blind spot could hide
/// a holder of it, the device and its verdict, then its holders (fuser-style, or `verbose`: one
/// line per hold, then the scan's warnings and blind spots).
pub fn holders_text(r: &pb::ListHoldersResponse, verbose: bool) -> String {
    let Some(d) = &r.device else { return "the agent answered without the device\n".into() };
    if verbose {
        let mut out = text::device_table(d, false);
        for w in &r.warnings {
            let _ = writeln!(out, "warning: {}", clean(w));
        }
        if !r.blind_spots.is_empty() {
            let _ = writeln!(out, "blind spots ({}):", r.blind_spots.len());
            for b in &r.blind_spots {
                let _ = writeln!(out, "  - {}", clean(b));
            }
        }
        return text::incomplete_first(&r.incomplete_view, out);
    }
    let mut out = format!("{}\n", text::device_header(d));
    let _ = writeln!(out, "verdict: {}", crate::view::names::verdict_name(d.verdict));
    for reason in &d.reasons {
        let _ = writeln!(out, "  - {}", clean(reason));
    }
    if d.holders.is_empty() {
        out.push_str("holders: none\n");
    } else {
        out.push_str(&grouped(d));
    }
    text::incomplete_first(&r.incomplete_view, out)
}

/// `holders DEV...` (several answers): each device's text, a blank line between them.
/// `opening` (lines, or "") goes first, after the first device's INCOMPLETE VIEW line when it has
/// one (which stays the report's first line): the agent's line about the Kubernetes API.
pub fn holders_texts(answers: &[pb::ListHoldersResponse], verbose: bool, opening: &str) -> String {
    let texts: Vec<String> = answers.iter().map(|r| holders_text(r, verbose)).collect();
    let all = texts.join("\n");
    match answers.first() {
        Some(r) if !r.incomplete_view.is_empty() && !opening.is_empty() => {
            let (first, rest) = all.split_once('\n').unwrap_or((all.as_str(), ""));
            format!("{first}\n{opening}{rest}")
        }
        _ => format!("{opening}{all}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(kind: pb::HolderKind, pid: u32, access: &str, ns: u64, host: bool) -> pb::Holder {
        pb::Holder {
            kind: kind as i32,
            pids: vec![pid],
            pid_count: 1,
            comm: format!("p{pid}"),
            access: access.into(),
            mount_namespace: ns,
            in_host_namespace: host,
            ..Default::default()
        }
    }

    #[test]
    fn one_line_per_process_with_fusers_letters() {
        use pb::HolderKind as K;
        let d = pb::Device {
            name: "loop3".into(),
            holders: vec![
                holder(K::OpenFile, 10, "F", 1, true),
                holder(K::Cwd, 10, "c", 1, true),
                holder(K::Mmap, 10, "em", 1, true),
                holder(K::Root, 11, "", 7, false),
                pb::Holder {
                    kind: K::Mount as i32,
                    mount_point: "/mnt".into(),
                    description: "mounted at /mnt".into(),
                    ..Default::default()
                },
            ],
            kernel_threads: vec!["jbd2/loop3-8 (pid 5)".into()],
            ..Default::default()
        };
        let r = pb::ListHoldersResponse { device: Some(d), ..Default::default() };
        let t = holders_text(&r, false);
        let line = |pid: &str| t.lines().filter(|l| l.starts_with(pid)).collect::<Vec<_>>();
        assert_eq!(line("10 ").len(), 1, "{t}");
        assert!(line("10 ")[0].contains("F.cem") && line("10 ")[0].contains("host"), "{t}");
        assert!(line("11 ")[0].contains(".r...") && line("11 ")[0].contains(" 7"), "{t}");
        assert!(t.contains("mount (1):\n  - mount: mounted at /mnt"), "{t}");
        assert!(t.contains("kernel threads (symptoms, not holders): jbd2/loop3-8"), "{t}");
        let long = holders_text(&r, true);
        let listed = long.split_once("holders (5):\n").map_or("", |(_, rest)| rest);
        let holds = listed.lines().take_while(|l| l.starts_with("  - ")).count();
        assert_eq!(holds, 5, "one line per hold: {long}");
    }

    #[test]
    fn access_column_has_fusers_five_places() {
        let set = |s: &str| s.chars().collect::<BTreeSet<char>>();
        assert_eq!(access_column(&set("fF")), "F....");
        assert_eq!(access_column(&set("mcr")), ".rc.m");
        assert_eq!(access_column(&set("")), ".....");
    }
}
