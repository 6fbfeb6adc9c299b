//! `blockjanitor-agent`: scan this node's block devices and who holds them, and release stale
//! holders. Parses flags, calls the library, prints. Exit codes: 0 done, 1 error, 2 refused
//! because the device is still held.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};

use blockjanitor::act::linux::LinuxActuator;
use blockjanitor::act::{execute, StepOutcome, StepReport};
use blockjanitor::config::Config;
use blockjanitor::daemon::protect::protected_devices;
use blockjanitor::daemon::state::AgentState;
use blockjanitor::daemon::triggers;
use blockjanitor::discover::blockdev;
use blockjanitor::discover::namespaces::MountReader;
use blockjanitor::graph::{DeviceEntry, DeviceGraph};
use blockjanitor::host::HostRoot;
use blockjanitor::journal::{self, Journal};
use blockjanitor::metrics::Metrics;
use blockjanitor::model::DevNum;
use blockjanitor::plan::{self, Plan};
use blockjanitor::policy::{Judgement, Tracker};
use blockjanitor::snapshot::{ScanOptions, Scope, Snapshot};
use blockjanitor::{render, resolve, server};
use std::sync::Arc;
use std::time::SystemTime;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;

const EXIT_HELD: u8 = 2;

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
EXIT CODES:\n  0  done (or dry run printed)\n  1  error (bad argument, unreadable host, failed step)\n  \
2  refused or still held: the device is in use and was left alone"
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
    /// Deadline for each kernel call that may block on a device, in seconds.
    #[arg(long, global = true, default_value_t = 10, value_name = "SECONDS")]
    timeout: u64,
    /// The kubelet directory, as the host sees it (its volumes name each device's PV and pods).
    #[arg(long, global = true, default_value = "/var/lib/kubelet", value_name = "DIR")]
    kubelet_dir: PathBuf,
    /// How mount tables are read: `auto` checks each namespace with listmount/statmount (Linux
    /// 6.8+) and reads mountinfo text only where a wanted device is mounted; `mountinfo` reads the
    /// text of every namespace.
    #[arg(long, global = true, value_enum, default_value_t = ReaderArg::Auto)]
    mount_reader: ReaderArg,
    /// PID 1 cannot be inspected on this machine (a sandbox supervisor or an LSM shields it even
    /// from root): trust that it holds no device. Without this, PID 1 is a blind spot and every
    /// cleanup candidate is `unknown`. Never needed on a normal node.
    #[arg(long, global = true, env = "BLOCKJANITOR_TRUST_UNREADABLE_INIT")]
    trust_unreadable_init: bool,
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
        #[arg(long, short, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Detach a loop device (LOOP_CLR_FD) when nothing holds it; refuse with the holders
    /// otherwise. Dry run unless --apply.
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
    /// Address for /metrics over HTTP.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Seconds between periodic rescans [default: 60].
    #[arg(long, value_name = "SECONDS")]
    rescan_interval: Option<u64>,
    /// Seconds a mapping must stay unheld, across scans, before it is stale [default: 300].
    #[arg(long, value_name = "SECONDS")]
    grace_period: Option<u64>,
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
}

fn main() -> ExitCode {
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
    ScanOptions { reader: MountReader::from(cli.mount_reader), kubelet_dir: cli.kubelet_dir.clone() }
}

/// One device's scan: its entry, the graph and snapshot it came from, and the devices in scope
/// (it and what is stacked on it).
struct DeviceScan {
    entry: DeviceEntry,
    graph: DeviceGraph,
    snap: Snapshot,
    scope: Vec<DevNum>,
}

impl DeviceScan {
    /// The device's verdict (the grace clocks of the devices in scope are updated).
    fn judgement(&self, cli: &Cli, host: &HostRoot) -> Option<Judgement> {
        judge(cli, host, &self.graph, Some(&self.scope)).remove(&self.entry.device.devnum)
    }
}

/// Scans for one device and what is stacked on it.
fn scan_device(host: &HostRoot, opts: &ScanOptions, arg: &str) -> Result<DeviceScan> {
    let started = Instant::now();
    let devices = blockdev::scan(host)?;
    let devnum = resolve::device(host, &devices, arg)?.devnum;
    let scope = blockdev::with_descendants(&devices, devnum);
    let snap = Snapshot::take_with(host, devices, &Scope::Devices(scope.clone()), started, opts)?;
    let graph = DeviceGraph::build(&snap);
    let entry =
        graph.get(devnum).cloned().with_context(|| format!("device {devnum} disappeared during the scan"))?;
    Ok(DeviceScan { entry, graph, snap, scope })
}

/// Verdicts for the devices in `scope` (all when `None`): the grace clocks come from and go back
/// to `--state`, so the grace period spans runs (not for fixture trees).
fn judge(cli: &Cli, host: &HostRoot, graph: &DeviceGraph, scope: Option<&[DevNum]>) -> render::Verdicts {
    let live = host.is_live();
    let mut tracker = if live { Tracker::load(&cli.state) } else { Tracker::default() };
    let scoped = DeviceGraph {
        host_ns: graph.host_ns,
        devices: graph
            .devices
            .iter()
            .filter(|e| scope.is_none_or(|s| s.contains(&e.device.devnum)))
            .cloned()
            .collect(),
    };
    let protected = protected_devices(host, graph, &Config::default().protected_paths, &[]);
    let verdicts =
        tracker.judge_some(&scoped, &protected, Duration::from_secs(cli.grace_period), SystemTime::now());
    if live {
        if let Err(e) = tracker.save(&cli.state) {
            tracing::warn!(
                "cannot save {}: {e}; the grace period restarts on the next run",
                cli.state.display()
            );
        }
    }
    verdicts
}

/// Rescans a device by number; `None` when it is gone.
fn rescan(host: &HostRoot, opts: &ScanOptions, devnum: DevNum) -> Result<Option<DeviceScan>> {
    match scan_device(host, opts, &devnum.to_string()) {
        Ok(x) => Ok(Some(x)),
        Err(e) if e.downcast_ref::<resolve::ResolveError>().is_some() => Ok(None),
        Err(e) => Err(e),
    }
}

fn run(cli: &Cli) -> Result<u8> {
    let host = host(cli);
    let opts = scan_options(cli);
    match &cli.command {
        Command::Scan { output } => {
            let started = Instant::now();
            let devices = blockdev::scan(&host)?;
            let snap = Snapshot::take_with(&host, devices, &Scope::All, started, &opts)?;
            let graph = DeviceGraph::build(&snap);
            let verdicts = judge(cli, &host, &graph, None);
            match output {
                Output::Json => {
                    print_json(&render::scan_json(&graph, &verdicts, &snap.stats, &snap.warnings))?
                }
                Output::Table => {
                    print!("{}", render::scan_table(&graph, &verdicts, &snap.stats, &snap.warnings))
                }
            }
            Ok(0)
        }
        Command::Holders { device, output } => {
            let d = scan_device(&host, &opts, device)?;
            let j = d.judgement(cli, &host);
            let (stats, warnings) = (&d.snap.stats, &d.snap.warnings);
            match output {
                Output::Json => print_json(&render::holders_json(&d.entry, j.as_ref(), stats, warnings))?,
                Output::Table => print!("{}", render::holders_table(&d.entry, j.as_ref(), stats, warnings)),
            }
            Ok(0)
        }
        Command::Release { device, apply, output } => {
            let d = scan_device(&host, &opts, device)?;
            let mut plan = plan::release(&d.entry);
            plan::safety_gate(&mut plan, &d.entry, d.judgement(cli, &host).as_ref());
            carry_out(cli, &host, &plan, *apply, *output, |_| Ok(()))
        }
        Command::Clean { device, apply, deferred_remove, force, output } => {
            let d = scan_device(&host, &opts, device)?;
            let clean_opts = plan::CleanOptions { deferred_remove: *deferred_remove, force_unmap: *force };
            let mut plan = plan::for_clean(&d.entry, &d.graph, clean_opts);
            // Maps, disks, rbd and nbd go only once stale (grace measured across runs); nothing is
            // done to a protected device or one a pod uses.
            plan::gate(&mut plan, &d.entry, d.judgement(cli, &host).as_ref());
            let devnum = plan.devnum;
            let recheck_host = host.clone();
            let recheck_opts = opts.clone();
            carry_out(cli, &host, &plan, *apply, *output, move |step| {
                plan::recheck(step, || {
                    rescan(&recheck_host, &recheck_opts, devnum)
                        .map(|d| d.map(|d| d.entry))
                        .map_err(|e| blockjanitor::errors::one_line(e.as_ref()))
                })
            })
        }
        Command::Serve(args) => serve(cli, args, host),
        Command::Journal => {
            let path = journal_path(cli);
            let pending =
                journal::pending(&path).with_context(|| format!("cannot read {}", path.display()))?;
            if pending.is_empty() {
                println!("no unfinished steps in {}", path.display());
            }
            for p in pending {
                println!("unfinished: {p}");
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
    if let Some(v) = a.metrics_listen {
        c.metrics.listen = Some(v);
    }
    if let Some(v) = a.rescan_interval {
        c.rescan_interval_seconds = v;
    }
    if let Some(v) = a.grace_period {
        c.grace_period_seconds = v;
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
    if let Some(j) = &cli.journal {
        c.journal = j.clone();
    }
    c.kubelet_dir = cli.kubelet_dir.clone();
    c.validate()?;
    Ok(c)
}

fn serve(cli: &Cli, args: &ServeArgs, host: HostRoot) -> Result<u8> {
    let config = serve_config(cli, args)?;
    for p in journal::pending(&config.journal).unwrap_or_default() {
        tracing::warn!("a previous run did not finish this step; it will be re-planned if asked again: {p}");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async move {
        let metrics = Arc::new(Metrics::new()?);
        let every = config.rescan_interval();
        let state = AgentState::new(host, config, metrics);
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
        state.scan_once("start").await;
        tokio::spawn(Arc::clone(&state).run_scanner(stop.clone()));
        tokio::spawn(triggers::watch_kernel_uevents(Arc::clone(&state), stop.clone()));
        triggers::spawn_udev_watch(Arc::clone(&state), stop.clone());
        tokio::spawn(triggers::watch_mount_table(Arc::clone(&state), stop.clone()));
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
                blockjanitor::kube::spawn_watch(client.clone(), &state.node_name, Default::default());
            state.use_kubernetes(view, blockjanitor::kube::Reporter::new(client, &state.node_name));
            tracing::info!(node = %state.node_name, "using the Kubernetes API");
        }
        Err(e) => tracing::warn!("running without the Kubernetes API: {e}"),
    }
}

fn carry_out(
    cli: &Cli,
    host: &HostRoot,
    plan: &Plan,
    apply: bool,
    output: Output,
    recheck: impl FnMut(&plan::Step) -> Result<(), String>,
) -> Result<u8> {
    let refused_held = plan.refusal.is_some() && !plan.unsupported;
    if output == Output::Table {
        print!("{}", render::plan_text(plan, apply && host.is_live()));
    }
    if plan.refusal.is_some() || !apply || plan.steps.is_empty() {
        if output == Output::Json {
            print_json(&serde_json::json!({ "plan": plan, "applied": false }))?;
        }
        return Ok(match (&plan.refusal, refused_held) {
            (Some(_), true) => EXIT_HELD,
            (Some(r), false) => anyhow::bail!("{r}"),
            (None, _) => 0,
        });
    }
    if !host.is_live() {
        anyhow::bail!(
            "--apply needs the live host: {} is not this process's procfs (a fixture tree?); \
             namespaces and devices cannot be acted on through it",
            host.proc().display()
        );
    }
    let journal_file = journal_path(cli);
    for p in journal::pending(&journal_file).unwrap_or_default() {
        eprintln!("warning: a previous run did not finish this step (re-planned from a fresh scan): {p}");
    }
    let mut journal = Journal::open(&journal_file).with_context(|| {
        format!("cannot open the journal {} (needed before any change)", journal_file.display())
    })?;
    let actuator = LinuxActuator::new(host.clone(), Duration::from_secs(cli.timeout));
    let reports: Vec<StepReport> = execute(plan, &actuator, &mut journal, recheck);
    let failed = reports.iter().any(|r| r.result.is_err());
    let deferred = reports.iter().any(|r| matches!(r.result, Ok(StepOutcome::Deferred(_))));
    let after = rescan(host, &scan_options(cli), plan.devnum)?;
    let still_held = after.as_ref().is_some_and(|d| !d.entry.holders.is_empty());
    match output {
        Output::Table => {
            print!("{}", render::reports_text(&reports));
            match &after {
                Some(d) if !d.entry.holders.is_empty() => {
                    println!("still held after {}:", plan.operation);
                    print!("{}", render::holders_table(&d.entry, None, &d.snap.stats, &d.snap.warnings));
                }
                Some(d) if d.entry.device.is_unbound_loop() => {
                    println!("{} is free and unbound", d.entry.device.name)
                }
                Some(d) => println!("{} is free: nothing holds it any more", d.entry.device.name),
                None => println!("{} is gone", plan.device),
            }
        }
        Output::Json => print_json(&serde_json::json!({
            "plan": plan,
            "applied": true,
            "results": reports,
            "after": after.as_ref().map(|d| render::holders_json(&d.entry, None, &d.snap.stats, &d.snap.warnings)),
        }))?,
    }
    Ok(if failed {
        1
    } else if still_held || deferred {
        EXIT_HELD
    } else {
        0
    })
}
