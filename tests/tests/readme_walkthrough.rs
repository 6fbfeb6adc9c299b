//! The README's walkthrough ("A walkthrough: a volume kubelet cannot unmap"), run exactly as it
//! writes it: every `# ` line of its console block is a root command, run in that order by one
//! bash in a fresh directory, with the agent under test first on PATH. The rest of the block is
//! the output the README shows, each line of which the agent must print (numbers, paths and the
//! device's name aside: so the README's figures stay current); the test also checks what it claims: `holders` finds the mount in the
//! other namespace and exits 2 (held), the `release` dry run changes nothing, `release --apply`
//! detaches it there and says the device is free and unbound, and the holder still runs.

use std::process::{Command, Stdio};

use blockjanitor_tests::deploy::repo;
use blockjanitor_tests::{agent_bin, require_real_kernel, serial, text, trust_init};

const HEADING: &str = "## A walkthrough: ";

/// The walkthrough's commands: the `# ` lines of the section's ```console block, as written.
fn walkthrough_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section =
        readme.split("\n## ").find(|s| format!("## {s}").starts_with(HEADING)).expect("the section");
    let start = section.find("```console\n").expect("a console block") + "```console\n".len();
    let block = &section[start..start + section[start..].find("\n```").expect("closed")];
    block.lines().filter_map(|l| l.strip_prefix("# ")).map(str::to_owned).collect()
}

/// The output the README shows under each command of the walkthrough (its lines up to the next
/// `# ` line or blank line), in the commands' order.
fn walkthrough_outputs() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section =
        readme.split("\n## ").find(|s| format!("## {s}").starts_with(HEADING)).expect("the section");
    let start = section.find("```console\n").expect("a console block") + "```console\n".len();
    let block = &section[start..start + section[start..].find("\n```").expect("closed")];
    let mut outputs: Vec<Vec<String>> = Vec::new();
    let mut open = false;
    for line in block.lines() {
        if line.starts_with("# ") {
            outputs.push(Vec::new());
            open = true;
        } else if line.trim().is_empty() {
            open = false;
        } else if let (true, Some(last)) = (open, outputs.last_mut()) {
            last.push(line.to_owned());
        }
    }
    outputs
}

/// A line with what differs from run to run taken out: the README's directory (`/var/tmp/demo`)
/// and the test's become `DIR`, the loop device's name `DEV`, every number `N`.
fn shape(line: &str, dir: &str, dev: &str) -> String {
    let line = line.replace(dir, "DIR").replace("/var/tmp/demo", "DIR").replace(dev, "DEV");
    let mut out = String::new();
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Kills the background holder (and with it the namespace and its copy of the mount) and frees
/// the loop device if a failed run left it bound.
struct Cleanup {
    dir: tempfile::TempDir,
    pids: Vec<i32>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for pid in &self.pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), nix::sys::signal::SIGKILL);
        }
        let _ = Command::new("umount").arg(self.dir.path().join("mnt")).stderr(Stdio::null()).status();
        let img = self.dir.path().join("vol.img");
        if let Ok(out) = Command::new("losetup").args(["-j"]).arg(&img).args(["-n", "-O", "NAME"]).output() {
            for dev in text(&out.stdout).lines() {
                let _ = Command::new("losetup").args(["-d", dev.trim()]).status();
            }
        }
    }
}

#[test]
fn root_readme_walkthrough_runs_as_written() {
    if !require_real_kernel(&["losetup", "mkfs.ext4", "unshare", "truncate", "bash"]) {
        return;
    }
    let _serial = serial();
    let commands = walkthrough_commands();
    assert_eq!(commands.len(), 7, "the walkthrough's commands: {commands:#?}");
    // Each command as written, between markers that give its output and exit code.
    let mut script = String::new();
    for (i, c) in commands.iter().enumerate() {
        script.push_str(&format!("echo '@@BEGIN {i}'\n{c}\necho \"@@RC {i} $?\"\n"));
    }
    script.push_str("echo \"@@JOBS $(jobs -p | tr '\\n' ' ')\"\n");
    let mut cleanup = Cleanup {
        dir: tempfile::Builder::new().prefix("bj-walk").tempdir_in("/var/tmp").expect("dir"),
        pids: vec![],
    };
    let bin = agent_bin();
    let path =
        format!("{}:{}", bin.parent().expect("bin dir").display(), std::env::var("PATH").unwrap_or_default());
    // Output to files, not pipes: the background holder keeps bash's stdout open for its life.
    let (out_path, err_path) = (cleanup.dir.path().join("out.log"), cleanup.dir.path().join("err.log"));
    let mut cmd = Command::new("bash");
    cmd.args(["-c", &script])
        .current_dir(cleanup.dir.path())
        .env("PATH", path)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("out.log"))
        .stderr(std::fs::File::create(&err_path).expect("err.log"));
    trust_init(&mut cmd);
    let status = cmd.status().expect("bash");
    let stdout = std::fs::read_to_string(&out_path).expect("out.log");
    let all = format!("{stdout}{}\n(bash: {status})", std::fs::read_to_string(&err_path).expect("err.log"));
    cleanup.pids = all
        .lines()
        .find_map(|l| l.strip_prefix("@@JOBS "))
        .map(|p| p.split_whitespace().filter_map(|x| x.parse().ok()).collect())
        .unwrap_or_default();
    let part = |i: usize| -> (String, Option<i32>) {
        let begin = format!("@@BEGIN {i}\n");
        let from =
            stdout.find(&begin).unwrap_or_else(|| panic!("command {i} never ran:\n{all}")) + begin.len();
        let rest = &stdout[from..];
        let rc_at = rest
            .find(&format!("@@RC {i} "))
            .unwrap_or_else(|| panic!("command {i} has no exit code:\n{all}"));
        let rc = rest[rc_at..]
            .lines()
            .next()
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|c| c.parse().ok());
        (rest[..rc_at].to_owned(), rc)
    };
    for (i, c) in commands.iter().enumerate().take(4) {
        assert_eq!(part(i).1, Some(0), "`{c}` failed:\n{all}");
    }
    assert_eq!(cleanup.pids.len(), 1, "one background holder (the README's `sleep`):\n{all}");

    // The output the README shows is the output the agent prints, line for line (but for what
    // differs between runs: paths, the device's name, numbers; and the kernel threads, whose
    // workqueue threads come and go).
    let dir = cleanup.dir.path().to_str().expect("utf-8 dir").to_owned();
    let dev = stdout
        .lines()
        .find_map(|l| l.split_whitespace().next().filter(|w| w.starts_with("loop")))
        .unwrap_or("loop")
        .to_owned();
    for (i, shown) in walkthrough_outputs().iter().enumerate() {
        let printed: Vec<String> = part(i).0.lines().map(|l| shape(l, &dir, &dev)).collect();
        for line in shown.iter().filter(|l| !l.starts_with("kernel threads")) {
            let want = shape(line, &dir, &dev);
            assert!(
                printed.contains(&want),
                "README's output of `{}` shows a line the agent does not print:\n  {want}\nprinted:\n{}",
                commands[i],
                printed.join("\n")
            );
        }
    }

    let (holders, rc) = part(4);
    assert_eq!(rc, Some(2), "holders exits 2 (held):\n{all}");
    assert!(holders.contains("verdict: in_use"), "{holders}");
    let mount_line = holders
        .lines()
        .find(|l| l.trim_start().starts_with("- mount: "))
        .unwrap_or_else(|| panic!("no mount holder:\n{holders}"));
    assert!(
        mount_line.contains("/mnt in mount namespace")
            && mount_line.contains("(sleep)")
            && mount_line.contains("ext4"),
        "{mount_line}"
    );
    assert!(!holders.contains("INCOMPLETE"), "{holders}");

    let (dry, rc) = part(5);
    assert_eq!(rc, Some(0), "the dry run may go:\n{all}");
    assert!(dry.contains("dry run: add --apply") && dry.contains("umount2 MNT_DETACH"), "{dry}");

    let (apply, rc) = part(6);
    assert_eq!(rc, Some(0), "release --apply:\n{all}");
    assert!(apply.contains(" -> done") && apply.contains("is free and unbound"), "{apply}");
    // What the README says after it: the holder still runs, the loop device is gone.
    let holder = nix::unistd::Pid::from_raw(cleanup.pids[0]);
    assert!(nix::sys::signal::kill(holder, None).is_ok(), "the holder was not killed");
    let bound =
        Command::new("losetup").arg("-j").arg(cleanup.dir.path().join("vol.img")).output().expect("losetup");
    assert_eq!(text(&bound.stdout).trim(), "", "the loop device auto-cleared");
}
