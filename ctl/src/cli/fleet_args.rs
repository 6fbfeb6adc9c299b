//! `agentctl fleet`'s commands (also the kubectl plugin's): the questions the fleet console
//! answers, with their help.

use blockjanitor_proto::v1 as pb;
use clap::Subcommand;

use blockjanitor_rpc::view::choices::DeviceFilter;

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
    /// Why a pod (or a PVC, a PV) is stuck: each of its volumes from the claim down to the nodes
    /// that map, attach, use and hold it, then one diagnosis with its evidence and the next
    /// commands (printed, never run). OBJECT as kubectl names it: pod/NAME, pvc/NAME, pv/NAME (a
    /// bare NAME is a pod). As in kubectl, -n is the object's namespace [default: the kubeconfig
    /// context's, else default]; the console's own is found by its labels, or named with
    /// --console-namespace.
    #[command(after_help = "EXAMPLES:\n  kubectl blockjanitor explain pod/db-0 -n shop\n  \
kubectl blockjanitor explain pvc/data-db-0 -n shop -o json\n  kubectl blockjanitor explain pv/pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c\n  \
agentctl fleet --context prod --console-namespace ops explain pod/db-0 -n shop\n\n\
EXIT CODES:\n  0  not blocked: nothing on any node blocks it (the answer says what else to look at)\n  1  error \
(no such object, the console cannot be reached or read the API)\n  2  blocked, with a known fix: the answer names the node, \
device, holder and the next command\n  3  unknown: a node involved cannot be asked and is not believed dead (or its agent \
cannot vouch): its last view is shown with its age")]
    Explain {
        /// pod/NAME, pvc/NAME or pv/NAME (a bare NAME is a pod).
        #[arg(value_name = "pod/NAME|pvc/NAME|pv/NAME")]
        object: String,
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
    /// Pin risks across the fleet: mount namespaces that keep a private copy (neither shared nor
    /// slave) of a live host mount under the kubelet's or a runtime's directory, or of the host
    /// root, so that the device stays busy once the host unmounts it; with who holds them, what
    /// they copy and the fix. Every page, or the one --page-token names.
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet pin-risks\n  agentctl fleet pin-risks --node node-a -o json\n\n\
EXIT CODES:\n  0  none, every node answered\n  1  error\n  2  pin risks listed\n  \
3  none listed, but a node could not be asked or judged"
    )]
    PinRisks {
        /// Only this node.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// One page only: the one after this token (a table's "more:" line, `next_page_token`).
        #[arg(long, value_name = "TOKEN")]
        page_token: Option<String>,
        /// Risks per page (the console's default: 100).
        #[arg(long, value_name = "N", default_value_t = 0)]
        page_size: u32,
    },
    /// The dry run: each node's plan (through the console, as the caller), with a per-node
    /// summary of the steps that would run and what is refused and why. Nothing is changed. NODE
    /// alone plans every stale device on it. Exit code 2 when anything is refused.
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet plan node-a                 # every stale device on node-a\n  \
agentctl fleet plan node-a/rbd4 node-b/rbd0\n  agentctl fleet plan node-a -o json\n\n\
EXIT CODES (the table of `agentctl plan`, the worst of every node's):\n  0  every node's plan may run (or nothing to do)\n  \
1  error (a device its node's agent does not know)\n  2  held: something holds a device\n  \
3  unknown: a node's plan could not be had, or its agent cannot see everything\n  4  refused by a safety rule"
    )]
    Plan {
        /// NODE (every stale device on it) or NODE/DEVICE, repeatable.
        #[arg(required = true, value_name = "NODE[/DEVICE]")]
        targets: Vec<String>,
    },
    /// Clean devices on one or more nodes through the console: a dry run of every node's plan
    /// is shown first; with --yes the same plans are then carried out, bound to the identities
    /// they were made for. Without --yes nothing runs (exit 2), as `agentctl apply`. A refusal in
    /// the dry run stops everything with its code (2 held, 3 unknown, 4 refused; the budget: 4).
    #[command(
        after_help = "EXAMPLES:\n  agentctl fleet apply node-a/rbd4 node-b/rbd0   # the dry run only (nothing runs without --yes)\n  \
agentctl fleet apply node-a/rbd4 --yes          # show the dry run, then carry it out\n  \
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
        /// Carry the plans out (the dry run is still shown first, and a refusal in it still
        /// stops everything).
        #[arg(long)]
        yes: bool,
    },
}
