//! `agentctl`: talk to the blockjanitor agent on this node (unix socket) or on another node (TCP
//! with mutual TLS). Parses flags, makes one call (`apply --yes`: a Plan, shown, then the Apply
//! bound to the identities it answered; `watch`: a stream), prints; the formatting is in
//! [`blockjanitor::client`]. Exit codes: 0 ok, 1 error (the agent refused the call, e.g. a
//! device changed since it was planned), 2 not carried out (no --yes, a plan refused, a step
//! deferred).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use serde_json::Value;

use blockjanitor::client::{self, Target, TcpTarget, DEFAULT_SOCKET};
use blockjanitor::judge::Verdict;
use blockjanitor::model::DeviceKind;
use blockjanitor::server::convert;
use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use tonic::transport::Channel;

const EXIT_NOT_DONE: u8 = 2;

#[derive(Parser, Debug)]
#[command(
    name = "agentctl",
    version,
    about = "Ask the blockjanitor agent which block devices are stale and who holds them; plan and carry out their cleanup.",
    long_about = "Ask the blockjanitor agent which block devices are stale and who holds them; plan and carry out \
their cleanup; watch what changes.\n\nBy default agentctl talks to the agent on this node over its unix socket: \
root is an operator, members of the socket's group may read. With --addr it talks to an agent on another node \
over TCP with mutual TLS, and the name in the client certificate decides the role.\n\nOnly `apply --yes` \
changes anything.",
    after_help = "EXAMPLES:\n  agentctl node\n  agentctl devices --stale\n  agentctl devices --kind loop -o yaml\n  \
agentctl holders rbd3 -o json\n  agentctl plan                          # every stale device\n  \
agentctl apply loop3                   # show the plan, change nothing\n  \
agentctl apply loop3 --yes             # plan, show it, carry out exactly that\n  agentctl watch -o json\n  \
agentctl --addr node1:9443 --cert c.pem --key k.pem --ca ca.pem node\n  \
agentctl completions bash > /etc/bash_completion.d/agentctl\n\n\
EXIT CODES:\n  0  ok\n  1  error: cannot connect, bad argument, the agent refused the call, or a step failed\n  \
2  apply did not carry everything out: no --yes, a plan was refused, or a step was deferred"
)]
struct Cli {
    /// The agent's unix socket on this node.
    #[arg(long, global = true, help_heading = "Connection", env = "BLOCKJANITOR_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    /// Talk to the agent on another node over TCP with mutual TLS instead of the socket
    /// (needs --cert, --key and --ca).
    #[arg(long, global = true, help_heading = "Connection", value_name = "HOST:PORT")]
    addr: Option<String>,
    /// The fleet console, for `fleet` (needs --cert, --key and --ca).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "BLOCKJANITOR_CONSOLE",
        value_name = "HOST:PORT"
    )]
    console: Option<String>,
    /// Client certificate (PEM), for --addr and --console (fleet: also BLOCKJANITOR_CERT).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    cert: Option<PathBuf>,
    /// The client certificate's private key (PEM), for --addr and --console (fleet: also
    /// BLOCKJANITOR_KEY).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    key: Option<PathBuf>,
    /// CA certificate that signed the agent's (or console's) certificate (PEM) (fleet: also
    /// BLOCKJANITOR_CA).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    ca: Option<PathBuf>,
    /// Name the agent's certificate must carry [default: the host part of --addr].
    #[arg(long, global = true, help_heading = "Connection", value_name = "NAME")]
    server_name: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, help_heading = "Output", value_enum, default_value_t = Output::Table)]
    output: Output,
    /// Give up on connecting, and on each call, after this many seconds (`watch`: on connecting only).
    #[arg(long, global = true, help_heading = "Connection", default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout: u64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    /// Text for people.
    Table,
    /// Pretty JSON (watch: one object per line).
    Json,
    /// YAML (watch: one document per event).
    Yaml,
}

/// Which devices to list (`devices`, `fleet devices`): filters combine.
#[derive(Debug, Clone, clap::Args)]
struct DeviceFilter {
    /// Only devices of this kind.
    #[arg(long, value_enum)]
    kind: Option<DeviceKind>,
    /// Only devices with this verdict.
    #[arg(long, value_enum, conflicts_with = "stale")]
    verdict: Option<Verdict>,
    /// Only stale devices (same as --verdict stale).
    #[arg(long)]
    stale: bool,
}

impl DeviceFilter {
    /// The kind and verdict as the wire carries them (unspecified: any).
    fn wire(&self) -> (i32, i32) {
        let verdict = if self.stale { Some(Verdict::Stale) } else { self.verdict };
        (
            self.kind.map_or(pb::DeviceKind::Unspecified, convert::kind) as i32,
            verdict.map_or(pb::Verdict::Unspecified, convert::verdict) as i32,
        )
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// This node and its agent: name, kernel, version, whether the Kubernetes API vouches, last
    /// scan, warnings and blind spots.
    #[command(
        long_about = "This node and its agent: name, kernel, agent version, mode, whether the Kubernetes API \
vouches for the verdicts (`vouching`, `not configured`, or `cannot vouch: <why>`), the last scan, its warnings, \
and its blind spots: what the scan could not see. A cleanup candidate a blind spot could hide a holder of is \
`unknown`, never `stale`.",
        after_help = "EXAMPLES:\n  agentctl node\n  agentctl node -o json\n  \
agentctl --addr node1:9443 --cert c.pem --key k.pem --ca ca.pem node\n\nEXIT CODES:\n  0  ok\n  1  error"
    )]
    Node,
    /// Block devices from the agent's latest scan with their verdicts, optionally filtered.
    #[command(
        long_about = "Block devices from the agent's latest scan: name, MAJ:MIN, kind, size, verdict, number of \
holders and the first reason for the verdict. Filters combine (--kind loop --stale: stale loop devices).",
        after_help = "EXAMPLES:\n  agentctl devices\n  agentctl devices --stale\n  agentctl devices --kind rbd --verdict in_use\n  \
agentctl devices -o json | jq -r '.devices[] | select(.verdict == \"stale\") | .name'\n\n\
EXIT CODES:\n  0  ok (also when nothing matches)\n  1  error"
    )]
    Devices {
        #[command(flatten)]
        filter: DeviceFilter,
    },
    /// One device: its identity, its stack, its verdict with every reason, and who holds it.
    #[command(
        long_about = "One device: what it is, its kernel identity (what its number stands for now), what is \
stacked on or below it, its verdict with every reason, \
and one line per holder (mounts in every mount namespace, open fds, working directories, memory maps, swap, \
stacked devices, loop devices backed by it). Kernel threads named after it are shown as symptoms, not holders.\n\n\
DEVICE is a kernel name (loop3), a /dev path, a dm name or MAJ:MIN.",
        after_help = "EXAMPLES:\n  agentctl device loop3\n  agentctl device /dev/mapper/vg-data -o yaml\n  agentctl device 252:1\n\n\
EXIT CODES:\n  0  ok\n  1  error (e.g. NotFound: unknown device)"
    )]
    Device {
        /// Kernel name, /dev path, dm name or MAJ:MIN.
        device: String,
    },
    /// Who holds one device, one line per holder.
    #[command(
        long_about = "Who holds one device: one line per holder with the process, mount namespace, mount point, \
container and pod where the agent knows them. Kernel threads (jbd2/<dev>-8...) are symptoms, not holders.\n\n\
DEVICE is a kernel name (rbd3), a /dev path, a dm name or MAJ:MIN.",
        after_help = "EXAMPLES:\n  agentctl holders rbd3\n  agentctl holders rbd3 -o json\n  agentctl holders /dev/loop3\n\n\
EXIT CODES:\n  0  ok\n  1  error (e.g. NotFound: unknown device)"
    )]
    Holders {
        /// Kernel name, /dev path, dm name or MAJ:MIN.
        device: String,
    },
    /// The steps that would clean the given devices (default: every stale one). Changes nothing.
    #[command(
        long_about = "The ordered steps that would clean the given devices, planned by the agent from a fresh \
scan: detach mounts in other mount namespaces (detach_mount), then tear the device down by its kind \
(detach_loop, nbd_disconnect, rbd_unmap, dm_message and dm_remove, scsi_offline and scsi_delete). Shows the \
identity each plan was made for, what it leaves alone and why, and why a plan is refused. Changes \
nothing.\n\nWith no DEVICE: every device whose verdict is stale. A script that applies later passes each plan's \
`identity` (JSON) to `apply --identity`.",
        after_help = "EXAMPLES:\n  agentctl plan\n  agentctl plan loop3 rbd0\n  agentctl plan loop3 -o json\n\n\
EXIT CODES:\n  0  ok (also when a plan is refused: read the plan)\n  1  error"
    )]
    Plan {
        /// Devices to plan for [default: every stale device].
        devices: Vec<String>,
        /// Plan only the release of the copies of their mounts that other mount namespaces keep
        /// (incident 5); the devices themselves stay. Needs the devices named.
        #[arg(long)]
        release: bool,
    },
    /// Carry out the plans for the given devices; without --yes only show them.
    #[command(
        long_about = "Carry out the plans for the given devices. With --yes, agentctl asks the agent for the \
plans, shows them, and applies them bound to the identities they were made for: if a device number now \
stands for another kernel object (a loop device detached and attached to another file, an nbd index or rbd \
id reused), the agent refuses with FailedPrecondition naming both identities, and nothing is done. The agent \
re-plans each device from a fresh scan, re-checks every step right before it runs, and journals and audits \
it. Needs the operator role (root on the socket, or an operator certificate).\n\nWith --identity (one per \
device, in the same order, as `agentctl plan -o json` printed them), the apply is bound to that earlier plan \
instead and no plan is asked for.\n\nWithout --yes, shows the plans and changes nothing.",
        after_help = "EXAMPLES:\n  agentctl apply loop3                 # show the plan, change nothing\n  \
agentctl apply loop3 --yes           # plan, show it, carry out exactly that\n  \
agentctl apply loop3 loop4 --yes -o json\n  \
id=$(agentctl plan loop3 -o json | jq -r '.plans[0].identity')\n  \
agentctl apply loop3 --yes --identity \"$id\"\n\n\
EXIT CODES:\n  0  every step done (or already absent)\n  \
1  error (e.g. FailedPrecondition: the device changed since it was planned), or a step failed\n  \
2  not carried out: no --yes, a plan was refused, or a step was deferred"
    )]
    Apply {
        /// Devices to clean (kernel name, /dev path, dm name or MAJ:MIN).
        #[arg(required = true)]
        devices: Vec<String>,
        /// Only release the copies of their mounts that other mount namespaces keep, inside each
        /// holder's namespace (no process is killed; live host mounts are never touched); the
        /// devices stay. Needs no stale verdict.
        #[arg(long)]
        release: bool,
        /// Carry out the plans (without it: show them only).
        #[arg(long)]
        yes: bool,
        /// The identity an earlier plan was made for, one per device in the same order ("" for
        /// none): the agent refuses a device that is now another one. Repeatable; needs --yes.
        #[arg(long = "identity", value_name = "TOKEN", requires = "yes")]
        identities: Vec<String>,
    },
    /// Stream what changes (devices, holders, verdicts, actions) until Ctrl-C or the agent stops.
    #[command(
        long_about = "Stream what changes on the node: devices appearing and going, holders and verdicts \
changing, actions starting and finishing. Starts with no backlog. Runs until Ctrl-C or until the agent ends \
the stream; --timeout bounds only the connection.\n\nTable: one line per event. JSON: one object per line. \
YAML: one document per event.",
        after_help = "EXAMPLES:\n  agentctl watch\n  agentctl watch -o json | jq -c 'select(.type == \"verdict_changed\")'\n\n\
EXIT CODES:\n  0  stopped by Ctrl-C or by the agent\n  1  error (cannot connect, stream broken)"
    )]
    Watch,
    /// Ask the fleet console about every node at once (see `agentctl fleet --help`).
    #[command(
        long_about = "Ask the fleet console (blockjanitor-console) about every node at once: which nodes map an \
image, a PV or a PVC; which node a Ceph watcher belongs to and whether unfencing it is safe; why a volume is \
stuck in Multi-Attach; every volume on several nodes, attached but unused, or held by a dead node (sweep); \
each node's plan (plan) and carrying it out (apply). Needs --console HOST:PORT with --cert, --key and --ca (mutual TLS). Every answer lists \
the nodes it could not speak for.\n\nInstalled as `kubectl-blockjanitor` (a symlink), this is the kubectl \
plugin: `kubectl blockjanitor where shop/data-db-0`.",
        after_help = "EXAMPLES:\n  agentctl fleet nodes --console console:9444 --cert c.pem --key k.pem --ca ca.pem\n  \
agentctl fleet where k8s/kubernetes-dynamic-pvc-0a5eb91b\n  agentctl fleet where shop/data-db-0   # a PVC\n  \
rbd status k8s/img | agentctl fleet who-watches -\n  agentctl fleet multiattach shop/data-db-0 -o json\n  \
agentctl fleet sweep\n  agentctl fleet plan node-a\n\n\
EXIT CODES:\n  0  ok\n  1  error"
    )]
    Fleet {
        #[command(subcommand)]
        command: FleetCommand,
    },
    /// Print a shell completion script to stdout.
    #[command(after_help = "EXAMPLES:\n  agentctl completions bash > /etc/bash_completion.d/agentctl\n  \
agentctl completions zsh > \"${fpath[1]}/_agentctl\"\n  agentctl completions fish > ~/.config/fish/completions/agentctl.fish\n\n\
EXIT CODES:\n  0  ok\n  1  error")]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: Shell,
    },
}

/// The fleet console's questions.
#[derive(Subcommand, Debug)]
enum FleetCommand {
    /// Every node's agent: reachable or not, devices, last sync, last error.
    Nodes,
    /// Devices across the fleet, optionally filtered.
    Devices {
        #[command(flatten)]
        filter: DeviceFilter,
        /// Only this node.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Ask every agent now instead of answering from the console's index.
        #[arg(long)]
        fresh: bool,
    },
    /// Which nodes map a Ceph image (POOL/IMAGE), a PV (NAME or pv/NAME), a PVC (NAMESPACE/NAME
    /// or pvc/NAMESPACE/NAME) or a WWID, with holders and verdicts.
    Where {
        /// POOL/IMAGE, NAMESPACE/PVC, pvc/NAMESPACE/NAME, pv/NAME, a PV name or a WWID.
        what: String,
        /// Ask every agent now instead of answering from the console's index.
        #[arg(long)]
        fresh: bool,
    },
    /// Which node and device a Ceph watcher belongs to, and whether unfencing it is safe. WATCHER
    /// is a client address as Ceph prints it (IP:0/NONCE, v1:IP:0/NONCE, [v2:...,v1:...],
    /// [IPv6]:0/NONCE), an IP or range, a client id (client.N), a `rbd status` or `ceph osd
    /// blocklist ls` line, or `-` to read such output from stdin. Input it does not understand is
    /// an error, never an answer.
    WhoWatches {
        /// IP:0/NONCE (with or without v1:/v2:), IP, client.N, a watcher= or blocklist line, or `-`.
        watcher: String,
        /// Ask every agent now instead of answering from the console's index.
        #[arg(long)]
        fresh: bool,
    },
    /// For a PV or PVC: one diagnosis per node (in_use_correct, stale_mapping with the steps that
    /// clear it, safe_to_delete_va, unknown). Without one: the fleet-wide sweep (as `fleet
    /// sweep`, with its exit codes).
    Multiattach {
        /// A PV name, pv/NAME, NAMESPACE/PVC or pvc/NAMESPACE/NAME (none: sweep every volume).
        volume: Option<String>,
    },
    /// Every volume across the fleet: mapped on more than one node, attached but not in use, or
    /// watched by a client of a node whose agent cannot be asked. Exit code 0 when every node
    /// answered and nothing was found (clean), 2 when something was found, 3 when a node did not
    /// answer (incomplete: never read as clean, whatever was found).
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet sweep\n  agentctl fleet sweep --kind dead_node_watcher -o json\n\n\
EXIT CODES:\n  0  clean: every node answered, nothing found\n  1  error\n  2  findings (every node answered)\n  \
3  incomplete: a node (or the Kubernetes view) did not answer"
    )]
    Sweep {
        /// Only this kind (multi_node, attached_not_in_use, dead_node_watcher), repeatable.
        #[arg(long, value_name = "KIND", value_parser = blockjanitor::fleet_render::parse_finding_kind)]
        kind: Vec<pb::FindingKind>,
        /// Ask every agent now instead of answering from the console's index.
        #[arg(long)]
        fresh: bool,
    },
    /// The dry run: each node's plan (through the console, as the caller), with a per-node
    /// summary of the steps that would run and what is refused and why. Nothing is changed. NODE
    /// alone plans every stale device on it. Exit code 2 when anything is refused.
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet plan node-a                 # every stale device on node-a\n  \
agentctl fleet plan node-a/rbd4 node-b/rbd0\n  agentctl fleet plan node-a -o json\n\n\
EXIT CODES:\n  0  every node's plan may run\n  1  error\n  2  something is refused (see the summary)"
    )]
    Plan {
        /// NODE (every stale device on it) or NODE/DEVICE, repeatable.
        #[arg(required = true, value_name = "NODE[/DEVICE]")]
        targets: Vec<String>,
    },
    /// Clean devices on one or more nodes through the console: a dry run of every node's plan
    /// is shown first, then, once confirmed (or with --yes), the same plans are carried out,
    /// bound to the identities they were made for. Exit code 2 when nothing or not everything
    /// ran (a refusal, no confirmation, a step deferred or failed).
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet apply node-a/rbd4 node-b/rbd0   # show, ask, carry out\n  \
agentctl fleet apply node-a/rbd4 --yes          # show, carry out without asking\n  \
agentctl fleet apply node-a/rbd4 --identity \"$id\" --yes   # bound to an earlier plan"
    )]
    Apply {
        /// NODE/DEVICE, repeatable.
        #[arg(required = true, value_name = "NODE/DEVICE")]
        devices: Vec<String>,
        /// The identity an earlier Plan returned for each device, in the same order (repeat
        /// once per device). Without it, each node's plan is read now and the dry run shows it.
        #[arg(long, value_name = "ID")]
        identity: Vec<String>,
        /// Do not ask before carrying the plans out (the dry run is still shown first, and a
        /// refusal in it still stops everything).
        #[arg(long)]
        yes: bool,
    },
}

/// As the kubectl plugin (`kubectl-blockjanitor`, run by `kubectl blockjanitor ...`), the
/// arguments are those of `agentctl fleet`.
fn arguments() -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let plugin =
        args.first().and_then(|a| Path::new(a).file_name()).is_some_and(|n| n == "kubectl-blockjanitor");
    if plugin {
        args.insert(1, "fleet".into());
    }
    args
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(arguments()) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", blockjanitor::errors::one_line(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

/// Where to connect, from the flags.
fn target(cli: &Cli) -> Result<Target> {
    let Some(addr) = &cli.addr else {
        if cli.cert.is_some() || cli.key.is_some() || cli.ca.is_some() || cli.server_name.is_some() {
            bail!("--cert, --key, --ca and --server-name are for TCP: add --addr HOST:PORT");
        }
        return Ok(Target::Unix(cli.socket.clone()));
    };
    let (host, _) = client::split_host_port(addr)
        .with_context(|| format!("--addr '{addr}' is not HOST:PORT (e.g. node1:9443 or [fd00::1]:9443)"))?;
    let missing: Vec<&str> = [("--cert", &cli.cert), ("--key", &cli.key), ("--ca", &cli.ca)]
        .into_iter()
        .filter(|(_, v)| v.is_none())
        .map(|(flag, _)| flag)
        .collect();
    let (Some(cert), Some(key), Some(ca)) = (&cli.cert, &cli.key, &cli.ca) else {
        bail!("--addr needs --cert, --key and --ca (mutual TLS); missing {}", missing.join(", "));
    };
    Ok(Target::Tcp(TcpTarget {
        addr: addr.clone(),
        cert: cert.clone(),
        key: key.clone(),
        ca: ca.clone(),
        server_name: cli.server_name.clone().unwrap_or_else(|| host.to_owned()),
    }))
}

fn run(cli: &Cli) -> Result<u8> {
    if let Command::Completions { shell } = &cli.command {
        let mut buf = Vec::new();
        clap_complete::generate(*shell, &mut Cli::command(), "agentctl", &mut buf);
        write_out(&String::from_utf8_lossy(&buf))?;
        return Ok(0);
    }
    if let Command::Fleet { command } = &cli.command {
        let target = console_target(cli)?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")?;
        return rt.block_on(fleet(cli, command, &target)).map_err(tls_hint(&target));
    }
    let target = target(cli)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(run_async(cli, &target)).map_err(tls_hint(&target))
}

/// Where the console is, from the flags.
fn console_target(cli: &Cli) -> Result<Target> {
    let Some(addr) = &cli.console else {
        bail!("fleet needs --console HOST:PORT (or BLOCKJANITOR_CONSOLE) with --cert, --key and --ca");
    };
    if cli.addr.is_some() {
        bail!("--addr names one agent; fleet talks to the console: use --console only");
    }
    let (host, _) = client::split_host_port(addr)
        .with_context(|| format!("--console '{addr}' is not HOST:PORT (e.g. blockjanitor-console:9444)"))?;
    // For fleet only, the files may come from the environment (the kubectl plugin's usual way);
    // the local commands never pick them up from there.
    let file =
        |flag: &Option<PathBuf>, var: &str| flag.clone().or_else(|| std::env::var_os(var).map(PathBuf::from));
    let (Some(cert), Some(key), Some(ca)) = (
        file(&cli.cert, "BLOCKJANITOR_CERT"),
        file(&cli.key, "BLOCKJANITOR_KEY"),
        file(&cli.ca, "BLOCKJANITOR_CA"),
    ) else {
        bail!("--console needs --cert, --key and --ca (or BLOCKJANITOR_CERT, _KEY, _CA): mutual TLS");
    };
    Ok(Target::Tcp(TcpTarget {
        addr: addr.clone(),
        cert,
        key,
        ca,
        server_name: cli.server_name.clone().unwrap_or_else(|| host.to_owned()),
    }))
}

/// One question to the fleet console.
async fn fleet(cli: &Cli, command: &FleetCommand, target: &Target) -> Result<u8> {
    use blockjanitor::fleet_render as fr;
    use blockjanitor_proto::v1::fleet_client::FleetClient;
    let timeout = Duration::from_secs(cli.timeout);
    let mut c =
        FleetClient::new(client::connect_channel(target, timeout).await?).max_decoding_message_size(64 << 20);
    let out = cli.output;
    let text = match command {
        FleetCommand::Nodes => {
            let r = client::call(timeout, c.list_nodes(client::request(pb::ListNodesRequest {}, timeout)))
                .await
                .map_err(status)?;
            render(out, || fr::nodes_value(&r), || fr::nodes_table(&r, client::now_secs()))?
        }
        FleetCommand::Devices { filter, node, fresh } => {
            let (kind, verdict) = filter.wire();
            let req = pb::FleetListDevicesRequest {
                kind,
                verdict,
                node: node.clone().unwrap_or_default(),
                fresh: *fresh,
            };
            let r =
                client::call(timeout, c.list_devices(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::devices_value(&r), || fr::devices_table(&r))?
        }
        FleetCommand::Where { what, fresh } => {
            let req = pb::WhereRequest { query: what.clone(), fresh: *fresh, ..Default::default() };
            let r = client::call(timeout, c.r#where(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::where_value(&r), || fr::where_table(&r))?
        }
        FleetCommand::WhoWatches { watcher, fresh } => {
            let mut req = pb::WhoWatchesRequest { fresh: *fresh, ..Default::default() };
            if watcher == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin().lock(), &mut text)
                    .context("cannot read the watcher text from stdin")?;
                req.text = text;
            } else {
                // Whatever was pasted (an address with or without its v1:/v2: prefix, a vector, a
                // client id, a `rbd status` or `ceph osd blocklist ls` line): the console parses
                // it and refuses what it does not understand (INVALID_ARGUMENT, exit non-zero).
                req.text = watcher.clone();
            }
            let r =
                client::call(timeout, c.who_watches(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::who_watches_value(&r), || fr::who_watches_table(&r))?
        }
        FleetCommand::Multiattach { volume: None } => {
            let req = pb::MultiAttachRequest::default();
            let r =
                client::call(timeout, c.multi_attach(client::request(req, timeout))).await.map_err(status)?;
            write_out(&render(out, || fr::multiattach_value(&r), || fr::multiattach_table(&r))?)?;
            return Ok(r.sweep.as_ref().map_or(1, sweep_exit_code));
        }
        FleetCommand::Multiattach { volume: Some(volume) } => {
            let mut req = pb::MultiAttachRequest::default();
            if let Some(pv) = volume.strip_prefix("pv/") {
                req.pv = pv.to_owned();
            } else if let Some(pvc) = volume.strip_prefix("pvc/") {
                req.pvc = pvc.to_owned();
            } else if volume.contains('/') {
                req.pvc = volume.clone();
            } else {
                req.pv = volume.clone();
            }
            let r =
                client::call(timeout, c.multi_attach(client::request(req, timeout))).await.map_err(status)?;
            render(out, || fr::multiattach_value(&r), || fr::multiattach_table(&r))?
        }
        FleetCommand::Apply { devices, identity, yes } => {
            return fleet_apply(&mut c, cli, devices, identity, *yes).await;
        }
        FleetCommand::Sweep { kind, fresh } => {
            let req = pb::SweepRequest { fresh: *fresh, kinds: kind.iter().map(|k| *k as i32).collect() };
            let r = client::call(timeout, c.sweep(client::request(req, timeout))).await.map_err(status)?;
            write_out(&render(out, || fr::sweep_value(&r), || fr::sweep_table(&r))?)?;
            return Ok(sweep_exit_code(&r));
        }
        FleetCommand::Plan { targets } => return fleet_plan(&mut c, cli, targets).await,
    };
    write_out(&text)?;
    Ok(0)
}

/// `fleet apply`: identities (given, or from each node's plan now), the console's dry run shown,
/// a confirmation unless `yes`, then the same request carried out.
async fn fleet_apply(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<tonic::transport::Channel>,
    cli: &Cli,
    devices: &[String],
    identity: &[String],
    yes: bool,
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let out = cli.output;
    let targets = client::fleet_targets(devices).map_err(anyhow::Error::msg)?;
    let identities: Vec<Vec<String>> = if identity.is_empty() {
        let mut all = Vec::new();
        for (node, devs) in &targets {
            let req = pb::FleetPlanRequest { node: node.clone(), devices: devs.clone() };
            let p = client::call(timeout, c.plan(client::request(req, timeout))).await.map_err(status)?;
            let plans = p.plan.unwrap_or_default().plans;
            all.push(
                devs.iter()
                    .map(|d| {
                        plans.iter().find(|p| &p.device == d).map(|p| p.identity.clone()).unwrap_or_default()
                    })
                    .collect(),
            );
        }
        all
    } else {
        // Given in argument order: hand them out to the devices as they were named.
        if identity.len() != devices.len() {
            bail!(
                "{} --identity for {} devices: give one per NODE/DEVICE, in the same order",
                identity.len(),
                devices.len()
            );
        }
        let mut given = devices.iter().zip(identity).collect::<Vec<_>>();
        targets
            .iter()
            .map(|(node, devs)| {
                devs.iter()
                    .map(|d| {
                        let at = given.iter().position(|(a, _)| **a == format!("{node}/{d}")).unwrap_or(0);
                        given.remove(at).1.clone()
                    })
                    .collect()
            })
            .collect()
    };
    let request = client::fleet_apply_request(&targets, &identities, false);
    let dry =
        client::call(timeout, c.apply(client::request(request.clone(), timeout))).await.map_err(status)?;
    if !write_out(&render(out, || client::fleet_apply_value(&dry), || client::fleet_summary_table(&dry))?)? {
        return Ok(2);
    }
    if client::fleet_dry_run_refuses(&dry) {
        eprintln!("nothing ran: the dry run refuses (see above)");
        return Ok(2);
    }
    if let Some(why) = blockjanitor::fleet_plan::over_budget(&dry) {
        eprintln!("nothing ran: {why}");
        return Ok(2);
    }
    if !yes {
        let steps: u32 = dry.summary.iter().map(|n| n.steps).sum();
        eprint!("Carry out these {steps} step(s) on {} node(s)? [y/N] ", dry.summary.len());
        let mut answer = String::new();
        let read = std::io::stdin().read_line(&mut answer).unwrap_or(0);
        if read == 0 || !matches!(answer.trim(), "y" | "Y" | "yes" | "YES") {
            eprintln!("nothing ran (not confirmed; --yes skips the question)");
            return Ok(2);
        }
    }
    let request = pb::FleetApplyRequest { execute: true, ..request };
    // Carrying out may take a while: the agents' own bound.
    let long = timeout.max(Duration::from_secs(300));
    let done = client::call(long, c.apply(client::request(request, long))).await.map_err(status)?;
    write_out(&render(out, || client::fleet_apply_value(&done), || client::fleet_results_table(&done))?)?;
    Ok(if client::fleet_all_done(&done) { 0 } else { 2 })
}

/// A sweep's exit code: 0 clean (complete, nothing found), 2 findings, 3 incomplete.
fn sweep_exit_code(r: &pb::SweepResponse) -> u8 {
    match (r.complete, r.findings.is_empty()) {
        (false, _) => 3,
        (true, false) => 2,
        (true, true) => 0,
    }
}

/// `fleet plan`: each node's plan through the console (as the caller: the console's per-caller
/// limit counts it), summarised per node as `fleet apply` shows its dry run. Every node is asked
/// even when one fails; its failure is its refusal.
async fn fleet_plan(
    c: &mut blockjanitor_proto::v1::fleet_client::FleetClient<tonic::transport::Channel>,
    cli: &Cli,
    targets: &[String],
) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let targets = blockjanitor::fleet_plan::plan_targets(targets).map_err(anyhow::Error::msg)?;
    let mut summary = Vec::new();
    for (node, devices) in &targets {
        let req = pb::FleetPlanRequest { node: node.clone(), devices: devices.clone() };
        let plan = client::call(timeout, c.plan(client::request(req, timeout)))
            .await
            .map(|p| p.plan.unwrap_or_default())
            .map_err(|s| client::status_line(&s));
        summary.push(blockjanitor::fleet_plan::summarise(node, devices, plan));
    }
    let r = pb::FleetApplyResponse { summary, ..Default::default() };
    write_out(&render(cli.output, || client::fleet_apply_value(&r), || client::fleet_summary_table(&r))?)?;
    Ok(if client::fleet_dry_run_refuses(&r) { 2 } else { 0 })
}

/// Writes to stdout; a closed pipe (`| head`) is not an error. `Ok(false)` when it was closed.
fn write_out(s: &str) -> Result<bool> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

/// The response in the chosen format.
fn render(output: Output, value: impl FnOnce() -> Value, table: impl FnOnce() -> String) -> Result<String> {
    Ok(match output {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(&value())? + "\n",
        Output::Yaml => serde_yaml_ng::to_string(&value())?,
    })
}

fn status(s: tonic::Status) -> anyhow::Error {
    anyhow::anyhow!(client::status_line(&s))
}

/// Over TLS, an agent that rejects the client certificate just drops the connection after the
/// handshake: say so.
fn tls_hint(target: &Target) -> impl Fn(anyhow::Error) -> anyhow::Error + '_ {
    move |e| {
        let msg = e.to_string();
        let broken = ["Unknown: ", "Unavailable: ", "Cancelled: "].iter().any(|p| msg.starts_with(p));
        if matches!(target, Target::Tcp(_)) && broken && msg.contains("transport error") {
            anyhow::anyhow!(
                "{msg} (over TLS this usually means the agent rejected the client certificate: is --cert signed \
                 by the agent's client CA?)"
            )
        } else {
            e
        }
    }
}

async fn run_async(cli: &Cli, target: &Target) -> Result<u8> {
    let timeout = Duration::from_secs(cli.timeout);
    let mut c: AgentClient<Channel> = client::connect(target, timeout).await?;
    let out = cli.output;
    match &cli.command {
        Command::Completions { .. } | Command::Fleet { .. } => Ok(0),
        Command::Node => {
            let n = client::call(timeout, c.get_node(client::request(pb::GetNodeRequest {}, timeout)))
                .await
                .map_err(status)?;
            write_out(&render(
                out,
                || client::node_value(&n),
                || client::node_table(&n, client::now_secs()),
            )?)?;
            Ok(0)
        }
        Command::Devices { filter } => {
            let (kind, verdict) = filter.wire();
            let r = pb::ListDevicesRequest { kind, verdict };
            let r =
                client::call(timeout, c.list_devices(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(out, || client::devices_value(&r), || client::devices_table(&r))?)?;
            Ok(0)
        }
        Command::Device { device } => {
            let r = pb::GetDeviceRequest { device: device.clone() };
            let d = client::call(timeout, c.get_device(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(out, || client::device_value(&d), || client::device_table(&d, true))?)?;
            Ok(0)
        }
        Command::Holders { device } => {
            let r = pb::ListHoldersRequest { device: device.clone() };
            let r =
                client::call(timeout, c.list_holders(client::request(r, timeout))).await.map_err(status)?;
            let Some(d) = &r.device else { bail!("the agent answered without the device") };
            write_out(&render(out, || client::holders_value(&r), || client::device_table(d, false))?)?;
            Ok(0)
        }
        Command::Plan { devices, release } => {
            let r = pb::PlanRequest { devices: devices.clone(), operation: operation(*release) as i32 };
            let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(
                out,
                || client::plans_value(&r),
                || client::plans_table(&r, devices.is_empty()),
            )?)?;
            Ok(0)
        }
        Command::Apply { devices, yes: false, release, .. } => {
            let r = pb::PlanRequest { devices: devices.clone(), operation: operation(*release) as i32 };
            let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
            write_out(&render(out, || client::plans_value(&r), || client::plans_table(&r, false))?)?;
            eprintln!("not applied: add --yes to carry it out");
            Ok(EXIT_NOT_DONE)
        }
        Command::Apply { devices, yes: true, identities, release } => {
            let op = operation(*release);
            // Bound to identities: from --identity (planned earlier), else from a plan shown now.
            let (planned, request) = if identities.is_empty() {
                let r = pb::PlanRequest { devices: devices.clone(), operation: op as i32 };
                let r = client::call(timeout, c.plan(client::request(r, timeout))).await.map_err(status)?;
                if out == Output::Table {
                    write_out(&format!("{}\n", client::plans_table(&r, false)))?;
                }
                if r.plans.is_empty() {
                    eprintln!("not applied: nothing was planned");
                    return Ok(EXIT_NOT_DONE);
                }
                let request = client::apply_bound_to(&r, op);
                (r.plans, request)
            } else {
                let request =
                    client::apply_with_identities(devices, identities, op).map_err(anyhow::Error::msg)?;
                (Vec::new(), request)
            };
            let r =
                client::call(timeout, c.apply(client::request(request, timeout))).await.map_err(status)?;
            write_out(&render(out, || client::apply_value(&planned, &r), || client::apply_table(&r))?)?;
            Ok(client::apply_summary(&r).exit_code())
        }
        Command::Watch => watch(&mut c, timeout, out).await,
    }
}

/// The operation `--release` asks for (else a cleanup).
fn operation(release: bool) -> pb::Operation {
    if release {
        pb::Operation::Release
    } else {
        pb::Operation::Clean
    }
}

/// Streams events until Ctrl-C, the agent ends the stream, or stdout is closed.
async fn watch(c: &mut AgentClient<Channel>, timeout: Duration, out: Output) -> Result<u8> {
    let mut stream =
        client::call(timeout, c.watch_events(pb::WatchEventsRequest {})).await.map_err(status)?;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        let event = tokio::select! {
            _ = &mut ctrl_c => return Ok(0),
            m = stream.message() => m.map_err(status)?,
        };
        let Some(e) = event else {
            eprintln!("the agent ended the stream");
            return Ok(0);
        };
        let text = match out {
            Output::Table => client::event_line(&e) + "\n",
            Output::Json => serde_json::to_string(&client::event_value(&e))? + "\n",
            Output::Yaml => format!("---\n{}", serde_yaml_ng::to_string(&client::event_value(&e))?),
        };
        if !write_out(&text)? {
            return Ok(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("agentctl").chain(args.iter().copied()))
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn devices_filters() {
        let cli = parse(&["devices", "--kind", "loop", "--verdict", "in_use", "-o", "yaml"]).expect("parse");
        assert_eq!(cli.output, Output::Yaml);
        match cli.command {
            Command::Devices { filter } => {
                assert_eq!(filter.kind, Some(DeviceKind::Loop));
                assert_eq!(filter.verdict, Some(Verdict::InUse));
                assert!(!filter.stale);
            }
            other => panic!("parsed as {other:?}"),
        }
        assert!(parse(&["devices", "--stale"]).is_ok());
        assert!(parse(&["devices", "--verdict", "in-use"]).is_ok());
        assert!(parse(&["devices", "--stale", "--verdict", "unused"]).is_err());
        assert!(parse(&["devices", "--kind", "floppy"]).is_err());
    }

    #[test]
    fn cli_names_match_the_agents_names() {
        for k in DeviceKind::value_variants() {
            let name = k.to_possible_value().map(|p| p.get_name().to_owned());
            assert_eq!(name, Some(client::kind_name(convert::kind(*k) as i32)));
        }
        for v in Verdict::value_variants() {
            let name = v.to_possible_value().map(|p| p.get_name().to_owned());
            assert_eq!(name, Some(client::verdict_name(convert::verdict(*v) as i32)));
        }
    }

    #[test]
    fn apply_needs_devices_and_timeout_is_bounded() {
        assert!(parse(&["apply"]).is_err());
        assert!(parse(&["apply", "loop3", "--yes"]).is_ok());
        // --identity binds an apply to an earlier plan: repeatable, may be "", needs --yes.
        let cli =
            parse(&["apply", "loop3", "loop4", "--yes", "--identity", "a", "--identity", ""]).expect("parse");
        match cli.command {
            Command::Apply { devices, yes, identities, release } => {
                assert_eq!(devices, ["loop3", "loop4"]);
                assert!(yes && !release);
                assert_eq!(identities, ["a", ""]);
            }
            other => panic!("parsed as {other:?}"),
        }
        match parse(&["apply", "--release", "loop3", "--yes"]).expect("parse").command {
            Command::Apply { release, .. } => assert!(release),
            other => panic!("parsed as {other:?}"),
        }
        assert!(parse(&["apply", "loop3", "--identity", "a"]).is_err(), "--identity without --yes");
        assert!(parse(&["--timeout", "0", "node"]).is_err());
        assert!(parse(&["node", "--timeout", "5"]).is_ok());
    }

    #[test]
    fn fleet_targets_the_console() {
        let cli = parse(&[
            "fleet",
            "where",
            "shop/db",
            "--console",
            "console:9444",
            "--cert",
            "c",
            "--key",
            "k",
            "--ca",
            "a",
        ])
        .expect("parse");
        match console_target(&cli).expect("target") {
            Target::Tcp(t) => {
                assert_eq!((t.addr.as_str(), t.server_name.as_str()), ("console:9444", "console"))
            }
            other => panic!("{other:?}"),
        }
        let cli = parse(&["fleet", "nodes", "--console", "console:9444", "--addr", "n:1"]).expect("parse");
        assert!(console_target(&cli).is_err(), "--addr is one agent, not the console");
        let cli = parse(&["fleet", "multiattach", "pvc/shop/db", "-o", "yaml"]).expect("parse");
        assert!(matches!(cli.command, Command::Fleet { command: FleetCommand::Multiattach { .. } }));
        assert!(parse(&["fleet", "where"]).is_err(), "where needs something to look for");
    }

    #[test]
    fn targets() {
        let cli = parse(&["--socket", "/tmp/a.sock", "node"]).expect("parse");
        assert_eq!(target(&cli).expect("target"), Target::Unix("/tmp/a.sock".into()));
        let cli =
            parse(&["--addr", "node1:9443", "--cert", "c.pem", "--key", "k.pem", "--ca", "ca.pem", "node"])
                .expect("parse");
        match target(&cli).expect("target") {
            Target::Tcp(t) => assert_eq!(t.server_name, "node1"),
            other => panic!("{other:?}"),
        }
        let cli = parse(&["--addr", "node1:9443", "--cert", "c.pem", "node"]).expect("parse");
        let e = target(&cli).expect_err("missing files");
        assert_eq!(e.to_string(), "--addr needs --cert, --key and --ca (mutual TLS); missing --key, --ca");
        let cli = parse(&["--cert", "c.pem", "node"]).expect("parse");
        assert!(target(&cli).is_err());
        let cli =
            parse(&["--addr", "node1", "--cert", "c", "--key", "k", "--ca", "a", "node"]).expect("parse");
        assert!(target(&cli).is_err());
    }
}
