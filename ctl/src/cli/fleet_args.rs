//! `agentctl fleet`'s commands (also the kubectl plugin's): the questions the fleet console
//! answers, with their help.

use blockjanitor_proto::v1 as pb;
use clap::Subcommand;

use super::choices::DeviceFilter;

/// The fleet console's questions.
#[derive(Subcommand, Debug)]
pub(crate) enum FleetCommand {
    /// Every node's agent: reachable or not, devices, last sync, last error.
    #[command(after_help = "EXAMPLES:\n  agentctl fleet nodes\n  kubectl blockjanitor nodes -o wide\n  \
agentctl fleet nodes -o json | jq -r '.nodes[] | select(.error != \"\") | .name'")]
    Nodes,
    /// Devices across the fleet, optionally filtered.
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet devices --stale\n  agentctl fleet devices --node node-a --kind rbd\n  \
agentctl fleet devices --verdict unknown --fresh -o yaml"
    )]
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
    #[command(after_help = "EXAMPLES:\n  agentctl fleet where shop/data-db-0            # a PVC\n  \
agentctl fleet where pv/pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10\n  agentctl fleet where k8s/csi-vol-1234 --fresh   # POOL/IMAGE, asking every agent now")]
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
    #[command(after_help = "EXAMPLES:\n  agentctl fleet who-watches 10.0.0.7:0/3423687629\n  \
rbd status k8s/csi-vol-1234 | agentctl fleet who-watches -\n  ceph osd blocklist ls | agentctl fleet who-watches - -o json")]
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
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet multiattach shop/data-db-0\n  agentctl fleet multiattach pv/pvc-0a5e6f1c-3b2d-4e8f-9a71-5c2d8e4f6b10 -o json\n  \
agentctl fleet multiattach                      # the fleet-wide sweep"
    )]
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
        #[arg(long, value_name = "KIND", value_parser = crate::fleet_render::parse_finding_kind)]
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
