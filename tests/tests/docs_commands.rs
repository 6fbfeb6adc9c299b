//! Every command the project's pages give (README.md, CONTRIBUTING.md, ARCHITECTURE.md, every page
//! under docs/) parses with the CLI it names: `blockjanitor-agent` with the agent's parser,
//! `agentctl` and `kubectl blockjanitor` with agentctl's, and a `kubectl` that selects the
//! project's pods does so by their component label in the project's namespace. The commands that
//! set a scene and run on this machine are run as written elsewhere (`readme_commands.rs`);
//! this check covers the rest, which need a cluster, a console or a node's devices.
//!
//! Also: the README stays a first hour's read (about 250 lines, the install steps in the order a
//! user needs them), and every relative link of every page (and of BENCHMARKS.md) points to a
//! file a clone has: one git tracks, not one that is only here.

use std::path::{Path, PathBuf};

use blockjanitor_tests::deploy::repo;
use blockjanitor_tests::doc_commands::{check_command, code_lines};

/// The pages: README.md, CONTRIBUTING.md, ARCHITECTURE.md and every `.md` under docs/ (runbooks
/// included).
fn pages() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> =
        ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md"].iter().map(|p| repo().join(p)).collect();
    let mut dirs = vec![repo().join("docs")];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn name(p: &Path) -> String {
    p.strip_prefix(repo()).unwrap_or(p).display().to_string()
}

/// The command a code-block line gives, if it runs one of the CLIs or kubectl: its first word
/// (after a prompt, `sudo` and variable assignments) names it. A layout listing or an output line
/// that merely mentions a binary is not a command.
fn command(line: &str) -> Option<&str> {
    let line = line.trim_start();
    // A root prompt (`# command`) or a user's (`$ command`) in a console block.
    let line = line.strip_prefix("# ").or_else(|| line.strip_prefix("$ ")).unwrap_or(line);
    let mut rest = line;
    loop {
        let (word, tail) = rest.split_once(' ').unwrap_or((rest, ""));
        if word == "sudo" || (word.contains('=') && !word.starts_with('-') && !word.starts_with('=')) {
            rest = tail.trim_start();
            continue;
        }
        let known = ["blockjanitor-agent", "agentctl", "kubectl", "kubectl-blockjanitor"];
        let word = word.rsplit('/').next().unwrap_or(word);
        return known.contains(&word).then_some(line);
    }
}

#[test]
fn every_command_in_the_pages_parses_with_its_cli() {
    let mut wrong = Vec::new();
    let mut checked = 0;
    for page in pages() {
        for line in code_lines(&read(&page)) {
            let Some(line) = command(&line) else { continue };
            checked += 1;
            if let Some(why) = check_command(line) {
                let why = why.lines().next().unwrap_or_default();
                wrong.push(format!("{}: `{line}`: {why}", name(&page)));
            }
        }
    }
    assert!(checked > 100, "only {checked} commands found: is the code-block reader broken?");
    assert!(wrong.is_empty(), "commands in the pages that their CLI does not take:\n{}", wrong.join("\n"));
}

#[test]
fn every_relative_link_points_to_a_file_of_the_clone() {
    // What git tracks, when this is a checkout: a file that is here but ignored (a bench's
    // results) is not in a clone.
    let tracked = std::process::Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(repo())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            o.stdout
                .split(|b| *b == 0)
                .filter(|f| !f.is_empty())
                .map(|f| repo().join(String::from_utf8_lossy(f).as_ref()))
                .collect::<Vec<PathBuf>>()
        });
    let in_clone = |p: &Path| -> bool {
        let Ok(p) = p.canonicalize() else { return false };
        match &tracked {
            Some(files) => files.iter().any(|f| f.starts_with(&p)),
            None => true,
        }
    };
    let mut wrong = Vec::new();
    let mut all = pages();
    all.push(repo().join("BENCHMARKS.md"));
    for page in all {
        let text = read(&page);
        let dir = page.parent().expect("a page's directory");
        for (i, _) in text.match_indices("](") {
            let rest = &text[i + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.starts_with("http") || target.starts_with('#') || target.contains(' ') {
                continue;
            }
            let file = target.split('#').next().unwrap_or_default();
            if !in_clone(&dir.join(file)) {
                wrong.push(format!("{}: ({target})", name(&page)));
            }
        }
    }
    assert!(wrong.is_empty(), "links to files a clone does not have:\n{}", wrong.join("\n"));
}

#[test]
fn the_readme_is_a_first_hours_read_in_the_order_a_user_needs() {
    let readme = read(&repo().join("README.md"));
    let lines = readme.lines().count();
    assert!(lines <= 320, "README.md is {lines} lines: move detail to docs/");
    let headings: Vec<&str> = readme.lines().filter_map(|l| l.strip_prefix("## ")).collect();
    let at = |h: &str| {
        headings
            .iter()
            .position(|x| x.starts_with(h))
            .unwrap_or_else(|| panic!("no section `## {h}`: {headings:?}"))
    };
    let order = [
        "Quick start",
        "Try it",
        "A walkthrough",
        "A stuck pod",
        "Install on a cluster",
        "Daily commands",
        "Exit codes",
    ];
    let positions: Vec<usize> = order.iter().map(|h| at(h)).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "sections out of order: {headings:?}");
    // Build, push, apply: in that order, before any `kubectl apply -k`.
    let install = readme.split("\n## Install on a cluster").nth(1).expect("install section");
    let build = install.find("docker build").expect("a build");
    let push = install.find("docker push").expect("a push");
    let apply = install.find("kubectl apply -k deploy/").expect("an apply");
    assert!(build < push && push < apply, "build, push, apply: in that order");
}
