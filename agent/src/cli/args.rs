//! The agent binary's flags, commands and help text (clap).

use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

/// Exit code of a scan or a holders report that could not see everything (a blind spot); of a
/// held device (`holders`, as `fuser -s` tells a script). One table for both CLIs.
pub use blockjanitor_rpc::view::exit::{HELD as EXIT_HELD, UNKNOWN as EXIT_UNKNOWN};

/// The top-level help's examples, then the exit-code table both CLIs share.
fn after_help() -> String {
    let examples = "EXAMPLES:\n  blockjanitor-agent scan\n  blockjanitor-agent holders /dev/rbd3 --output json\n  \
blockjanitor-agent release /dev/loop3            # dry run: print the plan\n  blockjanitor-agent release /dev/loop3 --apply    \
# detach foreign-namespace mounts\n  blockjanitor-agent clean loop3 --apply           # detach an unheld loop device\n  \
blockjanitor-agent --root /host holders 7:3      # in a pod that mounts the host at /host\n\n";
    format!("{examples}{}", blockjanitor_rpc::view::exit::help_section())
}

#[derive(Parser, Debug)]
#[command(
    name = "blockjanitor-agent",
    version,
    about = "Find who holds each block device on this node, in every mount namespace, and release stale holders safely.",
    long_about = "Find who holds each block device on this node: mounts in every mount namespace (with the \
process, container and pod living there), open file descriptors, working directories, memory maps, swap, \
devices stacked on top and loop devices backed by it. Kernel threads such as jbd2/loop0-8 are shown as \
symptoms, not holders.\n\nNothing is changed unless you pass --apply. Every change is journaled before and \
after it runs and logged as one audit line.",
    after_help = after_help()
)]
pub struct Cli {
    /// Print nothing on stdout: a script reads the exit code alone (errors and warnings still go
    /// to stderr).
    #[arg(long, short = 'q', global = true, help_heading = "Output")]
    pub quiet: bool,
    /// Output format: `table` and `wide` for people, `json` and `yaml` the v1 schema's
    /// documents (as agentctl's -o).
    #[arg(long, short = 'o', global = true, help_heading = "Output", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// The host's root; /proc, /sys and /dev are looked for under it.
    #[arg(long, global = true, help_heading = "Host", default_value = "/", value_name = "DIR")]
    pub root: PathBuf,
    /// Where the host's procfs is (default: ROOT/proc).
    #[arg(long, global = true, help_heading = "Host", value_name = "DIR")]
    pub proc: Option<PathBuf>,
    /// Where the host's sysfs is (default: ROOT/sys).
    #[arg(long, global = true, help_heading = "Host", value_name = "DIR")]
    pub sys: Option<PathBuf>,
    /// Where the host's /dev is (default: ROOT/dev).
    #[arg(long, global = true, help_heading = "Host", value_name = "DIR")]
    pub dev: Option<PathBuf>,
    /// Journal of destructive steps, written before and after each step
    /// [default: /var/lib/blockjanitor/journal.jsonl, or the config's `journal` for serve].
    #[arg(long, global = true, help_heading = "State and journal", value_name = "FILE")]
    pub journal: Option<PathBuf>,
    /// Seconds a device must stay a cleanup candidate (unheld mapping, map with every path
    /// failed, offline disk), across runs, before it is stale.
    #[arg(
        long,
        global = true,
        help_heading = "State and journal",
        default_value_t = 300,
        value_name = "SECONDS"
    )]
    pub grace_period: u64,
    /// Where the one-shot commands remember since when each candidate was seen, so the grace
    /// period spans runs. Not written for fixture trees.
    #[arg(
        long,
        global = true,
        help_heading = "State and journal",
        default_value = "/var/lib/blockjanitor/state.json",
        value_name = "FILE"
    )]
    pub state: PathBuf,
    /// Where `holders` and `scan` keep what `statmount` said of each mount between runs (this
    /// boot's only; never read by a command that acts, nor by the daemon, which writes it after
    /// each full scan that learned something, so a one-shot run on its node starts warm).
    /// Empty: keep none.
    #[arg(
        long,
        global = true, help_heading = "State and journal",
        default_value = crate::engine::requests::setup::STATMOUNT_MEMO,
        value_name = "FILE",
        value_parser = clap::builder::TypedValueParser::map(clap::builder::OsStringValueParser::new(), PathBuf::from)
    )]
    pub statmount_memo: PathBuf,
    /// Seconds between scans: the daemon rescans at least this often, and a grace clock keeps
    /// running only while observations are at most twice this apart (for the one-shot commands:
    /// between runs) [default: 60, or the config's for serve].
    #[arg(long, global = true, help_heading = "State and journal", value_name = "SECONDS")]
    pub rescan_interval: Option<u64>,
    /// Deadline for each kernel call that may block on a device, in seconds.
    #[arg(long, global = true, help_heading = "Host", default_value_t = 10, value_name = "SECONDS")]
    pub timeout: u64,
    /// The kubelet directory, as the host sees it (its volumes name each device's PV and pods)
    /// [default: /var/lib/kubelet, or the config's `kubelet_dir` for serve].
    #[arg(long, global = true, help_heading = "Host", value_name = "DIR")]
    pub kubelet_dir: Option<PathBuf>,
    /// How mount tables are read: `auto` checks each namespace with listmount/statmount (Linux
    /// 6.8+) and reads mountinfo text only where a wanted device is mounted; `mountinfo` reads the
    /// text of every namespace.
    #[arg(long, global = true, help_heading = "Host", value_enum, default_value_t = ReaderArg::Auto)]
    pub mount_reader: ReaderArg,
    /// PID 1 cannot be inspected on this machine (a sandbox supervisor or an LSM shields it even
    /// from root): trust that it holds no device. Without this, PID 1 is a blind spot and every
    /// cleanup candidate is `unknown`. Never needed on a normal node.
    #[arg(
        long,
        global = true, help_heading = "Host",
        env = "BLOCKJANITOR_TRUST_UNREADABLE_INIT",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub trust_unreadable_init: bool,
    /// Seconds an --apply run waits for another run (or the daemon) writing the same journal
    /// before it refuses, naming that run's pid.
    #[arg(
        long,
        global = true,
        help_heading = "State and journal",
        default_value_t = 30,
        value_name = "SECONDS"
    )]
    pub lock_wait: u64,
    /// Log format on stderr (audit lines included).
    #[arg(long, global = true, help_heading = "Output", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Do not ask the Kubernetes API: verdicts rest on this node's evidence alone (every report
    /// says so). Without it, the API is asked when configured (--kube-url, --kubeconfig) or in a
    /// cluster (a service-account token), and an API that cannot be reached makes every device
    /// a PV could own `unknown` (the daemon also when none is configured).
    #[arg(long, global = true, help_heading = "Kubernetes", conflicts_with_all = ["kube_url", "kubeconfig"])]
    pub no_kubernetes: bool,
    /// Kubernetes API URL (otherwise --kubeconfig, or the in-cluster service account).
    #[arg(long, global = true, help_heading = "Kubernetes", value_name = "URL")]
    pub kube_url: Option<String>,
    /// Kubeconfig file for the Kubernetes API (its current context).
    #[arg(long, global = true, help_heading = "Kubernetes", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name, as the Kubernetes API knows it (its pods, attachments and Node)
    /// [default: $NODE_NAME, else the config's `node_name`, else the host name].
    #[arg(long, global = true, help_heading = "Kubernetes", env = "NODE_NAME", value_name = "NAME")]
    pub node_name: Option<String>,
    /// Seconds one Kubernetes watch (or the Node lookup) may go without hearing from the API
    /// server before the view stops vouching [default: 90].
    #[arg(long, global = true, help_heading = "Kubernetes", value_name = "SECONDS")]
    pub kube_silence_bound_seconds: Option<u64>,
    /// Seconds a one-shot run waits for the Kubernetes API's view to be complete before it
    /// judges (an incomplete view makes devices a PV could own `unknown`).
    #[arg(long, global = true, help_heading = "Kubernetes", default_value_t = 10, value_name = "SECONDS")]
    pub kube_wait: u64,
    #[command(subcommand)]
    pub command: Command,
}

/// The global flags each subcommand ignores (by field name), hidden from its `--help` so that
/// it lists only what it uses; they are still accepted (a script may pass one set to every
/// command).
const IGNORED: &[(&str, &[&str])] = &[
    ("scan", &["journal", "lock_wait"]),
    ("holders", &["journal", "lock_wait"]),
    ("plan", &["statmount_memo", "lock_wait"]),
    ("release", &["statmount_memo"]),
    ("clean", &["statmount_memo"]),
    ("apply", &["statmount_memo"]),
    ("serve", &["state", "kube_wait", "output", "quiet"]),
    (
        "journal",
        &[
            "root",
            "proc",
            "sys",
            "dev",
            "grace_period",
            "state",
            "statmount_memo",
            "rescan_interval",
            "timeout",
            "kubelet_dir",
            "mount_reader",
            "trust_unreadable_init",
            "lock_wait",
            "no_kubernetes",
            "kube_url",
            "kubeconfig",
            "node_name",
            "kube_silence_bound_seconds",
            "kube_wait",
        ],
    ),
];

/// The help of subcommand `name` (`-h` short, else long), listing only the global flags it
/// uses ([`IGNORED`]); `None` for an unknown name.
fn subcommand_help(name: &str, short: bool) -> Option<String> {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    // Global flags reach the subcommands when the command is built; hiding them after that
    // changes only what help shows (this command is never used to parse).
    cmd.build();
    let ignored = IGNORED.iter().find(|(n, _)| *n == name).map_or(&[][..], |(_, i)| *i);
    let mut sub = cmd.find_subcommand(name)?.clone();
    for id in ignored {
        sub = sub.mut_arg(*id, |a| a.hide(true));
    }
    let help = if short { sub.render_help() } else { sub.render_long_help() };
    // Styled as clap styles its own help: on a terminal, unless NO_COLOR says otherwise.
    let styled = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let text = if styled { help.ansi().to_string() } else { help.to_string() };
    Some(text)
}

/// Parses the process's arguments (as [`Cli`]); `--help` of a subcommand is printed without the
/// global flags it ignores, and returns `Ok(None)`.
pub fn parse() -> Result<Option<Cli>, clap::Error> {
    match <Cli as Parser>::try_parse() {
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => {
            let args: Vec<String> = std::env::args().skip(1).collect();
            let short = args.iter().any(|a| a == "-h");
            let named = args.iter().find(|a| IGNORED.iter().any(|(n, _)| n == a));
            match named.and_then(|n| subcommand_help(n, short)) {
                Some(help) => {
                    print!("{help}");
                    Ok(None)
                }
                None => Err(e),
            }
        }
        other => other.map(Some),
    }
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum ReaderArg {
    Auto,
    Mountinfo,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Text for people.
    Table,
    /// Text for people, no cell cut (scan: every reason of a device in WHY; the other tables never
    /// cut a cell).
    Wide,
    /// Pretty JSON.
    Json,
    /// YAML: the JSON's document.
    Yaml,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Every block device judged, one row each as lsblk shows them (as `agentctl scan`), then a
    /// summary.
    ///
    /// One row per device: NAME, MAJ:MIN, SIZE (as lsblk prints it), TYPE, VERDICT, HELD-BY (who
    /// holds it, counted by kind) and WHY (the first reason for the verdict); then how many
    /// devices the filter left out, the scan's figures and blind spots, pin risks and orphaned pod
    /// volume directories. Warnings go to stderr. -o wide never cuts a cell and shows every reason
    /// (and the PV column); -o table cuts the widest cells to the terminal's width (or $COLUMNS)
    /// and says so. --columns picks the columns, --tree draws each stack as lsblk does. Verdicts
    /// are coloured on a terminal, unless NO_COLOR is set. `holders DEVICE` shows one device whole.
    ///
    /// Changes no device, mount or map; it writes only the grace clocks' state file (--state: when each candidate was first
    /// seen unheld) and the statmount memo (--statmount-memo; '' keeps none).
    #[command(
        after_help = "EXAMPLES:\n  blockjanitor-agent scan\n  blockjanitor-agent scan -o json | jq -r '.devices[] | select(.verdict == \"stale\") | .name'\n  \
blockjanitor-agent scan --kind loop --stale      # filters combine, as agentctl's\n  \
blockjanitor-agent scan --tree                  # each stack as lsblk draws it, down to its holders\n  \
blockjanitor-agent scan --columns NAME,SIZE,VERDICT,WHY -o wide\n  \
blockjanitor-agent scan -q; echo $?             # 3: a blind spot (INCOMPLETE VIEW)"
    )]
    Scan {
        #[command(flatten)]
        filter: blockjanitor_rpc::view::choices::DeviceFilter,
        #[command(flatten)]
        layout: blockjanitor_rpc::view::columns::ScanLayout,
    },
    /// Who holds each device, one line per process as `fuser -v` shows them (-v: one per hold).
    #[command(
        long_about = "Who holds each DEVICE: one line per process, however many ways it holds the device, as \
`fuser -v -m` shows them: PID, ACCESS in fuser's letters (f open file, F open for writing, r root directory, \
c working directory, e executable being run, m mapped file or shared library; '.' where a letter is not), \
COMMAND, then what fuser does not know: the mount namespace(s) it uses the device from (host for the \
host's), its container and pod. Then the holders that are not a process's own, a line each, grouped by kind \
(mounts in every mount namespace, swap, stacked devices, loop devices backed by it, a filesystem alive with \
no mount), and kernel threads (jbd2/<dev>-8...) as symptoms, not holders. -v prints one line per hold, with \
paths and fds. JSON and YAML are the `device` document, whatever the table shows.\n\n\
DEVICE is a /dev path, a kernel name (loop3), a dm name or MAJ:MIN; or a path that is not a device node \
(/mnt/data): the device its filesystem lives on, as `fuser -m` resolves it (the file's device number, or the \
mount holding it and that mount's source device). A path on a filesystem with no block device (tmpfs, proc) \
is an error naming it. With --root, paths are under that root, as /dev paths are.\n\n\
Several devices: each device's table in turn; with -o json one `device` document per device, one JSON \
line each (with -o yaml a `---` document each); one device prints the one document. The exit code is \
2 if any device is held, else 3 if any is unknown, else 0 (1 when an argument names no device: nothing \
is printed).\n\n\
Changes no device, mount or map (it writes the state file and memo, as `scan` does).",
        after_help = "EXAMPLES:\n  blockjanitor-agent holders /dev/rbd3\n  blockjanitor-agent holders loop3 loop4 /mnt/data\n  \
blockjanitor-agent holders loop3 -v              # one line per hold, with paths\n  \
blockjanitor-agent holders loop3 -o yaml\n  blockjanitor-agent holders 7:3\n  \
blockjanitor-agent --root /host holders /dev/rbd/k8s/csi-vol-1234   # in a pod that mounts the host at /host"
    )]
    Holders {
        /// Devices (kernel name, /dev path, dm name, MAJ:MIN) or paths on their filesystems.
        #[arg(required = true, value_name = "DEVICE|PATH")]
        devices: Vec<String>,
        /// One line per hold (each fd, directory, mapping, mount), with paths: the long form.
        #[arg(long, short)]
        verbose: bool,
    },
    /// Detach every mount of DEVICE in a mount namespace other than the host's (setns +
    /// umount2 MNT_DETACH, no process is killed), then show what still holds it. Dry run unless --apply.
    #[command(
        after_help = "EXAMPLES:\n  blockjanitor-agent release /dev/rbd3            # the plan: which copies would be detached\n  \
blockjanitor-agent release /dev/rbd3 --apply\n  blockjanitor-agent release rbd3 --apply --force-busy 'INC-4211: pod gone, agent still in it'"
    )]
    Release {
        device: String,
        /// Carry out the plan.
        #[arg(long)]
        apply: bool,
        /// Detach mounts even though processes in their namespaces still use the filesystem
        /// (a task's cwd or root, an open file or the device node, a mapping): they keep the
        /// detached filesystem and lose their path to it. Covers processes only: swap, a loop
        /// device backed by a file on it, a stacked device and a filesystem alive with no mount
        /// (an overlay's upper directory) still refuse. REASON goes into the plan, the journal
        /// and the audit log. Never overrides a blind spot, a copy of a host mount, or the host's
        /// (or another device's) mount an unmount would take with it through propagation.
        #[arg(long, value_name = "REASON", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        force_busy: Option<String>,
    },
    /// Tear DEVICE down by its kind once it is stale (observed unheld for the grace period):
    /// unbind a loop device (LOOP_CLR_FD), disconnect nbd, unmap rbd, tear down a dead
    /// multipath map and its paths, delete an offline SCSI disk; its mounts in other namespaces
    /// are released first. Refused, with the holders, while anything else holds it. Or remove an
    /// orphaned pod volume directory (`pod-volume:...`, as `scan` lists them). Dry run unless
    /// --apply.
    #[command(
        long_about = "Tear DEVICE down by its kind once it is stale (observed unheld for the grace period): unbind a loop \
device (LOOP_CLR_FD), disconnect nbd, unmap rbd, tear down a dead multipath map and its paths, delete an offline \
SCSI disk; its mounts in other namespaces are released first. Refused, with the holders, while anything else holds \
it.\n\nDEVICE may instead name an orphaned pod volume directory (what kubelet logs as \"orphaned pod ... found, but \
volume paths are still present on disk\"): pod-volume:<pod uid>/volumes/<plugin>/<name> (also \
.../volumeDevices/<plugin>/<name> and .../volume-subpaths/<volume>/<container>/<index>), as `scan` lists them, \
or the directory's path below the kubelet directory. It is removed with rmdir, deepest directory first, only when \
its pod is gone per the Kubernetes API and per this node (no process, no mount of its files), nothing is mounted \
at or below it in any mount namespace, and it has held nothing but empty directories for the grace period; each \
rmdir is re-checked right before it runs and journaled. A directory with anything in it is never removed.\n\n\
Dry run unless --apply.",
        after_help = "EXAMPLES:\n  blockjanitor-agent clean loop3                  # the plan, or why not\n  \
blockjanitor-agent clean loop3 --apply\n  blockjanitor-agent clean mpatha --apply --deferred-remove\n  \
blockjanitor-agent clean rbd0 -o json | jq -r '.plans[0].outcome'\n  \
blockjanitor-agent clean pod-volume:0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e/volumes/kubernetes.io~csi/pvc-1 --apply"
    )]
    Clean {
        /// A device (/dev path, kernel name, dm name, MAJ:MIN) or an orphaned pod volume
        /// directory (pod-volume:<pod uid>/volumes/<plugin>/<name>, as `scan` lists them).
        device: String,
        /// Carry out the plan.
        #[arg(long)]
        apply: bool,
        /// For a multipath map still open: remove it on its last close (deferred remove).
        #[arg(long)]
        deferred_remove: bool,
        /// For rbd: unmap with `force` (in-flight I/O fails; a mount left behind cannot be
        /// unmounted any more). Only for a mapping whose cluster is gone for good.
        #[arg(long)]
        force: bool,
    },
    /// The plans for the given devices (default: every stale one, and every removable orphaned
    /// pod volume directory): the dry run of `clean` of each, or of `release` with --release.
    /// Changes no device, mount or map (it keeps the grace clocks' state file, as `scan` does).
    #[command(
        after_help = "EXAMPLES:\n  blockjanitor-agent plan                          # every stale device\n  \
blockjanitor-agent plan loop3 rbd0\n  blockjanitor-agent plan loop3 --release -o json | jq -r '.plans[0].outcome'"
    )]
    Plan {
        /// Devices (or pod-volume:... directories) to plan for [default: every stale device and
        /// removable orphaned pod volume directory].
        devices: Vec<String>,
        /// Plan only the release of the copies of their mounts other mount namespaces keep (the
        /// devices stay). Needs the devices named.
        #[arg(long)]
        release: bool,
    },
    /// Carry out the plans for the given devices (default: every stale one, and every removable
    /// orphaned pod volume directory): `clean --apply` of each, or `release --apply` with
    /// --release. Without --yes only shows them, and refuses.
    #[command(
        after_help = "EXAMPLES:\n  blockjanitor-agent apply loop3                   # show the plan, change nothing (exit 2)\n  \
blockjanitor-agent apply loop3 --yes\n  blockjanitor-agent apply --yes                   # every stale device\n  \
blockjanitor-agent apply rbd3 --release --yes -o json"
    )]
    Apply {
        /// Devices (or pod-volume:... directories) to carry out plans for [default: every stale
        /// device and removable orphaned pod volume directory].
        devices: Vec<String>,
        /// Only release the copies of their mounts other mount namespaces keep; the devices stay.
        /// Needs the devices named.
        #[arg(long)]
        release: bool,
        /// Carry out the plans (without it: show them only).
        #[arg(long)]
        yes: bool,
    },
    /// Steps a previous run started but never finished (from the journal).
    #[command(after_help = "EXAMPLES:\n  blockjanitor-agent journal\n  \
blockjanitor-agent --journal /var/lib/blockjanitor/journal.jsonl journal -o json")]
    Journal,
    /// Run as a daemon: scan at start, on block uevents, on host mount-table changes and on a
    /// timer; serve the gRPC API on a unix socket (and TCP with mutual TLS) and /metrics.
    #[command(
        after_help = "EXAMPLES:\n  blockjanitor-agent serve\n  blockjanitor-agent serve --config /etc/blockjanitor/agent.toml\n  \
blockjanitor-agent serve --mode release --metrics-listen 0.0.0.0:9910 --health-listen 0.0.0.0:9911   # the manifests' ports"
    )]
    Serve(Box<ServeArgs>),
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Config file (TOML), or a directory of parts (every `*.toml` in it, by name, merged key by
    /// key: as a ConfigMap mounted whole gives them); flags override it.
    #[arg(long, value_name = "FILE|DIR")]
    pub config: Option<PathBuf>,
    /// Unix socket to serve on [default: /run/blockjanitor/agent.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Group (name or GID) that owns the socket; its members are viewers, root is operator.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// TCP address for gRPC with mutual TLS (needs --tls-cert, --tls-key, --tls-client-ca).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// Server certificate (PEM) for the TCP listener.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// CA that signs client certificates (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Client identity (certificate DNS SAN or CN) with the operator role, one per person (never a
    /// certificate a team shares: the audit names it); repeatable.
    #[arg(long, value_name = "NAME")]
    pub tls_operator: Vec<String>,
    /// Client identity with the viewer role; repeatable.
    #[arg(long, value_name = "NAME")]
    pub tls_viewer: Vec<String>,
    /// Client identity with the console role (reads; Apply only on behalf of a person it names,
    /// which the audit log records); repeatable.
    #[arg(long, value_name = "NAME")]
    pub tls_console: Vec<String>,
    /// Address for /metrics over HTTP.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Address for the gRPC health service alone, without TLS (kubelet's `grpc` probes).
    #[arg(long, value_name = "ADDR")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// Seconds a mapping must stay unheld, across scans, before it is stale [default: 300].
    #[arg(long, value_name = "SECONDS")]
    pub grace_period: Option<u64>,
    /// Every Nth full scan reads every process's open files and memory maps in full; the others
    /// keep what a process's last read found while its start time, fd count and memory size are
    /// the same (cwd, root and namespaces are read every time). 1: every scan reads everything.
    /// Actions always re-check with a full read [default: 10, or the config's `full_read_every`].
    #[arg(long, value_name = "N")]
    pub full_read_every: Option<u64>,
    /// Seconds a device may have I/O in flight with none completing before it is reported
    /// unresponsive (and nothing destructive is done to it) [default: 10].
    #[arg(long, value_name = "SECONDS")]
    pub unresponsive_after: Option<u64>,
    /// At most one holders/verdict event per device a second on the watch stream (a churning
    /// device's changes folded into the next, which says how many it stands for). On by
    /// default (config `cap_device_events`); a device's first change after a quiet second goes
    /// at once.
    #[arg(long, overrides_with = "no_cap_device_events")]
    pub cap_device_events: bool,
    /// Turns the per-device event cap off: every holders/verdict change goes to watchers at
    /// once, however often a device changes.
    #[arg(long, overrides_with = "cap_device_events")]
    pub no_cap_device_events: bool,
    /// What the agent does by itself: report (default) changes nothing; release detaches
    /// mounts in other namespaces of volumes kubelet has let go of; clean tears down every
    /// device judged stale and removes (rmdir) every removable orphaned pod volume directory.
    #[arg(long, value_parser = ["report", "release", "clean"], value_name = "MODE")]
    pub mode: Option<String>,
    /// At most this many destructive steps per minute in release and clean modes [default: 6].
    #[arg(long, value_name = "N")]
    pub max_actions_per_minute: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every subcommand's `--help` shows an example, and every example parses.
    #[test]
    fn every_subcommand_has_an_example_that_parses() {
        let mut cli = Cli::command();
        let examples = |c: &mut clap::Command| {
            blockjanitor_rpc::help_examples::examples(&c.render_long_help().to_string(), "blockjanitor-agent")
        };
        let mut checked = 0;
        for sub in cli.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let name = sub.get_name().to_owned();
            let found = examples(sub);
            assert!(
                found.iter().any(|w| w.get(1) == Some(&name)),
                "`{name} --help` shows no example of {name}"
            );
            for words in found {
                Cli::try_parse_from(&words)
                    .unwrap_or_else(|e| panic!("the example {words:?} does not parse: {e}"));
                checked += 1;
            }
        }
        assert!(checked >= 12, "{checked} examples");
    }
}
