//! agentctl's flags and commands (clap): the connection, the output format, the device filters
//! and every command with its help; `fleet`'s own commands are in `fleet_args.rs`.

use std::path::PathBuf;

use blockjanitor_rpc::client::DEFAULT_SOCKET;
use clap::{Parser, Subcommand, ValueEnum};
use clap_complete::Shell;

use super::fleet_args::FleetCommand;
use super::kube_args::KubeArgs;
use blockjanitor_rpc::view::choices::DeviceFilter;
use blockjanitor_rpc::view::columns::ScanLayout;

/// The top-level help's examples, then the exit-code table both CLIs share.
fn after_help() -> String {
    let examples =
        "EXAMPLES:\n  agentctl node\n  agentctl scan --stale\n  agentctl scan --kind loop -o yaml\n  \
agentctl holders rbd3 -o json\n  agentctl plan                          # every stale device\n  \
agentctl apply loop3                   # show the plan, change nothing\n  \
agentctl apply loop3 --yes             # plan, show it, carry out exactly that\n  \
agentctl clean loop3 --apply           # as blockjanitor-agent clean loop3 --apply, by the daemon\n  \
agentctl watch -o json\n  \
agentctl --addr node1:9443 --cert c.pem --key k.pem --ca ca.pem node\n  \
agentctl completions bash > /etc/bash_completion.d/agentctl\n\n";
    format!("{examples}{}", blockjanitor_rpc::view::exit::help_section())
}

#[derive(Parser, Debug)]
#[command(
    name = "agentctl",
    version,
    about = "Ask the blockjanitor agent which block devices are stale and who holds them; plan and carry out their cleanup.",
    long_about = "Ask the blockjanitor agent which block devices are stale and who holds them; plan and carry out \
their cleanup; watch what changes.\n\nBy default agentctl talks to the agent on this node over its unix socket: \
root is an operator, members of the socket's group may read. With --addr it talks to an agent on another node \
over TCP with mutual TLS, and the name in the client certificate decides the role.\n\nOnly `apply --yes`, `release --apply` \
and `clean --apply` change anything.",
    after_help = after_help()
)]
pub(crate) struct Cli {
    /// The agent's unix socket on this node.
    #[arg(long, global = true, help_heading = "Connection", env = "BLOCKJANITOR_SOCKET", default_value = DEFAULT_SOCKET, value_name = "PATH")]
    pub(crate) socket: PathBuf,
    /// Talk to the agent on another node over TCP with mutual TLS instead of the socket
    /// (needs --cert, --key and --ca).
    #[arg(long, global = true, help_heading = "Connection", value_name = "HOST:PORT")]
    pub(crate) addr: Option<String>,
    /// The fleet console, for `fleet` (needs --cert, --key and --ca).
    #[arg(
        long,
        global = true,
        help_heading = "Connection",
        env = "BLOCKJANITOR_CONSOLE",
        value_name = "HOST:PORT"
    )]
    pub(crate) console: Option<String>,
    /// Client certificate (PEM), for --addr and --console (fleet: also BLOCKJANITOR_CERT; through
    /// the kubeconfig, a certificate of your own instead of your token).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    pub(crate) cert: Option<PathBuf>,
    /// The client certificate's private key (PEM), for --addr and --console (fleet: also
    /// BLOCKJANITOR_KEY).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    pub(crate) key: Option<PathBuf>,
    /// CA certificate that signed the agent's (or console's) certificate (PEM) (fleet: also
    /// BLOCKJANITOR_CA; through the kubeconfig, alone: instead of the ConfigMap the console
    /// publishes).
    #[arg(long, global = true, help_heading = "Connection", value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// Name the agent's certificate must carry [default: the host part of --addr].
    #[arg(long, global = true, help_heading = "Connection", value_name = "NAME")]
    pub(crate) server_name: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', global = true, help_heading = "Output", value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
    /// Print nothing on stdout: a script reads the exit code alone (errors still go to stderr).
    #[arg(long, short = 'q', global = true, help_heading = "Output")]
    pub(crate) quiet: bool,
    /// Give up on connecting, and on each call, after this many seconds (`watch`: on connecting only).
    #[arg(long, global = true, help_heading = "Connection", default_value_t = 30, value_name = "SECONDS",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub(crate) timeout: u64,
    #[command(flatten)]
    pub(crate) kube: KubeArgs,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Text for people.
    Table,
    /// Text for people, no cell cut (every reason of a device in WHY).
    Wide,
    /// Pretty JSON (watch: one object per line).
    Json,
    /// YAML (watch: one document per event).
    Yaml,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
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
    /// Block devices from the agent's latest scan with their verdicts, optionally filtered
    /// (`devices` is the same command).
    #[command(
        visible_alias = "devices",
        long_about = "Block devices from the agent's latest scan, one row each as lsblk shows them: NAME, MAJ:MIN, \
SIZE (as lsblk prints it), TYPE, VERDICT, HELD-BY (who holds it, counted by kind) and WHY (the first reason for \
the verdict), then how many devices the filter left out, the scan's blind spots, pin risks and orphaned pod \
volume directories. Warnings go to stderr. Filters combine (--kind loop --stale: stale loop devices).\n\n\
-o wide never cuts a cell and shows every reason (and the PV column); -o table cuts the widest cells to the \
terminal's width (or $COLUMNS) and says so. --columns picks the columns, --tree draws each stack as lsblk \
does. Verdicts are coloured on a terminal, unless NO_COLOR is set.",
        after_help = "EXAMPLES:\n  agentctl scan\n  agentctl scan --stale\n  agentctl devices --kind rbd --verdict in_use\n  \
agentctl scan --tree\n  agentctl scan --columns NAME,SIZE,VERDICT -o wide\n  \
agentctl scan -o json | jq -r '.devices[] | select(.verdict == \"stale\") | .name'\n\n\
EXIT CODES:\n  0  ok (also when nothing matches)\n  1  error\n  \
3  unknown: the scan has a blind spot (INCOMPLETE VIEW)"
    )]
    Scan {
        #[command(flatten)]
        filter: DeviceFilter,
        #[command(flatten)]
        layout: ScanLayout,
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
    /// Who holds each device, one line per process as `fuser -v` shows them (-v: one per hold).
    #[command(
        long_about = "Who holds each DEVICE, as the agent sees it: one line per process, however many ways it \
holds the device, as `fuser -v -m` shows them: PID, ACCESS in fuser's letters (f open file, F open for writing, \
r root directory, c working directory, e executable being run, m mapped file or shared library; '.' where a \
letter is not), COMMAND, then what fuser does not know: the mount namespace(s) it uses the device from (host \
for the host's), its container and pod. Then the holders that are not a process's own, a line each, grouped \
by kind (mounts in every mount namespace, swap, stacked devices, loop backing, a filesystem alive with no \
mount), and kernel threads (jbd2/<dev>-8...) as symptoms, not holders. -v prints one line per hold, with \
paths and fds. JSON and YAML are the `device` document, whatever the table shows.\n\n\
DEVICE is a kernel name (rbd3), a /dev path, a dm name or MAJ:MIN; or a path that is not a device node \
(/mnt/data): agentctl resolves it here, in its own mount namespace, where the path means what you mean \
(the agent runs in the host's), to the device its filesystem lives on, as `fuser -m` does, and asks for \
that device. A path on a filesystem with no block device (tmpfs, proc) is an error naming it.\n\n\
Several devices: each device's table in turn; with -o json one `device` document per device, one JSON \
line each (with -o yaml a `---` document each); one device prints the one document.",
        after_help = "EXAMPLES:\n  agentctl holders rbd3\n  agentctl holders loop3 loop4 /mnt/data\n  \
agentctl holders rbd3 -v                  # one line per hold, with paths\n  \
agentctl holders rbd3 -o json\n  agentctl holders /dev/loop3\n  \
agentctl -q holders loop3; echo $?      # 2 held, 0 free, 3 unknown (like fuser -s)\n\n\
EXIT CODES (several devices: 2 if any is held, else 3 if any is unknown, else 0):\n  \
0  free: nothing holds it\n  1  error (e.g. NotFound: unknown device; a path with no block device)\n  2  held\n  \
3  unknown: nothing seen holding it, but a blind spot could hide a holder"
    )]
    Holders {
        /// Devices (kernel name, /dev path, dm name, MAJ:MIN) or paths on their filesystems.
        #[arg(required = true, value_name = "DEVICE|PATH")]
        devices: Vec<String>,
        /// One line per hold (each fd, directory, mapping, mount), with paths: the long form.
        #[arg(long, short)]
        verbose: bool,
    },
    /// The steps that would clean the given devices (default: every stale one). Changes nothing.
    #[command(
        long_about = "The ordered steps that would clean the given devices, planned by the agent from a fresh \
scan: detach mounts in other mount namespaces (detach_mount), then tear the device down by its kind \
(detach_loop, nbd_disconnect, rbd_unmap, dm_message and dm_remove, scsi_offline and scsi_delete). Shows the \
identity each plan was made for, what it leaves alone and why, and why a plan is refused. Changes \
nothing.\n\nWith no DEVICE: every device whose verdict is stale. A script that applies later passes each plan's \
`identity` (JSON) to `apply --identity`.",
        after_help = "EXAMPLES:\n  agentctl plan\n  agentctl plan loop3 rbd0\n  agentctl plan loop3 -o json\n  \
agentctl plan rbd3 --release\n\n\
EXIT CODES (the worst plan's):\n  0  every plan may go\n  1  error\n  2  held\n  3  unknown\n  4  refused"
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
EXIT CODES:\n  0  every step done (or already absent)\n  1  error, or a step failed\n  \
2  not carried out: no --yes, a plan was held, or a step was deferred\n  3  unknown\n  \
4  refused (e.g. FailedPrecondition: the device changed since it was planned, or is protected;\n     PermissionDenied: not an operator)"
    )]
    Apply {
        /// Devices to clean (kernel name, /dev path, dm name or MAJ:MIN) [default: every stale
        /// device].
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
    /// Detach the copies of DEVICE's mounts other mount namespaces keep (the device stays): the
    /// plan, or with --apply, carried out. The agent's `release`, asked of the daemon.
    #[command(
        after_help = "EXAMPLES:\n  agentctl release rbd3                  # the plan: which copies would be detached\n  \
agentctl release rbd3 --apply\n  agentctl release /dev/loop3 --apply -o json\n\n\
EXIT CODES:\n  0  done, or the dry run may go\n  1  error\n  2  held: something else still holds it\n  \
3  unknown\n  4  refused"
    )]
    Release {
        /// Kernel name, /dev path, dm name or MAJ:MIN.
        device: String,
        /// Carry out the plan (operators only).
        #[arg(long)]
        apply: bool,
    },
    /// Tear DEVICE down by its kind once it is stale: the plan, or with --apply, carried out.
    /// The agent's `clean`, asked of the daemon.
    #[command(after_help = "EXAMPLES:\n  agentctl clean loop3                   # the plan, or why not\n  \
agentctl clean loop3 --apply\n  agentctl clean rbd0 -o json | jq -r '.plans[0].outcome'\n\n\
EXIT CODES:\n  0  done, or the dry run may go\n  1  error\n  2  held\n  3  unknown\n  \
4  refused (protected, not stale yet...)")]
    Clean {
        /// Kernel name, /dev path, dm name or MAJ:MIN.
        device: String,
        /// Carry out the plan (operators only).
        #[arg(long)]
        apply: bool,
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
        long_about = "Ask the fleet console (blockjanitor-console) about every node at once: why a pod (PVC, PV) is \
stuck, from the pod down to the process that holds its volume (explain); which nodes map an \
image, a PV or a PVC; which node a Ceph watcher belongs to and whether unfencing it is safe; why a volume is \
stuck in Multi-Attach; every volume on several nodes, attached but unused, or held by a dead node (sweep); \
each node's plan (plan) and carrying it out (apply). Every answer lists the nodes it could not speak for.\n\n\
The console is reached either through the Kubernetes API, as kubectl reaches a pod (--kubeconfig, --context, \
-n: the kubeconfig's context, the console's pod in the namespace, default blockjanitor, a port-forward through \
the API server; who you are is your own kubeconfig token, which the console has the API server review, and what \
you may do is the cluster's RBAC: get, plan and apply on fleet.blockjanitor.io, granted by the Roles \
blockjanitor-fleet-viewer and blockjanitor-fleet-operator; the console's certificate is checked against the CA \
in the ConfigMap blockjanitor-console-ca), or directly with --console HOST:PORT and --cert, --key and --ca \
(mutual TLS, a certificate of your own).\n\nInstalled as `kubectl-blockjanitor` (a symlink, or with krew), this is the kubectl plugin, \
which goes through the Kubernetes API unless --console is given: `kubectl blockjanitor --context prod -n \
blockjanitor where shop/data-db-0`.",
        after_help = "EXAMPLES:\n  agentctl fleet --context prod nodes      # through the API server, namespace blockjanitor\n  \
agentctl fleet -n ops sweep                 # your kubeconfig token; the console in ops\n  \
agentctl fleet nodes --console console:9444 --cert c.pem --key k.pem --ca ca.pem\n  \
agentctl fleet where k8s/kubernetes-dynamic-pvc-0a5eb91b\n  agentctl fleet where shop/data-db-0   # a PVC\n  \
rbd status k8s/img | agentctl fleet who-watches -\n  agentctl fleet multiattach shop/data-db-0 -o json\n  \
agentctl fleet sweep\n  agentctl fleet plan node-a\n  kubectl blockjanitor explain pod/db-0 -n shop\n\n\
EXIT CODES:\n  0  ok (explain: not blocked)\n  1  error\n  2  explain: blocked, with a known fix\n  \
3  explain: unknown (a node involved cannot be asked)\n  4  refused: an agent refused the apply (FailedPrecondition)"
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
