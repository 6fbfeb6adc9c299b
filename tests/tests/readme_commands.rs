//! The README's commands, run exactly as it writes them (read from README.md at run time), from the
//! repository's root:
//!
//! - the main job, `./scripts/scan.sh` (Quick start), changes no installed Debian package: `dpkg`
//!   before and after, every package installed before keeps its version and every package new
//!   after is one the script named as installing. Under `CI=true` the test first removes the
//!   headers the script installs when missing (`libudev-dev`), so that its install path runs as
//!   on a fresh machine (and puts them back if the script did not);
//! - the image build ("Install on a cluster": `cargo build --release`, `strip`, `docker build
//!   --target runtime-prebuilt ... .` with the repository as context and its `.dockerignore`),
//!   against podman's Docker-compatible API with the bookworm image made here standing in for
//!   `debian:bookworm-slim` (Docker Hub cannot be reached); the image then runs each of its three
//!   binaries.
//!
//! Both need root; the image build needs podman, runc, the docker client and strip (and
//! mmdebstrap once, for the base image). `CI=true` fails when one is missing. The two share one
//! release build (`scan.sh` builds every binary, as the image build does).

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Command, Stdio};

use blockjanitor_tests::container::{podman, DockerEngine, ULIMITS};
use blockjanitor_tests::deploy::{on_path, repo};
use blockjanitor_tests::readme::{commands, sh_block};
use blockjanitor_tests::{require, serial, text, Scratch};

fn missing_tools(tools: &[&str]) -> Vec<String> {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root".to_owned());
    }
    missing.extend(tools.iter().filter(|t| on_path(t).is_none()).map(|t| format!("the {t} command")));
    missing
}

fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Installed packages (`ii`) by name (with architecture) and version.
fn installed() -> BTreeMap<String, String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f", "${binary:Package}\t${Version}\t${db:Status-Abbrev}\n"])
        .output()
        .expect("dpkg-query");
    assert!(out.status.success(), "dpkg-query: {}", text(&out.stderr));
    text(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (p, v, s) = (f.next()?, f.next()?, f.next()?);
            s.starts_with("ii").then(|| (p.to_owned(), v.to_owned()))
        })
        .collect()
}

/// A package's name without its architecture.
fn name(package: &str) -> &str {
    package.split(':').next().unwrap_or(package)
}

/// The packages a script's output says it installs (`WHO: installing A B (asked for: ...)`,
/// scripts/lib.sh), by name.
fn named_as_installed(output: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|l| l.split_once(": installing ").map(|(_, rest)| rest))
        .flat_map(|rest| rest.split(" (asked for").next().unwrap_or("").split_whitespace())
        .map(|p| name(p.split('=').next().unwrap_or(p)).to_owned())
        .collect()
}

/// Puts back the headers the test removed if the script under test did not (so a failed run does
/// not leave the machine without them).
struct Reinstall(Vec<String>);

impl Drop for Reinstall {
    fn drop(&mut self) {
        let now = installed();
        let gone: Vec<&String> =
            self.0.iter().filter(|p| !now.keys().any(|k| name(k) == p.as_str())).collect();
        if !gone.is_empty() {
            let _ = Command::new("apt-get")
                .args(["install", "-y", "-qq", "--no-install-recommends", "--no-upgrade"])
                .args(gone)
                .env("DEBIAN_FRONTEND", "noninteractive")
                .status();
        }
    }
}

#[test]
fn root_readme_main_command_changes_no_installed_package() {
    if !require("the README main-command test", &missing_tools(&["dpkg-query", "apt-get", "cargo"])) {
        return;
    }
    let _serial = serial();
    let block = sh_block("Quick start");
    let main = commands(&block)[0];
    assert_eq!(main, "./scripts/scan.sh", "the README's main command changed:\n{block}");

    let before = installed();
    // As on a fresh machine: without the headers the build needs, so the script installs them.
    let remove: Vec<String> = if ci() && before.keys().any(|p| name(p) == "libudev-dev") {
        vec!["libudev-dev".to_owned()]
    } else {
        Vec::new()
    };
    let _reinstall = Reinstall(remove.clone());
    if !remove.is_empty() {
        let st = Command::new("apt-get")
            .args(["remove", "-y", "-qq"])
            .args(&remove)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .expect("apt-get remove");
        assert!(st.success(), "apt-get remove {remove:?} failed");
    }

    let out = Command::new("bash")
        .args(["-c", main])
        .current_dir(repo())
        .stdin(Stdio::null())
        .output()
        .expect("run the main command");
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let code = out.status.code();
    // scan: 0, or 3 when the view is incomplete (README "Exit codes").
    assert!(matches!(code, Some(0 | 3)), "`{main}` exited {code:?}:\n{stdout}\n{stderr}");
    assert!(stdout.contains(" block devices ("), "`{main}` printed no scan summary:\n{stdout}\n{stderr}");

    let after = installed();
    let named = named_as_installed(&format!("{stdout}\n{stderr}"));
    for p in &remove {
        assert!(named.contains(p), "`{main}` did not say it installs {p} (removed before it ran):\n{stderr}");
    }
    let changed: Vec<String> = before
        .iter()
        .filter_map(|(p, v)| match after.get(p) {
            Some(now) if now != v => Some(format!("{p} {v} -> {now}")),
            None => Some(format!("{p} {v} -> removed")),
            _ => None,
        })
        .collect();
    let unnamed: Vec<String> = after
        .iter()
        .filter(|(p, _)| !before.contains_key(*p) && !named.contains(name(p)))
        .map(|(p, v)| format!("{p} {v}"))
        .collect();
    assert!(
        changed.is_empty() && unnamed.is_empty(),
        "`{main}` changed installed packages: {changed:?}; installed without naming them: {unnamed:?}\n\
         (it named {named:?})\n{stderr}"
    );
    eprintln!(
        "`{main}` exited {code:?}; {} packages before and after, the same versions; it named {named:?} as installed",
        after.len()
    );
}

/// The image a README command tags (`-t NAME`), removed on drop.
struct Image(String);

impl Drop for Image {
    fn drop(&mut self) {
        let _ = podman().args(["rmi", "-f", &self.0]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

#[test]
fn root_readme_image_build_runs_as_written() {
    let mut tools = vec!["podman", "runc", "docker", "strip", "cargo"];
    let base_cached = on_path("podman").is_some()
        && blockjanitor_tests::container::image_exists(blockjanitor_tests::container::BASE_IMAGE);
    if !base_cached {
        tools.push("mmdebstrap");
    }
    if !require("the README image-build test", &missing_tools(&tools)) {
        return;
    }
    let _serial = serial();
    let block = sh_block("Install on a cluster");
    let build = commands(&block)
        .into_iter()
        .find(|c| c.starts_with("docker build"))
        .unwrap_or_else(|| panic!("the README's image block has no `docker build`:\n{block}"));
    let tag = build
        .split_whitespace()
        .skip_while(|w| *w != "-t")
        .nth(1)
        .unwrap_or_else(|| panic!("`{build}` names no image (-t)"));
    let image = Image(tag.to_owned());

    let s = Scratch::new();
    let engine = DockerEngine::start(s.dir.path());
    let out = Command::new("bash")
        .args(["-euo", "pipefail", "-c", &block])
        .current_dir(repo())
        .env("DOCKER_HOST", engine.host())
        .stdin(Stdio::null())
        .output()
        .expect("run the README's image build");
    assert!(
        out.status.success(),
        "the README's image build failed ({:?}):\n{block}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    );

    // The image runs each of its binaries (the agent is the entrypoint).
    for bin in ["blockjanitor-agent", "agentctl", "blockjanitor-console"] {
        let mut c = podman();
        c.args(["run", "--rm", "--network", "none"]).args(ULIMITS).args([
            "--entrypoint",
            &format!("/usr/local/bin/{bin}"),
            &image.0,
            "--version",
        ]);
        let v = c.output().expect("podman run");
        let said = text(&v.stdout);
        assert!(
            v.status.success() && said.contains(bin) && said.contains(env!("CARGO_PKG_VERSION")),
            "{bin} --version in {}: {:?}\n{said}{}",
            image.0,
            v.status.code(),
            text(&v.stderr)
        );
    }
    let size =
        podman().args(["image", "inspect", "--format", "{{.Size}}", &image.0]).output().expect("inspect");
    eprintln!("built {} as the README writes it: {} bytes", image.0, text(&size.stdout).trim());
}
