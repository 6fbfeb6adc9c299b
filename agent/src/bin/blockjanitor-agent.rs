//! `blockjanitor-agent`: scan this node's block devices and who holds them, and release stale
//! holders. Parses flags, calls the library (`release` and `clean` through the one request
//! workflow, [`Engine::carry_out`]), prints. Exit codes (README, "Exit codes"): 0 free or done,
//! 1 error, 2 held, 3 unknown (could not see), 4 refused.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use blockjanitor::act::journal;
use blockjanitor::config::Config;
use blockjanitor::daemon;
use blockjanitor::daemon::metrics::Metrics;
use blockjanitor::daemon::mount_watch::MountWatch;
use blockjanitor::daemon::state::AgentState;
use blockjanitor::daemon::triggers;
use blockjanitor::discover::blockdev;
use blockjanitor::discover::namespaces::MountReader;
use blockjanitor::engine::outcome::{self, Class, Outcome, Request, Subject};
use blockjanitor::engine::workflow;
use blockjanitor::engine::world::LinuxWorld;
use blockjanitor::engine::world::World;
use blockjanitor::engine::{Engine, Operation, Settings};
use blockjanitor::graph::scan::Target;
use blockjanitor::host::HostRoot;
use blockjanitor::judge::grace::Clocks;
use blockjanitor::model::DevNum;
use blockjanitor::plan;
use blockjanitor::snapshot::ScanOptions;
use blockjanitor::{cli::render, graph::resolve, server};
use std::sync::Arc;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

/// Exit code of a scan or a holders report that could not see everything (a blind spot).
const EXIT_UNKNOWN: u8 = 3;

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
    after_help = "EXAMPLES:\n  blockjanitor-agent scan\n  blockjanitor-agent holders /dev/rbd3 --output json\n  \
blockjanitor-agent release /dev/loop3            # dry run: print the plan\n  blockjanitor-agent release /dev/loop3 --apply    \
# detach foreign-namespace mounts\n  blockjanitor-agent clean loop3 --apply           # detach an unheld loop device\n  \
blockjanitor-agent --root /host holders 7:3      # in a pod that mounts the host at /host\n\n\
EXIT CODES:\n  0  free or done: nothing holds it, nothing to do, the dry run may go, or every step done\n  \
1  error: bad argument, unreadable host or journal, a failed step\n  \
2  held: something still holds the device; it was left alone\n  \
3  unknown: the agent could not see everything that could hold it (a blind spot: not root, \
an unreadable process or namespace); the report's first line says INCOMPLETE VIEW\n  \
4  refused: a safety rule said no (protected, the API cannot vouch, not stale yet, identity \
changed, --apply without the privileges to see, another run holds the journal)"
)]
struct Cli {
    /// The host's root; /proc, /sys and /dev are looked for under it.
    #[arg(long, global = true, default_value = "/", value_name = "DIR")]
    root: PathBuf,
    /// Where the host's procfs is (default: ROOT/proc).
    #[arg(long, global = true, value_name = "DIR")]
    proc: Option<PathBuf>,
    /// Where the host's sysfs is (default: ROOT/sys).
    #[arg(long, global = true, value_name = "DIR")]
    sys: Option<PathBuf>,
    /// Where the host's /dev is (default: ROOT/dev).
    #[arg(long, global = true, value_name = "DIR")]
    dev: Option<PathBuf>,
    /// Journal of destructive steps, written before and after each step
    /// [default: /var/lib/blockjanitor/journal.jsonl, or the config's `journal` for serve].
    #[arg(long, global = true, value_name = "FILE")]
    journal: Option<PathBuf>,
    /// Seconds a device must stay a cleanup candidate (unheld mapping, map with every path
    /// failed, offline disk), across runs, before it is stale.
    #[arg(long, global = true, default_value_t = 300, value_name = "SECONDS")]
    grace_period: u64,
    /// Where the one-shot commands remember since when each candidate was seen, so the grace
    /// period spans runs. Not written for fixture trees.
    #[arg(long, global = true, default_value = "/var/lib/blockjanitor/state.json", value_name = "FILE")]
    state: PathBuf,
    /// Seconds between scans: the daemon rescans at least this often, and a grace clock keeps
    /// running only while observations are at most twice this apart (for the one-shot commands:
    /// between runs) [default: 60, or the config's for serve].
    #[arg(long, global = true, value_name = "SECONDS")]
    rescan_interval: Option<u64>,
    /// Deadline for each kernel call that may block on a device, in seconds.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECONDS")]
    timeout: u64,
    /// The kubelet directory, as the host sees it (its volumes name each device's PV and pods)
    /// [default: /var/lib/kubelet, or the config's `kubelet_dir` for serve].
    #[arg(long, global = true, value_name = "DIR")]
    kubelet_dir: Option<PathBuf>,
    /// How mount tables are read: `auto` checks each namespace with listmount/statmount (Linux
    /// 6.8+) and reads mountinfo text only where a wanted device is mounted; `mountinfo` reads the
    /// text of every namespace.
    #[arg(long, global = true, value_enum, default_value_t = ReaderArg::Auto)]
    mount_reader: ReaderArg,
    /// PID 1 cannot be inspected on this machine (a sandbox supervisor or an LSM shields it even
    /// from root): trust that it holds no device. Without this, PID 1 is a blind spot and every
    /// cleanup candidate is `unknown`. Never needed on a normal node.
    #[arg(
        long,
        global = true,
        env = "BLOCKJANITOR_TRUST_UNREADABLE_INIT",
        action = clap::ArgAction::SetTrue,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    trust_unreadable_init: bool,
    /// Seconds an --apply run waits for another run (or the daemon) writing the same journal
    /// before it refuses, naming that run's pid.
    #[arg(long, global = true, default_value_t = 30, value_name = "SECONDS")]
    lock_wait: u64,
    /// Log format on stderr (audit lines included).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum ReaderArg {
    Auto,
    Mountinfo,
}

impl From<ReaderArg> for MountReader {
    fn from(r: ReaderArg) -> Self {
        match r {
            ReaderArg::Auto => MountReader::Auto,
            ReaderArg::Mountinfo => MountReader::MountInfo,
        }
    }
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every block device with its stack and holders, then a summary. Read only.
    Scan {
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Who holds one device. DEVICE is a /dev path, a kernel name (loop3), a dm name or MAJ:MIN.
    Holders {
        device: String,
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Detach every mount of DEVICE in a mount namespace other than the host's (setns +
    /// umount2 MNT_DETACH, no process is killed), then show what still holds it. Dry run unless --apply.
    Release {
        device: String,
        /// Carry out the plan.
        #[arg(long)]
        apply: bool,
        /// Detach mounts even though processes in their namespaces still use the filesystem
        /// (cwd, open files, mappings): they keep the detached filesystem and lose their path to
        /// it. REASON goes into the plan and the audit log. Never overrides a blind spot or a
        /// copy of a host mount.
        #[arg(long, value_name = "REASON", value_parser = clap::builder::NonEmptyStringValueParser::new())]
        force_busy: Option<String>,
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Tear DEVICE down by its kind once it is stale (observed unheld for the grace period):
    /// unbind a loop device (LOOP_CLR_FD), disconnect nbd, unmap rbd, tear down a dead
    /// multipath map and its paths, delete an offline SCSI disk; its mounts in other namespaces
    /// are released first. Refused, with the holders, while anything else holds it. Dry run
    /// unless --apply.
    Clean {
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
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Steps a previous run started but never finished (from the journal).
    Journal,
    /// Run as a daemon: scan at start, on block uevents, on host mount-table changes and on a
    /// timer; serve the gRPC API on a unix socket (and TCP with mutual TLS) and /metrics.
    Serve(Box<ServeArgs>),
}

#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Config file (TOML); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Unix socket to serve on [default: /run/blockjanitor/agent.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Group (name or GID) that owns the socket; its members are viewers, root is operator.
    #[arg(long, value_name = "GROUP")]
    socket_group: Option<String>,
    /// TCP address for gRPC with mutual TLS (needs --tls-cert, --tls-key, --tls-client-ca).
    #[arg(long, value_name = "ADDR")]
    listen: Option<std::net::SocketAddr>,
    /// Server certificate (PEM) for the TCP listener.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Server private key (PEM).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// CA that signs client certificates (PEM).
    #[arg(long, value_name = "FILE")]
    tls_client_ca: Option<PathBuf>,
    /// Client identity (certificate DNS SAN or CN) with the operator role; repeatable.
    #[arg(long, value_name = "NAME")]
    tls_operator: Vec<String>,
    /// Client identity with the viewer role; repeatable.
    #[arg(long, value_name = "NAME")]
    tls_viewer: Vec<String>,
    /// Client identity with the console role (reads; Apply only on behalf of an operator it
    /// names, which the audit log records); repeatable.
    #[arg(long, value_name = "NAME")]
    tls_console: Vec<String>,
    /// Address for /metrics over HTTP.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Address for the gRPC health service alone, without TLS (kubelet's `grpc` probes).
    #[arg(long, value_name = "ADDR")]
    health_listen: Option<std::net::SocketAddr>,
    /// Seconds a mapping must stay unheld, across scans, before it is stale [default: 300].
    #[arg(long, value_name = "SECONDS")]
    grace_period: Option<u64>,
    /// Seconds a device may have I/O in flight with none completing before it is reported
    /// unresponsive (and nothing destructive is done to it) [default: 10].
    #[arg(long, value_name = "SECONDS")]
    unresponsive_after: Option<u64>,
    /// Node name reported by GetNode and used with the Kubernetes API [default: the host name].
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// What the agent does by itself: report (default) changes nothing; release detaches
    /// mounts in other namespaces of volumes kubelet has let go of; clean tears down every
    /// device judged stale.
    #[arg(long, value_parser = ["report", "release", "clean"], value_name = "MODE")]
    mode: Option<String>,
    /// At most this many destructive steps per minute in release and clean modes [default: 6].
    #[arg(long, value_name = "N")]
    max_actions_per_minute: Option<u32>,
    /// Kubernetes API URL (otherwise --kubeconfig, or the in-cluster service account).
    #[arg(long, value_name = "URL")]
    kube_url: Option<String>,
    /// Kubeconfig file for the Kubernetes API.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Seconds one Kubernetes watch (or the Node lookup) may go without hearing from the API
    /// server before the view stops vouching [default: 90].
    #[arg(long, value_name = "SECONDS")]
    kube_silence_bound_seconds: Option<u64>,
}

/// At most two glibc malloc arenas. glibc gives each thread that allocates its own arena (up
/// to 8 per core), and the daemon's blocking threads (scans, Plan) come and go: memory freed in
/// an arena stays with it, and under load (BENCHMARKS.md, "Load") RSS climbed 10 MiB higher
/// with the default than with two arenas, for no gain in speed.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; it is called first thing in
    // main, before any other thread exists, and its arguments are constants glibc documents.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(cli.log_format);
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", blockjanitor::errors::one_line(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BLOCKJANITOR_LOG").unwrap_or_else(|_| {
        EnvFilter::new(if std::env::args().any(|a| a == "serve") { "info" } else { "warn,audit=info" })
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn host(cli: &Cli) -> HostRoot {
    let mut h = HostRoot::new(&cli.root);
    if let Some(p) = &cli.proc {
        h = h.with_proc(p);
    }
    if let Some(s) = &cli.sys {
        h = h.with_sys(s);
    }
    if let Some(d) = &cli.dev {
        h = h.with_dev(d);
    }
    h
}

fn print_json(v: &serde_json::Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// How the one-shot commands read the host.
fn scan_options(cli: &Cli) -> ScanOptions {
    ScanOptions {
        reader: MountReader::from(cli.mount_reader),
        kubelet_dir: cli
            .kubelet_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(blockjanitor::discover::kubelet::DEFAULT_KUBELET_DIR)),
        trust_unreadable_init: cli.trust_unreadable_init,
        ..ScanOptions::default()
    }
}

/// The engine the one-shot commands drive.
fn engine(cli: &Cli, host: HostRoot, clean: plan::CleanOptions) -> Engine<LinuxWorld> {
    let interval = Duration::from_secs(cli.rescan_interval.unwrap_or(60).max(1));
    let world = LinuxWorld::new(host, scan_options(cli), Duration::from_secs(cli.timeout));
    Engine::new(
        world,
        Settings {
            grace: Duration::from_secs(cli.grace_period),
            max_gap: interval * 2,
            clean,
            release: plan::ReleaseOptions::default(),
            unresponsive_after: blockjanitor::judge::stall::DEFAULT_THRESHOLD,
        },
    )
}

/// The grace clocks the one-shot commands keep in `--state` between runs (stamped with the boot
/// id; a fixture tree keeps none).
struct StateFile<'a> {
    path: &'a std::path::Path,
    live: bool,
    clocks: Clocks,
}

impl<'a> StateFile<'a> {
    fn load(cli: &'a Cli, host: &HostRoot) -> Self {
        let live = host.is_live();
        let boot = blockjanitor::host::clock::boot_id(host);
        let clocks = if live { Clocks::load(&cli.state, boot) } else { Clocks::new(None) };
        Self { path: &cli.state, live, clocks }
    }

    fn save(&self) {
        if self.live {
            if let Err(e) = self.clocks.save(self.path) {
                tracing::warn!(
                    "cannot save {}: {e}; the grace period restarts on the next run",
                    self.path.display()
                );
            }
        }
    }
}

/// The device an operator named.
fn device_arg(host: &HostRoot, arg: &str) -> Result<DevNum> {
    let devices = blockdev::scan(host)?;
    Ok(resolve::device(host, &devices, arg)?.devnum)
}

fn run(cli: &Cli) -> Result<u8> {
    let host = host(cli);
    let mut state = StateFile::load(cli, &host);
    match &cli.command {
        Command::Scan { output } => {
            let e = engine(cli, host, plan::CleanOptions::default());
            let judged = e.judge(e.scan(Target::All)?, &mut state.clocks);
            state.save();
            let incomplete = outcome::incomplete_view(&judged.scan, None);
            match output {
                Output::Json => print_json(&render::scan_json(&judged))?,
                Output::Table => {
                    if let Some(line) = &incomplete {
                        println!("{line}");
                    }
                    print!("{}", render::scan_table(&judged))
                }
            }
            Ok(if incomplete.is_some() { EXIT_UNKNOWN } else { 0 })
        }
        Command::Holders { device, output } => {
            let devnum = device_arg(&host, device)?;
            let e = engine(cli, host, plan::CleanOptions::default());
            // The scan a cleanup of it would rest on: what its removal takes with it (an NVMe
            // controller's other namespaces, a session's other disks) is looked at too.
            let judged = e.judge(e.plan_scan(devnum, Operation::Clean)?, &mut state.clocks);
            state.save();
            let incomplete =
                judged.scan.entry(devnum).and_then(|e| outcome::incomplete_view(&judged.scan, Some(e)));
            match output {
                Output::Json => print_json(&render::holders_json(&judged, devnum)?)?,
                Output::Table => {
                    if let Some(line) = &incomplete {
                        println!("{line}");
                    }
                    print!("{}", render::holders_table(&judged, devnum)?)
                }
            }
            Ok(if incomplete.is_some() { EXIT_UNKNOWN } else { 0 })
        }
        Command::Release { device, apply, force_busy, output } => {
            let mut e = engine(cli, host, plan::CleanOptions::default());
            e.settings.release = plan::ReleaseOptions { force_busy: force_busy.clone() };
            one_request(cli, &e, &mut state, Operation::Release, device, *apply, *output)
        }
        Command::Clean { device, apply, deferred_remove, force, output } => {
            let clean = plan::CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            let e = engine(cli, host, clean);
            one_request(cli, &e, &mut state, Operation::Clean, device, *apply, *output)
        }
        Command::Serve(args) => serve(cli, args, host),
        Command::Journal => {
            let path = journal_path(cli);
            let pending =
                journal::pending(&path).with_context(|| format!("cannot read {}", path.display()))?;
            let plans =
                journal::open_plans(&path).with_context(|| format!("cannot read {}", path.display()))?;
            if pending.is_empty() && plans.is_empty() {
                println!("no unfinished steps in {}", path.display());
            }
            for p in pending {
                println!("unfinished: {p}");
            }
            for p in plans {
                let op = p.record.pointer("/request/operation").and_then(|v| v.as_str()).unwrap_or("?");
                let arg = p.record.pointer("/request/argument").and_then(|v| v.as_str()).unwrap_or("?");
                let total = p.record.get("steps").and_then(|v| v.as_array()).map_or(0, Vec::len);
                println!(
                    "unfinished plan {}: {op} '{arg}', {} of {total} step(s) finished: run `{op} {arg} --apply` again to finish it",
                    p.id,
                    p.finished.len()
                );
            }
            Ok(0)
        }
    }
}

fn journal_path(cli: &Cli) -> PathBuf {
    cli.journal.clone().unwrap_or_else(|| PathBuf::from(journal::DEFAULT_PATH))
}

/// Builds the daemon's config: the file (if any), then the flags.
fn serve_config(cli: &Cli, a: &ServeArgs) -> Result<Config> {
    let mut c = match &a.config {
        Some(p) => Config::load(p)?,
        None => Config::default(),
    };
    if let Some(v) = &a.socket {
        c.socket.path = v.clone();
    }
    if let Some(v) = &a.socket_group {
        c.socket.group = Some(v.clone());
    }
    if let Some(v) = a.listen {
        c.tcp.listen = Some(v);
    }
    if let Some(v) = &a.tls_cert {
        c.tcp.cert = Some(v.clone());
    }
    if let Some(v) = &a.tls_key {
        c.tcp.key = Some(v.clone());
    }
    if let Some(v) = &a.tls_client_ca {
        c.tcp.client_ca = Some(v.clone());
    }
    c.tcp.operators.extend(a.tls_operator.iter().cloned());
    c.tcp.viewers.extend(a.tls_viewer.iter().cloned());
    c.tcp.consoles.extend(a.tls_console.iter().cloned());
    if let Some(v) = a.metrics_listen {
        c.metrics.listen = Some(v);
    }
    if let Some(v) = a.health_listen {
        c.health.listen = Some(v);
    }
    if let Some(v) = cli.rescan_interval {
        c.rescan_interval_seconds = v;
    }
    if let Some(v) = a.grace_period {
        c.grace_period_seconds = v;
    }
    if let Some(v) = a.unresponsive_after {
        c.unresponsive_after_seconds = v;
    }
    if let Some(v) = &a.node_name {
        c.node_name = Some(v.clone());
    }
    if let Some(m) = &a.mode {
        c.mode = match m.as_str() {
            "release" => blockjanitor::config::Mode::Release,
            "clean" => blockjanitor::config::Mode::Clean,
            _ => blockjanitor::config::Mode::Report,
        };
    }
    if let Some(n) = a.max_actions_per_minute {
        c.max_actions_per_minute = n;
    }
    if let Some(u) = &a.kube_url {
        c.kubernetes.url = Some(u.clone());
    }
    if let Some(k) = &a.kubeconfig {
        c.kubernetes.kubeconfig = Some(k.clone());
    }
    if let Some(b) = a.kube_silence_bound_seconds {
        c.kubernetes.silence_bound_seconds = Some(b);
    }
    if let Some(j) = &cli.journal {
        c.journal = j.clone();
    }
    // The flag overrides the config's `kubelet_dir` only when given.
    if let Some(k) = &cli.kubelet_dir {
        c.kubelet_dir = k.clone();
    }
    c.trust_unreadable_init |= cli.trust_unreadable_init;
    c.validate()?;
    Ok(c)
}

fn serve(cli: &Cli, args: &ServeArgs, host: HostRoot) -> Result<u8> {
    let config = serve_config(cli, args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    let world = LinuxWorld::new(
        host.clone(),
        ScanOptions {
            reader: MountReader::from(cli.mount_reader),
            kubelet_dir: config.kubelet_dir.clone(),
            trust_unreadable_init: config.trust_unreadable_init,
            protected_paths: config.protected_paths.clone(),
            protected_devices: config.protected_devices.clone(),
        },
        Duration::from_secs(cli.timeout),
    );
    if config.mode != blockjanitor::config::Mode::Report {
        world
            .can_act()
            .map_err(|why| anyhow::anyhow!("mode {} acts by itself, but {why}", config.mode.as_str()))?;
    }
    let settings = Settings {
        grace: config.grace_period(),
        max_gap: config.rescan_interval() * 2,
        clean: plan::CleanOptions::default(),
        release: plan::ReleaseOptions::default(),
        unresponsive_after: config.unresponsive_after(),
    };
    let engine = Engine::new(world, settings);
    // Before anything acts: close the steps a run that died left open, each re-checked against
    // its device as it is now; the devices are then planned afresh by the scans.
    // An unfinished plan is resumed (each remaining step re-checked) only by a daemon that acts
    // by itself; a reporting one lists it.
    let resume = config.mode != blockjanitor::config::Mode::Report;
    match engine.recover_all(&config.journal, workflow::LOCK_WAIT, resume) {
        Ok(out) => {
            say_recovery(&out, |line| tracing::warn!("{line}"));
            for r in &out.resumed {
                tracing::warn!("{}", r.describe());
            }
            if let Some((_, why)) = &out.refusal {
                tracing::warn!("journal recovery postponed: {why}");
            }
        }
        Err(err) => tracing::warn!("cannot recover the journal {}: {err}", config.journal.display()),
    }
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::new()?);
        let every = config.rescan_interval();
        let state = AgentState::new(host, config, metrics, engine);
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(async move {
            let mut term = match signal(SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!("cannot handle SIGTERM: {e}");
                    return;
                }
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: shutting down"),
            }
            let _ = stop_tx.send(true);
        });
        connect_kubernetes(&state).await;
        let mount_watch = match MountWatch::open() {
            Ok(w) => {
                let w = Arc::new(w);
                state.use_mount_watch(Arc::clone(&w) as Arc<dyn blockjanitor::daemon::state::NamespaceWatch>);
                Some(w)
            }
            Err(e) => {
                tracing::info!("the kernel cannot report mount events ({e}; Linux 6.15+): watching the host's mount table and rescanning on the timer");
                None
            }
        };
        state.scan_once("start").await;
        tokio::spawn(Arc::clone(&state).run_scanner(stop.clone()));
        tokio::spawn(triggers::watch_kernel_uevents(Arc::clone(&state), stop.clone()));
        triggers::spawn_udev_watch(Arc::clone(&state), stop.clone());
        match mount_watch {
            Some(w) => tokio::spawn(daemon::watch_mounts(Arc::clone(&state), w, stop.clone())),
            None => tokio::spawn(triggers::watch_mount_table(Arc::clone(&state), stop.clone())),
        };
        tokio::spawn(triggers::timer(Arc::clone(&state), every, stop.clone()));
        server::listen::serve(state, stop).await?;
        tracing::info!("stopped");
        Ok::<u8, anyhow::Error>(0)
    })
}

/// Uses the Kubernetes API when it is configured (URL, kubeconfig) or the agent runs in a
/// cluster; otherwise, or when connecting fails, runs without it and says so.
async fn connect_kubernetes(state: &Arc<AgentState>) {
    let k = &state.config.kubernetes;
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    if k.enabled == Some(false) || (k.url.is_none() && k.kubeconfig.is_none() && !in_cluster) {
        tracing::info!("running without the Kubernetes API (none configured)");
        return;
    }
    let cfg = blockjanitor::kube::KubeConfig {
        url: k.url.clone(),
        kubeconfig: k.kubeconfig.clone(),
        node_name: state.node_name.clone(),
    };
    match blockjanitor::kube::connect(&cfg).await {
        Ok(client) => {
            let (view, _task) =
                blockjanitor::kube::spawn_watch(client.clone(), &state.node_name, watch_options(k));
            state.use_kubernetes(view, blockjanitor::kube::Reporter::new(client, &state.node_name));
            tracing::info!(node = %state.node_name, "using the Kubernetes API");
        }
        Err(e) => tracing::warn!("running without the Kubernetes API: {e}"),
    }
}

/// The watches' options: the defaults, or scaled to the configured silence bound.
fn watch_options(k: &blockjanitor::config::KubernetesConfig) -> blockjanitor::kube::WatchOptions {
    match k.silence_bound_seconds {
        Some(s) => blockjanitor::kube::WatchOptions::with_silence_bound(Duration::from_secs(s.max(1))),
        None => blockjanitor::kube::WatchOptions::default(),
    }
}

/// Says what the journal's recovery did through `say`: each interrupted step closed (or left
/// open), each unfinished plan resumed or left for its own command.
fn say_recovery(out: &Outcome, say: impl Fn(&str)) {
    for (i, how) in &out.recovery.resolved {
        say(&format!("recovered interrupted step {} ({}): {}", i.id, how.word, how.detail));
    }
    for (id, why) in &out.recovery.left_open {
        say(&format!("journal step {id} left open: {why}"));
    }
    for u in &out.unfinished {
        say(u);
    }
}

/// `release` or `clean` of the device the operator named, through the one request workflow
/// ([`Engine::carry_out`]): with --apply, recovery and the unfinished plan this argument owes
/// come first, before the argument is resolved. Prints the report; returns the exit code.
fn one_request(
    cli: &Cli,
    e: &Engine<LinuxWorld>,
    state: &mut StateFile<'_>,
    op: Operation,
    device: &str,
    apply: bool,
    output: Output,
) -> Result<u8> {
    let journal_file = journal_path(cli);
    let clocks = std::sync::Mutex::new(std::mem::replace(&mut state.clocks, Clocks::new(None)));
    let request = Request {
        op,
        subject: Subject::Argument(device.to_owned()),
        argument: device.to_owned(),
        expected_identity: None,
        apply,
        by: format!("cli (uid {})", nix::unistd::geteuid()),
        journal: &journal_file,
        lock_wait: Duration::from_secs(cli.lock_wait),
        clocks: &clocks,
        admit: None,
    };
    let result = e.carry_out(&request);
    state.clocks = clocks.into_inner().unwrap_or_else(|p| p.into_inner());
    state.save();
    let out = result?;
    say_recovery(&out, |line| eprintln!("warning: {line}"));
    let class = out.class();
    if output == Output::Json {
        print_json(&render::outcome_json(&out, class.exit_code()))?;
        return Ok(class.exit_code());
    }
    // The one line a refusal before any step is (sight, may-act, the journal's lock).
    if let Some((_, why)) = &out.refusal {
        if out.plan.is_none() {
            println!("{why}");
            return Ok(class.exit_code());
        }
    }
    print!("{}", render::outcome_text(&out, device));
    if class == Class::Error {
        if let Some(p) = out.plan.as_ref().filter(|p| p.unsupported) {
            anyhow::bail!("{}", p.refusal.as_deref().unwrap_or_default());
        }
    }
    Ok(class.exit_code())
}
