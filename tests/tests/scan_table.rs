//! `scan`'s table in both CLIs (issue 38, item 2), against real loop devices and `lsblk`:
//! one row per device with the NAME, MAJ:MIN and SIZE strings lsblk prints for it (sizes of
//! 1 MiB, 100 MiB, 1.5 GiB and 3 GiB, sparse, and a partitioned one), the same in
//! `blockjanitor-agent scan` and `agentctl scan` against a daemon; `-o wide` never cuts (every
//! reason the JSON has is there whole, even with COLUMNS=40); `--tree` draws the partitions
//! under their disk and the mount under its partition; verdicts in colour on a terminal (a pty,
//! through `script`) and never when piped or with NO_COLOR set; warnings on stderr only.

use std::collections::HashMap;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;
use serde_json::Value;

const TOOLS: &[&str] = &["losetup", "lsblk", "parted", "partx", "mkfs.ext4", "mount", "umount", "script"];

/// The scene: loop devices of several sizes, one with two partitions (the first mounted on the
/// host), and a daemon that scanned them.
struct Scene {
    // Drop order: the daemon, the mount, the loop devices, the scratch directory.
    daemon: Daemon,
    _mount: HostMount,
    loops: Vec<LoopDev>,
    parted: LoopDev,
    s: Scratch,
}

/// A loop device on `file`, with `-P` (its partitions get devices); where this kernel's own scan
/// does not read the table (no GPT support built in), `partx -a` adds them (BLKPG).
fn loop_with_partscan(file: &std::path::Path) -> LoopDev {
    let dev = sh("losetup", &["-P", "-f", "--show", utf8(file)]).trim().to_owned();
    let lo = LoopDev::adopt(dev.trim_start_matches("/dev/"), file);
    let p1 = format!("{dev}p1");
    if !wait_until(Duration::from_secs(2), || std::path::Path::new(&p1).exists()) {
        sh("partx", &["-a", &dev]);
    }
    assert!(wait_until(Duration::from_secs(10), || std::path::Path::new(&p1).exists()), "{p1} appeared");
    lo
}

impl Scene {
    fn new() -> Option<(std::sync::MutexGuard<'static, ()>, Self)> {
        let (serial, s) = real_kernel_test(TOOLS)?;
        let loops: Vec<LoopDev> =
            [("one-mib", 1), ("hundred-mib", 100), ("gib-and-half", 1536), ("three-gib", 3072)]
                .iter()
                .map(|(name, mb)| LoopDev::attach(&s.sparse_file(&format!("{name}.img"), *mb)))
                .collect();
        let disk = s.sparse_file("parted.img", 64);
        let d = utf8(&disk);
        sh(
            "parted",
            &["-s", d, "mklabel", "gpt", "mkpart", "one", "1MiB", "33MiB", "mkpart", "two", "33MiB", "63MiB"],
        );
        let parted = loop_with_partscan(&disk);
        let p1 = format!("{}p1", parted.dev);
        sh("mkfs.ext4", &["-q", "-F", &p1]);
        let mount = HostMount::new(&p1, &s.mkdir("p1-mnt"), &[]);
        let daemon = Daemon::start(s.dir.path(), &["--grace-period", "3600"]);
        Some((serial, Self { daemon, _mount: mount, loops, parted, s }))
    }

    fn names(&self) -> Vec<String> {
        let mut n: Vec<String> = self.loops.iter().map(|l| l.name().to_owned()).collect();
        let p = self.parted.name();
        n.extend([p.to_owned(), format!("{p}p1"), format!("{p}p2")]);
        n
    }

    fn agent(&self, args: &[&str]) -> Output {
        agent(&self.agent_args(args).iter().map(String::as_str).collect::<Vec<_>>())
    }

    fn agent_args(&self, args: &[&str]) -> Vec<String> {
        let mut all: Vec<String> = ["--grace-period", "3600", "--state"].map(str::to_owned).to_vec();
        all.push(utf8(&self.s.path("cli-state.json")).to_owned());
        all.push("--journal".into());
        all.push(utf8(&self.s.path("cli-journal.jsonl")).to_owned());
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    }

    fn agentctl_args(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["--socket".to_owned(), utf8(&self.daemon.socket).to_owned()];
        all.extend(args.iter().map(|a| (*a).to_owned()));
        all
    }

    fn agentctl(&self, args: &[&str]) -> Output {
        Command::new(agent_bin().with_file_name("agentctl"))
            .args(self.agentctl_args(args))
            .stdin(Stdio::null())
            .output()
            .expect("run agentctl")
    }

    /// `bin` ("agent" or "agentctl") with `args`, its stdout.
    fn run(&self, bin: &str, args: &[&str]) -> String {
        let out = if bin == "agent" { self.agent(args) } else { self.agentctl(args) };
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "{bin} {args:?}: {:?}\n{}\n{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
        text(&out.stdout)
    }

    /// Waits until the daemon's scan has every scene device.
    fn wait_for_daemon(&self) {
        let names = self.names();
        let mut last = String::new();
        let seen = wait_until(REACT, || {
            last = text(&self.agentctl(&["scan", "-o", "json"]).stdout);
            names.iter().all(|n| last.contains(&format!("\"name\": \"{n}\"")))
        });
        assert!(seen, "the daemon lists {names:?}: {last}");
    }
}

/// lsblk's NAME -> (MAJ:MIN, SIZE) for `names` (`bytes`: `-b`, sizes in bytes).
fn lsblk(names: &[String], bytes: bool) -> HashMap<String, (String, String)> {
    let mut args = vec!["-r", "-n", "-o", "NAME,MAJ:MIN,SIZE"];
    if bytes {
        args.insert(0, "-b");
    }
    let out = sh("lsblk", &args);
    let all: HashMap<String, (String, String)> = out
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() == 3).then(|| (w[0].to_owned(), (w[1].to_owned(), w[2].to_owned())))
        })
        .collect();
    names
        .iter()
        .map(|n| (n.clone(), all.get(n).unwrap_or_else(|| panic!("lsblk lists {n}: {out}")).clone()))
        .collect()
}

/// The first three cells of `name`'s row in a table (after any tree drawing).
fn row_of(table: &str, name: &str) -> Option<(String, String, String)> {
    table.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let first = w.first()?.trim_start_matches(['├', '└', '─', '│', ' ']);
        (first == name && w.len() >= 3).then(|| (first.to_owned(), w[1].to_owned(), w[2].to_owned()))
    })
}

#[test]
fn root_scan_tables_show_what_lsblk_shows_in_both_clis() {
    let Some((_serial, scene)) = Scene::new() else { return };
    scene.wait_for_daemon();
    let names = scene.names();
    let human = lsblk(&names, false);
    let bytes = lsblk(&names, true);
    // The sizes the scene asked for, as lsblk prints them.
    let want: Vec<&str> = vec!["1M", "100M", "1.5G", "3G", "64M"];
    for (n, w) in names.iter().zip(&want) {
        assert_eq!(human[n].1, *w, "lsblk's SIZE of {n}");
    }
    for bin in ["agent", "agentctl"] {
        let json: Value = serde_json::from_str(&scene.run(bin, &["scan", "-o", "json"])).expect("JSON");
        let table = scene.run(bin, &["scan"]);
        for n in &names {
            let (majmin, size) = &human[n];
            assert_eq!(
                row_of(&table, n),
                Some((n.clone(), majmin.clone(), size.clone())),
                "{bin}: {n}'s row shows lsblk's NAME, MAJ:MIN and SIZE:\n{table}"
            );
            assert_eq!(find_device(&json, n)["size_bytes"].to_string(), bytes[n].1, "{bin}: {n} in bytes");
        }
        let head = table.lines().find(|l| l.starts_with("NAME")).expect("a header");
        let cols: Vec<&str> = head.split_whitespace().collect();
        assert_eq!(cols, ["NAME", "MAJ:MIN", "SIZE", "TYPE", "VERDICT", "HELD-BY", "WHY"], "{bin}: {table}");
        // --columns picks them, in its order; a bad name says which are valid.
        let picked = scene.run(bin, &["scan", "--columns", "size,NAME"]);
        let (p1, size) =
            (format!("{}p1", scene.parted.name()), &human[&format!("{}p1", scene.parted.name())].1);
        assert!(
            picked.lines().any(|l| l.split_whitespace().collect::<Vec<_>>() == [size.as_str(), p1.as_str()]),
            "{picked}"
        );
        let bad = if bin == "agent" {
            scene.agent(&["scan", "--columns", "NAME,COLOUR"])
        } else {
            scene.agentctl(&["scan", "--columns", "NAME,COLOUR"])
        };
        assert!(matches!(bad.status.code(), Some(1 | 2)), "{bin}: a usage error: {:?}", bad.status);
        for valid in ["NAME", "MAJ:MIN", "SIZE", "TYPE", "VERDICT", "HELD-BY", "WHY"] {
            assert!(
                text(&bad.stderr).contains(valid),
                "{bin}: the error names {valid}: {}",
                text(&bad.stderr)
            );
        }
    }
}

/// `s` with every run of digits as `#` (a duration, a count).
fn without_numbers(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

#[test]
fn root_scan_wide_never_cuts_and_tree_draws_the_stack() {
    let Some((_serial, scene)) = Scene::new() else { return };
    scene.wait_for_daemon();
    // The grace clocks' first sight (a reason of its own) is behind the agent's later runs.
    scene.run("agent", &["scan"]);
    let disk = scene.parted.name().to_owned();
    let (p1, p2) = (format!("{disk}p1"), format!("{disk}p2"));
    for bin in ["agent", "agentctl"] {
        let json: Value = serde_json::from_str(&scene.run(bin, &["scan", "-o", "json"])).expect("JSON");
        // Even told the terminal is 40 columns wide.
        let out = if bin == "agent" {
            trust_init(&mut Command::new(agent_bin()))
                .args(scene.agent_args(&["scan", "-o", "wide"]))
                .env("COLUMNS", "40")
                .output()
        } else {
            Command::new(agent_bin().with_file_name("agentctl"))
                .args(scene.agentctl_args(&["scan", "-o", "wide"]))
                .env("COLUMNS", "40")
                .output()
        }
        .expect("run");
        let wide = text(&out.stdout);
        assert!(
            !wide.contains('…') && !wide.contains("cells cut") && !wide.contains(" more"),
            "{bin}: {wide}"
        );
        // Every reason of every scene device, whole (durations aside: each run judges anew).
        let reasons: Vec<String> = scene
            .names()
            .iter()
            .flat_map(|n| find_device(&json, n)["reasons"].as_array().cloned().unwrap_or_default())
            .filter_map(|r| r.as_str().map(without_numbers))
            .collect();
        assert!(reasons.iter().any(|r| r.len() > 40), "{bin}: a reason longer than 40 columns: {reasons:?}");
        for r in &reasons {
            assert!(without_numbers(&wide).contains(r.as_str()), "{bin} -o wide shows `{r}` whole:\n{wide}");
        }
        // With COLUMNS=40, -o table cuts and says so.
        let narrow = if bin == "agent" {
            trust_init(&mut Command::new(agent_bin()))
                .args(scene.agent_args(&["scan"]))
                .env("COLUMNS", "40")
                .output()
        } else {
            Command::new(agent_bin().with_file_name("agentctl"))
                .args(scene.agentctl_args(&["scan"]))
                .env("COLUMNS", "40")
                .output()
        }
        .expect("run");
        assert!(
            text(&narrow.stdout).contains("(cells cut to fit 40 columns: -o wide shows them whole)"),
            "{bin}: {}",
            text(&narrow.stdout)
        );

        let tree = scene.run(bin, &["scan", "--tree"]);
        let lines: Vec<&str> = tree.lines().collect();
        let at = |prefix: &str| {
            lines
                .iter()
                .position(|l| l.starts_with(prefix))
                .unwrap_or_else(|| panic!("{bin}: no line starts with `{prefix}`:\n{tree}"))
        };
        let d = at(&format!("{disk} "));
        let c1 = at(&format!("├─{p1} "));
        let leaf = at("│ └─mount: ");
        let c2 = at(&format!("└─{p2} "));
        assert!(
            d < c1 && c1 < leaf && leaf < c2,
            "{bin}: {p1} and {p2} under {disk}, the mount under {p1}:\n{tree}"
        );
        assert_eq!(c1, d + 1, "{bin}: {tree}");
        assert!(lines[leaf].contains(utf8(&scene.s.path("p1-mnt"))), "{bin}: the mount point: {tree}");
    }
}

/// `cmd` (a binary and its arguments) run on a pty by `script`, with `NO_COLOR` set to `no_color`
/// (or removed): what the terminal got.
fn on_a_pty(cmd: &[String], no_color: Option<&str>) -> String {
    let line: Vec<String> = cmd.iter().map(|a| format!("'{}'", a.replace('\'', "'\\''"))).collect();
    let mut c = Command::new("script");
    trust_init(&mut c).args(["-q", "-e", "-c", &line.join(" "), "/dev/null"]).stdin(Stdio::null());
    match no_color {
        Some(v) => c.env("NO_COLOR", v),
        None => c.env_remove("NO_COLOR"),
    };
    text(&c.output().expect("script").stdout)
}

#[test]
fn root_scan_colours_verdicts_only_on_a_terminal_and_warns_on_stderr() {
    let Some((_serial, scene)) = Scene::new() else { return };
    scene.wait_for_daemon();
    let agent_cmd: Vec<String> =
        std::iter::once(utf8(&agent_bin()).to_owned()).chain(scene.agent_args(&["scan"])).collect();
    let ctl_cmd: Vec<String> = std::iter::once(utf8(&agent_bin().with_file_name("agentctl")).to_owned())
        .chain(scene.agentctl_args(&["scan"]))
        .collect();
    for cmd in [&agent_cmd, &ctl_cmd] {
        let tty = on_a_pty(cmd, None);
        assert!(
            tty.contains("\x1b[32min_use\x1b[0m"),
            "{}: a held device's verdict in green on a terminal:\n{tty:?}",
            cmd[0]
        );
        assert!(tty.contains("\x1b[33msuspect\x1b[0m"), "{}: a suspect one in yellow:\n{tty:?}", cmd[0]);
        let no_color = on_a_pty(cmd, Some("1"));
        assert!(
            no_color.contains("in_use") && !no_color.contains('\x1b'),
            "{}: NO_COLOR=1: {no_color:?}",
            cmd[0]
        );
        let empty = on_a_pty(cmd, Some(""));
        assert!(empty.contains("\x1b[32min_use"), "{}: an empty NO_COLOR does not disable colour", cmd[0]);
        let piped = trust_init(&mut Command::new(&cmd[0]))
            .args(&cmd[1..])
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .output()
            .expect("run");
        let piped_text = text(&piped.stdout);
        assert!(
            piped_text.contains("in_use") && !piped_text.contains('\x1b'),
            "{}: piped: {piped_text:?}",
            cmd[0]
        );
        // Warnings: never in the table; on stderr, each once.
        assert!(!piped_text.contains("warning:"), "{}: {piped_text}", cmd[0]);
        let said: Vec<&str> = std::str::from_utf8(&piped.stderr)
            .unwrap_or("")
            .lines()
            .filter(|l| l.starts_with("warning: "))
            .collect();
        let mut once = said.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(said.len(), once.len(), "{}: each warning once: {said:?}", cmd[0]);
        // Where PID 1 is shielded (the run trusts it: a warning of the scan's), it is said there.
        if pid1_uninspectable() {
            assert!(
                said.iter().any(|w| w.contains("PID 1 trusted to hold no device")),
                "{}: the scan's warning on stderr: {said:?}\nstdout: {piped_text}",
                cmd[0]
            );
        }
    }
}
