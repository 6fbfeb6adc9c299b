//! The daemon's configuration: a TOML file, with command-line flags that override it.
//!
//! ```toml
//! node_name = "worker-3"                 # default: the host name
//! rescan_interval_seconds = 60           # slow periodic rescan; uevents and mount changes wake it sooner
//! full_read_every = 10                   # every Nth full scan reads every process's files in full;
//!                                        # the others keep a process's last read while its start
//!                                        # time, fd count and memory size are the same (1: always)
//! grace_period_seconds = 300             # unheld this long, across scans, before "stale"
//! unresponsive_after_seconds = 10        # I/O in flight and none completing this long: "unresponsive"
//! journal = "/var/lib/blockjanitor/journal.jsonl"
//! protected_devices = ["sda"]            # never touched, in addition to those behind protected_paths
//! protected_paths = ["/", "/var/lib/kubelet", "/var/lib/containerd", "/var/lib/docker", "/var/lib/containers"]
//! mode = "report"                        # report | release | clean (what it does by itself)
//! max_actions_per_minute = 6             # destructive steps a minute in release/clean mode (a
//!                                        # plan runs whole: a bigger one waits for an empty minute)
//! kubelet_dir = "/var/lib/kubelet"
//! plans_per_minute_per_client = 60       # Plan calls (each a fresh scan) a minute per caller; 0: no limit
//! applies_per_minute_per_client = 30     # Apply calls a minute per person over TCP (the console's
//!                                        # each apart; root on the socket is not limited); 0: none
//! cap_device_events = true               # at most one holders/verdict event per device a second
//!                                        # (a change less than a second after the device's last
//!                                        # event is folded into one sent when the second is up);
//!                                        # false (or `serve --no-cap-device-events`): every change at once
//!
//! [socket]
//! path = "/run/blockjanitor/agent.sock"  # created 0660
//! group = "blockjanitor"                 # group of the socket: its members are viewers; root is operator
//!
//! [tcp]                                  # optional; only ever with mutual TLS
//! listen = "0.0.0.0:9443"
//! cert = "/etc/blockjanitor/tls/tls.crt"
//! key = "/etc/blockjanitor/tls/tls.key"
//! client_ca = "/etc/blockjanitor/tls/ca.crt"
//! operators = ["alice", "bob"]          # client certificate DNS SAN or CN: one per person, never
//!                                        # a certificate a team shares (the audit names it)
//! consoles = ["console.blockjanitor.svc"]    # the fleet console: reads; Apply on behalf of a person
//! viewers = ["dashboard"]
//!
//! [metrics]
//! listen = "127.0.0.1:9910"              # /metrics over plain HTTP
//!
//! [health]                               # optional; for kubelet's `grpc` probes, which speak no TLS
//! listen = "0.0.0.0:9911"                # grpc.health.v1.Health only, plain text: nothing else is served
//!
//! [kubernetes]                           # optional; in-cluster service account by default
//! kubeconfig = "/etc/blockjanitor/kubeconfig"
//! silence_bound_seconds = 90             # a watch silent this long (no event, no bookmark) cannot vouch
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// A configuration that cannot be used, saying what and where.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The parts of a config directory: its `*.toml` files (symlinks followed, as a ConfigMap's keys
/// are; names starting with `.` passed over, as a ConfigMap's `..data` is), by name.
fn config_parts(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let entries =
        std::fs::read_dir(dir).map_err(|source| ConfigError::Read { path: dir.to_owned(), source })?;
    let mut parts = Vec::new();
    for e in entries {
        let e = e.map_err(|source| ConfigError::Read { path: dir.to_owned(), source })?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".toml") || !e.path().is_file() {
            continue;
        }
        parts.push(e.path());
    }
    parts.sort();
    if parts.is_empty() {
        return Err(ConfigError::Invalid(format!("{} holds no *.toml file", dir.display())));
    }
    Ok(parts)
}

/// Merges `from` into `into`: tables key by key, anything else replaced.
fn merge_table(into: &mut toml::Table, from: toml::Table) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(toml::Value::Table(a)), toml::Value::Table(b)) => merge_table(a, b),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

/// `[socket]`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SocketConfig {
    #[serde(default = "default_socket")]
    pub path: PathBuf,
    /// Group name or numeric GID owning the socket; members are viewers.
    pub group: Option<String>,
}

/// `[tcp]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TcpConfig {
    pub listen: Option<SocketAddr>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub client_ca: Option<PathBuf>,
    /// Client identities (DNS SAN or CN) with the operator role: one per person (each gets a
    /// certificate of their own, so the audit names who acted).
    #[serde(default)]
    pub operators: Vec<String>,
    /// Client identities with the viewer role.
    #[serde(default)]
    pub viewers: Vec<String>,
    /// Client identities with the console role: read, and Apply on behalf of an operator the
    /// console names (recorded in the audit log).
    #[serde(default)]
    pub consoles: Vec<String>,
}

/// `[metrics]`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    pub listen: Option<SocketAddr>,
}

/// `[health]`: the gRPC health service alone, without TLS, on its own address (kubelet's native
/// `grpc` probe cannot present a client certificate, and cannot reach a unix socket).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    pub listen: Option<SocketAddr>,
}

/// What the daemon does by itself.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Report only (the default): changes are made only when an operator asks (Apply).
    #[default]
    Report,
    /// Also detach, by itself, mounts in other namespaces of volumes kubelet has let go of.
    Release,
    /// Also tear down, by itself, every device judged stale, and remove every removable orphaned
    /// pod volume directory (`rmdir`, [`crate::engine::dir_workflow`]).
    Clean,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Report => "report",
            Self::Release => "release",
            Self::Clean => "clean",
        }
    }
}

/// `[kubernetes]`: where the API is. Without this section the agent uses the in-cluster service
/// account; with none (not in a cluster), the daemon cannot vouch for any device a PV could own
/// until `enabled = false` says to go on without the API.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct KubernetesConfig {
    /// `false` turns the API off, even in a cluster: verdicts rest on the node's evidence alone
    /// (every report says so).
    pub enabled: Option<bool>,
    /// Who turned it off (`--no-kubernetes`), for the reports; not a key of the file.
    #[serde(skip)]
    pub off_by: Option<String>,
    /// An explicit API URL (tests, proxies).
    pub url: Option<String>,
    pub kubeconfig: Option<PathBuf>,
    /// How long one watch (or the Node lookup) may go without hearing from the API server
    /// before the view stops vouching (default 90: see `kube::DEFAULT_SILENCE_BOUND`).
    pub silence_bound_seconds: Option<u64>,
}

/// The whole configuration.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub node_name: Option<String>,
    #[serde(default = "default_rescan")]
    pub rescan_interval_seconds: u64,
    /// Every this many full scans, every process's files are read in full (the others keep a
    /// process's last read while its signs of change are the same: `snapshot::process_read_cache`).
    #[serde(default = "default_full_read_every")]
    pub full_read_every: u64,
    #[serde(default = "default_grace")]
    pub grace_period_seconds: u64,
    /// A device with I/O in flight and none completing for this long is unresponsive.
    #[serde(default = "default_unresponsive_after")]
    pub unresponsive_after_seconds: u64,
    #[serde(default = "default_journal")]
    pub journal: PathBuf,
    #[serde(default)]
    pub protected_devices: Vec<String>,
    #[serde(default = "default_protected_paths")]
    pub protected_paths: Vec<PathBuf>,
    /// The kubelet directory, as the host sees it.
    #[serde(default = "default_kubelet_dir")]
    pub kubelet_dir: PathBuf,
    #[serde(default)]
    pub socket: SocketConfig,
    #[serde(default)]
    pub tcp: TcpConfig,
    #[serde(default)]
    pub metrics: MetricsConfig,
    #[serde(default)]
    pub health: HealthConfig,
    #[serde(default)]
    pub mode: Mode,
    /// At most this many destructive steps per minute in release and clean modes.
    #[serde(default = "default_actions_per_minute")]
    pub max_actions_per_minute: u32,
    /// Plan calls (each scans its devices afresh) a minute per caller; 0: no limit.
    #[serde(default = "default_plans_per_minute")]
    pub plans_per_minute_per_client: u32,
    /// Apply calls a minute per person over TCP (the console's forwarded ones counted per person
    /// it names; root on the socket is not limited); 0: no limit.
    #[serde(default = "default_applies_per_minute")]
    pub applies_per_minute_per_client: u32,
    /// At most one holders/verdict event per device a second on the watch stream, a churning
    /// device's changes folded into the next (`daemon::event_rate`). On by default: a device's
    /// first change after a quiet second goes at once; a change less than a second after its
    /// previous event reaches watchers up to a second late, folded with the others.
    #[serde(default = "default_cap_device_events")]
    pub cap_device_events: bool,
    #[serde(default)]
    pub kubernetes: KubernetesConfig,
    /// PID 1 cannot be inspected on this machine (a sandbox supervisor or an LSM shields it even
    /// from root): trust that it holds no device instead of treating it as a blind spot that
    /// makes every cleanup candidate `unknown`. Never needed on a normal node.
    #[serde(default)]
    pub trust_unreadable_init: bool,
}

fn default_socket() -> PathBuf {
    PathBuf::from("/run/blockjanitor/agent.sock")
}
fn default_rescan() -> u64 {
    60
}
fn default_full_read_every() -> u64 {
    crate::snapshot::process_read_cache::DEFAULT_FULL_READ_EVERY
}
fn default_grace() -> u64 {
    300
}
fn default_unresponsive_after() -> u64 {
    crate::judge::stall::DEFAULT_THRESHOLD.as_secs()
}
fn default_journal() -> PathBuf {
    PathBuf::from(crate::act::journal::DEFAULT_PATH)
}
fn default_actions_per_minute() -> u32 {
    6
}
fn default_cap_device_events() -> bool {
    true
}

fn default_plans_per_minute() -> u32 {
    60
}
fn default_applies_per_minute() -> u32 {
    30
}
fn default_kubelet_dir() -> PathBuf {
    PathBuf::from(crate::discover::kubelet::DEFAULT_KUBELET_DIR)
}
fn default_protected_paths() -> Vec<PathBuf> {
    crate::host::DEFAULT_PROTECTED_PATHS.iter().map(PathBuf::from).collect()
}

impl Default for SocketConfig {
    fn default() -> Self {
        Self { path: default_socket(), group: None }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            node_name: None,
            rescan_interval_seconds: default_rescan(),
            full_read_every: default_full_read_every(),
            grace_period_seconds: default_grace(),
            unresponsive_after_seconds: default_unresponsive_after(),
            journal: default_journal(),
            protected_devices: Vec::new(),
            protected_paths: default_protected_paths(),
            kubelet_dir: default_kubelet_dir(),
            socket: SocketConfig::default(),
            tcp: TcpConfig::default(),
            metrics: MetricsConfig::default(),
            health: HealthConfig::default(),
            mode: Mode::Report,
            max_actions_per_minute: default_actions_per_minute(),
            plans_per_minute_per_client: default_plans_per_minute(),
            applies_per_minute_per_client: default_applies_per_minute(),
            cap_device_events: default_cap_device_events(),
            kubernetes: KubernetesConfig::default(),
            trust_unreadable_init: false,
        }
    }
}

impl Config {
    /// Parses a TOML text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_owned(),
            message: e.to_string().replace('\n', " ").trim().to_owned(),
        })
    }

    /// Reads and parses a config file, or a directory of parts: every `*.toml` file in it (not
    /// hidden), in name order, merged key by key (a table merges into the table of the same
    /// name, any other value replaces the earlier one). So the parts a deployment's base, its
    /// mode and its Components each ship (the ConfigMap's keys, mounted as a directory) combine,
    /// and none replaces the others whole.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let read = |p: &Path| {
            std::fs::read_to_string(p).map_err(|source| ConfigError::Read { path: p.to_owned(), source })
        };
        let meta =
            std::fs::metadata(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        if !meta.is_dir() {
            return Self::parse(&read(path)?, path);
        }
        let parts = config_parts(path)?;
        let mut merged = toml::Table::new();
        for part in &parts {
            let table: toml::Table = toml::from_str(&read(part)?).map_err(|e| ConfigError::Parse {
                path: part.clone(),
                message: e.to_string().replace('\n', " ").trim().to_owned(),
            })?;
            merge_table(&mut merged, table);
        }
        let names: Vec<String> =
            parts.iter().filter_map(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned()).collect();
        merged.try_into().map_err(|e: toml::de::Error| ConfigError::Parse {
            path: path.to_owned(),
            message: format!(
                "{} (parts merged: {})",
                e.to_string().replace('\n', " ").trim(),
                names.join(", ")
            ),
        })
    }

    /// Checks what serde cannot: TCP only with the three TLS files, sane intervals.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.tcp;
        if t.listen.is_some() && (t.cert.is_none() || t.key.is_none() || t.client_ca.is_none()) {
            return Err(ConfigError::Invalid(
                "a TCP listener needs mutual TLS: set tcp.cert, tcp.key and tcp.client_ca (--tls-cert, --tls-key, --tls-client-ca)"
                    .into(),
            ));
        }
        if t.listen.is_some() && t.operators.is_empty() && t.viewers.is_empty() && t.consoles.is_empty() {
            return Err(ConfigError::Invalid(
                "a TCP listener with no client identities would refuse everyone: set tcp.operators and/or tcp.viewers".into(),
            ));
        }
        if self.rescan_interval_seconds == 0 {
            return Err(ConfigError::Invalid("rescan_interval_seconds must be at least 1".into()));
        }
        if self.full_read_every == 0 {
            return Err(ConfigError::Invalid(
                "full_read_every must be at least 1 (1: every full scan reads every process in full)".into(),
            ));
        }
        if self.unresponsive_after_seconds == 0 {
            return Err(ConfigError::Invalid(
                "unresponsive_after_seconds must be at least 1 (I/O in flight for an instant is normal)"
                    .into(),
            ));
        }
        if self.socket.path.as_os_str().is_empty() {
            return Err(ConfigError::Invalid("socket.path is empty".into()));
        }
        Ok(())
    }

    pub fn rescan_interval(&self) -> Duration {
        Duration::from_secs(self.rescan_interval_seconds)
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_secs(self.grace_period_seconds)
    }

    pub fn unresponsive_after(&self) -> Duration {
        Duration::from_secs(self.unresponsive_after_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config directory as a ConfigMap mounts it: each key a symlink into `..data`, the
    /// parts of the base, a mode overlay and the tls Component merged, none replacing another.
    #[test]
    fn a_directory_of_parts_merges_them_in_name_order() {
        let d = tempfile::tempdir().expect("tempdir");
        let data = d.path().join("..2026_12_07_00_00_00.1");
        std::fs::create_dir(&data).expect("mkdir");
        std::os::unix::fs::symlink(&data, d.path().join("..data")).expect("symlink");
        let part = |name: &str, text: &str| {
            std::fs::write(data.join(name), text).expect("write");
            std::os::unix::fs::symlink(format!("..data/{name}"), d.path().join(name)).expect("symlink");
        };
        part(
            "00-agent.toml",
            "mode = \"report\"\nmax_actions_per_minute = 6\n[socket]\npath = \"/run/x.sock\"\n",
        );
        part("50-mode.toml", "mode = \"clean\"\nmax_actions_per_minute = 4\n");
        part(
            "60-tls.toml",
            "[tcp]\nlisten = \"0.0.0.0:9443\"\ncert = \"/c\"\nkey = \"/k\"\nclient_ca = \"/ca\"\nviewers = [\"v\"]\n",
        );
        part("README", "not a part");
        let c = Config::load(d.path()).expect("loads");
        assert_eq!(c.mode, Mode::Clean, "the mode part wins over the base");
        assert_eq!(c.max_actions_per_minute, 4);
        assert_eq!(c.socket.path, Path::new("/run/x.sock"), "the base's table is kept");
        assert_eq!(c.tcp.listen.map(|a| a.port()), Some(9443), "the tls part adds its table");
        c.validate().expect("valid");

        part("70-typo.toml", "mdoe = \"clean\"\n");
        let e = Config::load(d.path()).expect_err("an unknown key is an error").to_string();
        assert!(e.contains("mdoe") && e.contains("70-typo.toml"), "{e}");
        std::fs::remove_file(d.path().join("70-typo.toml")).expect("rm");
        part("80-broken.toml", "mode = \n");
        let e = Config::load(d.path()).expect_err("a broken part").to_string();
        assert!(e.contains("80-broken.toml"), "names the part: {e}");
        let empty = tempfile::tempdir().expect("tempdir");
        assert!(Config::load(empty.path()).expect_err("no part").to_string().contains("no *.toml"));
    }

    #[test]
    fn full_example_parses() {
        let text = r#"
node_name = "worker-3"
rescan_interval_seconds = 30
protected_devices = ["sda"]
[socket]
path = "/tmp/x.sock"
group = "blockjanitor"
[tcp]
listen = "127.0.0.1:9443"
cert = "/c"
key = "/k"
client_ca = "/ca"
operators = ["console"]
consoles = ["console.blockjanitor.svc"]
[metrics]
listen = "127.0.0.1:9910"
[health]
listen = "0.0.0.0:9911"
"#;
        let c = Config::parse(text, Path::new("t.toml")).expect("parses");
        c.validate().expect("valid");
        assert_eq!(c.health.listen, Some("0.0.0.0:9911".parse().expect("addr")));
        assert_eq!(c.node_name.as_deref(), Some("worker-3"));
        assert_eq!(c.grace_period(), Duration::from_secs(300));
        assert_eq!(c.tcp.operators, vec!["console"]);
        assert_eq!(c.tcp.consoles, vec!["console.blockjanitor.svc"]);
    }

    /// The example in docs/daemon.md is a working config (keys after a `[table]` header belong to
    /// that table: an easy way to write a config that does not load).
    #[test]
    fn readme_example_parses() {
        let readme = include_str!("../../docs/daemon.md");
        let start = readme.find("```toml\n").expect("a toml block in docs/daemon.md") + 8;
        let end = start + readme[start..].find("```").expect("end of the block");
        let c = Config::parse(&readme[start..end], Path::new("docs/daemon.md"))
            .expect("the example in docs/daemon.md parses");
        c.validate().expect("and is valid");
        assert_eq!(c.mode, Mode::Report);
        assert_eq!(c.kubernetes.kubeconfig.as_deref(), Some(Path::new("/etc/blockjanitor/kubeconfig")));
    }

    /// The per-device event cap is on unless a config turns it off.
    #[test]
    fn the_event_cap_is_on_unless_turned_off() {
        assert!(Config::default().cap_device_events);
        let parse = |t: &str| Config::parse(t, Path::new("a.toml")).expect("parses").cap_device_events;
        assert!(parse(""));
        assert!(!parse("cap_device_events = false"));
        assert!(parse("cap_device_events = true"));
    }

    #[test]
    fn full_read_every_defaults_and_must_be_positive() {
        let parse = |t: &str| Config::parse(t, Path::new("a.toml")).expect("parses");
        assert_eq!(parse("").full_read_every, crate::snapshot::process_read_cache::DEFAULT_FULL_READ_EVERY);
        assert_eq!(parse("full_read_every = 1").full_read_every, 1);
        let e = parse("full_read_every = 0").validate().expect_err("zero");
        assert!(e.to_string().contains("full_read_every must be at least 1"), "{e}");
    }

    #[test]
    fn errors_name_the_problem() {
        let e = Config::parse("rescan_interval_seconds = \"soon\"", Path::new("a.toml")).expect_err("type");
        assert!(e.to_string().starts_with("config a.toml:"), "{e}");
        let e = Config::parse("[socket]\npaht = \"/x\"", Path::new("a.toml")).expect_err("typo");
        assert!(e.to_string().contains("paht"), "{e}");
        let c = Config::parse("[tcp]\nlisten = \"127.0.0.1:1\"\noperators=[\"x\"]", Path::new("a.toml"))
            .expect("parses");
        let e = c.validate().expect_err("no tls");
        assert!(e.to_string().contains("mutual TLS"), "{e}");
        assert!(Config::parse("[tcp]\nlisten = \"nonsense\"", Path::new("a.toml")).is_err());
    }
}
