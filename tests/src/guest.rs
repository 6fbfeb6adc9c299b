//! Running scenarios in the qemu guest (Debian's kernel with scsi_debug, dm-multipath, nbd, rbd;
//! see `tests/guest/README.md`) from Rust tests, with the agent binary inside it.
//!
//! Guest tests are named `root_guest_*`. They need root (to install qemu on first use), the
//! package mirror on a cold cache, and about 5-10 s per scenario.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `tests/guest/`.
pub fn guest_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("guest")
}

/// Checks that guest tests can run: fails in CI, skips with a reason elsewhere.
pub fn require_guest() -> bool {
    crate::require_real_kernel(&["strip", "timeout"])
}

/// Puts the agent and agentctl binaries (stripped), the shared libraries they need, and the
/// scenarios' shell library into `dir`, so that they run in the guest as
/// `/extra/bin/blockjanitor-agent`, `/extra/bin/agentctl`, `/extra/lib/mp-lib.sh` and
/// `/extra/lib/nvme-lib.sh`.
pub fn stage_agent(dir: &Path) {
    let agent = crate::agent_bin();
    for (bin, name) in [(agent.clone(), "blockjanitor-agent"), (agent.with_file_name("agentctl"), "agentctl")]
    {
        let out = Command::new(guest_dir().join("copy-binary-libs.sh"))
            .arg(&bin)
            .arg(dir)
            .arg(format!("/bin/{name}"))
            .output()
            .expect("copy-binary-libs.sh");
        assert!(out.status.success(), "copy-binary-libs.sh {name}: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new("strip").arg(dir.join("bin").join(name)).output().expect("strip");
        assert!(out.status.success(), "strip: {}", String::from_utf8_lossy(&out.stderr));
    }
    std::fs::create_dir_all(dir.join("lib")).expect("mkdir lib");
    for lib in ["mp-lib.sh", "nvme-lib.sh"] {
        std::fs::copy(guest_dir().join("scenario-lib").join(lib), dir.join("lib").join(lib))
            .unwrap_or_else(|e| panic!("copy {lib}: {e}"));
    }
}

/// The outcome of one scenario.
pub struct Run {
    pub code: Option<i32>,
    /// What the scenario printed (its stdout and stderr), ending with `GUEST-EXIT <code>`.
    pub output: String,
    /// Harness messages; on failure, the guest console's tail.
    pub harness: String,
}

impl Run {
    /// The outcome of a harness script (`run.sh`, `agent-scenario.sh`): its exit code, the
    /// scenario's output on stdout, the harness's on stderr.
    pub fn from_output(out: &Output) -> Self {
        Run {
            code: out.status.code(),
            output: String::from_utf8_lossy(&out.stdout).into_owned(),
            harness: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics with everything the guest said unless the scenario exited 0. The lines that tell
    /// why (the scenario's `FAIL`, each `rc=`, and the agent's refusals and errors) come first,
    /// so a log cut in the middle still shows them.
    pub fn assert_ok(&self) -> &Self {
        assert_eq!(
            self.code,
            Some(0),
            "guest scenario failed\n--- why ---\n{}\n--- scenario output ---\n{}\n--- harness and console ---\n{}",
            self.why(),
            self.output,
            self.harness
        );
        self
    }

    /// The lines of the output that say why a scenario failed.
    pub fn why(&self) -> String {
        const TELLING: [&str; 8] =
            ["FAIL", "rc=", "ERROR", "WARN", "refused", "error:", "INCOMPLETE", "unknown"];
        let lines: Vec<&str> =
            self.output.lines().filter(|l| TELLING.iter().any(|t| l.contains(t))).collect();
        let skip = lines.len().saturating_sub(40);
        lines[skip..].join("\n")
    }

    /// Section `name` parsed as JSON; fails the test with the section and the whole output when
    /// it is not JSON.
    pub fn json(&self, name: &str) -> serde_json::Value {
        let text = self.section(name);
        serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!("section {name} is not JSON ({e}):\n{text}\n--- output ---\n{}", self.output)
        })
    }

    /// Section `name` as one document of the CLIs' output model (`docs/schema/README.md`): fails
    /// the test unless it is JSON with `"schema_version": 1` and `"document": document`.
    pub fn document(&self, name: &str, document: &str) -> serde_json::Value {
        let v = self.json(name);
        check_document(&v, document, &format!("section {name}"));
        v
    }

    /// Section `name` as a `device` document (`holders DEVICE -o json`, `agentctl device`): the
    /// device's fields at the top level (`verdict`, `reasons`, `holders`, `multipath`, `scsi`...).
    pub fn device(&self, name: &str) -> serde_json::Value {
        self.document(name, "device")
    }

    /// Section `name` as a `devices` document (`scan -o json`); [`crate::find_device`] finds a
    /// device by name in it, [`scan_device`] by anything else.
    pub fn devices(&self, name: &str) -> serde_json::Value {
        self.document(name, "devices")
    }

    /// Every section that holds one document of the output model (a JSON object with a
    /// `document` field), by section name, in the order printed: what a test checks against the
    /// schema file. Other sections (text, a journal's JSON lines) are left out.
    pub fn documents(&self) -> Vec<(String, serde_json::Value)> {
        let mut names: Vec<&str> = Vec::new();
        for l in self.output.lines() {
            if let Some(name) = l.trim().strip_prefix("BEGIN ") {
                if !names.contains(&name) {
                    names.push(name);
                }
            }
        }
        names
            .into_iter()
            .filter_map(|name| {
                let v: serde_json::Value = serde_json::from_str(&self.section(name)).ok()?;
                v.get("document").is_some().then(|| (name.to_owned(), v))
            })
            .collect()
    }

    /// The lines between `BEGIN name` and `END name` markers the scenario printed.
    pub fn section(&self, name: &str) -> String {
        let begin = format!("BEGIN {name}");
        let end = format!("END {name}");
        let mut inside = false;
        let mut out = Vec::new();
        for l in self.output.lines() {
            if l.trim() == begin {
                inside = true;
            } else if l.trim() == end {
                break;
            } else if inside {
                out.push(l);
            }
        }
        out.join("\n")
    }
}

/// Boots the guest with `scenarios/<name>` and the agent staged under /extra.
pub fn run_scenario(name: &str) -> Run {
    run_scenario_within(name, None)
}

/// [`run_scenario`] for a scenario that needs longer than run.sh's default host timeout (120 s):
/// `timeout` seconds, unless `BLOCKJANITOR_GUEST_TIMEOUT` asks for more.
pub fn run_scenario_within(name: &str, timeout: Option<u64>) -> Run {
    run_scenario_with(name, timeout, |_| {})
}

/// [`run_scenario_within`], with `stage` putting more files into the staged `/extra/` (a helper
/// program built on the host, as `/extra/bin/NAME`).
pub fn run_scenario_with(name: &str, timeout: Option<u64>, stage: impl FnOnce(&Path)) -> Run {
    let extra = tempfile::tempdir().expect("tempdir");
    stage_agent(extra.path());
    stage(extra.path());
    let mut cmd = Command::new(guest_dir().join("run.sh"));
    if let Some(t) = timeout {
        let asked = std::env::var("BLOCKJANITOR_GUEST_TIMEOUT").ok().and_then(|v| v.parse::<u64>().ok());
        cmd.env("BLOCKJANITOR_GUEST_TIMEOUT", asked.unwrap_or(0).max(t).to_string());
    }
    let out: Output = cmd
        .arg(guest_dir().join("scenarios").join(name))
        .arg(extra.path())
        .stdin(Stdio::null())
        .output()
        .expect("run.sh");
    Run::from_output(&out)
}

/// Fails the test unless `v` is the output model's document `document` of schema version 1
/// (`what` names where it came from).
pub fn check_document(v: &serde_json::Value, document: &str, what: &str) {
    assert!(
        v["schema_version"] == 1 && v["document"] == document,
        "{what}: not a version 1 '{document}' document (schema_version {}, document {}):\n{v:#}",
        v["schema_version"],
        v["document"]
    );
}

/// The device of a `devices` document (`scan -o json`) that `matches` (by name:
/// [`crate::find_device`]); fails the test naming `what` (and showing the document) when none
/// does.
pub fn scan_device<'a>(
    scan: &'a serde_json::Value,
    what: &str,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> &'a serde_json::Value {
    scan["devices"]
        .as_array()
        .unwrap_or_else(|| panic!("no devices list in {scan:#}"))
        .iter()
        .find(|d| matches(d))
        .unwrap_or_else(|| panic!("no {what} in {scan:#}"))
}
